"""Decode per kernel after a short and after a long prompt, in one process (issue 31):
what grows with the context. METALKV_PROFILE=1 (per-dispatch timing) is set here.

    METALKV_HOST_THREADS=2 python bench/profile_long_decode.py
"""
import os, sys, time
os.environ["METALKV_PROFILE"] = "1"
sys.path.insert(0, "bench")
import metalkv
from compare import prompt_ids
from profile_decode import table
eng = metalkv.Engine.load(device="host", context=1600, kv_memory=0)
dev = eng.device
for n in (100, 1500):
    ids = prompt_ids(eng.tokenizer, n)
    cache = eng.new_cache()
    first = eng.generate_ids(ids, max_tokens=1, stop_ids=(), cache=cache)
    dev.reset_counters()
    t0 = time.perf_counter()
    out = eng.generate_ids(first, max_tokens=8, stop_ids=(), cache=cache)
    wall = time.perf_counter() - t0
    print(f"\ndecode after {n} tokens: {len(out)} steps, {len(out)/wall:.2f} tok/s wall, load {os.getloadavg()[0]:.2f}")
    table(dev.kernel_times(), len(out), "tok")
