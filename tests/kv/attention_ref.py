"""A numpy float64 reference for attention over metalkv's KV-cache layout,
written for clarity rather than speed, plus helpers that build the cache.

Cache of one layer: half (2, R, n_kv_heads, D), K block then V block. With n
tokens stored, slot s < min(n, R) holds position p(s) = (n-1) - ((n-1-s) mod R).
"""
from __future__ import annotations

import numpy as np


def slot_position(s: int, n: int, slots: int) -> int:
    """The position slot s holds after n tokens were stored (the p(s) rule)."""
    return (n - 1) - ((n - 1 - s) % slots)


def build_cache(k: np.ndarray, v: np.ndarray, slots: int, poison: bool = False) -> np.ndarray:
    """Places keys/values of positions 0..n-1, k and v (n, n_kv_heads, D), into a
    (2, slots, n_kv_heads, D) half cache by the p(s) rule: a ring buffer keeps
    the last `slots` positions. Unused slots are zero, or NaN with poison=True
    (a kernel that reads them would spoil its output)."""
    n, n_kv, d = k.shape
    cache = np.full((2, slots, n_kv, d), np.nan if poison else 0.0, dtype=np.float16)
    for s in range(min(n, slots)):
        p = slot_position(s, n, slots)
        cache[0, s] = k[p]
        cache[1, s] = v[p]
    return cache


def visible(key_pos: int, query_pos: int, window: int) -> bool:
    """Causal mask, and for a sliding layer the window: key pos > query pos - W."""
    if key_pos > query_pos:
        return False
    if window > 0 and key_pos <= query_pos - window:
        return False
    return True


def attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos0: int, *, scale: float,
              window: int = 0, softcap: float = 0.0, sinks: np.ndarray | None = None) -> np.ndarray:
    """Attention of queries q (n_q, n_q_heads, D) at positions q_pos0.. over keys
    and values k, v (n, n_kv_heads, D) at positions 0..n-1, in float64.

    GQA: query head h uses KV head h // (n_q_heads // n_kv_heads).
    softcap c > 0: s = c * tanh(s / c), before masking (Gemma 2).
    sinks (n_q_heads): a virtual key per head with logit sinks[h] and a zero
    value; it only adds exp(sinks[h] - m) to the softmax denominator (gpt-oss).
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
        mask = np.array([visible(p, qpos, window) for p in range(n)])
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
