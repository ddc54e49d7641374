"""From a model reference to what the engine needs: config, tensors, tokenizer
and chat template.

    from metalkv.models import load_model
    m = load_model()            # the default SmolLM2-135M-Instruct Q4_1 GGUF
    m = load_model("path/to/model.gguf" | "path/to/hf_dir" | "org/name")
    ids = m.tokenizer.encode(m.chat_template.render([{"role": "user", "content": "Hi"}]))

See docs/MODELS.md.
"""
from __future__ import annotations

import os
import pathlib
from dataclasses import dataclass, field
from typing import Any

from .architectures import SUPPORTED_ARCHS
from .chat import CHATML, ChatTemplate, ChatTemplateError
from .config import ModelConfig, rope_freq_factors
from .errors import ModelLoadError
from .resolve import ModelNotFoundError, default_model_path, hf_cache_dir, resolve_model
from .tensor import Tensor, expected_shapes
from .tokenizer import IncrementalDetokenizer, Tokenizer

__all__ = [
    "CHATML", "ChatTemplate", "ChatTemplateError", "IncrementalDetokenizer", "LoadedModel",
    "ModelConfig", "ModelLoadError", "ModelNotFoundError", "SUPPORTED_ARCHS", "Tensor", "Tokenizer",
    "default_model_path", "expected_shapes", "hf_cache_dir", "load_model", "resolve_model",
    "rope_freq_factors",
]


@dataclass
class LoadedModel:
    path: pathlib.Path
    config: ModelConfig
    tensors: dict[str, Tensor]          # canonical (GGUF) names, see tensor.py
    tokenizer: Tokenizer | None         # None: the model ships no tokenizer
    chat_template: ChatTemplate
    metadata: dict[str, Any] = field(repr=False)  # GGUF key/values or config.json


def _is_gguf(path: pathlib.Path) -> bool:
    with open(path, "rb") as f:
        return f.read(4) == b"GGUF"


def load_model(ref: str | os.PathLike | None = None, *, progress: bool | None = None,
               quantize: str | None = None) -> LoadedModel:
    """Resolve `ref` (see resolve_model) and load everything. progress: tqdm bars on
    stderr (None: only on a terminal, and not when METALKV_NO_PROGRESS is set).
    quantize: the type the engine will quantize float matrices to (Engine.load), so
    that safetensors bf16 matrices it will quantize keep their exact values."""
    path = resolve_model(ref)
    if path.is_file() and path.suffix == ".safetensors":
        path = path.parent
    try:
        return _load(path, progress, quantize)
    except ChatTemplateError as e:  # a template that does not parse is a file that cannot be used
        raise ModelLoadError(f"{path}: {e}") from None
    except ModelLoadError as e:
        if str(path) in str(e):
            raise
        raise ModelLoadError(f"{path}: {e}") from None  # tokenizer errors do not know the file


def _load(path: pathlib.Path, progress: bool | None, quantize: str | None) -> LoadedModel:
    if path.is_dir():
        from .safetensors_loader import load_safetensors_dir

        cfg, tensors, md = load_safetensors_dir(path, progress=progress, quantize=quantize)
        tok = (Tokenizer.from_hf_dir(path, bos_id=cfg.bos_id, eos_ids=cfg.eos_ids)
               if (path / "tokenizer.json").is_file() else None)
        chat = ChatTemplate.from_hf_dir(path)
    elif _is_gguf(path):
        from .gguf_loader import load_gguf

        cfg, tensors, md = load_gguf(path, progress=progress)
        tok = (Tokenizer.from_gguf_metadata(md, eos_ids=cfg.eos_ids)
               if "tokenizer.ggml.tokens" in md else None)
        chat = ChatTemplate.from_gguf_metadata(md)
    else:
        raise ModelLoadError(f"[load] {path}: not a GGUF file (no 'GGUF' magic) and not a directory "
                             f"with config.json + *.safetensors")
    return LoadedModel(path, cfg, tensors, tok, chat, md)
