"""Gemma 3n's vision tower (timm's MobileNet-V5 encoder) and its embedder into the text
model: read from a Gemma3nForConditionalGeneration checkpoint's safetensors, put on the
device as metalkv._core.MobileNet (cpp/towers/mobilenet.h), and run on prepared images.

    tower = Gemma3nVision.load(device, model_dir, config)    # None: no vision weights
    tower = Gemma3nVision.from_mmproj(device, "mmproj.gguf", vocab_offset)  # llama.cpp's file
    tower.encode(pixel_values)     # (n, 3, S, S) float32 -> (n, tokens_per_image, text_hidden)
    tower.hard_row(token_id)       # the embedder's row of a hard token (<end_of_image>)

The blocks come from the tensors: a block with conv_exp is an edge residual, one with
pw_exp a universal inverted residual, one with attn.query a multi-query attention block;
their widths and kernels from the tensors' shapes. What the tensors do not hold comes from
the architecture, the one Gemma 3n uses (timm's mobilenetv5_300m_enc): each stage's first
block strides by 2, an attention block with a key down_conv strides its keys and values by
2, and the fusion takes the last two stages' outputs. The loader writes the tower's
canonical names (mobilenet.h) and fits three things to the kernels: k x k convs become gemm
rows (their (in, k, k) patch padded with zeros to the 4 a matmul row reads at a time),
depthwise taps are stored (k², channels), and the fusion's first 1x1 conv is split into its
two column blocks, one per input.

llama.cpp's mmproj files of Gemma 3n (convert_hf_to_gguf.py's Gemma3nVisionAudioModel, projector
type "gemma3nv") hold the same tensors under other names: the blocks as v.blk.S.I.<timm's
suffix>, the stem and the fusion under v.*, the embedder under mm.*; the stem's bias and the
layer scales as (1, C, 1, 1). The output grid's side is not in the file: the converter writes
patch_size = image_size // image_seq_length, so image_seq_length = image_size // patch_size.
"""
from __future__ import annotations

import json
import pathlib
import re
from typing import Any, Mapping

import numpy as np

from .. import _core
from .errors import ModelLoadError
from .gguf_file import read_gguf
from .safetensors_loader import read_safetensors
from .towers import HardRows, ImageTower, core_weights
from .vision import _f32, _padded_patch

ARCHITECTURE = "mobilenetv5_300m_enc"
_TOWER = "vision_tower.timm_model."
_EMBED = "embed_vision."
_BLOCK = re.compile(r"^blocks\.(\d+)\.(\d+)\.(.+)$")
_KV_STRIDE = 2  # the architecture's ("mqa_..._v2_...")
_TIMM_EPS = 1e-6  # RmsNorm2d's, which timm's MobileNet-V5 never changes


def _fail(message: str) -> ModelLoadError:
    return ModelLoadError(f"[vision] {message}")


def _raw(files) -> dict[str, tuple[str, np.ndarray]]:
    """The tower's tensors by timm's names (blocks.1.0.pw_exp.conv.weight) and the embedder's
    (embed_vision.*), from safetensors files."""
    raw: dict[str, tuple[str, np.ndarray]] = {}
    for f in files:
        for name, t in read_safetensors(f).items():
            name = name.removeprefix("model.")
            if name.startswith(_TOWER):
                raw[name[len(_TOWER):]] = t
            elif name.startswith(_EMBED):
                raw[name] = t
    return raw


def _stages(raw) -> list[list[dict[str, tuple[str, np.ndarray]]]]:
    """blocks.S.I.* grouped: stages of blocks, each {suffix: tensor}."""
    grouped: dict[int, dict[int, dict]] = {}
    for name, t in raw.items():
        m = _BLOCK.match(name)
        if m:
            grouped.setdefault(int(m[1]), {}).setdefault(int(m[2]), {})[m[3]] = t
    if sorted(grouped) != list(range(len(grouped))) or len(grouped) < 2:
        raise _fail(f"the tower's stages are {sorted(grouped)}: expected 0 .. n - 1, at least two")
    stages = []
    for s in range(len(grouped)):
        if sorted(grouped[s]) != list(range(len(grouped[s]))):
            raise _fail(f"stage {s}'s blocks are {sorted(grouped[s])}: expected 0 .. n - 1")
        stages.append([grouped[s][i] for i in range(len(grouped[s]))])
    return stages


