"""Decode rows in the gemm (Engine.load(batch_invariant=False), docs/BATCHING.md
"Decode rows in the gemm"): from the device's gemm_decode_rows decoding
sequences on, a step's projections run as one gemm. Each sequence's logits are
then checked against the float64 numpy forward of the same ids (as the one-
sequence path is), and against the batch-invariant engine: equal up to
rounding, not bit for bit (which shows the gemm ran). Below the threshold, and
in the default engine, nothing changes."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path
from metalkv.models import load_model

from .reference import llama_logits
from .test_batching import load, prompts, with_logits


def gemm_rows(engine) -> int:
    n = engine.device.properties["gemm_decode_rows"]
    if n == 0:
        pytest.skip("this device never runs decode rows as a gemm (DeviceProperties::gemm_decode_rows)")
    return n


@pytest.fixture(scope="module")
def fast(tiny_gguf):
    return load(tiny_gguf, batch_invariant=False)


@pytest.fixture(scope="module")
def invariant(tiny_gguf):
    return load(tiny_gguf)


def test_the_option_is_off_by_default_and_checked(fast, invariant):
    assert invariant.batch_invariant and not fast.batch_invariant
    with pytest.raises(metalkv.ArgumentError, match=r"batch_invariant='no': expected True or False"):
        metalkv.Engine.load(None, batch_invariant="no")


def test_a_batch_in_the_gemm_against_numpy(fast, invariant, tiny_gguf):
    """2 x gemm_decode_rows sequences of mixed prompt lengths (prefill chunks of 8
    beside the decode rows in the same steps), 12 greedy tokens each."""
    ps = prompts(2 * gemm_rows(fast), seed=21)
    kw = dict(max_tokens=12, stop_ids=())
    got = with_logits(fast, ps, kw, together=True)
    m = load_model(tiny_gguf, progress=False)
    differ = 0
    for p, (ids, logits), (ids_i, logits_i) in zip(ps, got, with_logits(invariant, ps, kw, together=False)):
        assert [int(np.argmax(r)) for r in logits] == ids  # greedy: each id from its own row
        ref = llama_logits(m, p + ids[:-1])[len(p) - 1:]
        np.testing.assert_allclose(logits, ref, rtol=0, atol=2e-3 * np.abs(ref).max())
        if ids == ids_i:  # the same tokens: the same logits up to float32 rounding
            np.testing.assert_allclose(logits, logits_i, rtol=0, atol=1e-4 * np.abs(logits_i).max())
            differ += not np.array_equal(logits, logits_i)
    assert differ > 0  # the gemm's sums, not the gemv's


def test_fewer_sequences_than_the_threshold_stay_bit_identical(fast, invariant):
    ps = prompts(gemm_rows(fast) - 1, seed=4) if gemm_rows(fast) > 1 else []
    kw = dict(max_tokens=10, stop_ids=())
    for (ids_b, logits_b), (ids_a, logits_a) in zip(with_logits(fast, ps, kw, True),
                                                    with_logits(invariant, ps, kw, False)):
        assert ids_b == ids_a
        np.testing.assert_array_equal(logits_b, logits_a)


def test_sliding_layers_and_qk_norm_in_the_gemm(tiny_sliding_dir):
    """Gemma 3 (ring layers, q/k norms over the gemm's and the gemv's rows): each
    sequence against the same sequence alone in a batch-invariant engine."""
    fast, alone = load(tiny_sliding_dir, batch_invariant=False), load(tiny_sliding_dir)
    ps = prompts(2 * gemm_rows(fast), seed=8)
    kw = dict(max_tokens=30, stop_ids=())
    compared = 0
    for (ids_b, logits_b), (ids_a, logits_a) in zip(with_logits(fast, ps, kw, True),
                                                    with_logits(alone, ps, kw, False)):
        same = next((i for i, (a, b) in enumerate(zip(ids_a, ids_b)) if a != b), len(ids_a))
        np.testing.assert_allclose(logits_b[:same + 1], logits_a[:same + 1], rtol=0,
                                   atol=1e-4 * np.abs(logits_a).max())
        compared += same
    assert compared >= len(ps) * 20  # near-ties may part a few sequences, not most


def test_serve_takes_the_flag():
    from metalkv.cli import _parser

    assert _parser().parse_args(["serve"]).batch_invariant is True
    assert _parser().parse_args(["serve", "--no-batch-invariant"]).batch_invariant is False
