"""Gemma 3n in the loaders (models/gemma3n.py): config.json in both rope spellings and
nested in the multimodal config, GGUF metadata as llama.cpp's converter writes it, the
model's own KV sharing (E2B's and E4B's maps, a user kv_share added to it), canonical
tensors of a multimodal checkpoint, and every refusal by name. Parity with transformers:
tests/engine/test_gemma3n.py."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

import metalkv
from metalkv.model_spec import engine_spec, kv_layers
from metalkv.models import ModelLoadError, expected_shapes, load_model
from metalkv.models.gemma3n import unstack
from metalkv.models.gguf_loader import config_from_gguf
from metalkv.models.hf_config import config_from_hf
from metalkv.models.tensor import Tensor

from .tiny import gemma3n_config, gemma3n_hf_shapes, write_safetensors


def test_config_json():
    c = config_from_hf(gemma3n_config(), "t")
    assert (c.arch, c.source_arch, c.head_dim, c.ffn_hidden, c.hidden_act) == ("gemma3n", "gemma3n_text", 16, 48,
                                                                              "gelu_tanh")
    assert c.layer_types == ("sliding", "full") * 3 and c.sliding_window == 8
    assert (c.rope_theta, c.rope_local_base_freq, c.rope_scaling) == (1e6, 1e4, None)
    assert c.attn_scale == 1.0 and c.query_pre_attn_scalar == 1.0  # the file's 256 is unused
    assert c.norm_weight_offset == 0.0 and c.embedding_scale == pytest.approx(math.sqrt(32))
    assert c.tie_embeddings and c.final_logit_softcap == 30.0 and c.traits.v_norm and c.traits.altup
    assert (c.altup_inputs, c.altup_active, c.per_layer_dim, c.per_layer_vocab, c.laurel_rank) == (4, 0, 8, 48, 4)
    assert c.ffn_sparse_std == (np.float32(1.6448536),) * 2 + (None,) * 4
    assert c.kv_shared_layers == 2 and c.kv_share_sources() == {4: 2, 5: 3}
    assert c.eos_ids == (1,) and c.bos_id == 2
    assert config_from_hf(gemma3n_config(hidden_activation="silu"), "t").hidden_act == "silu"  # as the file says


def test_defaults_are_transformers():
    """Keys left out mean what Gemma3nTextConfig's defaults mean."""
    bare = {k: v for k, v in gemma3n_config(num_hidden_layers=20, intermediate_size=48).items()
            if k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                     "num_key_value_heads", "vocab_size")}
    c = config_from_hf(bare, "t")
    assert (c.head_dim, c.sliding_window, c.context_length, c.final_logit_softcap) == (256, 512, 32768, 30.0)
    assert c.layer_types == tuple("full" if i % 5 == 4 else "sliding" for i in range(20))
    assert (c.rope_theta, c.rope_local_base_freq) == (1e6, 1e4)
    assert (c.altup_inputs, c.per_layer_dim, c.per_layer_vocab, c.laurel_rank) == (4, 256, 262144, 64)
    assert c.ffn_sparse_std == (np.float32(1.6448536),) * 10 + (None,) * 10  # the first 10 of > 10 layers
    assert c.kv_shared_layers == 15 and c.kv_share_sources() == {i: 4 if i % 5 == 4 else 3 for i in range(5, 20)}
    ten = {**bare, "num_hidden_layers": 10, "num_kv_shared_layers": 0}
    assert config_from_hf(ten, "t").ffn_sparse_std == ()  # 10 layers: none sparse


def test_defaults_match_transformers_config():
    transformers = pytest.importorskip("transformers")
    hf = transformers.Gemma3nTextConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=35,
                                        num_attention_heads=4, num_key_value_heads=1, head_dim=16, vocab_size=100,
                                        vocab_size_per_layer_input=90, hidden_size_per_layer_input=8)
    c = config_from_hf(hf.to_dict(), "t")
    assert c.layer_types == tuple("sliding" if t == "sliding_attention" else "full" for t in hf.layer_types)
    assert c.ffn_sparse_std == tuple(None if p == 0 else np.float32(1.6448536) for p in hf.activation_sparsity_pattern)
    assert c.kv_shared_layers == hf.num_kv_shared_layers == 15
    modes = hf.kv_sharing_modes
    store = {hf.layer_types[i]: i for i, m in enumerate(modes) if m == "store"}
    assert c.kv_share_sources() == {i: store[hf.layer_types[i]] for i, m in enumerate(modes) if m == "reuse"}


