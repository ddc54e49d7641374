#!/usr/bin/env python3
"""Gemma 3n (E2B / E4B shapes, random weights) on metalkv beside transformers, in one run:
the KV cache's bytes per token with the model's layer sharing and as if every layer
stored its own, and greedy prefill and decode tok/s (issue 37, item 4).

    python bench/gpu/gemma3n.py --shape e4b --json FILE          # the H200 run (tools/cuda_run.sh)
    python bench/gpu/gemma3n.py --shape tiny --device host       # the host run: a tiny model, both engines on the CPU

1. Builds a transformers Gemma3nForCausalLM of the shape (E2B: 30 layers, 10 reading
   others' K/V, ffn 8192; E4B: 35 layers, 15 readers, ffn 16384; both hidden 2048, 8/2
   heads of 256, per-layer inputs of 256, vocab 262400) with random bf16 weights (tiny:
   float32), with correct_output_scale and the norms random too (zero-initialized, they
   would switch the per-layer inputs off), and saves it as a safetensors directory.
2. metalkv then transformers (bench/gpu/engine.py's measurements: a warm-up, medians of
   --repeat greedy generations of --new-tokens after a --prompt of random ids), and how
   many of their first greedy tokens agree.
3. KV bytes per token: metalkv's cache (KVCache.bytes_per_token: the layers that store) and
   the same times layers / storing layers, what a cache of every layer would hold.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine as gpu_engine  # noqa: E402  (bench/gpu/engine.py)
from common import device_name, log, table  # noqa: E402

BIG = dict(hidden_size=2048, num_attention_heads=8, num_key_value_heads=2, head_dim=256,
           hidden_size_per_layer_input=256, vocab_size=262400, vocab_size_per_layer_input=262144,
           laurel_rank=64, sliding_window=512)
SHAPES = {
    "e2b": dict(BIG, num_hidden_layers=30, num_kv_shared_layers=10, intermediate_size=8192),
    "e4b": dict(BIG, num_hidden_layers=35, num_kv_shared_layers=15, intermediate_size=16384),
    "tiny": dict(hidden_size=128, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                 hidden_size_per_layer_input=16, vocab_size=1024, vocab_size_per_layer_input=1000, laurel_rank=8,
                 sliding_window=16, num_hidden_layers=10, num_kv_shared_layers=5, intermediate_size=256),
}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--shape", choices=sorted(SHAPES), default="e4b")
    ap.add_argument("--device", default="cuda", help="metalkv device: cuda (default) or host")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prompt", type=int, default=256)
    ap.add_argument("--new-tokens", type=int, default=64)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--hf-cache", default="dynamic", help="transformers cache implementations, comma-separated")
    ap.add_argument("--hf-compile", choices=("auto", "off"), default="off")
    ap.add_argument("--check", type=int, default=0, metavar="N",
                    help="also compare metalkv's logits over the prompt's first N ids with transformers' run "
                         "in float32 (the random bf16 model's greedy ids are no test: transformers computes in bf16)")
    ap.add_argument("--dir", help="where the model is saved (default /tmp/metalkv-gemma3n-<shape>)")
    ap.add_argument("--json")
    a = ap.parse_args(argv)
    # what bench/gpu/engine.py's measuring functions read
    a.context, a.prefill_chunk, a.quantize = 0, 512, None
    a.kv_k = a.kv_v = "f16"
    a.kv_rotate = a.kv_residual = None
    return a


def build_model(a, tdev: str):
    import torch
    from transformers import Gemma3nForCausalLM, Gemma3nTextConfig

    shape = SHAPES[a.shape]
    n = shape["num_hidden_layers"]
    cfg = Gemma3nTextConfig(**shape, layer_types=["full_attention" if (i + 1) % 5 == 0 else "sliding_attention"
                                                  for i in range(n)],
                            activation_sparsity_pattern=[0.95] * min(10, n) + [0.0] * max(0, n - 10),
                            max_position_embeddings=32768)
    dtype = torch.float32 if a.shape == "tiny" else torch.bfloat16
    torch.manual_seed(a.seed)
    old = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        with torch.device(tdev):
            model = Gemma3nForCausalLM(cfg)
    finally:
        torch.set_default_dtype(old)
    with torch.no_grad():  # (zero- and one-initialized: random, so the per-layer inputs and the norms count;
        #                      q and k norms ~head_dim^-0.25 keep q.k O(1) under Gemma 3n's scale of 1)
        for name, p in model.named_parameters():
            if name.endswith("correct_output_scale") or p.dim() == 1:
                p.copy_(torch.rand_like(p) + 0.5)
            if name.endswith(("q_norm.weight", "k_norm.weight")):
                p.mul_(cfg.head_dim ** -0.25)
    return model.to(dtype).eval()


def kv_bytes(mk: dict, a) -> dict:
    """metalkv's cache bytes per token (its cache layers: those that store), and as if
    every layer stored its own (each cache layer holds the same per token)."""
    shape = SHAPES[a.shape]
    layers, stored = shape["num_hidden_layers"], shape["num_hidden_layers"] - shape["num_kv_shared_layers"]
    shared = mk["kv"]["bytes_per_token"]
    return dict(layers=layers, cache_layers=stored, shared_bytes_per_token=shared,
                every_layer_bytes_per_token=shared * layers / stored, saved=1 - stored / layers)


def f32_check(path: Path, ids: list[int], a, tdev: str) -> dict:
    """metalkv's logits at every position of ids against transformers' in float32."""
    import metalkv
    import torch
    from transformers import Gemma3nForCausalLM

    ref = Gemma3nForCausalLM.from_pretrained(str(path), dtype=torch.float32).to(tdev).eval()
    with torch.inference_mode():
        want = ref(torch.tensor([ids], device=tdev)).logits[0].float().cpu().numpy()
    del ref
    if tdev == "cuda":
        torch.cuda.empty_cache()
    got = metalkv.Engine.load(str(path), device=a.device, context=len(ids) + 16, progress=False).logits(ids)
    return dict(positions=len(ids), max_abs_diff=float(np.abs(got - want).max()),
                logit_scale=float(np.abs(want).max()), argmax_agree=int((got.argmax(1) == want.argmax(1)).sum()))


def main(argv=None) -> int:
    a = parse_args(argv)
    import torch

    tdev = "cuda" if a.device != "host" else "cpu"
    path = Path(a.dir or f"/tmp/metalkv-gemma3n-{a.shape}-s{a.seed}")
    path.mkdir(parents=True, exist_ok=True)
    notes: list[str] = []
    t0 = time.perf_counter()
    model = build_model(a, tdev)
    log(f"built {a.shape} in {time.perf_counter() - t0:.1f} s on {device_name(tdev)}")
    save_s = gpu_engine.save_model(model, path, gpu_engine.weight_fingerprint(model))
    log(f"saved in {save_s:.1f} s")
    prompt = np.random.default_rng(a.seed).integers(3, SHAPES[a.shape]["vocab_size_per_layer_input"],
                                                     size=a.prompt).tolist()
    res = dict(shape=a.shape, config=SHAPES[a.shape], device=device_name(tdev), torch=torch.__version__,
               prompt_tokens=a.prompt, new_tokens=a.new_tokens, notes=notes)
    mk = gpu_engine.bench_metalkv(path, prompt, a, notes)
    res["kv"] = kv_bytes(mk, a) if mk else None
    hf = gpu_engine.bench_transformers(model, prompt, a, tdev, notes)
    res["engines"] = ([mk] if mk else []) + hf
    for r in hf:
        r["engine"] = r["engine"].replace("f16", "f32" if a.shape == "tiny" else "bf16")  # (engine.py's label)
        r["agree_with_metalkv"] = gpu_engine.agreement(mk["tokens"], r["tokens"]) if mk else None
    if a.check:
        del model
        res["f32_check"] = f32_check(path, prompt[:a.check], a, tdev)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    kv = res["kv"] or {}
    print(f"Gemma 3n {a.shape} (random weights), {res['device']}; prompt {a.prompt}, {a.new_tokens} new tokens")
    if kv:
        print(f"KV bytes per token: {kv['shared_bytes_per_token']:,.0f} with its sharing, "
              f"{kv['every_layer_bytes_per_token']:,.0f} if every layer stored its own ({kv['saved']:.0%} less)")
    print(table(["engine", "prefill tok/s", "decode tok/s", "first tokens agreeing"],
                [[r["engine"], r["prefill_tok_s"], r["decode_tok_s"], r.get("agree_with_metalkv", "")]
                 for r in res["engines"]]))
    if a.check:
        c = res["f32_check"]
        print(f"against transformers in float32 over {c['positions']} positions: logits within {c['max_abs_diff']:.4f} "
              f"(largest {c['logit_scale']:.2f}), the same argmax at {c['argmax_agree']}")
    for n in notes:
        print("note:", n)
    return 0 if mk else 1


if __name__ == "__main__":
    sys.exit(main())
