"""Values read from a model file (GGUF metadata, config.json), checked for type and
range where they are read, so that a string where a count belongs, a bool where
an int does, a zero head count or a NaN epsilon is an error naming the key, not a
TypeError, a ZeroDivisionError or a model that computes from it.

    n = as_int(md["llama.block_count"], "llama.block_count", source, *INT_RANGES["n_layers"])
"""
from __future__ import annotations

import math
from typing import Any

from .errors import ModelLoadError

_I32_MAX = (1 << 31) - 1  # the C++ engine holds sizes and ids as int32

# Ranges of ModelConfig's integer fields: wide enough for every released model,
# tight enough that a corrupt count cannot make a loop or an allocation run away
# before the tensors are compared with it.
INT_RANGES: dict[str, tuple[int, int]] = {
    "n_layers": (1, 1024), "hidden": (1, 1 << 17), "n_heads": (1, 1 << 12),
    "n_kv_heads": (1, 1 << 12), "head_dim": (2, 1 << 12), "ffn_hidden": (1, 1 << 20),
    "vocab": (1, 1 << 22), "context_length": (1, _I32_MAX), "sliding_window": (1, _I32_MAX),
    "original_max_position_embeddings": (1, _I32_MAX),
    # Gemma 3n's (models/gemma3n.py)
    "altup_inputs": (2, 64), "per_layer_dim": (1, 1 << 16), "per_layer_vocab": (1, 1 << 22),
    "laurel_rank": (1, 1 << 16), "kv_shared_layers": (0, 1023),
}


def describe(v: Any) -> str:
    """A value for an error message: its type and a short repr."""
    if v is None:
        return "null"
    text = repr(v)
    if len(text) > 60:
        text = text[:57] + "..."
    kind = {bool: "a bool", int: "an int", float: "a float", str: "a string", list: "a list",
            dict: "an object"}.get(type(v), f"a {type(v).__name__}")
    return f"{kind} {text}"


def _expected(what: str, lo: float | None, hi: float | None, open_lo: bool = False) -> str:
    if lo is not None and hi is not None:
        return f"{what} in {'(' if open_lo else '['}{lo}, {hi}]"
    if lo is not None:
        return f"{what} {'>' if open_lo else '>='} {lo}"
    if hi is not None:
        return f"{what} <= {hi}"
    return what


def as_int(v: Any, key: str, source: str, lo: int | None = None, hi: int | None = None) -> int:
    """v as an int in [lo, hi]; bools and floats are refused (30.0 is not a layer count)."""
    if isinstance(v, bool) or not isinstance(v, int) or (lo is not None and v < lo) \
            or (hi is not None and v > hi):
        raise ModelLoadError(f"[config] {source}: {key} is {describe(v)}; expected "
                             f"{_expected('an integer', lo, hi)}")
    return v


def as_float(v: Any, key: str, source: str, *, lo: float | None = None, gt: float | None = None,
             hi: float | None = None) -> float:
    """v (an int or a float, not a bool) as a finite float >= lo, > gt, <= hi."""
    ok = isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v) \
        and (lo is None or v >= lo) and (gt is None or v > gt) and (hi is None or v <= hi)
    if not ok:
        bound = gt if gt is not None else lo
        raise ModelLoadError(f"[config] {source}: {key} is {describe(v)}; expected "
                             f"{_expected('a finite number', bound, hi, open_lo=gt is not None)}")
    return float(v)


def as_bool(v: Any, key: str, source: str) -> bool:
    if not isinstance(v, bool):
        raise ModelLoadError(f"[config] {source}: {key} is {describe(v)}; expected true or false")
    return v


def as_str(v: Any, key: str, source: str) -> str:
    if not isinstance(v, str):
        raise ModelLoadError(f"[config] {source}: {key} is {describe(v)}; expected a string")
    return v


def as_list(v: Any, key: str, source: str, item: str) -> list:
    """v as a list whose items are all of kind `item` ("int", "str", "bool", "float": a finite
    number)."""
    kinds = {"int": lambda x: isinstance(x, int) and not isinstance(x, bool),
             "str": lambda x: isinstance(x, str), "bool": lambda x: isinstance(x, bool),
             "float": lambda x: isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)}
    if not isinstance(v, list):
        raise ModelLoadError(f"[config] {source}: {key} is {describe(v)}; expected a list of {item}")
    bad = next((i for i, x in enumerate(v) if not kinds[item](x)), None)
    if bad is not None:
        raise ModelLoadError(f"[config] {source}: {key}[{bad}] is {describe(v[bad])}; expected a "
                             f"list of {item}")
    return v


def as_count(v: Any, key: str, source: str, field: str) -> int:
    """An integer ModelConfig field read from `key`, in INT_RANGES[field]."""
    return as_int(v, key, source, *INT_RANGES[field])


def as_token_id(v: Any, key: str, source: str, vocab: int) -> int:
    """A special token id (bos, eos, pad, ...): an int inside the vocabulary."""
    if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v < vocab:
        raise ModelLoadError(f"[config] {source}: {key} is {describe(v)}; expected a token id in "
                             f"[0, {vocab - 1}] (the vocabulary has {vocab} tokens)")
    return v