def _block(t: dict, stride: int, where: str) -> dict:
    """One block's spec from its tensors (suffix -> (dtype, array))."""
    def shape(suffix: str) -> tuple[int, ...]:
        if suffix not in t:
            raise _fail(f"{where}: missing tensor {suffix}")
        return t[suffix][1].shape

    if any(k.startswith(("se.", "dw_end.", "aa.")) or ".se." in k for k in t):
        raise _fail(f"{where} has squeeze-excite, an end depthwise conv or anti-aliasing: not in "
                    f"{ARCHITECTURE}, not run")
    if "conv_exp.weight" in t:
        mid, c_in, k, _ = shape("conv_exp.weight")
        return dict(kind="edge", **{"in": c_in}, out=shape("conv_pwl.weight")[0], mid=mid, k=k, stride=stride)
    if "pw_exp.conv.weight" in t:
        mid, c_in = shape("pw_exp.conv.weight")[:2]
        k_start = shape("dw_start.conv.weight")[2] if "dw_start.conv.weight" in t else 0
        k_mid = shape("dw_mid.conv.weight")[2] if "dw_mid.conv.weight" in t else 0
        return dict(kind="inverted", **{"in": c_in}, out=shape("pw_proj.conv.weight")[0], mid=mid,
                    k_start=k_start, k_mid=k_mid, stride=stride)
    if "attn.query.proj.weight" in t:
        if stride != 1:
            raise _fail(f"{where}: an attention block opens its stage; {ARCHITECTURE}'s never do")
        q_out, c_in = shape("attn.query.proj.weight")[:2]
        key_dim = shape("attn.key.proj.weight")[0]
        if shape("attn.value.proj.weight")[0] != key_dim or q_out % key_dim:
            raise _fail(f"{where}: value_dim {shape('attn.value.proj.weight')[0]} and query width {q_out} must "
                        f"match key_dim {key_dim} (the attention kernels read K and V of one head_dim)")
        down = "attn.key.down_conv.weight" in t
        return dict(kind="attention", **{"in": c_in}, out=shape("attn.output.proj.weight")[0], heads=q_out // key_dim,
                    key_dim=key_dim, kv_stride=_KV_STRIDE if down else 1,
                    kv_kernel=shape("attn.key.down_conv.weight")[2] if down else 0)
    raise _fail(f"{where} is no block of {ARCHITECTURE} (tensors {sorted(t)[:4]} ...)")


def _matrix(dtype: str, a: np.ndarray) -> tuple[str, np.ndarray]:
    """A conv's weight (out, in, k, k) as gemm rows, padded with zero columns to a multiple of 4."""
    w = a.reshape(a.shape[0], -1)
    return dtype, np.pad(w, ((0, 0), (0, _padded_patch(w.shape[1]) - w.shape[1])))


def _taps(dtype: str, a: np.ndarray) -> tuple[str, np.ndarray]:
    """A depthwise conv's weight (channels, 1, k, k) as (k², channels) float32."""
    return "f32", np.ascontiguousarray(_f32(dtype, a).reshape(a.shape[0], -1).T)


def _vector(dtype: str, a: np.ndarray) -> tuple[str, np.ndarray]:
    return "f32", _f32(dtype, a).reshape(-1)


