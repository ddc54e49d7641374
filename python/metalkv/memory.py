"""Engine.memory(): where an engine's bytes are (docs/KV_CACHE.md, "Every byte counted").

    {"device": {"live": ..., "peak": ...},      # every buffer of the device (Device.memory_use)
     "weights": ...,                            # the model's tensors on the device
     "kv": {"kv_memory": ..., "used": ..., "peak": ..., "sequences": ...,
            "pool": {"bytes": ..., "used": ..., "free": ..., "cached": ..., "evictable": ...}},
     "tiers": {"host": {...}, "disk": {...}, "redis": {...}}}   # with a prefix store

kv_memory is a hard cap: "used" counts every KV byte on the device now (the pool's
buffers, and each running sequence's own: residual rings, block-table mirrors, sampling
buffers) and never passes it; "peak" is the most it has held. The pool's "used" bytes are
the blocks some cache holds, "cached" those the prefix cache keeps (held or not),
"evictable" cached blocks nobody holds (free, kept until a new block needs their room).
"""
from __future__ import annotations


def memory_report(engine) -> dict:
    out = {"device": dict(engine.device.memory_use), "weights": engine.weights_nbytes}
    pool = engine.kv_pool
    if pool is not None:
        def blocks(key):
            return sum(g[key] * g["block_bytes"] for g in pool["groups"])
        out["kv"] = {"kv_memory": pool["kv_memory"], "used": pool["used_bytes"], "peak": pool["peak_bytes"],
                     "sequences": pool["sequence_bytes"],
                     "pool": {"bytes": pool["nbytes"], "used": blocks("blocks") - blocks("free_blocks"),
                              "free": blocks("free_blocks"), "cached": blocks("cached_blocks"),
                              "evictable": blocks("evictable_blocks")}}
    store = getattr(engine, "prefix_store", None)
    if store is not None:
        out["tiers"] = store.tiers()
    return out
