"""Quantized KV (issue 14): the store quantizes on the way in, every attention
kernel reads the codes and dequantizes in registers. Checked against the numpy
reference of the documented formats (kv_quant_ref.py):

- the store's bytes equal the reference quantizer's, slot by slot (exact on
  the host executor: the same float32 operations), for both store paths;
- attention over a quantized pool equals the float64 reference attention
  over the reference's dequantized K and V (decode: the kernel dequantizes in
  float32, so the tolerance is test_attention's; prefill stages the
  dequantized values as half, so its reference rounds them to half too).
"""
from __future__ import annotations

import itertools

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from . import kv_quant_ref as qr
from .attention_ref import attention
from .test_attention import ATOL, RTOL
from .test_rope import rope_ref
from devices import test_device  # tests/ is on sys.path

B = qr.B
QUANT = ("q8", "q4")
# every (K, V) pair with at least one quantized side
PAIRS = [(k, v) for k, v in itertools.product(qr.FORMATS, qr.FORMATS) if "f16" != k or "f16" != v]
QUANT_DIMS = (32, 64, 128, 192, 256)  # the head_dims the quantized formats take


def held_slots(cache, layer):
    pos = np.asarray(cache.positions(layer))
    slots = np.nonzero(pos >= 0)[0]
    order = slots[np.argsort(pos[slots], kind="stable")]
    return pos[order], order


# ---- the store ------------------------------------------------------------

