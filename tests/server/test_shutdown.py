"""`metalkv serve` as users run it, stopped as process managers stop it: SIGTERM or
SIGINT with a reply in flight. Within --shutdown-timeout the reply finishes; past it,
it is cut short and ends with the shutdown's error (a stream: an error event, then
[DONE]); either way the process exits 0, promptly, without a traceback. The default
model: slow enough on the host executor that a reply is still running when the signal
comes."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from .conftest import free_port, needs_server_packages

needs_server_packages()
import httpx  # noqa: E402
import openai  # noqa: E402


@pytest.fixture
def serve(smol_engine):
    """Starts `metalkv serve` on the default model (the session's engine shows it is installed)."""
    procs = []

    def start(*flags: str) -> tuple[subprocess.Popen, str]:
        port = free_port()
        env = dict(os.environ, METALKV_NO_PROGRESS="1")
        p = subprocess.Popen([sys.executable, "-m", "metalkv.cli", "serve", "--port", str(port), "--context", "512",
                              "--model-name", "smol", *flags], stderr=subprocess.PIPE, text=True, env=env)
        procs.append(p)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    return p, url
            except httpx.TransportError:
                pass
            if p.poll() is not None or time.monotonic() > deadline:
                raise AssertionError(f"metalkv serve did not start: {p.stderr.read()}")
            time.sleep(0.2)

    yield start
    for p in procs:
        if p.poll() is None:
            p.kill()
            p.wait()


def stream_then_signal(url: str, proc, sig, max_tokens: int) -> list[str]:
    """Starts a streamed reply, sends `sig` after its first piece, and reads what follows."""
    body = {"model": "smol", "prompt": "Once upon a time", "max_tokens": max_tokens, "stream": True}
    events = []
    try:
        with httpx.stream("POST", f"{url}/v1/completions", json=body, timeout=120) as r:
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
                    if len(events) == 2:
                        proc.send_signal(sig)
    except httpx.RemoteProtocolError:  # the server closed the stream it had to cancel
        pass
    return events


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_reply_in_flight_finishes_within_the_grace(serve, sig):
    proc, url = serve("--shutdown-timeout", "120")
    events = stream_then_signal(url, proc, sig, max_tokens=12)
    assert events[-1] == "[DONE]"
    last = json.loads(events[-2])
    assert last["choices"][0]["finish_reason"] == "length"
    text = "".join(json.loads(e)["choices"][0]["text"] for e in events[:-1])
    assert text  # the whole reply came
    assert proc.wait(timeout=60) == 0
    err = proc.stderr.read()
    assert "Traceback" not in err and "Finished server process" in err


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_past_the_grace_replies_end_with_the_shutdowns_error(serve, sig):
    """A stream cut short ends with an error event and [DONE]; a whole reply gets a JSON
    error; the openai client raises with the server's words. No request is left for
    uvicorn to cancel (it would log "ASGI callable returned without completing response")."""
    proc, url = serve("--shutdown-timeout", "1")
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=120)
    seen = {}

    def whole():
        try:
            client.completions.create(model="smol", prompt="Once upon a time", max_tokens=400)
        except openai.APIStatusError as e:
            seen["whole"] = e

    def streamed():
        try:
            for _ in client.completions.create(model="smol", prompt="Long ago", max_tokens=400, stream=True):
                pass
        except openai.APIError as e:
            seen["streamed"] = e

    others = [threading.Thread(target=whole), threading.Thread(target=streamed)]
    for t in others:
        t.start()
    while httpx.get(f"{url}/health", timeout=10).json()["calls_in_flight"] < 2:  # both running
        time.sleep(0.05)
    t0 = time.monotonic()
    events = stream_then_signal(url, proc, sig, max_tokens=400)
    for t in others:
        t.join(timeout=60)
    assert events[-1] == "[DONE]"  # cut, yet ended as a stream ends: 400 tokens take over a minute here
    error = json.loads(events[-2])["error"]
    assert "shutting down" in error["message"] and error["type"] == "server_error"
    assert json.loads(events[0])["choices"][0]["text"]  # what came before the cut
    assert seen["whole"].status_code == 503 and "shutting down" in seen["whole"].body["message"]
    assert "shutting down" in str(seen["streamed"])
    assert proc.wait(timeout=60) == 0
    assert time.monotonic() - t0 < 60
    err = proc.stderr.read()
    assert "Traceback" not in err and "without completing response" not in err, err
    assert "Cancel" not in err, err  # uvicorn's backstop found nothing to cancel
    with pytest.raises(httpx.TransportError):  # and it is gone
        httpx.get(f"{url}/health", timeout=2)
