"""The KV cache's options on Gemma 3n (tiny_hf's gemma3n_shared: 6 layers of which 4
read layers 0 and 1's K and V, window 8, sparse gates, AltUp, per-layer inputs):
batching, the prefix cache, saved caches and speculation give what one plain call gives,
bit for bit; quantized caches stay near transformers' logits; an eviction policy holds
its budget over the two cache layers. (Each option against the float64 reference with
sharing: test_kv_share.py; Gemma 3n's parity with transformers: test_gemma3n.py.)"""
from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

import metalkv  # noqa: E402

from . import tiny_hf  # noqa: E402
from devices import TEST_DEVICE  # tests/ is on sys.path  # noqa: E402

NAME = "gemma3n_shared"
PROMPTS = [[int(i) for i in np.random.default_rng(s).integers(3, 256, n)] for s, n in ((1, 40), (2, 23), (3, 57))]


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    return tiny_hf.build_all(tmp_path_factory.mktemp("gemma3n_kv"), (NAME,))[NAME]


def load(ref, **kw) -> metalkv.Engine:
    return metalkv.Engine.load(ref.path, device=TEST_DEVICE, context=128, progress=False, **kw)


def test_the_cache_holds_the_two_storing_layers(ref):
    cache = load(ref).new_cache()
    assert cache.n_layers == 2 and list(cache.windows) == [8, 0]  # layers 0 (sliding) and 1 (full)


def test_a_batch_gives_each_call_what_it_gets_alone(ref):
    eng = load(ref)
    alone = [eng.generate_ids(p, max_tokens=10, stop_ids=()) for p in PROMPTS]
    assert eng.generate_ids(PROMPTS, max_tokens=10, stop_ids=()) == alone


def test_a_cached_prefix_gives_the_reply_computing_it_gives(ref):
    eng = load(ref)
    fresh = load(ref).generate_ids(PROMPTS[2], max_tokens=10, stop_ids=())
    eng.generate_ids(PROMPTS[2][:40], max_tokens=1, stop_ids=())  # its first 32 tokens: a cached block
    assert eng.generate_ids(PROMPTS[2], max_tokens=10, stop_ids=()) == fresh
    assert eng.last_stats["prompt_tokens_cached"] == 32


def test_a_saved_cache_continues_as_if_never_saved(ref, tmp_path):
    eng = load(ref)
    whole = eng.logits(PROMPTS[0] + PROMPTS[1])
    cache = eng.new_cache()
    eng.logits(PROMPTS[0], cache=cache)
    cache.save(tmp_path / "c.safetensors")
    back = eng.load_cache(tmp_path / "c.safetensors")
    np.testing.assert_array_equal(eng.logits(PROMPTS[1], cache=back), whole[len(PROMPTS[0]):])


def test_lookup_speculation_gives_plain_decodings_ids(ref):
    eng = load(ref)
    prompt = (PROMPTS[0][:6] * 6)[:34]
    plain = eng.generate_ids(prompt, max_tokens=20, stop_ids=())
    assert eng.generate_ids(prompt, max_tokens=20, stop_ids=(), speculate="lookup") == plain


def quantized_kv_logits(ref, ids: list[int], fmt: str) -> np.ndarray:
    """transformers' float64 logits with K and V read back as a `fmt` cache stores them
    (kv_quant_ref's roundtrip, then f16), as test_kv_quant_engine's storage does."""
    import torch
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import ALL_MASK_ATTENTION_FUNCTIONS, sdpa_mask

    from kv import kv_quant_ref as qr  # tests/ is on sys.path

    def stored(t):  # (1, heads, n, d)
        x = t[0].transpose(0, 1).numpy().astype(np.float32)
        y = qr.roundtrip(x, fmt).astype(np.float16).astype(np.float64)
        return torch.from_numpy(y).transpose(0, 1)[None].to(t.dtype)

    def attend(module, query, key, value, attention_mask, **kw):
        return sdpa_attention_forward(module, query, stored(key), stored(value), attention_mask, **kw)

    name = f"metalkv_{fmt}_kv"
    AttentionInterface.register(name, attend)
    ALL_MASK_ATTENTION_FUNCTIONS.register(name, sdpa_mask)
    ref.logits(ids[:2], float64=True)  # (makes the float64 copy)
    model = ref._model64
    base = model.config._attn_implementation
    model.set_attn_implementation(name)
    try:
        with torch.no_grad():
            return model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    finally:
        model.set_attn_implementation(base)


@pytest.mark.filterwarnings("ignore:a q4 KV cache without rotation")  # (unrotated on purpose: the storage alone)
@pytest.mark.parametrize("fmt", ["q8", "q4"])
def test_quantized_caches_match_transformers_reading_the_same_storage(ref, fmt):
    """q8 and q4 (unrotated, no residual window) against transformers with K and V through
    the same quantizer: the readers read their writers' quantized rows."""
    eng = load(ref, kv_k=fmt, kv_v=fmt, kv_rotate=False, kv_residual=0)
    got = eng.logits(PROMPTS[2])
    want = quantized_kv_logits(ref, PROMPTS[2], fmt)
    f16 = ref.logits(PROMPTS[2], float64=True)
    scale = np.abs(want).max()
    err, off = np.abs(got - want).max() / scale, np.abs(got - f16).max() / scale
    assert err < 4e-3 and off > 4 * err, (err, off)


def test_a_q4_cache_past_its_residual_window_stays_near(ref):
    """q4 with a residual window of 32: the 57-token prompt's first keys are read as q4."""
    want = ref.logits(PROMPTS[2], float64=True)
    got = load(ref, kv_k="q4", kv_v="q4", kv_residual=32).logits(PROMPTS[2])
    f16 = load(ref).logits(PROMPTS[2])
    err = np.abs(got - want).max() / np.abs(want).max()
    assert 0 < np.abs(got - f16).max() and err < 0.05, err


@pytest.mark.parametrize("kv_memory", [None, "auto"], ids=["own-pool", "shared-pool"])
def test_streaming_goes_on_past_its_budget_beside_sliding_layers(ref, kv_memory):
    """A streaming cache's capacity is its budget; its sliding layer goes on past it too,
    letting go of what leaves its window (it used to stop the call at the budget:
    context_full after 8 tokens), alone and batched."""
    eng = load(ref, kv_policy="streaming", kv_budget=64, kv_memory=kv_memory)
    cache = eng.new_cache()
    out = eng.generate_ids(PROMPTS[2], max_tokens=200, stop_ids=(), cache=cache)  # 257 tokens through 64
    assert len(out) == 200 and eng.last_stats["finish_reason"] == "length"
    assert cache.evicted > 0 and cache.count(1) <= 64  # the full cache layer (layer 1's, read by 3 and 5)
    alone = eng.generate_ids(PROMPTS[1], max_tokens=120, stop_ids=())
    assert eng.generate_ids([PROMPTS[2], PROMPTS[1]], max_tokens=120, stop_ids=())[1] == alone
