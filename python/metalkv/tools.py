"""Tool calling (OpenAI's `tools`, `tool_choice`, `tool_calls`), in one of two formats
(docs/CONSTRAINED.md, "Tools"):

- native: the model's chat template takes the tools and writes calls its own way
  (metalkv.tool_formats reads that way from the template); the tools and earlier tool
  turns go to the template as they are, and the reply is held by a grammar to the
  template's call format (or an answer, under "auto");
- generic, for templates without tool support (the default model's): the tools are
  described in a system message, and the reply is held by a JSON schema to either
  {"tool_calls": [{"name", "arguments"}, ...]} or {"response": "..."}; earlier tool turns
  are written as text the template takes (an assistant's calls as the JSON it would have
  replied, a tool's result as a user message that names the call). llama.cpp falls back to
  the same kind of format.

Either way the reply is parsed back into OpenAI's message: `content`, or `tool_calls` with
ids and arguments as JSON text; streamed, an answer goes out as it comes and each call as
soon as its JSON is whole (native), or the whole reply at its end (generic).
"""
from __future__ import annotations

import dataclasses
import json
import re
from dataclasses import dataclass
from typing import Any

from .errors import argument_error
from .tool_formats import NativeFormat, objects, openai_call

_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")  # OpenAI's function names


@dataclass(frozen=True)
class Tool:
    name: str
    description: str
    parameters: dict


