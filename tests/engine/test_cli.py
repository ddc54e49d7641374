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
    assert re.search(r"\[\d+ prompt tokens at [\d.]+ tok/s, \d+ generated at [\d.]+ tok/s; "
                     r"finish: stop \(the model ended its turn\); context \d+/128 tokens\]", err)


def test_generate_speculating(engine, capsys):
    """--speculate lookup: the same text as without it (greedy), on the default model."""
    quote = "Copy this sentence exactly: the cat sat on the mat and looked at the hat."
    assert cli.main(["generate", quote, "--max-tokens", "24", "--device", "host", "--context", "128",
                     "--speculate", "lookup", "--draft-tokens", "3"]) == 0
    out, err = capsys.readouterr()
    assert out == engine.generate(quote, max_tokens=24) + "\n"
    assert re.search(r"; \d+ of [1-9]\d* proposed ids accepted; finish:", err), err


def test_generate_with_a_json_schema_and_a_grammar(engine, tmp_path, capsys):
    """--json-schema FILE and --grammar FILE (GBNF): the text the API gives for them."""
    import json

    schema = {"type": "object", "properties": {"colour": {"enum": ["red", "green", "blue"]}},
              "required": ["colour"], "additionalProperties": False}
    (tmp_path / "s.json").write_text(json.dumps(schema))
    (tmp_path / "g.gbnf").write_text('root ::= "yes" | "no"\n')
    q = "Pick a colour."
    assert cli.main(["generate", q, "--max-tokens", "40", "--device", "host", "--context", "128",
                     "--json-schema", str(tmp_path / "s.json")]) == 0
    out = capsys.readouterr().out
    fmt = {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}}
    assert out == engine.generate(q, max_tokens=40, response_format=fmt) + "\n"
    assert json.loads(out)["colour"] in ("red", "green", "blue")
    assert cli.main(["generate", "Is water wet?", "--max-tokens", "8", "--device", "host", "--context", "128",
                     "--grammar", str(tmp_path / "g.gbnf")]) == 0
    assert capsys.readouterr().out in ("yes\n", "no\n")


def test_generate_with_a_draft_model(engine, default_gguf, capsys):
    """--draft-model (the model as its own draft): --speculate draft is implied, the text
    is the one without it."""
    quote = "Repeat: one two three four five six."
    assert cli.main(["generate", quote, "--max-tokens", "16", "--device", "host", "--context", "128",
                     "--draft-model", str(default_gguf)]) == 0
    out, _ = capsys.readouterr()
    assert out == engine.generate(quote, max_tokens=16) + "\n"


@pytest.mark.parametrize("policy,prompt", [("streaming", None), ("snapkv", "whole")])
def test_generate_with_an_eviction_policy_goes_past_its_budget(engine, capsys, policy, prompt):
    """--kv-policy/--kv-budget/--kv-prompt: 48 tokens of reply through a budget of 64 (the
    prompt's ~40 and the reply pass it; 64 is the least a budget may be beside a 4-token sink
    and a block): no context_full, what is kept on the closing line, and the same text as the
    Python API with the same policy."""
    story = "Tell me a long story about a dragon."
    args = ["generate", story, "--max-tokens", "48", "--device", "host", "--kv-policy", policy,
            "--kv-budget", "64", "--kv-sinks", "4", "--temperature", "0", "--repetition-penalty", "1.3"]
    assert cli.main(args + (["--kv-prompt", prompt] if prompt else [])) == 0
    out, err = capsys.readouterr()
    assert re.search(rf"finish: length .*; {policy}: \d+/64 tokens kept of \d+, [1-9]\d* evicted\]", err), err
    import metalkv
    eng = metalkv.Engine.load(device="host", kv_policy=policy, kv_budget=64, kv_prompt=prompt, progress=False)
    assert out == eng.generate(story, max_tokens=48, temperature=0, repetition_penalty=1.3) + "\n"


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


def test_prompt_from_standard_input(engine, monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO(PROMPT))
    assert cli.main(["generate", "-", "--max-tokens", "4", "--device", "host", "--context", "128"]) == 0
    out, err = capsys.readouterr()
    assert out == engine.generate(PROMPT, max_tokens=4) + "\n"
    assert "finish: length (--max-tokens reached)" in err


def test_stop_string_finish_reason(engine, capsys):
    assert cli.main(["generate", PROMPT, "--max-tokens", "12", "--device", "host", "--stop", "Paris"]) == 0
    assert "finish: stop_string (a --stop string)" in capsys.readouterr().err


