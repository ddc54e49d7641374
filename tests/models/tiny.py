"""Tiny random models written with the reference libraries (gguf's GGUFWriter,
safetensors' serializer), so the loaders are tested against files they did not
write themselves."""
from __future__ import annotations

import json
import pathlib
from dataclasses import dataclass

import numpy as np

# A small llama: 2 layers, 4 heads of 8, 2 kv heads.
LLAMA = dict(n_layers=2, hidden=32, n_heads=4, n_kv_heads=2, head_dim=8, ffn=48, vocab=64)


def hf_names(arch: str, n_layers: int, tied: bool, bias: bool = False) -> list[str]:
    """arch: "llama" (also qwen2, mistral), "qwen3", "phi3", "gemma2" or "gemma3"."""
    per = ["input_layernorm.weight", "self_attn.q_proj.weight", "self_attn.k_proj.weight",
           "self_attn.v_proj.weight", "self_attn.o_proj.weight", "post_attention_layernorm.weight",
           "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight"]
    if arch == "phi3":  # fused projections
        per = [n for n in per if n.split(".")[1] not in ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")]
        per += ["self_attn.qkv_proj.weight", "mlp.gate_up_proj.weight"]
    if bias:
        per += ["self_attn.q_proj.bias", "self_attn.k_proj.bias", "self_attn.v_proj.bias"]
    if arch in ("gemma3", "qwen3"):
        per += ["self_attn.q_norm.weight", "self_attn.k_norm.weight"]
    if arch in ("gemma2", "gemma3"):
        per += ["pre_feedforward_layernorm.weight", "post_feedforward_layernorm.weight"]
    names = ["model.embed_tokens.weight", "model.norm.weight"] + ([] if tied else ["lm_head.weight"])
    return names + [f"model.layers.{i}.{p}" for i in range(n_layers) for p in per]


def hf_shape(name: str, c: dict) -> tuple[int, ...]:
    h, hd = c["hidden_size"], c.get("head_dim", c["hidden_size"] // c["num_attention_heads"])
    q, kv, ffn, vocab = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd, \
        c["intermediate_size"], c["vocab_size"]
    table = {"embed_tokens.weight": (vocab, h), "lm_head.weight": (vocab, h),
             "q_proj.weight": (q, h), "k_proj.weight": (kv, h), "v_proj.weight": (kv, h),
             "q_proj.bias": (q,), "k_proj.bias": (kv,), "v_proj.bias": (kv,),
             "qkv_proj.weight": (q + 2 * kv, h), "gate_up_proj.weight": (2 * ffn, h),
             "o_proj.weight": (h, q), "gate_proj.weight": (ffn, h), "up_proj.weight": (ffn, h),
             "down_proj.weight": (h, ffn), "q_norm.weight": (hd,), "k_norm.weight": (hd,)}
    key = ".".join(name.split(".")[-2:])
    return table.get(key, (h,))  # every other tensor is a hidden-sized norm


def hf_arch(model_type: str) -> str:
    """The hf_names family of a config.json model_type."""
    return {"gemma3_text": "gemma3", "qwen2": "llama", "mistral": "llama"}.get(model_type, model_type)


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
         "max_position_embeddings": 512, "bos_token_id": 2, "eos_token_id": [1, 60],
         "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None}
    c.update(over)
    return c


def gemma3n_config(**over) -> dict:
    """A Gemma3nTextConfig as transformers 5 writes it: 6 layers (sliding, full, ...), the last
    2 reading layers 2 and 3's K and V, sparse gates on the first two."""
    c = {"model_type": "gemma3n_text", "hidden_size": 32, "intermediate_size": [48] * 6,
         "num_hidden_layers": 6, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
         "vocab_size": 64, "vocab_size_per_layer_input": 48, "hidden_size_per_layer_input": 8,
         "rms_norm_eps": 1e-6, "sliding_window": 8, "layer_types": ["sliding_attention", "full_attention"] * 3,
         "rope_parameters": {"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
         "altup_num_inputs": 4, "altup_active_idx": 0, "altup_coef_clip": 120.0, "altup_correct_scale": True,
         "laurel_rank": 4, "num_kv_shared_layers": 2, "activation_sparsity_pattern": [0.95, 0.95] + [0.0] * 4,
         "final_logit_softcapping": 30.0, "query_pre_attn_scalar": 256, "max_position_embeddings": 512,
         "hidden_activation": "gelu_pytorch_tanh", "tie_word_embeddings": True, "bos_token_id": 2,
         "eos_token_id": 1}
    c.update(over)
    return c


def gemma3n_hf_shapes(c: dict, prefix: str = "model.", reader_kv: bool = False) -> dict[str, tuple[int, ...]]:
    """HF tensor names and shapes of a Gemma 3n text model (names as transformers saves them;
    reader_kv: k/v weights on the reading layers too, as Google's checkpoints have them)."""
    d, n, p, r, L = (c["hidden_size"], c["altup_num_inputs"], c["hidden_size_per_layer_input"], c["laurel_rank"],
                     c["num_hidden_layers"])
    hd, ffn = c["head_dim"], c["intermediate_size"][0]
    q, kv = c["num_attention_heads"] * hd, c["num_key_value_heads"] * hd
    out = {"embed_tokens.weight": (c["vocab_size"], d), "norm.weight": (d,),
           "embed_tokens_per_layer.weight": (c["vocab_size_per_layer_input"], L * p),
           "per_layer_model_projection.weight": (L * p, d), "per_layer_projection_norm.weight": (p,)}
    for k in range(n - 1):
        out[f"altup_projections.{k}.weight"] = out[f"altup_unembed_projections.{k}.weight"] = (d, d)
    first_reader = L - c["num_kv_shared_layers"]
    for i in range(L):
        layer = {"input_layernorm.weight": (d,), "post_attention_layernorm.weight": (d,),
                 "pre_feedforward_layernorm.weight": (d,), "post_feedforward_layernorm.weight": (d,),
                 "self_attn.q_proj.weight": (q, d), "self_attn.o_proj.weight": (d, q), "self_attn.q_norm.weight": (hd,),
                 "mlp.gate_proj.weight": (ffn, d), "mlp.up_proj.weight": (ffn, d), "mlp.down_proj.weight": (d, ffn),
                 "altup.correct_output_scale": (d,), "altup.correction_coefs.weight": (n, n),
                 "altup.prediction_coefs.weight": (n * n, n), "altup.modality_router.weight": (n, d),
                 "altup.router_norm.weight": (d,), "laurel.linear_left.weight": (r, d),
                 "laurel.linear_right.weight": (d, r), "laurel.post_laurel_norm.weight": (d,),
                 "per_layer_input_gate.weight": (p, d), "per_layer_projection.weight": (d, p),
                 "post_per_layer_input_norm.weight": (d,)}
        if i < first_reader or reader_kv:
            layer.update({"self_attn.k_proj.weight": (kv, d), "self_attn.v_proj.weight": (kv, d),
                          "self_attn.k_norm.weight": (hd,)})
        out.update({f"layers.{i}.{k}": v for k, v in layer.items()})
    return {prefix + k: v for k, v in out.items()}


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
    for name in hf_names(hf_arch(config["model_type"]), config["num_hidden_layers"], tied, bias):
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
               tokenizer: "TinyVocab | None" = None, alignment: int | None = None,
               set_kv: dict | None = None, raw_arrays: dict | None = None,
               extra_shapes: dict | None = None, gains: dict | None = None, **meta) -> dict[str, np.ndarray]:
    """A tiny llama GGUF (LLAMA sizes). quantize: {name: GGMLQuantizationType};
    tokenizer: a whole gpt2 vocabulary (tokens, types, merges, special ids), see TINY_VOCAB;
    alignment: write general.alignment; set_kv: {key: (value, GGUFValueType[, element
    type])} replaces or adds metadata, {key: None} drops it; raw_arrays: {name: array}
    written as they are (any dtype gguf-py takes); extra_shapes: more tensors
    {name: shape} (rope_freqs.weight, ...); gains: {name suffix: factor} scales
    the standard normal draws of the tensors whose names end so ({"attn_q.weight":
    0.125, "attn_k.weight": 0.125} gives scores of about unit size instead of a
    hundred, a softmax that spreads). Returns the float32 arrays (before
    quantization)."""
    import gguf

    c = {**LLAMA, **meta}
    w = gguf.GGUFWriter(str(path), arch)
    if alignment is not None:
        w.add_custom_alignment(alignment)
    w.add_block_count(c["n_layers"])
    w.add_context_length(256)
    w.add_embedding_length(c["hidden"])
    w.add_feed_forward_length(c["ffn"])
    w.add_head_count(c["n_heads"])
    w.add_head_count_kv(c["n_kv_heads"])
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(c["vocab"])
    if tokenizer is not None:
        tokens = tokenizer.tokens
    if tokens is not None:
        w.add_tokenizer_model("gpt2")
        w.add_tokenizer_pre("smollm")
        w.add_token_list(tokens)
    if tokenizer is not None:
        w.add_token_types(tokenizer.types)
        w.add_token_merges(tokenizer.merges)
        w.add_bos_token_id(tokenizer.bos)
        w.add_eos_token_id(tokenizer.eos)
        w.add_pad_token_id(tokenizer.pad)
        w.add_add_bos_token(False)
    for key, v in (set_kv or {}).items():
        if v is None:
            del w.kv_data[0][key]
        else:
            w.add_key_value(key, *v)
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
    shapes.update(extra_shapes or {})
    arrays = {}
    for name, shape in shapes.items():
        if name in omit:
            continue
        a = rng.standard_normal((reshape or {}).get(name, shape)).astype(np.float32)
        for suffix, factor in (gains or {}).items():
            if name.endswith(suffix):
                a *= np.float32(factor)
        arrays[name] = a
        qt = (quantize or {}).get(name)
        if name in (raw_arrays or {}):
            w.add_tensor(name, raw_arrays[name])
        elif qt is None:
            w.add_tensor(name, a)
        else:
            w.add_tensor(name, gguf.quants.quantize(a, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return arrays


@dataclass(frozen=True)
class TinyVocab:
    tokens: list[str]
    types: list[int]     # gguf.TokenType values
    merges: list[str]    # "left right", both and their join in tokens
    bos: int
    eos: int
    pad: int


def _tiny_vocab() -> TinyVocab:
    """64 byte-level BPE tokens: 3 control tokens, a..z, Ġ, Ġa..Ġz and 8 letter pairs."""
    letters = [chr(ord("a") + i) for i in range(26)]
    pairs = [letters[i] + letters[i + 1] for i in range(8)]
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + letters + ["Ġ"] + \
        ["Ġ" + x for x in letters] + pairs
    merges = [f"Ġ {x}" for x in letters] + [f"{p[0]} {p[1]}" for p in pairs]
    return TinyVocab(tokens, [3, 3, 3] + [1] * (len(tokens) - 3), merges, bos=1, eos=2, pad=0)


TINY_VOCAB = _tiny_vocab()
assert len(TINY_VOCAB.tokens) == 64

# llama config.json whose optional keys hold transformers' defaults, so a fuzzed
# null means the same model; head_dim 64 (128 / 2 heads) is a size the kernels take.
TINY_HF = dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64,
               vocab_size=64, rope_theta=10000.0, rms_norm_eps=1e-6, max_position_embeddings=2048)


# -- where each field of a GGUF file lies, for tests that edit bytes ------------------
# Written apart from metalkv's reader on purpose (and only for well-formed files).

GGUF_SCALAR_SIZES = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


@dataclass
class KVField:
    key: str
    start: int       # the key's length field
    type_at: int     # the u32 value type
    value_at: int    # the value (string: its u64 length; array: its u32 element type)
    end: int
    vtype: int
    sub: int | None = None  # arrays: element type; the u64 length is at value_at + 4
    items: list[int] | None = None  # arrays of strings: where each element (its u64 length) starts


@dataclass
class TensorField:
    name: str
    start: int
    ndims_at: int
    dims_at: int     # ne[0], ne[1], ... u64 each
    type_at: int
    offset_at: int
    end: int
    ne: tuple[int, ...]
    ggml_type: int
    offset: int      # relative to the data section
    nbytes: int


@dataclass
class GGUFLayout:
    kv: dict[str, KVField]
    tensors: dict[str, TensorField]
    kv_end: int
    infos_end: int
    data_start: int
    size: int


def gguf_layout(data: bytes) -> GGUFLayout:
    """Byte positions of every header field of a well-formed little-endian GGUF v3."""
    import struct

    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    n_tensors, n_kv = struct.unpack_from("<QQ", data, 8)
    pos = 24

    def skip_value(at: int, vtype: int) -> int:
        if vtype == 8:
            return at + 8 + struct.unpack_from("<Q", data, at)[0]
        if vtype == 9:
            sub, n = struct.unpack_from("<IQ", data, at)
            at += 12
            for _ in range(n):
                at = skip_value(at, sub)
            return at
        return at + GGUF_SCALAR_SIZES[vtype]

    kv: dict[str, KVField] = {}
    alignment = 32
    for _ in range(n_kv):
        start = pos
        klen = struct.unpack_from("<Q", data, pos)[0]
        key = data[pos + 8:pos + 8 + klen].decode()
        type_at = pos + 8 + klen
        vtype = struct.unpack_from("<I", data, type_at)[0]
        end = skip_value(type_at + 4, vtype)
        sub = struct.unpack_from("<I", data, type_at + 4)[0] if vtype == 9 else None
        items = None
        if sub == 8:
            items, at = [], type_at + 16
            for _ in range(struct.unpack_from("<Q", data, type_at + 8)[0]):
                items.append(at)
                at = skip_value(at, 8)
        kv[key] = KVField(key, start, type_at, type_at + 4, end, vtype, sub, items)
        if key == "general.alignment":
            alignment = struct.unpack_from("<I", data, type_at + 4)[0]
        pos = end
    kv_end = pos
    tensors: dict[str, TensorField] = {}
    for _ in range(n_tensors):
        start = pos
        nlen = struct.unpack_from("<Q", data, pos)[0]
        name = data[pos + 8:pos + 8 + nlen].decode()
        ndims_at = pos + 8 + nlen
        nd = struct.unpack_from("<I", data, ndims_at)[0]
        ne = struct.unpack_from(f"<{nd}Q", data, ndims_at + 4)
        type_at = ndims_at + 4 + 8 * nd
        gtype, offset = struct.unpack_from("<IQ", data, type_at)
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(gtype)]
        nbytes = int(np.prod(ne)) // block * block_bytes
        tensors[name] = TensorField(name, start, ndims_at, ndims_at + 4, type_at, type_at + 4,
                                    type_at + 12, tuple(ne), gtype, offset, nbytes)
        pos = type_at + 12
    data_start = -(-pos // alignment) * alignment
    return GGUFLayout(kv, tensors, kv_end, pos, data_start, len(data))


# -- safetensors files, edited ------------------------------------------------------

def safetensors_parts(f: pathlib.Path) -> tuple[dict, bytes]:
    """(header, data section) of a safetensors file."""
    data = f.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return json.loads(data[8:8 + n]), data[8 + n:]


def write_safetensors_parts(f: pathlib.Path, header: dict | str | bytes, body: bytes) -> None:
    """A safetensors file from a header (a dict, or its text as it should be) and data."""
    text = header if isinstance(header, bytes) else \
        (header if isinstance(header, str) else json.dumps(header)).encode()
    f.write_bytes(len(text).to_bytes(8, "little") + text + body)
