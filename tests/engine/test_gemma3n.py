"""Gemma 3n's text decoder (tiny_hf.GEMMA3N_NAMES) against transformers 5.24, as
test_parity_transformers.py checks the other architectures (its tolerances, explained
there): logits at every position, greedy decoding equal to model.generate through
prefill chunks and across the sliding window, a cache fed in pieces, chunked prefill; and
the same weights as llama.cpp's gemma3n GGUF. Before the engine: what the loaders make
of the checkpoints transformers saved (config, canonical tensors, the spec the C++ takes).

What the tiny models exercise: 4 AltUp streams with a router whose coefficients mix them
by ~20 %, LAuReL, per-layer inputs (prompt ids beyond the per-layer table included),
sparse ffn gates (0.95 and 0.75), v's weightless norm, unscaled scores, x * w norms, a
final soft-cap, window 8 < the 40-token prompts, and the last layers reading earlier
layers' K and V (tiny_hf.GEMMA3N_SPECS).
"""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

import metalkv  # noqa: E402
from metalkv.model_spec import device_tensor, engine_spec  # noqa: E402
from metalkv.models import expected_shapes, load_model  # noqa: E402

from . import tiny_hf  # noqa: E402
from .test_gguf_vs_hf import write_gguf_from_hf  # noqa: E402
from .test_parity_transformers import (CONTEXT, N_GREEDY, N_PROMPT, SPLITS, Bounds, prompt,  # noqa: E402
                                       where)
from .test_parity_transformers import bounds, greedy_case  # noqa: E402,F401  (fixtures, over this module's refs)
from devices import TEST_DEVICE  # tests/ is on sys.path  # noqa: E402

NAMES = tiny_hf.GEMMA3N_NAMES
_TYPES = {"sliding_attention": "sliding", "full_attention": "full"}


@pytest.fixture(scope="session")
def refs(tmp_path_factory):
    return tiny_hf.build_all(tmp_path_factory.mktemp("tiny_gemma3n"), NAMES)


@pytest.fixture(scope="module")
def engines(refs):
    cache = {}

    def get(name: str, prefill_chunk: int = 128) -> metalkv.Engine:
        if (name, prefill_chunk) not in cache:
            cache[name, prefill_chunk] = metalkv.Engine.load(refs[name].path, device=TEST_DEVICE, context=CONTEXT,
                                                             prefill_chunk=prefill_chunk, progress=False)
        return cache[name, prefill_chunk]

    return get


# ---- the loaders (no engine) ----------------------------------------------------------

def expected_config(name: str) -> dict:
    """What ModelConfig must say, written from the spec by hand."""
    s = tiny_hf.SPECS[name]
    rp = s["rope_parameters"]
    stds = {0.95: 1.6448536, 0.75: 0.6744897, 0.0: None}  # float32 Normal(0, 1).icdf, as torch gives them
    sparsity = tuple(stds[p] for p in s["activation_sparsity_pattern"])
    return dict(
        arch="gemma3n", n_layers=s["num_hidden_layers"], hidden=s["hidden_size"],
        n_heads=s["num_attention_heads"], n_kv_heads=s["num_key_value_heads"], head_dim=s["head_dim"],
        ffn_hidden=s["intermediate_size"], vocab=s["vocab_size"], rms_eps=s["rms_norm_eps"],
        rope_theta=rp["full_attention"]["rope_theta"], rope_local_base_freq=rp["sliding_attention"]["rope_theta"],
        rope_scaling=None, rope_style="neox", tie_embeddings=True, attn_bias=False, hidden_act="gelu_tanh",
        layer_types=tuple(_TYPES[t] for t in s["layer_types"]), sliding_window=s["sliding_window"],
        attn_scale=1.0, final_logit_softcap=s.get("final_logit_softcapping", 30.0), attn_logit_softcap=None,
        embedding_scale=pytest.approx(s["hidden_size"] ** 0.5), norm_weight_offset=0.0,
        altup_inputs=4, altup_active=0, per_layer_dim=16, per_layer_vocab=s["vocab_size_per_layer_input"],
        laurel_rank=s["laurel_rank"], kv_shared_layers=s["num_kv_shared_layers"],
        ffn_sparse_std=pytest.approx(sparsity) if any(sparsity) else ())


