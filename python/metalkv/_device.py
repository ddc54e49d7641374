"""Opening a device: the one place a fallback of device="auto" becomes a warning."""
from __future__ import annotations

import warnings

from . import _core


def open_device(kind: str = "auto", *, fiber_order: str = "", seed: int = 0) -> "_core.Device":
    """A device of `kind`. 'auto' runs on the host executor when no GPU backend is
    usable, and warns when one is built but failed (e.g. Apple's compiler rejected a
    kernel source: the warning quotes it). 'metal' raises instead."""
    dev = _core.Device(kind, fiber_order=fiber_order, seed=seed)
    if dev.fallback:
        warnings.warn(f"metalkv: {dev.fallback}", RuntimeWarning, stacklevel=3)
    return dev
