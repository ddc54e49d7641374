"""Tiny random Gemma3nForConditionalGeneration checkpoints with a real vision tower: timm's
MobileNet-V5 (mobilenetv5_300m_enc, all 84 blocks, channels x 1/16) beside tiny_audio's
audio tower and text model, built offline by transformers and saved as safetensors.

An image of side S leaves the tower's stage 2 at S/16 and stage 3 at S/32; the fusion
adapter (MSFA) joins them at S/16 and pools (or, where S/16 is no multiple of R,
interpolates bilinearly) to R x R: R*R soft tokens of 2048 values each, timm's fixed width.
Defaults S=96, R=3 (a 2x2 average); S=64, R=2 pools too, S=96, R=6 does not.

Weights are drawn as tiny_audio draws them, f16-exact: conv weights 1/sqrt(fan in), the stem's
bias 0.1 n, RmsNorm2d weights 1 + 0.1 n, layer-scale gammas 0.5 + 0.15 n (tiny_audio.LAYER_SCALE).
Stages 1-3 open with a block that has a layer scale but no shortcut, so the gammas set the
residual stream's size: at timm's 1e-5 it would be ~1e-5, where RmsNorm2d's eps (1e-6) outweighs its
mean square and the norms stop normalizing; at 0.5 the stream's std stays 0.5..3 and every
block moves it by over 10 %.

transformers builds TimmWrapperModel, and imports timm, only where torchvision is installed;
timm_tower() lifts that gate while a model is built (nothing of torchvision runs).
"""
from __future__ import annotations

import contextlib
import pathlib

import numpy as np

from . import tiny_audio
from .tiny_vlm import save  # noqa: F401  (the same save_pretrained)

SIDE, RES = 96, 3
WIDTH = 2048  # timm's MSFA output channels, whatever the channel multiplier
# the released gemma-3n-E4B-it's image processor (transformers' convert_gemma3n_weights.py), at side S
IMAGE_PROCESSOR = dict(image_processor_type="SiglipImageProcessorFast", do_resize=True, resample=2, do_rescale=True,
                       rescale_factor=1 / 255, do_normalize=False, image_mean=[0.5] * 3, image_std=[0.5] * 3,
                       do_convert_rgb=True, image_seq_length=256)


def vision_config(res: int = RES) -> dict:
    """Gemma3nVisionConfig fields: MobileNet-V5 at 1/16 of its channels, R x R soft tokens."""
    return dict(architecture="mobilenetv5_300m_enc", hidden_size=WIDTH,
                model_args={"channel_multiplier": 0.0625, "msfa_output_resolution": res})


@contextlib.contextmanager
def timm_tower():
    """transformers' TimmWrapperModel built with timm_import's timm: transformers only imports
    timm, and lets the wrapper be built, when torchvision is installed."""
    from unittest import mock
    from transformers.models.timm_wrapper import modeling_timm_wrapper as wrapper
    from .timm_import import import_timm
    timm = import_timm()
    with mock.patch.object(wrapper, "timm", timm, create=True), \
            mock.patch.object(wrapper, "requires_backends", lambda *args: None):
        yield


def build(res: int = RES, seed: int = 0, layout: dict = tiny_audio.LAYOUT, audio: str = "tiny"):
    """The model in float32, weights at test scales, f16-exact; R = res."""
    with timm_tower():
        return tiny_audio.build(audio, seed, layout, vision=vision_config(res), vision_tokens=res * res)


def timm_model(model):
    """The timm MobileNetV5Encoder inside the model."""
    return model.model.vision_tower.timm_model


def pixels(n: int, side: int = SIDE, seed: int = 0) -> np.ndarray:
    """Images as the processor gives them: (n, 3, side, side) float32 in [0, 1], smooth plus noise."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:side, 0:side] / side
    fx, fy = rng.uniform(1, 3, (2, n, 3, 1, 1))  # (n, 3, 1, 1) each: a slow wave per image and channel
    base = 0.5 + 0.3 * np.sin(2 * np.pi * (fx * x + fy * y))
    return np.clip(base + 0.1 * rng.normal(size=(n, 3, side, side)), 0, 1).astype(np.float32)


def tower_features(model, pixel_values: np.ndarray) -> np.ndarray:
    """The timm tower's output, before the embedder: (n, 2048, R, R) float32."""
    import torch
    with torch.no_grad():
        return timm_model(model).forward_features(torch.from_numpy(pixel_values)).float().numpy()