@pytest.mark.parametrize("name", NAMES)
def test_config_from_transformers(refs, name):
    cfg = load_model(refs[name].path, progress=False).config
    want = expected_config(name)
    assert {k: getattr(cfg, k) for k in want} == want
    # the sparsity multipliers are exactly torch's float32 icdf, which transformers computes
    torch_std = [torch.distributions.Normal(0, 1).icdf(torch.tensor(p)).item()
                 for p in tiny_hf.SPECS[name]["activation_sparsity_pattern"] if p]
    assert [s for s in cfg.ffn_sparse_std if s is not None] == torch_std


@pytest.mark.parametrize("name", NAMES)
def test_kv_sharing_is_transformers(refs, name):
    """Each reader reads the layer transformers marks "store" for its type."""
    hf = refs[name].model.config
    if hasattr(hf, "kv_sharing_modes"):
        modes = hf.kv_sharing_modes
        store = {hf.layer_types[i]: i for i, m in enumerate(modes) if m == "store"}
        want = {i: store[hf.layer_types[i]] for i, m in enumerate(modes) if m == "reuse"}
    else:  # (transformers 5.17: each attention names the layer it reads)
        want = {i: layer.self_attn.kv_shared_layer_index for i, layer in enumerate(refs[name].model.model.layers)
                if layer.self_attn.is_kv_shared_layer}
    assert load_model(refs[name].path, progress=False).config.kv_share_sources() == want


@pytest.mark.parametrize("name", NAMES)
def test_canonical_tensors_from_safetensors(refs, name):
    """Every tensor of the checkpoint transformers saved, under its canonical name and shape;
    the readers have no k/v weights; values are the model's."""
    m = load_model(refs[name].path, progress=False)
    shapes = expected_shapes(m.config)
    assert {n: t.shape for n, t in m.tensors.items()} == shapes
    readers = m.config.kv_share_sources()
    assert not any(f"blk.{i}.attn_k.weight" in m.tensors for i in readers)
    state = {k: v.numpy() for k, v in refs[name].model.state_dict().items()}
    pairs = {"per_layer_token_embd.weight": "model.embed_tokens_per_layer.weight",
             "altup_proj.2.weight": "model.altup_projections.2.weight",
             "altup_unembd_proj.0.weight": "model.altup_unembed_projections.0.weight",
             "blk.1.altup_correct_scale.weight": "model.layers.1.altup.correct_output_scale",
             "blk.1.altup_predict_coef.weight": "model.layers.1.altup.prediction_coefs.weight",
             "blk.1.laurel_r.weight": "model.layers.1.laurel.linear_right.weight",
             "blk.1.inp_gate.weight": "model.layers.1.per_layer_input_gate.weight",
             "blk.1.post_norm.weight": "model.layers.1.post_per_layer_input_norm.weight"}
    for ours, theirs in pairs.items():
        np.testing.assert_array_equal(_f32(m.tensors[ours]), state[theirs], err_msg=ours)


@pytest.mark.parametrize("quantize", [None, "q8_0"])
def test_altup_coefficients_reach_the_device_as_f32(refs, quantize):
    """The router and coefficient matrices are f32 whatever the file and quantize= say;
    the other matrices follow the usual rules."""
    name = "gemma3n_d64"  # saved in bf16
    m = load_model(refs[name].path, progress=False, quantize=quantize)
    for kind in ("altup_router", "altup_predict_coef", "altup_correct_coef"):
        dtype, data = device_tensor(m.tensors[f"blk.0.{kind}.weight"], quantize)
        assert dtype == "f32" and data.dtype == np.float32, kind
    assert device_tensor(m.tensors["blk.0.laurel_l.weight"], quantize)[0] == (quantize or "f16")


