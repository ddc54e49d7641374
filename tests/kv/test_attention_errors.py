"""The attention ops' checks (metalkv._core.ops.attention_*): every bad shape,
buffer and table is refused with a message naming it, before anything runs."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv._core import ops

from devices import test_device  # tests/ is on sys.path


def _decode_kwargs(**over):
    kw = dict(n_q_heads=8, n_kv_heads=2, head_dim=64, n_tokens=10, slots=32)
    kw.update(over)
    return kw


@pytest.mark.parametrize("over,message", [
    (dict(head_dim=48), r"\[attention_decode\] head_dim 48 is not supported; expected "
                        r"32, 64, 80, 96, 112, 128, 160, 192 or 256"),
    (dict(head_dim=576), r"head_dim 576 is not supported"),
    (dict(n_kv_heads=3), r"n_q_heads 8 is not a multiple of n_kv_heads 3"),
    (dict(n_kv_heads=0), r"must both be at least 1"),
    (dict(n_tokens=0), r"\[attention_decode\] n_tokens is 0"),
    (dict(slots=0), r"slots is 0"),
    (dict(slots=48), r"slots 48 is not a multiple of the block size 32 \(a pool holds whole blocks\)"),
    (dict(scale=0.0), r"scale 0\.0+ must be finite and > 0"),
    (dict(softcap=-1.0), r"softcap -1\.0+ must be finite and >= 0"),
    (dict(chunks=3), r"split_chunks 3 applies only with split 'always'"),
    (dict(chunks=513, split="always"), r"split_chunks 513 is more than the 512 chunks the reduce merges"),
    (dict(variant="nopf"), r"decode_variant 'nopf' exists for head_dim 128 only, not 64"),
    (dict(variant="u8"), r"decode_variant 'u8' is not one of '' \(the device's shape\), 'gpu', 'host' or 'nopf'"),
])
def test_decode_bad_shapes(over, message):
    dev = test_device()
    kw = _decode_kwargs(**over)
    buf = dev.buffer(1 << 16)
    with pytest.raises(metalkv.GpuError, match=message):
        ops.attention_decode(dev, buf, buf, buf, buf, **kw)


def test_host_shape_is_the_host_executors_only():
    """variant 'host' (the _h kernels) runs where they are built, the host
    executor; any other device refuses it by name."""
    dev = test_device()
    kw = _decode_kwargs()
    buf = dev.buffer(1 << 16)
    if dev.kind == "host":
        ops.attention_decode(dev, buf, buf, buf, buf, variant="host", **kw)
    else:
        with pytest.raises(metalkv.GpuError, match=r"decode_variant 'host' is the host executor's shape, "
                                                   r"not built for " + dev.kind):
            ops.attention_decode(dev, buf, buf, buf, buf, variant="host", **kw)


def test_decode_bad_buffers():
    dev = test_device()
    kw = _decode_kwargs()
    big = dev.buffer(1 << 16)
    with pytest.raises(metalkv.GpuError, match=r"\[attention_decode\] q needs 2048 bytes at offset 0 "
                                               r"but the buffer has 100"):
        ops.attention_decode(dev, dev.buffer(100), big, big, big, **kw)
    with pytest.raises(metalkv.GpuError, match=r"kv needs 16384 bytes at offset 60000"):
        ops.attention_decode(dev, big, big, big, big, kv_offset=60000, **kw)
    with pytest.raises(metalkv.GpuError, match=r"kv offset 6 is not a multiple of 8"):
        ops.attention_decode(dev, big, big, big, big, kv_offset=6, **kw)
    with pytest.raises(metalkv.GpuError, match=r"kv offset 8 is not a multiple of 16 \(decode reads"):
        ops.attention_decode(dev, big, big, big, big, kv_offset=8, **kw)
    with pytest.raises(metalkv.GpuError, match=r"sinks needs 32 bytes"):
        ops.attention_decode(dev, big, big, big, big, sinks=dev.buffer(8), **kw)
    with pytest.raises(metalkv.GpuError, match=r"scratch \(attention_decode_scratch_bytes\) needs"):
        ops.attention_decode(dev, big, big, big, big, split="always", scratch=dev.buffer(4), **kw)
    with pytest.raises(ValueError, match=r"split 'sometimes' is not one of"):
        ops.attention_decode(dev, big, big, big, big, split="sometimes", **kw)
    # The table: one uint32 per 32 positions, each naming a block of the pool.
    with pytest.raises(ValueError, match=r"\[attention_decode\] table needs 2 uint32 entries"):
        ops.attention_decode(dev, big, big, dev.buffer(4), big, **{**kw, "n_tokens": 40})
    with pytest.raises(ValueError, match=r"table entry 1 is block 5; the pool has 2 blocks"):
        ops.attention_decode(dev, big, big, dev.buffer_from(np.array([0, 5], np.uint32)), big,
                             **{**kw, "n_tokens": 40, "slots": 64})


def test_prefill_bad_shapes():
    dev = test_device()
    buf = dev.buffer(1 << 16)
    kw = dict(n_q_heads=4, n_kv_heads=2, head_dim=64, q_pos0=0, slots=32)
    with pytest.raises(metalkv.GpuError, match=r"\[attention_prefill\] head_dim 40 is not supported; "
                                               r"expected 32, 64, .* or 256"):
        ops.attention_prefill(dev, buf, buf, buf, buf, n_queries=4, **{**kw, "head_dim": 40})
    with pytest.raises(metalkv.GpuError, match=r"\[attention_prefill\] n_queries 0 must be between"):
        ops.attention_prefill(dev, buf, buf, buf, buf, n_queries=0, **kw)
    with pytest.raises(metalkv.GpuError, match=r"slots 16 is not a multiple of the block size 32"):
        ops.attention_prefill(dev, buf, buf, buf, buf, n_queries=10, **{**kw, "slots": 16})
    with pytest.raises(ValueError, match=r"\[attention_prefill\] table entry 0 is block 1; the pool has 1"):
        ops.attention_prefill(dev, buf, buf, dev.buffer_from(np.array([1], np.uint32)), buf, n_queries=8, **kw)
    with pytest.raises(metalkv.GpuError, match=r"\[attention_prefill\] out needs 8192 bytes"):
        ops.attention_prefill(dev, buf, buf, buf, dev.buffer(64), n_queries=8, **kw)
