"""One BOS: a chat prompt's ids are transformers' apply_chat_template(tokenize=True)
ids, and a plain prompt's are transformers' tokenizer(text) ids, for a tiny
checkpoint of every family metalkv loads (chat_checkpoints.py) and for GGUF files
of the byte-level ones. Skipped without transformers (CI installs it: the
`reference` extra). No network: every file is written here."""
from __future__ import annotations

import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path
from metalkv.models import ChatTemplate, Tokenizer

from .chat_checkpoints import FAMILIES, write_checkpoint, write_family_gguf

CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "be brief"}, {"role": "user", "content": "what is two plus three?"},
     {"role": "assistant", "content": "five"}, {"role": "user", "content": "the sum, café 123?"}],
]
PLAIN = ["hi you", " what is two plus three", "café 123\nthe sum"]


@pytest.fixture(scope="module")
def transformers():
    return pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory, transformers):
    """family -> (HF directory, transformers' tokenizer of it)."""
    out = {}
    for name, family in FAMILIES.items():
        d = tmp_path_factory.mktemp(name)
        write_checkpoint(d, family)
        out[name] = d, transformers.AutoTokenizer.from_pretrained(str(d))
    return out


def reference_chat_ids(hf_tok, messages) -> list[int]:
    out = hf_tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    return list(out["input_ids"] if hasattr(out, "keys") else out)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_chat_ids_are_transformers(checkpoints, name):
    d, hf_tok = checkpoints[name]
    engine = metalkv.Engine.load(d, device=TEST_DEVICE, context=64, progress=False)
    bos = hf_tok.bos_token_id
    for messages in CONVERSATIONS:
        want = reference_chat_ids(hf_tok, messages)
        assert engine.chat_ids(messages) == want
        if FAMILIES[name].template.startswith("{{ bos_token }}"):
            assert want[0] == bos and want[1] != bos  # the template's BOS, once
        else:
            assert bos is None or bos not in want     # none added (Phi-3's tokenizer would add <s>)


@pytest.mark.parametrize("name", list(FAMILIES))
def test_plain_prompt_ids_are_transformers(checkpoints, name):
    d, hf_tok = checkpoints[name]
    ours = Tokenizer.from_hf_dir(d, bos_id=hf_tok.bos_token_id)
    for text in PLAIN:
        assert ours.encode(text) == hf_tok(text)["input_ids"], text
        assert ours.encode(text, add_special=False) == hf_tok(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("name, add_bos", [("llama", True), ("qwen2", False), ("qwen3", False)])
def test_gguf_chat_ids_are_transformers(checkpoints, tmp_path, name, add_bos):
    """The GGUF of the same vocabulary, template and add_bos_token (as llama.cpp's
    converter writes them) gives the HF reference's ids."""
    _, hf_tok = checkpoints[name]
    write_family_gguf(tmp_path / "m.gguf", FAMILIES[name], add_bos=add_bos)
    engine = metalkv.Engine.load(tmp_path / "m.gguf", device=TEST_DEVICE, context=64, progress=False)
    for messages in CONVERSATIONS:
        assert engine.chat_ids(messages) == reference_chat_ids(hf_tok, messages)
    for text in PLAIN:  # a plain prompt: add_bos_token's BOS (llama.cpp's rule; transformers' too here)
        assert engine.tokenizer.encode(text) == hf_tok(text)["input_ids"]


def test_a_template_bos_is_not_doubled_and_plain_text_keeps_its_rule(checkpoints):
    """The issue's case: Gemma 3's template writes <bos> and its tokenizer adds one."""
    d, _ = checkpoints["gemma3"]
    tok = Tokenizer.from_hf_dir(d)
    chat = ChatTemplate.from_hf_dir(d)
    prompt = chat.render([{"role": "user", "content": "hi"}])
    bos = tok.token_to_id("<bos>")
    assert tok.encode(prompt)[:2] == [bos, tok.token_to_id("<start_of_turn>")]
    assert tok.encode(str(prompt))[:2] == [bos, bos]  # the same text as a plain prompt: as transformers
