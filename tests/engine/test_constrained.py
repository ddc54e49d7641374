"""Constrained decoding (docs/CONSTRAINED.md) on tiny models: a Constraint written
here (the ids it allows are a rule of ours) against a numpy loop over
Engine.logits that takes the argmax of the allowed ids; llguidance's regex, Lark
and GBNF grammars over the tiny 64-token vocabulary, every reply checked with
Python's re; logit_bias; speculative decoding and batching under a constraint;
the errors."""
import re

import numpy as np
import pytest

import metalkv
from metalkv import _core

from .test_batching import load, tiny, tiny_text  # noqa: F401 (fixtures)


class Allow(_core.Constraint):
    """Allows the ids rule(history) returns (a set), done after `length` ids."""

    def __init__(self, rule, length):
        super().__init__()
        self.rule, self.length, self.taken, self.calls = rule, length, [], []

    def fill_mask(self, address, n_words):
        import ctypes
        words = (ctypes.c_uint32 * n_words).from_address(address)
        for w in range(n_words):
            words[w] = 0
        for i in self.rule(self.taken):
            words[i // 32] |= 1 << (i % 32)
        self.calls.append("mask")

    def advance(self, id):
        if id not in self.rule(self.taken):
            return False
        self.taken.append(id)
        return True

    def rollback(self, n):
        del self.taken[len(self.taken) - n:]
        self.calls.append(f"rollback {n}")

    def valid_prefix(self, ids):
        hist = list(self.taken)
        for k, i in enumerate(ids):
            if i not in self.rule(hist):
                return k
            hist.append(i)
        return len(ids)

    def done(self):
        return len(self.taken) >= self.length

    def error(self):
        return "not allowed"


def alternating(hist):
    """Even ids after an odd one (or at the start), odd ids after an even one; never 0..2."""
    odd = not hist or hist[-1] % 2 == 1
    return {i for i in range(3, 64) if (i % 2 == 0) == odd}


def reference(engine, prompt, rule, n, bias=None):
    """Greedy: argmax of (logits + bias) over the allowed ids, step by step."""
    out = []
    for _ in range(n):
        x = engine.logits(list(prompt) + out)[-1].astype(np.float64)
        for i, b in (bias or {}).items():
            x[i] += np.float32(b)
        allowed = sorted(rule(out))
        out.append(allowed[int(np.argmax(x[allowed]))])
    return out


def test_a_constraint_of_our_own_against_numpy(tiny):
    prompt = [5, 9, 13, 20, 7]
    c = Allow(alternating, 24)
    ids = _generate(tiny, prompt, constraint=c, max_tokens=100)
    assert tiny.last_stats["finish_reason"] == "stop"  # done() after 24 ids ends the call
    assert ids == reference(tiny, prompt, alternating, 24)
    assert c.calls.count("mask") == 24


def _generate(engine, prompt, cache=None, **kw):
    c = cache if cache is not None else engine.new_cache()
    r = engine._core.submit(c, np.asarray(prompt, np.int64), **{"stop_ids": [], **kw})
    ids = r.result()
    engine.last_stats = dict(r.stats, finish_reason=r.finish_reason)
    return ids


def test_logit_bias_against_numpy(tiny):
    prompt = [4, 8, 15, 16, 23, 42]
    bias = {10: 3.0, 11: -100.0, 40: 1.5, 63: 2.25}
    free = lambda hist: set(range(64))  # noqa: E731
    ids = _generate(tiny, prompt, max_tokens=20, logit_bias=bias)
    assert ids == reference(tiny, prompt, free, 20, bias)
    assert ids != _generate(tiny, prompt, max_tokens=20)  # it changes the reply


def test_speculation_under_a_constraint_is_exact(tiny):
    """Lookup proposals the constraint refuses are cut before the step; row i is
    masked after its proposals 1..i, taken back after: the ids are those without
    speculation, and the rule is kept."""
    rule = lambda hist: {i for i in range(3, 64) if i % 5 != 0}  # noqa: E731
    prompt = ([7, 8, 9, 10, 11, 12] * 4)[:20]
    plain = _generate(tiny, prompt, max_tokens=40, constraint=Allow(rule, 10**6))
    c = Allow(rule, 10**6)
    spec = _generate(tiny, prompt, max_tokens=40, constraint=c, speculate="lookup")
    assert spec == plain and all(i % 5 for i in spec)
    assert tiny.last_stats["draft_proposed"] > 0
    assert any(x.startswith("rollback") for x in c.calls)


def test_batched_calls_each_with_its_own_constraint(tiny):
    prompts = [[3, 4, 5], [10, 11, 12, 13], [20, 21]]
    rules = [alternating, lambda h: {i for i in range(3, 64) if i % 3 == 0}, lambda h: set(range(30, 40))]
    alone = [_generate(tiny, p, max_tokens=16, constraint=Allow(r, 16)) for p, r in zip(prompts, rules)]
    ch = _core.Channel()
    reqs = [tiny._core.submit(tiny.new_cache(), np.asarray(p, np.int64), max_tokens=16, stop_ids=[], channel=ch,
                              constraint=Allow(r, 16)) for p, r in zip(prompts, rules)]
    assert [r.result() for r in reqs] == alone
    assert max(r.stats["max_batch"] for r in reqs) > 1


def test_a_constraint_that_allows_nothing_ends_the_call(tiny):
    with pytest.raises(metalkv.GpuError, match=r"\[constraint\] it allows no token here"):
        _generate(tiny, [5, 6], max_tokens=8, constraint=Allow(lambda h: set() if len(h) == 3 else {7, 8}, 99))


# -- llguidance ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def text_engine(tiny_text):
    return load(tiny_text, context=256)


GRAMMARS = [  # (how, the grammar, the regex its replies match)
    ("regex", r"[a-h]{3,6}( [a-z]{2}){2}", r"[a-h]{3,6}( [a-z]{2}){2}"),
    ("regex", r"(ab|cd|ef)+ x", r"(ab|cd|ef)+ x"),
    ("lark", 'start: word (" " word){1,3}\nword: /[a-e]{2,4}/', r"[a-e]{2,4}( [a-e]{2,4}){1,3}"),
    ("gbnf", 'root ::= "go" [a-c]{1,3} " " ("yes" | "no")', r"go[a-c]{1,3} (yes|no)"),
]


@pytest.mark.parametrize("how,grammar,pattern", GRAMMARS)
@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.5, seed=3)])
def test_llguidance_replies_match_their_grammar(text_engine, how, grammar, pattern, sampling):
    g = {"regex": metalkv.Grammar.regex, "lark": metalkv.Grammar.lark, "gbnf": metalkv.Grammar.gbnf}[how](grammar)
    texts = text_engine.generate(["abc", "hello world", "x"], grammar=g, chat=False, max_tokens=40, **sampling)
    for t in texts:
        assert re.fullmatch(pattern, t), (grammar, t)
    assert all(r["finish_reason"] == "stop" for r in text_engine.last_stats["requests"])


