#!/usr/bin/env python3
"""metalkv's engine vs transformers' generate on a random-weight Llama-3-8B-shaped model.

    python bench/gpu/engine.py [--layers 32] [--prompt 512] [--new-tokens 128] [--quantize q8_0] [--json FILE]
    python bench/gpu/engine.py --context 32768 --prompt 64 ...   # decode at 32k positions
    python bench/gpu/engine.py --device host --layers 2 --hidden 256 --heads 4 --kv-heads 2 \\
        --ffn 512 --vocab 1024 --prompt 32 --new-tokens 16      # local smoke test on the CPU

1. Builds a transformers LlamaForCausalLM with Llama-3.1-8B's config (hidden 4096, 32
   layers, 32/8 heads, ffn 14336, vocab 128256, rope_theta 500000, llama3 rope scaling;
   untied embeddings) and random f16 weights, initialized on the GPU with a fixed seed
   and a small std (--init-std) so that f16 activations stay finite (checked on the
   logits), and saves it as a safetensors HF directory (--dir; no tokenizer: both
   engines take token ids). Nothing is downloaded.
2. Measures the copy ceiling (torch copy_ of 2 GiB, bytes read + written).
3. metalkv: Engine.load(dir, device=..., quantize=--quantize), generate_ids(prompt,
   stop_ids=()), greedy; prefill and decode tok/s from engine.last_stats, after a warm-up.
   First, so that a slow transformers run (torch.compile) cannot cost these numbers.
   With --quantize q8_0 | q4_0 metalkv quantizes the f16 matrices at load (its load_s
   includes that); transformers stays f16 (its rows say so).
4. transformers: model.generate, greedy, f16, for each --hf-cache (static, dynamic),
   after a warm-up of the same length; a streamer notes when each token comes out:
   prefill = prompt in, first token out; decode tok/s = (new - 1) / the rest.
   --context N: before each timed generation the cache already holds N positions of random
   K/V (metalkv: KVCache.append_all_layers in chunks; transformers: a DynamicCache of the same
   size, its static cache is skipped), so every decode step reads N + prompt + i keys and
   values; the prompt then continues at position N. The two engines' random caches differ, so
   their tokens are not compared. Filling a 32k cache through an 8B prefill
   would cost minutes of GPU time and measure the prefill, not the decode.
5. Weight bytes read per decoded token (every matrix once, one row of the embedding
   table unless it is tied to the output), per engine from the types it holds (metalkv:
   Engine.weight_tensors, quantized blocks counted as stored), and the fraction of the copy ceiling that
   bytes/token x tok/s is; also with the KV cache reads at the mean decode position.
   And whether the engines' first greedy tokens agree (reported, not asserted).
"""
from __future__ import annotations

import argparse
import hashlib
import inspect
import json
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import LLAMA3_8B, add_shape_args, copy_ceiling, device_name, log, table  # noqa: E402

