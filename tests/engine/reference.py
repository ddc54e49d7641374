"""A float64 numpy forward of the Llama family, written for clarity, as the
independent reference for the engine's model tests.

It reads the same canonical tensors the engine does (dequantized by gguf-py,
not by metalkv), and rounds K and V to float16 where the engine's cache stores
them; everything else is float64.
"""
from __future__ import annotations

import numpy as np

from metalkv.models import LoadedModel, rope_freq_factors


def dequantized(m: LoadedModel) -> dict[str, np.ndarray]:
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    out = {}
    for name, t in m.tensors.items():
        if t.quantized:
            a = dequantize(t.data, GGMLQuantizationType[t.dtype.upper()])
        elif t.dtype == "bf16":
            a = (t.data.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
        else:
            a = t.data
        out[name] = np.asarray(a, np.float64).reshape(t.shape)
    return out


def rope(x: np.ndarray, pos: np.ndarray, inv_freq: np.ndarray, style: str) -> np.ndarray:
    """x (n, heads, d) rotated at positions pos; pairs (2i, 2i+1) when interleaved,
    (i, i + d/2) for neox."""
    ang = pos[:, None] * inv_freq[None, :]               # (n, d/2)
    c, s = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    d = x.shape[-1]
    i0, i1 = (np.arange(0, d, 2), np.arange(1, d, 2)) if style == "interleaved" else \
        (np.arange(d // 2), np.arange(d // 2, d))
    out = x.copy()
    out[..., i0] = x[..., i0] * c - x[..., i1] * s
    out[..., i1] = x[..., i0] * s + x[..., i1] * c
    return out


def f16_storage(k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The f16 cache: K and V rounded to float16."""
    return tuple(a.astype(np.float16).astype(np.float64) for a in (k, v))


def residual_view(n: int, residual: int, block: int = 32, ring_lo: int = 0, ring_lo_from: int = 0) -> np.ndarray:
    """(n, n) bool: query p reads key j from the quantized storage (True) or
    from the full-precision residual window (False). The window of query p is
    its last `residual` positions and the block they start in: keys before
    S(p) = max(0, floor((p + 1 - residual) / block) * block) are quantized.
    ring_lo: the queries from ring_lo_from on (those computed after the cache
    lost its window's rows below ring_lo: a truncate deeper than its ring
    reaches) also read every key before ring_lo quantized."""
    p = np.arange(n)
    s = np.maximum(0, (p + 1 - residual) // block * block)
    s = np.where(p >= ring_lo_from, np.maximum(s, ring_lo), s)
    return np.arange(n)[None, :] < s[:, None]


def llama_logits(m: LoadedModel, ids: list[int], W: dict[str, np.ndarray] | None = None,
                 storage=f16_storage, residual: int = 0, window_storage=f16_storage,
                 ring_lo: int = 0, ring_lo_from: int = 0, visible=None, probs: dict | None = None,
                 kv_share: dict[int, int] | None = None) -> np.ndarray:
    """(n, vocab) logits of ids at positions 0..n-1 (full causal attention).
    storage(k, v) -> (k, v): what attention reads back of the roped K and of V
    (n, n_kv_heads, head_dim) as the cache stores them (default: float16).
    residual > 0: each query reads its residual window (residual_view) from
    window_storage (default: float16) and only the keys before it from storage
    (residual_view, with ring_lo and ring_lo_from).
    visible(layer, kv_head) -> (n, n) bool: the keys each query may see besides
    the causal mask (an eviction policy's); probs: filled with each (layer,
    query head)'s (n, n) attention probabilities. kv_share {reader: source}: a reader layer
    attends over its source layer's stored K and V (a source that reads: that one's)
    with its own queries, and computes no K and V of its own."""
    cfg = m.config
    assert cfg.arch == "llama", "this reference covers the llama family"
    W = dequantized(m) if W is None else W
    n, D, nh, nkv = len(ids), cfg.head_dim, cfg.n_heads, cfg.n_kv_heads
    pos = np.arange(n, dtype=np.float64)
    inv_freq = cfg.rope_theta ** (-np.arange(0, D, 2, dtype=np.float64) / D)
    factors = rope_freq_factors(cfg)
    if factors is not None:
        inv_freq = inv_freq / factors

    def rms(x, w):
        return x / np.sqrt((x * x).mean(-1, keepdims=True) + cfg.rms_eps) * w

    def proj(h, name):
        y = h @ W[name + ".weight"].T
        return y + W[name + ".bias"] if name + ".bias" in W else y

    x = W["token_embd.weight"][ids] * cfg.embedding_scale
    causal = np.tril(np.ones((n, n), bool))
    share = {r % cfg.n_layers: s % cfg.n_layers for r, s in (kv_share or {}).items()}
    stored = {}  # layer -> its (k, v) before storage
    for layer in range(cfg.n_layers):
        p = f"blk.{layer}."
        h = rms(x, W[p + "attn_norm.weight"])
        q = rope(proj(h, p + "attn_q").reshape(n, nh, D), pos, inv_freq, cfg.rope_style)
        if layer in share:
            k, v = stored[share[layer]]
            stored[layer] = k, v
        else:
            k = rope(proj(h, p + "attn_k").reshape(n, nkv, D), pos, inv_freq, cfg.rope_style)
            v = proj(h, p + "attn_v").reshape(n, nkv, D)
            stored[layer] = k, v
        kq, vq = storage(k, v)  # what the cache gives back
        kf, vf = window_storage(k, v) if residual else (kq, vq)
        quant = residual_view(n, residual, ring_lo=ring_lo, ring_lo_from=ring_lo_from) if residual \
            else np.ones((n, n), bool)
        o = np.empty((n, nh, D))
        for hq in range(nh):
            g = hq // (nh // nkv)
            s = np.where(quant, q[:, hq] @ kq[:, g].T, q[:, hq] @ kf[:, g].T) * cfg.attn_scale
            s = np.where(causal if visible is None else causal & visible(layer, g), s, -np.inf)
            pr = np.exp(s - s.max(1, keepdims=True))
            pr = pr / pr.sum(1, keepdims=True)
            if probs is not None:
                probs[layer, hq] = pr
            o[:, hq] = np.where(quant, pr, 0) @ vq[:, g] + np.where(quant, 0, pr) @ vf[:, g]
        x = x + o.reshape(n, nh * D) @ W[p + "attn_output.weight"].T
        h = rms(x, W[p + "ffn_norm.weight"])
        gate, up = h @ W[p + "ffn_gate.weight"].T, h @ W[p + "ffn_up.weight"].T
        x = x + (gate / (1 + np.exp(-gate)) * up) @ W[p + "ffn_down.weight"].T
    head = W["token_embd.weight"] if cfg.tie_embeddings else W["output.weight"]
    return rms(x, W["output_norm.weight"]) @ head.T
