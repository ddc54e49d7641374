"""metalkv serve with a prefix store (--prefix-store DIR): a long system prompt one
server computed is found on disk by a second server over the same directory (a restart,
or a replica), whose reply is the same and whose prompt comes from the cache; /metrics
says which tier it came from."""
from __future__ import annotations

import pytest

import metalkv
from metalkv.prefix_store import PrefixStore

from .conftest import TEST_DEVICE, LiveServer, needs_server_packages

needs_server_packages()
httpx = pytest.importorskip("httpx")
SYSTEM = open(__file__.rsplit("/tests/", 1)[0] + "/README.md").read()[:2000]


def ask(server, question: str) -> dict:
    body = {"model": "m", "max_tokens": 10, "temperature": 0, "messages": [
        {"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]}
    return httpx.post(f"{server.url}/v1/chat/completions", json=body, timeout=300).json()


def samples(server) -> dict:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{server.url}/metrics", timeout=30).text
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def test_a_second_server_finds_the_first_ones_prompt_on_disk(smol_engine, tmp_path):
    def server():
        eng = metalkv.Engine.load(smol_engine.model_path, device=TEST_DEVICE, context=1024, progress=False)
        return LiveServer(eng, model_name="m", prefix_store=PrefixStore(eng, tmp_path))

    first = server()
    try:
        a = ask(first, "What does it do?")
        first.server.store.flush()  # the save runs after the reply, off the request path
        assert samples(first)[("metalkv_prefix_store_saved_blocks_total", ())] > 0
    finally:
        first.close()
    second = server()
    try:
        b = ask(second, "What does it do?")
        m = samples(second)
    finally:
        second.close()
    assert b["choices"][0]["message"] == a["choices"][0]["message"]
    cached = b["usage"]["prompt_tokens_details"]["cached_tokens"]
    assert cached >= 32 * 10 and a["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
    assert m[("metalkv_prefix_store_loaded_tokens_total", (("tier", "disk"),))] == cached
    assert m[("metalkv_prefix_store_bytes", (("tier", "disk"),))] > 0


def test_the_serve_flags(tmp_path, capsys):
    from metalkv import cli

    assert cli.main(["serve", "--prefix-store", str(tmp_path), "--prefix-store-size", "lots"]) == 2
    assert "--prefix-store-size 'lots': expected an int (bytes) or a size" in capsys.readouterr().err
    assert cli.main(["serve", "--prefix-store", str(tmp_path), "--prefix-store-host", "-1"]) == 2
    assert "--prefix-store-host '-1': expected" in capsys.readouterr().err
