"""Images and clips in the prompt, laid out as transformers' Gemma3Processor and Gemma3nProcessor
lay them out: the chat template writes one placeholder per media part, the processor replaces
each with the item's soft tokens between its begin and end tokens, and the model puts the
tower's embeddings at those soft tokens.

    tokens = MediaTokens.from_hf_config(json.load(open("config.json")), tokenizer.id_to_token)
    text = template.render(normalize(messages, media=tokens.kinds))  # Gemma 3: "<start_of_image>" per image
    text = expand(text, tokens, images=1)     # "\\n\\n<start_of_image>", 256 "<image_soft_token>", "<end_of_image>\\n\\n"
    ids = tokenizer.encode(text)
    media_spans(ids, tokens)                  # [Span(start=12, length=256, kind="image", index=0)]

Gemma 3: images only; the placeholder is <start_of_image>, 256 soft tokens a view (an image,
and each pan-and-scan crop, written as the processor writes them). Gemma 3n: images (placeholder
<image_soft_token>, 256) and audio (placeholder <audio_soft_token>, 188), each between its own
begin and end tokens.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Callable, Mapping, NamedTuple, Sequence

from ..errors import ArgumentError, ModelLoadError
from ..models.chat import ChatPrompt

# Gemma3Processor's words around an image's pan-and-scan crops
CROPS_BEFORE = "Here is the original image "
CROPS_BETWEEN = " and here are some crops to help you see better "

# transformers' defaults (Gemma3Config, Gemma3nConfig) for a key a config.json leaves out
GEMMA3_DEFAULTS = {"boi_token_index": 255_999, "eoi_token_index": 256_000, "image_token_index": 262_144,
                   "mm_tokens_per_image": 256}
GEMMA3N_DEFAULTS = {"boi_token_id": 255_999, "eoi_token_id": 262_144, "image_token_id": 262_145,
                    "boa_token_id": 256_000, "eoa_token_id": 262_272, "audio_token_id": 262_273,
                    "vision_soft_tokens_per_image": 256, "audio_soft_tokens_per_image": 188}


@dataclass(frozen=True)
class MediaSlot:
    """How one kind of media is written in the prompt."""
    kind: str            # "image" | "audio"
    placeholder: str     # what the chat template writes per part: "<start_of_image>" (Gemma 3), "<image_soft_token>"
    begin: str           # "<start_of_image>", "<start_of_audio>"
    end: str             # "<end_of_image>", "<end_of_audio>"
    soft_token: str      # "<image_soft_token>": one per embedding of the tower
    soft_id: int
    per_item: int        # soft tokens per image (per view, with crops) or clip
    crops: bool = False  # written with pan-and-scan crops (Gemma 3's images)

    @property
    def sequence(self) -> str:
        """What the processor writes for one image (one view) or clip."""
        return f"\n\n{self.begin}{self.soft_token * self.per_item}{self.end}\n\n"

    def text(self, crops: int = 0) -> str:
        """The placeholder's replacement: the sequence, or with pan-and-scan the whole image's then its crops'."""
        if not crops:
            return self.sequence
        return CROPS_BEFORE + self.sequence + CROPS_BETWEEN + " ".join([self.sequence] * crops)


@dataclass(frozen=True)
class MediaTokens:
    """The media a model takes and how each kind is written in its prompt."""
    model_type: str
    image: MediaSlot | None = None
    audio: MediaSlot | None = None

    def __post_init__(self):
        if self.image and self.audio and (self.image.placeholder == self.audio.placeholder
                                          or self.image.soft_id == self.audio.soft_id):
            raise ValueError(f"[media] {self.model_type}: images and audio need placeholders and soft tokens of "
                             f"their own, got {self.image.placeholder!r} and {self.audio.placeholder!r}")

    @property
    def kinds(self) -> tuple[str, ...]:
        """("image",), ("image", "audio"): what messages.normalize(media=...) takes for this model."""
        return tuple(s.kind for s in (self.image, self.audio) if s is not None)

    @property
    def slots(self) -> tuple[MediaSlot, ...]:
        return tuple(s for s in (self.image, self.audio) if s is not None)

    @classmethod
    def from_hf_config(cls, config: Mapping, id_to_token: Callable[[int], str | None]) -> "MediaTokens | None":
        """The media of a transformers config.json (a dict): Gemma3ForConditionalGeneration's
        (model_type "gemma3": images) or Gemma3nForConditionalGeneration's ("gemma3n": images
        and audio); None for any other model (text only: "gemma3_text", Gemma 3 1B, and the rest).
        id_to_token: the tokenizer's id -> token text (Tokenizer.id_to_token), for the texts the
        template and the processor write. A key left out or null takes transformers' default."""
        model_type = config.get("model_type")
        if model_type == "gemma3":
            get = _reader(config, GEMMA3_DEFAULTS, id_to_token, model_type)
            image = MediaSlot("image", get("boi_token_index", token=True), get("boi_token_index", token=True),
                              get("eoi_token_index", token=True), get("image_token_index", token=True),
                              get("image_token_index"), get("mm_tokens_per_image", count=True), crops=True)
            return cls(model_type, image=image)
        if model_type == "gemma3n":
            get = _reader(config, GEMMA3N_DEFAULTS, id_to_token, model_type)
            image = MediaSlot("image", get("image_token_id", token=True), get("boi_token_id", token=True),
                              get("eoi_token_id", token=True), get("image_token_id", token=True),
                              get("image_token_id"), get("vision_soft_tokens_per_image", count=True))
            audio = MediaSlot("audio", get("audio_token_id", token=True), get("boa_token_id", token=True),
                              get("eoa_token_id", token=True), get("audio_token_id", token=True),
                              get("audio_token_id"), get("audio_soft_tokens_per_image", count=True))
            return cls(model_type, image=image, audio=audio)
        return None