def test_e2b_and_e4b_sharing_maps():
    """E2B: 30 layers, 10 reading: 20-23 and 25-28 read layer 18 (sliding), 24 and 29 layer 19
    (full); E4B: 35 and 15, the same two sources (research note section 2; llama.cpp agrees)."""
    e2b = config_from_hf(gemma3n_config(num_hidden_layers=30, intermediate_size=48, layer_types=None,
                                        activation_sparsity_pattern=None, num_kv_shared_layers=10), "e2b")
    want = {i: 19 if i in (24, 29) else 18 for i in range(20, 30)}
    assert e2b.kv_share_sources() == want
    assert kv_layers(e2b, None) == list(range(20)) + [18, 18, 18, 18, 19, 18, 18, 18, 18, 19]
    e4b = config_from_hf(gemma3n_config(num_hidden_layers=35, intermediate_size=48, layer_types=None,
                                        activation_sparsity_pattern=None, num_kv_shared_layers=15), "e4b")
    assert e4b.kv_share_sources() == {i: 19 if i % 5 == 4 else 18 for i in range(20, 35)}


def test_a_user_kv_share_adds_to_the_models():
    cfg = config_from_hf(gemma3n_config(), "t")  # 4 reads 2, 5 reads 3
    assert kv_layers(cfg, None) == [0, 1, 2, 3, 2, 3]
    assert kv_layers(cfg, {2: 0}) == [0, 1, 0, 2, 0, 2]  # 4 reads 2, which reads 0: both read 0
    with pytest.raises(metalkv.ArgumentError, match=r"\[engine\] kv_share=\{5: 1\}: expected readers outside the "
                                                    r"layers the model shares itself: layers 4\.\.5 already read "
                                                    r"earlier layers' K and V \(layer 5 reads layer 3's\)"):
        kv_layers(cfg, {5: 1})
    plain = config_from_hf(gemma3n_config(num_kv_shared_layers=0), "t")
    assert kv_layers(plain, None) is None and "kv_layer" not in engine_spec(plain, {})


def test_spelling_4x_and_multimodal_nesting():
    old = gemma3n_config(rope_theta=5e5, rope_local_base_freq=2e4, intermediate_size=48)
    del old["rope_parameters"]
    c = config_from_hf(old, "t")
    assert (c.rope_theta, c.rope_local_base_freq, c.ffn_hidden) == (5e5, 2e4, 48)
    nested = {"model_type": "gemma3n", "text_config": gemma3n_config(), "vision_config": {"model_type": "x"},
              "audio_config": {"model_type": "y"}}
    assert config_from_hf(nested, "t") == config_from_hf(gemma3n_config(), "t")


@pytest.mark.parametrize("over, match", [
    (dict(intermediate_size=[48] * 5 + [64]), r"intermediate_size is a per-layer list \[48, 48, 48, 48, 48, 64\] "
                                              r"of 6 sizes; metalkv needs one size for all 6 layers"),
    (dict(layer_types=["sliding_attention"] * 4 + ["full_attention"] * 2),
     r"the last 2 layers \(4\.\.5\) read the K and V of the last earlier layer of their type, but no full layer "
     r"comes before layer 4"),
    (dict(altup_num_inputs=1), r"altup_num_inputs is an int 1; expected an integer in \[2, 64\]"),
    (dict(altup_active_idx=4), r"altup_active_idx is an int 4; expected an integer in \[0, 3\]"),
    (dict(altup_correct_scale=False), r"altup_correct_scale is false"),
    (dict(attention_bias=True), r"attention_bias is true; Gemma 3n is supported without attention biases"),
    (dict(activation_sparsity_pattern=[0.95] * 5), r"activation_sparsity_pattern has 5 values for "
                                                   r"num_hidden_layers=6"),
    (dict(activation_sparsity_pattern=[1.0] + [0.0] * 5), r"activation_sparsity_pattern\[0\] is a float 1\.0; "
                                                          r"expected a target sparsity in \[0, 1\)"),
    (dict(num_kv_shared_layers=6), r"the last 6 layers would read earlier layers' K and V "
                                   r"\(num_kv_shared_layers, GGUF attention.shared_kv_layers\) in a model of 6 layers"),
    (dict(laurel_rank=0), r"laurel_rank is an int 0; expected an integer in \[1, 65536\]"),
])
def test_refusals(over, match):
    with pytest.raises(ModelLoadError, match=match):
        config_from_hf(gemma3n_config(**over), "t")


