"""The KV cache's options as users give them (Engine.load, Engine.new_cache, the CLI, a saved
cache): every name, default, choice and check lives in C++ (cpp/kv/kv_options.h, bound as
_core.KvOptions, with _core.KV_OPTIONS listing them); Python only forwards them.

    kv_k="q8", kv_v="q4"           every layer; or one per layer (a list)
    kv_f16_layers=(0, -1)          these layers keep K and V at f16 (negative: from the last)
    kv_rotate=True                 the quantized layers store K, V and queries Hadamard-rotated
    kv_residual=128                each query reads its last 128 positions as f16 rows kept beside
                                   the quantized cache; None: 128 with q2, else 0
    kv_policy="snapkv"             evict to a budget (docs/KV_POLICIES.md): kv_budget (tokens, or a
                                   fraction of the context; None: 0.25), kv_sinks, kv_recent,
                                   kv_window, kv_prompt ('whole' | 'stream' | None: the policy's)
    kv_memory="4GB"                the engine's shared pool ('auto', None or 0: each cache its own)
"""
from __future__ import annotations

from . import _core

KV_FORMATS: tuple[str, ...] = _core.KV_FORMATS
KV_POLICIES: tuple[str, ...] = _core.KV_POLICIES
KV_OPTIONS: list[dict] = _core.KV_OPTIONS  # name, metavar, choices, default (as shown), help


def kv_options(op: str = "engine", **given) -> "_core.KvOptions":
    """_core.KvOptions of the keywords given (None: not given), checked in the words of `op`."""
    return _core.KvOptions(op, **given)
