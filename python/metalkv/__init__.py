"""metalkv: a KV-cache-centred LLM inference engine for Apple Silicon.

The C++ core lives in the private extension ``metalkv._core``; this package
re-exports what users need. Importing metalkv never touches a device: devices
are created when asked for.
"""
import importlib.metadata as _metadata

from ._core import (
    BlitEncoder,
    Buffer,
    CommandBuffer,
    ComputeEncoder,
    Device,
    GpuError,
    KVCache,
    Pipeline,
)
from ._core import device_kinds as _device_kinds
from ._device import open_device
from .constrain import Grammar
from .engine import Engine, Sampling
from .errors import ArgumentError, CacheFileError, MediaError, ModelLoadError

__all__ = [
    "ArgumentError", "BlitEncoder", "CacheFileError", "Buffer", "CommandBuffer", "ComputeEncoder", "Device", "Engine", "GpuError",
    "Grammar", "KVCache", "MediaError", "ModelLoadError", "Pipeline", "Sampling", "device", "devices",
]
__version__ = _metadata.version("metalkv")  # pyproject.toml is the one place it is written


def devices() -> list[str]:
    """Device kinds available here, best first: 'metal' on Apple Silicon, 'cuda' with an
    NVIDIA GPU (in a build with the CUDA toolkit), then 'host'."""
    return list(_device_kinds())


def device(kind: str = "auto", *, fiber_order: str = "", seed: int = 0) -> Device:
    """A device: 'auto' (Metal, else CUDA where available, else the host executor), 'host',
    'metal' or 'cuda'.

    fiber_order applies to the host executor only: the order in which the
    threads of a threadgroup run ('forward', 'reverse', 'random' with seed).
    """
    return open_device(kind, fiber_order=fiber_order, seed=seed)