# -- GGUF ------------------------------------------------------------------------------------

def _md(**keys) -> dict:
    """gemma3n metadata as convert_hf_to_gguf writes it for gemma3n_config()."""
    md = {"general.architecture": "gemma3n", "gemma3n.block_count": 6, "gemma3n.context_length": 512,
          "gemma3n.embedding_length": 32, "gemma3n.feed_forward_length": [48] * 6, "gemma3n.attention.head_count": 4,
          "gemma3n.attention.head_count_kv": 2, "gemma3n.attention.key_length": 16,
          "gemma3n.attention.value_length": 16, "gemma3n.attention.layer_norm_rms_epsilon": 1e-6,
          "gemma3n.rope.freq_base": 1e6, "gemma3n.final_logit_softcapping": 30.0,
          "gemma3n.attention.sliding_window": 8, "gemma3n.altup.active_idx": 0, "gemma3n.altup.num_inputs": 4,
          "gemma3n.embedding_length_per_layer_input": 8, "gemma3n.attention.shared_kv_layers": 2,
          "gemma3n.activation_sparsity_scale": [1.6448536] * 2 + [-math.inf] * 4,
          "gemma3n.attention.sliding_window_pattern": [True, False] * 3, "gemma3n.vocab_size": 64}
    md.update({f"gemma3n.{k}": v for k, v in keys.items()})
    return {k: v for k, v in md.items() if v is not None}


SHAPES = {"per_layer_token_embd.weight": (64, 48), "blk.0.laurel_l.weight": (4, 32)}


def test_gguf_metadata():
    c = config_from_gguf(_md(), set(SHAPES), "g.gguf", SHAPES)
    hf = config_from_hf(gemma3n_config(), "t")
    skip = ("source_arch", "source_format", "rms_eps", "per_layer_vocab", "bos_id", "eos_ids")
    assert {k: getattr(c, k) for k in vars(hf) if k not in skip} == \
        {k: v for k, v in vars(hf).items() if k not in skip}
    assert c.per_layer_vocab == 64  # the converter's table, padded to the vocabulary


def test_gguf_defaults_are_llamacpps():
    """Without the keys llama.cpp hard-codes: every 5th layer full, a sliding base of 1e4, 20
    layers with K and V (so 6 layers share none), transformers' default sparsity (none at 6)."""
    c = config_from_gguf(_md(**{"attention.sliding_window_pattern": None, "attention.shared_kv_layers": None,
                                "activation_sparsity_scale": None}), set(SHAPES), "g.gguf", SHAPES)
    assert c.layer_types == ("sliding",) * 4 + ("full", "sliding") and c.rope_local_base_freq == 1e4
    assert c.kv_shared_layers == 0 and c.ffn_sparse_std == ()
    assert config_from_gguf(_md(block_count=24, **{"feed_forward_length": 48, "attention.sliding_window_pattern": None,
                                                  "attention.shared_kv_layers": None,
                                                  "activation_sparsity_scale": None}),
                            set(SHAPES), "g.gguf", SHAPES).kv_shared_layers == 4


@pytest.mark.parametrize("keys, shapes, match", [
    ({}, {"per_layer_token_embd.weight": (64, 48)}, r"a gemma3n GGUF needs the 2-D tensor blk\.0\.laurel_l\.weight"),
    ({"activation_sparsity_scale": [math.nan] + [-math.inf] * 5}, SHAPES, r"activation_sparsity_scale is a list"),
    ({"activation_sparsity_scale": [1.0] * 5}, SHAPES, r"expected 6 floats, finite or -inf"),
    ({"attention.sliding_window_pattern": [True] * 5}, SHAPES, r"sliding_window_pattern has 5 values for 6 layers"),
    ({"attention.sliding_window": None}, SHAPES, r"GGUF metadata lacks gemma3n\.attention\.sliding_window"),
    ({"feed_forward_length": [48] * 5 + [64]}, SHAPES, r"feed_forward_length is a per-layer list"),
])
def test_gguf_refusals(keys, shapes, match):
    with pytest.raises(ModelLoadError, match=match):
        config_from_gguf(_md(**keys), set(shapes), "g.gguf", shapes)


