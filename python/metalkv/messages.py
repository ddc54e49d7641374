"""Chat messages as callers give them, checked and made plain for the chat template.

    [{"role": "system", "content": "Be brief."},
     {"role": "user", "content": [{"type": "text", "text": "Hi"}]}]

OpenAI's shape is the one taken (Engine.chat, the server): a role among
system, developer (OpenAI's newer name for system), user and assistant; content a
str or a list of text parts, joined. What a text model cannot honour (images,
tool calls, tool results) is refused by name rather than dropped.

For a model that sees or hears (media=True), a user message may also hold images and
audio, in OpenAI's parts or transformers' (docs/MULTIMODAL.md "Content parts"):

    {"type": "image_url", "image_url": {"url": "photo.jpg"}}      # or "image_url": "data:image/png;base64,..."
    {"type": "input_audio", "input_audio": {"data": "<base64>", "format": "wav"}}
    {"type": "image", "path": "photo.jpg"}   {"type": "audio", "url": "file:///tmp/clip.wav"}

Such a message's content stays a list, as the template takes it: [{"type": "text", "text"},
{"type": "image"}, {"type": "audio"}] in the order given; media_parts() gives the sources
in the same order. Nothing is read here: the media layer reads and checks each source.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, NamedTuple, Sequence

from .errors import ArgumentError, argument_error

ROLES = ("system", "developer", "user", "assistant")
MEDIA_KINDS = ("image", "audio")
# A part's type -> what it holds, and the keys its source may be under (transformers' parts: the first present)
PART_KINDS = {"text": "text", "image_url": "image", "input_audio": "audio", "image": "image", "audio": "audio"}
SOURCE_KEYS = {"image": ("image", "url", "path"), "audio": ("audio", "url", "path")}
NEEDS = {"image": "images need a model whose vision tower metalkv runs (Gemma 3 4B and up, Gemma 3n)",
         "audio": "audio needs a model with an audio tower (Gemma 3n)"}


class MediaPart(NamedTuple):
    """An image or a clip of the messages, in the order the prompt holds them."""
    kind: str     # "image" | "audio"
    source: Any   # a path, a data URL, an http(s) or file:// URL, bytes, or input_audio's {"data", "format"}
    where: str    # "messages[1].content[0]": where it was given, for messages about it


def _refuse(where: str, what: str) -> ArgumentError:
    e = ArgumentError(f"[chat] {where}: {what}")
    e.argument, e.value, e.expected = "messages", "", what
    return e


def media_kinds(media: bool | Iterable[str]) -> tuple[str, ...]:
    """normalize's `media` as the kinds a model takes: True both, False none, or the kinds named."""
    if isinstance(media, bool):
        return MEDIA_KINDS if media else ()
    kinds = tuple(media) if isinstance(media, Iterable) and not isinstance(media, str) else (media,)
    if not all(k in MEDIA_KINDS for k in kinds):
        raise argument_error("chat", "media", media, "True, False, or kinds among 'image' and 'audio'")
    return kinds


def _cannot_read(kind: str, kinds: tuple[str, ...]) -> str:
    reads = "text only" if not kinds else "text and " + (kinds[0] if kinds[0] == "audio" else "images")
    return f"this model reads {reads}; {NEEDS[kind]}"


def _source(part: Mapping, type_: str, kind: str, at: str) -> Any:
    """Where a media part's bytes are: checked for shape only (the media layer reads them)."""
    if type_ == "image_url":
        v = part.get("image_url")
        url = v.get("url") if isinstance(v, Mapping) else v
        if not isinstance(url, str) or not url:
            raise _refuse(f"{at}.image_url", "{'url': a data URL, a path, a file:// or http(s) URL}, or that URL "
                                             f"as a str; got {v!r:.80}")
        return url
    if type_ == "input_audio":
        v = part.get("input_audio")
        if not isinstance(v, Mapping) or not isinstance(v.get("data"), str) or not isinstance(v.get("format"), str):
            raise _refuse(f"{at}.input_audio", "{'data': the file's bytes in base64, 'format': 'wav'}")
        return {"data": v["data"], "format": v["format"]}
    for key in SOURCE_KEYS[kind]:  # transformers' "image"/"audio" parts
        if part.get(key) not in (None, ""):
            return part[key]
    keys = " or ".join(repr(k) for k in SOURCE_KEYS[kind])
    raise _refuse(at, f"an {kind} part needs its source under {keys}: a path, a data URL or a file:// URL")


