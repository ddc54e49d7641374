"""Images and clips in the prompt (metalkv.media.prompt) against transformers' Gemma3Processor and
Gemma3nProcessor: the same conversations, through their apply_chat_template and through ours
(messages.normalize, ChatTemplate.render, expand, Tokenizer.encode), give the same input_ids, and
media_spans finds the soft tokens where the processors' token_type_ids mark them.

The tokenizer is tiny (tests/models/chat_checkpoints.py's Gemma pipeline: " " -> "▁", byte
fallback) with Gemma's special tokens, written here; both sides load the same tokenizer.json.
"""
from __future__ import annotations

import base64
import json

import pytest

transformers = pytest.importorskip("transformers")
from transformers.models.gemma3.image_processing_pil_gemma3 import Gemma3ImageProcessorPil  # noqa: E402
from transformers.models.siglip.image_processing_pil_siglip import SiglipImageProcessorPil  # noqa: E402

from metalkv.errors import ArgumentError, ModelLoadError  # noqa: E402
from metalkv.media import (ImageConfig, MediaTokens, Span, count_placeholders, expand, load_image,  # noqa: E402
                           media_spans, preprocess_image)
from metalkv.messages import media_parts, normalize  # noqa: E402
from metalkv.models import ChatTemplate, Tokenizer  # noqa: E402
from models.chat_checkpoints import Family, build_tokenizer  # noqa: E402  (tests/ is on sys.path)

from . import checkpoints  # noqa: E402
from .drawn import data_url, encode, gradient  # noqa: E402
from .sounds import signal, wav_of  # noqa: E402

SPECIALS = ("<pad>", "<eos>", "<bos>", "<unk>", "<mask>", "<start_of_turn>", "<end_of_turn>", "<start_of_image>",
            "<end_of_image>", "<image_soft_token>", "<start_of_audio>", "<end_of_audio>", "<audio_soft_token>")
NAMED = {"boi_token": "<start_of_image>", "eoi_token": "<end_of_image>", "image_token": "<image_soft_token>",
         "boa_token": "<start_of_audio>", "eoa_token": "<end_of_audio>", "audio_token": "<audio_soft_token>"}


def gemma_template(image: str, audio: str = "") -> str:
    """Our own template, not Google's: neither the installed transformers nor this repository
    holds the published Gemma 3 / 3n templates, and tests download nothing. It has their shape
    (BOS, the system text opening the first user turn, 'model' for the assistant, parts trimmed)
    and writes their placeholders: Gemma 3 <start_of_image>; Gemma 3n <image_soft_token> and
    <audio_soft_token>."""
    return (
        "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{% set prefix = messages[0]['content'] + '\n\n' %}"
        "{% set turns = messages[1:] %}{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
        "{% for m in turns %}<start_of_turn>{{ 'model' if m['role'] == 'assistant' else m['role'] }}\n"
        "{% if loop.first %}{{ prefix }}{% endif %}"
        "{% if m['content'] is string %}{{ m['content'] | trim }}{% else %}{% for p in m['content'] %}"
        f"{{% if p['type'] == 'image' %}}{image}{{% elif p['type'] == 'audio' %}}{audio}"
        "{% elif p['type'] == 'text' %}{{ p['text'] | trim }}{% endif %}{% endfor %}{% endif %}<end_of_turn>\n"
        "{% endfor %}{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}")


