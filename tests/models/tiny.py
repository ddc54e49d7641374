"""Tiny random models written with the reference libraries (gguf's GGUFWriter,
safetensors' serializer), so the loaders are tested against files they did not
write themselves."""
from __future__ import annotations

import json
import pathlib

import numpy as np

# A small llama: 2 layers, 4 heads of 8, 2 kv heads.
LLAMA = dict(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn=48, vocab=64)


def hf_names(arch: str, n_layers: int, tied: bool, bias: bool = False) -> list[str]:
    per = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
           "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
           "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    if bias:
        per += ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]
    if arch == "gemma3":
        per += ["self_attn.q_norm.weight", "self_attn.k_norm.weight",
                "pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"]
    names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if tied else ["lm_head.weight"])
    return names + [f"model.layers.{i}.{p}" for i in range(n_layers) for p in per]


def hf_shape(name: str, c: dict) -> tuple[int, ...]:
    h, hd = c["hidden_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    q, kv, ffn, vocab = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, \
        c["intermediate_size"], c["vocab_size"]
    table = {"embed_tokens.weight": (vocab, h), "lm_head.weight": (vocab, h),
             "q_proj.weight": (q, h), "k_proj.weight": (kv, h), "v_proj.weight": (kv, h),
             "q_proj.bias": (q,), "k_proj.bias": (kv,), "v_proj.bias": (kv,),
             "o_proj.weight": (h, q), "gate_proj.weight": (ffn, h), "up_proj.weight": (ffn, h),
             "down_proj.weight": (h, ffn), "q_norm.weight": (hd,), "k_norm.weight": (hd,)}
    key = ".".join(name.split(".")[-2:])
    return table.get(key, (h,))  # every other tensor is a hidden-sized norm


def llama_config(**over) -> dict:
    c = {"model_type": "llama", "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 64, "rms_norm_eps": 1e-5,
         "rope_theta": 50000.0, "max_position_embeddings": 256, "tie_word_embeddings": False,
         "bos_token_id": 1, "eos_token_id": 2, "hidden_act": "silu"}
    c.update(over)
    return c


def gemma3_config(**over) -> dict:
    c = {"model_type": "gemma3_text", "hidden_size": 32, "intermediate_size": 48,
         "num_hidden_layers": 7, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": 64, "rms_norm_eps": 1e-6, "rope_theta": 1e6, "rope_local_base_freq": 1e4,
         "sliding_window": 8, "sliding_window_pattern": 6, "query_pre_attn_scalar": 16,
         "max_position_embeddings": 512, "bos_token_id": 2, "eos_token_id": [1, 106],
         "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None}
    c.update(over)
    return c


def write_safetensors(path: pathlib.Path, arrays: dict[str, np.ndarray], dtype: str) -> None:
    """dtype "F32" | "F16" | "BF16"; BF16 from float32 by truncation of the low bits."""
    import safetensors

    keep, specs = [], {}
    for name, a in arrays.items():
        if dtype == "BF16":
            a = np.ascontiguousarray((a.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16))
            st_dtype = "bfloat16"
        else:
            a = np.ascontiguousarray(a.astype(np.float16 if dtype == "F16" else np.float32))
            st_dtype = a.dtype.name
        keep.append(a)
        specs[name] = safetensors.TensorSpec(dtype=st_dtype, shape=a.shape, data_ptr=a.ctypes.data,
                                             data_len=a.nbytes)
    safetensors.serialize_file(specs, str(path))


def write_hf_dir(d: pathlib.Path, config: dict, *, dtype: str = "F16", omit: tuple = (),
                 reshape: dict | None = None, seed: int = 0, shards: int = 1) -> dict[str, np.ndarray]:
    """An HF model directory of random weights; returns the float32 arrays written."""
    d.mkdir(parents=True, exist_ok=True)
    (d / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(seed)
    tied = config.get("tie_word_embeddings", config["model_type"].startswith("gemma"))
    bias = config["model_type"] == "qwen2" or config.get("attention_bias", False)
    arrays = {}
    for name in hf_names("gemma3" if "gemma" in config["model_type"] else "llama",
                         config["num_hidden_layers"], tied, bias):
        if name in omit:
            continue
        shape = (reshape or {}).get(name, hf_shape(name, config))
        arrays[name] = rng.standard_normal(shape).astype(np.float32)
    names = list(arrays)
    for s in range(shards):
        part = {n: arrays[n] for n in names[s::shards]}
        write_safetensors(d / f"model-{s + 1:05d}-of-{shards:05d}.safetensors", part, dtype)
    return arrays


def write_gguf(path: pathlib.Path, *, arch: str = "llama", omit: tuple = (), reshape: dict | None = None,
               quantize: dict | None = None, tokens: list[str] | None = None, seed: int = 0,
               **meta) -> dict[str, np.ndarray]:
    """A tiny llama GGUF (LLAMA sizes). quantize: {name: GGMLQuantizationType}.
    Returns the float32 arrays (before quantization)."""
    import gguf

    c = {**LLAMA, **meta}
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(c["n_layers"])
    w.add_context_length(256)
    w.add_embedding_length(c["hidden"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(c["n_kv_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(c["vocab"])
    if tokens is not None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
    rng = np.random.default_rng(seed)
    h, q, kv, f = c["hidden"], c["n_heads"] * c["head_dim"], c["n_kv_heads"] * c["head_dim"], c["ffn"]
    shapes = {"token_embd.weight": (c["vocab"], h), "output_norm.weight": (h,)}
    for i in range(c["n_layers"]):
        p = f"blk.{i}."
        shapes.update({p + "attn_norm.weight": (h,), p + "attn_q.weight": (q, h),
                       p + "attn_k.weight": (kv, h), p + "attn_v.weight": (kv, h),
                       p + "attn_output.weight": (h, q), p + "ffn_norm.weight": (h,),
                       p + "ffn_gate.weight": (f, h), p + "ffn_up.weight": (f, h),
                       p + "ffn_down.weight": (h, f)})
    arrays = {}
    for name, shape in shapes.items():
        if name in omit:
            continue
        a = rng.standard_normal((reshape or {}).get(name, shape)).astype(np.float32)
        arrays[name] = a
        qt = (quantize or {}).get(name)
        if qt is None:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays
