"""Soft tokens for the engine: a model's towers, their outputs cached by media hash, and
the prompts that carry them (docs/MULTIMODAL.md).

A MediaPrompt is token ids whose media positions hold *keys*: negative int32 values made
from a hash of the prepared media, so the ids of an image are the same wherever and
whenever the same image comes. The prefix cache, a saved cache's token record and a chat's
common-prefix check all compare ids, so they reuse an image's blocks with no more
machinery; the C++ engine takes each span's rows from the tower instead of the
embedding table (engine/media.h).

    media = Media.load(device, loaded)        # None: the model has no tower metalkv runs
    prompt = media.prompt(ids, [image])       # ids with the image's placeholder run
    prompt = media.prompt(ids, clips=[wav])   # (Gemma 3n) a clip's run
    engine.generate(prompt) / engine.logits(prompt)

A chat turn keys its prompt first (chat_prompt: a KeyedPrompt, no tower run), finds the
common prefix with its cache, and takes the tail it feeds: only media past that prefix go
through a tower. So a conversation continued from a saved cache, on an engine that never saw
its images, encodes none of them again.
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from functools import partial
from typing import Callable

import numpy as np

from .media import (AudioFeatureConfig, ImageConfig, MediaError, MediaLimits, PreparedImage, load_audio,
                    load_image, log_mel_features, preprocess_image)
from .media.prompt import MediaTokens, expand, media_spans
from .models.audio import Gemma3nAudio
from .models.errors import ModelLoadError
from .models.mmproj import load_mmproj
from .models.vision import Gemma3Vision
from .models.vision3n import Gemma3nVision

KEY_LIMIT = 2 ** 31 - 1  # keys are -1 .. -KEY_LIMIT
_GOLDEN = 0x9E3779B1     # spreads the tokens of one item over the key space


def media_keys(digest: bytes, n: int) -> np.ndarray:
    """The n keys of the item whose prepared data hashes to `digest`: negative int32, never
    a vocabulary id, the same for the same data."""
    base = int.from_bytes(digest[:8], "little")
    return np.array([-1 - (base + j * _GOLDEN) % KEY_LIMIT for j in range(n)], np.int64)


@dataclass
class MediaPrompt:
    """Token ids with soft tokens: spans [(start, length, bidirectional)] of ids whose rows
    (rows, (Σ length, hidden) float32) come from a tower; the spans' ids are their keys."""
    ids: np.ndarray
    spans: list[tuple[int, int, bool]] = field(default_factory=list)
    rows: np.ndarray | None = None
    stats: dict = field(default_factory=dict)  # tower_seconds, media_items, media_cached

    def __len__(self) -> int:
        return len(self.ids)

    def fed_from(self, start: int) -> tuple[np.ndarray, tuple | None]:
        """(the ids from index `start` on, their media for _core's submit: spans shifted to
        that start, rows of the spans it keeps; None when none is left)."""
        spans, rows, offset = [], [], 0
        for s, n, bidi in self.spans:
            lo = max(s, start)
            if lo < s + n:
                spans.append((lo - start, s + n - lo, bidi))
                rows.append(self.rows[offset + lo - s: offset + n])
            offset += n
        media = (spans, np.ascontiguousarray(np.concatenate(rows), np.float32)) if spans else None
        return self.ids[start:], media


class _SoftTokenCache:
    """The towers' outputs by media hash, least recently used dropped past max_bytes."""

    def __init__(self, max_bytes: int):
        self.max_bytes, self._bytes, self._rows = max_bytes, 0, OrderedDict()

    def get(self, digest: bytes) -> np.ndarray | None:
        rows = self._rows.get(digest)
        if rows is not None:
            self._rows.move_to_end(digest)
        return rows

    def put(self, digest: bytes, rows: np.ndarray) -> None:
        self._rows[digest] = rows
        self._bytes += rows.nbytes
        while self._bytes > self.max_bytes and len(self._rows) > 1:
            self._bytes -= self._rows.popitem(last=False)[1].nbytes


