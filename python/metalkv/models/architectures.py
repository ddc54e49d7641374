"""Architectures: the one file that says what each supported family's decoder
layer is, as features of ModelConfig, and which source names (HF model_type,
GGUF general.architecture) belong to it.

The loaders read everything else from the file (biases, windows, soft-caps,
rotary dims, norm offsets) and model_spec.py maps features onto the C++
model's switches without naming any architecture. Adding an architecture:
docs/MODELS.md, "How to add an architecture".
"""
from __future__ import annotations

from dataclasses import dataclass

from .errors import ModelLoadError


@dataclass(frozen=True)
class Architecture:
    """What a family's decoder layer has beyond Llama's (ModelConfig.traits)."""
    qk_norm: bool = False         # per-head RMSNorm of q and k before rope (attn_{q,k}_norm)
    sandwich_norms: bool = False  # norms after attention and after the ffn too (HF: the
    #                               post_attention_layernorm is the norm *after* attention)
    partial_rotary: bool = False  # rope may rotate fewer dims than head_dim (llama.cpp refuses
    #                               rope.dimension_count != head_dim for llama; so do we)
    gemma: bool = False           # Gemma's conventions: HF norms hold w of x * (1 + w) (GGUF adds
    #                               the 1), embeddings times sqrt(hidden), GeGLU, query_pre_attn_scalar
    fused_projections: bool = False  # files hold q/k/v and gate/up fused: HF qkv_proj, gate_up_proj;
    #                                  GGUF attn_qkv, and ffn_up of (2 ffn_hidden, hidden), gate first
    v_norm: bool = False          # per-head RMSNorm of v without a weight (Gemma 3n)
    altup: bool = False           # Gemma 3n's layer: AltUp streams, LAuReL, per-layer inputs, sparse
    #                               ffn gates, its last layers reading earlier K/V (models/gemma3n.py);
    #                               norms x * w, embeddings times sqrt(hidden), GeGLU, scores unscaled


ARCHITECTURES: dict[str, Architecture] = {
    "llama": Architecture(),  # also qwen2 (q/k/v bias), mistral (a sliding window on every layer)
    "qwen3": Architecture(qk_norm=True),
    "phi3": Architecture(partial_rotary=True, fused_projections=True),
    "gemma2": Architecture(sandwich_norms=True, gemma=True),
    "gemma3": Architecture(qk_norm=True, sandwich_norms=True, gemma=True),
    "gemma3n": Architecture(qk_norm=True, sandwich_norms=True, v_norm=True, altup=True),
}
SUPPORTED_ARCHS = tuple(ARCHITECTURES)
# Source architecture names (GGUF general.architecture / HF model_type) -> our arch.
# qwen2 is a llama with q/k/v bias and NEOX rope; mistral a llama with a sliding window.
_ARCH_ALIASES = {"llama": "llama", "qwen2": "llama", "mistral": "llama", "qwen3": "qwen3",
                 "phi3": "phi3", "gemma2": "gemma2", "gemma3": "gemma3", "gemma3_text": "gemma3",
                 "gemma3n": "gemma3n", "gemma3n_text": "gemma3n"}


def normalize_arch(name: str | None, source: str) -> str:
    if name is None:
        raise ModelLoadError(f"[config] {source}: no architecture: the file has no "
                             f"general.architecture (GGUF) or model_type (config.json); metalkv "
                             f"supports {', '.join(SUPPORTED_ARCHS)}")
    arch = _ARCH_ALIASES.get(name)
    if arch is None:
        raise ModelLoadError(
            f"[config] {source}: architecture {name!r} is not supported; metalkv supports "
            f"{', '.join(SUPPORTED_ARCHS)} (source names: {', '.join(sorted(_ARCH_ALIASES))})")
    return arch