@dataclass(frozen=True)
class Tools:
    """The tools a reply may call and how (tool_choice), checked."""
    tools: tuple[Tool, ...]
    choice: str             # "auto", "required", or the one function's name
    parallel: bool = True   # several calls in one reply
    native: NativeFormat | None = None  # the template's own format (using()); None: the generic one
    tokenizer: Any = None

    @classmethod
    def of(cls, tools: Any, tool_choice: Any = None, parallel_tool_calls: Any = None) -> "Tools | None":
        """None when there are no tools or tool_choice is "none" (the reply is plain text).
        Raises ArgumentError naming the field (tools[i].function.name, tool_choice, ...)."""
        if tools is None or tools == []:
            if tool_choice not in (None, "none", "auto"):
                raise argument_error("chat", "tool_choice", tool_choice, "to come with tools")
            return None
        if not isinstance(tools, list):
            raise argument_error("chat", "tools", tools, "a list of {'type': 'function', 'function': {...}}")
        out, names = [], set()
        for i, t in enumerate(tools):
            where = f"tools[{i}]"
            if not isinstance(t, dict) or t.get("type") != "function" or not isinstance(t.get("function"), dict):
                raise argument_error("chat", where, t, "{'type': 'function', 'function': {'name', ...}}")
            f = t["function"]
            name = f.get("name")
            if not isinstance(name, str) or not _NAME.fullmatch(name):
                raise argument_error("chat", f"{where}.function.name", name, "1-64 letters, digits, _ or -")
            if name in names:
                raise argument_error("chat", f"{where}.function.name", name, "a name no other tool has")
            names.add(name)
            params = f.get("parameters", {"type": "object", "properties": {}})
            if not isinstance(params, dict):
                raise argument_error("chat", f"{where}.function.parameters", params, "a JSON schema object")
            desc = f.get("description", "")
            if not isinstance(desc, str):
                raise argument_error("chat", f"{where}.function.description", desc, "a str")
            out.append(Tool(name, desc, params))
        if tool_choice in (None, "auto", "required", "none"):
            choice = tool_choice or "auto"
        elif isinstance(tool_choice, dict) and tool_choice.get("type") == "function" \
                and isinstance(tool_choice.get("function"), dict) and tool_choice["function"].get("name") in names:
            choice = tool_choice["function"]["name"]
        else:
            raise argument_error("chat", "tool_choice", tool_choice, "'none', 'auto', 'required' or "
                                 "{'type': 'function', 'function': {'name': one of the tools}}")
        if choice == "none":
            return None
        if parallel_tool_calls is not None and not isinstance(parallel_tool_calls, bool):
            raise argument_error("chat", "parallel_tool_calls", parallel_tool_calls, "true or false")
        return cls(tuple(out), choice, parallel_tool_calls is not False)

    def callable(self) -> tuple[Tool, ...]:
        return self.tools if self.choice in ("auto", "required") else tuple(t for t in self.tools if t.name == self.choice)

    def using(self, native: NativeFormat | None, tokenizer) -> "Tools":
        """These tools in a chat template's native format (None: the generic one)."""
        return dataclasses.replace(self, native=native, tokenizer=tokenizer)

    def openai_tools(self) -> list[dict]:
        """The callable tools as OpenAI lists them (what a template's `tools` takes)."""
        return [{"type": "function", "function": {"name": t.name, "description": t.description,
                                                  "parameters": t.parameters}} for t in self.callable()]

    def constraint(self) -> dict:
        """The Sampling fields that hold a reply to the format."""
        if self.native is None:
            return {"response_format": {"type": "json_schema",
                                        "json_schema": {"name": "tool_reply", "schema": self.schema()}}}
        from .constrain import Grammar

        return {"grammar": Grammar.lark(self.native.lark(self.callable(), self.tokenizer, auto=self.choice == "auto",
                                                         parallel=self.parallel))}

    def system_text(self) -> str:
        """What the model is told: the tools, and the two reply shapes."""
        listed = json.dumps([{"name": t.name, "description": t.description, "parameters": t.parameters}
                             for t in self.callable()], ensure_ascii=False)
        calls = 'Reply with JSON: {"tool_calls": [{"name": <a tool\'s name>, "arguments": {...}}]}'
        if self.choice == "auto":
            how = f'{calls} to call tools, or {{"response": "<your answer>"}} to answer without them.'
        else:
            how = f"{calls}: you must call a tool."
        return f"You can call these tools:\n{listed}\n{how}"

    def schema(self) -> dict:
        """The JSON schema every reply is held to."""
        call = [{"type": "object", "properties": {"name": {"const": t.name}, "arguments": t.parameters},
                 "required": ["name", "arguments"], "additionalProperties": False} for t in self.callable()]
        items = call[0] if len(call) == 1 else {"anyOf": call}
        calls = {"type": "object", "additionalProperties": False, "required": ["tool_calls"],
                 "properties": {"tool_calls": dict({"type": "array", "items": items, "minItems": 1},
                                                   **({} if self.parallel else {"maxItems": 1}))}}
        if self.choice != "auto":
            return calls
        answer = {"type": "object", "properties": {"response": {"type": "string"}}, "required": ["response"],
                  "additionalProperties": False}
        return {"anyOf": [calls, answer]}

    def messages(self, messages: list) -> list:
        """The conversation for the template. Native: as given (the template writes the
        tools and the tool turns). Generic: with the tools' system text (added to the first
        system message, or first) and earlier tool turns written as plain text."""
        if self.native is not None:
            return messages
        plain = plain_tool_turns(messages)
        text = self.system_text()
        if plain and isinstance(plain[0], dict) and plain[0].get("role") in ("system", "developer") \
                and isinstance(plain[0].get("content"), str):
            return [dict(plain[0], content=plain[0]["content"] + "\n\n" + text)] + plain[1:]
        return [{"role": "system", "content": text}] + plain

    def reply(self, text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls) of a reply held to the format: OpenAI's tool_calls (ids
        made here, arguments as JSON text), or the answer as content."""
        if self.native is not None:
            calls = self.native.calls(text, [t.name for t in self.callable()], self.tokenizer)
            return (None, calls) if calls else (text, [])
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:  # cut short (max_tokens): what came, as text
            return text, []
        if isinstance(obj, dict) and isinstance(obj.get("tool_calls"), list):
            return None, [openai_call(c["name"], c["arguments"]) for c in obj["tool_calls"] if isinstance(c, dict)]
        if isinstance(obj, dict) and isinstance(obj.get("response"), str):
            return obj["response"], []
        return text, []


def plain_tool_turns(messages: Any) -> Any:
    """Earlier tool turns as text any template takes: an assistant's tool_calls as the JSON
    it replied, a tool's result (role "tool") as a user message naming the call. Anything
    else is left for messages.normalize to check."""
    if not isinstance(messages, list):
        return messages
    out = []
    for m in messages:
        if isinstance(m, dict) and m.get("role") == "assistant" and m.get("tool_calls"):
            calls = []
            for c in m["tool_calls"] if isinstance(m["tool_calls"], list) else []:
                f = c.get("function", {}) if isinstance(c, dict) else {}
                try:
                    args = json.loads(f.get("arguments") or "{}")
                except (TypeError, json.JSONDecodeError):
                    args = f.get("arguments")
                calls.append({"name": f.get("name"), "arguments": args})
            out.append({"role": "assistant", "content": json.dumps({"tool_calls": calls}, ensure_ascii=False)})
        elif isinstance(m, dict) and m.get("role") == "tool":
            content = m.get("content")
            content = content if isinstance(content, str) else json.dumps(content, ensure_ascii=False)
            out.append({"role": "user", "content": f"Result of tool call {m.get('tool_call_id', '')}: {content}"})
        else:
            out.append(m)
    return out


class ReplyStream:
    """A streamed reply's deltas under tools: feed() each piece of text, finish() at the
    end; each returns OpenAI delta dicts ({"content"} or {"tool_calls": [...]}). Native
    format: an answer streams as it comes, once its first character shows it is not a
    call; each call goes out when its JSON is whole. Generic format, or a native one whose
    calls start with a control token (not in the text): the whole reply at its end."""

    def __init__(self, tools: Tools):
        self.tools = tools
        self.text = ""
        first = tools.native.first_char(tools.tokenizer) if tools.native is not None else None
        self._first = first            # None: the reply is held to its end
        self._mode = None if first is not None else "held"
        self._sent = 0                 # characters of an answer sent, or calls sent
        self.called = False

    def feed(self, piece: str) -> list[dict]:
        self.text += piece
        if self._mode is None:
            head = self.text.lstrip()
            if not head:
                return []
            self._mode = "calls" if head[0] == self._first else "answer"
        if self._mode == "answer":
            out, self._sent = self.text[self._sent:], len(self.text)
            return [{"content": out}] if out else []
        if self._mode == "calls":
            names = {t.name for t in self.tools.callable()}
            key = self.tools.native.args_key
            whole = [v for _, _, v in objects(self.text)
                     if isinstance(v, dict) and v.get("name") in names and isinstance(v.get(key), dict)]
            fresh = whole[self._sent:]
            self._sent = len(whole)
            self.called = self.called or bool(fresh)
            return [{"tool_calls": [dict(openai_call(v["name"], v[key]), index=self._sent - len(fresh) + k)
                                    for k, v in enumerate(fresh)]}] if fresh else []
        return []

    def finish(self) -> list[dict]:
        if self._mode != "held":
            return []
        content, calls = self.tools.reply(self.text)
        self.called = bool(calls)
        return [{"tool_calls": [dict(c, index=k) for k, c in enumerate(calls)]} if calls else {"content": content}]
