"""GET /metrics: Prometheus' text format, read back with prometheus_client's own parser.
The counters agree with what the replies' `usage` said (prompt, generated and cached
tokens, calls by finish reason); the gauges with the engine's batch and KV pool."""
from __future__ import annotations

import pytest

from .conftest import LiveServer, needs_server_packages

needs_server_packages()
httpx = pytest.importorskip("httpx")

SYSTEM = "You answer questions about European capitals. " * 12  # a prefix long enough to be cached


@pytest.fixture(scope="module")
def fresh(smol_engine):
    """Its own app: counters from zero."""
    s = LiveServer(smol_engine, model_name="smol")
    yield s
    s.close()


def scrape(server, **headers) -> dict:
    """{(name, labels as a sorted tuple): value} of every sample."""
    from prometheus_client.parser import text_string_to_metric_families

    r = httpx.get(f"{server.url}/metrics", headers=headers, timeout=30)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(r.text) for s in fam.samples}


def test_counters_follow_the_replies_usage(fresh):
    before = scrape(fresh)
    assert before.get(("metalkv_requests_total", (("finish_reason", "length"),)), 0) == 0
    client = fresh.client()
    usages = []
    for q in ("What is the capital of France?", "What is the capital of Spain?"):
        r = client.chat.completions.create(model="smol", max_tokens=5, temperature=0, messages=[
            {"role": "system", "content": SYSTEM}, {"role": "user", "content": q}])
        usages.append(r.usage)
    stream = client.chat.completions.create(model="smol", max_tokens=4, temperature=0, stream=True,
                                            stream_options={"include_usage": True},
                                            messages=[{"role": "user", "content": "Hi"}])
    usages.append([c.usage for c in stream if c.usage][0])
    m = scrape(fresh)
    assert m[("metalkv_requests_total", (("finish_reason", "length"),))] == 3
    assert m[("metalkv_prompt_tokens_total", ())] == sum(u.prompt_tokens for u in usages)
    assert m[("metalkv_generation_tokens_total", ())] == sum(u.completion_tokens for u in usages)
    cached = sum(u.prompt_tokens_details.cached_tokens for u in usages)
    assert cached > 0  # the second question found the system prompt
    assert m[("metalkv_prompt_tokens_cached_total", (("tier", "device"),))] == cached
    assert m[("metalkv_time_to_first_token_seconds_count", ())] == 3
    assert m[("metalkv_request_seconds_count", ())] == 3
    assert m[("metalkv_requests_running", ())] == 0 and m[("metalkv_requests_waiting", ())] == 0


def test_the_pool_gauges_are_the_engines(fresh):
    pool = fresh.engine.kv_pool
    m = scrape(fresh)
    total = 0
    for g in pool["groups"]:
        w = str(g["window"])
        got = {s: m[("metalkv_kv_blocks", (("state", s), ("window", w)))] for s in ("used", "cached", "reserved",
                                                                                    "free")}
        assert got["cached"] == g["cached_blocks"] and got["reserved"] == g["reserved_blocks"]
        assert sum(got.values()) == g["blocks"]
        total += g["blocks"]
    assert m[("metalkv_kv_pool_bytes", ())] == pool["nbytes"]
    assert m[("metalkv_kv_memory_bytes", (("kind", "total"),))] == pool["kv_memory"] >= pool["nbytes"]
    assert pool["nbytes"] <= m[("metalkv_kv_memory_bytes", (("kind", "used"),))] <= pool["kv_memory"]
    free = sum(m[(k, lab)] for (k, lab) in m if k == "metalkv_kv_blocks" and ("state", "free") in lab)
    assert m[("metalkv_kv_pool_usage", ())] == pytest.approx(1 - free / total)


def test_a_reply_in_flight_is_running(fresh):
    client = fresh.client()
    stream = client.chat.completions.create(model="smol", max_tokens=200, temperature=0, stream=True,
                                            messages=[{"role": "user", "content": "Count from one to a hundred."}])
    chunks = iter(stream)
    next(chunks), next(chunks)
    m = scrape(fresh)
    assert m[("metalkv_requests_running", ())] == 1
    used = sum(m[(k, lab)] for (k, lab) in m if k == "metalkv_kv_blocks" and ("state", "used") in lab)
    assert used > 0  # the reply's cache holds blocks
    stream.close()
    fresh.settled()


def test_metrics_need_the_api_key(smol_engine):
    s = LiveServer(smol_engine, model_name="smol", api_key="k")
    try:
        assert httpx.get(f"{s.url}/metrics", timeout=30).status_code == 401
        assert scrape(s, authorization="Bearer k")[("metalkv_requests_running", ())] == 0
    finally:
        s.close()
