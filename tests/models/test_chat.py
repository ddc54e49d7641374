"""Chat templates: SmolLM2's own (from the GGUF) against the ChatML text written
out by hand, the ChatML fallback, HF directories, and errors."""
from __future__ import annotations

import json

import pytest

from metalkv.models import CHATML, ChatTemplate, ChatTemplateError

SYSTEM = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"


def test_smollm2_template(smollm):
    chat = smollm.chat_template
    assert not chat.is_fallback and chat.bos_token == "<|im_start|>" and chat.eos_token == "<|im_end|>"
    msgs = [{"role": "user", "content": "Hi!"}]
    assert chat.render(msgs) == SYSTEM + "<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n"
    assert chat.render(msgs, add_generation_prompt=False) == SYSTEM + "<|im_start|>user\nHi!<|im_end|>\n"
    convo = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "2+2?"},
             {"role": "assistant", "content": "4"}, {"role": "user", "content": "3+3?"}]
    assert chat.render(convo) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
        "<|im_start|>assistant\n4<|im_end|>\n<|im_start|>user\n3+3?<|im_end|>\n<|im_start|>assistant\n")


def test_smollm2_chat_prompt_matches_recording(smollm, llamacpp_ref):
    chat = next(g for g in llamacpp_ref["generations"] if g["name"] == "chat")
    text = smollm.chat_template.render(llamacpp_ref["settings"]["chat_messages"])
    assert text == chat["prompt"]
    assert smollm.tokenizer.encode(text) == chat["prompt_ids"]


def test_fallback_is_chatml():
    chat = ChatTemplate(None)
    assert chat.is_fallback and chat.source == CHATML
    assert chat.render([{"role": "user", "content": "Hi"}]) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"


def test_hf_directory_templates(tmp_path):
    tpl = "{{ bos_token }}{% for m in messages %}[{{ m['role'] }}]{{ m['content'] }}{% endfor %}"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": tpl, "bos_token": {"content": "<s>"}, "eos_token": "</s>"}))
    chat = ChatTemplate.from_hf_dir(tmp_path)
    assert chat.render([{"role": "user", "content": "x"}]) == "<s>[user]x"
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"chat_template": [{"name": "tool_use", "template": "no"}, {"name": "default", "template": tpl}]}))
    assert ChatTemplate.from_hf_dir(tmp_path).render([{"role": "a", "content": "b"}]) == "[a]b"
    (tmp_path / "tokenizer_config.json").write_text("{}")
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] | upper }}")
    assert ChatTemplate.from_hf_dir(tmp_path).render([{"role": "a", "content": "b"}]) == "B"
    (tmp_path / "chat_template.jinja").unlink()
    assert ChatTemplate.from_hf_dir(tmp_path).is_fallback


def test_errors():
    chat = ChatTemplate(None)
    with pytest.raises(ChatTemplateError, match="messages must be a list"):
        chat.render("hello")
    with pytest.raises(ChatTemplateError, match="message 1 must be a dict with str 'role' and 'content'"):
        chat.render([{"role": "user", "content": "a"}, {"role": "user"}])
    with pytest.raises(ChatTemplateError, match="does not parse"):
        ChatTemplate("{% for %}")
    strict = ChatTemplate("{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}")
    with pytest.raises(ChatTemplateError, match="template: user first"):
        strict.render([{"role": "assistant", "content": "x"}])
    sandboxed = ChatTemplate("{{ messages.__class__.__mro__ }}")
    with pytest.raises(ChatTemplateError, match="failed to render"):
        sandboxed.render([{"role": "user", "content": "x"}])
