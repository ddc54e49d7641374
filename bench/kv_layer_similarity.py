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
    python bench/kv_layer_similarity.py --tokens 1024 --merge 15 6 --next 512 [--retain 0.05]

--merge L ...: what merging costs, decode-time. For each L, a cache of the
first `tokens` tokens has each pair of layers (L, L+1), (L+2, L+3), ...
merged as MiniCache merges them: per (token, KV head) the two rows' unit
directions SLERP-ed half way into one shared direction, each layer keeping its
own row's norm, except the `retain` share of rows that disagree most (lowest
cosine), which stay as they were. The merged rows are written back into the
cache and the next `next` tokens are scored through it, 32 at a time, beside
the unmerged cache: the perplexity change, and the KV a merged store would
save (a merged pair keeps one direction per token, its retained rows and two
norms) as a ratio of the f16 cache's bytes.
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


def slerp_half(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The unit direction half way between a's and b's (rows of the last axis)."""
    ua = a / (np.linalg.norm(a, axis=-1, keepdims=True) + 1e-12)
    ub = b / (np.linalg.norm(b, axis=-1, keepdims=True) + 1e-12)
    theta = np.arccos(np.clip((ua * ub).sum(-1, keepdims=True), -1.0, 1.0))
    s = np.sin(theta)
    w = np.where(s > 1e-6, np.sin(0.5 * theta) / np.maximum(s, 1e-12), 0.5)  # (equal weights: the same angle)
    d = w * (ua + ub)
    return d / (np.linalg.norm(d, axis=-1, keepdims=True) + 1e-12)


def merge_pair(x0: np.ndarray, x1: np.ndarray, retain: float) -> tuple[np.ndarray, np.ndarray]:
    """Two layers' rows (n, heads, dim) merged: the shared direction at each
    layer's norm, the `retain` share of (token, head) rows with the lowest
    cosine kept as they were."""
    d = slerp_half(x0, x1)
    m0 = d * np.linalg.norm(x0, axis=-1, keepdims=True)
    m1 = d * np.linalg.norm(x1, axis=-1, keepdims=True)
    cos = cosine(x0, x1)
    if retain > 0:
        keep = cos <= np.quantile(cos, retain)
        m0[keep], m1[keep] = x0[keep], x1[keep]
    return m0, m1


def nll(eng, cache, ids) -> float:
    """Mean negative log-likelihood of ids[1:] fed 32 at a time after the cache."""
    from metalkv.ppl import log_softmax

    total, n = 0.0, 0
    for a in range(0, len(ids) - 1, 32):
        chunk = ids[a:a + 32]
        lp = log_softmax(eng.logits(chunk, cache=cache))
        targets = ids[a + 1:a + 1 + len(chunk)]
        total -= float(lp[np.arange(len(targets)), targets].sum())
        n += len(targets)
    return total / n


def merge_runs(eng, ids, tokens: int, n_next: int, starts: list[int], retain: float) -> list[dict]:
    def prefilled():
        c = eng.new_cache()
        eng.logits(ids[:tokens], cache=c)
        return c

    rest = ids[tokens - 1:tokens + n_next]  # (the last prompt id again: its logits predict the first)
    base_cache = prefilled()
    base_cache.truncate(tokens - 1)
    base = nll(eng, base_cache, rest)
    out = []
    n_layers = base_cache.n_layers
    for start in starts:
        c = prefilled()
        pairs = [(l, l + 1) for l in range(start, n_layers - 1, 2)]
        for l0, l1 in pairs:
            for kv in (0, 1):
                x0, x1 = rows(c, l0)[kv], rows(c, l1)[kv]
                for layer, m in zip((l0, l1), merge_pair(x0, x1, retain)):
                    data, params = (np.asarray(t) for t in c.read_rows(layer, kv, 0, tokens))
                    c.write_rows(layer, kv, 0, np.ascontiguousarray(m.astype(np.float16).reshape(tokens, -1).view(np.uint8)),
                                 params)
        c.truncate(tokens - 1)
        got = nll(eng, c, rest)
        # a merged pair stores one direction row, its retained rows and two norms per (token, head)
        row = base_cache.head_dim * 2
        pair_bytes = 2 * row * (1 - retain) / 2 + 2 * row * retain + 2 * 2 * 2
        ratio = n_layers * row / ((n_layers - 2 * len(pairs)) * row + len(pairs) * pair_bytes)
        out.append(dict(merge_from=start, pairs=[list(p) for p in pairs], retain=retain, tokens=tokens, next=n_next,
                        ppl=float(np.exp(got)), ppl_base=float(np.exp(base)), ppl_change=float(np.exp(got - base) - 1),
                        kv_ratio=ratio))
        print(f"merge from layer {start:>2} ({len(pairs)} pairs, retain {100 * retain:.0f} %): PPL {np.exp(got):.3f} vs "
              f"{np.exp(base):.3f} unmerged ({100 * (np.exp(got - base) - 1):+.1f} %), {ratio:.2f}x less KV", flush=True)
    return out


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--json", default=None)
    p.add_argument("--merge", type=int, nargs="*", default=[], metavar="L", help="merge pairs from layer L up")
    p.add_argument("--next", type=int, default=512, help="tokens scored after a merge (default 512)")
    p.add_argument("--retain", type=float, default=0.05, help="share of rows kept unmerged (default 0.05)")
    a = p.parse_args()
    import metalkv
    from metalkv.ppl import text_ids

    eng = metalkv.Engine.load(device="auto", context=a.tokens + a.next + 8, kv_memory=None, progress=False)
    all_ids = text_ids(eng, str(TEXT), a.tokens + a.next)
    ids = all_ids[:a.tokens]
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
    merges = merge_runs(eng, all_ids, a.tokens, a.next, a.merge, a.retain) if a.merge else []
    if a.json:
        pathlib.Path(a.json).write_text(json.dumps(dict(tokens=a.tokens, pairs=out, merges=merges,
                                                        command=" ".join(sys.argv)), indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