@pytest.mark.parametrize("flags,message", [
    (["--top-p", "1.5"], "--top-p 1.5: expected a number in (0, 1] (1 = off)"),
    (["--min-p", "-1"], "--min-p -1.0: expected a number in [0, 1] (0 = off)"),
    (["--temperature", "-1"], "--temperature -1.0: expected a finite number >= 0 (0 = greedy)"),
    (["--temperature", "nan"], "--temperature nan: expected a finite number >= 0"),
    (["--top-k", "-3"], "--top-k -3: expected an int >= 0 (0 = off)"),
    (["--max-tokens", "-1"], "--max-tokens -1: expected an int >= 0"),
    (["--max-tokens", str(10**20)], f"--max-tokens {10**20}: expected an int between"),
    (["--repetition-penalty", "0"], "--repetition-penalty 0.0: expected a finite number > 0"),
    (["--presence-penalty", "3"], "--presence-penalty 3.0: expected a finite number in [-2, 2] (0 = off)"),
    (["--frequency-penalty", "nan"], "--frequency-penalty nan: expected a finite number in [-2, 2] (0 = off)"),
    (["--seed", "-1"], "--seed -1: expected an int in [0, 2**64)"),
    (["--context", "0"], "--context 0: expected a positive int (tokens a cache holds)"),
    (["--stop", ""], "--stop ['']: expected a non-empty str or a list of them"),
    (["--no-chat", "--system", "be brief"], "--system needs the chat template; drop --no-chat"),
    (["--kv-policy", "h2o", "--kv-budget", "1.5"], "--kv-budget 1.5: expected a token count >= 1 or a fraction"),
    (["--kv-policy", "h2o", "--kv-sinks", "-1"], "--kv-sinks -1: expected an int >= 0"),
    (["--kv-residual", "100"], "--kv-residual 100: expected an int >= 0, a multiple of 32"),
    (["--kv-budget", "64"], "--kv-budget does nothing without --kv-policy"),
    (["--kv-policy", "streaming", "--kv-window", "8"], "--kv-window does nothing with --kv-policy 'streaming'"),
    (["--device", "cuda"], "--device cuda: not available on this machine"),
    (["--speculate", "lookup", "--draft-tokens", "0"], "--draft-tokens 0: expected an int in 1..16"),
    (["--draft-tokens", "3"], "--draft-tokens 3: expected to come with --speculate lookup or --speculate draft"),
    (["--save-cache", "/nonexistent/dir/x.safetensors"], "--save-cache /nonexistent/dir/x.safetensors: the "
                                                          "folder /nonexistent/dir does not exist"),
    (["--load-cache", "/nonexistent/x.safetensors"], "--load-cache /nonexistent/x.safetensors: No such file"),
    (["--json-schema", "/nonexistent/s.json"], "--json-schema /nonexistent/s.json: cannot read it"),
    (["--grammar", "/nonexistent/g.gbnf"], "--grammar /nonexistent/g.gbnf: cannot read it"),
    (["--regex", "[a-"], "--regex: at 1("),
    (["--logit-bias", "five=1"], "--logit-bias five=1: expected ID=BIAS"),
])
def test_flags_are_checked_before_the_model_loads(flags, message, capsys):
    """A model that does not exist would fail the load: the flag error comes first."""
    assert cli.main(["generate", "hi", "--model", "/nonexistent/m.gguf", "--device", "host"] + flags) == 2
    err = capsys.readouterr().err
    assert err.startswith("metalkv: error: ") and message in err and "m.gguf" not in err
    assert err.count("\n") == 1  # one line


def test_impossible_numbers_are_refused_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "hi", "--max-tokens", "10**20"])
    assert e.value.code == 2 and "invalid int value: '10**20'" in capsys.readouterr().err


def test_empty_prompt(monkeypatch, capsys):
    monkeypatch.setattr("sys.stdin", io.StringIO("  \n"))
    assert cli.main(["generate", "-", "--model", "/nonexistent/m.gguf"]) == 2
    assert "the prompt is empty (standard input had no text)" in capsys.readouterr().err


def test_version_and_help(capsys):
    import metalkv

    with pytest.raises(SystemExit) as e:
        cli.main(["--version"])
    assert e.value.code == 0 and capsys.readouterr().out == f"metalkv {metalkv.__version__}\n"
    with pytest.raises(SystemExit):
        cli.main(["generate", "--help"])
    out = capsys.readouterr().out
    for shown in ("most tokens to generate per reply (default: 256)", "0 = greedy (default: 0.0)",
                  "1 = off (default: 1.0)", "'-' reads it from standard input"):
        assert shown in " ".join(out.split()), shown


