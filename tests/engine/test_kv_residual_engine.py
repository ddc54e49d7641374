"""The residual window and q2 through the whole engine (issue 14).

The reference is tests/engine/reference.py's float64 forward whose attention
reads, for each query, the keys before its window start from the quantized
storage (kv_quant_ref.py: q2's K per channel over blocks of 32, V per token)
and its window in f16 (`residual`). Prefill gives every query its own window,
so the logits do not depend on how the prompt was chunked.
"""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path
from kv import kv_quant_ref as qr
from metalkv.models import load_model

from .reference import llama_logits
from .test_kv_quant_engine import storage

IDS = [int(i) for i in np.random.default_rng(7).integers(0, 64, 100)]


def load(path, **kw):
    kw = {"context": 160, "prefill_chunk": 64, "kv_memory": None, **kw}
    return metalkv.Engine.load(path, device=TEST_DEVICE, progress=False, **kw)


@pytest.mark.parametrize("kv_k,kv_v,rotate", [("q4", "q4", False), ("q2", "q2", True), ("q8", "q2", False)])
def test_logits_match_the_reference_with_a_residual_window(tiny_gguf, kv_k, kv_v, rotate):
    m = load_model(tiny_gguf, progress=False)
    eng = load(tiny_gguf, kv_k=kv_k, kv_v=kv_v, kv_rotate=rotate, kv_residual=32)
    got = eng.logits(IDS)
    store = storage(qr.section_format(kv_k, 0), qr.section_format(kv_v, 1), rotate)
    # the window holds f16 rows as stored: rotated ones for a rotated cache
    ref = llama_logits(m, IDS, storage=store, residual=32, window_storage=storage("f16", "f16", rotate))
    everywhere = llama_logits(m, IDS, storage=store)  # every key quantized: what the window saves
    scale = np.abs(ref).max()
    err, off = np.abs(got - ref).max() / scale, np.abs(got - everywhere).max() / scale
    assert err < 4e-3, err
    assert off > 4 * err, (off, err)


def test_prefill_chunks_do_not_change_the_logits(tiny_gguf):
    kw = dict(kv_k="q4", kv_v="q2", kv_residual=32)
    a = load(tiny_gguf, **kw).logits(IDS)
    b = load(tiny_gguf, prefill_chunk=16, **kw).logits(IDS)
    np.testing.assert_array_equal(a, b)


def test_decode_reads_the_window_as_prefill_does(tiny_gguf):
    eng = load(tiny_gguf, kv_k="q2", kv_v="q2")  # the q2 default window: 128
    assert eng.new_cache().residual == 128
    full = eng.logits(IDS)
    cache = eng.new_cache()
    eng.logits(IDS[:-1], cache=cache)
    last = eng.logits(IDS[-1:], cache=cache)  # one decode step
    np.testing.assert_allclose(last[0], full[-1], atol=2e-3 * np.abs(full).max())


def test_q2_blocks_are_sealed_per_channel_from_the_window():
    """A q2 K block is quantized when full, from its f16 rows; V per token at store."""
    dev = qr_device()
    n_kv, d, n = 2, 64, 90
    rng = np.random.default_rng(3)
    k = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    k[:, :, 5] += 4.0
    c = metalkv.KVCache(dev, 1, n_kv, d, 128, max_chunk=40, kv_k=["q2"], kv_v=["q2"], kv_residual=32)
    assert c.formats(0) == ("q2", "q2") and c.has_ring(0) and c.ring_slots == 128  # 40 + 32 + 31, whole blocks
    for lo in range(0, n, 30):
        c.append(0, k[lo:lo + 30], v[lo:lo + 30])
    for b0 in (0, 32):
        data, params = c.read_rows(0, 0, b0, 32)
        codes, prm = qr.quantize_q2k(qr.half(k[b0:b0 + 32]))
        np.testing.assert_array_equal(data.reshape(codes.shape), codes)
        np.testing.assert_array_equal(params.reshape(-1), np.ascontiguousarray(prm).view(np.uint8).reshape(-1))
    data, params = c.read_rows(0, 1, 0, n)
    want_d, want_p = qr.quantize_q2v(v)
    np.testing.assert_array_equal(data, want_d.reshape(n, -1))
    np.testing.assert_array_equal(params, want_p.reshape(n, -1))
    with pytest.raises(metalkv.GpuError, match="q2 K rows of positions 64..89 are in the residual window's ring only"):
        c.read_rows(0, 0, 60, 10)
    # the ring's reach: positions ring_lo.. are its; a truncate keeps what is below it
    assert c.ring_lo(0) == 0
    c.append(0, k[:30], v[:30])  # 120 stored: 128 slots still hold them all
    c.append(0, k[:8], v[:8])    # 128
    assert c.ring_lo(0) == 0
    c.truncate(100)
    assert c.ring_lo(0) == 0
    c.reset()
    assert c.ring_lo(0) == 0 and c.length(0) == 0


