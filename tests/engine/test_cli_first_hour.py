"""A new user's first hour with the CLI (issue 31): mistakes said in one line in the
flags' own words, each checked before the slow part, unsafe KV choices priced, no
lost work, honest numbers, and progress the API can show."""
from __future__ import annotations

import io
import re

import pytest

import metalkv
from metalkv import cli

PROMPT = "What is the capital of France? Answer in one sentence."
HOST = ["--device", "host", "--context", "128"]


def test_an_argparse_mistake_is_one_line_with_where_to_look(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "hi", "--kv-k", "q3"])
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.count("\n") == 1
    assert err.startswith("metalkv generate: error: argument --kv-k: invalid choice: 'q3'")
    assert err.endswith("(see metalkv generate --help)\n")


def _no_weights(monkeypatch):
    """Loading the weights fails the test: what is checked must be checked before them."""
    def refuse(*a, **kw):
        raise AssertionError("the weights were loaded before the flags were checked")
    monkeypatch.setattr(metalkv.engine, "load_weights", refuse)


@pytest.mark.parametrize("flags,message", [
    (["--kv-k", "q8", "--kv-f16-layers", "0,99"], "--kv-f16-layers [0, 99]: expected layer indices in -30..29"),
    (["--context", "100000000"], "--context 100000000: the model was trained for 8192 positions"),
])
def test_flags_that_need_the_model_header_are_checked_before_its_weights(default_gguf, monkeypatch, capsys,
                                                                         flags, message):
    _no_weights(monkeypatch)
    assert cli.main(["generate", "hi", "--device", "host"] + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("metalkv: error: ") and message in err and err.count("\n") == 1


def test_an_unrotated_four_bit_cache_warns_in_one_line(default_gguf, capsys):
    assert cli.main(["generate", PROMPT, "--max-tokens", "1", "--kv-k", "q4", "--no-kv-rotate"] + HOST) == 0
    warned = [l for l in capsys.readouterr().err.splitlines() if "warning" in l]
    assert len(warned) == 1 and warned[0].startswith("metalkv: warning: a q4 KV cache without rotation")
    assert "--kv-rotate" in warned[0] and "kv_rotate" not in warned[0]  # the flag, not the keyword


def test_a_prompt_that_does_not_fit_names_the_flag(default_gguf, capsys):
    assert cli.main(["generate", "word " * 200, "--max-tokens", "1", "--device", "host", "--context", "64"]) == 2
    err = capsys.readouterr().err
    assert "do not fit" in err and "(--context)" in err and "Engine.load" not in err and "new_cache" not in err


def test_a_save_that_fails_keeps_the_previous_file_and_says_why(default_gguf, monkeypatch, tmp_path, capsys):
    path = tmp_path / "chat.safetensors"
    path.write_bytes(b"the previous save")

    def full_disk(*a, **kw):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(metalkv.cache_file, "write_atomically", full_disk)
    assert cli.main(["generate", PROMPT, "--max-tokens", "2", "--save-cache", str(path)] + HOST) == 1
    err = capsys.readouterr().err
    assert f"metalkv: error: the KV cache was not saved to {path}: No space left on device (the file there is " \
           f"unchanged)" in err and "Traceback" not in err
    assert path.read_bytes() == b"the previous save"


def test_max_tokens_zero_reports_the_prefill_rate(default_gguf, capsys):
    assert cli.main(["generate", PROMPT, "--max-tokens", "0"] + HOST) == 0
    rate = float(re.search(r"prompt tokens at ([\d.]+) tok/s", capsys.readouterr().err).group(1))
    assert rate > 0


def test_unknown_chat_commands_are_answered_and_double_slash_sends_one(default_gguf, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("/foo\n//bar\n/exit\n"))
    assert cli.main(["chat", "--max-tokens", "2"] + HOST) == 0
    err = capsys.readouterr().err
    assert "[unknown command /foo: type a message;" in err
    assert len(re.findall(r"\[\d+ prompt tokens", err)) == 1  # /foo was not sent, //bar was (as /bar)


def test_help_points_at_files_users_have(capsys):
    with pytest.raises(SystemExit):
        cli.main(["ppl", "--help"])
    assert "shared/data" not in capsys.readouterr().out


def test_prompt_progress_reaches_a_callback(engine):
    seen = []
    engine.generate("word " * 300, chat=False, max_tokens=1, progress=lambda done, total: seen.append((done, total)))
    assert seen and seen[-1][0] == seen[-1][1] > 300 // 2
    assert all(a[0] <= b[0] for a, b in zip(seen, seen[1:])) and len({t for _, t in seen}) == 1
    with pytest.raises(metalkv.ArgumentError, match="progress=3"):
        engine.generate("hi", progress=3)


def test_a_library_warning_is_one_line_without_source(default_gguf, capsys):
    """--quantize on a model already quantized: what was left is said once, no Python source line."""
    assert cli.main(["generate", PROMPT, "--max-tokens", "1", "--quantize", "q8_0"] + HOST) == 0
    err = capsys.readouterr().err
    warned = [l for l in err.splitlines() if "warning" in l]
    assert len(warned) == 1 and warned[0].startswith("metalkv: warning: quantize='q8_0': ")
    assert "warnings.warn" not in err and ".py:" not in err