class Model:
    """One family written out: transformers' processor, and ours (template, tokenizer, MediaTokens)."""

    def __init__(self, d, model_type: str):
        template = gemma_template("<start_of_image>") if model_type == "gemma3" else \
            gemma_template("<image_soft_token>", "<audio_soft_token>")
        tok = build_tokenizer(Family(model_type, {}, "gemma", SPECIALS, "<bos>", "<eos>", template, "GemmaTokenizer"))
        tok.save(str(d / "tokenizer.json"))
        (d / "tokenizer_config.json").write_text(json.dumps({
            "tokenizer_class": "GemmaTokenizer", "bos_token": "<bos>", "eos_token": "<eos>",
            "extra_special_tokens": {k: v for k, v in NAMED.items() if model_type == "gemma3n" or "a_" not in k}}))
        hf_tok = transformers.AutoTokenizer.from_pretrained(str(d))
        v = tok.get_vocab(with_added_tokens=True)
        if model_type == "gemma3":
            self.processor = transformers.Gemma3Processor(
                image_processor=Gemma3ImageProcessorPil.from_dict(checkpoints.GEMMA3), tokenizer=hf_tok,
                chat_template=template)
            self.config = {"model_type": "gemma3", "boi_token_index": v["<start_of_image>"],
                           "eoi_token_index": v["<end_of_image>"], "image_token_index": v["<image_soft_token>"],
                           "mm_tokens_per_image": 256}
        else:
            self.processor = transformers.Gemma3nProcessor(
                feature_extractor=transformers.Gemma3nAudioFeatureExtractor(),
                image_processor=SiglipImageProcessorPil.from_dict(checkpoints.GEMMA3N), tokenizer=hf_tok,
                chat_template=template)
            self.config = {"model_type": "gemma3n", "audio_soft_tokens_per_image": 188,
                           "vision_soft_tokens_per_image": 256, "boi_token_id": v["<start_of_image>"],
                           "eoi_token_id": v["<end_of_image>"], "image_token_id": v["<image_soft_token>"],
                           "boa_token_id": v["<start_of_audio>"], "eoa_token_id": v["<end_of_audio>"],
                           "audio_token_id": v["<audio_soft_token>"]}
        self.tokenizer = Tokenizer.from_hf_dir(d)
        self.template = ChatTemplate(template, bos_token="<bos>", eos_token="<eos>")
        self.tokens = MediaTokens.from_hf_config(self.config, self.tokenizer.id_to_token)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    return {name: Model(tmp_path_factory.mktemp(name), name) for name in ("gemma3", "gemma3n")}


# A conversation: turns of (role, items); an item is text, ("image", (width, height)) or ("audio", samples)
CAT = ("image", (64, 48))
WIDE = ("image", (1200, 300))  # pan-and-scan cuts it into 4 crops
CLIP = ("audio", 1600)
CONVERSATIONS = {
    "one image": [("user", [CAT, "What is this?"])],
    "several turns": [("system", "Answer in one word."), ("user", ["Compare", CAT, " with ", ("image", (40, 80))]),
                      ("assistant", "Colour."), ("user", [CAT, CAT, "And these?"])],
    "image last": [("user", ["Describe: ", CAT])],
    "a clip": [("user", [CLIP, "What is said?"])],
    "both": [("system", "Be brief."), ("user", [CAT, "then", CLIP]), ("assistant", "A cat, then a tone."),
             ("user", [CLIP, ("audio", 3200), CAT, "Again?"])],
}
HAS_AUDIO = {"a clip", "both"}


def _png(size) -> bytes:
    return encode(gradient(*size), "PNG")


def openai_messages(conversation) -> list[dict]:
    """The conversation as an OpenAI client sends it (data URLs, input_audio)."""
    def part(item):
        if isinstance(item, str):
            return {"type": "text", "text": item}
        if item[0] == "image":
            return {"type": "image_url", "image_url": {"url": data_url(_png(item[1]))}}
        wav = base64.b64encode(wav_of(signal("tone", item[1]), 16_000)).decode()
        return {"type": "input_audio", "input_audio": {"data": wav, "format": "wav"}}
    return [{"role": r, "content": c if isinstance(c, str) else [part(i) for i in c]} for r, c in conversation]


def hf_messages(conversation) -> list[dict]:
    """The same as transformers' processors take it (image URLs; audio as samples at 16 kHz)."""
    def part(item):
        if isinstance(item, str):
            return {"type": "text", "text": item}
        if item[0] == "image":
            return {"type": "image", "url": data_url(_png(item[1]))}
        return {"type": "audio", "audio": signal("tone", item[1])}
    return [{"role": r, "content": c if isinstance(c, str) else [part(i) for i in c]} for r, c in conversation]


