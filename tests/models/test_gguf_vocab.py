"""GGUF vocabularies against llama.cpp (tests/data/llamacpp_vocabs.json, recorded by
tools/record_llamacpp_vocabs.py with llama-cpp-python):

- two small SentencePiece vocabularies trained with sentencepiece and written as
  llama.cpp's converter writes them, with the ids of llama.cpp, of sentencepiece itself
  and of the tokenizer.json transformers makes from the .model. metalkv follows llama.cpp
  exactly; the other two differ from it in the known places only (docs/MODELS.md,
  "GGUF vocabularies");
- the default model's byte-level BPE vocabulary under 17 tokenizer.ggml.pre names.

tools/check_llamacpp_vocabs.py runs the same comparison on llama.cpp's own test
vocabularies (Llama 2, Phi-3 and the BPE families' real vocabularies)."""
from __future__ import annotations

import json
import pathlib

import pytest

from metalkv.models import ModelLoadError, Tokenizer
from metalkv.models.gguf_loader import check_vocab_metadata

from metalkv.models.gguf_file import read_gguf

REF = json.loads((pathlib.Path(__file__).resolve().parents[1] / "data" / "llamacpp_vocabs.json")
                 .read_text(encoding="utf-8"))
VOCABS = REF["vocabs"]
CASES = [(name, i) for name, v in VOCABS.items() for i in range(len(v["cases"]))]
BPE = REF["bpe"]["cases"]


@pytest.fixture(scope="module")
def toks() -> dict[str, Tokenizer]:
    out = {}
    for name, v in VOCABS.items():
        check_vocab_metadata(v["metadata"], name)
        out[name] = Tokenizer.from_gguf_metadata(v["metadata"])
    return out


def added_tokens(name: str) -> list[str]:
    md = VOCABS[name]["metadata"]
    return [t for t, k in zip(md["tokenizer.ggml.tokens"], md["tokenizer.ggml.token_type"]) if k in (3, 4)]


@pytest.mark.parametrize("name, i", CASES, ids=[f"{n}-{i}" for n, i in CASES])
def test_encode_matches_llamacpp(toks, name, i):
    case = VOCABS[name]["cases"][i]
    assert toks[name].encode(case["text"], add_special=False, parse_special=case["parse_special"]) \
        == case["llamacpp"]


def test_sentencepiece_agrees_where_no_added_token_is_in_the_text():
    """sentencepiece matches its user-defined pieces in the middle of text, while llama.cpp
    cuts the text at them and starts the rest with "▁" again (add_space_prefix); elsewhere
    the two are the same algorithm, and every case here agrees."""
    n = 0
    for name, v in VOCABS.items():
        words = added_tokens(name)
        for case in v["cases"]:
            if not any(w in case["text"] for w in words):
                assert case["sentencepiece"] == case["llamacpp"], (name, case["text"])
                n += 1
    assert n > 100


def test_transformers_differs_only_on_leading_spaces_and_added_tokens():
    """HF's Llama tokenizer (Metaspace, prepend "first") gives one "▁" to a text that starts
    with a space, where llama.cpp and sentencepiece prepend another; and its added tokens
    split like llama.cpp's. On text that starts with neither it agrees."""
    n = 0
    for name, v in VOCABS.items():
        words = added_tokens(name)
        for case in v["cases"]:
            t = case["text"]
            if t[:1] not in (" ", "\t", "\n") and not any(w in t for w in words):
                assert case["hf"] == case["llamacpp"], (name, t)
                n += 1
    assert n > 100


@pytest.mark.parametrize("name", sorted(VOCABS))
def test_decode_gives_the_text_back(toks, name):
    """Byte fallback and "▁" undone; a leading "▁" that add_space_prefix put there is dropped.
    (Text after an added token got a "▁" of its own, which decoding keeps, as llama.cpp does.)"""
    tok, words = toks[name], added_tokens(name)
    for case in VOCABS[name]["cases"]:
        if not any(w in case["text"] for w in words):
            assert tok.decode(case["llamacpp"]) == case["text"], case["text"]


