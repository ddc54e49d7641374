"""The KV cache's formats as users give them (Engine.load, Engine.new_cache,
the CLI), resolved to one format per layer for K and for V.

    kv_k="q8", kv_v="q4"           every layer
    kv_k=["q8", "q4", ...]         one per layer
    kv_f16_layers=(0, -1)          these layers (negative: from the last) keep K and V at f16,
                                   whatever kv_k and kv_v say
    kv_rotate=True                 the quantized layers store K, V and the queries rotated by an
                                   orthonormal Hadamard transform (outliers spread over the head)
    kv_residual=128                each query reads its last 128 positions (and the block they
                                   start in) as f16 rows kept beside the quantized cache; None:
                                   128 when a layer is q2 (which needs a window), else 0

The formats themselves (bytes, groups, layout) are docs/KV_QUANT.md's; which
head_dims they take is checked by the C++ cache (ArgumentError naming kv_k or kv_v).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from .errors import argument_error

KV_FORMATS = ("f16", "q8", "q4", "q2")
DEFAULT_Q2_RESIDUAL = 128  # KIVI's window


@dataclass(frozen=True)
class KvFormats:
    """What a user asked for; per_layer() resolves it for a model."""
    kv_k: str | Sequence[str] = "f16"
    kv_v: str | Sequence[str] = "f16"
    kv_f16_layers: Sequence[int] = ()
    kv_rotate: bool = False
    kv_residual: int | None = None

    def check(self, op: str = "engine") -> "KvFormats":
        for name in ("kv_k", "kv_v"):
            value = getattr(self, name)
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, (list, tuple)) or not names or not all(n in KV_FORMATS for n in names):
                raise argument_error(op, name, value, "'f16', 'q8', 'q4' or 'q2', or a list of them (one per layer)")
        layers = self.kv_f16_layers
        if not isinstance(layers, (list, tuple)) or not all(isinstance(i, int) and not isinstance(i, bool)
                                                            for i in layers):
            raise argument_error(op, "kv_f16_layers", layers, "a list of layer indices (negative: from the last)")
        if not isinstance(self.kv_rotate, bool):
            raise argument_error(op, "kv_rotate", self.kv_rotate, "True or False")
        r = self.kv_residual
        if r is not None and (not isinstance(r, int) or isinstance(r, bool) or r < 0 or r % 32 or r >= 2**31):
            raise argument_error(op, "kv_residual", r, "None or an int >= 0, a multiple of 32 (tokens kept in f16)")
        return self

    def residual(self, n_layers: int) -> int:
        """The window in tokens: kv_residual, or by default 128 with a q2 layer, else 0."""
        if self.kv_residual is not None:
            return self.kv_residual
        k, v = self.per_layer(n_layers)
        return DEFAULT_Q2_RESIDUAL if "q2" in k + v else 0

    @property
    def quantized(self) -> bool:
        return any(f != "f16" for f in self._names(self.kv_k, 1) + self._names(self.kv_v, 1))

    def per_layer(self, n_layers: int, op: str = "engine") -> tuple[list[str], list[str]]:
        """(K formats, V formats), one per layer."""
        self.check(op)
        k, v = self._names(self.kv_k, n_layers), self._names(self.kv_v, n_layers)
        for name, got in (("kv_k", k), ("kv_v", v)):
            if len(got) != n_layers:
                raise argument_error(op, name, getattr(self, name), f"one format per layer: {n_layers} of them")
        for i in self.kv_f16_layers:
            if not -n_layers <= i < n_layers:
                raise argument_error(op, "kv_f16_layers", list(self.kv_f16_layers),
                                     f"layer indices in {-n_layers}..{n_layers - 1}")
            k[i] = v[i] = "f16"
        return k, v

    @staticmethod
    def _names(value, n_layers: int) -> list[str]:
        return [value] * n_layers if isinstance(value, str) else list(value)

    def describe(self, n_layers: int) -> str:
        """'K q8, V q4' or per layer where they differ, for logs and the CLI."""
        k, v = self.per_layer(n_layers)
        rot = ", rotated" if self.kv_rotate and self.quantized else ""
        if self.residual(n_layers):
            rot += f", residual {self.residual(n_layers)}"
        if len(set(k)) == 1 and len(set(v)) == 1:
            return f"K {k[0]}, V {v[0]}{rot}"
        return "K " + ",".join(k) + "; V " + ",".join(v) + rot

    def cache_kwargs(self, n_layers: int, op: str = "engine") -> dict:
        """The per-layer keywords of _core.Engine and _core.Engine.new_cache."""
        k, v = self.per_layer(n_layers, op)
        return {"kv_k": k, "kv_v": v, "kv_rotate": self.kv_rotate, "kv_residual": self.residual(n_layers)}


KV_POLICIES = ("streaming", "keynorm", "h2o", "snapkv", "pyramidkv")


@dataclass(frozen=True)
class KvPolicy:
    """An eviction policy as users give it (Engine.load, Engine.new_cache, the
    CLI; docs/KV_POLICIES.md):

        kv_policy="snapkv"     None (keep everything) or one of KV_POLICIES ("none": keep
                               everything, also where an engine's default says otherwise)
        kv_budget=1024         tokens each full layer keeps, or a fraction of the
                               context (0.25); None: a quarter of the context
        kv_sinks=4             the first positions, always kept
        kv_recent=None         the latest tokens always kept (None: the policy's default)
        kv_window=32           snapkv, pyramidkv: the queries whose attention picks what stays
        kv_prompt=None         'whole': hold each prompt whole (up to the cache's capacity) and
                               compress to the budget after it, the choice made by scores that
                               saw all of it (SnapKV as published; a prompt-sized peak);
                               'stream': evict as the prompt is stored (the budget from the
                               first token); None: snapkv and pyramidkv whole, the others stream
    """
    kv_policy: str | None = None
    kv_budget: int | float | None = None
    kv_sinks: int = 4
    kv_recent: int | None = None
    kv_window: int = 32
    kv_prompt: str | None = None

    def check(self, op: str = "engine") -> "KvPolicy":
        if self.kv_policy is not None and self.kv_policy not in KV_POLICIES + ("none",):
            raise argument_error(op, "kv_policy", self.kv_policy, "None, 'none' or one of " + ", ".join(KV_POLICIES))
        b = self.kv_budget
        if b is not None and (isinstance(b, bool) or not isinstance(b, (int, float))
                              or (isinstance(b, float) and not 0 < b <= 1) or (isinstance(b, int) and not 0 < b < 2**31)):
            raise argument_error(op, "kv_budget", b, "None, a token count >= 1 or a fraction of the context in (0, 1]")
        for name, least in (("kv_sinks", 0), ("kv_window", 1)):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or not least <= v < 2**31:
                raise argument_error(op, name, v, f"an int >= {least}")
        if self.kv_prompt not in (None, "whole", "stream"):
            raise argument_error(op, "kv_prompt", self.kv_prompt, "None, 'whole' or 'stream'")
        r = self.kv_recent
        if r is not None and (not isinstance(r, int) or isinstance(r, bool) or not 0 <= r < 2**31):
            raise argument_error(op, "kv_recent", r, "None or an int >= 0 (tokens)")
        return self

    def budget(self, context: int) -> int:
        """Tokens kept per full layer for a cache of `context` tokens."""
        b = 0.25 if self.kv_budget is None else self.kv_budget
        return max(1, int(b * context)) if isinstance(b, float) else b

    def core(self, context: int) -> dict | None:
        """The kv_policy argument of _core.Engine / new_cache (None: no policy)."""
        if self.kv_policy in (None, "none"):
            return None if self.kv_policy is None else {"policy": "none"}
        return {"policy": self.kv_policy, "budget": self.budget(context), "sinks": self.kv_sinks,
                "recent": -1 if self.kv_recent is None else self.kv_recent, "window": self.kv_window,
                "prompt": self.kv_prompt}

    def describe(self, context: int) -> str:
        if self.kv_policy in (None, "none"):
            return "none"
        return f"{self.kv_policy} {self.budget(context)} ({self.kv_sinks} sinks)"
