"""The default model (SmolLM2-135M-Instruct, Q4_1 GGUF read in-kernel) against
independent references: a float64 numpy forward of the dequantized weights,
and llama.cpp's recorded logits and greedy ids (tests/data, written by
tools/record_llamacpp.py with the command in each file's header)."""
from __future__ import annotations

import numpy as np
import pytest

from metalkv.models import load_model

from .reference import llama_logits

# Measured: our logits sit within 0.006 of the float64 reference and of llama.cpp
# on F32 weights (logits range to ~27; float32 accumulation over 30 layers plus
# the float16 K/V cache). Steps whose reference top-2 margin is below 2 * TOL
# could flip either way; greedy ids are compared up to the first such step.
TOL = 0.02


def gens(data: dict) -> list[dict]:
    return data["generations"]


def test_logits_match_float64_reference(engine, default_gguf):
    m = load_model(default_gguf, progress=False)
    ids = [504, 3575, 282, 4649, 314]  # "The capital of France is"
    ref = llama_logits(m, ids)
    ours = engine.logits(ids)
    assert ours.shape == (5, m.config.vocab) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, ref, rtol=0, atol=TOL)


@pytest.mark.parametrize("i", range(4))
def test_logits_match_llamacpp_f32(engine, llamacpp_f32, i):
    g = gens(llamacpp_f32)[i]
    ours = engine.logits(g["prompt_ids"])
    assert list(ours.argmax(1)) == g["prompt_argmax"], g["name"]
    for t in g["first_step_top10"]:
        assert abs(ours[-1, t["id"]] - t["logit"]) < TOL, (g["name"], t)


def required_steps(margins: list[float], tol: float) -> int:
    """Steps up to (not including) the first whose top-2 margin is within 2 * tol."""
    return next((i for i, mg in enumerate(margins) if mg < 2 * tol), len(margins))


# The largest difference measured between our logits and llama.cpp's F32 ones
# (top-10 of the first step, four prompts): 0.006. Two logits can swap order only
# when the reference margin between them is below twice that.
MEASURED_F32_ERROR = 0.006


@pytest.mark.parametrize("i", range(4))
def test_greedy_matches_llamacpp_f32(engine, llamacpp_f32, i):
    g = gens(llamacpp_f32)[i]
    ref, margins = g["greedy_ids"], g["greedy_top1_margin"]
    ours = engine.generate_ids(g["prompt_ids"], max_tokens=len(ref), stop_ids=())
    assert len(ours) == len(ref) == 48
    first_diff = next((j for j, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    if first_diff is not None:  # allowed only where llama.cpp itself was undecided, past 16 tokens
        assert first_diff >= 16 and margins[first_diff] < 2 * MEASURED_F32_ERROR, \
            (g["name"], first_diff, margins[first_diff], ours, ref)


# llama.cpp on the Q4_1 file quantizes activations to 8 bits (Q8_1) before its
# Q4_1 dot products; measured, that moves its logits by up to 0.27 from the
# exact product of the file's weights (ours stays within 0.006), and by 0.38 from
# ours on the "code" prompt. So against that recording the tolerance is
# llama.cpp's, not ours.
LLAMACPP_Q8_ACTIVATION_TOL = 0.5


@pytest.mark.parametrize("i", range(4))
def test_close_to_llamacpp_on_the_q4_1_file(engine, llamacpp_q4_1, i):
    g = gens(llamacpp_q4_1)[i]
    ours = engine.logits(g["prompt_ids"])
    for t in g["first_step_top10"]:
        assert abs(ours[-1, t["id"]] - t["logit"]) < LLAMACPP_Q8_ACTIVATION_TOL, (g["name"], t)
    n = required_steps(g["greedy_top1_margin"], LLAMACPP_Q8_ACTIVATION_TOL)
    ids = engine.generate_ids(g["prompt_ids"], max_tokens=max(n, 1), stop_ids=())
    assert ids[:n] == g["greedy_ids"][:n], g["name"]