def test_bos_and_space_prefix_follow_the_file(toks):
    prefix, noprefix = toks["prefix"], toks["noprefix"]
    bos = VOCABS["prefix"]["metadata"]["tokenizer.ggml.bos_token_id"]
    assert prefix.add_bos and prefix.encode("Elizabeth")[0] == bos  # SentencePiece's default
    assert prefix.encode("Elizabeth", add_special=False) == prefix.encode(" Elizabeth", add_special=False)[1:]
    assert noprefix.encode("x", add_special=False) != noprefix.encode(" x", add_special=False)


def test_a_sentencepiece_vocabulary_without_scores_is_refused_by_name():
    md = dict(VOCABS["prefix"]["metadata"])
    md["tokenizer.ggml.scores"] = md["tokenizer.ggml.scores"][:-1]
    with pytest.raises(ModelLoadError, match=r"x.gguf: tokenizer.ggml.scores has \d+ entries for \d+ tokens"):
        check_vocab_metadata(md, "x.gguf")
    md["tokenizer.ggml.scores"] = ["high"] * len(md["tokenizer.ggml.tokens"])
    with pytest.raises(ModelLoadError, match=r"tokenizer.ggml.scores\[0\] is .*expected a list of float"):
        check_vocab_metadata(md, "x.gguf")


@pytest.mark.parametrize("pre", sorted(BPE))
def test_bpe_pre_tokenizers_match_llamacpp(default_gguf, pre):
    """The default model's vocabulary and merges, split by `pre`'s steps: every string
    (digits, contractions, case runs, CJK, white space, control tokens) as llama.cpp."""
    md = dict(read_gguf(default_gguf).metadata)
    md["tokenizer.ggml.pre"] = pre
    tok = Tokenizer.from_gguf_metadata(md)
    got = [tok.encode(c["text"], add_special=False, parse_special=c["parse_special"]) for c in BPE[pre]]
    want = [c["llamacpp"] for c in BPE[pre]]
    assert got == want


def test_a_gguf_model_with_a_sentencepiece_vocabulary_loads_and_tokenizes_as_llamacpp(tmp_path):
    """A whole (tiny, llama-architecture: Llama 2, Mistral) model file carrying the Llama-2-like
    vocabulary: load_model builds its tokenizer from the file and splits text as llama.cpp."""
    from gguf import GGUFValueType as T

    from metalkv.models import load_model

    from .tiny import write_gguf

    md = VOCABS["prefix"]["metadata"]
    f = tmp_path / "spm-llama.gguf"
    write_gguf(f, vocab=len(md["tokenizer.ggml.tokens"]), tokens=md["tokenizer.ggml.tokens"], set_kv={
        "tokenizer.ggml.model": ("llama", T.STRING),
        "tokenizer.ggml.pre": ("default", T.STRING),
        "tokenizer.ggml.scores": (md["tokenizer.ggml.scores"], T.ARRAY, T.FLOAT32),
        "tokenizer.ggml.token_type": (md["tokenizer.ggml.token_type"], T.ARRAY, T.INT32),
        "tokenizer.ggml.bos_token_id": (md["tokenizer.ggml.bos_token_id"], T.UINT32),
        "tokenizer.ggml.eos_token_id": (md["tokenizer.ggml.eos_token_id"], T.UINT32),
        "tokenizer.ggml.unknown_token_id": (md["tokenizer.ggml.unknown_token_id"], T.UINT32)})
    m = load_model(f, progress=False)
    tok = m.tokenizer
    for case in VOCABS["prefix"]["cases"]:
        assert tok.encode(case["text"], add_special=False, parse_special=case["parse_special"]) == case["llamacpp"]
    assert tok.add_bos and tok.encode("Darcy")[0] == md["tokenizer.ggml.bos_token_id"]
    # </s>, and <|end|>: a text llama.cpp ends generation on (config.EOG_TEXTS)
    assert m.config.eos_ids == (md["tokenizer.ggml.eos_token_id"], md["tokenizer.ggml.tokens"].index("<|end|>"))