def ours(model: Model, messages: list[dict], pan_and_scan: bool = False) -> tuple[list[int], list[Span]]:
    media = media_parts(messages, media=model.tokens.kinds)
    text = model.template.render(normalize(messages, media=model.tokens.kinds), add_generation_prompt=True)
    crops = None
    if pan_and_scan:
        config = ImageConfig.from_preprocessor_config(checkpoints.GEMMA3, "gemma3")
        crops = [preprocess_image(load_image(p.source), config, pan_and_scan=True).num_crops for p in media]
    text = expand(text, model.tokens, images=sum(p.kind == "image" for p in media),
                  clips=sum(p.kind == "audio" for p in media), crops=crops)
    ids = model.tokenizer.encode(text)
    return ids, media_spans(ids, model.tokens)


def theirs(model: Model, conversation, **kwargs) -> tuple[list[int], list[int]]:
    out = model.processor.apply_chat_template(hf_messages(conversation), add_generation_prompt=True, tokenize=True,
                                              return_dict=True, **kwargs)
    return list(out["input_ids"][0]), list(out["token_type_ids"][0])


def type_ids(n: int, spans: list[Span]) -> list[int]:
    """The processors' token_type_ids of spans: 1 for an image's soft tokens, 3 for a clip's."""
    out = [0] * n
    for s in spans:
        out[s.start:s.start + s.length] = [1 if s.kind == "image" else 3] * s.length
    return out


@pytest.mark.parametrize("model_type, name", [(m, n) for m in ("gemma3", "gemma3n") for n in sorted(CONVERSATIONS)
                                               if m == "gemma3n" or n not in HAS_AUDIO])  # Gemma 3 takes no audio
def test_ids_and_spans_are_the_processors(models, model_type, name):
    model, conversation = models[model_type], CONVERSATIONS[name]
    ids, spans = ours(model, openai_messages(conversation))
    want_ids, want_types = theirs(model, conversation)
    assert ids == want_ids
    assert type_ids(len(ids), spans) == want_types
    kinds = [i[0] for _, c in conversation if not isinstance(c, str) for i in c if not isinstance(i, str)]
    assert [s.kind for s in spans] == kinds  # one run per image or clip, in order
    assert all(s.length == (256 if s.kind == "image" else 188) for s in spans)
    assert [s.index for s in spans if s.kind == "image"] == list(range(kinds.count("image")))


def test_pan_and_scan_crops_are_written_as_gemma3_writes_them(models):
    conversation = [("user", ["Read it:", WIDE, CAT])]
    ids, spans = ours(models["gemma3"], openai_messages(conversation), pan_and_scan=True)
    want_ids, want_types = theirs(models["gemma3"], conversation, do_pan_and_scan=True)
    assert ids == want_ids and type_ids(len(ids), spans) == want_types
    assert len(spans) == 1 + 4 + 1 and [s.index for s in spans] == list(range(6))  # the wide image's 4 crops follow it


def test_media_tokens_of_the_configs(models):
    g3, g3n = models["gemma3"].tokens, models["gemma3n"].tokens
    assert g3.kinds == ("image",) and g3.audio is None
    assert (g3.image.placeholder, g3.image.begin, g3.image.end, g3.image.soft_token, g3.image.per_item) == (
        "<start_of_image>", "<start_of_image>", "<end_of_image>", "<image_soft_token>", 256)
    assert g3.image.sequence == "\n\n<start_of_image>" + "<image_soft_token>" * 256 + "<end_of_image>\n\n"
    assert g3n.kinds == ("image", "audio")
    assert (g3n.image.placeholder, g3n.audio.placeholder, g3n.audio.begin, g3n.audio.end, g3n.audio.per_item) == (
        "<image_soft_token>", "<audio_soft_token>", "<start_of_audio>", "<end_of_audio>", 188)
    assert g3n.audio.soft_id == models["gemma3n"].tokenizer.token_to_id("<audio_soft_token>")
    for model_type in ("gemma3_text", "llama", None):
        assert MediaTokens.from_hf_config({"model_type": model_type}, lambda i: "x") is None


