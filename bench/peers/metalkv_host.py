"""metalkv through the host executor (its Metal kernels compiled as C++ and run on the CPU).

Times come from the engine's own counters (eng.last_stats): prefill is prompt in, first
token out; decode is the steps after it. Those follow the same convention as
common.py, so they sit in the same columns as the peers' wall-clock numbers. The
per-token dispatch/encoder/command-buffer/wait counts are the decode steps' averages.
"""
from __future__ import annotations

from .common import PeerResult, PeerUnavailable, RunSpec, Timing, measure, timed

# last_stats keys reported per decoded token (averages over the decode steps)
PER_TOKEN_KEYS = ("dispatches_per_token", "compute_encoders_per_token", "blit_encoders_per_token",
                  "command_buffers_committed_per_token", "waits_per_token")


def run(spec: RunSpec, *, device: str = "host", prefill_chunk: int | None = None) -> PeerResult:
    try:
        import metalkv
    except ImportError as e:
        raise PeerUnavailable(f"metalkv not installed ({e.name})") from None

    chunk = prefill_chunk or max(len(spec.prompt_ids), 1)
    context = len(spec.prompt_ids) + spec.n_decode + 8
    # kv_memory=0: no shared pool, so no prefix cache. With one, every timed run after the
    # warm-up found the whole prompt cached (1,500 tokens "prefilled" at ~1,500 tok/s).
    kv = {} if spec.kv == "f16" else {"kv_k": spec.kv, "kv_v": spec.kv}
    eng = metalkv.Engine.load(spec.model_path, device=device, context=context,
                              prefill_chunk=chunk, kv_memory=0, progress=False, **kv)

    def generate() -> Timing:
        # stop_ids=(): never stop on end-of-generation ids, like the peers
        tokens, wall = timed(lambda: eng.generate_ids(list(spec.prompt_ids), max_tokens=spec.n_decode,
                                                      temperature=0.0, stop_ids=()))
        st = eng.last_stats
        extra = {k: float(st[k]) for k in PER_TOKEN_KEYS if k in st}
        extra["wall_s"] = wall
        extra["engine_prefill_tok_s"] = st.get("prefill_tok_s")
        extra["engine_decode_tok_s"] = st.get("decode_tok_s")
        return Timing(float(st["prefill_seconds"]), float(st["decode_seconds"]), tokens, extra)

    res = measure("metalkv", spec, generate)
    res.extra["version"] = getattr(metalkv, "__version__", "?")
    res.extra["device"] = str(eng.device)
    res.extra["prefill_chunk"] = chunk
    res.notes.append(f"metalkv {res.extra['version']}, device={device} (Metal kernels run on the "
                     f"CPU by the host executor), prefill_chunk={chunk}, weights Q4_1 as stored")
    return res
