"""The same weights as a Hugging Face directory and as a GGUF file give the same
logits. The GGUF is written the way llama.cpp's convert_hf_to_gguf.py lays
models out: Llama's (and Mistral's) q/k rows permuted so that llama.cpp's
interleaved ("normal") rope applies, no permutation for the NEOX-rope archs
(qwen2, qwen3, phi3, gemma2, gemma3), Gemma's norms stored as 1 + w, Phi-3's
qkv kept fused as attn_qkv and its gate_up as ffn_up (2 ffn rows, gate first),
Llama 3's rope scaling as rope_freqs.weight and LongRoPE's factors as
rope_factors_{long,short}.weight, YaRN as rope.scaling.* keys, rope.dimension_count the
rotated dims, names and metadata in GGUF form. This ties together the two
loaders, the two rope styles, the norm offset and the fused tensors through the
whole engine (the default model covers GGUF Llama against llama.cpp; the
transformers tests cover the HF side).

One departure, on purpose: convert_hf_to_gguf drops Mistral's sliding window
(its llama arch has none, so llama.cpp runs Mistral with full attention); the
Mistral file here carries `llama.attention.sliding_window`, which metalkv reads,
so that the window is compared too."""
from __future__ import annotations

import gguf
import numpy as np
import pytest

import metalkv
from metalkv.models import rope_freq_factors
from metalkv.models.hf_config import config_from_hf
from metalkv.models.safetensors_loader import canonical_name
from models.tiny import gemma3_config, llama_config, write_hf_dir, write_safetensors  # tests/ on sys.path
from devices import TEST_DEVICE  # tests/ is on sys.path

SIZES = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64, vocab_size=64)
N_IDS = 24  # > 2 sliding windows of 8