def test_stacked_projections_unstack_as_views_whatever_the_type():
    """GGUF's altup_proj (N-1, D, D) in q8_0: each projection is its D rows of blocks."""
    import gguf

    cfg = config_from_hf(gemma3n_config(), "t")
    a = np.random.default_rng(0).standard_normal((3, 32, 32)).astype(np.float32)
    q = gguf.quants.quantize(a.reshape(96, 32), gguf.GGMLQuantizationType.Q8_0)
    tensors = {"altup_proj.weight": Tensor("altup_proj.weight", (3, 32, 32), "q8_0", q),
               "altup_unembd_proj.weight": Tensor("altup_unembd_proj.weight", (3, 32, 32), "f32", a)}
    unstack(tensors, cfg, "g.gguf")
    assert sorted(tensors) == [f"{b}.{k}.weight" for b in ("altup_proj", "altup_unembd_proj") for k in range(3)]
    for k in range(3):
        t = tensors[f"altup_proj.{k}.weight"]
        assert t.shape == (32, 32) and np.shares_memory(t.data, q)
        np.testing.assert_array_equal(gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.Q8_0),
                                      gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)[32 * k:32 * (k + 1)])
        np.testing.assert_array_equal(tensors[f"altup_unembd_proj.{k}.weight"].data, a[k])
    with pytest.raises(ModelLoadError, match=r"altup_proj\.weight has shape \(2, 32, 32\), expected \(3, 32, 32\)"):
        unstack({"altup_proj.weight": Tensor("altup_proj.weight", (2, 32, 32), "f32", a[:2])}, cfg, "g.gguf")


# -- safetensors ------------------------------------------------------------------------------

def test_multimodal_checkpoint_tensors(tmp_path):
    """Gemma3nForConditionalGeneration's file: the language model under model.language_model.,
    towers beside it (skipped without a word), k/v weights on the reading layers (dropped)."""
    config = {"model_type": "gemma3n", "text_config": gemma3n_config(), "architectures":
              ["Gemma3nForConditionalGeneration"]}
    (tmp_path / "config.json").write_text(json.dumps(config))
    shapes = gemma3n_hf_shapes(gemma3n_config(), "model.language_model.", reader_kv=True)
    shapes.update({"model.vision_tower.timm_model.blocks.0.0.conv.weight": (8, 8),
                   "model.audio_tower.conformer.0.attention.attn.q_proj.weight": (8, 8),
                   "model.embed_vision.embedding.weight": (4, 32), "model.embed_audio.embedding.weight": (4, 32),
                   "model.embed_vision.hard_embedding_norm.weight": (32,)})
    rng = np.random.default_rng(0)
    arrays = {n: rng.standard_normal(s).astype(np.float32) for n, s in shapes.items()}
    write_safetensors(tmp_path / "model.safetensors", arrays, "BF16")
    m = load_model(tmp_path, progress=False)
    assert {n: t.shape for n, t in m.tensors.items()} == expected_shapes(m.config)
    assert "blk.4.attn_k.weight" not in m.tensors and "blk.3.attn_k.weight" in m.tensors
    p = "model.language_model."
    pairs = {"altup_unembd_proj.2.weight": "altup_unembed_projections.2.weight",
             "blk.5.altup_correct_scale.weight": "layers.5.altup.correct_output_scale",
             "blk.5.altup_router.weight": "layers.5.altup.modality_router.weight",
             "blk.0.proj.weight": "layers.0.per_layer_projection.weight",
             "per_layer_model_proj.weight": "per_layer_model_projection.weight"}
    bf16 = {n: (a.view(np.uint32) >> 16 << 16).view(np.float32) for n, a in arrays.items()}
    for ours, theirs in pairs.items():
        t = m.tensors[ours]
        np.testing.assert_array_equal(np.asarray(t.data, np.float32), bf16[p + theirs], err_msg=ours)
    # the router and coefficients become f32 at load (exactly), the other matrices f16
    assert {m.tensors[f"blk.1.{k}.weight"].dtype for k in ("altup_router", "altup_predict_coef",
                                                           "altup_correct_coef")} == {"f32"}
    assert m.tensors["blk.1.laurel_l.weight"].dtype == "f16"


def test_a_missing_altup_tensor_names_its_hf_name(tmp_path):
    config = gemma3n_config()
    (tmp_path / "config.json").write_text(json.dumps(config))
    shapes = gemma3n_hf_shapes(config)
    del shapes["model.altup_projections.1.weight"]
    write_safetensors(tmp_path / "model.safetensors", {n: np.zeros(s, np.float32) for n, s in shapes.items()}, "F32")
    with pytest.raises(ModelLoadError, match=r"missing tensor\(s\) altup_proj\.1\.weight "
                                             r"\(model\.altup_projections\.1\.weight\) for a gemma3n model"):
        load_model(tmp_path, progress=False)