def test_engine_spec(refs):
    """The Gemma 3n keys of the spec dict the C++ model takes (model_spec.altup_spec)."""
    m = load_model(refs["gemma3n"].path, progress=False)
    spec = engine_spec(m.config, m.tensors)
    assert spec["kv_layer"] == [0, 1, 2, 3, 4, 2, 4, 2]  # 5 and 7 read layer 2, 6 reads layer 4
    assert {k: spec[k] for k in ("altup_inputs", "altup_active", "per_layer_dim", "per_layer_vocab",
                                 "laurel_rank", "v_norm")} == dict(altup_inputs=4, altup_active=0, per_layer_dim=16,
                                                                   per_layer_vocab=256, laurel_rank=8, v_norm=True)
    assert spec["ffn_sparse"] == [True] * 3 + [False] * 5
    assert spec["ffn_sparse_std"] == [float(np.float32(1.6448536))] * 3 + [0.0] * 5
    assert (spec["norm_offset"], spec["attn_scale"], spec["final_softcap"]) == (0.0, 1.0, 30.0)
    assert spec["embedding_scale"] == pytest.approx(128 ** 0.5) and spec["activation"] == "gelu_tanh"
    assert spec["qk_norm"] and spec["sandwich_norms"] and spec["tied_embeddings"]
    assert spec["layer_window"] == [8, 8, 0, 8, 8, 0, 8, 0] and spec["layer_rope_table"] == [1, 1, 0, 1, 1, 0, 1, 0]


def test_the_cache_holds_the_layers_that_store_and_kv_share_adds_to_them(refs):
    """gemma3n: 5 of its 8 layers store K and V; kv_share={1: 0} (both sliding) leaves 4;
    a layer the model already shares cannot be given another source."""
    path = refs["gemma3n"].path
    own = metalkv.Engine.load(path, device=TEST_DEVICE, context=CONTEXT, progress=False)
    more = metalkv.Engine.load(path, device=TEST_DEVICE, context=CONTEXT, progress=False, kv_share={1: 0})
    assert (own.new_cache(capacity=64).n_layers, more.new_cache(capacity=64).n_layers) == (5, 4)
    with pytest.raises(metalkv.ArgumentError, match=r"layers 5\.\.7 already read earlier layers' K and V"):
        metalkv.Engine.load(path, device=TEST_DEVICE, progress=False, kv_share={6: 3})


# ---- GGUF --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def gguf_files(refs, tmp_path_factory):
    """Each model as llama.cpp's converter writes it (test_gguf_vs_hf.write_gguf_from_hf)."""
    out = {}
    for name in NAMES:
        config = json.loads((refs[name].path / "config.json").read_text())
        arrays = {k: v.numpy() for k, v in refs[name].model.state_dict().items()}
        out[name] = tmp_path_factory.mktemp("gguf") / f"{name}.gguf"
        write_gguf_from_hf(out[name], config, arrays)
    return out


@pytest.mark.parametrize("name", NAMES)
def test_gguf_and_safetensors_give_the_same_model(refs, gguf_files, name):
    """Config and canonical tensors agree, but for the per-layer table: the converter pads it
    with zero rows to the vocabulary, so a GGUF's per_layer_vocab is the vocabulary."""
    hf = load_model(refs[name].path, progress=False)
    gg = load_model(gguf_files[name], progress=False)
    skip = ("source_arch", "source_format", "per_layer_vocab")
    want = {k: v for k, v in vars(hf.config).items() if k not in skip}
    got = {k: getattr(gg.config, k) for k in want}
    assert got == {k: np.float32(v) if k == "rms_eps" else v for k, v in want.items()}
    assert (hf.config.per_layer_vocab, gg.config.per_layer_vocab) == (tiny_hf.SPECS[name]["vocab_size_per_layer_input"],
                                                                      hf.config.vocab)
    assert set(gg.tensors) == set(hf.tensors)  # the readers' k/v zeros dropped, altup_proj unstacked
    for n, t in hf.tensors.items():
        a = _f32(t)
        b = _f32(gg.tensors[n])
        if n == "per_layer_token_embd.weight":
            assert not b[a.shape[0]:].any()
            b = b[:a.shape[0]]
        np.testing.assert_array_equal(b, a, err_msg=n)


