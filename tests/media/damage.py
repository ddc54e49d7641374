"""Damaged copies of a valid file, for the refusal tests: a few random bytes of its head
overwritten, and a third of them cut short as well."""
from __future__ import annotations

import numpy as np


def damaged_copies(data: bytes, rng: np.random.Generator, n: int, head: int, max_flips: int):
    for _ in range(n):
        damaged = bytearray(data)
        for at in rng.integers(0, min(len(data), head), rng.integers(1, max_flips)):
            damaged[at] = rng.integers(0, 256)
        if rng.random() < 0.3:
            damaged = damaged[:rng.integers(1, len(damaged))]
        yield bytes(damaged)
