"""Constrained decoding (docs/CONSTRAINED.md): a JSON schema, a regex or a grammar
that every generated token must keep satisfiable, through llguidance. A Grammar
is checked when a call is made (a bad one raises ArgumentError naming the field
and llguidance's position); each call gets its own Matcher, which the engine's
scheduler asks for the allowed next ids (a bitmask the device sampler applies)
and tells of each id it takes."""
from __future__ import annotations

import json
from typing import Any

from . import _core
from .errors import ArgumentError, argument_error


def invalid(field: str, message: str) -> ArgumentError:
    """ArgumentError for a schema or grammar that does not compile: the field it came
    in and the compiler's message, which gives the position (line(column))."""
    e = ArgumentError(f"[generate] {field}: {message}")
    e.argument, e.value, e.expected = field, None, message
    return e


def _llguidance():
    try:
        import llguidance
        return llguidance
    except ImportError as e:  # a dependency of the package: only a broken install lacks it
        raise ImportError("constrained decoding needs llguidance: pip install llguidance") from e


class Grammar:
    """What a constrained call may generate: build one with json_schema, json_object,
    regex, lark or gbnf (or let Engine.generate's response_format= and grammar= do it).
    `field` names where it came from, for errors."""

    def __init__(self, kind: str, source: Any, compiled: str, field: str):
        self.kind, self.source, self.compiled, self.field = kind, source, compiled, field

    def __repr__(self) -> str:
        return f"Grammar.{self.kind}({self.source!r})"

    @classmethod
    def json_schema(cls, schema: dict | str, *, field: str = "json_schema") -> "Grammar":
        if isinstance(schema, str):
            try:
                schema = json.loads(schema)
            except json.JSONDecodeError as e:
                raise invalid(field, f"not JSON: {e}") from None
        if not isinstance(schema, dict):
            raise argument_error("generate", field, schema, "a JSON schema (a dict, or its JSON text)")
        try:
            compiled = _llguidance().LLMatcher.grammar_from_json_schema(schema)
        except ValueError as e:
            raise invalid(field, str(e)) from None
        return cls("json_schema", schema, compiled, field).check()

    @classmethod
    def json_object(cls, *, field: str = "response_format") -> "Grammar":
        """Any JSON object (OpenAI's response_format {"type": "json_object"})."""
        return cls.json_schema({"type": "object"}, field=field)

    @classmethod
    def regex(cls, pattern: str, *, field: str = "regex") -> "Grammar":
        if not isinstance(pattern, str):
            raise argument_error("generate", field, pattern, "a regular expression (str)")
        return cls("regex", pattern, _llguidance().LLMatcher.grammar_from_regex(pattern), field).check()

    @classmethod
    def lark(cls, text: str, *, field: str = "grammar") -> "Grammar":
        if not isinstance(text, str):
            raise argument_error("generate", field, text, "a Lark grammar (str)")
        return cls("lark", text, _llguidance().LLMatcher.grammar_from_lark(text), field).check()

    @classmethod
    def gbnf(cls, text: str, *, field: str = "grammar") -> "Grammar":
        """llama.cpp's GBNF, translated to Lark by llguidance."""
        if not isinstance(text, str):
            raise argument_error("generate", field, text, "a GBNF grammar (str)")
        from llguidance.gbnf_to_lark import gbnf_to_lark
        try:
            lark = gbnf_to_lark(text)
        except Exception as e:  # its parser's errors carry the position
            raise invalid(field, f"GBNF: {e}") from None
        return cls("gbnf", text, _llguidance().LLMatcher.grammar_from_lark(lark), field).check()

    @classmethod
    def of(cls, grammar) -> "Grammar":
        """grammar= as Engine.generate takes it: a Grammar, or the text of a GBNF
        grammar (it has '::=') or a Lark one."""
        if isinstance(grammar, Grammar):
            return grammar
        if isinstance(grammar, str):
            return cls.gbnf(grammar) if "::=" in grammar else cls.lark(grammar)
        raise argument_error("generate", "grammar", grammar, "a Grammar, or a GBNF or Lark grammar's text")

    @classmethod
    def from_response_format(cls, fmt) -> "Grammar | None":
        """OpenAI's response_format: {"type": "text"} (None), {"type": "json_object"}, or
        {"type": "json_schema", "json_schema": {"name": ..., "schema": {...}, "strict": ...}}."""
        if fmt is None:
            return None
        if not isinstance(fmt, dict) or not isinstance(fmt.get("type"), str):
            raise argument_error("generate", "response_format", fmt,
                                 "None or {'type': 'text' | 'json_object' | 'json_schema', ...}")
        kind = fmt["type"]
        if kind == "text":
            return None
        if kind == "json_object":
            return cls.json_object()
        if kind == "json_schema":
            spec = fmt.get("json_schema")
            if not isinstance(spec, dict) or "schema" not in spec:
                raise argument_error("generate", "response_format.json_schema", spec,
                                     "{'name': ..., 'schema': {...}, 'strict': bool}")
            return cls.json_schema(spec["schema"], field="response_format.json_schema.schema")
        raise argument_error("generate", "response_format.type", kind, "'text', 'json_object' or 'json_schema'")

    def check(self) -> "Grammar":
        """Raises ArgumentError naming the field and llguidance's message (with its position)."""
        error, messages = _llguidance().LLMatcher.validate_grammar_with_warnings(self.compiled, None)
        if error:
            raise invalid(self.field, messages[0].strip())
        return self

    def matcher(self, tokenizer) -> "Matcher":
        """A fresh matcher for one call (tokenizer: llg_tokenizer's)."""
        return Matcher(_llguidance().LLMatcher(tokenizer, self.compiled, log_level=0))


