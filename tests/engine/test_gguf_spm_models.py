"""The GGUF files people download for Gemma 3, Mistral and Phi-3 carry a SentencePiece
vocabulary (tokenizer.ggml.model = llama): a tiny model of each architecture, written as
llama.cpp's converter writes it (test_gguf_vs_hf.write_gguf_from_hf) with one of the
vocabularies of tests/data/llamacpp_vocabs.json, loads, tokenizes every recorded text as
llama.cpp did, and gives the logits of the same weights loaded from safetensors."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path
from models.tiny import write_hf_dir, write_safetensors

from .test_gguf_vs_hf import CASES, write_gguf_from_hf

VOCABS = json.loads((pathlib.Path(__file__).resolve().parents[1] / "data" / "llamacpp_vocabs.json")
                    .read_text(encoding="utf-8"))["vocabs"]


@pytest.mark.parametrize("name, vocab", [("gemma3", "noprefix"), ("mistral", "prefix"), ("phi3", "prefix")])
def test_a_sentencepiece_gguf_loads_tokenizes_as_llamacpp_and_runs(tmp_path, name, vocab):
    md = VOCABS[vocab]["metadata"]
    config = {**CASES[name], "vocab_size": len(md["tokenizer.ggml.tokens"]),
              "bos_token_id": md["tokenizer.ggml.bos_token_id"], "eos_token_id": md["tokenizer.ggml.eos_token_id"]}
    arrays = {k: v * 0.3 for k, v in write_hf_dir(tmp_path / "hf", config, dtype="F32").items()}
    for f in (tmp_path / "hf").glob("*.safetensors"):
        f.unlink()
    write_safetensors(tmp_path / "hf" / "model.safetensors", arrays, "F32")
    write_gguf_from_hf(tmp_path / "m.gguf", config, arrays, vocab=md)

    eng = metalkv.Engine.load(tmp_path / "m.gguf", device=TEST_DEVICE, context=64, progress=False)
    tok = eng.tokenizer
    for case in VOCABS[vocab]["cases"]:
        assert tok.encode(case["text"], add_special=False, parse_special=case["parse_special"]) == case["llamacpp"]
    ids = tok.encode("Mr. Darcy walked into the room.")
    assert ids[0] == md["tokenizer.ggml.bos_token_id"]
    hf = metalkv.Engine.load(tmp_path / "hf", device=TEST_DEVICE, context=64, progress=False).logits(ids)
    np.testing.assert_allclose(eng.logits(ids), hf, rtol=0, atol=1e-3 * np.abs(hf).max())
