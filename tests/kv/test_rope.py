"""RoPE: the standalone Q kernel (rope_f32_<style>) and the inv_freq tables,
against numpy references written for clarity (also used by test_kvcache.py),
and against transformers itself where it is installed."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops
from devices import test_device  # tests/ is on sys.path

# ---- references -------------------------------------------------------------


def pair_elements(style: str, i: int, rotary_dim: int) -> tuple[int, int]:
    """Element indices (within a head) of rotary pair i."""
    if style == "neox":  # half-split: HF transformers' rotate_half
        return i, i + rotary_dim // 2
    if style == "interleaved":  # adjacent: llama.cpp LLAMA on GGUF weights
        return 2 * i, 2 * i + 1
    raise ValueError(style)


def rope_ref(x: np.ndarray, positions, inv_freq: np.ndarray, style: str, rotary_dim: int) -> np.ndarray:
    """x (n_tokens, n_heads, head_dim) rotated, as float64. The angle pos * inv_freq
    is rounded to float32 as the spec says; cos, sin and the rotation are float64.
    Dims at or past rotary_dim are copied."""
    out = x.astype(np.float64)
    for t, pos in enumerate(positions):
        for i in range(rotary_dim // 2):
            theta = np.float64(np.float32(pos) * np.float32(inv_freq[i]))
            c, s = np.cos(theta), np.sin(theta)
            ia, ib = pair_elements(style, i, rotary_dim)
            a = x[t, :, ia].astype(np.float64)
            b = x[t, :, ib].astype(np.float64)
            out[t, :, ia] = a * c - b * s
            out[t, :, ib] = b * c + a * s
    return out


def inv_freq_default_ref(rotary_dim: int, base: float) -> np.ndarray:
    """transformers' _compute_default_rope_parameters in float32:
    1.0 / (base ** (arange(0, dim, 2) / dim))."""
    exponent = np.arange(0, rotary_dim, 2).astype(np.float32) / np.float32(rotary_dim)
    return (np.float32(1.0) / np.power(np.float32(base), exponent)).astype(np.float32)


def inv_freq_llama3_ref(rotary_dim, base, factor, low_freq_factor, high_freq_factor, old_context_len):
    """transformers' _compute_llama3_parameters, transcribed in float32."""
    f32 = np.float32
    inv_freq = inv_freq_default_ref(rotary_dim, base)
    low_freq_wavelen = old_context_len / low_freq_factor
    high_freq_wavelen = old_context_len / high_freq_factor
    wavelen = f32(2 * np.pi) / inv_freq
    # wavelen < high_freq_wavelen: unchanged; > low_freq_wavelen: divided by factor
    inv_freq_llama = np.where(wavelen > low_freq_wavelen, inv_freq / f32(factor), inv_freq)
    # in between: interpolate with a smooth factor
    smooth = (f32(old_context_len) / wavelen - f32(low_freq_factor)) / f32(high_freq_factor - low_freq_factor)
    smoothed = (f32(1) - smooth) * inv_freq_llama / f32(factor) + smooth * inv_freq_llama
    is_medium = ~(wavelen < high_freq_wavelen) & ~(wavelen > low_freq_wavelen)
    return np.where(is_medium, smoothed, inv_freq_llama).astype(np.float32)


def run_rope(dev, x, positions, inv_freq, style, rotary_dim):
    xb = dev.buffer_from(np.ascontiguousarray(x, np.float32))
    pb = dev.buffer_from(np.asarray(positions, np.uint32))
    fb = dev.buffer_from(np.asarray(inv_freq, np.float32))
    n, h, d = x.shape
    ops.rope(dev, xb, pb, fb, n_tokens=n, n_heads=h, head_dim=d, rotary_dim=rotary_dim, style=style)
    return xb.numpy().view(np.float32).reshape(x.shape).copy()


# Positions include long-context ones: angles up to ~1.3e5 rad test the kernel's
# precise sin/cos.
POSITIONS = [0, 1, 2, 7, 100, 4095, 32768, 131071]

