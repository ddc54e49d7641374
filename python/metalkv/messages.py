"""Chat messages as callers give them, checked and made plain for the chat template.

    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]

OpenAI's shape is the one taken (Engine.chat, the server): a role among
system, developer (OpenAI's newer name for system), user and assistant; content a
str or a list of text parts, joined. What a text model cannot honour (images,
tool calls, tool results) is refused by name rather than dropped.
"""
from __future__ import annotations

import json
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


def _tool_calls(calls: Any, where: str) -> list[dict]:
    """An assistant's OpenAI tool_calls as chat templates take them: arguments as an
    object (OpenAI sends JSON text)."""
    if not isinstance(calls, Sequence) or isinstance(calls, (str, bytes)):
        raise _refuse(f"{where}.tool_calls", "a list of {'id', 'type': 'function', 'function'} objects")
    out = []
    for j, c in enumerate(calls):
        f = c.get("function") if isinstance(c, Mapping) else None
        if not isinstance(f, Mapping) or not isinstance(f.get("name"), str):
            raise _refuse(f"{where}.tool_calls[{j}]", "{'id', 'type': 'function', 'function': {'name', 'arguments'}}")
        args = f.get("arguments", "{}")
        if isinstance(args, str):
            try:
                args = json.loads(args or "{}")
            except json.JSONDecodeError as e:
                raise _refuse(f"{where}.tool_calls[{j}].function.arguments", f"JSON text ({e})") from None
        out.append({"id": str(c.get("id", "")), "type": "function", "function": {"name": f["name"], "arguments": args}})
    return out


def normalize(messages: Any, *, tool_turns: bool = False) -> list[dict[str, Any]]:
    """[{"role", "content"}] with str contents, as the chat template takes them; raises
    ArgumentError (argument 'messages') saying which message is wrong and why.
    tool_turns (a template that takes tools): an assistant's tool_calls and the tools'
    results (role "tool") are kept for the template, the calls' arguments as objects."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise _refuse("messages", "a non-empty list of {'role', 'content'} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise _refuse(where, f"a message is an object with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if tool_turns and role == "tool":
            out.append({"role": "tool", "content": _text(m.get("content"), where),
                        **{k: str(m[k]) for k in ("tool_call_id", "name") if m.get(k) is not None}})
            continue
        if tool_turns and role == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": _text(m.get("content") or "", where),
                        "tool_calls": _tool_calls(m["tool_calls"], where)})
            continue
        if role not in ROLES:
            raise _refuse(f"{where}.role", f"one of {', '.join(ROLES)}, got {role!r}"
                          + (" (tools are not supported)" if role in ("tool", "function") else ""))
        if m.get("tool_calls") or m.get("function_call"):
            raise _refuse(where, "tool calls are not supported")
        if "content" not in m or m["content"] is None:
            raise _refuse(f"{where}.content", "every message needs content")
        out.append({"role": "system" if role == "developer" else role, "content": _text(m["content"], where)})
    return out


class Conversation:
    """Messages given to Engine.chat(): rendered whole with the chat template."""

    def __init__(self, messages):
        self.messages = normalize(messages)