def qr_device():
    from devices import test_device
    return test_device()


def test_residual_arguments_are_checked(tiny_gguf):
    with pytest.raises(metalkv.ArgumentError, match="kv_residual=48: expected None or an int >= 0, a multiple of 32"):
        load(tiny_gguf, kv_k="q4", kv_residual=48)
    with pytest.raises(metalkv.ArgumentError, match="q2 quantizes K per channel over whole blocks"):
        load(tiny_gguf, kv_k="q2", kv_residual=0).new_cache()
    with pytest.raises(metalkv.ArgumentError, match="every layer's K and V are f16 already"):
        load(tiny_gguf, kv_residual=64).new_cache()
    eng = load(tiny_gguf, kv_k="q4", kv_v="q4", kv_residual=32)
    assert eng.kv_options.describe(eng.config.n_layers, eng.config.head_dim, eng.context) == \
        "K q4, V q4, rotated, residual 32"
    c = eng.new_cache()
    assert c.ring_nbytes == c.n_layers * 2 * c.ring_slots * c.n_kv_heads * c.head_dim * 2
    assert c.nbytes >= c.ring_nbytes + sum(c.layer_nbytes(l) for l in range(c.n_layers))


@pytest.mark.parametrize("kv_k,kv_v,residual", [("q2", "q2", None), ("q4", "q8", 32)])
def test_a_residual_cache_takes_its_prefix_with_its_window_rows(tiny_gguf, kv_k, kv_v, residual):
    """Issue 36: a published block keeps its window's f16 rows beside it (the pool's
    PrefixRows), and a call taking the prefix gets them into its ring, so its queries
    read what a prefill's read: ids and logits bit for bit those of an engine with no
    prefix cache at all, for calls sharing a system prompt past the window."""
    from .test_prefix_cache import run

    kw = dict(kv_k=kv_k, kv_v=kv_v, kv_residual=residual, prefill_chunk=16, context=320)
    eng, plain = load(tiny_gguf, kv_memory="auto", **kw), load(tiny_gguf, **kw)
    rng = np.random.default_rng(11)
    system = rng.integers(1, 64, 200).tolist()
    for i, n in enumerate((23, 40, 9)):
        ids = system + rng.integers(1, 64, n).tolist()
        got, ref = run(eng, ids, max_tokens=20), run(plain, ids, max_tokens=20)
        assert got[0] == ref[0]
        np.testing.assert_array_equal(got[1], ref[1])
        assert got[2]["prompt_tokens_cached"] == (0 if i == 0 else 192)  # the system prompt's whole blocks
    pool = eng.kv_pool
    window = eng.new_cache().residual
    assert window == (residual or 128)
    row = 2 * 32 * pool_heads(eng) * 2  # one block's K and V f16 rows, one layer
    assert pool["window_rows_bytes"] > 0 and pool["window_rows_bytes"] % (eng.config.n_layers * row) == 0
    assert pool["window_rows_bytes"] <= pool["window_rows_max_bytes"] == pool["nbytes"] // 4


def pool_heads(eng) -> int:
    return eng.config.n_kv_heads * eng.config.head_dim