class Media:
    """A model's towers (Gemma 3's SigLIP; Gemma 3n's MobileNet-V5 and audio conformer), its
    processor settings, and the soft tokens they made, by media hash."""

    def __init__(self, tokens: MediaTokens | None, *, vision: Gemma3Vision | Gemma3nVision | None = None,
                 image_config: ImageConfig | None = None, audio: Gemma3nAudio | None = None,
                 audio_config: AudioFeatureConfig | None = None, cache_bytes: int = 256 << 20):
        self.vision, self.image_config = vision, image_config
        self.audio, self.audio_config = audio, audio_config
        self.tokens = tokens  # the processor's layout of media in the prompt (None: no tokenizer to read it)
        self._cache = _SoftTokenCache(cache_bytes)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The content parts its model reads ("image", "audio")."""
        return tuple(k for k, tower in (("image", self.vision), ("audio", self.audio)) if tower is not None)

    @classmethod
    def load(cls, device, loaded, mmproj=None) -> "Media | None":
        """The towers of a loaded checkpoint (a directory whose config.json has them), or
        Gemma 3's vision tower from llama.cpp's mmproj file; None for a model without one
        metalkv runs."""
        if mmproj is not None:
            return cls.from_mmproj(device, loaded, mmproj)
        config, path = loaded.metadata, loaded.path
        if not path.is_dir():
            return None
        vision = Gemma3Vision.load(device, path, config) or Gemma3nVision.load(device, path, config)
        audio = Gemma3nAudio.load(device, path, config)
        if vision is None and audio is None:
            return None
        preprocessor = _preprocessor(path)
        image_config = None if vision is None else ImageConfig.from_preprocessor_config(
            preprocessor or {"size": {"height": vision.image_size, "width": vision.image_size}}, config["model_type"])
        audio_config = None if audio is None else AudioFeatureConfig.from_preprocessor_config(preprocessor or {})
        tokens = MediaTokens.from_hf_config(config, loaded.tokenizer.id_to_token) if loaded.tokenizer else None
        return cls(tokens, vision=vision, image_config=image_config, audio=audio, audio_config=audio_config)

    @classmethod
    def from_mmproj(cls, device, loaded, mmproj) -> "Media":
        """The vision tower of llama.cpp's mmproj file beside `loaded`: Gemma 3's (a Gemma 3
        model) or Gemma 3n's (a Gemma 3n model; its audio tower still from a safetensors
        checkpoint's own weights, where it has them). GGUF or safetensors; the media tokens are
        the tokenizer's, found by their text."""
        arch = loaded.config.arch
        if arch not in ("gemma3", "gemma3n"):
            raise ModelLoadError(f"[mmproj] {mmproj}: an mmproj file's vision tower needs a Gemma 3 or Gemma 3n "
                                 f"model, not {arch}")
        find = loaded.tokenizer.token_to_id if loaded.tokenizer is not None else (lambda text: None)
        texts = {"boi": "<start_of_image>", "eoi": "<end_of_image>", "image": "<image_soft_token>"}
        if arch == "gemma3n":
            texts.update(boa="<start_of_audio>", eoa="<end_of_audio>", audio="<audio_soft_token>")
        ids = {key: find(text) for key, text in texts.items()}
        missing = [texts[k] for k, v in ids.items() if v is None]
        if missing and (arch == "gemma3n" or loaded.tokenizer is not None):
            raise ModelLoadError(f"[mmproj] {mmproj}: the model's tokenizer has no {', '.join(missing)}")
        if arch == "gemma3":
            vision, image_config, per_image = load_mmproj(device, mmproj)
            tokens = None if loaded.tokenizer is None else MediaTokens.from_hf_config(dict(
                model_type="gemma3", boi_token_index=ids["boi"], eoi_token_index=ids["eoi"],
                image_token_index=ids["image"], mm_tokens_per_image=per_image), loaded.tokenizer.id_to_token)
            return cls(tokens, vision=vision, image_config=image_config)
        vision = Gemma3nVision.from_mmproj(device, mmproj, ids["eoi"])  # <end_of_image> opens its vocabulary
        config = loaded.metadata if loaded.path.is_dir() else {}
        audio = Gemma3nAudio.load(device, loaded.path, config) if config else None
        image_config = ImageConfig.from_preprocessor_config(  # the released processor's, at the file's size
            {"size": {"height": vision.image_size, "width": vision.image_size}, "resample": 2,
             "do_normalize": False}, "gemma3n")
        tokens = MediaTokens.from_hf_config(dict(
            model_type="gemma3n", boi_token_id=ids["boi"], eoi_token_id=ids["eoi"], image_token_id=ids["image"],
            boa_token_id=ids["boa"], eoa_token_id=ids["eoa"], audio_token_id=ids["audio"],
            vision_soft_tokens_per_image=vision.tokens_per_image,
            audio_soft_tokens_per_image=int(config.get("audio_soft_tokens_per_image", 188))),
            loaded.tokenizer.id_to_token)
        audio_config = None if audio is None else AudioFeatureConfig.from_preprocessor_config(
            _preprocessor(loaded.path) or {})
        return cls(tokens, vision=vision, image_config=image_config, audio=audio, audio_config=audio_config)

    def chat_prompt(self, engine, messages: list, sources: list) -> "KeyedPrompt":
        """Checked messages (their media as template parts) and the media's sources
        (messages.MediaPart, in order): rendered with the chat template, each item expanded as
        the processor lays it out, tokenized, and keyed (keyed); no tower has run yet."""
        if self.tokens is None or engine.tokenizer is None:
            raise MediaError("[media] this checkpoint has no tokenizer to lay out media in the prompt")
        limits = engine.media_limits
        images = [self.prepare_image(p.source, limits) for p in sources if p.kind == "image"]
        clips = [p.source for p in sources if p.kind == "audio"]
        text = expand(engine.chat_template.render(messages, add_generation_prompt=True), self.tokens,
                      images=len(images), clips=len(clips), crops=[p.num_crops for p in images])
        return self.keyed(engine.tokenizer.encode(text), images, clips, limits=limits)

    def prepare_image(self, source, limits: MediaLimits | None = None) -> PreparedImage:
        """One image (a path, bytes, data URL or PIL image) as the processor prepares it: the
        whole image, then its pan-and-scan crops where the processor config asks for them."""
        if self.vision is None:
            raise MediaError("[image] this model has no vision tower metalkv runs")
        return preprocess_image(source if hasattr(source, "convert") else load_image(source, limits), self.image_config)

    def rows(self, digest: bytes, encode: Callable[[], np.ndarray]) -> tuple[np.ndarray, float, bool]:
        """The cached rows of `digest`, or encode()'s: (rows, tower seconds, from the cache)."""
        got = self._cache.get(digest)
        if got is not None:
            return got, 0.0, True
        t0 = time.perf_counter()
        got = encode()
        seconds = time.perf_counter() - t0
        self._cache.put(digest, got)
        return got, seconds, False

    def image_items(self, source, limits: MediaLimits | None = None) -> list[tuple[bytes, Callable]]:
        """One image (a path, bytes, data URL, PIL image or PreparedImage) as (digest, encode)
        per view (the image, then pan-and-scan crops when the processor makes them): encode()
        runs the tower on the view."""
        prepared = source if isinstance(source, PreparedImage) else self.prepare_image(source, limits)
        return [(hashlib.sha256(np.ascontiguousarray(view, np.float32).tobytes()).digest(),
                 partial(_first, self.vision.encode, view[None])) for view in prepared.pixel_values]

    def clip_item(self, source, limits: MediaLimits | None = None) -> tuple[bytes, Callable]:
        """One clip (a path, bytes, data URL or input_audio's {data, format}) as (digest of its
        features, encode: the tower's rows of its run)."""
        if self.audio is None:
            raise MediaError("[audio] this model has no audio tower metalkv runs")
        samples = load_audio(source, self.audio_config.sampling_rate, limits)
        feats = log_mel_features(samples, self.audio_config)
        n_valid = int(feats.mask.sum())
        digest = hashlib.sha256(feats.features.tobytes() + n_valid.to_bytes(4, "little")).digest()
        run = self.tokens.audio.per_item if self.tokens and self.tokens.audio else self.audio.tokens_per_clip
        made = self.audio.tokens_for(len(feats.features))
        if made > run:
            raise MediaError(f"[audio] a clip of {len(samples) / self.audio_config.sampling_rate:.2f} s makes {made} "
                             f"soft tokens; its run holds {run} (audio_soft_tokens_per_image): cut it into shorter "
                             "clips")
        return digest, partial(self.audio.encode, feats.features, n_valid, run)

    def prompt(self, ids, images=(), clips=(), *, limits: MediaLimits | None = None) -> MediaPrompt:
        """keyed(), every item through its tower (or from the cache of their outputs)."""
        return self.keyed(ids, images, clips, limits=limits).tail(0)

    def keyed(self, ids, images=(), clips=(), *, limits: MediaLimits | None = None) -> "KeyedPrompt":
        """`ids` (the tokenized expand(): a run of soft tokens per image view and clip,
        media.prompt's media_spans) with each run's keys from `images` and `clips`, each in
        order; for Gemma 3n, a row of an embedder for each of its hard tokens (<end_of_image>,
        <end_of_audio>) the ids hold. The towers run when a tail is taken, for the runs it
        feeds. Image runs are bidirectional blocks where the model's are (Gemma 3's)."""
        ids = np.array(ids, np.int64)
        runs = media_spans(ids.tolist(), self.tokens)
        items = {"image": [v for source in images for v in self.image_items(source, limits)],
                 "audio": [self.clip_item(source, limits) for source in clips]}
        for kind, got in items.items():
            n_runs = sum(r.kind == kind for r in runs)
            if n_runs != len(got):
                raise MediaError(f"[{kind}] the prompt has {n_runs} runs of {kind} tokens for {len(got)} "
                                 f"{'image views' if kind == 'image' else 'clips'}")
        spans = []
        for run in runs:
            digest, encode = items[run.kind][run.index]
            ids[run.start:run.start + run.length] = media_keys(digest, run.length)
            bidirectional = run.kind == "image" and self.vision.bidirectional
            spans.append((run.start, run.length, bidirectional, partial(self.rows, digest, encode)))
        spans += [(i, 1, False, partial(_given, row)) for i, row in self._hard_rows(ids, runs)]
        return KeyedPrompt(ids, sorted(spans, key=lambda s: s[0]), len(runs))

    def _hard_rows(self, ids: np.ndarray, runs) -> list[tuple[int, np.ndarray]]:
        """(index, row) of the ids of a Gemma 3n embedder's vocabulary outside the runs: its
        rows replace the text table's there, as Gemma3nModel embeds them."""
        embedders = [t for t in (self.vision, self.audio) if hasattr(t, "hard_row")]
        if not embedders:
            return []
        inside = np.zeros(len(ids), bool)
        for run in runs:
            inside[run.start:run.start + run.length] = True
        first = min(t.vocab_offset for t in embedders)
        out = []
        for i in np.flatnonzero(~inside & (ids >= first)):
            rows = [r for r in (t.hard_row(int(ids[i])) for t in embedders) if r is not None]
            if rows:
                out.append((int(i), rows[0][None]))
        return out


