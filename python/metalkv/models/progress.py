"""Loading progress bars: tqdm on stderr, so stdout stays clean for generated text."""
from __future__ import annotations

import os
import sys
from typing import Iterable, TypeVar

T = TypeVar("T")


def shows_progress(progress: bool | None = None) -> bool:
    """progress=None: a bar only when stderr is a terminal and METALKV_NO_PROGRESS is
    unset; True/False force it on or off."""
    if progress is None:
        return not os.environ.get("METALKV_NO_PROGRESS") and sys.stderr.isatty()
    return bool(progress)


def progress_bar(items: Iterable[T], *, desc: str, progress: bool | None = None,
                 total: int | None = None, unit: str = "tensor") -> Iterable[T]:
    """items, through a tqdm bar on stderr when shows_progress(progress)."""
    if not shows_progress(progress):
        return items
    from tqdm import tqdm

    return tqdm(items, desc=desc, total=total, file=sys.stderr, unit=unit, leave=False)


class PromptProgress:
    """A progress(done, total) callback for Engine.generate/stream: a bar of prompt
    tokens on stderr for prompts of at least `least` tokens, when shows_progress()."""

    def __init__(self, desc: str = "reading the prompt", least: int = 256, progress: bool | None = None):
        self.desc, self.least, self.on = desc, least, shows_progress(progress)
        self.bar = None

    def __call__(self, done: int, total: int) -> None:
        if not self.on or total < self.least:
            return
        if self.bar is None:
            from tqdm import tqdm

            self.bar = tqdm(desc=self.desc, total=total, file=sys.stderr, unit="tok", leave=False)
        self.bar.total = total
        self.bar.update(done - self.bar.n)
        if done >= total:
            self.close()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
