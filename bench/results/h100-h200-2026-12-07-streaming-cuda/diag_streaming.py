"""Where the cuda device's streaming-policy logits leave the host's (tests/engine/
test_kv_policy_engine.py::test_streaming_logits_match_the_reference): the same tiny
model, prompt and policy on both devices, the largest difference per position,
for prefill chunks of 1 (decode only), 8, 32 and 64, with and without the policy.

    PYTHONPATH=/tmp/site python3 bench/results/h100-h200-2026-12-07-streaming-cuda/diag_streaming.py host cuda
"""
import sys
import tempfile
import pathlib

import numpy as np

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[3] / "tests" / "engine"))
import metalkv  # noqa: E402
from conftest import TINY  # noqa: E402
from models.tiny import write_gguf  # noqa: E402

DEVICES = sys.argv[1:] or ["host", "cuda"]
IDS = [int(i) for i in np.random.default_rng(3).integers(0, 64, 150)]
f = pathlib.Path(tempfile.mkdtemp()) / "tiny.gguf"
write_gguf(f, **TINY)
print("positions of id", {i: [p for p, t in enumerate(IDS) if t == IDS[i]] for i in (114, 137)})
for kw in (dict(kv_policy="streaming", kv_budget=64), dict(context=160)):
    for chunk in (1, 8, 32, 64):
        got = {}
        for dev in DEVICES:
            eng = metalkv.Engine.load(f, device=dev, progress=False, prefill_chunk=chunk, kv_memory=None,
                                      **{"context": 96, **kw})
            got[dev] = eng.logits(IDS, cache=eng.new_cache())
        d = np.abs(got[DEVICES[0]] - got[DEVICES[-1]]).max(-1) / np.abs(got[DEVICES[0]]).max()
        bad = np.flatnonzero(d > 1e-3)
        print(kw, "chunk", chunk, "max", d.max(), "first bad", bad[:5], "count", len(bad),
              "ids there", [IDS[i] for i in bad[:5]], "second worst", np.sort(d)[-2])
