"""Quantized and rotated KV caches through the whole engine (issue 14).

The reference is tests/engine/reference.py's float64 forward whose cache
storage is the numpy quantizer of tests/kv/kv_quant_ref.py (and, rotated, the
orthonormal Hadamard transform written out as a matrix). Prefill stages the
dequantized K/V as half, so the reference rounds them to float16 after
dequantizing. Besides matching it, the engine must be measurably off the
f16-cache reference (the cache really is quantized), and every batching,
prefix-sharing and saving path must give exactly what a lone call gives.
"""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path
from kv import kv_quant_ref as qr
from metalkv.models import load_model

from .reference import f16_storage, llama_logits
from .test_batching import with_logits

IDS = [1, 5, 9, 63, 0, 17, 17, 2, 40, 33, 8, 8, 21, 60, 3, 12, 44, 2, 9, 30, 31, 7]


def hadamard(d: int) -> np.ndarray:
    """The orthonormal Sylvester Hadamard matrix, H @ H = I."""
    h = np.ones((1, 1))
    while len(h) < d:
        h = np.block([[h, h], [h, -h]])
    return h / np.sqrt(d)


def storage(kv_k: str, kv_v: str, rotate: bool = False):
    """The cache's storage as the reference's storage hook: rotate (the
    attention scores and output are unchanged by it, so the reference rotates
    back), quantize, dequantize, round to half as prefill stages it."""
    def store(k, v):
        out = []
        for x, fmt in ((k, kv_k), (v, kv_v)):
            h = hadamard(x.shape[-1]) if rotate else np.eye(x.shape[-1])
            y = qr.roundtrip((x @ h).astype(np.float32), fmt).astype(np.float16).astype(np.float64)
            out.append(y @ h)
        return tuple(out)
    return store


def load(path, **kw):
    kw = {"context": 64, "prefill_chunk": 64, **kw}
    return metalkv.Engine.load(path, device=TEST_DEVICE, progress=False, **kw)


@pytest.mark.parametrize("kv_k,kv_v,rotate", [("q8", "q8", False), ("q4", "q4", False), ("q8", "q4", True),
                                               ("q4", "f16", True)])
def test_logits_match_the_reference_with_the_quantized_storage(tiny_gguf, kv_k, kv_v, rotate):
    m = load_model(tiny_gguf, progress=False)
    eng = load(tiny_gguf, kv_k=kv_k, kv_v=kv_v, kv_rotate=rotate, kv_residual=0)  # (the storage alone)
    got = eng.logits(IDS)
    ref = llama_logits(m, IDS, storage=storage(kv_k, kv_v, rotate))
    f16 = llama_logits(m, IDS, storage=f16_storage)
    scale = np.abs(ref).max()
    err, off = np.abs(got - ref).max() / scale, np.abs(got - f16).max() / scale
    # float32 vs float64 may move a code by one step where a value sits on a
    # rounding boundary; the quantization itself moves the logits far more
    assert err < 4e-3, err
    assert off > 4 * err, (off, err)


def test_rotation_is_the_orthonormal_hadamard_transform(dev):
    from metalkv._core import ops

    rng = np.random.default_rng(0)
    for d in (32, 64, 128, 256):
        x = rng.standard_normal((3, 2, d)).astype(np.float32)
        buf = dev.buffer_from(x)
        ops.hadamard(dev, buf, n_rows=3, n_heads=2, head_dim=d)
        got = buf.numpy().view(np.float32).reshape(x.shape)
        np.testing.assert_allclose(got, x.astype(np.float64) @ hadamard(d), atol=1e-5)
        ops.hadamard(dev, buf, n_rows=3, n_heads=2, head_dim=d)  # its own inverse
        np.testing.assert_allclose(buf.numpy().view(np.float32).reshape(x.shape), x, atol=1e-5)
    with pytest.raises(metalkv.GpuError, match="head_dim 96 is not a power of two"):
        ops.hadamard(dev, dev.buffer(4 * 96), n_rows=1, n_heads=1, head_dim=96)