def test_grammar_text_is_gbnf_or_lark(text_engine):
    assert re.fullmatch("(ab|cd)", text_engine.generate("a", grammar='root ::= "ab" | "cd"', chat=False))
    assert re.fullmatch("(ab|cd)", text_engine.generate("a", grammar='start: "ab" | "cd"', chat=False))


def test_speculation_with_a_grammar_is_exact(text_engine):
    kw = dict(grammar=metalkv.Grammar.regex("(abc ){2,12}d"), chat=False, max_tokens=60)
    prompt = "abc abc abc abc abc abc"
    plain = text_engine.generate(prompt, **kw)
    assert text_engine.generate(prompt, speculate="lookup", **kw) == plain
    assert re.fullmatch("(abc ){2,12}d", plain)


@pytest.mark.parametrize("kw,match", [
    (dict(grammar="start: foo"), r"\[generate\] grammar: .*unknown name.*foo"),
    (dict(grammar=metalkv.Grammar.regex), r"grammar="),
    (dict(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "objectx"}}}),
     r"response_format.json_schema.schema: .*objectx"),
    (dict(response_format={"type": "yaml"}), r"response_format.type='yaml'"),
    (dict(response_format={"type": "json_object"}, grammar='start: "a"'), r"one constraint a call"),
    (dict(logit_bias=[1, 2]), r"logit_bias"),
    (dict(logit_bias={1: 101.0}), r"biases in \[-100, 100\]"),
    (dict(logit_bias={64: 1.0}), r"token ids in 0..63"),
])
def test_bad_constraints_are_clear_errors(text_engine, kw, match):
    with pytest.raises(metalkv.ArgumentError, match=match):
        text_engine.generate("abc", chat=False, max_tokens=4, **kw)


def test_regex_errors_name_the_position():
    with pytest.raises(metalkv.ArgumentError, match=r"(?s)regex: at .*unclosed character class"):
        metalkv.Grammar.regex("[a-z")


def test_a_constrained_call_takes_its_prompt_from_the_prefix_cache(text_engine):
    """The prompt's blocks come from the shared pool's prefix cache; the constrained reply
    is the one it gets computing them."""
    prompt = "abcd " * 40
    kw = dict(grammar=metalkv.Grammar.regex("[a-d]{2,8}( [a-d]{2,8}){3}"), chat=False, max_tokens=40)
    first = text_engine.generate(prompt, **kw)
    again = text_engine.generate(prompt, **kw)
    assert text_engine.last_stats["prompt_tokens_cached"] >= 32
    assert again == first and re.fullmatch("[a-d]{2,8}( [a-d]{2,8}){3}", again)


def test_a_format_the_vocabulary_cannot_write_fails_the_call_in_one_line(text_engine):
    """The tiny vocabulary has no '{': a JSON reply cannot be written. The call fails with
    the matcher's message (its first line, not its parser dump), the engine goes on."""
    with pytest.raises(metalkv.GpuError, match=r"^\[constraint\] [^\n]+$"):
        text_engine.generate("abc", response_format={"type": "json_object"}, chat=False, max_tokens=8)
    assert text_engine.generate("abc", chat=False, max_tokens=4) is not None


def test_a_model_without_a_tokenizer_cannot_take_a_grammar(tiny):
    with pytest.raises(metalkv.ArgumentError, match=r"response_format/grammar: .* has no tokenizer"):
        tiny.generate_ids([1, 2, 3], max_tokens=4, response_format={"type": "json_object"})
