"""A numpy float64 reference for attention over metalkv's KV-cache layout,
written for clarity rather than speed, plus a helper that builds the cache.

Cache of one layer: a pool, half (2, R, n_kv_heads, D), K block then V block,
cut into blocks of B = 32 slots; a block table (uint32, one entry per B
positions) names the pool block of each: position p sits in slot
table[p // B] * B + p % B.
"""
from __future__ import annotations

from typing import NamedTuple

import numpy as np


B = 32  # tokens per block: metalkv._core.BLOCK_TOKENS, restated (the kernels' kKvBlockTokens)


class Paged(NamedTuple):
    pool: np.ndarray   # (2, slots, n_kv_heads, D) float16
    table: np.ndarray  # (ceil(n / B),) uint32

    @property
    def slots(self) -> int:
        return self.pool.shape[1]


def build_cache(k: np.ndarray, v: np.ndarray, *, first: int = 0, spare: int = 1, shuffle: bool = True,
                poison: bool = True) -> Paged:
    """Places positions first..n-1 of k and v (n, n_kv_heads, D) into a pool
    whose blocks are in random order (shuffle; seeded by n), with `spare`
    blocks more. Table entries of blocks wholly before `first` name a spare
    block, and every slot that holds no position in [first, n) is NaN (poison)
    or zero: a kernel that reads one spoils its output."""
    n, n_kv, d = k.shape
    n_logical = -(-n // B)
    first_block = first // B
    held = n_logical - first_block
    order = np.arange(held + spare)
    if shuffle:
        order = np.random.default_rng(n).permutation(order)
    table = np.empty(n_logical, np.uint32)
    table[first_block:] = order[:held]
    table[:first_block] = order[held] if spare else order[0]
    pool = np.full((2, (held + spare) * B, n_kv, d), np.nan if poison else 0.0, dtype=np.float16)
    for p in range(first, n):
        s = int(table[p // B]) * B + p % B
        pool[0, s] = k[p]
        pool[1, s] = v[p]
    return Paged(pool, table)


def visible(key_pos: int, query_pos: int, window: int) -> bool:
    """Causal mask, and for a sliding layer the window: key pos > query pos - W."""
    if key_pos > query_pos:
        return False
    if window > 0 and key_pos <= query_pos - window:
        return False
    return True


def last_key(query_pos: int, blocks=()) -> int:
    """The last key position a query sees: its own, or its bidirectional block's last."""
    for lo, hi in blocks:
        if lo <= query_pos < hi:
            return hi - 1
    return query_pos


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos0: int, *, scale: float,
              window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None,
              blocks=()) -> np.ndarray:
    """Attention of queries q (n_q, n_q_heads, D) at positions q_pos0.. over keys
    and values k, v (n, n_kv_heads, D) at positions 0..n-1, in float64.

    GQA: query head h uses KV head h // (n_q_heads // n_kv_heads).
    softcap c > 0: s = c * tanh(s / c), before masking (Gemma 2).
    sinks (n_q_heads): a virtual key per head with logit sinks[h] and a zero
    value; it only adds exp(sinks[h] - m) to the softmax denominator (gpt-oss).
    blocks [(lo, hi), ...]: a query in [lo, hi) also sees the keys after it up to hi - 1.
    """
    q = q.astype(np.float64)
    k = k.astype(np.float64)
    v = v.astype(np.float64)
    n_q, n_q_heads, d = q.shape
    n, n_kv_heads, _ = k.shape
    group = n_q_heads // n_kv_heads
    out = np.zeros((n_q, n_q_heads, d))
    for i in range(n_q):
        qpos = q_pos0 + i
        hi = last_key(qpos, blocks)
        mask = np.array([p <= hi and visible(min(p, qpos), qpos, window) for p in range(n)])
        for h in range(n_q_heads):
            kvh = h // group
            s = (k[:, kvh, :] @ q[i, h]) * scale
            if softcap > 0:
                s = softcap * np.tanh(s / softcap)
            s = np.where(mask, s, -np.inf)
            logits = s if sinks is None else np.append(s, float(sinks[h]))
            m = logits.max()
            w = np.exp(logits - m)
            denom = w.sum()
            out[i, h] = (w[:n] @ v[:, kvh, :]) / denom  # the sink's value is zero
    return out