def _f32(t) -> np.ndarray:
    from metalkv.models.tensor import bf16_to_f32

    return bf16_to_f32(t.data) if t.dtype == "bf16" else np.asarray(t.data, np.float32)


# ---- parity ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_logits_every_position(engines, bounds, name):
    b = bounds(name)
    assert b.kv_effect < b.loose, "the first-order estimate of f16 K/V's effect does not hold"
    assert b.tight < b.kv_effect, "float32 noise hides the f16 K/V rounding: TIGHT would not see it"
    got = engines(name).logits(prompt(name))
    assert got.shape == b.z32.shape and got.dtype == np.float32
    b.check_tight(got, "engine")
    d32 = np.abs(got - b.z32)
    assert d32.max() <= b.loose, f"engine vs transformers float32: {where(d32)} > {b.loose:.3g}"
    ref_sorted = np.sort(b.z32, axis=1)
    clear = ref_sorted[:, -1] - ref_sorted[:, -2] > b.clear_margin
    assert clear.sum() >= N_PROMPT // 2, "too few rows with a clear argmax to test it"
    np.testing.assert_array_equal(got[clear].argmax(1), b.z32[clear].argmax(1))


@pytest.mark.parametrize("chunk", [128, 5])
@pytest.mark.parametrize("name", NAMES)
def test_greedy_matches_generate(engines, greedy_case, name, chunk):
    """32 tokens after a 40-token prompt: well past window 8, the readers' sources included."""
    ids, want, b = greedy_case(name)
    got = engines(name, prefill_chunk=chunk).generate_ids(ids, max_tokens=N_GREEDY, stop_ids=())
    if got != want:
        step = next(i for i, (g, w) in enumerate(zip(got + [-1] * N_GREEDY, want)) if g != w)
        pytest.fail(f"greedy differs from step {step}: engine {got[step:step + 4]}, transformers "
                    f"{want[step:step + 4]}")


@pytest.mark.parametrize("name", NAMES)
def test_decode_through_cache_equals_prefill(engines, bounds, name):
    eng, ids, b = engines(name), prompt(name), bounds(name)
    c = eng.new_cache()
    edges = (0,) + SPLITS + (len(ids),)
    got = np.concatenate([eng.logits(ids[lo:hi], cache=c) for lo, hi in zip(edges, edges[1:])])
    b.check_tight(got, f"pieces {edges}")


@pytest.mark.parametrize("chunk", [1, 8, 13])
@pytest.mark.parametrize("name", NAMES)
def test_chunked_prefill(engines, bounds, name, chunk):
    b = bounds(name)
    b.check_tight(engines(name, prefill_chunk=chunk).logits(prompt(name)), f"prefill_chunk={chunk}")


@pytest.mark.parametrize("name", NAMES)
def test_gguf_gives_transformers_logits(refs, gguf_files, name):
    """The GGUF of the same weights, within the same bound of transformers, on the prompt's
    ids inside the per-layer table: past it the GGUF reads its zero padding (llama.cpp's
    behaviour), transformers row 0."""
    table = tiny_hf.SPECS[name]["vocab_size_per_layer_input"]
    ids = [i for i in prompt(name) if i < table]
    eng = metalkv.Engine.load(gguf_files[name], device=TEST_DEVICE, context=CONTEXT, progress=False)
    Bounds(refs[name], ids).check_tight(eng.logits(ids), "GGUF")
