"""Every engine kernel family once, at small sizes, on one device: the program
compute-sanitizer runs (memcheck, racecheck, synccheck, initcheck) in
tools/cuda_run.sh. Correctness is the test suite's job; this only has to reach
every kernel with realistic arguments, quickly, and check the outputs are finite.

    python tools/cuda_smoke.py [--device cuda]      # prints the kernel families it ran
"""
from __future__ import annotations

import argparse
import sys

import numpy as np

import metalkv
from metalkv._core import ops

WTYPES = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1")


def weights(wtype: str, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Random (rows, cols) weights as the kernels read them (quantized: packed)."""
    w = (rng.standard_normal((rows, cols)) * 0.1).astype(np.float32)
    if wtype in ("f32", "f16"):
        return w.astype(np.float32 if wtype == "f32" else np.float16)
    from gguf import GGMLQuantizationType, quants

    return ops.pack_weights(wtype, quants.quantize(w, GGMLQuantizationType[wtype.upper()]), cols=cols)


def f32(dev, n: int, rng) -> "metalkv.Buffer":
    return dev.buffer_from(rng.standard_normal(n).astype(np.float32))


def finite(buf, n: int, what: str) -> None:
    out = buf.numpy().view(np.float32)[:n]
    if not np.isfinite(out).all():
        raise SystemExit(f"cuda_smoke: {what} produced non-finite values")


def run(dev) -> list[str]:
    rng = np.random.default_rng(0)
    ran = []
    n_in, n_out = 256, 96
    for wtype in WTYPES:
        w = dev.buffer_from(np.ascontiguousarray(weights(wtype, n_out, n_in, rng)))
        w2 = dev.buffer_from(np.ascontiguousarray(weights(wtype, 2 * n_out, n_in, rng)))
        for tokens, kernel in ((1, "gemv"), (1, "gemv"), (40, "gemm")):
            x, y = f32(dev, tokens * n_in, rng), dev.buffer(tokens * n_out * 4)
            rows = {1: 0}.get(tokens, 0)
            ops.matmul(dev, x, w, y, n_tokens=tokens, n_in=n_in, n_out=n_out, wtype=wtype, kernel=kernel,
                       gemv_rows=rows)
            finite(y, tokens * n_out, f"{kernel}_{wtype}")
        for rows in (1, 2, 4, 8, 32):  # the GPU shapes, the 8-row and the host executor's 32-row one
            x, y = f32(dev, n_in, rng), dev.buffer(n_out * 4)
            ops.matmul(dev, x, w, y, n_tokens=1, n_in=n_in, n_out=n_out, wtype=wtype, kernel="gemv", gemv_rows=rows,
                       accumulate=True)
            for act in ("silu", "gelu_tanh"):
                ops.matmul_glu(dev, x, w2, y, n_tokens=1, n_in=n_in, n_out=n_out, wtype=wtype, act=act,
                               gemv_rows=rows)
                finite(y, n_out, f"gemv_glu_{wtype}_r{rows}_{act}")
        table = dev.buffer_from(np.ascontiguousarray(weights(wtype, 64, n_in, rng)))
        ids = dev.buffer_from(np.array([0, 5, 63, 7], np.int32))
        emb = dev.buffer(4 * n_in * 4)
        ops.embedding(dev, table, ids, emb, n_tokens=4, dim=n_in, vocab=64, ttype=wtype)
        finite(emb, 4 * n_in, f"embedding_{wtype}")
        ran += [f"gemv/gemm/glu/embedding {wtype}"]

    x = f32(dev, 6 * n_in, rng)
    out = dev.buffer(6 * n_in * 4)
    for wtype in ("f32", "f16"):
        norm = dev.buffer_from(rng.standard_normal(n_in).astype(np.float32 if wtype == "f32" else np.float16))
        ops.rms_norm(dev, x, norm, out, n_rows=6, dim=n_in, eps=1e-5, wtype=wtype)
        finite(out, 6 * n_in, f"rms_norm_{wtype}")
    y = f32(dev, 6 * n_in, rng)
    ops.add(dev, y, x, n=6 * n_in)
    ops.scale(dev, y, n=6 * n_in, s=0.5)
    ops.softcap(dev, y, n=6 * n_in, cap=30.0)
    ops.swiglu(dev, x, y, out, n=6 * n_in)
    ops.geglu(dev, x, y, out, n=6 * n_in)
    finite(out, 6 * n_in, "elementwise")
    logits = f32(dev, 3 * 1000, rng)
    probs = dev.buffer(3 * 1000 * 4)
    ops.softmax(dev, logits, probs, n_rows=3, n=1000)
    arg = dev.buffer(3 * 4)
    ops.argmax(dev, logits, arg, n_rows=3, n=1000)
    penalty = dev.buffer_from(np.array([1, 2, 3], np.uint32))
    ops.sample(dev, logits, 1000, uniform=0.3, temperature=0.8, top_k=40, top_p=0.9, min_p=0.05,
               repetition_penalty=1.1, penalty_ids=penalty, n_penalty_ids=3)
    ran += ["rms_norm, add, scale, softcap, swiglu, geglu, softmax, argmax, sample"]

    for d in (64, 128, 256):
        n_q, n_kv, n_tok = 8, 2, 300
        inv = dev.buffer_from(np.asarray(ops.rope_inv_freq_default(d, 10000.0), np.float32))
        for style in ("neox", "interleaved"):
            q = f32(dev, 5 * n_q * d, rng)
            pos = dev.buffer_from(np.arange(5, dtype=np.uint32))
            ops.rope(dev, q, pos, inv, n_tokens=5, n_heads=n_q, head_dim=d, style=style)
            cache = metalkv.KVCache(dev, 1, n_kv, d, 512, max_chunk=64)
            k = rng.standard_normal((n_tok, n_kv, d)).astype(np.float32)
            cache.append_all_layers(k[None], k[None], rope=dict(style=style, inv_freq=np.asarray(
                ops.rope_inv_freq_default(d, 10000.0), np.float32)))
        sliding = metalkv.KVCache(dev, 1, n_kv, d, 512, windows=[64], max_chunk=16, store="blit")
        for _ in range(3):
            k = rng.standard_normal((16, n_kv, d)).astype(np.float32)
            sliding.append(0, k, k)
        kv = dev.buffer_from(np.ascontiguousarray(rng.standard_normal((2, 512, n_kv, d)).astype(np.float16)))
        q, o = f32(dev, n_q * d, rng), dev.buffer(n_q * d * 4)
        sinks = f32(dev, n_q, rng)
        table = dev.buffer_from(rng.permutation(16).astype(np.uint32))  # 512 slots = 16 blocks, shuffled
        ring = dev.buffer_from((np.arange(16) % 4).astype(np.uint32))   # a sliding layer's 4 blocks
        for split in ("never", "always"):
            ops.attention_decode(dev, q, kv, table, o, n_q_heads=n_q, n_kv_heads=n_kv, head_dim=d, n_tokens=n_tok, slots=512,
                                 split=split, chunks=4 if split == "always" else 0, sinks=sinks, softcap=30.0)
            finite(o, n_q * d, f"attn_decode d{d} {split}")
        ops.attention_decode(dev, q, kv, ring, o, n_q_heads=n_q, n_kv_heads=n_kv, head_dim=d, n_tokens=n_tok, slots=128,
                             window=90)
        qp, op = f32(dev, 40 * n_q * d, rng), dev.buffer(40 * n_q * d * 4)
        ops.attention_prefill(dev, qp, kv, table, op, n_q_heads=n_q, n_kv_heads=n_kv, head_dim=d, n_queries=40,
                              q_pos0=n_tok - 40, slots=512)
        finite(op, 40 * n_q * d, f"attn_prefill d{d}")
        ran += [f"rope, kv_store (compute, blit, ring), attention decode/split/reduce/sliding/prefill through block tables d{d}"]

        # quantized KV (issue 14): the store quantizing after rope and rotating, both store paths, a
        # sliding layer; the _kvq decode (single, split, 4-row) and prefill kernels; the rotation op
        inv_np = np.asarray(ops.rope_inv_freq_default(d, 10000.0), np.float32)
        for store in ("compute", "blit"):
            qc = metalkv.KVCache(dev, 2, n_kv, d, 512, windows=[0, 64], max_chunk=48, store=store,
                                 kv_k=["q4", "q8"], kv_v=["q8", "q4"], kv_rotate=True)
            for _ in range(3):
                k = rng.standard_normal((2, 48, n_kv, d)).astype(np.float32)
                qc.append_all_layers(k, k.copy(), rope=dict(style="neox", inv_freq=inv_np))
            qc.append(0, rng.standard_normal((3, n_kv, d)).astype(np.float32),
                      rng.standard_normal((3, n_kv, d)).astype(np.float32), rope=dict(style="neox", inv_freq=inv_np),
                      q=rng.standard_normal((3, n_q, d)).astype(np.float32))
        qkv = dev.buffer_from(rng.integers(0, 256, 512 * n_kv * (3 * d + 64), dtype=np.uint8))
        for kv_k, kv_v in (("q8", "q4"), ("q4", "f16")):
            for split, heads in (("never", n_q), ("always", n_q), ("never", 2 * n_kv)):
                ops.attention_decode(dev, q, qkv, table, o, n_q_heads=heads, n_kv_heads=n_kv, head_dim=d, n_tokens=n_tok,
                                     slots=512, split=split, chunks=4 if split == "always" else 0, kv_k=kv_k, kv_v=kv_v)
            ops.attention_prefill(dev, qp, qkv, table, op, n_q_heads=n_q, n_kv_heads=n_kv, head_dim=d, n_queries=40,
                                  q_pos0=n_tok - 40, slots=512, window=100, kv_k=kv_k, kv_v=kv_v)
        ops.hadamard(dev, op, n_rows=40, n_heads=n_q, head_dim=d)
        ran += [f"quantized kv_store (q8/q4, rotated, compute, blit, sliding), attn_decode/split/prefill _kvq, hadamard d{d}"]

        # the residual window and q2: the store's ring and q2 V codes, kv_seal_q2k (blocks filled
        # by appends of 48), and the _res decode (single, split) and prefill kernels over a ring
        for store in ("compute", "blit"):
            rc = metalkv.KVCache(dev, 2, n_kv, d, 512, max_chunk=48, store=store, kv_k=["q2", "q4"],
                                 kv_v=["q2", "q8"], kv_rotate=True, kv_residual=64)
            for _ in range(4):
                k = rng.standard_normal((2, 48, n_kv, d)).astype(np.float32)
                rc.append_all_layers(k, k.copy(), rope=dict(style="neox", inv_freq=inv_np))
            rc.truncate(150)
            rc.append(0, rng.standard_normal((3, n_kv, d)).astype(np.float32),
                      rng.standard_normal((3, n_kv, d)).astype(np.float32), rope=dict(style="neox", inv_freq=inv_np))
        ring = dev.buffer_from(rng.standard_normal(2 * 160 * n_kv * d).astype(np.float16))
        for kv_k, kv_v in (("q2", "q2"), ("q4", "q8")):
            for split in ("never", "always"):
                ops.attention_decode(dev, q, qkv, table, o, n_q_heads=n_q, n_kv_heads=n_kv, head_dim=d, n_tokens=n_tok,
                                     slots=512, split=split, chunks=4 if split == "always" else 0, kv_k=kv_k,
                                     kv_v=kv_v, ring=ring, residual=64, ring_slots=160, ring_lo=n_tok - 100)
            ops.attention_prefill(dev, qp, qkv, table, op, n_q_heads=n_q, n_kv_heads=n_kv, head_dim=d, n_queries=40,
                                  q_pos0=n_tok - 40, slots=512, kv_k=kv_k, kv_v=kv_v, ring=ring, residual=64,
                                  ring_slots=160, ring_lo=n_tok - 140)
        ran += [f"residual window: kv_store ring, q2 V codes, kv_seal_q2k, attn_decode/split/prefill _res d{d}"]

        # eviction policies: keynorm's kv_key_scores and the compaction's kv_move_rows (f16 and q8,
        # compute and blit), and the attention kernels' logits with attn_scores_stats / _add
        for store, fmt in (("compute", "f16"), ("blit", "q8")):
            pc = metalkv.KVCache(dev, 2, n_kv, d, 128, max_chunk=16, store=store, kv_k=[fmt, fmt], kv_v=[fmt, fmt],
                                 kv_policy={"policy": "keynorm", "sinks": 4})
            for _ in range(20):
                k = rng.standard_normal((2, 16, n_kv, d)).astype(np.float32)
                pc.append_all_layers(k, k.copy(), rope=dict(style="neox", inv_freq=inv_np))
        logits = dev.buffer(40 * n_q * n_tok * 4)
        scores = dev.buffer(n_kv * n_tok * 4)
        f16 = dev.buffer_from(rng.standard_normal(2 * 512 * n_kv * d).astype(np.float16))
        for kv_k, pool in (("f16", f16), ("q8", qkv)):
            for split in ("never", "always"):
                ops.attention_decode(dev, q, pool, table, o, n_q_heads=n_q, n_kv_heads=n_kv, head_dim=d, n_tokens=n_tok,
                                     slots=512, split=split, chunks=4 if split == "always" else 0, kv_k=kv_k, kv_v=kv_k,
                                     logits=logits, scores=scores)
            ops.attention_prefill(dev, qp, pool, table, op, n_q_heads=n_q, n_kv_heads=n_kv, head_dim=d, n_queries=40,
                                  q_pos0=n_tok - 40, slots=512, kv_k=kv_k, kv_v=kv_k, logits=logits, scores=scores,
                                  score_rows_from=8)
        ran += [f"eviction: kv_key_scores, kv_move_rows, attn_decode/split/prefill logits, attn_scores_* d{d}"]
    return ran


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--device", default="cuda")
    args = ap.parse_args(argv)
    dev = metalkv.device(args.device)
    for line in run(dev):
        print(f"cuda_smoke: ran {line}")
    print(f"cuda_smoke: ok on {dev.kind} ({dev.name})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