# float32 sin/cos (<= 1 ulp) and three float32 roundings on values |x| < 1 give
# errors of a few 1e-7; the angle itself is the same float32 on both sides.
ATOL = 1e-6


# Every head_dim the attention kernels take, rotated whole; partial rotary as
# Phi-2 (80 of which 32) and others use it; an odd pair count (6 of 2).
ROPE_SHAPES = [(d, d) for d in ops.attention_head_dims()] + [(64, 32), (128, 96), (80, 32),
                                                             (112, 56), (6, 2)]


@pytest.mark.parametrize("style", ["neox", "interleaved"])
@pytest.mark.parametrize("head_dim,rotary_dim", ROPE_SHAPES)
def test_rope_matches_reference(dev, style, head_dim, rotary_dim):
    rng = np.random.default_rng(head_dim + rotary_dim)
    n_heads = 5
    x = rng.uniform(-1, 1, (len(POSITIONS), n_heads, head_dim)).astype(np.float32)
    inv = inv_freq_default_ref(rotary_dim, 10000.0)
    got = run_rope(dev, x, POSITIONS, inv, style, rotary_dim)
    np.testing.assert_allclose(got, rope_ref(x, POSITIONS, inv, style, rotary_dim), rtol=0, atol=ATOL)
    # dims past rotary_dim are untouched, bit for bit
    np.testing.assert_array_equal(got[..., rotary_dim:], x[..., rotary_dim:])


def test_position_zero_is_identity(dev):
    x = np.random.default_rng(0).uniform(-1, 1, (1, 3, 64)).astype(np.float32)
    got = run_rope(dev, x, [0], inv_freq_default_ref(64, 10000.0), "neox", 64)
    np.testing.assert_array_equal(got, x)  # cos 0 = 1, sin 0 = 0 exactly


def test_interleaved_is_neox_on_deinterleaved_dims(dev):
    """The two styles differ only in which dims pair up: interleaved rope equals
    neox rope applied to x with dims (0,2,4,...,1,3,5,...) gathered."""
    rng = np.random.default_rng(3)
    d = 32
    x = rng.uniform(-1, 1, (len(POSITIONS), 2, d)).astype(np.float32)
    inv = inv_freq_default_ref(d, 500000.0)
    perm = np.concatenate([np.arange(0, d, 2), np.arange(1, d, 2)])
    inter = run_rope(dev, x, POSITIONS, inv, "interleaved", d)
    neox = run_rope(dev, x[..., perm], POSITIONS, inv, "neox", d)
    np.testing.assert_array_equal(inter[..., perm], neox)