def test_bad_arguments_exit_with_a_message(default_gguf, capsys):
    import metalkv

    if "metal" not in metalkv.devices():
        assert cli.main(["generate", "hi", "--device", "metal"]) == 2  # a flag's mistake, before the load
        assert "--device metal: not available on this machine (available: " in capsys.readouterr().err
    assert cli.main(["generate", "hi", "--model", "/nonexistent/model.gguf"]) == 2
    assert "model '/nonexistent/model.gguf' not found" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["generate"])  # argparse: the prompt is required


def test_quantize_flag(tmp_path, capsys):
    """--quantize reaches Engine.load: the text is the quantized engine's, not the float one's."""
    import warnings

    import metalkv
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    f = tmp_path / "tiny.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    flags = ["--model", str(f), "--device", "host", "--no-chat", "--max-tokens", "8", "--context", "64"]
    assert cli.main(["generate", "abc", "--quantize", "q4_0"] + flags) == 0
    out = capsys.readouterr().out
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every matrix of this model is whole blocks
        eng = metalkv.Engine.load(f, device="host", context=64, quantize="q4_0", progress=False)
    assert out == eng.generate("abc", chat=False, max_tokens=8) + "\n"
    with pytest.raises(SystemExit) as e:
        cli.main(["generate", "abc", "--quantize", "q5_0"] + flags)
    assert e.value.code == 2 and "invalid choice: 'q5_0'" in capsys.readouterr().err


def test_save_and_load_cache_continue_the_conversation(engine, monkeypatch, capsys, tmp_path):
    """generate --save-cache, then chat --load-cache: the second turn is what one
    uninterrupted conversation gives (greedy), and feeds only the new message."""
    f = tmp_path / "conv.safetensors"
    base = ["--max-tokens", "10", "--device", "host", "--context", "256", "--temperature", "0"]
    assert cli.main(["generate", "My name is Ana.", "--save-cache", str(f)] + base) == 0
    capsys.readouterr()
    monkeypatch.setattr("sys.stdin", io.StringIO("What is my name?\n/exit\n"))
    assert cli.main(["chat", "--load-cache", str(f), "--save-cache", str(f)] + base) == 0
    out, err = capsys.readouterr()
    assert re.search(r"\[loaded .*conv\.safetensors: \d+ tokens, 2 messages\]", err)
    straight = engine.new_cache()
    engine.generate("My name is Ana.", cache=straight, max_tokens=10, temperature=0.0)
    reply = engine.generate("What is my name?", cache=straight, max_tokens=10, temperature=0.0)
    assert out == f"> {reply}\n> "  # input()'s prompts around the reply
    fed = [int(n) for n in re.findall(r"\[(\d+) prompt tokens", err)]
    assert fed == [engine.last_stats["prompt_tokens"]]
    assert engine.load_cache(f).messages == straight.messages  # chat saved it again after the turn


def test_load_cache_errors_exit_2(capsys, tmp_path):
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"\x00" * 16)
    assert cli.main(["generate", "hi", "--device", "host", "--load-cache", str(bad)]) == 2
    assert re.search(r"^metalkv: error: --load-cache .*bad\.safetensors: header length 0 does not fit",
                     capsys.readouterr().err)


def test_chat_template_flag(engine, tmp_path, capsys):
    """--chat-template FILE: the reply is the one to the prompt that template writes;
    a file that is missing or does not parse is the flag's error."""
    from metalkv.models.chat import ChatTemplate

    source = ("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }} Reply in French.<|im_end|>\n"
              "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
    f = tmp_path / "t.jinja"
    f.write_text(source)
    assert cli.main(["generate", PROMPT, "--max-tokens", "10", "--device", "host", "--context", "128",
                     "--chat-template", str(f)]) == 0
    text = ChatTemplate(source).render([{"role": "user", "content": PROMPT}])
    ids = engine.generate_ids(engine.tokenizer.encode(text), max_tokens=10)
    want = engine.tokenizer.decode(ids, skip_special=True)
    assert capsys.readouterr().out == want + "\n" != engine.generate(PROMPT, max_tokens=10) + "\n"
    assert cli.main(["generate", "hi", "--chat-template", str(tmp_path / "none.jinja")]) == 2
    assert "--chat-template " + str(tmp_path / "none.jinja") + ": cannot read it" in capsys.readouterr().err
    f.write_text("{% for m in messages %}")
    assert cli.main(["generate", "hi", "--chat-template", str(f)]) == 2
    assert "template does not parse" in capsys.readouterr().err
