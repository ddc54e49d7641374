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
    engine.generate(prompt) / engine.logits(prompt)
"""
from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from dataclasses import dataclass, field

import numpy as np

from .media import ImageConfig, MediaError, load_image, preprocess_image
from .media.prompt import MediaTokens, expand, media_spans
from .models.vision import Gemma3Vision

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

    def tail(self, start: int) -> "MediaPrompt":
        """The prompt from index `start` on (what a chat turn feeds after the cache's common prefix)."""
        ids, media = self.fed_from(start)
        spans, rows = media if media else ([], None)
        return MediaPrompt(ids, spans, rows, self.stats)

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
    """A model's image tower (Gemma 3's SigLIP), its processor settings, and the soft
    tokens it made, by media hash."""

    kinds = ("image",)  # the content parts its model reads

    def __init__(self, vision: Gemma3Vision, image_config: ImageConfig, tokens: MediaTokens | None = None,
                 cache_bytes: int = 256 << 20):
        self.vision, self.image_config = vision, image_config
        self.tokens = tokens  # the processor's layout of an image in the prompt (None: no tokenizer to read it)
        self._cache = _SoftTokenCache(cache_bytes)

    @classmethod
    def load(cls, device, loaded) -> "Media | None":
        """The towers of a loaded checkpoint (a directory whose config.json has them); None
        for a model without one metalkv runs."""
        config, path = loaded.metadata, loaded.path
        if not path.is_dir() or config.get("model_type") != "gemma3" or not config.get("vision_config"):
            return None
        vision = Gemma3Vision.load(device, path, config)
        pre = path / "preprocessor_config.json"
        preprocessor = json.loads(pre.read_text()) if pre.is_file() else None
        image_config = ImageConfig.from_preprocessor_config(
            preprocessor or {"size": {"height": vision.image_size, "width": vision.image_size}}, "gemma3")
        tokens = MediaTokens.from_hf_config(config, loaded.tokenizer.id_to_token) if loaded.tokenizer else None
        return cls(vision, image_config, tokens)

    def chat_prompt(self, engine, messages: list, sources: list) -> MediaPrompt:
        """Checked messages (their images as template parts) and the images' sources, in
        order: rendered with the chat template, each image expanded as the processor lays it
        out, tokenized, and keyed (prompt)."""
        if self.tokens is None or engine.tokenizer is None:
            raise MediaError("[image] this checkpoint has no tokenizer to lay out an image in the prompt")
        text = expand(engine.chat_template.render(messages, add_generation_prompt=True), self.tokens,
                      images=len(sources))
        return self.prompt(engine.tokenizer.encode(text), [p.source for p in sources])

    def image_rows(self, source) -> tuple[list[np.ndarray], list[bytes], float, int]:
        """The soft tokens of one image (a path, bytes, data URL or PIL image): the rows of
        each of its views (the image, then pan-and-scan crops when the processor makes
        them), their digests, the tower's seconds, and how many views came from the cache."""
        image = source if hasattr(source, "convert") else load_image(source)
        pixels = preprocess_image(image, self.image_config).pixel_values
        rows, digests, seconds, cached = [], [], 0.0, 0
        for view in pixels:
            digest = hashlib.sha256(np.ascontiguousarray(view, np.float32).tobytes()).digest()
            got = self._cache.get(digest)
            if got is None:
                t0 = time.perf_counter()
                got = self.vision.encode(view[None])[0]
                seconds += time.perf_counter() - t0
                self._cache.put(digest, got)
            else:
                cached += 1
            rows.append(got)
            digests.append(digest)
        return rows, digests, seconds, cached

    def prompt(self, ids, images) -> MediaPrompt:
        """`ids` (the tokenized expand(): a run of soft tokens per image view, media.prompt's
        media_spans) with each run's keys and rows from `images`, in order."""
        ids = np.array(ids, np.int64)
        runs = media_spans(ids.tolist(), self.tokens)
        views, digests, seconds, cached = [], [], 0.0, 0
        for source in images:
            r, d, s, c = self.image_rows(source)
            views += r
            digests += d
            seconds += s
            cached += c
        if len(runs) != len(views):
            raise MediaError(f"[image] the prompt has {len(runs)} runs of image tokens for {len(views)} image "
                             f"views")
        for run, digest in zip(runs, digests):
            ids[run.start:run.start + run.length] = media_keys(digest, run.length)
        rows = np.concatenate(views).astype(np.float32) if views else None
        return MediaPrompt(ids, [(run.start, run.length, True) for run in runs], rows,
                           {"tower_seconds": seconds, "media_items": len(views), "media_cached": cached})


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
