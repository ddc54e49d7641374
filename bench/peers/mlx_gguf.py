"""MLX (CPU build on Linux) running mlx-lm's llama model on the same GGUF file.

mx.load reads the GGUF: Q4_0/Q4_1/Q8_0 tensors come back already in MLX's affine
quantized form (`name.weight` uint32 packed, `name.scales`, `name.biases`), which for
Q4_1 is exact (Q4_1 is d*q + m per block of 32, MLX's affine is scale*q + bias per group);
other GGUF types come back dequantized. We build mlx-lm's llama `Model` from the GGUF
metadata, turn the layers whose weights are quantized into QuantizedLinear /
QuantizedEmbedding with the group size and bits read off the tensor shapes, and load.

RoPE: llama.cpp's converter permutes the Q/K rows of llama checkpoints so that rope
rotates adjacent pairs (x[2i], x[2i+1]); HF checkpoints and mlx-lm's default rotate
halves (x[i], x[i+d/2]). Rather than un-permuting the rows, we ask mlx-lm for the
adjacent-pair ("traditional") rope, which matches the GGUF weights as stored.
mlx-lm reads rope_theta from the top level of its config, so it is set there.
"""
from __future__ import annotations

import importlib.metadata as md
from typing import Any

from .common import PeerResult, PeerUnavailable, RunSpec, Timing, measure, timed

# GGUF tensor name (after "blk.N.") -> mlx-lm llama module path (after "model.layers.N.")
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
_TOP_NAMES = {"token_embd": "model.embed_tokens", "output_norm": "model.norm", "output": "lm_head"}


def _scalar(v: Any) -> Any:
    return v.item() if hasattr(v, "item") else v


def _mlx_name(gguf_name: str) -> str:
    """'blk.3.attn_q.scales' -> 'model.layers.3.self_attn.q_proj.scales'."""
    parts = gguf_name.split(".")
    if parts[0] == "blk":
        module = _LAYER_NAMES.get(parts[2])
        if module is None:
            raise ValueError(f"[mlx] unexpected GGUF tensor {gguf_name!r}")
        return f"model.layers.{parts[1]}.{module}.{parts[3]}"
    module = _TOP_NAMES.get(parts[0])
    if module is None:
        raise ValueError(f"[mlx] unexpected GGUF tensor {gguf_name!r}")
    return f"{module}.{parts[1]}"


