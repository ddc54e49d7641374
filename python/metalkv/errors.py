"""The errors metalkv raises for what a caller did, in one place.

    ArgumentError   an argument outside what it may be: a ValueError whose
                    .argument names it (Python spelling, e.g. "top_p"), .value
                    and .expected say what was given and what is allowed. The C++
                    core raises the same class (its checks are the ones that count).
    ModelLoadError  a model file that cannot be found, read or understood.
    CacheFileError  a saved KV cache that cannot be read, or belongs to another
                    model or format version (metalkv.cache_file).
    MediaError      an image or audio clip that cannot be used (metalkv.media): its
                    message starts with [image] or [audio] and names what was given.
    MetalkvWarning  what metalkv warns of (an unsafe KV combination, matrices --quantize
                    left as they were): the CLI prints each as one line.
"""
from __future__ import annotations

from ._core import ArgumentError
from .models import ModelLoadError

__all__ = ["ArgumentError", "CacheFileError", "MediaError", "MetalkvWarning", "ModelLoadError", "argument_error"]


class MetalkvWarning(UserWarning):
    """Something the user chose that works but costs more than they may think."""


class CacheFileError(ValueError):
    """A saved cache file that cannot be used: missing, truncated, corrupt, from
    another model, or of a format version this metalkv does not read."""


class MediaError(ValueError):
    """An image or audio clip that cannot be used: the message starts with `[image]` or `[audio]`,
    names what was given (a path, a data URL, bytes), says what was wrong and what to do (a
    server answers it with a 400)."""


def argument_error(op: str, name: str, value, expected: str) -> ArgumentError:
    """ArgumentError("[op] name=value: expected ..."), as the C++ checks word it."""
    e = ArgumentError(f"[{op}] {name}={value!r}: expected {expected}")
    e.argument, e.value, e.expected = name, repr(value), expected
    return e
