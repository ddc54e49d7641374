"""The prefix store's Redis tier (metalkv.prefix_redis), against a real redis-server
(Debian's, started here on a free port): two engines that share a Redis and no
directory (two servers on two machines) share a prompt's blocks, and the second's reply
is the one computing them gives; a damaged entry is refused and deleted; a Redis that
goes away mid-run is a warning and the local tiers, never a failed call."""
from __future__ import annotations

import shutil
import socket
import subprocess
import time
import warnings

import pytest

import metalkv
from metalkv.errors import MetalkvWarning
from metalkv.prefix_store import PrefixStore

from .conftest import TEST_DEVICE

redis = pytest.importorskip("redis", reason="the test extra's redis package is not installed")
TEXT = open(__file__.rsplit("/tests/", 1)[0] + "/README.md").read()[:2000]


@pytest.fixture
def redis_url(tmp_path):
    exe = shutil.which("redis-server")
    if exe is None:
        pytest.skip("redis-server is not installed (apt-get install redis-server; .ci/run does)")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                             "--dir", str(tmp_path)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    client = redis.Redis(port=port)
    deadline = time.monotonic() + 10
    while True:
        try:
            client.ping()
            break
        except redis.exceptions.ConnectionError:
            if time.monotonic() > deadline:
                proc.kill()
                pytest.fail("redis-server did not start")
            time.sleep(0.05)
    yield f"redis://127.0.0.1:{port}/0", proc, client
    proc.kill()
    proc.wait()


def load(default_gguf):
    return metalkv.Engine.load(default_gguf, device=TEST_DEVICE, context=1024, progress=False)


def ask(engine):
    return engine.chat_ids([{"role": "system", "content": TEXT}, {"role": "user", "content": "Summarize it."}])


def test_two_engines_share_a_prompt_through_redis(default_gguf, redis_url):
    url, _, client = redis_url
    a, b = load(default_gguf), load(default_gguf)
    prompt = ask(a)
    want = a.generate_ids(prompt, max_tokens=10)
    first = PrefixStore(a, redis=url)
    saved = first.save(prompt)
    assert saved > 0 and len(client.keys(f"metalkv:{first.namespace}:*")) == saved
    second = PrefixStore(b, redis=url)
    assert second.warm(prompt) == saved * 32 and second.stats["loaded_redis"] == saved * 32
    assert b.generate_ids(prompt, max_tokens=10) == want
    assert b.last_stats["prompt_tokens_cached"] == saved * 32


def test_a_damaged_entry_in_redis_is_refused_and_deleted(default_gguf, redis_url):
    url, _, client = redis_url
    a = load(default_gguf)
    prompt = ask(a)
    want = a.generate_ids(prompt, max_tokens=6)
    PrefixStore(a, redis=url).save(prompt)
    b = load(default_gguf)
    store = PrefixStore(b, redis=url, host_bytes=0)
    key = sorted(client.keys(f"metalkv:{store.namespace}:*"))[0]
    client.set(key, b"MKVB" + b"\0" * 64)
    store.warm(prompt)
    assert store.stats["corrupt"] >= 1 and client.get(key) is None
    assert b.generate_ids(prompt, max_tokens=6) == want


def test_a_redis_that_goes_away_is_a_warning_not_a_failure(default_gguf, redis_url, tmp_path):
    url, proc, _ = redis_url
    a = load(default_gguf)
    prompt = ask(a)
    want = a.generate_ids(prompt, max_tokens=6)
    store = PrefixStore(a, tmp_path, redis=url)
    proc.kill()
    proc.wait()
    with pytest.warns(MetalkvWarning, match=r"Redis at redis://127.0.0.1:\d+/0 failed .*local tiers"):
        assert store.save(prompt) > 0  # the disk tier took them
    assert store.stats["redis_errors"] >= 1
    b = load(default_gguf)
    other = PrefixStore(b, tmp_path, redis=url)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert other.warm(prompt) > 0 and other.stats["loaded_disk"] > 0
    assert b.generate_ids(prompt, max_tokens=6) == want
