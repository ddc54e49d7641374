"""A by-position numpy reference of what a metalkv.KVCache layer holds, and the
check that reads a layer back against it (tests/kv/test_kvcache*.py)."""
from __future__ import annotations

import numpy as np

from metalkv._core import BLOCK_TOKENS as B

from .test_rope import rope_ref

F16_BYTES = 2
TABLE_ENTRY_BYTES = 4  # uint32 block id


def rows(rng, *shape):
    return rng.uniform(-2, 2, shape).astype(np.float32)


def pool_blocks(window, capacity, max_chunk):
    """The spec: capacity's blocks for a full layer; a sliding one holds the window,
    a chunk and max_chunk positions of history, over at most one block more."""
    full = -(-capacity // B)
    return full if window == 0 else min(full, -(-(window + 2 * max_chunk - 1) // B) + 1)


class Reference:
    """What a layer should hold: the float16 K and V row of each position, and
    first_held, the first position it holds. A sliding table lets go of each block
    wholly before max(0, L - W + 1 - max_chunk), L its length when an append starts."""

    def __init__(self, n_kv, d, window=0, max_chunk=1):
        self.k = np.zeros((0, n_kv, d), np.float16)
        self.v = np.zeros((0, n_kv, d), np.float16)
        self.window, self.max_chunk, self.first_held = window, max_chunk, 0

    @property
    def n(self):
        return len(self.k)

    def append(self, k, v):
        """k, v: the rows as the cache should hold them (cast to float16 here)."""
        if self.window:
            first_kept = max(0, self.n - self.window + 1 - self.max_chunk)
            self.first_held = max(self.first_held, first_kept // B * B)
        self.k = np.concatenate([self.k, np.asarray(k).astype(np.float16)])
        self.v = np.concatenate([self.v, np.asarray(v).astype(np.float16)])

    def truncate(self, n):
        self.k, self.v = self.k[:n], self.v[:n]


def check(cache, layer, ref, rotary_dim=0):
    """The layer holds exactly positions first_held .. n-1, each in the one slot
    block_table() gives it, with ref's rows: V exact, K exact past rotary_dim and
    within 1 half ulp before it (float32 vs float64 rotation). Returns the positions."""
    n, pos, slots = cache.length(layer), cache.positions(layer), cache.slots(layer)
    assert n == ref.n and pos.shape == (slots,) and slots % B == 0
    held = np.nonzero(pos >= 0)[0]
    held = held[np.argsort(pos[held], kind="stable")]
    p = pos[held]
    assert list(p) == list(range(ref.first_held, n)), (layer, ref.first_held, n)  # contiguous, each once
    if ref.window:
        assert ref.first_held <= max(0, n - ref.window + 1)  # the next query's window is there
    table = cache.block_table(layer)
    blocks = [b for b in table if b >= 0]
    assert len(set(blocks)) == len(blocks) <= slots // B and all(b < slots // B for b in blocks)
    assert list(held) == [table[q // B] * B + q % B for q in p]
    k, v = cache.keys(layer)[held], cache.values(layer)[held]
    np.testing.assert_array_equal(v, ref.v[p])
    np.testing.assert_array_equal(k[..., rotary_dim:], ref.k[p][..., rotary_dim:])
    np.testing.assert_allclose(k[..., :rotary_dim].astype(np.float32), ref.k[p][..., :rotary_dim].astype(np.float32),
                               rtol=2.0 ** -10, atol=2.0 ** -24)
    return p


def append_all(cache, refs, k, v, rope=None):
    """One append_all_layers step, into the cache and into every layer's reference."""
    cache.append_all_layers(k, v, rope=rope)
    for ref, kl, vl in zip(refs, k, v):
        ref.append(rope_rows(kl, ref.n, rope), vl)


def rope_rows(k, first_pos, rope):
    """k rotated as the store should (None: as is), in float64."""
    if rope is None:
        return k
    rd = rope.get("rotary_dim", 2 * len(rope["inv_freq"]))
    return rope_ref(k, range(first_pos, first_pos + len(k)), rope["inv_freq"], rope["style"], rd)
