"""Tiny random Gemma3ForConditionalGeneration checkpoints, built offline by
transformers: a SigLIP tower, the multimodal projector and a small Gemma 3 text
model, saved as safetensors with the config.json the loaders read.

Weights are drawn with a seed at scales that keep every layer's output O(1)
(transformers' own init leaves the projector at zero), then rounded to values
exact in float16, so a checkpoint saved in float32 computes the same in f16.
"""
from __future__ import annotations

import pathlib

import numpy as np

# Vision sizes: "tiny" (head_dim 16, padded to 32 by the loader) and "d72" (SigLIP-so400m's
# head_dim 72, padded to 80); both a 8x8 patch grid pooled 2x2 to 16 tokens.
VISION = {
    "tiny": dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 image_size=32, patch_size=4, layer_norm_eps=1e-6),
    "d72": dict(hidden_size=144, intermediate_size=160, num_hidden_layers=2, num_attention_heads=2,
                image_size=56, patch_size=7, layer_norm_eps=1e-6),
}
TEXT = dict(vocab_size=300, hidden_size=128, intermediate_size=256, num_hidden_layers=3, num_attention_heads=2,
            num_key_value_heads=1, head_dim=64, rms_norm_eps=1e-6, sliding_window=16, query_pre_attn_scalar=64,
            layer_types=["sliding_attention", "sliding_attention", "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 1e4}},
            max_position_embeddings=512)
IMAGE_TOKEN, BOI, EOI = 299, 297, 298
TOKENS_PER_IMAGE = 16


def config(vision: str = "tiny", vocab: int = TEXT["vocab_size"], ids=(IMAGE_TOKEN, BOI, EOI)):
    from transformers import Gemma3Config
    image, boi, eoi = ids
    return Gemma3Config(text_config=dict(TEXT, vocab_size=vocab), vision_config=dict(VISION[vision]),
                        mm_tokens_per_image=16, image_token_index=image, boi_token_index=boi, eoi_token_index=eoi)


def build(vision: str = "tiny", seed: int = 0, **config_kw):
    """The model in float32, eager attention, weights at test scales, f16-exact."""
    import torch
    from transformers import Gemma3ForConditionalGeneration
    torch.manual_seed(seed)
    model = Gemma3ForConditionalGeneration(config(vision, **config_kw)).eval().float()
    model.config._attn_implementation = "eager"
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.ndim == 1:  # norms and biases: (1 + w) norms near 1, LayerNorms near 1, biases small
                offset = 1.0 if "layer_norm" in name or "post_layernorm" in name else 0.0
                p.copy_(offset + 0.1 * torch.randn_like(p))
            else:
                fan_in = p.shape[0] if "mm_input_projection" in name else p[0].numel()
                p.copy_(torch.randn_like(p) / fan_in ** 0.5)
            p.copy_(p.half().float())
    return model


def save(model, d: pathlib.Path) -> pathlib.Path:
    d.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(d, safe_serialization=True)
    return d


def image_features(model, pixel_values: np.ndarray) -> np.ndarray:
    """transformers' soft tokens of the images: (n, 16, text hidden) float32."""
    import torch
    with torch.no_grad():
        out = model.model.get_image_features(torch.from_numpy(pixel_values))
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    return feats.float().numpy()


def save_chat(d: pathlib.Path, seed: int = 0):
    """A checkpoint Engine.chat takes: the model with a tiny Gemma-style tokenizer
    (tests/media/test_prompt.py's: Gemma's special tokens, byte fallback) and its chat
    template, the config's image ids the tokenizer's. Returns (model, d)."""
    import json
    from media.test_prompt import SPECIALS, gemma_template  # tests/ is on sys.path
    from models.chat_checkpoints import Family, build_tokenizer
    d.mkdir(parents=True, exist_ok=True)
    template = gemma_template("<start_of_image>")
    tok = build_tokenizer(Family("gemma3", {}, "gemma", SPECIALS, "<bos>", "<eos>", template, "GemmaTokenizer"))
    tok.save(str(d / "tokenizer.json"))
    (d / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>", "chat_template": template}))
    v = tok.get_vocab(with_added_tokens=True)
    ids = (v["<image_soft_token>"], v["<start_of_image>"], v["<end_of_image>"])
    model = build("tiny", seed, vocab=max(len(v), TEXT["vocab_size"]), ids=ids)
    save(model, d)
    (d / "preprocessor_config.json").write_text(json.dumps({
        "image_processor_type": "Gemma3ImageProcessor", "size": {"height": 32, "width": 32}, "resample": 2,
        "do_rescale": True, "rescale_factor": 1 / 255, "do_normalize": True, "image_mean": [0.5] * 3,
        "image_std": [0.5] * 3}))
    return model, d


def write_mmproj(model, path: pathlib.Path, matrix_type: str = "F16") -> pathlib.Path:
    """The model's vision tower and projector as llama.cpp's convert_hf_to_gguf.py writes an
    mmproj file (Gemma3VisionModel): names from gguf-py's own tensor map, the pooling head left
    out, "_weight" read as ".weight", soft_emb_norm stored as 1 + w, the embeddings in F32,
    the input projection in F16 (kept (vision hidden, text hidden)), other matrices in
    `matrix_type`, norms and biases F32; the sizes under clip.vision.*."""
    import gguf
    cfg = model.config
    v = cfg.vision_config
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, v.num_hidden_layers)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_clip_has_vision_encoder(True)
    w.add_clip_projector_type(gguf.VisionProjectorType.GEMMA3)
    w.add_vision_image_size(v.image_size)
    w.add_vision_patch_size(v.patch_size)
    w.add_vision_embedding_length(v.hidden_size)
    w.add_vision_feed_forward_length(v.intermediate_size)
    w.add_vision_block_count(v.num_hidden_layers)
    w.add_vision_head_count(v.num_attention_heads)
    w.add_vision_projection_dim(cfg.text_config.hidden_size)
    w.add_vision_attention_layernorm_eps(v.layer_norm_eps)
    w.add_vision_use_gelu(True)
    w.add_vision_image_mean([0.5, 0.5, 0.5])
    w.add_vision_image_std([0.5, 0.5, 0.5])
    side = int(cfg.mm_tokens_per_image ** 0.5)
    if (v.image_size // v.patch_size) // side != 4:
        w.add_vision_projector_scale_factor((v.image_size // v.patch_size) // side)
    for name, p in model.state_dict().items():
        name = name.removeprefix("model.").replace("_weight", ".weight")
        if not name.startswith(("vision_tower.", "multi_modal_projector.")) or ".head." in name:
            continue
        released = name.replace("vision_tower.", "vision_tower.vision_model.")  # the names the converter sees
        new = names.get_name(released, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        a = p.detach().float().numpy()
        if "soft_emb_norm" in name:
            a = a + 1
        if "input_projection" in name:
            w.add_tensor(new, a.astype(np.float16))
        elif ".embeddings." in name or a.ndim == 1:
            w.add_tensor(new, a.astype(np.float32))
        elif matrix_type == "F16" or a.shape[-1] % 32:  # (the converter's fallback for rows it cannot quantize)
            w.add_tensor(new, a.astype(np.float16))
        else:
            qt = getattr(gguf.GGMLQuantizationType, matrix_type)
            w.add_tensor(new, gguf.quants.quantize(a, qt), raw_dtype=qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
