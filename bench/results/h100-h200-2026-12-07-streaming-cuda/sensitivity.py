"""How far each row of test_streaming_logits_match_the_reference's float64 reference moves
when every weight matrix is multiplied by (1 + 1e-6 noise), with and without the streaming
policy, and the top attention probabilities at rows 114 and 137 (no device involved).

    python3 bench/results/h100-h200-2026-12-07-streaming-cuda/sensitivity.py
"""
import sys, pathlib, tempfile
import numpy as np
TESTS = pathlib.Path(__file__).resolve().parents[3] / "tests"
sys.path.insert(0, str(TESTS)); sys.path.insert(0, str(TESTS / "engine"))
from conftest import TINY
from models.tiny import write_gguf
from metalkv.models import load_model
from engine.reference import llama_logits, dequantized
from engine.test_kv_policy_engine import IDS, visible_by_chunks
f = pathlib.Path(tempfile.mkdtemp()) / "tiny.gguf"; write_gguf(f, **TINY)
m = load_model(f, progress=False)
W = dequantized(m)
for kw, name in ((dict(visible=lambda l, g, v=visible_by_chunks(150, {"policy": "streaming", "sinks": 4}, 64): v), "streaming"), ({}, "none")):
    probs = {}
    ref = llama_logits(m, IDS, W=W, probs=probs, **kw)
    scale = np.abs(ref).max()
    rng = np.random.default_rng(0)
    worst = np.zeros(150)
    for t in range(4):
        W2 = {k: (v * (1 + 1e-6 * rng.standard_normal(v.shape)) if v.ndim == 2 else v) for k, v in W.items()}
        got = llama_logits(m, IDS, W=W2, **kw)
        worst = np.maximum(worst, np.abs(got - ref).max(-1) / scale)
    o = np.argsort(worst)[::-1][:5]
    print(name, "rows most sensitive to 1e-6 weight noise:", list(zip(o.tolist(), np.round(worst[o], 6).tolist())))
    for (l, h), pr in sorted(probs.items()):
        for row in (114, 137):
            top = np.sort(pr[row])[::-1][:3]
            print(f"  layer {l} head {h} row {row}: top probs {np.round(top, 4)} at {np.argsort(pr[row])[::-1][:3]}")
