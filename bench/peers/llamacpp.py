"""llama.cpp through llama-cpp-python, CPU, on the same GGUF file.

The prompt ids go in as they are (no tokenizing, no BOS added). Greedy is an argmax over
llama.cpp's last logits row done here, so no sampler setting of llama-cpp-python enters.
Wall-clock times are measured around llama_decode calls; llama.cpp's own perf counters
are reported beside them as a cross-check.
"""
from __future__ import annotations

import importlib.metadata as md
import os

import numpy as np

from .common import PeerResult, PeerUnavailable, RunSpec, Timing, measure, timed


# ggml's type ids (ggml.h: GGML_TYPE_Q4_0 = 2, GGML_TYPE_Q8_0 = 8) for metalkv's KV format names.
LLAMA_KV_TYPES = {"q8": 8, "q4": 2}


def run(spec: RunSpec) -> PeerResult:
    try:
        import llama_cpp
    except ImportError as e:
        raise PeerUnavailable(f"llama-cpp-python not installed ({e.name})") from None

    n_ctx = len(spec.prompt_ids) + spec.n_decode + 8
    # A quantized cache: llama.cpp's q8_0 / q4_0 for K and V, which needs its flash attention.
    kv = {} if spec.kv == "f16" else dict(
        type_k=LLAMA_KV_TYPES[spec.kv], type_v=LLAMA_KV_TYPES[spec.kv], flash_attn=True)
    llm = llama_cpp.Llama(
        model_path=spec.model_path, n_ctx=n_ctx, n_batch=max(len(spec.prompt_ids), 32),
        n_threads=spec.threads, n_threads_batch=spec.threads, n_gpu_layers=0,
        logits_all=False, verbose=False, **kv)
    n_vocab = llm.n_vocab()

    def argmax_last() -> int:
        # (n_vocab,) float32 view of the logits of the last token fed
        row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))
        return int(np.argmax(row))      # lowest id on a tie, like metalkv's sampler

    def generate() -> Timing:
        llm.reset()                      # n_tokens = 0; eval() drops the KV cells after it
        llama_cpp.llama_perf_context_reset(llm.ctx)

        def prefill() -> int:
            llm.eval(list(spec.prompt_ids))
            return argmax_last()

        first, t_prefill = timed(prefill)
        tokens = [first]

        def decode() -> None:
            for _ in range(spec.n_decode - 1):
                llm.eval([tokens[-1]])
                tokens.append(argmax_last())

        _, t_decode = timed(decode)
        perf = llama_cpp.llama_perf_context(llm.ctx)
        extra = {}
        if perf.n_p_eval > 0 and perf.t_p_eval_ms > 0:
            extra["internal_prefill_tok_s"] = perf.n_p_eval / perf.t_p_eval_ms * 1e3
        if perf.n_eval > 0 and perf.t_eval_ms > 0:
            extra["internal_decode_tok_s"] = perf.n_eval / perf.t_eval_ms * 1e3
        return Timing(t_prefill, t_decode, tokens, extra)

    res = measure("llama.cpp", spec, generate)
    version = md.version("llama-cpp-python")
    sysinfo = llama_cpp.llama_print_system_info().decode(errors="replace")
    res.extra["version"] = version
    res.extra["system_info"] = sysinfo.strip()
    res.extra["threads"] = spec.threads
    res.notes.append(f"llama-cpp-python {version}, CPU, n_threads={spec.threads} "
                     f"(batch {spec.threads}) of {os.cpu_count()} cores, weights Q4_1 as stored")
    del llm
    return res
