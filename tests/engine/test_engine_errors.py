"""Bad input gets a clear error naming what was wrong: model files, devices,
arguments, token ids, caches. Small GGUF models are written with gguf-py."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import metalkv
from metalkv import _core
from metalkv.models import ModelLoadError, ModelNotFoundError, load_model

from models.tiny import write_gguf  # tests/ is on sys.path (rootdir-relative packages)
from .reference import llama_logits
from devices import TEST_DEVICE  # tests/ is on sys.path

# head_dim 64 (hidden 128 / 2 heads): a size the attention kernels take
TINY = dict(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    f = tmp_path_factory.mktemp("tiny") / "tiny.gguf"
    q = gguf.GGMLQuantizationType
    write_gguf(f, **TINY, quantize={"blk.0.attn_q.weight": q.Q4_0, "blk.0.ffn_up.weight": q.Q4_1,
                                    "blk.1.attn_output.weight": q.Q8_0, "blk.1.ffn_down.weight": q.F16})
    return f


@pytest.fixture(scope="module")
def tiny(tiny_path):
    return metalkv.Engine.load(tiny_path, device=TEST_DEVICE, context=32)


def test_tiny_quantized_model_matches_reference(tiny, tiny_path):
    """Q4_0, Q4_1, Q8_0 and F16 matrices in one model, read in-kernel, against
    the float64 forward of gguf-py's dequantization."""
    ids = [1, 5, 9, 63, 0, 17, 17, 2]
    ref = llama_logits(load_model(tiny_path, progress=False), ids)
    got = tiny.logits(ids)
    # random weights of std 1 give logits of ~1e2; float32 sums and the f16 cache
    # keep ~1e-3 relative of that
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-3 * np.abs(ref).max())


@pytest.mark.parametrize("make,match", [
    (lambda f: write_gguf(f, arch="gptneox", **TINY), r"architecture 'gptneox' is not supported"),
    (lambda f: write_gguf(f, omit=("blk.1.ffn_up.weight",), **TINY), r"missing tensor\(s\) blk.1.ffn_up.weight"),
    (lambda f: write_gguf(f, reshape={"blk.0.attn_k.weight": (32, 128)}, **TINY),
     r"blk.0.attn_k.weight has shape \(32, 128\), expected \(64, 128\)"),
    (lambda f: write_gguf(f), r"head_dim 8 is not supported; the attention kernels take 32, 64, 80, 96, 112, 128, 160, 192 or 256"),
])
def test_bad_model_files(tmp_path, make, match):
    f = tmp_path / "m.gguf"
    make(f)
    with pytest.raises(ModelLoadError, match=match):
        metalkv.Engine.load(f, device=TEST_DEVICE)


@pytest.mark.parametrize("keep", [0.9, 0.3])
def test_truncated_and_corrupt_files(tmp_path, keep):
    f = tmp_path / "m.gguf"
    write_gguf(f, **TINY)
    data = f.read_bytes()
    f.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match=r"truncated"):
        metalkv.Engine.load(f, device=TEST_DEVICE)
    f.write_bytes(b"GGUX" + data[4:])
    with pytest.raises(ModelLoadError, match=r"not a GGUF file"):
        metalkv.Engine.load(f, device=TEST_DEVICE)


def test_missing_model_and_bad_device(tmp_path):
    with pytest.raises(ModelNotFoundError):
        metalkv.Engine.load(tmp_path / "nothing.gguf", device=TEST_DEVICE)
    with pytest.raises(metalkv.GpuError, match=r"unknown device kind 'gpu'"):
        metalkv.Engine.load(tmp_path / "nothing.gguf", device="gpu")


def test_cache_of_another_model(tiny, engine):
    with pytest.raises(metalkv.GpuError, match=r"was not made for this model"):
        tiny.logits([1, 2], cache=engine.new_cache(capacity=8))


def test_model_without_tokenizer_needs_ids(tiny):
    with pytest.raises(ValueError, match=r"ships no tokenizer; pass token ids"):
        tiny.generate("hello")
    assert len(tiny.generate_ids([1, 2, 3], max_tokens=3, stop_ids=())) == 3


def chi2_critical(df: int, z: float = 3.719) -> float:
    """Wilson-Hilferty approximation of the chi-square quantile; z = 3.719 is the
    standard normal's 1 - 1e-4 quantile."""
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("kw", [dict(temperature=1.5), dict(temperature=0.8, top_k=5)])
def test_sampled_first_tokens_follow_the_softmax(tiny, kw):
    """Through the whole engine (seeded host draws, the device sampler): the first
    sampled token over many seeds follows softmax(logits / T), restricted to the
    top k when asked. Seeds are fixed, so the outcome is deterministic."""
    prompt = [3, 14, 15, 9, 26]
    logits = tiny.logits(prompt)[-1].astype(np.float64) / kw["temperature"]
    p = np.exp(logits - logits.max())
    if "top_k" in kw:
        p[np.argsort(-logits, kind="stable")[kw["top_k"]:]] = 0
    p /= p.sum()
    n = 800
    counts = np.zeros(len(p))
    # all at once: batched, each call draws what it draws alone (docs/BATCHING.md), in far fewer steps
    opts = dict(temperature=kw["temperature"], top_k=kw.get("top_k", 0), top_p=1.0, min_p=0.0,
                repetition_penalty=1.0, max_tokens=1, stop_ids=[], ephemeral=True)
    ch = _core.Channel()
    calls = [tiny._core.submit(tiny.new_cache(), np.asarray(prompt, np.int64), channel=ch, seed=seed, **opts)
             for seed in range(n)]
    for c in calls:
        counts[c.result()[0]] += 1
    assert counts[p == 0].sum() == 0  # nothing outside the allowed set
    expected = n * p
    big = expected >= 5  # pool the rare tokens into one bin
    obs = np.append(counts[big], counts[~big & (p > 0)].sum())
    exp = np.append(expected[big], expected[~big & (p > 0)].sum())
    keep = exp > 0
    stat = float(((obs[keep] - exp[keep]) ** 2 / exp[keep]).sum())
    assert stat < chi2_critical(int(keep.sum()) - 1), (stat, obs, exp)
