"""metalkv.KVCache: layout, ring buffers, both store paths (compute and blit),
RoPE on K, errors and byte accounting, against plain numpy."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from .test_rope import inv_freq_default_ref, rope_ref, run_rope
from devices import host_only, test_device  # tests/ is on sys.path

F16_BYTES = 2


@pytest.fixture
def host() -> metalkv.Device:
    """One host device, for tests that only check bookkeeping and errors."""
    return test_device()


def rows(rng, n, n_kv, d):
    return rng.uniform(-2, 2, (n, n_kv, d)).astype(np.float32)


def expected_position(n: int, slots: int, s: int) -> int:
    """The spec: slot s < min(n, R) holds (n-1) - ((n-1-s) mod R)."""
    return (n - 1) - ((n - 1 - s) % slots) if s < min(n, slots) else -1


class RingModel:
    """What a layer should hold, by brute force: token p goes to slot p % R."""

    def __init__(self, slots, n_kv, d):
        self.k = np.zeros((slots, n_kv, d), np.float16)
        self.v = np.zeros((slots, n_kv, d), np.float16)
        self.pos = np.full(slots, -1, np.int64)
        self.n = 0

    def append(self, k16, v16):
        for t in range(len(k16)):
            s = self.n % len(self.pos)
            self.k[s], self.v[s], self.pos[s] = k16[t], v16[t], self.n
            self.n += 1


# ---- storing ----------------------------------------------------------------


@pytest.mark.parametrize("store", ["compute", "blit"])
def test_store_without_rope_is_exact_half_conversion(dev, store):
    rng = np.random.default_rng(1)
    cache = metalkv.KVCache(dev, 3, 2, 16, 32, max_chunk=8, store=store)
    model = RingModel(32, 2, 16)
    for n in [5, 1, 8, 3]:
        k, v = rows(rng, n, 2, 16), rows(rng, n, 2, 16)
        cache.append(1, k, v)
        model.append(k.astype(np.float16), v.astype(np.float16))  # numpy's round-to-nearest-even
    np.testing.assert_array_equal(cache.keys(1), model.k)
    np.testing.assert_array_equal(cache.values(1), model.v)
    np.testing.assert_array_equal(cache.positions(1), model.pos)
    assert cache.length(1) == 17 and cache.length(0) == 0 and cache.length(2) == 0
    assert not cache.keys(0).any() and not cache.keys(2).any()  # other layers untouched


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("style,rotary_dim", [("neox", 64), ("interleaved", 64), ("neox", 32), ("interleaved", 16)])
def test_store_ropes_k_at_its_positions(dev, store, style, rotary_dim):
    rng = np.random.default_rng(rotary_dim)
    n_kv, d = 3, 64
    cache = metalkv.KVCache(dev, 1, n_kv, d, 64, max_chunk=16, store=store)
    inv = inv_freq_default_ref(rotary_dim, 100000.0)
    rope = dict(style=style, inv_freq=inv, rotary_dim=rotary_dim)
    ks, vs = [], []
    for n in [7, 1, 16]:  # positions continue across calls
        k, v = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d)
        cache.append(0, k, v, rope=rope)
        ks.append(k), vs.append(v)
    k, v = np.concatenate(ks), np.concatenate(vs)
    want = rope_ref(k, range(24), inv, style, rotary_dim).astype(np.float16)
    got = cache.keys(0)[:24]
    # The kernel rotates in float32 then rounds to half; float32 vs float64 rotation
    # can flip the rounding of a value lying near a half-ulp boundary: allow 1 half ulp.
    np.testing.assert_allclose(got.astype(np.float32), want.astype(np.float32),
                               rtol=2.0 ** -10, atol=2.0 ** -24)
    np.testing.assert_array_equal(got[..., rotary_dim:], k[..., rotary_dim:].astype(np.float16))
    np.testing.assert_array_equal(cache.values(0)[:24], v.astype(np.float16))  # V is never rotated


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("style,rotary_dim", [("neox", 64), ("interleaved", 32)])
def test_store_rotates_the_queries_in_the_same_dispatch(dev, store, style, rotary_dim):
    """append(q=...) rotates Q (more heads than K, GQA) at the positions K goes
    to, in the store's one dispatch, as a model step does: the same values as
    the standalone rope kernel, bit for bit, and the reference within float32."""
    rng = np.random.default_rng(5)
    n_kv, n_q, d = 2, 6, 64
    cache = metalkv.KVCache(dev, 1, n_kv, d, 64, max_chunk=16, store=store)
    inv = inv_freq_default_ref(rotary_dim, 10000.0)
    rope = dict(style=style, inv_freq=inv, rotary_dim=rotary_dim)
    pos0 = 0
    for n in [5, 1, 3]:
        k, v, q = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d), rows(rng, n, n_q, d)
        got = cache.append(0, k, v, rope=rope, q=q)
        positions = range(pos0, pos0 + n)
        np.testing.assert_array_equal(got, run_rope(dev, q, positions, inv, style, rotary_dim))
        np.testing.assert_allclose(got, rope_ref(q, positions, inv, style, rotary_dim), rtol=0, atol=1e-6)
        assert cache.last_append_counters["dispatches"] == 1
        pos0 += n
    # K still goes in rotated and V as is, as without q
    assert cache.length(0) == 9


def test_store_q_needs_rope_and_matching_rows(host):
    cache = metalkv.KVCache(host, 1, 1, 8, 16)
    x = np.zeros((2, 1, 8), np.float32)
    inv = inv_freq_default_ref(8, 10000.0)
    with pytest.raises(ValueError, match=r"q= is rotated with k's rope; pass rope= too"):
        cache.append(0, x, x, q=np.zeros((2, 4, 8), np.float32))
    with pytest.raises(ValueError, match=r"q has shape \(1, 4, 8\); expected \(n=2, n_heads >= 1, head_dim=8\)"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv), q=np.zeros((1, 4, 8), np.float32))
    assert cache.length(0) == 0


@pytest.mark.parametrize("store", ["compute", "blit"])
@pytest.mark.parametrize("d", ops.attention_head_dims())
def test_store_at_every_attention_head_dim(dev, d, store):
    """At each head_dim the attention kernels take: a full layer with neox rope
    over the whole head, and a sliding ring (window 5, chunks of up to 3, so it
    wraps mid-chunk) with interleaved rope over half of it (partial rotary)."""
    rng = np.random.default_rng(d)
    n_kv, window, max_chunk = 2, 5, 3
    cache = metalkv.KVCache(dev, 2, n_kv, d, 16, windows=[0, window], max_chunk=max_chunk, store=store)
    R = window + max_chunk - 1
    ropes = [dict(style="neox", inv_freq=inv_freq_default_ref(d, 10000.0), rotary_dim=d),
             dict(style="interleaved", inv_freq=inv_freq_default_ref(d // 2, 10000.0), rotary_dim=d // 2)]
    models = [RingModel(16, n_kv, d), RingModel(R, n_kv, d)]
    for n in [3, 1, 3, 2, 3]:  # 12 tokens
        k, v = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d)
        for layer, (rope, model) in enumerate(zip(ropes, models)):
            cache.append(layer, k, v, rope=rope)
            k_rot = rope_ref(k, range(model.n, model.n + n), rope["inv_freq"], rope["style"],
                             rope["rotary_dim"])
            model.append(k_rot.astype(np.float16), v.astype(np.float16))
    for layer, (rope, model) in enumerate(zip(ropes, models)):
        rd = rope["rotary_dim"]
        np.testing.assert_array_equal(cache.positions(layer), model.pos)
        np.testing.assert_array_equal(cache.values(layer), model.v)  # exact half conversion
        got = cache.keys(layer)
        # float32 vs float64 rotation may flip a half rounding: 1 half ulp (as above)
        np.testing.assert_allclose(got.astype(np.float32), model.k.astype(np.float32),
                                   rtol=2.0 ** -10, atol=2.0 ** -24)
        np.testing.assert_array_equal(got[..., rd:], model.k[..., rd:])  # past rotary_dim: a copy


def test_ring_wraps_per_token_with_positions(dev):
    rng = np.random.default_rng(2)
    window, max_chunk, n_kv, d = 5, 3, 2, 8
    cache = metalkv.KVCache(dev, 2, n_kv, d, 64, windows=[0, window], max_chunk=max_chunk)
    R = window + max_chunk - 1
    assert cache.slots(1) == R and cache.wraps(1) and not cache.wraps(0) and cache.slots(0) == 64
    model = RingModel(R, n_kv, d)
    for n in [3, 1, 2, 3, 3, 1, 3, 2, 3]:  # 21 tokens: the ring wraps three times, mid-chunk too
        k, v = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d)
        cache.append(1, k, v)
        model.append(k.astype(np.float16), v.astype(np.float16))
        length = cache.length(1)
        assert length == model.n
        np.testing.assert_array_equal(cache.positions(1), model.pos)
        assert list(cache.positions(1)) == [expected_position(length, R, s) for s in range(R)]
        np.testing.assert_array_equal(cache.keys(1), model.k)
        np.testing.assert_array_equal(cache.values(1), model.v)
        # every query of the chunk still finds its whole window: q-W < p <= q
        held = set(cache.positions(1))
        for q in range(length - n, length):
            assert set(range(max(0, q - window + 1), q + 1)) <= held


def test_ring_of_max_chunk_one_has_window_slots(host):
    cache = metalkv.KVCache(host, 1, 1, 4, 100, windows=[6])
    assert cache.slots(0) == 6 and cache.wraps(0)
    for _ in range(8):
        cache.append(0, np.ones((1, 1, 4), np.float32), np.ones((1, 1, 4), np.float32))
    assert list(cache.positions(0)) == [6, 7, 2, 3, 4, 5]


def test_sliding_window_larger_than_capacity_is_linear(host):
    """A ring at least as large as the capacity is pointless: capacity slots, overflow like full."""
    cache = metalkv.KVCache(host, 2, 1, 4, 8, windows=[0, 16], max_chunk=2)
    assert cache.slots(1) == 8 and not cache.wraps(1) and cache.window(1) == 16
    one = np.ones((2, 1, 4), np.float32)
    for _ in range(4):
        cache.append(1, one, one)
    with pytest.raises(metalkv.GpuError, match=r"layer 1 holds 8 tokens; storing 2 more needs 10 > capacity 8"):
        cache.append(1, one, one)


@pytest.mark.parametrize("windows", [None, [0, 7, 0]])
def test_blit_and_compute_caches_are_bit_identical(dev, windows):
    rng = np.random.default_rng(4)
    n_kv, d = 3, 64
    kw = dict(windows=windows, max_chunk=5)
    caches = [metalkv.KVCache(dev, 3, n_kv, d, 40, store=s, **kw) for s in ("compute", "blit")]
    inv = inv_freq_default_ref(48, 10000.0)
    for step, n in enumerate([5, 1, 4, 5, 2, 5, 1, 3]):
        k, v = rows(rng, n, n_kv, d), rows(rng, n, n_kv, d)
        rope = None if step % 3 == 2 else dict(style=("neox", "interleaved")[step % 2], inv_freq=inv)
        for c in caches:
            for layer in range(3):
                c.append(layer, k, v, rope=rope)
    for layer in range(3):
        for get in ("keys", "values"):
            a, b = (getattr(c, get)(layer) for c in caches)
            assert np.array_equal(a.view(np.uint16), b.view(np.uint16)), (layer, get)
        np.testing.assert_array_equal(caches[0].positions(layer), caches[1].positions(layer))


def test_encoders_per_store(host):
    """compute: the one compute encoder, no blit; blit: one compute (the staging
    kernel) + one blit encoder, 2 copies (K, V), or 4 when the range wraps."""
    n_kv, d = 2, 8
    row = n_kv * d * F16_BYTES
    one = np.ones((3, n_kv, d), np.float32)
    compute = metalkv.KVCache(host, 1, n_kv, d, 16, windows=[4], max_chunk=3, store="compute")
    compute.append(0, one, one)
    c = compute.last_append_counters
    assert (c["compute_encoders"], c["blit_encoders"], c["dispatches"]) == (1, 0, 1)
    blit = metalkv.KVCache(host, 1, n_kv, d, 16, windows=[4], max_chunk=3, store="blit")
    blit.append(0, one, one)  # slots 0..2
    c = blit.last_append_counters
    assert (c["compute_encoders"], c["blit_encoders"], c["dispatches"]) == (1, 1, 1)
    assert c["blit_bytes_copied"] == 2 * 3 * row
    blit.append(0, one, one)  # slots 3, 4, 5 of R = 6: no wrap yet
    blit.append(0, one, one)  # positions 6..8 -> slots 0..2
    blit.append(0, one[:2], one[:2])  # positions 9, 10 -> slots 3, 4
    blit.append(0, one, one)  # positions 11..13 -> slots 5, 0, 1: wraps inside one call
    c = blit.last_append_counters
    assert (c["compute_encoders"], c["blit_encoders"]) == (1, 1)
    assert c["blit_bytes_copied"] == 2 * 3 * row
    assert list(blit.positions(0)) == [12, 13, 8, 9, 10, 11]


@pytest.mark.parametrize("store", ["compute", "blit"])
def test_one_step_across_layers_in_one_command_buffer(dev, store):
    """A model step stores into every layer in one command buffer. compute: the
    caller's single compute encoder serves all layers; blit: each layer costs a
    blit encoder and a fresh compute encoder, and layers share one staging buffer."""
    rng = np.random.default_rng(6)
    n_layers, n_kv, d = 4, 2, 32
    cache = metalkv.KVCache(dev, n_layers, n_kv, d, 32, windows=[0, 3, 0, 3], max_chunk=2, store=store)
    inv = inv_freq_default_ref(d, 10000.0)
    ks, vs = [], []
    for n in [2, 1, 2, 2]:  # 7 tokens: the sliding layers (4 slots) wrap
        k, v = rows(rng, n_layers * n, n_kv, d), rows(rng, n_layers * n, n_kv, d)
        k, v = k.reshape(n_layers, n, n_kv, d), v.reshape(n_layers, n, n_kv, d)
        cache.append_all_layers(k, v, rope=dict(style="neox", inv_freq=inv))
        ks.append(k), vs.append(v)
        c = cache.last_append_counters
        want = (1, 0) if store == "compute" else (n_layers, n_layers)
        assert (c["compute_encoders"], c["blit_encoders"], c["dispatches"]) == want + (n_layers,)
    k, v = np.concatenate(ks, axis=1), np.concatenate(vs, axis=1)  # (layers, 7, n_kv, d)
    for layer in range(n_layers):
        assert cache.length(layer) == 7
        pos = cache.positions(layer)
        held = pos >= 0
        want_k = rope_ref(k[layer], range(7), inv, "neox", d).astype(np.float16)[pos[held]]
        np.testing.assert_allclose(cache.keys(layer)[held].astype(np.float32), want_k.astype(np.float32),
                                   rtol=2.0 ** -10, atol=2.0 ** -24)  # 1 half ulp, as above
        np.testing.assert_array_equal(cache.values(layer)[held], v[layer].astype(np.float16)[pos[held]])


def test_step_across_layers_is_all_or_nothing(host):
    cache = metalkv.KVCache(host, 3, 1, 4, 16, windows=[0, 0, 4], max_chunk=2)
    three = np.ones((3, 3, 1, 4), np.float32)
    with pytest.raises(metalkv.GpuError, match=r"layer 2 is sliding"):
        cache.append_all_layers(three, three)
    assert [cache.length(l) for l in range(3)] == [0, 0, 0]  # layers 0 and 1 did not move
    with pytest.raises(ValueError, match=r"k has shape \(2, 3, 1, 4\); expected \(n_layers=3, n, n_kv_heads=1"):
        cache.append_all_layers(three[:2], three[:2])


# ---- views and bookkeeping --------------------------------------------------


@host_only  # zero-copy views need CPU-visible memory (a discrete GPU returns copies)
def test_views_are_copy_free(host):
    cache = metalkv.KVCache(host, 2, 2, 8, 16)
    keys_before = cache.keys(1)
    values_before = cache.values(1)
    k = np.full((2, 2, 8), 0.5, np.float32)
    cache.append(1, k, 2 * k)
    assert (keys_before[:2] == 0.5).all() and (values_before[:2] == 1.0).all()  # the store is visible
    assert np.shares_memory(keys_before, cache.keys(1))
    assert not np.shares_memory(cache.keys(1), cache.values(1))
    assert cache.keys(1).shape == (16, 2, 8) and cache.keys(1).dtype == np.float16
    keys_before[5, 1, 3] = 7.0  # writes through the view reach the cache
    assert cache.keys(1)[5, 1, 3] == 7.0


@host_only  # reads the layout through the views' addresses
def test_layer_layout_is_k_block_then_v_block(host):
    """The documented layout (2, R, n_kv_heads, head_dim): V starts R rows after K."""
    cache = metalkv.KVCache(host, 1, 2, 4, 8)
    k = np.arange(16, dtype=np.float32).reshape(2, 2, 4)
    cache.append(0, k, -k)
    region = np.concatenate([cache.keys(0).ravel(), cache.values(0).ravel()]).reshape(2, 8, 2, 4)
    np.testing.assert_array_equal(region[0, :2], k.astype(np.float16))
    np.testing.assert_array_equal(region[1, :2], (-k).astype(np.float16))
    base = cache.keys(0).__array_interface__["data"][0]
    assert cache.values(0).__array_interface__["data"][0] - base == 8 * 2 * 4 * F16_BYTES


@pytest.mark.parametrize("store", ["compute", "blit"])
def test_byte_accounting(host, store):
    n_kv, d, cap, max_chunk = 3, 64, 100, 4
    windows = [0, 10, 0, 200, 10]  # full, ring (13 slots), full, clamped to capacity, ring
    cache = metalkv.KVCache(host, 5, n_kv, d, cap, windows=windows, max_chunk=max_chunk, store=store)
    row = n_kv * d * F16_BYTES  # one token's K (or V) row
    slots = [cap, 13, cap, cap, 13]
    assert [cache.slots(l) for l in range(5)] == slots
    assert [cache.layer_nbytes(l) for l in range(5)] == [2 * s * row for s in slots]
    staging = 2 * max_chunk * row if store == "blit" else 0
    assert cache.staging_nbytes == staging
    assert cache.nbytes == sum(2 * s * row for s in slots) + staging
    # one more context token costs a K and a V row in each layer that does not wrap
    assert cache.bytes_per_token == 3 * 2 * row


def test_blit_staging_grows_for_big_full_layer_chunks(host):
    cache = metalkv.KVCache(host, 2, 1, 8, 64, windows=[0, 4], max_chunk=2, store="blit")
    row = 8 * F16_BYTES
    assert cache.staging_nbytes == 2 * 2 * row
    k = np.random.default_rng(0).uniform(-1, 1, (20, 1, 8)).astype(np.float32)
    cache.append(0, k, k)  # a full layer takes chunks past max_chunk
    np.testing.assert_array_equal(cache.keys(0)[:20], k.astype(np.float16))
    assert cache.staging_nbytes == 2 * 20 * row
    assert cache.nbytes == 2 * 64 * row + 2 * 5 * row + 2 * 20 * row


def test_reset(host):
    cache = metalkv.KVCache(host, 2, 1, 4, 8, windows=[0, 3])
    one = np.ones((1, 1, 4), np.float32)
    for _ in range(5):
        cache.append(0, one, one)
        cache.append(1, one, one)
    cache.reset()
    assert cache.length(0) == cache.length(1) == 0
    assert (cache.positions(0) == -1).all() and (cache.positions(1) == -1).all()
    cache.append(1, 3 * one, one)
    assert list(cache.positions(1)) == [0, -1, -1] and cache.keys(1)[0, 0, 0] == 3


def test_truncate(host):
    # layer 0 full (capacity 16), layer 1 a ring for window 3 with max_chunk 2: 4 slots
    cache = metalkv.KVCache(host, 2, 1, 4, 16, windows=[0, 3], max_chunk=2)
    for p in range(6):
        row = np.full((1, 1, 4), p, np.float32)
        cache.append(0, row, row)
        cache.append(1, row, row)
    with pytest.raises(metalkv.GpuError, match=r"cannot truncate layer 1 from 6 to 3 tokens.*at most max_chunk = 2"):
        cache.truncate(3)
    assert cache.length(0) == cache.length(1) == 6  # nothing changed
    with pytest.raises(metalkv.GpuError, match=r"cannot truncate layer 0 to 7 tokens: it holds only 6"):
        cache.truncate(7)
    cache.truncate(4)
    assert cache.length(0) == cache.length(1) == 4
    # the window at position 4 needs positions 2, 3: still in the ring, labelled as such
    pos1 = list(cache.positions(1))
    assert 2 in pos1 and 3 in pos1 and max(pos1) == 3
    row = np.full((1, 1, 4), 40, np.float32)
    cache.append(1, row, row)  # position 4 goes to slot 4 % 4 = 0 again
    assert cache.keys(1)[4 % 4, 0, 0] == 40 and list(cache.positions(0)[:4]) == [0, 1, 2, 3]


def test_properties(host):
    cache = metalkv.KVCache(host, 2, 3, 16, 32, windows=[0, 8], max_chunk=4, store="blit")
    assert (cache.n_layers, cache.n_kv_heads, cache.head_dim, cache.capacity) == (2, 3, 16, 32)
    assert (cache.max_chunk, cache.store, cache.windows) == (4, "blit", [0, 8])
    assert (cache.window(0), cache.window(1)) == (0, 8)


# ---- errors -----------------------------------------------------------------


def test_full_layer_overflow_raises_and_keeps_state(host):
    cache = metalkv.KVCache(host, 4, 1, 4, 4096, max_chunk=4096)
    big = np.zeros((4096, 1, 4), np.float32)
    cache.append(3, big, big)
    five = np.ones((5, 1, 4), np.float32)
    with pytest.raises(metalkv.GpuError,
                       match=r"^\[kv_cache\] layer 3 holds 4096 tokens; storing 5 more needs 4101 > capacity 4096"):
        cache.append(3, five, five)
    assert cache.length(3) == 4096 and not cache.keys(3).any()


def test_chunk_larger_than_max_chunk_on_sliding_layer(host):
    cache = metalkv.KVCache(host, 2, 1, 4, 64, windows=[0, 8], max_chunk=2)
    three = np.ones((3, 1, 4), np.float32)
    with pytest.raises(metalkv.GpuError, match=r"layer 1 is sliding \(window 8, 9 slots\); storing 3 tokens "
                                              r"in one call exceeds max_chunk 2"):
        cache.append(1, three, three)
    assert cache.length(1) == 0
    cache.append(0, three, three)  # a full layer does not care
    assert cache.length(0) == 3


def test_bad_shapes_dtypes_and_layers(host):
    cache = metalkv.KVCache(host, 2, 2, 8, 16)
    ok = np.zeros((1, 2, 8), np.float32)
    with pytest.raises(ValueError, match=r"\[kv_cache\] k has dtype float64; expected float32"):
        cache.append(0, ok.astype(np.float64), ok)
    with pytest.raises(ValueError, match=r"\[kv_cache\] v has dtype float16; expected float32"):
        cache.append(0, ok, ok.astype(np.float16))
    with pytest.raises(ValueError, match=r"k has shape \(1, 3, 8\); expected \(n, n_kv_heads=2, head_dim=8\)"):
        cache.append(0, np.zeros((1, 3, 8), np.float32), ok)
    with pytest.raises(ValueError, match=r"v has shape \(2, 8\); expected"):
        cache.append(0, ok, np.zeros((2, 8), np.float32))
    with pytest.raises(ValueError, match=r"k has shape \(0, 2, 8\)"):
        cache.append(0, ok[:0], ok[:0])
    with pytest.raises(ValueError, match=r"k has 1 tokens but v has 2"):
        cache.append(0, ok, np.zeros((2, 2, 8), np.float32))
    with pytest.raises(metalkv.GpuError, match=r"\[kv_cache\] layer 2 is out of range; the cache has 2 layers \(0..1\)"):
        cache.append(2, ok, ok)
    for call in (cache.keys, cache.values, cache.positions, cache.length, cache.layer_nbytes):
        with pytest.raises(metalkv.GpuError, match="layer 5 is out of range"):
            call(5)
    assert cache.length(0) == 0


def test_bad_rope(host):
    cache = metalkv.KVCache(host, 1, 1, 8, 16)
    x = np.zeros((1, 1, 8), np.float32)
    inv = inv_freq_default_ref(8, 10000.0)
    with pytest.raises(ValueError, match=r"\[rope\] unknown style 'gptj'; expected 'neox'"):
        cache.append(0, x, x, rope=dict(style="gptj", inv_freq=inv))
    with pytest.raises(metalkv.GpuError, match=r"\[kv_cache\] rotary_dim 7 must be even and between 2 and head_dim 8"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv[:3], rotary_dim=7))
    with pytest.raises(metalkv.GpuError, match=r"rotary_dim 10 must be even and between 2 and head_dim 8"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv_freq_default_ref(10, 1e4)))
    with pytest.raises(ValueError, match=r"inv_freq has 4 frequencies; rotary_dim 4 needs 2"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv, rotary_dim=4))
    with pytest.raises(ValueError, match=r"rope inv_freq has dtype float64"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv.astype(np.float64)))
    with pytest.raises(ValueError, match=r"unknown rope key 'theta'"):
        cache.append(0, x, x, rope=dict(style="neox", inv_freq=inv, theta=1e4))
    assert cache.length(0) == 0


def test_bad_construction(host):
    with pytest.raises(ValueError, match=r"unknown store path 'copy'; expected 'compute'"):
        metalkv.KVCache(host, 1, 1, 8, 16, store="copy")
    with pytest.raises(metalkv.GpuError, match=r"windows has 1 entries; expected one per layer \(2\)"):
        metalkv.KVCache(host, 2, 1, 8, 16, windows=[0])
    with pytest.raises(metalkv.GpuError, match=r"must be positive"):
        metalkv.KVCache(host, 2, 1, 8, 0)
    with pytest.raises(metalkv.GpuError, match=r"max_chunk must be at least 1"):
        metalkv.KVCache(host, 2, 1, 8, 16, max_chunk=0)