@pytest.mark.parametrize("kv_k,kv_v", PAIRS)
@pytest.mark.parametrize("d", [32, 64, 128])
@pytest.mark.parametrize("store", ["compute", "blit"])
def test_store_writes_the_reference_codes(kv_k, kv_v, d, store):
    dev = test_device()
    rng = np.random.default_rng(d)
    n_kv, n = 3, 75  # 75: a partly filled third block
    cache = metalkv.KVCache(dev, 1, n_kv, d, 96, max_chunk=16, store=store, kv_k=[kv_k], kv_v=[kv_v])
    assert cache.formats(0) == (kv_k, kv_v)
    # rows with an outlier channel and a constant group: the formats' edge cases
    k = rng.standard_normal((n, n_kv, d)).astype(np.float32) * 3
    v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    k[:, :, 5] *= 20
    v[7, 1, :] = 0.25
    for lo in range(0, n, 16):  # chunks crossing block boundaries
        cache.append(0, k[lo:lo + 16], v[lo:lo + 16])
    pos, slots = held_slots(cache, 0)
    assert list(pos) == list(range(n))
    for kv, fmt, x in ((0, kv_k, k), (1, kv_v, v)):
        section = cache.section_bytes(0, kv)
        assert section.shape == (cache.slots(0) // B, B * qr.slot_bytes(fmt, n_kv, d))
        data, params = qr.section_rows(section, fmt, n_kv, d, slots)
        want_data, want_params = qr.quantize(x, fmt)
        np.testing.assert_array_equal(data, want_data)
        np.testing.assert_array_equal(params, want_params)


@pytest.mark.parametrize("fmt", QUANT)
@pytest.mark.parametrize("style,rotary_dim", [("neox", 64), ("interleaved", 64), ("neox", 32)])
def test_store_quantizes_k_after_rope(fmt, style, rotary_dim):
    """K is rotated first, then quantized: the codes are those of the rotated
    rows (float64 rope here, float32 in the kernel: a code may sit one step off
    at a rounding boundary, never more)."""
    dev = test_device()
    rng = np.random.default_rng(rotary_dim)
    n_kv, d, n = 2, 64, 40
    inv_freq = (1.0 / 10000 ** (np.arange(0, rotary_dim, 2) / rotary_dim)).astype(np.float32)
    rope = dict(style=style, inv_freq=inv_freq, rotary_dim=rotary_dim)
    cache = metalkv.KVCache(dev, 1, n_kv, d, 64, max_chunk=40, kv_k=[fmt], kv_v=[fmt])
    k = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    q = rng.standard_normal((n, 4, d)).astype(np.float32)
    q_out = cache.append(0, k, v, rope=rope, q=q)
    _, slots = held_slots(cache, 0)
    roped = rope_ref(k, range(n), inv_freq, style, rotary_dim)
    got = qr.dequantize(*qr.section_rows(cache.section_bytes(0, 0), fmt, n_kv, d, slots), fmt, d)
    want = qr.roundtrip(roped.astype(np.float32), fmt)
    # one quantization step of each row (at most: q4's groups of 32 may have smaller ones)
    step = np.abs(roped).max(-1, keepdims=True) / (127 if fmt == "q8" else 8)
    assert np.all(np.abs(got - want) <= 1.01 * step + 1e-6)
    assert np.mean(got == want) > 0.99
    # V is never rotated; Q is rotated in the same dispatch, in float32
    got_v = qr.dequantize(*qr.section_rows(cache.section_bytes(0, 1), fmt, n_kv, d, slots), fmt, d)
    np.testing.assert_array_equal(got_v, qr.roundtrip(v, fmt))
    np.testing.assert_allclose(q_out, rope_ref(q, range(n), inv_freq, style, rotary_dim), atol=1e-5)


@pytest.mark.parametrize("windows", [[0, 0], [0, 40]])
def test_blit_and_compute_quantized_caches_are_bit_identical(windows):
    dev = test_device()
    rng = np.random.default_rng(5)
    n_kv, d = 2, 64
    kw = dict(windows=windows, max_chunk=5, kv_k=["q4", "q8"], kv_v=["q8", "q4"])
    caches = [metalkv.KVCache(dev, 2, n_kv, d, 200, store=s, **kw) for s in ("compute", "blit")]
    for _ in range(30):
        n = int(rng.integers(1, 6))
        k = rng.standard_normal((2, n, n_kv, d)).astype(np.float32)
        v = rng.standard_normal((2, n, n_kv, d)).astype(np.float32)
        for c in caches:
            c.append_all_layers(k, v)
    for layer in range(2):
        pos = [c.positions(layer) for c in caches]
        np.testing.assert_array_equal(pos[0], pos[1])
        held = pos[0] >= 0
        for kv in range(2):
            fmt = caches[0].formats(layer)[kv]
            rows = [qr.section_rows(c.section_bytes(layer, kv), fmt, n_kv, d, np.nonzero(held)[0]) for c in caches]
            np.testing.assert_array_equal(rows[0][0], rows[1][0])
            np.testing.assert_array_equal(rows[0][1], rows[1][1])


def test_rows_read_and_written_as_the_format_defines_them():
    """read_rows gives each position's codes and parameters as the format
    defines them (the reference quantizer's); write_rows puts them back bit for
    bit (what saved caches rely on)."""
    dev = test_device()
    rng = np.random.default_rng(5)
    n_kv, d, n = 2, 128, 70
    kw = dict(windows=[0, 40], max_chunk=8, kv_k=["q4", "q8"], kv_v=["q8", "f16"])
    cache = metalkv.KVCache(dev, 2, n_kv, d, 200, **kw)
    k = rng.standard_normal((2, n, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((2, n, n_kv, d)).astype(np.float32)
    for lo in range(0, n, 7):
        cache.append_all_layers(k[:, lo:lo + 7], v[:, lo:lo + 7])
    copy = metalkv.KVCache(dev, 2, n_kv, d, 200, **kw)
    zeros = np.zeros((2, n, n_kv, d), np.float32)
    for lo in range(0, n, 7):
        copy.append_all_layers(zeros[:, lo:lo + 7], zeros[:, lo:lo + 7])
    for layer in range(2):
        first = int(np.min(np.where(cache.positions(layer) >= 0, cache.positions(layer), n)))
        for kv, x in ((0, k[layer]), (1, v[layer])):
            fmt = cache.formats(layer)[kv]
            data, params = cache.read_rows(layer, kv, first, n - first)
            want_data, want_params = qr.quantize(x[first:], fmt)
            np.testing.assert_array_equal(data, want_data.reshape(n - first, -1))
            np.testing.assert_array_equal(params, want_params.reshape(n - first, -1))
            copy.write_rows(layer, kv, first, data, params)
            got = copy.read_rows(layer, kv, first, n - first)
            np.testing.assert_array_equal(got[0], data)
            np.testing.assert_array_equal(got[1], params)
    with pytest.raises(metalkv.GpuError, match="holds 70 positions; cannot read rows 60..79"):
        cache.read_rows(0, 0, 60, 20)


def test_byte_accounting_follows_the_formats():
    dev = test_device()
    n_kv, d, cap = 3, 64, 100
    caches = {f: metalkv.KVCache(dev, 2, n_kv, d, cap, kv_k=[f, "f16"], kv_v=[f, "q4"]) for f in qr.FORMATS}
    for f, c in caches.items():
        want_row = qr.slot_bytes(f, n_kv, d) * 2 + qr.slot_bytes("f16", n_kv, d) + qr.slot_bytes("q4", n_kv, d)
        assert c.bytes_per_token == want_row
        assert c.layer_nbytes(0) == c.slots(0) * 2 * qr.slot_bytes(f, n_kv, d)
    # the memory targets' arithmetic for the default model's 3 KV heads of 64:
    # q8 64 + 2 bytes a head (its row of scales padded to 8): 1.92x; q4 32 + 2 scales: 3.56x smaller than f16
    assert qr.slot_bytes("f16", 3, 64) / qr.slot_bytes("q8", 3, 64) == pytest.approx(384 / 200)
    assert qr.slot_bytes("f16", 3, 64) / qr.slot_bytes("q4", 3, 64) == pytest.approx(384 / 108)


def test_views_and_bad_formats():
    dev = test_device()
    c = metalkv.KVCache(dev, 1, 2, 64, 32, kv_k=["q8"], kv_v=["f16"])
    with pytest.raises(ValueError, match="layer 0 stores K as q8; keys\\(\\)/values\\(\\) view f16 sections"):
        c.keys(0)
    assert c.values(0).shape == (32, 2, 64)
    with pytest.raises(metalkv.ArgumentError, match="kv_k='q3': expected one of 'f16', 'q8', 'q4' or 'q2'"):
        metalkv.KVCache(dev, 1, 2, 64, 32, kv_k=["q3"])
    with pytest.raises(metalkv.ArgumentError, match="kv_v='q4' cannot store heads of head_dim 80: the quantized "
                                                    "formats take head_dim 32, 64 or a multiple of 64"):
        metalkv.KVCache(dev, 1, 2, 80, 32, kv_v=["q4"])
    with pytest.raises(metalkv.ArgumentError, match="one KV format per layer is needed: got 1 for 2 layers"):
        metalkv.KVCache(dev, 2, 2, 64, 32, kv_k=["q4"])


# ---- attention over a quantized pool ------------------------------------------

def quant_pool(k, v, kv_k, kv_v, *, first=0, spare=1):
    """(pool bytes, table): K section then V section, blocks in random order,
    every slot outside [first, n) poison (kv_quant_ref.build_section)."""
    n = len(k)
    n_logical = -(-n // B)
    held = n_logical - first // B
    order = np.random.default_rng(n).permutation(held + spare)
    table = np.empty(n_logical, np.uint32)
    table[first // B:] = order[:held]
    table[:first // B] = order[held]
    n_blocks = held + spare
    pool = np.concatenate([qr.build_section(k, kv_k, table, n_blocks, first),
                           qr.build_section(v, kv_v, table, n_blocks, first)])
    return pool, table, n_blocks * B


def run_decode(dev, q, pool, table, slots, n_kv, n, kv_k, kv_v, **kw):
    n_q_heads, d = q.shape
    out = dev.buffer(n_q_heads * d * 4)
    ops.attention_decode(dev, dev.buffer_from(q), dev.buffer_from(pool), dev.buffer_from(table), out,
                         n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_tokens=n, slots=slots,
                         kv_k=kv_k, kv_v=kv_v, **kw)
    return out.numpy().view(np.float32).reshape(n_q_heads, d).copy()


def run_prefill(dev, q, pool, table, slots, n_kv, q_pos0, kv_k, kv_v, **kw):
    n_q, n_q_heads, d = q.shape
    out = dev.buffer(q.nbytes)
    ops.attention_prefill(dev, dev.buffer_from(q), dev.buffer_from(pool), dev.buffer_from(table), out,
                          n_q_heads=n_q_heads, n_kv_heads=n_kv, head_dim=d, n_queries=n_q, q_pos0=q_pos0,
                          slots=slots, kv_k=kv_k, kv_v=kv_v, **kw)
    return out.numpy().view(np.float32).reshape(q.shape).copy()


def inputs(seed, n_q, n_q_heads, n_kv, d, n):
    rng = np.random.default_rng(seed)
    q = (2.0 * rng.standard_normal((n_q, n_q_heads, d))).astype(np.float32)
    k = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    v = rng.standard_normal((n, n_kv, d)).astype(np.float32)
    k[:, :, 3] += 6.0  # an outlier channel, as real keys have
    return q, k, v


def decode_cases():
    for (kv_k, kv_v), d in itertools.product(PAIRS, QUANT_DIMS):
        yield kv_k, kv_v, d, (9, 3) if d <= 64 else (8, 2)  # GQA 3 (4-row kernels) / 4
    for d in (32, 64):
        yield "q4", "q8", d, (16, 2)  # 8 query heads per KV head: the 8-row kernels
    yield "q4", "q4", 64, (16, 2)     # ... with the formats as constants
    yield "q8", "q4", 128, (8, 1)     # MQA


@pytest.mark.parametrize("kv_k,kv_v,d,heads", list(decode_cases()))
@pytest.mark.parametrize("n,split", [(45, "never"), (700, "always")])
def test_decode_reads_quantized_kv(dev, shape, kv_k, kv_v, d, heads, n, split):
    n_q_heads, n_kv = heads
    q, k, v = inputs(d + n, 1, n_q_heads, n_kv, d, n)
    pool, table, slots = quant_pool(k, v, kv_k, kv_v, spare=2)
    got = run_decode(dev, q[0], pool, table, slots, n_kv, n, kv_k, kv_v, split=split, variant=shape)
    ref = attention(q, qr.roundtrip(k, kv_k), qr.roundtrip(v, kv_v), n - 1, scale=d ** -0.5)[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kv_k,kv_v", PAIRS)
@pytest.mark.parametrize("d", [64, 128])
def test_decode_quantized_with_window_sinks_and_softcap(dev, shape, kv_k, kv_v, d):
    n, window, n_kv = 300, 100, 2
    q, k, v = inputs(d, 1, 6, n_kv, d, n)
    first = n - window  # blocks wholly before the window are poison: never read
    pool, table, slots = quant_pool(k, v, kv_k, kv_v, first=first // B * B)
    sinks = np.linspace(-1, 2, 6).astype(np.float32)
    got = run_decode(dev, q[0], pool, table, slots, n_kv, n, kv_k, kv_v, window=window, softcap=30.0,
                     sinks=dev.buffer_from(sinks), variant=shape)
    ref = attention(q, qr.roundtrip(k, kv_k), qr.roundtrip(v, kv_v), n - 1, scale=d ** -0.5, window=window,
                    softcap=30.0, sinks=sinks)[0]
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


def half(x):
    return x.astype(np.float16).astype(np.float32)


@pytest.mark.parametrize("kv_k,kv_v", PAIRS)
@pytest.mark.parametrize("d", QUANT_DIMS)
def test_prefill_reads_quantized_kv(dev, prefill_shape, kv_k, kv_v, d):
    n_q, q_pos0, n_kv = 37, 50, 2
    n = q_pos0 + n_q
    q, k, v = inputs(3 * d, n_q, 4, n_kv, d, n)
    pool, table, slots = quant_pool(k, v, kv_k, kv_v)
    got = run_prefill(dev, q, pool, table, slots, n_kv, q_pos0, kv_k, kv_v, variant=prefill_shape)
    ref = attention(q, half(qr.roundtrip(k, kv_k)), half(qr.roundtrip(v, kv_v)), q_pos0, scale=d ** -0.5)
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("kv_k,kv_v", [("q8", "q8"), ("q4", "f16")])
def test_prefill_quantized_sliding_with_sinks_and_softcap(dev, prefill_shape, kv_k, kv_v):
    d, n_q, q_pos0, window, n_kv = 64, 40, 90, 48, 1
    n = q_pos0 + n_q
    q, k, v = inputs(11, n_q, 3, n_kv, d, n)
    pool, table, slots = quant_pool(k, v, kv_k, kv_v, first=(q_pos0 - window + 1) // B * B)
    sinks = np.array([0.5, -1.0, 2.0], np.float32)
    got = run_prefill(dev, q, pool, table, slots, n_kv, q_pos0, kv_k, kv_v, window=window, softcap=20.0,
                      sinks=dev.buffer_from(sinks), variant=prefill_shape)
    ref = attention(q, half(qr.roundtrip(k, kv_k)), half(qr.roundtrip(v, kv_v)), q_pos0, scale=d ** -0.5,
                    window=window, softcap=20.0, sinks=sinks)
    np.testing.assert_allclose(got, ref, atol=ATOL, rtol=RTOL)


def test_plan_counts_the_quantized_bytes():
    """Bytes read per decode step follow the formats: codes and group parameters;
    the commonest pairs run kernels with their formats as constants."""
    kw = dict(n_q_heads=9, n_kv_heads=3, head_dim=64, n_tokens=4096, slots=4096, wave=64)
    f16 = ops.attention_decode_plan(**kw)
    for kv_k, kv_v in PAIRS:
        p = ops.attention_decode_plan(**kw, kv_k=kv_k, kv_v=kv_v)
        fixed = {("q8", "q8"): "q8q8", ("q4", "q4"): "q4q4", ("q8", "q4"): "q8q4"}.get((kv_k, kv_v), "kvq")
        assert p["kernel"] in (f"attn_decode_{fixed}_d64_r4", f"attn_decode_split_{fixed}_d64_r4")
        per_key = qr.slot_bytes(kv_k, 1, 64) + qr.slot_bytes(kv_v, 1, 64)
        assert p["kv_bytes_visible"] == 3 * 4096 * per_key
        assert p["kv_bytes_visible"] < f16["kv_bytes_visible"]


def test_quantized_attention_errors(host):
    buf = host.buffer(1 << 20)
    kw = dict(n_q_heads=2, n_kv_heads=1, head_dim=80, n_tokens=4, slots=32)
    with pytest.raises(metalkv.GpuError, match="KV format 1 cannot be read at head_dim 80"):
        ops.attention_decode(host, buf, buf, buf, buf, **kw, kv_k="q8")
    with pytest.raises(metalkv.GpuError, match="decode_variant 'nopf' exists for f16 K and V only"):
        ops.attention_decode(host, buf, buf, buf, buf, **dict(kw, head_dim=128), kv_v="q4", variant="nopf")
    with pytest.raises(metalkv.ArgumentError, match="kv_v='int4'"):
        ops.attention_prefill(host, buf, buf, buf, buf, n_q_heads=2, n_kv_heads=1, head_dim=64, n_queries=1,
                              q_pos0=0, slots=32, kv_v="int4")
