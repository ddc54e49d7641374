"""One attention_decode call timed alone on the host: 9 query heads, 3 KV heads,
N keys (1500), head_dim D (64), the device's default kernel (VARIANT: "host" for
the SIMD-group _h kernels). LAYERS > 1 rotates that many copies of the pool so
the K/V comes from DRAM, as 30 layers' caches do. From the repository root:

    METALKV_HOST_THREADS=2 OPENBLAS_NUM_THREADS=1 D=64 LAYERS=30 \
        python bench/results/host-2026-12-05-issue31-decode/attn_decode_microbench.py
"""
import os, sys, time
sys.path.insert(0, "tests"); sys.path.insert(0, "tests/kv")
import numpy as np
from metalkv._core import ops
from attention_ref import build_cache
from devices import test_device
d = int(os.environ.get("D", 64)); n = int(os.environ.get("N", 1500)); reps = int(os.environ.get("REPS", 60))
variant = os.environ.get("VARIANT", "")
dev = test_device()
rng = np.random.default_rng(0)
q = (2.0 * rng.standard_normal((9, d))).astype(np.float32)
k = rng.standard_normal((n, 3, d)).astype(np.float16); v = rng.standard_normal((n, 3, d)).astype(np.float16)
cache = build_cache(k, v, spare=1)
L = int(os.environ.get("LAYERS", 1))
qb, tb = dev.buffer_from(q), dev.buffer_from(cache.table)
kvbs = [dev.buffer_from(cache.pool) for _ in range(L)]
layer = [0]
out = dev.buffer(9 * d * 4)
print(ops.attention_decode_plan(n_q_heads=9, n_kv_heads=3, head_dim=d, n_tokens=n, slots=cache.slots, device=dev, split="never", variant=variant)["kernel"])
def run():
    layer[0] = (layer[0] + 1) % L
    ops.attention_decode(dev, qb, kvbs[layer[0]], tb, out, n_q_heads=9, n_kv_heads=3, head_dim=d, n_tokens=n, slots=cache.slots, split="never", variant=variant)
for _ in range(3): run()
best = []
for _ in range(5):
    t0 = time.perf_counter()
    for _ in range(reps): run()
    best.append((time.perf_counter() - t0) / reps * 1e3)
print(f"layers={L} n={n} d={d} {variant or 'default'}: best {min(best):.3f} ms/dispatch, median {sorted(best)[2]:.3f}; x30 layers = {30*min(best):.1f} ms/token; load {os.getloadavg()[0]:.2f}")