def model_args_from_gguf(meta: dict[str, Any], weights: dict[str, Any]) -> dict[str, Any]:
    """mlx-lm llama ModelArgs fields from GGUF key/values (llama architecture only)."""
    arch = str(meta["general.architecture"])
    if arch != "llama":
        raise ValueError(f"[mlx] GGUF architecture {arch!r}: only 'llama' is mapped here")

    def get(key: str, default: Any = None) -> Any:
        return _scalar(meta.get(f"{arch}.{key}", default))

    n_heads = int(get("attention.head_count"))
    hidden = int(get("embedding_length"))
    scaling = get("rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"[mlx] rope scaling {scaling!r} is not mapped here")
    embd = weights["token_embd.weight"]
    vocab = int(get("vocab_size", embd.shape[0]))
    return {
        "model_type": "llama",
        "hidden_size": hidden,
        "num_hidden_layers": int(get("block_count")),
        "intermediate_size": int(get("feed_forward_length")),
        "num_attention_heads": n_heads,
        "num_key_value_heads": int(get("attention.head_count_kv", n_heads)),
        "head_dim": int(get("attention.key_length", hidden // n_heads)),
        "rms_norm_eps": float(get("attention.layer_norm_rms_epsilon")),
        "vocab_size": vocab,
        "max_position_embeddings": int(get("context_length", 4096)),
        "rope_theta": float(get("rope.freq_base", 10000.0)),   # top level: mlx-lm reads it there
        "rope_traditional": True,                               # GGUF Q/K rows: adjacent pairs
        "tie_word_embeddings": "output.weight" not in weights,
    }


def load_gguf_model(path: str, *, compute_dtype: str = "float32", dequantize: bool = False):
    """(model, info) for the GGUF at `path`; info says what was loaded quantized.
    dequantize: expand the quantized tensors to dense compute_dtype weights (a what-if:
    MLX's dense CPU matmul against its quantized one)."""
    import mlx.core as mx
    import mlx.nn as nn
    from mlx_lm.models import llama

    gguf, meta = mx.load(path, return_metadata=True)
    args = llama.ModelArgs(**model_args_from_gguf(meta, gguf))
    model = llama.Model(args)

    weights = {_mlx_name(k): v for k, v in gguf.items()}
    dtype = getattr(mx, compute_dtype)
    # Scales/biases arrive as float16; their dtype sets the activations' dtype in
    # quantized matmuls, so cast them (and any dense float weights) to compute_dtype.
    weights = {k: (v if v.dtype in (mx.uint32, mx.uint8) else v.astype(dtype))
               for k, v in weights.items()}
    quantized = sorted(k[: -len(".scales")] for k in weights if k.endswith(".scales"))
    # (group_size, bits) per layer from the shapes: group = in / n_groups,
    # bits = 32 * packed words / in. In this file the embedding is Q8_0, the rest Q4_1.
    qparams = {name: _quant_params(args, name, weights) for name in quantized}
    if dequantize:
        for name, q in qparams.items():
            w, s, b = (weights.pop(f"{name}.{k}") for k in ("weight", "scales", "biases"))
            weights[f"{name}.weight"] = mx.dequantize(w, s, b, **q).astype(dtype)
    else:
        nn.quantize(model, class_predicate=lambda p, m: qparams.get(p, False))
    model.load_weights(list(weights.items()), strict=True)
    mx.eval(model.parameters())
    n_total = sum(1 for k in weights if k.endswith(".weight"))
    info = {
        "quantized_tensors": len(quantized),
        "run_dequantized": dequantize,
        "dense_tensors": n_total - len(quantized),
        "layouts": sorted({f"{b}-bit/g{g}" for g, b in
                           ((q["group_size"], q["bits"]) for q in qparams.values())}),
        "compute_dtype": compute_dtype,
        "rope_theta": args.rope_theta,
    }
    return model, info


def _quant_params(args, name: str, weights) -> dict[str, int]:
    w, s = weights[f"{name}.weight"], weights[f"{name}.scales"]
    in_features = _expected_in(args, name)
    bits = w.shape[-1] * 32 // in_features
    if bits * in_features != w.shape[-1] * 32 or in_features % s.shape[-1]:
        raise ValueError(f"[mlx] cannot infer the quantization of {name}: packed {w.shape}, "
                         f"scales {s.shape}, {in_features} input features")
    return {"group_size": in_features // s.shape[-1], "bits": bits}


def _expected_in(args, name: str) -> int:
    """Input features of the linear/embedding `name` in mlx-lm's llama."""
    if name.endswith("mlp.down_proj"):
        return args.intermediate_size
    if name.endswith("self_attn.o_proj"):
        return args.num_attention_heads * (args.head_dim or args.hidden_size // args.num_attention_heads)
    return args.hidden_size


def run(spec: RunSpec, *, compute_dtype: str = "float32", dequantize: bool = False) -> PeerResult:
    try:
        import mlx.core as mx
        from mlx_lm.generate import generate_step
    except ImportError as e:
        raise PeerUnavailable(f"mlx / mlx-lm not installed ({e.name})") from None

    model, info = load_gguf_model(spec.model_path, compute_dtype=compute_dtype, dequantize=dequantize)
    prompt = mx.array(list(spec.prompt_ids), dtype=mx.uint32)

    def generate() -> Timing:
        # mlx-lm's own decode loop: greedy sampler by default, a new KV cache per call,
        # step k+1 queued (async_eval) before token k is read. The clock stops at the last
        # token we count; the one extra queued step finishes outside the timed window.
        steps = generate_step(prompt, model, max_tokens=spec.n_decode)
        first, t_prefill = timed(lambda: next(steps)[0])
        tokens = [first]

        def decode() -> None:
            for tok, _ in steps:
                tokens.append(int(tok))
                if len(tokens) == spec.n_decode:
                    break

        _, t_decode = timed(decode)
        steps.close()
        mx.synchronize()
        return Timing(t_prefill, t_decode, tokens)

    res = measure("mlx", spec, generate)
    ver, ver_lm = md.version("mlx"), md.version("mlx-lm")
    res.extra.update(info, version=ver, mlx_lm_version=ver_lm, device=str(mx.default_device()))
    q = (f"GGUF blocks loaded quantized by mx.load ({info['quantized_tensors']} tensors as "
         f"MLX affine {'+'.join(info['layouts'])}), {info['dense_tensors']} float"
         if info["quantized_tensors"] else "weights dequantized by mx.load")
    if dequantize:
        q += f", then expanded to dense {compute_dtype} here (--mlx-dequantize)"
    res.notes.append(f"mlx {ver} + mlx-lm {ver_lm}, {mx.default_device()}; {q}; "
                     f"activations {compute_dtype}; traditional (GGUF-order) rope; "
                     f"threads chosen by MLX")
    return res