def test_caches_with_and_without_a_window_never_share_a_prefix(tiny_gguf):
    """One pool, caches with a residual window and caches without: their blocks' bits
    differ (the window changes what the queries read), so their chains start from
    different roots and neither takes the other's prefix; each matches its reference."""
    from .test_prefix_cache import run

    kw = dict(kv_k="q4", kv_v="q4", prefill_chunk=16, context=320)
    eng = load(tiny_gguf, kv_memory="auto", kv_residual=32, **kw)
    refs = {r: load(tiny_gguf, kv_residual=r, **kw) for r in (0, 32)}
    ids = np.random.default_rng(12).integers(1, 64, 150).tolist()
    opts = dict(max_tokens=8, temperature=0.0, stop_ids=[], keep_logits=True, ephemeral=True)
    seen = set()
    for residual in (32, 0, 32, 0):
        r = eng._core.submit(eng.new_cache(kv_residual=residual), np.asarray(ids, np.int64), **opts)
        ref = refs[residual]._core.submit(refs[residual].new_cache(), np.asarray(ids, np.int64), **opts)
        assert r.result() == ref.result()
        np.testing.assert_array_equal(r.logits(), ref.logits())
        assert r.stats["prompt_tokens_cached"] == (128 if residual in seen else 0)
        seen.add(residual)


def test_a_truncate_past_the_ring_reads_the_pool_below_ring_lo(tiny_gguf):
    """Rolled back further than the ring reaches, the cache keeps its codes and
    the next queries read the keys below ring_lo from them, as the reference
    with that floor does."""
    m = load_model(tiny_gguf, progress=False)
    eng = load(tiny_gguf, kv_k="q4", kv_v="q4", kv_residual=32, kv_rotate=False)  # ring: 64 + 32 + 31 -> 128 slots
    ids = [int(i) for i in np.random.default_rng(9).integers(0, 64, 150)]
    cache = eng.new_cache()
    eng.logits(ids, cache=cache)
    assert cache.ring_slots == 128 and cache.ring_lo(0) == 150 - 128
    cache.truncate(40)
    assert cache.ring_lo(0) == 22
    got = eng.logits([5, 6, 7, 8], cache=cache)
    seq = ids[:40] + [5, 6, 7, 8]
    ref = llama_logits(m, seq, storage=storage("q4", "q4"), residual=32, ring_lo=22, ring_lo_from=40)[40:]
    fresh = llama_logits(m, seq, storage=storage("q4", "q4"), residual=32)[40:]
    scale = np.abs(ref).max()
    err = np.abs(got - ref).max() / scale
    assert err < 4e-3 and np.abs(got - fresh).max() / scale > 4 * err


@pytest.mark.parametrize("kv_k,kv_v", [("q2", "q2"), ("q4", "q8")])
def test_a_batch_gives_each_sequence_what_it_gets_alone(tiny_gguf, kv_k, kv_v):
    """Sequences of a shared pool batched into one step, each with its own ring,
    give the ids and logits they give alone, bit for bit."""
    from .test_batching import with_logits

    eng = load(tiny_gguf, kv_memory="auto", kv_k=kv_k, kv_v=kv_v, kv_residual=32, prefill_chunk=16)
    rng = np.random.default_rng(4)
    ps = [rng.integers(1, 60, int(rng.integers(30, 90))).tolist() for _ in range(5)]
    kw = dict(max_tokens=24, stop_ids=())  # decode runs past a block: q2's seals happen in the batch
    alone, together = with_logits(eng, ps, kw, False), with_logits(eng, ps, kw, True)
    for (ids_a, lg_a), (ids_b, lg_b) in zip(alone, together):
        assert ids_a == ids_b
        np.testing.assert_array_equal(lg_a, lg_b)


def test_ring_misuse_is_a_clear_error():
    dev = qr_device()
    c = metalkv.KVCache(dev, 1, 1, 64, 128, max_chunk=8, kv_k=["q4"], kv_v=["q4"], kv_residual=32)
    rows = np.zeros((9, 1, 64), np.float32)
    with pytest.raises(metalkv.GpuError, match="storing 9 tokens in one call exceeds max_chunk 8"):
        c.append(0, rows, rows)
    c.append(0, rows[:8], rows[:8])
    with pytest.raises(metalkv.GpuError, match="ring holds positions 0..7, not 4..11"):
        c.read_ring(0, 4, 8)
    k, v = c.read_ring(0, 2, 6)
    with pytest.raises(metalkv.GpuError, match="write_ring takes the rows of the layer's last positions"):
        c.write_ring(0, 1, k, v)  # 1..6 does not end at the length, 8
    c.write_ring(0, 2, k, v)
    assert c.ring_lo(0) == 2
    plain = metalkv.KVCache(dev, 1, 1, 64, 128, kv_k=["q4"])
    with pytest.raises(metalkv.GpuError, match="layer 0 keeps no residual window"):
        plain.read_ring(0, 0, 1)