def _content(content: Any, where: str, role: str, kinds: tuple[str, ...], found: list[MediaPart]) -> str | list:
    """A message's content: a str, the text parts of a list joined, or (media in a user message)
    the list of template parts, each media part's source appended to `found`."""
    if isinstance(content, str):
        return content
    if not isinstance(content, Sequence) or isinstance(content, (bytes, bytearray)):
        raise _refuse(f"{where}.content", f"a str or a list of text parts, got {type(content).__name__}")
    parts, media = [], False
    for j, part in enumerate(content):
        at = f"{where}.content[{j}]"
        if not isinstance(part, Mapping):
            raise _refuse(at, f"a content part is an object, got {type(part).__name__}")
        type_ = part.get("type")
        kind = PART_KINDS.get(type_) if isinstance(type_, str) else None
        if kind == "text":
            if not isinstance(part.get("text"), str):
                raise _refuse(f"{at}.text", "a text part needs a str 'text'")
            parts.append({"type": "text", "text": part["text"]})
            continue
        if kind is None and not kinds:
            raise _refuse(at, f"only 'text' parts are supported (this model reads text), got type {type_!r}")
        if kind is None:
            raise _refuse(at, f"a part's type is one of {', '.join(map(repr, PART_KINDS))}; got {type_!r}")
        if kind not in kinds:
            raise _refuse(at, _cannot_read(kind, kinds))
        if role != "user":
            raise _refuse(at, f"{'images' if kind == 'image' else 'audio clips'} go in user messages, not {role} "
                              "messages (Gemma's templates keep only the text of a system message; a reply is text)")
        found.append(MediaPart(kind, _source(part, type_, kind, at), at))
        parts.append({"type": kind})
        media = True
    return parts if media else "".join(p["text"] for p in parts)


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


def _read(messages: Any, tool_turns: bool, kinds: tuple[str, ...]) -> tuple[list[dict[str, Any]], list[MediaPart]]:
    """(the messages for the template, their media in order): normalize and media_parts in one walk."""
    if isinstance(messages, (str, bytes)) or not isinstance(messages, Sequence) or not messages:
        raise _refuse("messages", "a non-empty list of {'role', 'content'} objects")
    out: list[dict[str, Any]] = []
    found: list[MediaPart] = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, Mapping):
            raise _refuse(where, f"a message is an object with 'role' and 'content', got {type(m).__name__}")
        role = m.get("role")
        if tool_turns and role == "tool":
            out.append({"role": "tool", "content": _content(m.get("content"), where, role, kinds, found),
                        **{k: str(m[k]) for k in ("tool_call_id", "name") if m.get(k) is not None}})
            continue
        if tool_turns and role == "assistant" and m.get("tool_calls"):
            out.append({"role": "assistant", "content": _content(m.get("content") or "", where, role, kinds, found),
                        "tool_calls": _tool_calls(m["tool_calls"], where)})
            continue
        if role not in ROLES:
            raise _refuse(f"{where}.role", f"one of {', '.join(ROLES)}, got {role!r}"
                          + (" (tools are not supported)" if role in ("tool", "function") else ""))
        if m.get("tool_calls") or m.get("function_call"):
            raise _refuse(where, "tool calls are not supported")
        if "content" not in m or m["content"] is None:
            raise _refuse(f"{where}.content", "every message needs content")
        out.append({"role": "system" if role == "developer" else role,
                    "content": _content(m["content"], where, role, kinds, found)})
    return out, found


def normalize(messages: Any, *, tool_turns: bool = False, media: bool | Iterable[str] = False) -> list[dict[str, Any]]:
    """[{"role", "content"}] as the chat template takes them; raises ArgumentError (argument
    'messages') saying which message is wrong and why. Contents are str, but for a user
    message with media. tool_turns (a template that takes tools): an assistant's tool_calls
    and the tools' results (role "tool") are kept for the template, the calls' arguments as
    objects. media: the kinds the model takes, True for images and audio; False (a text
    model): an image or audio part is refused, saying which models read it."""
    return _read(messages, tool_turns, media_kinds(media))[0]


def media_parts(messages: Any, *, tool_turns: bool = False, media: bool | Iterable[str] = True) -> list[MediaPart]:
    """The images and clips of `messages` (checked as normalize checks them), in prompt order."""
    return _read(messages, tool_turns, media_kinds(media))[1]


class Conversation:
    """Messages given to Engine.chat(): rendered whole with the chat template. media: as
    normalize takes it; .media lists the sources of the images and clips, in order."""

    def __init__(self, messages, *, media: bool | Iterable[str] = False):
        self.messages, self.media = _read(messages, False, media_kinds(media))
