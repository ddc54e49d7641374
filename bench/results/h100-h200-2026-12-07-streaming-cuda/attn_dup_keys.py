"""ops.attention_prefill (mma shape) against the float64 reference, where a query's
row has two or three keys of the same token (one K row, two or three positions) and
its scores grow large: the condition of the rows diag_streaming.py found wrong on
the cuda device. Prints the worst row error for each score scale.

    PYTHONPATH=/tmp/site python3 bench/results/h100-h200-2026-12-07-streaming-cuda/attn_dup_keys.py cuda
"""
import pathlib
import sys

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
import metalkv  # noqa: E402
from kv.attention_ref import attention, build_cache  # noqa: E402
from kv.test_attention import prefill  # noqa: E402

dev = metalkv.Device(sys.argv[1] if len(sys.argv) > 1 else "host")
d, n_q_heads, n_kv, n = 64, 2, 1, 150
for variant in ("mma", "gpu"):
    for gain in (0.5, 1.0, 2.0, 4.0):
        worst = (0.0, None)
        for q_pos0 in (112, 136, 96, 120):
            n_q = 8
            rng = np.random.default_rng([int(gain), q_pos0])
            k = rng.standard_normal((n, n_kv, d)).astype(np.float16)
            v = rng.standard_normal((n, n_kv, d)).astype(np.float16)
            for dup in ((21, 99, 114), (31, 90, 137)):  # one token at three positions
                for p in dup[1:]:  # the same token, moved a little (as RoPE at another position would)
                    k[p] = k[dup[0]] + 0.05 * rng.standard_normal((n_kv, d)).astype(np.float16)
                    v[p] = v[dup[0]]
            q = (rng.standard_normal((n_q, n_q_heads, d)) * 0.3).astype(np.float32)
            q += gain * k[np.minimum(q_pos0 + np.arange(n_q), n - 1)].astype(np.float32) / np.sqrt(d) * 8
            q = q.astype(np.float32)
            cache = build_cache(k[:q_pos0 + n_q], v[:q_pos0 + n_q])
            got = prefill(dev, q, cache, q_pos0=q_pos0, variant=variant)
            want = attention(q, k[:q_pos0 + n_q], v[:q_pos0 + n_q], q_pos0, scale=1 / np.sqrt(d))
            err = np.abs(got - want).max(axis=(1, 2)) / np.abs(want).max()
            if err.max() > worst[0]:
                worst = (float(err.max()), (q_pos0, int(err.argmax())))
        print(f"{dev.kind} {variant:4} gain {gain:5}: worst row error {worst[0]:.2e} at (q_pos0, row) {worst[1]}")
