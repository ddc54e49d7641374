"""Running one kernel from a test: numpy arrays in, numpy arrays out."""
from __future__ import annotations

import pathlib

import numpy as np

import metalkv

ROOT = pathlib.Path(__file__).resolve().parents[2]


def run(dev: metalkv.Device, kernel: str, args: list, threadgroups, threads,
        threadgroup_memory: dict[int, int] | None = None) -> list:
    """Dispatches `kernel` with args bound by buffer index.

    An ndarray becomes a buffer holding a copy; bytes are set with set_bytes;
    None leaves the index unbound. Returns, per index, the buffer's final
    contents as an array of the input's dtype and shape (None for bytes).
    """
    def as3(t):
        t = tuple(t) if isinstance(t, (tuple, list)) else (t,)
        return t + (1,) * (3 - len(t))

    cb = dev.command_buffer()
    enc = cb.compute()
    enc.set_pipeline(dev.pipeline(kernel))
    outs = []
    for index, a in enumerate(args):
        if isinstance(a, np.ndarray):
            buf = dev.buffer_from(np.ascontiguousarray(a))
            enc.set_buffer(index, buf)
            outs.append((buf, a.dtype, a.shape))
        else:
            if isinstance(a, bytes):
                enc.set_bytes(index, a)
            outs.append(None)
    for index, length in (threadgroup_memory or {}).items():
        enc.set_threadgroup_memory(index, length)
    enc.dispatch(as3(threadgroups), as3(threads))
    enc.end()
    cb.commit()
    cb.wait()
    return [None if o is None else o[0].numpy().view(o[1]).reshape(o[2]).copy() for o in outs]


def u32(*values: int) -> bytes:
    return np.array(values, dtype=np.uint32).tobytes()


def line_of(relpath: str, needle: str, after: str = "") -> int:
    """1-based line of the first `needle` (after the line holding `after`)."""
    lines = (ROOT / relpath).read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if after in l) if after else 0
    return next(i + 1 for i in range(start, len(lines)) if needle in lines[i])
