"""Our Tokenizer against llama.cpp's own tokenization of the same GGUF
(tests/data/llamacpp_smollm2.json, recorded by tools/record_llamacpp.py), and
the streaming detokenizer."""
from __future__ import annotations

import json
import pathlib

import pytest

from metalkv.models import IncrementalDetokenizer, ModelLoadError, Tokenizer
from metalkv.models import gguf_vocab

REF = json.loads((pathlib.Path(__file__).resolve().parents[1] / "data" / "llamacpp_smollm2.json")
                 .read_text(encoding="utf-8"))
CASES = REF["tokenize"]
GENERATIONS = REF["generations"]


@pytest.fixture(scope="module")
def tok(smollm) -> Tokenizer:
    return smollm.tokenizer


def test_reference_settings():
    # the recording used no BOS (SmolLM2's GGUF says add_bos_token = false)
    assert REF["settings"]["add_bos"] is False and len(CASES) >= 70


@pytest.mark.parametrize("case", CASES, ids=[f"{i}-{'sp' if c['parse_special'] else 'txt'}"
                                              for i, c in enumerate(CASES)])
def test_encode_matches_llamacpp(tok, case):
    assert tok.encode(case["text"], parse_special=case["parse_special"]) == case["ids"]


@pytest.mark.parametrize("gen", GENERATIONS, ids=[g["name"] for g in GENERATIONS])
def test_prompts_and_greedy_text_match_llamacpp(tok, gen):
    assert tok.encode(gen["prompt"]) == gen["prompt_ids"]
    assert tok.decode(gen["greedy_ids"]) == gen["greedy_text"]  # llama.cpp detokenize(special=True)


def test_decode_round_trips(tok):
    for case in CASES:
        assert tok.decode(case["ids"]) == case["text"]


def test_special_tokens(tok):
    assert tok.bos_id == 1 and tok.eos_ids == (0, 2, 4) and not tok.add_bos
    assert tok.token_to_id("<|im_start|>") == 1 and tok.id_to_token(2) == "<|im_end|>"
    assert tok.token_to_id("no-such-token") is None
    ids = tok.encode("<|im_start|>user\nhi<|im_end|>\n")
    assert ids[0] == 1 and 2 in ids
    assert tok.decode(ids, skip_special=True) == "user\nhi\n"
    assert tok.encode("<|im_start|>", parse_special=False)[0] != 1  # plain text then
    assert tok.vocab_size == 49152


def test_bad_input(tok):
    with pytest.raises(ValueError, match=r"token id 49152 out of range \[0, 49152\)"):
        tok.decode([5, 49152])
    with pytest.raises(TypeError, match="encode expects str"):
        tok.encode(b"bytes")


def stream(tok: Tokenizer, ids: list[int], **kw) -> list[str]:
    d = IncrementalDetokenizer(tok, **kw)
    return [d.add(i) for i in ids] + [d.flush()]


def test_incremental_detokenizer_emits_only_complete_text(tok):
    text = "emoji 😀👍🏽 and 日本語のテキスト 👨‍👩‍👧 done"
    ids = tok.encode(text)
    pieces = stream(tok, ids)
    assert "".join(pieces) == text
    assert not any("\ufffd" in p for p in pieces)
    # some characters span several byte-level tokens: those steps emit nothing
    assert pieces[:-1].count("") > 0
    assert len(ids) > len([p for p in pieces if p])


def test_incremental_detokenizer_on_greedy_output(tok):
    for gen in GENERATIONS:
        assert "".join(stream(tok, gen["greedy_ids"])) == gen["greedy_text"]
        assert "".join(stream(tok, gen["greedy_ids"], skip_special=True)) == \
            tok.decode(gen["greedy_ids"], skip_special=True)


def test_incremental_detokenizer_flushes_partial_bytes(tok):
    ids = tok.encode("😀")
    assert len(ids) > 1  # 4 UTF-8 bytes, not one token in this vocabulary
    d = tok.detokenizer()
    assert d.add(ids[0]) == ""
    assert "\ufffd" in d.flush()


