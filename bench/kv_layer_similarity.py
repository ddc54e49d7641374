"""How alike adjacent layers' K and V are, token by token (issue 15's MiniCache
question; docs/KV_POLICIES.md): MiniCache merges the KV states of layer l and
l - 1 from the middle of the stack up, keeping each token's direction (SLERP)
and each layer's magnitude, and only where the two agree. This measures that
agreement on the default model: per pair of adjacent layers, the mean cosine
similarity of a token's K (and V) rows per KV head, and the share of
(token, head) rows above 0.9, over the first `tokens` tokens of the novel fed
into an f16 cache. K is stored after RoPE, which rotates both layers' rows at
a position alike, so the cosine is RoPE's own.

    python bench/kv_layer_similarity.py [--tokens 1024] [--json FILE]
"""
from __future__ import annotations

import argparse
import json
import pathlib
import sys

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
TEXT = ROOT.parent / "shared" / "data" / "pride_and_prejudice.txt"


def rows(cache, layer: int) -> tuple[np.ndarray, np.ndarray]:
    """(K, V) float32 (n, n_kv_heads, head_dim) in position order."""
    table, n = cache.block_table(layer), cache.length(layer)
    slots = [table[p // 32] * 32 + p % 32 for p in range(n)]
    return (np.asarray(cache.keys(layer))[slots].astype(np.float32),
            np.asarray(cache.values(layer))[slots].astype(np.float32))


def cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return (a * b).sum(-1) / (np.linalg.norm(a, axis=-1) * np.linalg.norm(b, axis=-1) + 1e-12)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--json", default=None)
    a = p.parse_args()
    import metalkv
    from metalkv.ppl import text_ids

    eng = metalkv.Engine.load(device="auto", context=a.tokens + 8, kv_memory=None, progress=False)
    ids = text_ids(eng, str(TEXT), a.tokens)[:a.tokens]
    cache = eng.new_cache()
    eng.logits(ids, cache=cache)
    layers = [rows(cache, l) for l in range(cache.n_layers)]
    out = []
    print(f"# {cache.n_layers} layers, {a.tokens} tokens of Pride and Prejudice; cosine of a token's rows in "
          f"layers l-1 and l, per KV head")
    print(f"{'pair':>7} {'K mean':>7} {'K>0.9':>6} {'V mean':>7} {'V>0.9':>6}")
    for l in range(1, cache.n_layers):
        ck, cv = cosine(layers[l][0], layers[l - 1][0]), cosine(layers[l][1], layers[l - 1][1])
        row = dict(pair=[l - 1, l], k_mean=float(ck.mean()), k_above_09=float((ck > 0.9).mean()),
                   v_mean=float(cv.mean()), v_above_09=float((cv > 0.9).mean()))
        out.append(row)
        print(f"{l - 1:>3}-{l:<3} {row['k_mean']:7.3f} {100 * row['k_above_09']:5.1f}% {row['v_mean']:7.3f} "
              f"{100 * row['v_above_09']:5.1f}%")
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(dict(tokens=a.tokens, pairs=out), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
