"""What the tower loaders (vision.py, mmproj.py, audio.py, vision3n.py) share: their canonical
tensors into a _core.Weights, what every tower object answers from its core, and the rows of a
Gemma 3n embedder's hard tokens."""
from __future__ import annotations

from typing import Mapping

import numpy as np

from .. import _core


def core_weights(device, tensors: Mapping[str, tuple[str, np.ndarray]]) -> "_core.Weights":
    """{canonical name: (dtype, array)} as a _core.Weights on `device` (copied, C order)."""
    weights = _core.Weights(device)
    for name, (dtype, a) in tensors.items():
        a = np.ascontiguousarray(a)
        weights.add(name, dtype, list(a.shape), a.reshape(-1).view(np.uint8))
    return weights


class CoreTower:
    """A tower on a device: _core is its _core.Siglip, MobileNet or Conformer."""

    _core: object

    @property
    def weights_nbytes(self) -> int:
        return self._core.weights_nbytes


class ImageTower(CoreTower):
    """A vision tower: its core makes tokens_per_image soft tokens of each image."""

    @property
    def tokens_per_image(self) -> int:
        return self._core.tokens_per_image


class HardRows:
    """A Gemma 3n tower's embedder rows of its hard tokens: vocab_offset is the first id of its
    vocabulary, _hard its rows ((vocab, text_hidden), the core's hard_rows())."""

    vocab_offset: int
    _hard: np.ndarray

    def hard_row(self, token_id: int) -> np.ndarray | None:
        """The embedder's row (text_hidden) of a token id of its vocabulary, None for another id."""
        j = token_id - self.vocab_offset
        return self._hard[j] if 0 <= j < len(self._hard) else None