def test_rotated_store_rotates_k_after_rope_v_and_the_queries():
    from kv.test_rope import rope_ref

    dev = metalkv.Device(TEST_DEVICE)
    rng = np.random.default_rng(3)
    n, n_kv, d = 20, 2, 64
    inv_freq = (1.0 / 10000 ** (np.arange(0, d, 2) / d)).astype(np.float32)
    rope = dict(style="neox", inv_freq=inv_freq)
    cache = metalkv.KVCache(dev, 1, n_kv, d, 32, max_chunk=32, kv_k=["q8"], kv_v=["q4"], kv_rotate=True)
    assert cache.rotated(0)
    k, v, q = (rng.standard_normal((n, h, d)).astype(np.float32) for h in (n_kv, n_kv, 4))
    q_out = cache.append(0, k.copy(), v.copy(), rope=rope, q=q)
    h = hadamard(d)
    np.testing.assert_allclose(q_out, rope_ref(q, range(n), inv_freq, "neox", d) @ h, atol=2e-5)
    pos, = np.nonzero(np.asarray(cache.positions(0)) >= 0)
    got_k = qr.dequantize(*qr.section_rows(cache.section_bytes(0, 0), "q8", n_kv, d, pos), "q8", d)
    got_v = qr.dequantize(*qr.section_rows(cache.section_bytes(0, 1), "q4", n_kv, d, pos), "q4", d)
    want_k = rope_ref(k, range(n), inv_freq, "neox", d) @ h
    np.testing.assert_allclose(got_k, want_k, atol=0.6 * np.abs(want_k).max() / 127 + 1e-5)
    want_v = v.astype(np.float64) @ h
    step = np.abs(want_v).max(-1, keepdims=True) / 8  # q4: one step of the row's largest group
    assert np.all(np.abs(got_v - want_v) <= 1.01 * step + 1e-5)  # clamped at +7 steps on the far side
    # an f16 layer of a rotated cache is not rotated: nothing to gain
    assert not metalkv.KVCache(dev, 1, n_kv, d, 32, kv_rotate=True).rotated(0)
    with pytest.raises(metalkv.ArgumentError, match="kv_rotate needs a power-of-two head_dim"):
        metalkv.KVCache(dev, 1, n_kv, 192, 32, kv_k=["q8"], kv_rotate=True)


@pytest.mark.parametrize("fixture", ["tiny_gguf", "tiny_sliding_dir"])
def test_batched_and_prefix_cached_calls_equal_lone_ones(request, fixture):
    """A shared pool of q4/q8 rotated blocks: batches, prefix-cache hits
    (blocks adopted, a tail copied on write) and lone calls give the same
    logits, bit for bit."""
    path = request.getfixturevalue(fixture)
    eng = load(path, kv_k="q4", kv_v="q8", kv_rotate=True, kv_residual=0, kv_memory="4MB", prefill_chunk=8,
               context=160)  # (no window: caches with one take no part in the prefix cache)
    rng = np.random.default_rng(1)
    system = rng.integers(1, 60, 40).tolist()  # a shared prefix: its full blocks go to the prefix cache
    ps = [system + rng.integers(1, 60, int(rng.integers(1, 20))).tolist() for _ in range(5)]
    kw = dict(max_tokens=6, stop_ids=())
    alone = with_logits(eng, ps, kw, False)
    together = with_logits(eng, ps, kw, True)
    assert eng.kv_pool["groups"][0]["cached_blocks"] > 0
    for (ids_a, lg_a), (ids_b, lg_b) in zip(alone, together):
        assert ids_a == ids_b
        np.testing.assert_array_equal(lg_a, lg_b)


def test_engine_formats_and_errors(tiny_gguf):
    eng = load(tiny_gguf, kv_k="q8", kv_v="q4", kv_f16_layers=[-1], kv_memory=None)
    c = eng.new_cache()
    n = eng.config.n_layers
    assert [c.formats(l) for l in range(n)] == [("q8", "q4")] * (n - 1) + [("f16", "f16")]
    assert eng.new_cache(kv_k="f16", kv_v="f16").formats(0) == ("f16", "f16")
    with pytest.raises(metalkv.ArgumentError, match="kv_k='q5'"):
        load(tiny_gguf, kv_k="q5")
    with pytest.raises(metalkv.ArgumentError, match="kv_f16_layers"):
        load(tiny_gguf, kv_f16_layers=[n])
    with pytest.raises(metalkv.ArgumentError, match=r"kv_rotate=1: expected None \(on for q4 and q2\), True or False"):
        load(tiny_gguf, kv_rotate=1)
    shared = load(tiny_gguf, kv_k="q8", kv_memory="1MB")
    with pytest.raises(metalkv.ArgumentError, match="shared KV pool \\(kv_memory\\) stores layer 0 as K q8, V f16"):
        shared.new_cache(kv_k="q4")
