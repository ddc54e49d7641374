"""The attention kernels' policy outputs (issue 15; ops.attention_decode /
attention_prefill with logits= and scores=): every visible key's scaled logit
as the kernel computed it, and attention_scores' per-KV-head probability sums,
against the float64 reference (attention_ref.py's softmax, restated here per
key). Decode single pass and split-K, prefill with a first scoring row, f16
and quantized K (the _kvq reader), GQA groups of 1, 4 and 8."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops
from devices import host_only  # tests/ is on sys.path

from . import kv_quant_ref as qr
from .attention_ref import build_cache
from .test_kv_quant import quant_pool


def logits_ref(q, k, q_pos0, scale, softcap=0.0):
    """(n_q, n_q_heads, n) scaled logits, -inf where masked (causal)."""
    q, k = q.astype(np.float64), k.astype(np.float64)
    n_q, n_q_heads, _ = q.shape
    n, n_kv, _ = k.shape
    group = n_q_heads // n_kv
    s = np.einsum("qhd,nhd->qhn", q, np.repeat(k, group, axis=1)) * scale
    if softcap:
        s = softcap * np.tanh(s / softcap)
    causal = np.arange(n)[None, :] <= (q_pos0 + np.arange(n_q))[:, None]
    return np.where(causal[:, None, :], s, -np.inf)


def scores_ref(s, n_kv, row_lo):
    """(n_kv, n): the probability of each key summed over rows row_lo.. and each KV head's query heads."""
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    n_q, n_q_heads, n = p.shape
    return p[row_lo:].sum(0).reshape(n_kv, n_q_heads // n_kv, n).sum(1)


def inputs(rng, n_q, n_q_heads, n_kv, d, n):
    q = rng.standard_normal((n_q, n_q_heads, d)).astype(np.float32)
    k = rng.standard_normal((n, n_kv, d)).astype(np.float16)
    v = rng.standard_normal((n, n_kv, d)).astype(np.float16)
    return q, k, v


@pytest.mark.parametrize("d,n_q_heads,n_kv", [(64, 8, 2), (128, 8, 1), (64, 3, 3)])
@pytest.mark.parametrize("split", ["never", "always"])
@pytest.mark.parametrize("kv_k", ["f16", "q8"])
def test_decode_writes_the_logits_and_the_scores(dev, shape, d, n_q_heads, n_kv, split, kv_k):
    rng = np.random.default_rng(d + n_q_heads)
    n, scale, softcap = 300, 1 / np.sqrt(d), 30.0
    q, k, v = inputs(rng, 1, n_q_heads, n_kv, d, n)
    if kv_k == "f16":
        c = build_cache(k, v)
        pool, table, slots = c.pool, c.table, c.slots
        kk = k
    else:
        pool, table, slots = quant_pool(k, v, qr.section_format("q8", 0), qr.section_format("f16", 1), spare=1)
        kk = qr.roundtrip(k, qr.section_format("q8", 0))
    logits = dev.buffer(n_q_heads * n * 4)
    scores = dev.buffer_from(np.full((n_kv, n + 7), 0.5, np.float32))  # adds to what is there
    out = dev.buffer(n_q_heads * d * 4)
    ops.attention_decode(dev, dev.buffer_from(q[0]), dev.buffer_from(pool), dev.buffer_from(table), out,
                         n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_tokens=n, slots=slots, split=split,
                         chunks=3 if split == "always" else 0, softcap=softcap, kv_k=kv_k, logits=logits,
                         scores=scores, score_stride=n + 7, variant=shape)
    want = logits_ref(q, kk, n - 1, scale, softcap)
    got = logits.numpy().view(np.float32).reshape(1, n_q_heads, n)
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)
    got_s = scores.numpy().view(np.float32).reshape(n_kv, n + 7)
    np.testing.assert_allclose(got_s[:, :n], 0.5 + scores_ref(want, n_kv, 0), rtol=1e-4, atol=1e-6)
    np.testing.assert_array_equal(got_s[:, n:], 0.5)  # past n_tokens: untouched


@pytest.mark.parametrize("d,n_q_heads,n_kv", [(64, 8, 2), (128, 4, 4)])
@pytest.mark.parametrize("row_lo", [0, 30])
def test_prefill_writes_the_logits_and_the_scores_of_rows_from_row_lo(dev, prefill_shape, d, n_q_heads, n_kv, row_lo):
    rng = np.random.default_rng(d + row_lo)
    n, n_q, scale = 170, 40, 1 / np.sqrt(d)
    q, k, v = inputs(rng, n_q, n_q_heads, n_kv, d, n)
    c = build_cache(k, v)
    logits = dev.buffer_from(np.full((n_q, n_q_heads, n), np.nan, np.float32))
    scores = dev.buffer(n_kv * n * 4)
    out = dev.buffer(q.nbytes)
    ops.attention_prefill(dev, dev.buffer_from(q), dev.buffer_from(c.pool), dev.buffer_from(c.table), out,
                          n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_queries=n_q, q_pos0=n - n_q,
                          slots=c.slots, logits=logits, scores=scores, score_rows_from=row_lo, variant=prefill_shape)
    want = logits_ref(q, k, n - n_q, scale)
    got = logits.numpy().view(np.float32).reshape(n_q, n_q_heads, n)
    seen = np.isfinite(want)
    np.testing.assert_allclose(got[seen], want[seen], rtol=1e-4, atol=1e-4)  # (masked keys are not written)
    np.testing.assert_allclose(scores.numpy().view(np.float32).reshape(n_kv, n), scores_ref(want, n_kv, row_lo),
                               rtol=1e-4, atol=1e-6)


@host_only
@pytest.mark.parametrize("variant,stats", [("", "attn_scores_stats_h"), ("host", "attn_scores_stats_h"),
                                           ("gpu", "attn_scores_stats")])
def test_the_stats_kernel_follows_the_attention_shape(variant, stats):
    """The host runs its one-thread stats form with its own attention shape and
    the GPU's 256-thread form with the GPU's, so the tests above hold both."""
    dev = metalkv.Device("host", profile=True)
    q, k, v = inputs(np.random.default_rng(3), 1, 4, 2, 64, 40)
    c = build_cache(k, v)
    ops.attention_decode(dev, dev.buffer_from(q[0]), dev.buffer_from(c.pool), dev.buffer_from(c.table),
                         dev.buffer(4 * 64 * 4), n_q_heads=4, n_kv_heads=2, head_dim=64, n_tokens=40, slots=c.slots,
                         variant=variant, logits=dev.buffer(4 * 40 * 4), scores=dev.buffer(2 * 40 * 4))
    assert {name for name in dev.kernel_times() if name.startswith("attn_scores_stats")} == {stats}
