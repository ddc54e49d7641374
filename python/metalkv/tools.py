"""Tool calling (OpenAI's `tools`, `tool_choice`, `tool_calls`) in the generic format:
the tools are described in a system message, and the reply is held by a JSON schema to
either {"tool_calls": [{"name", "arguments"}, ...]} or {"response": "..."} (docs/CONSTRAINED.md,
"Tools"). This works with any chat template, including those without tool support (the
default model's). llama.cpp falls back to the same kind of format. The reply is parsed back
into OpenAI's message: `content`, or `tool_calls` with ids and arguments as JSON text.

Earlier tool turns of a conversation are written as text the template takes: an assistant's
tool calls as the JSON it would have replied, a tool's result as a user message that names
the call.
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from .errors import argument_error

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

    def response_format(self) -> dict:
        return {"type": "json_schema", "json_schema": {"name": "tool_reply", "schema": self.schema()}}

    def messages(self, messages: list) -> list:
        """messages with the tools' system text (added to the first system message, or
        first) and earlier tool turns written as plain text."""
        plain = plain_tool_turns(messages)
        text = self.system_text()
        if plain and isinstance(plain[0], dict) and plain[0].get("role") in ("system", "developer") \
                and isinstance(plain[0].get("content"), str):
            return [dict(plain[0], content=plain[0]["content"] + "\n\n" + text)] + plain[1:]
        return [{"role": "system", "content": text}] + plain

    @staticmethod
    def reply(text: str) -> tuple[str | None, list[dict]]:
        """(content, tool_calls) of a reply held to schema(): OpenAI's tool_calls (ids made
        here, arguments as JSON text), or the answer as content."""
        try:
            obj = json.loads(text)
        except json.JSONDecodeError:  # cut short (max_tokens): what came, as text
            return text, []
        if isinstance(obj, dict) and isinstance(obj.get("tool_calls"), list):
            calls = [{"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
                      "function": {"name": c["name"], "arguments": json.dumps(c["arguments"], ensure_ascii=False)}}
                     for c in obj["tool_calls"] if isinstance(c, dict)]
            return None, calls
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
