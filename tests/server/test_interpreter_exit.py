"""A Python process that exits while an engine call runs on a daemon thread (a server's
pump thread, a user's worker) exits cleanly: CPython ends such a thread with
pthread_exit when it asks for the GIL back during finalization, and that unwinding
through the bindings' noexcept frames used to abort the process ("terminate called
without an active exception", exit 134). cpp/bindings/engine_bindings.cpp's ReleaseGil
parks the thread instead."""
from __future__ import annotations

import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

TESTS = pathlib.Path(__file__).resolve().parents[1]

SCRIPT = textwrap.dedent("""
    import sys, threading, time
    import metalkv
    from models.tiny import TINY_VOCAB, write_gguf
    write_gguf(sys.argv[1], tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    engine = metalkv.Engine.load(sys.argv[1], device="host", context=4096, progress=False)
    started = threading.Event()

    def work():
        started.set()
        if sys.argv[2] == "generate":  # random weights end a reply soon: one call after another
            while True:
                engine.generate("hello", max_tokens=4000)
        else:  # no end of text: one long call
            engine.generate_ids([5, 6, 7], max_tokens=4000, stop_ids=())

    threading.Thread(target=work, daemon=True).start()
    started.wait()
    time.sleep(0.3)  # a call is running
    print("exiting", flush=True)
""")


@pytest.mark.parametrize("how", ["generate", "ids"])
def test_exit_with_a_call_running_on_a_daemon_thread(tmp_path, how):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]),
               METALKV_NO_PROGRESS="1")
    r = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path / "tiny.gguf"), how], capture_output=True,
                       text=True, timeout=120, env=env)
    assert "terminate called" not in r.stderr, r.stderr[-2000:]
    assert "leaked" not in r.stderr, r.stderr[-2000:]  # nanobind's warnings: what the parked thread holds
    assert r.returncode == 0 and r.stdout.strip().endswith("exiting"), (r.returncode, r.stderr[-2000:])