def test_neox_matches_transformers_apply_rotary_pos_emb():
    torch = pytest.importorskip("torch")
    llama = pytest.importorskip("transformers.models.llama.modeling_llama")
    dev = test_device()
    rng = np.random.default_rng(5)
    n_heads, d = 3, 64
    q = rng.uniform(-1, 1, (len(POSITIONS), n_heads, d)).astype(np.float32)
    inv = inv_freq_default_ref(d, 100000.0)
    # transformers' LlamaRotaryEmbedding: freqs = pos x inv_freq (float32), emb = cat(freqs, freqs)
    freqs = torch.tensor(POSITIONS, dtype=torch.float32)[:, None] * torch.from_numpy(inv)[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    qt = torch.from_numpy(q).transpose(0, 1)[None]  # (1, heads, seq, d)
    want, _ = llama.apply_rotary_pos_emb(qt, qt, emb.cos()[None], emb.sin()[None])
    want = want[0].transpose(0, 1).numpy()
    got = run_rope(dev, q, POSITIONS, inv, "neox", d)
    np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


# ---- frequency tables -------------------------------------------------------


@pytest.mark.parametrize("rotary_dim,base", [(64, 10000.0), (128, 500000.0), (32, 100000.0)])
def test_inv_freq_default(rotary_dim, base):
    got = np.array(ops.rope_inv_freq_default(rotary_dim, base), np.float32)
    # same float32 steps; powf implementations may differ by an ulp or two
    np.testing.assert_allclose(got, inv_freq_default_ref(rotary_dim, base), rtol=5e-7)
    np.testing.assert_allclose(got, base ** (-np.arange(0, rotary_dim, 2) / rotary_dim), rtol=2e-6)


LLAMA3 = dict(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0, original_max_position_embeddings=8192)


def test_inv_freq_llama3_matches_numpy_transcription():
    got = np.array(ops.rope_inv_freq_llama3(128, 500000.0, **LLAMA3), np.float32)
    want = inv_freq_llama3_ref(128, 500000.0, 8.0, 1.0, 4.0, 8192)
    np.testing.assert_allclose(got, want, rtol=2e-6)  # a few float32 ulps of op-order/powf slack
    plain = inv_freq_default_ref(128, 500000.0)
    wavelen = 2 * np.pi / plain
    # the three bands really are exercised
    assert (wavelen < 2048).any() and (wavelen > 8192).any() and ((wavelen >= 2048) & (wavelen <= 8192)).any()
    np.testing.assert_allclose(got[wavelen < 2048], plain[wavelen < 2048], rtol=5e-7)  # powf ulps
    np.testing.assert_allclose(got[wavelen > 8192], plain[wavelen > 8192] / 8, rtol=1e-6)


def test_inv_freq_llama3_matches_transformers():
    pytest.importorskip("torch")
    tr = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
    cfg = tr.LlamaConfig(hidden_size=256, num_attention_heads=2, head_dim=128, max_position_embeddings=131072,
                         rope_parameters=dict(rope_type="llama3", rope_theta=500000.0, **LLAMA3))
    want, _ = ROPE_INIT_FUNCTIONS["llama3"](cfg, "cpu")
    got = np.array(ops.rope_inv_freq_llama3(128, 500000.0, **LLAMA3), np.float32)
    np.testing.assert_allclose(got, want.numpy(), rtol=2e-6)


# ---- errors -----------------------------------------------------------------


def rope_call(dev, *, style="neox", rotary_dim=64, n=2, heads=2, d=64, x_bytes=None, inv_len=32):
    x = dev.buffer(x_bytes or n * heads * d * 4)
    pos = dev.buffer(n * 4)
    inv = dev.buffer(max(inv_len, 1) * 4)
    ops.rope(dev, x, pos, inv, n_tokens=n, n_heads=heads, head_dim=d, rotary_dim=rotary_dim, style=style)


def test_rope_errors():
    dev = test_device()
    with pytest.raises(metalkv.GpuError, match=r"\[rope\] unknown style 'llama'; expected 'neox'"):
        rope_call(dev, style="llama")
    with pytest.raises(metalkv.GpuError, match=r"\[rope\] rotary_dim 63 must be even and between 2 and head_dim 64"):
        rope_call(dev, rotary_dim=63)
    with pytest.raises(metalkv.GpuError, match=r"\[rope\] rotary_dim 66 must be even"):
        rope_call(dev, rotary_dim=66)
    with pytest.raises(metalkv.GpuError, match=r"\[rope\] x \(n_tokens, n_heads, head_dim\) float needs 1024 bytes"):
        rope_call(dev, x_bytes=1000)
    with pytest.raises(metalkv.GpuError, match=r"\[rope\] inv_freq \(rotary_dim/2 floats\) needs 128 bytes"):
        rope_call(dev, inv_len=16)
    with pytest.raises(metalkv.GpuError, match=r"\[rope_inv_freq\] rotary_dim 7 must be even"):
        ops.rope_inv_freq_default(7, 10000.0)
    with pytest.raises(metalkv.GpuError, match=r"low_freq_factor < high_freq_factor"):
        ops.rope_inv_freq_llama3(64, 10000.0, low_freq_factor=4.0, high_freq_factor=4.0)