def _preprocessor(path) -> dict | None:
    """A checkpoint directory's preprocessor_config.json, None without one."""
    pre = path / "preprocessor_config.json"
    return json.loads(pre.read_text()) if pre.is_file() else None


def _first(encode: Callable[[np.ndarray], np.ndarray], batch: np.ndarray) -> np.ndarray:
    return encode(batch)[0]


def _given(row: np.ndarray) -> tuple[np.ndarray, float, bool]:
    return row, 0.0, True


@dataclass
class KeyedPrompt:
    """Prompt ids with their media's keys, before any tower ran: spans [(start, length,
    bidirectional, rows)], rows() -> (rows, tower seconds, from the cache). A chat turn takes
    the tail it feeds, so media wholly inside the cache's common prefix costs no tower time."""
    ids: np.ndarray
    spans: list[tuple[int, int, bool, Callable]]
    n_items: int  # the runs: one per image view and clip

    def tail(self, start: int) -> MediaPrompt:
        """The MediaPrompt of the ids from `start` on, with the rows of the spans it holds
        (their towers run now, or their outputs come from the cache). stats: media_items (the
        prompt's runs), media_cached (those not encoded now: in the cache of tower outputs, or
        wholly before `start`), tower_seconds."""
        spans, rows, seconds, encoded = [], [], 0.0, 0
        for s, n, bidi, get in self.spans:
            lo = max(s, start)
            if lo >= s + n:
                continue
            got, took, cached = get()
            seconds += took
            encoded += not cached
            spans.append((lo - start, s + n - lo, bidi))
            rows.append(got[lo - s:])
        stats = {"tower_seconds": seconds, "media_items": self.n_items, "media_cached": self.n_items - encoded}
        return MediaPrompt(self.ids[start:], spans, np.concatenate(rows).astype(np.float32) if rows else None, stats)


def recordable(messages: list) -> list[dict]:
    """Messages as a cache records them ('role' and 'content' str): a message with images
    keeps its text under the role "media:<role>", so a later turn that would re-render the
    record from text refuses (media_in) rather than feed the conversation without its images."""
    return [m if isinstance(m.get("content"), str) else
            {"role": "media:" + m["role"],
             "content": "".join(p.get("text", "") for p in m["content"] if p.get("type") == "text")}
            for m in messages]


def media_in(messages) -> bool:
    """Whether a cache's recorded messages hold a turn with images (recordable)."""
    return any(m["role"].startswith("media:") for m in messages)
