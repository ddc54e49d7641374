"""Requests without max_tokens (each may run to the end of the context) from many
clients at once, on a pool that holds a few such replies: the server admits them on
their prompts' blocks and preempts the newest when the pool runs short
(docs/BATCHING.md). Every reply is the one the same request gets from an engine whose
pool never runs short, and /metrics counts the preemptions."""
from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest

import metalkv

from .conftest import TEST_DEVICE, LiveServer, needs_server_packages

needs_server_packages()
httpx = pytest.importorskip("httpx")
CONTEXT = 256
CLIENTS = 24


@pytest.fixture(scope="module")
def engines(tmp_path_factory):
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    f = tmp_path_factory.mktemp("preempt_server") / "tiny.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        roomy = metalkv.Engine.load(f, device=TEST_DEVICE, context=CONTEXT, progress=False)
        block = roomy.kv_pool["groups"][0]["block_bytes"]
        small = metalkv.Engine.load(f, device=TEST_DEVICE, context=CONTEXT, progress=False, kv_memory=20 * block)
    return roomy, small


def test_many_clients_without_max_tokens_all_get_their_reply(engines):
    roomy, small = engines
    rng = np.random.default_rng(0)
    prompts = [rng.integers(3, 60, size=int(rng.integers(20, 60))).tolist() for _ in range(CLIENTS)]
    bodies = [{"model": "tiny", "prompt": p, "temperature": 0.0 if i % 2 else 0.9, "seed": i}
              for i, p in enumerate(prompts)]
    server = LiveServer(small, model_name="tiny")
    try:
        replies = [None] * CLIENTS

        def ask(i):
            r = httpx.post(f"{server.url}/v1/completions", json=bodies[i], timeout=300)
            replies[i] = r.json()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        metrics = httpx.get(f"{server.url}/metrics", timeout=30).text
    finally:
        server.close()
    for i, (p, reply) in enumerate(zip(prompts, replies)):
        want = roomy.generate(p, max_tokens=CONTEXT - len(p), temperature=bodies[i]["temperature"], seed=i)
        assert reply["choices"][0]["text"] == want, i
    from prometheus_client.parser import text_string_to_metric_families

    samples = {s.name: s.value for fam in text_string_to_metric_families(metrics) for s in fam.samples}
    assert samples["metalkv_preemptions_total"] > 0 and samples["metalkv_recomputed_tokens_total"] > 0
