"""A numpy reference of the eviction policies (issue 15; cpp/kv/kv_policy.h):
the rule that picks one KV head's kept tokens, and the budget arithmetic of an
eviction, written for clarity and independent of the C++ code."""
from __future__ import annotations

import numpy as np

B = 32  # tokens per block


def default_recent(policy: dict, n_keep: int) -> int:
    sinks = policy.get("sinks", 4)
    free = max(0, n_keep - sinks)
    name = policy["policy"]
    if name == "streaming":
        return free
    recent = policy.get("recent", -1)
    if recent < 0:
        recent = {"h2o": n_keep // 2, "snapkv": policy.get("window", 32),
                  "pyramidkv": policy.get("window", 32)}.get(name, 32)
    return min(recent, free)


def pooled(policy: dict, positions: np.ndarray, scores: np.ndarray) -> np.ndarray:
    """snapkv: each score replaced by the largest within `pool` neighbouring
    positions (pool // 2 on each side, in position order)."""
    width = policy.get("pool", 7)
    if policy["policy"] not in ("snapkv", "pyramidkv") or width <= 1:
        return scores
    order = np.argsort(positions)
    s = scores[order]
    half = width // 2
    out = np.array([s[max(0, j - half):j + half + 1].max() for j in range(len(s))])
    result = np.empty_like(scores)
    result[order] = out
    return result


def select_kept(policy: dict, positions, scores, n_keep: int) -> list[int]:
    """Indices kept of one head: the sinks (position < sinks), then the most
    recent tokens, then the highest (pooled) scores, later positions first on
    ties (without scores: the latest)."""
    positions = np.asarray(positions, np.int64)
    n = len(positions)
    if n_keep >= n:
        return list(range(n))
    keep = set([i for i in range(n) if positions[i] < policy.get("sinks", 4)][:n_keep])  # (in index order)
    latest_first = sorted(range(n), key=lambda i: -positions[i])
    recent = [i for i in latest_first if i not in keep][:default_recent(policy, n_keep)]
    keep |= set(recent)
    if len(keep) < n_keep:  # streaming (no scores): the latest of the rest
        s = positions.astype(np.float64) if scores is None else pooled(policy, positions, np.asarray(scores, np.float64))
        rest = sorted((i for i in range(n) if i not in keep), key=lambda i: (-s[i], -positions[i]))
        keep |= set(rest[:n_keep - len(keep)])
    return sorted(keep)


def layer_budgets(policy: dict, windows: list[int]) -> list[int]:
    """Each layer's budget (0 for a sliding one). pyramidkv: PyramidKV's
    arithmetic split over the full layers, the first the most: above a fixed
    part (twice the window, and at least the sinks and 64), the last layer
    gets a twentieth of what is free and the first twice it less that, so the
    layers average the budget."""
    budget, full = policy["budget"], [l for l, w in enumerate(windows) if w == 0]
    out = [0] * len(windows)
    fixed = max(2 * policy.get("window", 32), policy.get("sinks", 4) + 64)
    if policy["policy"] != "pyramidkv" or len(full) < 2 or budget <= fixed:
        for l in full:
            out[l] = budget
        return out
    free = budget - fixed
    lo = free // 20
    hi = 2 * free - lo
    for i, l in enumerate(full):
        out[l] = fixed + hi - i * (hi - lo) // (len(full) - 1)
    return out


def keep_after_eviction(budget: int, n_new: int) -> int:
    """Tokens an eviction before a store of n_new keeps: room for the store in
    whole blocks, and at most the budget less a step of budget / 16 (whole
    blocks, at least one), rounded down to a block: big budgets evict more at a
    time, and one that is not a whole number of blocks still evicts a step.
    At least one block where the room has it."""
    step = max(B, budget // 16 // B * B)
    room = (budget - n_new) // B * B
    below = max(0, budget - step) // B * B
    return max(min(room, below), min(room, B))


class HeadState:
    """The positions one KV head of an evicting layer holds (as a set: the
    cache's index order is its own), stepped through stores like the cache."""

    def __init__(self, policy: dict, budget: int):
        self.policy, self.budget, self.held, self.next = policy, budget, [], 0

    def store(self, n_new: int, scores_of=None) -> None:
        """scores_of(positions) -> scores, for a scoring policy."""
        if len(self.held) + n_new > self.budget:
            keep = keep_after_eviction(self.budget, n_new)
            pos = np.array(self.held)
            s = scores_of(pos) if scores_of else None
            self.held = [self.held[i] for i in select_kept(self.policy, pos, s, keep)]
        self.held += list(range(self.next, self.next + n_new))
        self.next += n_new