def _reader(config: Mapping, defaults: dict, id_to_token: Callable[[int], str | None], model_type: str):
    """get(key): the config's int (or transformers' default); token=True: that id's text; count=True: >= 1."""
    def get(key: str, *, token: bool = False, count: bool = False):
        value = config.get(key)
        if value is None and key == "image_token_index":  # transformers maps image_token_id onto it
            value = config.get("image_token_id")
        value = defaults[key] if value is None else value
        if isinstance(value, bool) or not isinstance(value, int) or value < (1 if count else 0):
            raise ModelLoadError(f"[media] config.json's {key}={value!r}: expected an int "
                                 f"{'>= 1' if count else '>= 0 (a token id)'} ({model_type})")
        if not token:
            return value
        text = id_to_token(value)
        if not text:
            raise ModelLoadError(f"[media] config.json's {key}={value}: no such token in the tokenizer; the config "
                                 f"and the tokenizer are of different models ({model_type})")
        return text
    return get


def _count(n: int, kind: str) -> str:
    """'1 image', '2 clips'."""
    noun = "image" if kind == "image" else "clip"
    return f"{n} {noun}{'' if n == 1 else 's'}"


def _refuse(what: str) -> ArgumentError:
    e = ArgumentError(f"[media] {what}")
    e.argument, e.value, e.expected = "messages", "", what
    return e


def _placeholders(tokens: MediaTokens) -> re.Pattern:
    return re.compile("|".join(f"(?P<{s.kind}>{re.escape(s.placeholder)})" for s in tokens.slots) or r"(?!)")


def count_placeholders(text: str, tokens: MediaTokens) -> dict[str, int]:
    """{"image": n, "audio": m}: the placeholders of each kind `text` (a rendered chat) holds."""
    found = {s.kind: 0 for s in tokens.slots}
    for m in _placeholders(tokens).finditer(text):
        found[m.lastgroup] += 1
    return found


def expand(text: str, tokens: MediaTokens, *, images: int = 0, clips: int = 0,
           crops: Sequence[int] | None = None) -> str:
    """`text` (a rendered chat) with each placeholder replaced by its item's soft tokens, as the
    processor replaces them. images, clips: the media given (messages.media_parts), which must be
    as many as the placeholders of each kind; crops: Gemma 3's pan-and-scan crops of each image
    (PreparedImage.num_crops), None for none. A ChatPrompt stays a ChatPrompt (no BOS added)."""
    given = {"image": images, "audio": clips}
    found = count_placeholders(text, tokens)
    for kind, n in given.items():
        if n and kind not in found:
            raise _refuse(f"{_count(n, kind)} given, but this model ({tokens.model_type}) takes no {kind}")
        have = found.get(kind, 0)
        if have != n:
            slot = tokens.image if kind == "image" else tokens.audio
            raise _refuse(f"the prompt holds {have} {slot.placeholder!r} for {_count(n, kind)}: "
                          + ("a message's text holds the placeholder's text; remove it" if have > n else
                             "the chat template wrote none for a part; use the model's own template"))
    crops = list(crops) if crops is not None else [0] * images
    if len(crops) != images or any(not isinstance(c, int) or c < 0 for c in crops):
        raise _refuse(f"crops={crops!r}: expected one count >= 0 per image ({images})")
    if any(crops) and not tokens.image.crops:
        raise _refuse(f"crops={crops!r}: {tokens.model_type} takes no pan-and-scan crops")
    counter = {"image": iter(crops), "audio": iter(())}

    def replace(m: re.Match) -> str:
        slot = tokens.image if m.lastgroup == "image" else tokens.audio
        return slot.text(next(counter["image"], 0) if slot.kind == "image" else 0)

    out = _placeholders(tokens).sub(replace, text)
    return ChatPrompt(out) if isinstance(text, ChatPrompt) else out


class Span(NamedTuple):
    """A run of soft tokens in the prompt ids: where the tower's embeddings of one view or clip go."""
    start: int
    length: int
    kind: str    # "image" | "audio"
    index: int   # its place among its kind's runs: the row of the tower's output (an image's crops follow it)


def media_spans(ids: Sequence[int], tokens: MediaTokens) -> list[Span]:
    """The runs of soft-token ids in `ids` (the tokenized expand()), in order. Each run must be
    one item's length: a stray soft token (its text typed in a message) is refused."""
    kinds = {s.soft_id: s for s in tokens.slots}
    spans: list[Span] = []
    seen = {s.kind: 0 for s in tokens.slots}
    i, n = 0, len(ids)
    while i < n:
        slot = kinds.get(ids[i])
        if slot is None:
            i += 1
            continue
        j = i
        while j < n and ids[j] == slot.soft_id:
            j += 1
        if j - i != slot.per_item:
            raise _refuse(f"the prompt holds a run of {j - i} {slot.soft_token!r} at token {i}, where "
                          f"{'an image' if slot.kind == 'image' else 'a clip'} takes {slot.per_item}: a message's "
                          "text holds the token's text; remove it")
        spans.append(Span(i, j - i, slot.kind, seen[slot.kind]))
        seen[slot.kind] += 1
        i = j
    return spans
