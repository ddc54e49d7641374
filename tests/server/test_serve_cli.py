"""`metalkv serve`'s flags are checked before the model loads, each mistake named; its
address too (a busy port is one line), and its URL is printed once it listens."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys

import pytest

from .conftest import free_port, needs_server_packages

needs_server_packages()


@pytest.mark.parametrize("flags, says", [
    (["--temperature", "-1"], "--temperature"),
    (["--presence-penalty", "3"], "--presence-penalty"),
    (["--top-p", "0"], "--top-p"),
    (["--port", "0"], "--port"),
    (["--max-tokens", "0"], "--max-tokens"),
    (["--max-calls", "0"], "--max-calls"),
])
def test_bad_flags_fail_before_loading(flags, says):
    r = subprocess.run([sys.executable, "-m", "metalkv.cli", "serve", "--model", "/nonexistent.gguf", *flags],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert says in r.stderr and "nonexistent" not in r.stderr  # refused before the model was looked for


def test_a_busy_port_is_one_line_before_the_load():
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        r = subprocess.run([sys.executable, "-m", "metalkv.cli", "serve", "--model", "/nonexistent.gguf",
                            "--port", str(port)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.startswith("metalkv")]  # (not an editable rebuild's)
    assert len(lines) == 1 and "Traceback" not in r.stderr, r.stderr
    assert f"port {port}" in lines[0] and "in use" in lines[0] and "--port" in lines[0]
    assert "http://" not in r.stderr  # no URL for a server that never listened


def test_the_url_is_printed_once_it_listens(tmp_path):
    """The moment `metalkv serve` prints its URL, a client can connect."""
    import httpx

    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    model = tmp_path / "tiny.gguf"
    write_gguf(model, tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    port = free_port()
    p = subprocess.Popen([sys.executable, "-m", "metalkv.cli", "serve", "--model", str(model), "--port", str(port),
                          "--context", "256"], stderr=subprocess.PIPE, text=True,
                         env=dict(os.environ, METALKV_NO_PROGRESS="1"))
    try:
        seen = []
        for line in p.stderr:  # (the test's timeout bounds this)
            seen.append(line)
            if "http://" in line:
                break
        assert f"at http://127.0.0.1:{port}/v1" in seen[-1], seen
        assert httpx.get(f"http://127.0.0.1:{port}/health", timeout=10).json()["status"] == "ok"  # no retry
        p.send_signal(signal.SIGINT)
        assert p.wait(timeout=60) == 0
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
