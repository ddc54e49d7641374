"""Chat messages as callers give them, checked and made plain for the chat template.

    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]

OpenAI's shape is the one taken (Engine.chat, the server): a role among
system, developer (OpenAI's newer name for system), user and assistant; content a
str or a list of text parts, joined. What a text model cannot honour (images,
tool calls, tool results) is refused by name rather than dropped.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

from .errors import ArgumentError

ROLES = ("system", "developer", "user", "assistant")


def _refuse(where: str, what: str) -> ArgumentError:
    e = ArgumentError(f"[chat] {where}: {what}")
    e.argument, e.value, e.expected = "messages", "", what
    return e


def _text(content: Any, where: str) -> str:
    """A message's content as one str: a str, or the text parts of a list joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, (bytes, bytearray)):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, Mapping):
                raise _refuse(f"{where}.content[{j}]", f"a content part is an object, got {type(part).__name__}")
            kind = part.get("type")
            if kind != "text":
                raise _refuse(f"{where}.content[{j}]", f"only 'text' parts are supported (this model reads text), "
                                                       f"got type {kind!r}")
            if not isinstance(part.get("text"), str):
                raise _refuse(f"{where}.content[{j}].text", "a text part needs a str 'text'")
            texts.append(part["text"])
        return "".join(texts)
    raise _refuse(f"{where}.content", f"a str or a list of text parts, got {type(content).__name__}")


def normalize(messages: Any) -> list[dict[str, str]]:
    """[{"role", "content"}] with str contents, as the chat template takes them; raises
    ArgumentError (argument 'messages') saying which message is wrong and why."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise _refuse("messages", "a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise _refuse(where, f"a message is an object with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if role not in ROLES:
            raise _refuse(f"{where}.role", f"one of {', '.join(ROLES)}, got {role!r}"
                          + (" (tools are not supported)" if role in ("tool", "function") else ""))
        if m.get("tool_calls") or m.get("function_call"):
            raise _refuse(where, "tool calls are not supported")
        if "content" not in m or m["content"] is None:
            raise _refuse(f"{where}.content", "every message needs content")
        out.append({"role": "system" if role == "developer" else role, "content": _text(m["content"], where)})
    return out
