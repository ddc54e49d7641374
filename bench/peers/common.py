"""What every peer of bench/compare.py shares: the run spec, the result, timing.

Timing convention, the same for every engine so that the numbers compare:
  prefill = feed the prompt ids and pick the first new token (argmax of the last row);
            prefill tok/s = prompt tokens / that time.
  decode  = the remaining steps, one token fed and one picked per step;
            decode tok/s = decode steps / that time.
Greedy (argmax) throughout, no stop on end-of-sequence ids (every engine runs the same
number of steps). Each engine gets one untimed warm-up generation, then `repeat` timed
ones; the median of each rate is reported.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field
from typing import Any, Callable


class PeerUnavailable(Exception):
    """The peer's package is not installed (or cannot run here); the message says why."""


@dataclass(frozen=True)
class RunSpec:
    model_path: str
    prompt_ids: tuple[int, ...]   # (n_prompt,) token ids, already tokenized by metalkv
    n_decode: int                 # new tokens per generation, the first one included
    repeat: int                   # timed runs; the median is reported
    threads: int                  # CPU threads asked of peers that take a count
    kv: str = "f16"               # the KV cache's K and V format: f16, q8 or q4 (llama.cpp: q8_0, q4_0)


@dataclass
class Timing:
    prefill_s: float
    decode_s: float
    tokens: list[int]             # (n_decode,) generated ids
    extra: dict[str, Any] = field(default_factory=dict)   # engine-specific counters


@dataclass
class PeerResult:
    engine: str
    prefill_tok_s: float | None = None
    decode_tok_s: float | None = None
    tokens: list[int] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)
    status: str = "ok"            # ok | not installed | failed


def timed(fn: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def summarize(engine: str, spec: RunSpec, runs: list[Timing]) -> PeerResult:
    """Median rates over the timed runs; tokens from the first run (runs are greedy, so they
    should all agree, and a note says so when they don't)."""
    n_prompt = len(spec.prompt_ids)
    steps = len(runs[0].tokens) - 1
    res = PeerResult(engine)
    res.prefill_tok_s = statistics.median(n_prompt / r.prefill_s for r in runs)
    if steps > 0:
        res.decode_tok_s = statistics.median(steps / r.decode_s for r in runs)
    res.tokens = list(runs[0].tokens)
    if any(r.tokens != runs[0].tokens for r in runs[1:]):
        res.notes.append("greedy tokens differ between repeats")
    res.extra["prefill_s"] = [round(r.prefill_s, 6) for r in runs]
    res.extra["decode_s"] = [round(r.decode_s, 6) for r in runs]
    return res


def measure(engine: str, spec: RunSpec, generate: Callable[[], Timing]) -> PeerResult:
    """One warm-up generation, then spec.repeat timed ones."""
    generate()
    runs, busy = [], []
    for _ in range(spec.repeat):
        c0, t0 = time.process_time(), time.perf_counter()
        runs.append(generate())
        busy.append((time.process_time() - c0) / (time.perf_counter() - t0))
    res = summarize(engine, spec, runs)
    # CPU seconds per wall second over a whole generation: how many cores it kept busy
    res.extra["cores_busy"] = round(statistics.median(busy), 2)
    for key in runs[0].extra:
        vals = [r.extra[key] for r in runs]
        res.extra[key] = statistics.median(vals) if all(
            isinstance(v, (int, float)) for v in vals) else vals[0]
    return res