def test_defaults_are_transformers(models):
    """A config.json that leaves the keys out gets transformers' defaults (read from its config classes)."""
    texts = {}
    g3 = MediaTokens.from_hf_config({"model_type": "gemma3"}, lambda i: texts.setdefault(i, f"<{i}>"))
    ref = transformers.Gemma3Config()
    assert (g3.image.soft_id, g3.image.begin, g3.image.end, g3.image.per_item) == (
        ref.image_token_id, f"<{ref.boi_token_id}>", f"<{ref.eoi_token_id}>", ref.mm_tokens_per_image)
    g3n = MediaTokens.from_hf_config({"model_type": "gemma3n"}, lambda i: f"<{i}>")
    ref = transformers.Gemma3nConfig()
    assert (g3n.image.soft_id, g3n.image.begin, g3n.image.end, g3n.image.per_item) == (
        ref.image_token_id, f"<{ref.boi_token_id}>", f"<{ref.eoi_token_id}>", ref.vision_soft_tokens_per_image)
    assert (g3n.audio.soft_id, g3n.audio.begin, g3n.audio.end, g3n.audio.per_item) == (
        ref.audio_token_id, f"<{ref.boa_token_id}>", f"<{ref.eoa_token_id}>", ref.audio_soft_tokens_per_image)
    aliased = MediaTokens.from_hf_config({"model_type": "gemma3", "image_token_id": 7}, lambda i: f"<{i}>")
    assert aliased.image.soft_id == 7  # transformers' other name for image_token_index


def test_configs_that_do_not_fit_the_tokenizer_are_refused():
    with pytest.raises(ModelLoadError, match=r"\[media\] config.json's image_token_index=262144: no such token in "
                                             r"the tokenizer; the config and the tokenizer are of different models"):
        MediaTokens.from_hf_config({"model_type": "gemma3"}, lambda i: None if i == 262_144 else "<t>")
    with pytest.raises(ModelLoadError, match=r"audio_soft_tokens_per_image=0: expected an int >= 1 \(gemma3n\)"):
        MediaTokens.from_hf_config({"model_type": "gemma3n", "audio_soft_tokens_per_image": 0}, lambda i: "<t>")


def test_placeholders_that_do_not_match_the_media_are_refused(models):
    tokens = models["gemma3"].tokens
    text = "<bos><start_of_turn>user\n<start_of_image>hi<end_of_turn>\n"
    assert count_placeholders(text, tokens) == {"image": 1}
    with pytest.raises(ArgumentError, match=r"\[media\] the prompt holds 1 '<start_of_image>' for 2 images: the "
                                            r"chat template wrote none for a part; use the model's own template"):
        expand(text, tokens, images=2)
    with pytest.raises(ArgumentError, match=r"holds 1 '<start_of_image>' for 0 images: a message's text holds the "
                                            r"placeholder's text; remove it") as e:
        expand(text, tokens)
    assert e.value.argument == "messages"
    with pytest.raises(ArgumentError, match=r"1 clip given, but this model \(gemma3\) takes no audio"):
        expand(text, tokens, images=1, clips=1)
    with pytest.raises(ArgumentError, match=r"crops=\[1, 2\]: expected one count >= 0 per image \(1\)"):
        expand(text, tokens, images=1, crops=[1, 2])
    with pytest.raises(ArgumentError, match=r"gemma3n takes no pan-and-scan crops"):
        expand("<image_soft_token>", models["gemma3n"].tokens, images=1, crops=[2])


def test_a_stray_soft_token_is_refused(models):
    """A message that types <image_soft_token> makes a run that is no image's."""
    model = models["gemma3"]
    text = expand(model.template.render([{"role": "user", "content": [
        {"type": "image"}, {"type": "text", "text": "what <image_soft_token> is"}]}]), model.tokens, images=1)
    with pytest.raises(ArgumentError, match=r"a run of 1 '<image_soft_token>' at token \d+, where an image takes 256"):
        media_spans(model.tokenizer.encode(text), model.tokens)


def test_a_chat_prompt_stays_one():
    """expand keeps the ChatPrompt type, so encoding it adds no second BOS."""
    from metalkv.models.chat import ChatPrompt

    tokens = MediaTokens.from_hf_config({"model_type": "gemma3"}, lambda i: f"<{i}>")
    out = expand(ChatPrompt("<bos><255999>"), tokens, images=1)
    assert isinstance(out, ChatPrompt) and out.count("<262144>") == 256
    assert type(expand("<255999>", tokens, images=1)) is str


def test_audio_parts_only_with_audio(models):
    with pytest.raises(ArgumentError, match="this model reads text and images; audio needs"):
        ours(models["gemma3"], openai_messages(CONVERSATIONS["a clip"]))
