"""Decode-time perplexity of a compressed KV cache, beside the f16 cache
(`metalkv ppl`, bench/kv_quant.py; ../shared/DESIGN.md "Judging compression
honestly").

The text's ids are fed in chunks of a few tokens into a cache, and each chunk's
logits come from attention over what the cache holds: every earlier token as
the cache stores it (quantized, for a quantized cache), the chunk's own tokens
too (they are stored before attention reads them). One prefill pass over
float K/V never reads a compressed cache, so it is never used here.

Every candidate runs in lockstep with an f16 cache on the same ids, so the
result holds, per candidate: perplexity, its change against f16, the mean KL
divergence KL(f16 || candidate) of the next-token distributions, the share of
positions whose top-1 token agrees with f16's, the cache's KV bytes per token, and
the most KV bytes it held (an eviction policy's budget shows there: its full
layers cost nothing per token, they hold a fixed number).
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from .models.progress import progress_bar


@dataclass
class PplResult:
    label: str
    tokens: int                 # scored predictions
    ppl: float
    bytes_per_token: int        # KV bytes one more context token costs (cache.bytes_per_token)
    seconds: float
    kl: float | None = None     # mean KL(f16 || this), nats; None for the f16 reference itself
    top1: float | None = None   # share of positions whose argmax agrees with f16's
    f16_ppl: float | None = None
    f16_bytes_per_token: int | None = None
    held_bytes: int = 0         # the most KV bytes the cache's blocks held after a chunk
    f16_held_bytes: int = 0
    extra: dict = field(default_factory=dict)

    @property
    def ppl_change(self) -> float | None:
        """Relative change against the f16 cache's perplexity (0.01 = +1 %)."""
        return None if self.f16_ppl is None else self.ppl / self.f16_ppl - 1.0

    def row(self) -> dict:
        return {"label": self.label, "tokens": self.tokens, "ppl": self.ppl, "ppl_change": self.ppl_change,
                "kl": self.kl, "top1": self.top1, "bytes_per_token": self.bytes_per_token,
                "bytes_vs_f16": (None if not self.f16_bytes_per_token or not self.bytes_per_token else
                                 self.f16_bytes_per_token / self.bytes_per_token),
                "held_bytes": self.held_bytes,
                "held_vs_f16": None if not self.held_bytes else self.f16_held_bytes / self.held_bytes,
                "seconds": self.seconds, **self.extra}


def log_softmax(logits: np.ndarray) -> np.ndarray:
    x = logits.astype(np.float64)
    x -= x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class _Run:
    """One cache's running totals."""

    def __init__(self, label: str, cache):
        self.label, self.cache = label, cache
        self.nll = self.kl = 0.0
        self.agree = self.n = 0
        self.seconds = 0.0
        self.held = 0


def text_ids(engine, path: str, n_tokens: int) -> np.ndarray:
    """The first n_tokens + 1 ids of the text file (BOS first if the model has one)."""
    with open(path, encoding="utf-8") as f:
        text = f.read((n_tokens + 1) * 16)  # tokens are longer than a character: enough text, not the book
    ids = np.asarray(engine.tokenizer.encode(text, add_special=True), np.int32)
    if len(ids) < n_tokens + 1:
        raise ValueError(f"[ppl] {path} holds {len(ids)} tokens; {n_tokens} scored tokens need {n_tokens + 1}")
    return ids[:n_tokens + 1]


def score(engine, ids, candidates: dict[str, dict], *, chunk: int = 16,
          progress: bool | None = None) -> list[PplResult]:
    """Perplexity of the f16 cache and of each candidate, {label: new_cache keywords},
    over ids (predictions of ids[1:]), fed `chunk` ids per call. Returns the f16
    reference first. progress: a bar of the tokens scored on stderr (None: on a
    terminal unless METALKV_NO_PROGRESS is set)."""
    if not isinstance(chunk, int) or chunk < 1:
        raise ValueError(f"[ppl] chunk={chunk!r}: expected a positive int (ids fed per call)")
    ids = np.asarray(ids, np.int32)
    if len(ids) < 2:
        raise ValueError("[ppl] at least 2 ids are needed (the first is only context)")
    cap = len(ids)
    runs = [_Run("f16", engine.new_cache(capacity=cap, kv_k="f16", kv_v="f16", kv_f16_layers=(), kv_rotate=False,
                                         kv_residual=0, kv_policy="none"))]
    runs += [_Run(label, engine.new_cache(capacity=cap, **kw)) for label, kw in candidates.items()]
    chunks = range(0, len(ids) - 1, chunk)
    for lo in progress_bar(chunks, desc=f"scoring {len(runs)} caches", progress=progress, unit="chunk"):
        hi = min(lo + chunk, len(ids) - 1)  # feed ids[lo:hi], predict ids[lo+1:hi+1]
        targets = ids[lo + 1:hi + 1]
        ref = None
        for run in runs:
            t0 = time.perf_counter()
            lp = log_softmax(engine.logits(ids[lo:hi], cache=run.cache))
            run.seconds += time.perf_counter() - t0
            run.held = max(run.held, run.cache.held_nbytes)
            run.nll -= float(lp[np.arange(len(targets)), targets].sum())
            run.n += len(targets)
            if ref is None:
                ref = lp
                continue
            p = np.exp(ref)
            run.kl += float((p * (ref - lp)).sum())
            run.agree += int((ref.argmax(-1) == lp.argmax(-1)).sum())
    f16 = runs[0]
    out = []
    for run in runs:
        is_ref = run is f16
        out.append(PplResult(run.label, run.n, float(np.exp(run.nll / run.n)), run.cache.bytes_per_token,
                             run.seconds, None if is_ref else run.kl / run.n, None if is_ref else run.agree / run.n,
                             float(np.exp(f16.nll / f16.n)), f16.cache.bytes_per_token, run.held, f16.held))
    return out


def format_table(results: list[PplResult]) -> str:
    head = (f"{'cache':<24} {'tokens':>6} {'PPL':>9} {'vs f16':>8} {'KL':>8} {'top-1':>7} {'B/token':>8} "
            f"{'smaller':>8} {'KV held':>8}")
    lines = [head]
    for r in results:
        d = r.row()
        change = "" if r.ppl_change is None or r.label == "f16" else f"{100 * r.ppl_change:+.2f}%"
        kl = "" if r.kl is None else f"{r.kl:.4f}"
        top1 = "" if r.top1 is None else f"{100 * r.top1:.1f}%"
        per_token = "" if d["bytes_vs_f16"] is None else f"{d['bytes_vs_f16']:.2f}x"
        held = "" if d["held_vs_f16"] is None else f"{d['held_vs_f16']:.2f}x"
        lines.append(f"{r.label:<24} {r.tokens:>6} {r.ppl:>9.3f} {change:>8} {kl:>8} {top1:>7} "
                     f"{r.bytes_per_token:>8} {per_token:>8} {held:>8}")
    return "\n".join(lines)