# canonical suffix -> (timm suffix, conversion), per kind; a suffix whose timm tensor is
# absent (an inverted block's missing depthwise conv, an attention block without
# downsampling) is left out, as the spec's kernel 0 says
_BLOCK_TENSORS = {
    "edge": {"exp": ("conv_exp.weight", _matrix), "exp_norm": ("bn1.weight", _vector),
             "proj": ("conv_pwl.weight", _matrix), "proj_norm": ("bn2.weight", _vector)},
    "inverted": {"dw_start": ("dw_start.conv.weight", _taps), "dw_start_norm": ("dw_start.bn.weight", _vector),
                 "pw_exp": ("pw_exp.conv.weight", _matrix), "pw_exp_norm": ("pw_exp.bn.weight", _vector),
                 "dw_mid": ("dw_mid.conv.weight", _taps), "dw_mid_norm": ("dw_mid.bn.weight", _vector),
                 "pw_proj": ("pw_proj.conv.weight", _matrix), "pw_proj_norm": ("pw_proj.bn.weight", _vector),
                 "gamma": ("layer_scale.gamma", _vector)},
    "attention": {"norm": ("norm.weight", _vector), "q": ("attn.query.proj.weight", _matrix),
                  "k": ("attn.key.proj.weight", _matrix), "v": ("attn.value.proj.weight", _matrix),
                  "k_down": ("attn.key.down_conv.weight", _taps), "k_down_norm": ("attn.key.norm.weight", _vector),
                  "v_down": ("attn.value.down_conv.weight", _taps),
                  "v_down_norm": ("attn.value.norm.weight", _vector),
                  "o": ("attn.output.proj.weight", _matrix), "gamma": ("layer_scale.gamma", _vector)},
}
_FUSION = {"exp_norm": "msfa.ffn.pw_exp.bn.weight", "proj_norm": "msfa.ffn.pw_proj.bn.weight",
           "norm": "msfa.norm.weight"}


def mobilenet_model(raw, config: Mapping[str, Any], image_size: int) -> tuple[dict, dict]:
    """(_core.MobileNet's spec, {canonical name: (dtype, array)}) from the tower's tensors (_raw)
    and a Gemma 3n config.json."""
    v, text = config.get("vision_config") or {}, config.get("text_config") or {}
    arch = v.get("architecture", ARCHITECTURE)
    if arch != ARCHITECTURE:
        raise _fail(f"vision_config.architecture {arch!r}: metalkv runs {ARCHITECTURE}, Gemma 3n's")
    args = v.get("model_args") or {}
    resolution = int(args.get("msfa_output_resolution", 16))
    tokens = int(config.get("vision_soft_tokens_per_image", 256))
    if resolution * resolution != tokens:
        raise _fail(f"vision_soft_tokens_per_image {tokens} is not msfa_output_resolution² ({resolution}²)")

    def take(name: str) -> tuple[str, np.ndarray]:
        if name not in raw:
            raise _fail(f"missing tensor {name}")
        return raw[name]

    out: dict[str, tuple[str, np.ndarray]] = {}
    out["v.stem.weight"] = _matrix(*take("conv_stem.conv.weight"))
    out["v.stem.bias"] = _vector(*take("conv_stem.conv.bias"))
    out["v.stem.norm"] = _vector(*take("conv_stem.bn.weight"))
    blocks, stage_ends = [], []
    for s, stage in enumerate(_stages(raw)):
        for i, t in enumerate(stage):
            b = _block(t, 2 if i == 0 else 1, f"block {s}.{i}")
            for canon, (suffix, convert) in _BLOCK_TENSORS[b["kind"]].items():
                if suffix in t:
                    out[f"v.blk.{len(blocks)}.{canon}"] = convert(*t[suffix])
            blocks.append(b)
        stage_ends.append(len(blocks) - 1)
    fuse = stage_ends[-2:]
    hi, lo = (blocks[f]["out"] for f in fuse)
    dt, w = take("msfa.ffn.pw_exp.conv.weight")
    w = w.reshape(w.shape[0], -1)
    if w.shape[1] != hi + lo:
        raise _fail(f"the fusion takes {w.shape[1]} channels; the last two stages give {hi} + {lo}")
    if any(k.startswith(("msfa.ffn.dw_", "msfa.ffn.layer_scale")) for k in raw):
        raise _fail(f"the fusion has a depthwise conv or a layer scale: not in {ARCHITECTURE}, not run")
    out["v.msfa.exp_hi"] = (dt, np.ascontiguousarray(w[:, :hi]))
    out["v.msfa.exp_lo"] = (dt, np.ascontiguousarray(w[:, hi:]))
    out["v.msfa.proj"] = _matrix(*take("msfa.ffn.pw_proj.conv.weight"))
    for canon, name in _FUSION.items():
        out[f"v.msfa.{canon}"] = _vector(*take(name))
    out["mm.embedding"] = take(_EMBED + "embedding.weight")
    out["mm.hard_norm"] = _vector(*take(_EMBED + "hard_embedding_norm.weight"))
    out["mm.soft_norm"] = _vector(*take(_EMBED + "soft_embedding_norm.weight"))
    out["mm.projection"] = take(_EMBED + "embedding_projection.weight")
    try:
        eps = float(v.get("rms_norm_eps", 1e-6))
        spec = dict(image=int(image_size), stem=out["v.stem.weight"][1].shape[0], blocks=blocks, fuse=fuse,
                    fusion_mid=w.shape[0], hidden=out["v.msfa.proj"][1].shape[0], resolution=resolution,
                    vocab=int(v.get("vocab_size", 128)), text_hidden=int(text["hidden_size"]), eps=_TIMM_EPS, mm_eps=eps)
    except (KeyError, TypeError, ValueError) as e:
        raise _fail(f"the checkpoint's config cannot be read: {e}") from None
    return spec, out


