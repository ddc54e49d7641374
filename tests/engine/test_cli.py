"""The `metalkv` command line on the default model: generate streams the text
to stdout and ends with a tokens/s line on stderr; chat keeps the cache."""
from __future__ import annotations

import io
import re

import pytest

from metalkv import cli

PROMPT = "What is the capital of France? Answer in one sentence."


def test_generate(engine, capsys):
    assert cli.main(["generate", PROMPT, "--max-tokens", "12", "--device", "host", "--context", "128"]) == 0
    out, err = capsys.readouterr()
    assert out == engine.generate(PROMPT, max_tokens=12) + "\n"
    assert re.search(r"\[\d+ prompt tokens at [\d.]+ tok/s, \d+ generated at [\d.]+ tok/s; finish: stop\]", err)


def test_generate_sampling_flags_and_stop(engine, capsys):
    args = ["generate", PROMPT, "--max-tokens", "6", "--device", "host", "--temperature", "0.7", "--top-k", "20",
            "--top-p", "0.9", "--min-p", "0.05", "--repetition-penalty", "1.1", "--seed", "3", "--stop", "Paris"]
    assert cli.main(args) == 0
    out, _ = capsys.readouterr()
    assert out == engine.generate(PROMPT, max_tokens=6, temperature=0.7, top_k=20, top_p=0.9, min_p=0.05,
                                  repetition_penalty=1.1, seed=3, stop="Paris") + "\n"
    assert "Paris" not in out


def test_chat_keeps_the_conversation(default_gguf, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("My name is Ana.\nWhat is my name?\n/exit\n"))
    assert cli.main(["chat", "--max-tokens", "16", "--device", "host", "--context", "256"]) == 0
    _, err = capsys.readouterr()
    fed = [int(n) for n in re.findall(r"\[(\d+) prompt tokens", err)]
    assert len(fed) == 2 and fed[1] < fed[0]  # the second turn feeds only what is new


def test_bad_arguments_exit_with_a_message(default_gguf, capsys):
    import metalkv

    if "metal" not in metalkv.devices():
        assert cli.main(["generate", "hi", "--device", "metal"]) == 2
        assert "[device] 'metal' needs macOS on Apple Silicon" in capsys.readouterr().err
    assert cli.main(["generate", "hi", "--temperature", "-1", "--device", "host"]) == 2
    assert "temperature=-1.0: expected a finite number >= 0" in capsys.readouterr().err
    assert cli.main(["generate", "hi", "--model", "/nonexistent/model.gguf"]) == 2
    assert "model '/nonexistent/model.gguf' not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate"])  # argparse: the prompt is required