LLAMA3_ROPE_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}  # Llama-3.1-8B's config.json


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cuda", help="metalkv device: cuda (default) or host; torch runs on "
                                                     "the GPU for cuda, on the CPU for host")
    add_shape_args(ap, LLAMA3_8B)
    ap.add_argument("--vocab", type=int, default=128256)
    ap.add_argument("--tied", action="store_true", help="tie the output to the embedding (Llama-3-8B does not)")
    ap.add_argument("--init-std", type=float, default=0.02, help="std of the random weights (default 0.02)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=512, help="prompt length in token ids (default 512)")
    ap.add_argument("--new-tokens", type=int, default=128, help="greedy tokens generated (default 128)")
    ap.add_argument("--prefill-chunk", type=int, default=512, help="metalkv prompt tokens per step (default 512)")
    ap.add_argument("--context", type=int, default=0,
                    help="positions of random K/V already in the cache before the prompt (default 0)")
    ap.add_argument("--quantize", choices=("q8_0", "q4_0"), default=None,
                    help="metalkv quantizes the f16 matrices to this GGUF type at load (transformers stays f16)")
    ap.add_argument("--kv-k", default="f16", choices=("f16", "q8", "q4", "q2"), help="metalkv's KV cache K format")
    ap.add_argument("--kv-v", default="f16", choices=("f16", "q8", "q4", "q2"), help="metalkv's KV cache V format")
    ap.add_argument("--kv-rotate", action=argparse.BooleanOptionalAction, default=None,
                    help="metalkv: Hadamard-rotate the quantized KV layers (default: on for q4 and q2)")
    ap.add_argument("--kv-residual", type=int, default=None, help="metalkv: the residual window (tokens kept in f16)")
    ap.add_argument("--repeat", type=int, default=2, help="timed generations per engine; medians (default 2)")
    ap.add_argument("--hf-cache", default="static,dynamic",
                    help="transformers cache implementations to time, comma-separated ('' to skip transformers)")
    ap.add_argument("--hf-compile", choices=("auto", "off"), default="auto",
                    help="auto: transformers' default (it may torch.compile static-cache decoding; the warm-up "
                         "pays for it); off: disable_compile=True, eager")
    ap.add_argument("--dir", help="where the model is saved (default /tmp/metalkv-llama3-random-<shape>)")
    ap.add_argument("--json", help="write everything here")
    return ap.parse_args(argv)


# ---- the model ---------------------------------------------------------------------
def llama_config(a):
    from transformers import LlamaConfig

    big_vocab = a.vocab > 128009
    return LlamaConfig(
        vocab_size=a.vocab, hidden_size=a.hidden, intermediate_size=a.ffn, num_hidden_layers=a.layers,
        num_attention_heads=a.heads, num_key_value_heads=a.kv_heads, head_dim=a.hidden // a.heads,
        max_position_embeddings=131072, rms_norm_eps=1e-5, hidden_act="silu",
        rope_theta=500000.0, rope_scaling=dict(LLAMA3_ROPE_SCALING),  # transformers 5 turns these into rope_parameters
        tie_word_embeddings=a.tied, initializer_range=a.init_std, attention_bias=False, mlp_bias=False,
        bos_token_id=128000 if big_vocab else a.vocab - 2,
        eos_token_id=[128001, 128008, 128009] if big_vocab else [a.vocab - 1])


def build_model(a, tdev: str):
    import torch
    from transformers import LlamaForCausalLM

    torch.manual_seed(a.seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(torch.float16)  # initialize in f16: no f32 copy of 8B weights
    try:
        with torch.device(tdev):
            model = LlamaForCausalLM(llama_config(a))
    finally:
        torch.set_default_dtype(old)
    model = model.to(torch.float16).eval()
    exact_rope_frequencies(model)
    return model


def exact_rope_frequencies(model) -> None:
    """.to(float16) also rounds the rotary embedding's inv_freq buffer to f16, whose
    phase error grows with the position (measured: logits off by 0.28 at position 511
    on 8 layers). metalkv computes the frequencies in float32, as the checkpoint's
    config defines them; give transformers the same, so the two run one model."""
    import torch

    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    for mod in model.modules():
        if not hasattr(mod, "inv_freq") or not hasattr(mod, "config"):
            continue
        kind = getattr(mod, "rope_type", "default")
        init = mod.compute_default_rope_parameters if kind == "default" else ROPE_INIT_FUNCTIONS[kind]
        inv, _ = init(mod.config)
        mod.inv_freq = inv.to(device=mod.inv_freq.device, dtype=torch.float32)
        if hasattr(mod, "original_inv_freq"):
            mod.original_inv_freq = mod.inv_freq.clone()


def weight_fingerprint(model) -> str:
    """A hash of a few tensors: tells whether a saved directory holds these weights."""
    h = hashlib.sha256()
    for name, p in list(model.named_parameters())[:4] + list(model.named_parameters())[-2:]:
        h.update(name.encode())
        h.update(p.detach().flatten()[:4096].float().cpu().numpy().tobytes())
    return h.hexdigest()[:16]


def save_model(model, path: Path, fingerprint: str) -> float:
    """save_pretrained as safetensors, unless path already holds these weights. Seconds spent."""
    marker = path / "metalkv_bench.json"
    if marker.exists() and json.loads(marker.read_text()).get("fingerprint") == fingerprint:
        log(f"{path}: already holds these weights (fingerprint {fingerprint})")
        return 0.0
    t0 = time.perf_counter()
    kw = {}
    if "safe_serialization" in inspect.signature(model.save_pretrained).parameters:
        kw["safe_serialization"] = True  # transformers 5 always writes safetensors and has no such argument
    model.save_pretrained(str(path), **kw)
    marker.write_text(json.dumps({"fingerprint": fingerprint}))
    if not list(path.glob("*.safetensors")):
        sys.exit(f"engine.py: save_pretrained wrote no .safetensors under {path}")
    return time.perf_counter() - t0


def weight_bytes_per_token(model) -> dict:
    """Bytes a decode step reads from the weights: every parameter once (tied ones once),
    except the embedding table, of which one row is read unless the output is tied to it."""
    params = dict(model.named_parameters())  # named_parameters lists a tied tensor once
    total = sum(p.numel() * p.element_size() for p in params.values())
    emb = model.get_input_embeddings().weight
    tied = model.get_output_embeddings().weight.data_ptr() == emb.data_ptr()
    emb_bytes = emb.numel() * emb.element_size()
    row = emb.shape[1] * emb.element_size()
    per_token = total + row - (0 if tied else emb_bytes)
    return dict(total_bytes=total, per_token_bytes=per_token, embedding_bytes=emb_bytes, tied=tied, dtype="f16")


def metalkv_weight_bytes_per_token(eng) -> dict:
    """weight_bytes_per_token from the tensors as the engine holds them (after quantize=):
    a quantized embedding row is its blocks; norms are f32 on the device."""
    tensors = eng.weight_tensors
    emb = tensors["token_embd.weight"]
    tied = "output.weight" not in tensors
    total = sum(t.nbytes for t in tensors.values())
    per_token = total + emb.nbytes // emb.shape[0] - (0 if tied else emb.nbytes)
    matrices = sorted({t.dtype for t in tensors.values() if len(t.shape) == 2})
    return dict(total_bytes=total, per_token_bytes=per_token, embedding_bytes=emb.nbytes, tied=tied,
                dtype="+".join(matrices))


def kv_bytes_per_token(cfg, position: float) -> float:
    """K and V (f16) of every layer read by one decode step at `position`."""
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    return 2 * cfg.num_hidden_layers * cfg.num_key_value_heads * head_dim * 2 * (position + 1)


# ---- transformers --------------------------------------------------------------------
def sync(tdev: str) -> None:
    import torch

    if tdev == "cuda":
        torch.cuda.synchronize()


class TokenTimes:
    """A transformers streamer that notes when each put() comes: the prompt first, then
    every generated token (generate has already synchronized by then: .cpu())."""

    def __init__(self, tdev: str):
        self.tdev, self.t = tdev, []

    def put(self, value) -> None:
        sync(self.tdev)
        self.t.append(time.perf_counter())

    def end(self) -> None:
        pass


def hf_generate(model, ids, n: int, cache: str, a, tdev: str):
    """One greedy generate of n tokens: (prefill s, decode s, tokens), with metalkv's
    definitions: prefill = prompt in, first token out; decode = the other n - 1 steps."""
    import torch

    kw = dict(max_new_tokens=n, min_new_tokens=n, do_sample=False, pad_token_id=0,
              attention_mask=torch.ones_like(ids), temperature=None, top_p=None, top_k=None)
    if cache != "dynamic":
        kw["cache_implementation"] = cache
    if a.context:
        kw["past_key_values"] = hf_filled_cache(model, a, tdev)
        sync(tdev)
    if a.hf_compile == "off":
        kw["disable_compile"] = True  # transformers compiles static-cache decoding on its own otherwise
    times = TokenTimes(tdev)
    with torch.inference_mode():
        out = model.generate(ids, streamer=times, **kw)
    t = times.t
    return t[1] - t[0], t[-1] - t[1], out[0, ids.shape[1]:].tolist()


def random_kv(shape, seed: int, lib: str, tdev: str = "cpu"):
    """Random K or V rows of `shape`: numpy float32, or a torch f16 tensor on tdev."""
    if lib == "numpy":
        return (np.random.default_rng(seed).standard_normal(shape, np.float32) * 0.5).astype(np.float32)
    import torch

    g = torch.Generator(device=tdev).manual_seed(seed)
    return torch.randn(shape, generator=g, device=tdev, dtype=torch.float16) * 0.5


def hf_filled_cache(model, a, tdev: str):
    """A DynamicCache holding a.context positions of random K/V in every layer."""
    from transformers import DynamicCache

    cfg = model.config
    cache = DynamicCache()
    shape = (1, cfg.num_key_value_heads, a.context, cfg.hidden_size // cfg.num_attention_heads)
    for layer in range(cfg.num_hidden_layers):
        cache.update(random_kv(shape, 2 * layer, "torch", tdev), random_kv(shape, 2 * layer + 1, "torch", tdev), layer)
    return cache


def bench_transformers(model, prompt: list[int], a, tdev: str, notes: list) -> list[dict]:
    import torch

    ids = torch.tensor([prompt], device=tdev)
    rows = []
    plans = [(c, a.hf_compile) for c in a.hf_cache.split(",") if c]
    if a.context:
        if any(c != "dynamic" for c, _ in plans):
            notes.append("transformers: with --context only the dynamic cache runs (prefilled with random K/V)")
        plans = [(c, m) for c, m in plans if c == "dynamic"]
        # the ids of the cached positions only size the attention mask and the cache positions
        ids = torch.cat([torch.zeros((1, a.context), dtype=ids.dtype, device=tdev), ids], dim=1)
    while plans:
        cache, compile_ = plans.pop(0)
        opts = argparse.Namespace(**{**vars(a), "hf_compile": compile_})
        try:  # the warm-up has the timed runs' shapes: a static cache (and a compile) of the same length
            t0 = time.perf_counter()
            hf_generate(model, ids, a.new_tokens, cache, opts, tdev)
            warmup_s = time.perf_counter() - t0
            runs = [hf_generate(model, ids, a.new_tokens, cache, opts, tdev) for _ in range(a.repeat)]
        except Exception as e:  # an older transformers without this cache, no compiler, out of memory, ...
            notes.append(f"transformers generate (cache {cache}, compile {compile_}): {type(e).__name__}: "
                         f"{(str(e).strip().splitlines() or [''])[0][:200]}")
            if cache == "static" and compile_ == "auto":
                plans.insert(0, (cache, "off"))  # perhaps torch.compile failed: once more, eager
            continue
        pre = statistics.median(r[0] for r in runs)
        dec = statistics.median(r[1] for r in runs)
        label = f"transformers ({cache} cache{', eager' if compile_ == 'off' and cache == 'static' else ''}, f16)"
        rows.append(dict(engine=label, prefill_tok_s=len(prompt) / pre,  # the prompt past the cached context
                         decode_tok_s=(a.new_tokens - 1) / dec if dec > 0 else None,
                         prefill_s=pre, decode_s=dec, warmup_s=warmup_s, tokens=runs[-1][2]))
        log(f"transformers {cache}: prefill {len(prompt) / pre:.0f} tok/s, decode {rows[-1]['decode_tok_s'] or 0:.1f} "
            f"tok/s (warm-up {warmup_s:.1f} s)")
    return rows


# ---- metalkv -------------------------------------------------------------------------
def bench_metalkv(path: Path, prompt: list[int], a, notes: list) -> dict | None:
    import metalkv

    t0 = time.perf_counter()
    try:
        eng = metalkv.Engine.load(str(path), device=a.device, context=a.context + len(prompt) + a.new_tokens + 16,
                                  prefill_chunk=a.prefill_chunk, progress=False, quantize=a.quantize,
                                  kv_k=a.kv_k, kv_v=a.kv_v, kv_rotate=a.kv_rotate, kv_residual=a.kv_residual)
    except Exception as e:
        notes.append(f"metalkv Engine.load(device={a.device!r}, quantize={a.quantize!r}): {type(e).__name__}: {e}")
        return None
    load_s = time.perf_counter() - t0
    wb = metalkv_weight_bytes_per_token(eng)
    log(f"metalkv: loaded on {eng.device.name} in {load_s:.1f} s ({'quantized to ' + a.quantize + ', ' if a.quantize else ''}"
        f"{eng.weights_nbytes / 1e9:.2f} GB of weights; matrices {wb['dtype']})")
    cache = eng.new_cache()
    fill_s = fill_metalkv_cache(cache, a) if a.context else 0.0
    if a.context:
        log(f"metalkv: {a.context} positions of random K/V stored in {fill_s:.1f} s")
    eng.generate_ids(prompt[:16], stop_ids=(), max_tokens=min(4, a.new_tokens), cache=cache)  # warm-up
    runs, tokens = [], None
    for _ in range(a.repeat):
        cache.truncate(a.context)
        tokens = eng.generate_ids(prompt, stop_ids=(), max_tokens=a.new_tokens, cache=cache)
        runs.append(dict(eng.last_stats))
    med = lambda k: statistics.median(r[k] for r in runs)
    st = runs[-1]
    row = dict(engine=f"metalkv ({a.device}, {wb['dtype']})", prefill_tok_s=med("prefill_tok_s"), decode_tok_s=med("decode_tok_s"),
               prefill_s=med("prefill_seconds"), decode_s=med("decode_seconds"), load_s=load_s, tokens=list(tokens),
               weights_nbytes=eng.weights_nbytes, weights=wb, quantize=a.quantize,
               kv=dict(k=a.kv_k, v=a.kv_v, rotate=any(cache.rotated(l) for l in range(cache.n_layers)), residual=cache.residual,
                       bytes_per_token=cache.bytes_per_token),
               per_token={k: st[k] for k in ("dispatches_per_token", "compute_encoders_per_token",
                                             "command_buffers_committed_per_token", "waits_per_token") if k in st},
               finish_reason=st.get("finish_reason"))
    log(f"metalkv: prefill {row['prefill_tok_s']:.0f} tok/s, decode {row['decode_tok_s']:.1f} tok/s")
    return row


def fill_metalkv_cache(cache, a, chunk: int = 1024) -> float:
    """Stores a.context positions of random K/V into every layer of cache. Seconds spent."""
    t0 = time.perf_counter()
    if cache.residual:  # a residual window's ring takes stores of at most max_chunk tokens
        chunk = min(chunk, cache.max_chunk)
    # one random chunk stored again and again: the values only have to be finite (drawing 2 x 4 GB of
    # normals took ~45 s on the GPU machine's CPU)
    shape = (cache.n_layers, min(chunk, a.context), cache.n_kv_heads, cache.head_dim)
    k, v = random_kv(shape, 0, "numpy"), random_kv(shape, 1, "numpy")
    for start in range(0, a.context, chunk):
        n = min(chunk, a.context - start)
        cache.append_all_layers(np.ascontiguousarray(k[:, :n]), np.ascontiguousarray(v[:, :n]))
    return time.perf_counter() - t0


def agreement(ref: list[int], other: list[int]) -> int:
    n = 0
    for x, y in zip(ref, other):
        if x != y:
            break
        n += 1
    return n


def finish(rows: list[dict], hf_rows: list[dict], wb: dict, kv_b: float, ceiling: dict, context: int = 0) -> None:
    """Per engine: bytes/token x tok/s against the ceiling, and agreement with transformers."""
    ref = hf_rows[0]["tokens"] if hf_rows and not context else None  # random caches differ: not comparable
    for r in rows:
        tps = r.get("decode_tok_s") or 0.0
        per_token = r.get("weights", wb)["per_token_bytes"]  # metalkv's own (quantized) bytes; transformers' f16
        r["weight_GB_per_token"] = per_token / 1e9
        r["weight_GB_per_s"] = per_token * tps / 1e9
        r["pct_ceiling_weights"] = 100 * r["weight_GB_per_s"] / ceiling["GBps"]
        r["pct_ceiling_weights_kv"] = 100 * (per_token + kv_b) * tps / 1e9 / ceiling["GBps"]
        r["ms_per_token"] = 1e3 / tps if tps else None
        if ref is not None and r is not hf_rows[0]:
            r["agree_with_transformers"] = agreement(ref, r["tokens"])


def print_report(res: dict, mk: dict | None, hf_rows: list[dict]) -> None:
    wb, kv_b, ceiling = res["weights"], res["kv_bytes_per_token_mean"], res["ceiling"]
    print(f"\n## engine: random-weight Llama-3-8B-shaped model ({res['model']}) on {res['device']}\n")
    print((f"{res['context']} cached positions of random K/V, then " if res.get("context") else "")
          + f"prompt {res['prompt_tokens']} ids, {res['new_tokens']} greedy tokens; weights read per token "
          f"{wb['per_token_bytes'] / 1e9:.3f} GB (f16, {'tied' if wb['tied'] else 'untied'} output)"
          + (f", metalkv's {mk['weights']['per_token_bytes'] / 1e9:.3f} GB ({mk['weights']['dtype']})" if mk else "")
          + ", "
          f"KV read per token at the mean position {kv_b / 1e6:.1f} MB; copy ceiling {ceiling['GBps']:.0f} GB/s; "
          f"logits finite: {res['logits_finite']}")
    if mk:
        print("metalkv per decoded token: " + ", ".join(f"{k.replace('_per_token', '')} {v:.1f}"
                                                         for k, v in mk["per_token"].items()))
    for n in res["notes"]:
        print(f"note: {n}")
    ref = hf_rows[0]["tokens"] if hf_rows else None
    if ref is not None:
        print(f"first tokens: transformers {ref[:8]}" + (f", metalkv {mk['tokens'][:8]}" if mk else ""))
    print()

    def agree(r):
        if "agree_with_transformers" in r:
            return f"{r['agree_with_transformers']}/{len(r['tokens'])}"
        return "(reference)" if hf_rows and r is hf_rows[0] else "-"

    print(table(["engine", "prefill tok/s", "decode tok/s", "ms/token", "weight GB/token", "weight GB/s",
                 "% ceiling (weights)", "% ceiling (+KV)", "greedy tokens = transformers"],
                [[r["engine"], r["prefill_tok_s"], r["decode_tok_s"], r["ms_per_token"], r["weight_GB_per_token"],
                  r["weight_GB_per_s"],
                  r["pct_ceiling_weights"], r["pct_ceiling_weights_kv"], agree(r)] for r in res["engines"]]))


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    t_start = time.perf_counter()
    tdev = "cuda" if a.device != "host" else "cpu"
    if tdev == "cuda" and not torch.cuda.is_available():
        sys.exit("engine.py: torch sees no CUDA GPU; --device host runs the local smoke test")
    notes: list[str] = []
    shape = f"l{a.layers}_h{a.hidden}_q{a.heads}_kv{a.kv_heads}_f{a.ffn}_v{a.vocab}{'_tied' if a.tied else ''}"
    path = Path(a.dir or f"/tmp/metalkv-llama3-random-{shape}-s{a.seed}")
    path.mkdir(parents=True, exist_ok=True)
    log(f"torch {torch.__version__} on {device_name(tdev)}; model {shape} -> {path}")

    t0 = time.perf_counter()
    model = build_model(a, tdev)
    build_s = time.perf_counter() - t0
    wb = weight_bytes_per_token(model)
    prompt = np.random.default_rng(a.seed).integers(0, a.vocab, size=a.prompt).tolist()
    with torch.inference_mode():
        logits = model(torch.tensor([prompt[:64]], device=tdev)).logits.float()
    finite, logit_std = bool(torch.isfinite(logits).all()), float(logits.std())
    del logits
    log(f"built in {build_s:.1f} s: {wb['total_bytes'] / 1e9:.2f} GB of f16 weights; logits finite: {finite}, "
        f"std {logit_std:.3f}")
    if not finite:
        notes.append(f"the random model's logits are not all finite in f16 (init std {a.init_std}); lower --init-std")
    save_s = save_model(model, path, weight_fingerprint(model))
    log(f"saved in {save_s:.1f} s")
    ceiling = copy_ceiling(tdev)
    kv_b = kv_bytes_per_token(model.config, a.context + a.prompt + (a.new_tokens - 1) / 2)
    res = dict(device=device_name(tdev), torch=torch.__version__, model=shape, dir=str(path),
               config=json.loads(model.config.to_json_string()), context=a.context, prompt_tokens=a.prompt,
               new_tokens=a.new_tokens,
               weights=wb, kv_bytes_per_token_mean=kv_b, logits_finite=finite, logit_std=logit_std,
               ceiling=ceiling, build_s=build_s, save_s=save_s, engines=[], notes=notes)

    # metalkv first (transformers' model idles in GPU memory meanwhile): a transformers
    # run that takes too long, torch.compile included, cannot cost metalkv's numbers.
    mk = bench_metalkv(path, prompt, a, notes)
    res["engines"] = [mk] if mk else []
    finish(res["engines"], [], wb, kv_b, ceiling, a.context)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    hf_rows = bench_transformers(model, prompt, a, tdev, notes)
    res["engines"] += hf_rows
    finish(res["engines"], hf_rows, wb, kv_b, ceiling, a.context)
    res["seconds"] = time.perf_counter() - t_start
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    log(f"engine.py: {res['seconds']:.0f} s")
    print_report(res, mk, hf_rows)
    return 0 if mk else 1


if __name__ == "__main__":
    sys.exit(main())