# llama.cpp's names of the tensors outside the blocks -> the checkpoint's (the _raw keys);
# tests/models/test_vision3n_mmproj.py writes its files through gguf-py's own name map
_MMPROJ_NAMES = {
    **{f"v.{n}": n for n in ("conv_stem.conv.weight", "conv_stem.conv.bias", "conv_stem.bn.weight",
                             "msfa.ffn.pw_exp.conv.weight", "msfa.ffn.pw_exp.bn.weight", "msfa.ffn.pw_proj.conv.weight",
                             "msfa.ffn.pw_proj.bn.weight", "msfa.norm.weight")},
    "mm.embedding.weight": _EMBED + "embedding.weight", "mm.hard_emb_norm.weight": _EMBED + "hard_embedding_norm.weight",
    "mm.soft_emb_norm.weight": _EMBED + "soft_embedding_norm.weight",
    "mm.input_projection.weight": _EMBED + "embedding_projection.weight",
}
_MMPROJ_BLOCK = re.compile(r"^v\.blk\.(\d+)\.(\d+)\.(.+)$")
_FLOATS = ("f32", "f16", "bf16")


def mmproj_model(path: str, vocab_offset: int) -> tuple[dict, dict, int]:
    """(_core.MobileNet's spec, its tensors, the image side) of a Gemma 3n mmproj file;
    vocab_offset: the id of the model's <end_of_image> (the vision embedder's first token)."""
    def refuse(why: str) -> ModelLoadError:
        return ModelLoadError(f"[mmproj] {path}: {why}")

    f = read_gguf(path)
    meta = f.metadata
    kind = meta.get("clip.vision.projector_type", meta.get("clip.projector_type"))
    if kind != "gemma3nv":
        raise refuse(f"projector type {kind!r}: a Gemma 3n model takes Gemma 3n's mmproj ('gemma3nv')")
    raw: dict[str, tuple[str, np.ndarray]] = {}
    for t in f.tensors:
        m = _MMPROJ_BLOCK.match(t.name)
        name = f"blocks.{m[1]}.{m[2]}.{m[3]}" if m else _MMPROJ_NAMES.get(t.name)
        if name is None:
            continue  # the audio tower's (a.*, mm.a.*), read from the checkpoint or not at all
        if t.ggml_type not in _FLOATS:
            raise refuse(f"tensor {t.name} is {t.ggml_type}; metalkv reads an mmproj of f32, f16 or bf16 "
                         "(llama.cpp's convert_hf_to_gguf.py writes f16 by default)")
        raw[name] = (t.ggml_type, f.tensor_array(t))
    try:
        image, patch = int(meta["clip.vision.image_size"]), int(meta["clip.vision.patch_size"])
        tokens = image // patch
        side = int(round(tokens ** 0.5))
        if side * side != tokens:
            raise ValueError(f"image_size // patch_size = {tokens} soft tokens is not a square grid")
        embedding, projection = raw[_EMBED + "embedding.weight"][1], raw[_EMBED + "embedding_projection.weight"][1]
        config = {"vision_config": {"architecture": ARCHITECTURE, "model_args": {"msfa_output_resolution": side},
                                    "vocab_size": embedding.shape[0], "vocab_offset": vocab_offset,
                                    "rms_norm_eps": float(meta.get("clip.vision.attention.layer_norm_epsilon", 1e-6))},
                  "text_config": {"hidden_size": projection.shape[0]}, "vision_soft_tokens_per_image": tokens}
    except (KeyError, TypeError, ValueError) as e:
        raise refuse(f"the vision metadata or embedder cannot be read: {e}") from None
    spec, tensors = mobilenet_model(raw, config, image)
    return spec, tensors, image


