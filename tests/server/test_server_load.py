"""The server under load: 32 clients at once, each making several requests (chat and
completions, whole and streamed, greedy and seeded). Every reply must be complete and
exactly what the same request got alone: the engine batches concurrent calls into
shared steps and promises each call what it gets by itself (docs/BATCHING.md).

Quick form (CI): the tiny model, 32 clients x 4 requests. METALKV_STRESS=long: the
default model, 32 clients x 8 requests of longer replies."""
from __future__ import annotations

import os
import random
import threading
import time

import pytest

from .conftest import needs_server_packages

needs_server_packages()
import httpx  # noqa: E402

LONG = os.environ.get("METALKV_STRESS", "quick") == "long"
CLIENTS = 32
PER_CLIENT = 8 if LONG else 4


def requests_to_make(model: str) -> list[dict]:
    """Distinct requests; each client makes a random sequence of them."""
    rng = random.Random(5)
    out = []
    for i in range(12):
        kind = "chat" if i % 2 else "completion"
        body = {"model": model, "max_tokens": rng.randrange(4, 40 if LONG else 24), "stream": i % 3 == 0}
        if i % 4 == 1:
            body.update(temperature=0.8, seed=100 + i, top_k=20)  # sampled, but seeded: reproducible
        if kind == "chat":
            body["messages"] = [{"role": "system", "content": "Answer briefly."},
                                {"role": "user", "content": f"Question {i}: what is {i} plus {i * 3}?"}]
        else:
            body["prompt"] = f"Item {i}: the list of {'colours' if i % 3 else 'numbers'} is"
        out.append((kind, body))
    return out


def make(server, kind: str, body: dict) -> tuple[str, str]:
    """(text, finish_reason) of one request through the openai client."""
    client = server.client()
    opts = dict(body)
    extra = {k: opts.pop(k) for k in ("top_k",) if k in opts}
    if kind == "chat":
        r = client.chat.completions.create(**opts, extra_body=extra)
        if body["stream"]:
            text, finish = "", None
            for chunk in r:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            return text, finish
        return r.choices[0].message.content, r.choices[0].finish_reason
    r = client.completions.create(**opts, extra_body=extra)
    if body["stream"]:
        text, finish = "", None
        for chunk in r:
            text += chunk.choices[0].text
            finish = chunk.choices[0].finish_reason or finish
        return text, finish
    return r.choices[0].text, r.choices[0].finish_reason


@pytest.fixture(scope="module")
def loaded(request):
    return request.getfixturevalue("smol" if LONG else "tiny")


def test_32_clients_get_what_each_request_gets_alone(loaded):
    model = loaded.server.model_name
    reqs = requests_to_make(model)
    alone = [make(loaded, kind, body) for kind, body in reqs]
    assert all(finish in ("stop", "length") for _, finish in alone)
    free_before = sum(g["free_blocks"] for g in loaded.engine.kv_pool["groups"])

    results: dict[tuple[int, int], tuple[int, tuple[str, str]]] = {}
    errors = []
    peak = [0]

    def client(c: int) -> None:
        rng = random.Random(c)
        for k in range(PER_CLIENT):
            i = rng.randrange(len(reqs))
            try:
                results[c, k] = i, make(loaded, *reqs[i])
            except Exception as e:  # noqa: BLE001 - every failure is reported below
                errors.append(f"client {c} request {k} ({reqs[i][1]}): {e!r}")

    threads = [threading.Thread(target=client, args=(c,)) for c in range(CLIENTS)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    while any(t.is_alive() for t in threads):
        peak[0] = max(peak[0], loaded.server.bridge.calls_in_flight)
        time.sleep(0.01)
    seconds = time.monotonic() - t0
    assert not errors, errors[:5]
    assert len(results) == CLIENTS * PER_CLIENT
    wrong = [(key, i, got, alone[i]) for key, (i, got) in results.items() if got != alone[i]]
    assert not wrong, wrong[:3]
    loaded.settled()
    assert sum(g["free_blocks"] for g in loaded.engine.kv_pool["groups"]) == free_before
    health = httpx.get(f"{loaded.url}/health").json()
    print(f"[load] {CLIENTS} clients x {PER_CLIENT} requests in {seconds:.1f} s; at most {peak[0]} replies in "
          f"flight, the largest step batched {health['max_batch']} sequences")
    assert peak[0] > 1 and health["max_batch"] > 1  # they really ran together
