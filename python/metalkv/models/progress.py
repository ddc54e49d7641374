"""Loading progress bars: tqdm on stderr, so stdout stays clean for generated text."""
from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

T = TypeVar("T")


def progress_bar(items: Iterable[T], *, desc: str, progress: bool | None = None,
                 total: int | None = None) -> Iterable[T]:
    """progress=None shows a bar only when stderr is a terminal and
    METALKV_NO_PROGRESS is unset; True/False force it on or off."""
    if progress is None:
        progress = not os.environ.get("METALKV_NO_PROGRESS") and sys.stderr.isatty()
    if not progress:
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, file=sys.stderr, unit="tensor", leave=False)