def interleave_rows(w: np.ndarray, n_heads: int) -> np.ndarray:
    """Per head, rows (0..d/2-1 | d/2..d-1) -> pairs (0, d/2), (1, d/2+1), ...:
    the NEOX pairing becomes the interleaved one."""
    d = w.shape[0] // n_heads
    return w.reshape(n_heads, 2, d // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


# config.json model_type -> the architecture convert_hf_to_gguf writes
GGUF_ARCH = {"llama": "llama", "mistral": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "phi3": "phi3",
             "gemma2": "gemma2", "gemma3_text": "gemma3", "gemma3n_text": "gemma3n"}


def gemma3n_keys(w: gguf.GGUFWriter, config: dict, cfg) -> None:
    """What llama.cpp's Gemma3NModel converter writes beside the common keys (no
    rope.freq_base_swa: llama.cpp's default 10000 stands for the sliding layers' base)."""
    from statistics import NormalDist

    w.add_sliding_window(config["sliding_window"])
    w.add_final_logit_softcapping(config["final_logit_softcapping"] or 0.0)
    w.add_altup_active_idx(config["altup_active_idx"])
    w.add_altup_num_inputs(config["altup_num_inputs"])
    w.add_embedding_length_per_layer_input(config["hidden_size_per_layer_input"])
    w.add_shared_kv_layers(config["num_kv_shared_layers"])
    # Normal(0, 1).icdf(p) per layer, -inf for a dense one
    w.add_activation_sparsity_scale([float(np.float32(NormalDist().inv_cdf(p))) if p else -np.inf
                                     for p in config["activation_sparsity_pattern"]])
    w.add_sliding_window_pattern([t == "sliding_attention" for t in config["layer_types"]])


def gemma3n_tensors(arrays: dict[str, np.ndarray], cfg) -> dict[str, np.ndarray]:
    """Canonical arrays in llama.cpp's gemma3n layout: the AltUp stream projections stacked
    into (N-1, D, D), the per-layer table padded with zero rows to the vocabulary, and k/v
    weights (zeros) on the layers that read others' K and V, which llama.cpp requires."""
    out = dict(arrays)
    for base in ("altup_proj", "altup_unembd_proj"):
        parts = [out.pop(f"{base}.{k}.weight") for k in range(cfg.altup_inputs - 1)]
        out[f"{base}.weight"] = np.stack(parts)
    table = out["per_layer_token_embd.weight"]
    pad = np.zeros((cfg.vocab - table.shape[0], table.shape[1]), np.float32)
    out["per_layer_token_embd.weight"] = np.concatenate([table, pad])
    kv = cfg.n_kv_heads * cfg.head_dim
    for layer in cfg.kv_share_sources():
        for kind, shape in (("attn_k", (kv, cfg.hidden)), ("attn_v", (kv, cfg.hidden)),
                            ("attn_k_norm", (cfg.head_dim,))):
            out[f"blk.{layer}.{kind}.weight"] = np.zeros(shape, np.float32)
    return out


def write_gguf_from_hf(path, config: dict, arrays: dict[str, np.ndarray], vocab: dict | None = None) -> None:
    """vocab: a GGUF vocabulary's metadata ({key: value}, as llamacpp_vocabs.json holds them) to
    write beside the model (none: a file of ids alone)."""
    arch = GGUF_ARCH[config["model_type"]]
    cfg = config_from_hf(config, "hf")  # the sizes transformers derives (head_dim, rotary dims)
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(config["num_hidden_layers"])
    w.add_context_length(config["max_position_embeddings"])
    w.add_embedding_length(config["hidden_size"])
    w.add_feed_forward_length(config["intermediate_size"])  # gemma3n: one per layer, a u32 array
    w.add_head_count(config["num_attention_heads"])
    w.add_head_count_kv(config["num_key_value_heads"])
    w.add_rope_freq_base(cfg.rope_theta)  # config.json's rope_theta, or rope_parameters' full-layer theta
    w.add_layer_norm_rms_eps(config["rms_norm_eps"])
    w.add_vocab_size(config["vocab_size"])
    if "head_dim" in config:  # TextModel writes it when config.json has it (phi3 never does)
        w.add_key_length(config["head_dim"])
        w.add_value_length(config["head_dim"])
    w.add_rope_dimension_count(cfg.rope_dim)
    if arch == "phi3":  # always written; 0 = no window (Phi-4)
        w.add_sliding_window(config.get("sliding_window") or 0)
        w.add_rope_scaling_orig_ctx_len(config.get("original_max_position_embeddings",
                                                   config["max_position_embeddings"]))
    if cfg.rope_scaling and cfg.rope_scaling["type"] == "llama3":  # LlamaModel's generate_extra_tensors
        w.add_tensor("rope_freqs.weight", rope_freq_factors(cfg))
    if cfg.rope_scaling and cfg.rope_scaling["type"] == "longrope":  # Phi-3's generate_extra_tensors
        w.add_rope_scaling_attn_factors(cfg.rope_scaling["attention_factor"])
        for kind in ("long", "short"):
            w.add_tensor(f"rope_factors_{kind}.weight", np.asarray(cfg.rope_scaling[f"{kind}_factor"], np.float32))
    if cfg.rope_scaling and cfg.rope_scaling["type"] == "yarn":  # TextModel.set_gguf_parameters' yarn branch
        rp = config["rope_scaling"]
        w.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        w.add_rope_scaling_factor(rp["factor"])
        w.add_rope_scaling_orig_ctx_len(rp["original_max_position_embeddings"])
        # written when config.json has them; llama.cpp's loader (and so metalkv's) ignores them
        for hf_key, add in (("extrapolation_factor", w.add_rope_scaling_yarn_ext_factor),
                            ("attention_factor", w.add_rope_scaling_yarn_attn_factor),
                            ("beta_fast", w.add_rope_scaling_yarn_beta_fast),
                            ("beta_slow", w.add_rope_scaling_yarn_beta_slow)):
            if rp.get(hf_key) is not None:
                add(rp[hf_key])
    if config["model_type"] == "mistral":  # see the module docstring
        w.add_sliding_window(config["sliding_window"])
    if arch in ("gemma2", "gemma3"):
        w.add_sliding_window(config["sliding_window"])
    if arch == "gemma2":
        w.add_attn_logit_softcapping(config["attn_logit_softcapping"])
        w.add_final_logit_softcapping(config["final_logit_softcapping"])
    if arch == "gemma3":
        w.add_float32(f"{arch}.rope.freq_base_swa", config["rope_local_base_freq"])
    if arch == "gemma3n":
        gemma3n_keys(w, config, cfg)
    for key, value in (vocab or {}).items():
        add_vocab_key(w, key, value)
    canonical = {canonical_name(hf_name, cfg.arch): a for hf_name, a in arrays.items()}
    canonical.pop(None, None)  # towers and other tensors metalkv does not read
    if cfg.tie_embeddings:
        canonical.pop("output.weight", None)  # a state_dict's tied copy
    if arch == "gemma3n":
        canonical = gemma3n_tensors(canonical, cfg)
    for name, a in canonical.items():
        if arch == "llama" and name.endswith(("attn_q.weight", "attn_k.weight")):
            heads = config["num_attention_heads" if "attn_q" in name else "num_key_value_heads"]
            a = interleave_rows(a, heads)
        if arch in ("gemma2", "gemma3") and name.endswith("norm.weight"):
            a = a + 1.0  # Gemma computes x * (1 + w); llama.cpp's GGUF stores 1 + w (Gemma 3n: w itself)
        name = name.replace("ffn_gate_up", "ffn_up")  # llama.cpp's phi3: ffn_up holds gate and up
        w.add_tensor(name, a.astype(np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def gemma2_config(**over) -> dict:
    c = {"model_type": "gemma2", "num_hidden_layers": 4, "head_dim": 64, "rms_norm_eps": 1e-6,
         "rope_theta": 1e4, "sliding_window": 8, "query_pre_attn_scalar": 64,
         "attn_logit_softcapping": 4.0, "final_logit_softcapping": 6.0, "max_position_embeddings": 512,
         "hidden_activation": "gelu_pytorch_tanh"}
    return {**c, **over}


CASES = {
    "llama": llama_config(**SIZES),
    # Llama 3 rope scaling: rope_freqs.weight in the GGUF; original context 16 puts all three
    # frequency bands at head_dim 64
    "llama3": llama_config(**SIZES, rope_scaling={"rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0,
                                                  "high_freq_factor": 4.0, "original_max_position_embeddings": 16}),
    "qwen2": llama_config(**SIZES, model_type="qwen2"),  # q/k/v biases, NEOX rope
    "qwen3": llama_config(**SIZES, model_type="qwen3", head_dim=64, num_hidden_layers=3),
    "mistral": llama_config(**SIZES, model_type="mistral", sliding_window=8, num_hidden_layers=3),
    # partial rotary (64 of head_dim 128), a window on every layer, fused tensors
    "phi3": llama_config(**{**SIZES, "hidden_size": 256}, model_type="phi3", partial_rotary_factor=0.5,
                         sliding_window=8, num_hidden_layers=3),
    # LongRoPE: 24 ids > original 16, so the long factors; the default attention factor
    "phi3_longrope": llama_config(**SIZES, model_type="phi3", max_position_embeddings=256,
                                  original_max_position_embeddings=16, rope_scaling={
                                      "type": "longrope", "short_factor": [1.0 + 0.1 * i for i in range(32)],
                                      "long_factor": [1.0 + 0.7 * i for i in range(32)]}),
    # YaRN (Qwen2.5-long-context-like): original 512 at base 5e4 and head_dim 64 puts the ramp on
    # pairs 2..14 of 32; no attention_factor, so transformers' and llama.cpp's default
    # 1 + 0.1 ln 4 agree (an HF attention_factor goes to yarn_attn_factor, which llama.cpp ignores)
    "qwen2_yarn": llama_config(**SIZES, model_type="qwen2", max_position_embeddings=2048, rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512}),
    # query scale 1/sqrt(head_dim) as llama.cpp assumes below 27B; even layers sliding
    "gemma2": gemma2_config(**SIZES),
    # head_dim 64, query scale 1/sqrt(head_dim) as llama.cpp assumes for gemma3 below 27B;
    # 7 layers, pattern 6: five sliding, one full, one sliding
    "gemma3": gemma3_config(**SIZES, head_dim=64, query_pre_attn_scalar=64, num_hidden_layers=7),
}


def add_vocab_key(w: gguf.GGUFWriter, key: str, value) -> None:
    """One tokenizer.* or general.* key in the type llama.cpp's converter writes it."""
    T = gguf.GGUFValueType
    if isinstance(value, list):
        kind = {"tokenizer.ggml.scores": T.FLOAT32, "tokenizer.ggml.token_type": T.INT32}.get(key, T.STRING)
        w.add_key_value(key, value, T.ARRAY, kind)
    elif isinstance(value, bool):
        w.add_bool(key, value)
    elif isinstance(value, int):
        w.add_uint32(key, value)
    else:
        w.add_string(key, value)


def as_gguf_says(d: dict) -> dict:
    """A config's fields as a GGUF can state them: floats in float32, Llama 3's scaling
    as its per-frequency divisors (rope_freqs.weight), LongRoPE's factors as tensors."""
    def one(v):
        if isinstance(v, dict) and v.get("type") == "llama3":
            return {"type": "freq_factors"}
        if isinstance(v, dict):
            return as_gguf_says({k: x for k, x in v.items() if k not in ("short_factor", "long_factor")})
        return np.float32(v) if isinstance(v, float) else v
    return {k: one(v) for k, v in d.items()}


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_and_hf_give_the_same_logits(tmp_path, name):
    config = CASES[name]
    # random std-1 weights, scaled down so that softmax stays far from one-hot
    arrays = {k: v * 0.3 for k, v in write_hf_dir(tmp_path / "hf", config, dtype="F32").items()}
    for f in (tmp_path / "hf").glob("*.safetensors"):
        f.unlink()
    write_safetensors(tmp_path / "hf" / "model.safetensors", arrays, "F32")
    write_gguf_from_hf(tmp_path / "m.gguf", config, arrays)

    ids = np.random.default_rng(1).integers(0, config["vocab_size"], N_IDS).tolist()
    hf_engine = metalkv.Engine.load(tmp_path / "hf", device=TEST_DEVICE, context=32)
    gg_engine = metalkv.Engine.load(tmp_path / "m.gguf", device=TEST_DEVICE, context=32)
    want = {k: v for k, v in vars(hf_engine.config).items() if k not in ("rope_style", "source_arch",
                                                                         "source_format", "norm_weight_offset",
                                                                         "bos_id", "eos_ids")}
    got = {k: getattr(gg_engine.config, k) for k in want}
    assert as_gguf_says(got) == as_gguf_says(want), "the two forms describe different models"
    hf, gg = hf_engine.logits(ids), gg_engine.logits(ids)
    # same math, different summation order in rope'd dot products and K/V f16 rounding flips
    np.testing.assert_allclose(gg, hf, rtol=0, atol=1e-3 * np.abs(hf).max())
    assert (gg.argmax(1) == hf.argmax(1)).mean() > 0.9
