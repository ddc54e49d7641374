"""Tool calls in the format a model's own chat template writes them (Hermes/Qwen's
`<tool_call>{...}</tool_call>`, Llama 3.1's bare `{"name", "parameters"}`, Mistral's
`[TOOL_CALLS][{...}, ...]`, and any other that wraps one JSON object per call).

The format is read from the template itself, not from a list of known models: a probe
conversation whose assistant turn holds one call, then two, is rendered, and the text
around the calls' JSON is the format: what comes before the first call (`prefix`),
between two calls (`sep`), after the last (`suffix`), and the key that holds the
arguments. A template that takes no tools, or renders a call some other way, has no
native format (None): metalkv.tools' generic format is used instead.

The reply is then held by a Lark grammar (llguidance) to `prefix call (sep call)* suffix`,
each call a JSON schema of one tool's name and parameters; under tool_choice "auto", to
that or a plain answer, which must not begin as a call does (a model may answer either
way, but not write half a call as text).
"""
from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any, Iterable

_PROBE = "metalkv_probe"
_ARGS = ({"k": "probe-1"}, {"k": "probe-2"})
_ANSWER = "metalkv probe answer"


def _probe_tool() -> dict:
    return {"type": "function", "function": {"name": _PROBE, "description": "A probe.", "parameters": {
        "type": "object", "properties": {"k": {"type": "string"}}, "required": ["k"]}}}


def _probe_call(i: int) -> dict:
    # 9 letters and digits: the ids Mistral's templates insist on
    return {"id": f"probe000{i}", "type": "function", "function": {"name": _PROBE, "arguments": _ARGS[i]}}


def objects(text: str) -> Iterable[tuple[int, int, Any]]:
    """(start, end, value) of each JSON object that starts at a '{' of text, left to right,
    not overlapping."""
    dec = json.JSONDecoder()
    i = text.find("{")
    while i >= 0:
        try:
            value, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        yield i, end, value
        i = text.find("{", end)