def image_features(model, pixel_values: np.ndarray) -> np.ndarray:
    """transformers' soft tokens of the images: (n, R*R, text hidden) float32, rows HW-major."""
    import torch
    with torch.no_grad():
        out = model.model.get_image_features(torch.from_numpy(pixel_values))
    feats = out.pooler_output if hasattr(out, "pooler_output") else out
    return feats.float().numpy()


def logits(model, ids: list[int], pixel_values: np.ndarray | None = None) -> np.ndarray:
    """transformers' logits at every position of ids (with the images where the ids hold their runs)."""
    import torch
    kw = {} if pixel_values is None else dict(pixel_values=torch.from_numpy(pixel_values))
    with torch.no_grad():
        return model(input_ids=torch.tensor([ids]), **kw).logits[0].float().numpy()


def image_processor_config(side: int = SIDE) -> dict:
    return dict(IMAGE_PROCESSOR, size={"height": side, "width": side})


def processor_pixels(image, side: int = SIDE) -> np.ndarray:
    """transformers' pixel_values of a PIL image under image_processor_config(side): (1, 3, side,
    side) float32. SiglipImageProcessorPil: what AutoImageProcessor picks without torchvision."""
    from transformers import SiglipImageProcessorPil
    cfg = {k: v for k, v in image_processor_config(side).items()
           if k not in ("image_processor_type", "image_seq_length")}
    return SiglipImageProcessorPil(**cfg)(image, return_tensors="np")["pixel_values"].astype(np.float32)


def save_chat(d: pathlib.Path, res: int = RES, side: int = SIDE, seed: int = 0, audio: str = "tiny"):
    """A checkpoint Engine.chat takes: tiny_audio.save_chat's tokenizer, template and audio
    settings, the model with the vision tower, and a preprocessor config holding both the
    audio feature extractor's and the image processor's fields (as Gemma 3n's released one
    does). Returns (model, d, layout)."""
    import json
    with timm_tower():
        model, d, layout = tiny_audio.save_chat(d, audio, seed, vision=vision_config(res), vision_tokens=res * res)
    path = d / "preprocessor_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **image_processor_config(side)}))
    return model, d, layout


def write_mmproj(model, path: pathlib.Path, side: int = SIDE, res: int = RES) -> pathlib.Path:
    """The model's vision tower and embedder as llama.cpp's convert_hf_to_gguf.py writes a Gemma 3n
    mmproj file (Gemma3nVisionAudioModel, its vision half): the blocks as v.blk.S.I.<timm's
    suffix> (the converter's own map), everything else by gguf-py's tensor map; the stem's bias
    and the layer scales reshaped to (1, C, 1, 1); the stem in F32, 1-D tensors in F32, every other
    tensor F16 (the converter's default); patch_size = side // tokens, as the converter writes it."""
    import gguf
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.MMPROJ, 128)
    w = gguf.GGUFWriter(str(path), "clip")
    w.add_clip_has_vision_encoder(True)
    w.add_clip_vision_projector_type(gguf.VisionProjectorType.GEMMA3NV)
    w.add_vision_image_size(side)
    w.add_vision_patch_size(side // (res * res))
    w.add_vision_attention_layernorm_eps(1e-6)
    w.add_vision_image_mean([0.0, 0.0, 0.0])
    w.add_vision_image_std([1.0, 1.0, 1.0])
    for name, p in model.state_dict().items():
        if not name.startswith(("model.vision_tower.", "model.embed_vision.")):
            continue
        if name.startswith("model.vision_tower.timm_model.blocks."):
            new = "v.blk." + ".".join(name.split(".")[4:])
        else:
            new = names.get_name(name, try_suffixes=(".weight", ".bias"))
        assert new is not None, name
        a = p.detach().float().numpy()
        if new.endswith(("conv_stem.conv.bias", "layer_scale.gamma")):
            a = a[None, :, None, None]
        w.add_tensor(new, a.astype(np.float32 if "stem" in new or a.ndim == 1 else np.float16))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