def image_size_of(path: pathlib.Path) -> int:
    """The square side Gemma 3n's processor resizes to (preprocessor_config.json's size; 768
    without one, the released checkpoints')."""
    pre = path / "preprocessor_config.json"
    size = (json.loads(pre.read_text()).get("size") if pre.is_file() else None) or {"height": 768, "width": 768}
    h, w = (size, size) if isinstance(size, int) else (size.get("height"), size.get("width"))
    if h != w or not isinstance(h, int):
        raise _fail(f"preprocessor_config.json size {size!r}: Gemma 3n's tower takes a square image")
    return h


class Gemma3nVision(ImageTower, HardRows):
    """Gemma 3n's MobileNet-V5 tower and its embedder on a device."""

    bidirectional = False  # Gemma 3n's image tokens attend causally (no PaliGemma-style block)

    def __init__(self, core: "_core.MobileNet", image_size: int, vocab_offset: int):
        self._core = core
        self.image_size = image_size
        self.vocab_offset = vocab_offset  # the first id of the embedder's hard tokens
        self._hard = core.hard_rows()

    @classmethod
    def load(cls, device, path: str | pathlib.Path, config: Mapping[str, Any]) -> "Gemma3nVision | None":
        """The vision tower of the checkpoint at `path` (a directory of safetensors) whose
        config.json is `config`; None when it is not Gemma 3n or holds no vision tower weights."""
        if config.get("model_type") != "gemma3n" or not config.get("vision_config"):
            return None
        path = pathlib.Path(path)
        raw = _raw(sorted(path.glob("*.safetensors")))
        if "conv_stem.conv.weight" not in raw:
            return None
        image_size = image_size_of(path)
        spec, tensors = mobilenet_model(raw, config, image_size)
        try:
            core = _core.MobileNet(device, spec, core_weights(device, tensors))
        except _core.GpuError as e:
            raise ModelLoadError(f"{path}: {e}") from None
        return cls(core, image_size, int(config["vision_config"].get("vocab_offset", 262_144)))

    @classmethod
    def from_mmproj(cls, device, path, vocab_offset: int) -> "Gemma3nVision":
        """The vision tower of llama.cpp's Gemma 3n mmproj file (mmproj_model)."""
        spec, tensors, image = mmproj_model(str(path), vocab_offset)
        try:
            core = _core.MobileNet(device, spec, core_weights(device, tensors))
        except _core.GpuError as e:
            raise ModelLoadError(f"[mmproj] {path}: {e}") from None
        return cls(core, image, vocab_offset)

    def encode(self, pixel_values: np.ndarray) -> np.ndarray:
        """pixel_values (n, 3, S, S) float32, as preprocess_image makes them -> the images' soft
        tokens (n, tokens_per_image, text_hidden) float32."""
        pv = np.asarray(pixel_values, np.float32)
        if pv.ndim != 4 or pv.shape[1:] != (3, self.image_size, self.image_size):
            raise ValueError(f"[vision] pixel_values must be (n, 3, {self.image_size}, {self.image_size}), "
                             f"got {pv.shape}")
        rows = self._core.encode(np.ascontiguousarray(pv.transpose(0, 2, 3, 1)))
        return rows.reshape(len(pv), self.tokens_per_image, -1)
