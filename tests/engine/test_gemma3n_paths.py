"""Gemma 3n through the engine's two kinds of step without transformers (CI's sanitizer
build runs this file): a tiny random checkpoint (models/tiny.py gemma3n_config: AltUp,
LAuReL, per-layer inputs, sparse gates, 2 of 6 layers reading others' K and V) gives the
same logits prefilled in one chunk (gemm, prefill attention), in chunks of 5 and fed one
token a step (gemv, decode attention); a batch gives each sequence what it gets alone.
Parity with transformers: test_gemma3n.py."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path
from models.tiny import gemma3n_config, gemma3n_hf_shapes, write_safetensors

IDS = [int(i) for i in np.random.default_rng(4).integers(0, 64, 30)]  # ids past the per-layer table (48) too


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    import json

    d = tmp_path_factory.mktemp("gemma3n_paths")
    config = gemma3n_config(head_dim=32)
    (d / "config.json").write_text(json.dumps(config))
    rng = np.random.default_rng(0)
    arrays = {name: (rng.standard_normal(shape) * (0.5 if len(shape) == 1 else 0.3)).astype(np.float32)
              for name, shape in gemma3n_hf_shapes(config).items()}
    write_safetensors(d / "model.safetensors", arrays, "F32")
    return d


def load(d, **kw):
    return metalkv.Engine.load(d, device=TEST_DEVICE, context=64, progress=False, **kw)


def test_prefill_chunks_and_decode_steps_give_the_same_logits(model_dir):
    whole = load(model_dir).logits(IDS)
    scale = np.abs(whole).max()
    assert scale > 1  # (soft-capped at 30: the logits are not flat)
    for chunk in (5, 1):
        got = load(model_dir, prefill_chunk=chunk).logits(IDS)
        np.testing.assert_allclose(got, whole, rtol=0, atol=1e-3 * scale)  # float32 sums in other orders


def test_a_batch_gives_each_sequence_what_it_gets_alone(model_dir):
    eng = load(model_dir)
    prompts = [IDS, IDS[:11], IDS[7:25]]
    alone = [eng.generate_ids(p, max_tokens=12, stop_ids=()) for p in prompts]
    assert eng.generate_ids(prompts, max_tokens=12, stop_ids=()) == alone