def grammar_of(response_format=None, grammar=None) -> Grammar | None:
    """The one Grammar of a call's response_format= and grammar= (at most one of them)."""
    g = Grammar.from_response_format(response_format)
    if grammar is not None:
        if g is not None:
            raise argument_error("generate", "grammar", grammar, "to come without a JSON response_format "
                                 "(one constraint a call)")
        g = Grammar.of(grammar)
    return g


class Matcher(_core.Constraint):
    """One call's constraint: llguidance's LLMatcher behind the engine's Constraint."""

    def __init__(self, matcher):
        super().__init__()
        self._m = matcher

    def fill_mask(self, address: int, n_words: int) -> None:
        self._m.unsafe_compute_mask_ptr(address, n_words * 4)  # (drops the GIL while it computes)

    def advance(self, id: int) -> bool:
        return self._m.consume_token(id)

    def rollback(self, n: int) -> None:
        self._m.rollback(n)

    def valid_prefix(self, ids: list[int]) -> int:
        return self._m.validate_tokens(ids)

    def done(self) -> bool:
        return self._m.is_stopped()

    def error(self) -> str:
        # the first line: llguidance follows it with a dump of its parser's state
        return (self._m.get_error() or "(no message)").split("\n", 1)[0]


def llg_tokenizer(loaded) -> Any:
    """llguidance's view of a loaded model's tokenizer (its tokenizer.json), over the
    model's vocab rows; built once per tokenizer (about a second for a 128k vocabulary).
    A model without a tokenizer cannot take a grammar: ArgumentError."""
    tokenizer = loaded.tokenizer
    if tokenizer is None:
        raise ArgumentError(f"[generate] response_format/grammar: {loaded.path.name} has no tokenizer, "
                            f"which a grammar needs (to know what text each id is)")
    cached = getattr(tokenizer, "_llg", None)
    if cached is None:
        cached = _llguidance().LLTokenizer(tokenizer._tok.to_str(), n_vocab=loaded.config.vocab,
                                           eos_token=list(loaded.config.eos_ids))
        tokenizer._llg = cached
    return cached
