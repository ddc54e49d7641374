"""The CLI as a person meets it, through a real terminal (pexpect drives a pty):
Ctrl-C, closed pipes, chat sessions that survive interruption and a full context,
readline history. No tracebacks for anything a person did."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

pexpect = pytest.importorskip("pexpect")

ENV = {**os.environ, "METALKV_NO_PROGRESS": "1", "SKBUILD_EDITABLE_VERBOSE": "0", "PYTHONUNBUFFERED": "1"}
CLI = [sys.executable, "-m", "metalkv.cli"]


_children = []


@pytest.fixture(autouse=True)
def _no_child_left():
    """A test that fails half-way must not leave its CLI running (it would load the next tests)."""
    yield
    while _children:
        child = _children.pop()
        if child.isalive():
            child.terminate(force=True)


def spawn(*args: str, timeout: float = 120):
    child = pexpect.spawn(CLI[0], CLI[1:] + list(args), env=ENV, encoding="utf-8", timeout=timeout,
                          dimensions=(40, 200))
    _children.append(child)
    return child


def test_ctrl_c_stops_generate_with_exit_130(default_gguf):
    child = spawn("generate", "Write a very long story about a lighthouse keeper.", "--max-tokens", "400",
                  "--device", "host")
    child.expect(r"\w{3,}")  # the first words of the reply: generation is under way
    child.sendintr()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 130, child.before
    assert "Traceback" not in child.before and "[interrupted]" in child.before


def test_closed_pipe_ends_quietly(default_gguf):
    p = subprocess.Popen(CLI + ["generate", "Count from one to one hundred.", "--max-tokens", "200",
                                "--device", "host"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=ENV)
    first = p.stdout.read(8)
    p.stdout.close()  # as `| head -c 8` does
    err = p.stderr.read().decode()
    assert p.wait(timeout=120) == 141 and len(first) == 8
    assert err == "", err


def test_chat_survives_ctrl_c_and_reset_and_keeps_history(default_gguf):
    child = spawn("chat", "--device", "host", "--max-tokens", "200", "--system", "You are a storyteller.")
    child.expect_exact("metalkv chat:")
    child.expect_exact("> ")
    child.sendline("Tell me a long story about a dragon.")
    child.expect_exact("dragon.\r\n")  # the terminal's echo of the line
    child.expect(r"\w{3,}")            # the first words of the reply
    child.sendintr()
    child.expect_exact("[interrupted: your message and the reply so far stay in the conversation]")
    child.expect_exact("> ")  # the session goes on
    child.sendline("/help")
    child.expect_exact("/reset starts over")
    child.expect_exact("> ")
    child.send("\x1b[A\r")  # up arrow: readline brings back "/help"
    child.expect_exact("/reset starts over")
    child.expect_exact("> ")
    child.sendline("/reset")
    child.expect_exact("[conversation cleared, system prompt kept]")
    child.expect_exact("> ")
    child.sendintr()  # Ctrl-C at the prompt does not end the session
    child.expect_exact("[/exit or Ctrl-D quits]")
    child.sendline("/exit")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before


def test_chat_with_a_full_context_says_so_and_stays_open(default_gguf):
    child = spawn("chat", "--device", "host", "--context", "40", "--max-tokens", "100")
    child.expect_exact("> ")
    child.sendline("Describe the sea in many words.")
    child.expect(r"finish: context_full \(the cache is full\); context 40/40 tokens\]")
    child.expect_exact("[the context is full (40/40 tokens): /reset starts over")
    child.expect_exact("> ")
    child.sendline("And the sky?")
    child.expect_exact("[this message does not fit: the context holds 40 tokens and 40 are used. /reset starts over")
    child.expect_exact("> ")
    child.sendline("/reset")
    child.expect_exact("[conversation cleared]")
    child.sendline("Hi")
    child.expect(r"context \d+/40 tokens\]")
    child.expect_exact("> ")  # Ctrl-D at the prompt: sent earlier it can land while the reply still runs
    child.sendeof()
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0 and "Traceback" not in child.before