@dataclass(frozen=True)
class NativeFormat:
    prefix: str      # before the first call
    sep: str | None  # between two calls; None: the template writes one call a turn
    suffix: str      # after the last call, before the end of the turn
    args_key: str    # "arguments" or "parameters"

    @classmethod
    def of_template(cls, template) -> "NativeFormat | None":
        """The template's format (the module doc), or None."""
        if template is None or getattr(template, "is_fallback", False) or "tools" not in template.source:
            return None
        tools = [_probe_tool()]
        user = [{"role": "user", "content": "metalkv probe question"}]

        def turn(assistant: dict) -> str | None:
            """The assistant turn's text as the template writes it, None if it refuses."""
            try:
                gen = str(template.render(user, add_generation_prompt=True, tools=tools))
                text = str(template.render(user + [assistant], add_generation_prompt=False, tools=tools))
            except Exception:  # noqa: BLE001 - a template that refuses the probe has no native format
                return None
            return text[len(gen):] if text.startswith(gen) else None

        answer = turn({"role": "assistant", "content": _ANSWER})
        one = turn({"role": "assistant", "content": "", "tool_calls": [_probe_call(0)]})
        if answer is None or one is None or _ANSWER not in answer:
            return None
        end = answer[answer.index(_ANSWER) + len(_ANSWER):]  # the end of a turn (<|im_end|>, <|eot_id|>, ...)
        if not one.endswith(end):
            return None
        one = one[:len(one) - len(end)]
        found = [(s, e, v) for s, e, v in objects(one) if isinstance(v, dict) and v.get("name") == _PROBE]
        if len(found) != 1:
            return None
        s, e, v = found[0]
        keys = [k for k, x in v.items() if x == _ARGS[0]]
        if len(v) != 2 or len(keys) != 1:
            return None
        prefix, suffix = one[:s], one[e:]
        sep = None
        two = turn({"role": "assistant", "content": "", "tool_calls": [_probe_call(0), _probe_call(1)]})
        if two is not None and two.endswith(end):
            two = two[:len(two) - len(end)]
            calls = [(s2, e2) for s2, e2, v2 in objects(two) if isinstance(v2, dict) and v2.get("name") == _PROBE]
            if len(calls) == 2 and two[:calls[0][0]] == prefix and two[calls[1][1]:] == suffix:
                sep = two[calls[0][1]:calls[1][0]]
        return cls(prefix, sep, suffix, keys[0])

    # ---- the grammar -------------------------------------------------------------
    def lark(self, tools, tokenizer, *, auto: bool, parallel: bool) -> str:
        """The Lark grammar a reply is held to; tools: metalkv.tools.Tool, the callable
        ones. Control tokens in the format (Mistral's [TOOL_CALLS]) are written as token
        ids, the rest as literal text."""
        schemas = [{"type": "object", "properties": {"name": {"const": t.name}, self.args_key: t.parameters},
                    "required": ["name", self.args_key], "additionalProperties": False} for t in tools]
        call = schemas[0] if len(schemas) == 1 else {"anyOf": schemas}
        rules = [f"call: %json {json.dumps(call, ensure_ascii=False)}"]
        many = parallel and self.sep is not None
        body = f"call ({self._pieces(self.sep, tokenizer)} call)*" if many else "call"
        rules.insert(0, f"calls: {self._pieces(self.prefix, tokenizer)} {body} {self._pieces(self.suffix, tokenizer)}")
        if not auto:
            return "start: calls\n" + "\n".join(rules)
        first = self.first_char(tokenizer)
        text = "/(.|\\n)+/" if first is None else f"/[^{re.escape(first)}](.|\\n)*/"
        return "start: TEXT | calls\nTEXT: " + text + "\n" + "\n".join(rules)

    def first_char(self, tokenizer) -> str | None:
        """The first character a call's text starts with; None when it starts with a
        control token (which plain text cannot contain)."""
        if not self.prefix:
            return "{"
        ids = tokenizer.encode(self.prefix, add_special=False, parse_special=True)
        return None if ids and ids[0] in tokenizer.control_ids else self.prefix[0]

    @staticmethod
    def _pieces(text: str, tokenizer) -> str:
        """text as a sequence of Lark items: control tokens as <[id]>, the rest literal."""
        if not text:
            return ""
        ids = tokenizer.encode(text, add_special=False, parse_special=True)
        out, run = [], []
        for i in ids + [None]:
            if i is None or i in tokenizer.control_ids:
                if run:
                    out.append(json.dumps(tokenizer.decode(run), ensure_ascii=False))
                    run = []
                if i is not None:
                    out.append(f"<[{i}]>")
            else:
                run.append(i)
        return " ".join(out)

    # ---- the reply ----------------------------------------------------------------
    def calls(self, text: str, names: Iterable[str], tokenizer) -> list[dict] | None:
        """The calls of a reply the grammar held (OpenAI's tool_calls, ids made here), or
        None when it is an answer, or was cut short inside a call. The reply's text has no
        control tokens (they are not text), so it is a call when nothing is left of it but
        whitespace once the calls' JSON and the format's text are taken out."""
        names = set(names)
        found = [(s, e, v) for s, e, v in objects(text)
                 if isinstance(v, dict) and v.get("name") in names and isinstance(v.get(self.args_key), dict)]
        if not found:
            return None
        rest, at = [], 0
        for s, e, _ in found:
            rest.append(text[at:s])
            at = e
        rest = "".join(rest + [text[at:]])
        for piece in (self.prefix, self.sep or "", self.suffix):
            plain = tokenizer.decode(tokenizer.encode(piece, add_special=False, parse_special=True),
                                     skip_special=True).strip()
            if plain:
                rest = rest.replace(plain, "")
        if rest.strip():
            return None
        return [openai_call(v["name"], v[self.args_key]) for _, _, v in found]


def openai_call(name: str, arguments: Any) -> dict:
    """One of OpenAI's tool_calls: an id made here, the arguments as JSON text."""
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)}}