def test_hf_tokenizer_json(tok, tmp_path):
    tok._tok.save(str(tmp_path / "tokenizer.json"))
    hf = Tokenizer.from_hf_dir(tmp_path, bos_id=1, eos_ids=(2,))
    for case in CASES[::7]:
        assert hf.encode(case["text"], parse_special=case["parse_special"]) == case["ids"]
    with pytest.raises(ModelLoadError, match="no tokenizer.json"):
        Tokenizer.from_hf_dir(tmp_path / "nowhere")


def test_add_bos_when_the_model_asks():
    md = {"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "smollm",
          "tokenizer.ggml.tokens": ["<s>", "a", "b", "ab"], "tokenizer.ggml.token_type": [3, 1, 1, 1],
          "tokenizer.ggml.merges": ["a b"], "tokenizer.ggml.bos_token_id": 0,
          "tokenizer.ggml.add_bos_token": True}
    t = Tokenizer.from_gguf_metadata(md)
    assert t.encode("ab") == [0, 3] and t.encode("ab", add_special=False) == [3]
    assert t.encode("<s>ab") == [0, 3]  # an explicit BOS is not doubled


def test_unsupported_gguf_tokenizers():
    with pytest.raises(ModelLoadError, match=r"tokenizer model 'bert' is not supported"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "bert", "tokenizer.ggml.tokens": []})
    with pytest.raises(ModelLoadError, match=r"pre-tokenizer 'no-such' is not supported"):
        Tokenizer.from_gguf_metadata({"tokenizer.ggml.model": "gpt2", "tokenizer.ggml.pre": "no-such",
                                      "tokenizer.ggml.tokens": []})


def split(pre: str, text: str) -> list[str]:
    return [p for p, _ in gguf_vocab._pre_tokenizer(gguf_vocab._PRE[pre][0]).pre_tokenize_str(text)]


@pytest.mark.parametrize("pre", sorted(gguf_vocab._PRE))
def test_every_pre_tokenizer_builds_and_keeps_the_text(pre):
    """Each name's regexes compile (Oniguruma) and its pieces put back together are the text
    (byte-level: a space is "Ġ", a newline "Ċ")."""
    text = "Hello, world! 12345 naïve 日本語  tabs\tand\nlines 😀 don't"
    pieces = split(pre, text)
    assert len(pieces) > 5
    decoded = bytes(_BYTE_OF[c] for c in "".join(pieces)).decode("utf-8")
    assert decoded == text


def _gpt2_byte_of() -> dict[str, int]:
    """GPT-2's byte-level alphabet, inverted: printable Latin-1 bytes stand for themselves,
    the other 68 bytes for the characters from U+0100 on, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in printable]
    return {**{chr(b): b for b in printable}, **{chr(0x100 + i): b for i, b in enumerate(others)}}


_BYTE_OF = _gpt2_byte_of()


@pytest.mark.parametrize("pre, want", [
    ("smollm", ["Ġ", "1", "2", "3", "4", "5", "Ġapples"]),     # digits one by one, then GPT-2
    ("gpt2", ["Ġ12345", "Ġapples"]),
    ("llama-bpe", ["Ġ", "123", "45", "Ġapples"]),                 # runs of up to 3 digits
    ("qwen2", ["Ġ", "1", "2", "3", "4", "5", "Ġapples"]),
    ("default", ["Ġ", "123", "45", "Ġapples"]),                  # GPT-2, digit runs, then 3-digit runs
    ("falcon", ["Ġ", "123", "45", "Ġapples"]),
    ("deepseek-coder", ["Ġ", "1", "2", "3", "4", "5", "Ġapples"]),
])
def test_pre_tokenizers_split_like_llamacpp_regexes(pre, want):
    assert split(pre, " 12345 apples") == want
