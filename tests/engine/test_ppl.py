"""Decode-time perplexity (metalkv.ppl, `metalkv ppl`): the numbers are the
definitions computed from the engine's own logits, and the command line
prints them for the formats it is given."""
from __future__ import annotations

import json

import numpy as np
import pytest

import metalkv
from metalkv import cli
from metalkv.ppl import log_softmax, score
from devices import TEST_DEVICE  # tests/ is on sys.path

IDS = [1, 5, 9, 63, 0, 17, 17, 2, 40, 33, 8, 8, 21, 60, 3, 12, 44, 2, 9, 30, 31, 7, 7, 19, 50, 4]


@pytest.fixture(scope="module")
def tiny(tiny_gguf):
    return metalkv.Engine.load(tiny_gguf, device=TEST_DEVICE, context=64, progress=False, kv_memory=None)


def reference(engine, ids, chunk, **cache_kw):
    """(log-probabilities of each next id, per position) written out: feed the
    chunks into one cache, keep every row."""
    cache = engine.new_cache(**cache_kw)
    rows = np.concatenate([engine.logits(ids[lo:min(lo + chunk, len(ids) - 1)], cache=cache)
                           for lo in range(0, len(ids) - 1, chunk)])
    return log_softmax(rows)


def test_scores_are_the_definitions(tiny):
    chunk = 4
    f16, q4 = score(tiny, IDS, {"q4": dict(kv_k="q4", kv_v="q4")}, chunk=chunk)
    lp_f16 = reference(tiny, IDS, chunk, kv_k="f16", kv_v="f16")
    lp_q4 = reference(tiny, IDS, chunk, kv_k="q4", kv_v="q4")
    targets = np.asarray(IDS[1:])
    nll = lambda lp: -lp[np.arange(len(targets)), targets].mean()  # noqa: E731
    assert f16.tokens == q4.tokens == len(IDS) - 1
    assert f16.ppl == pytest.approx(np.exp(nll(lp_f16)), rel=1e-9)
    assert q4.ppl == pytest.approx(np.exp(nll(lp_q4)), rel=1e-9)
    assert q4.ppl_change == pytest.approx(q4.ppl / f16.ppl - 1)
    kl = (np.exp(lp_f16) * (lp_f16 - lp_q4)).sum(-1).mean()
    assert q4.kl == pytest.approx(kl, rel=1e-6) and q4.kl > 0
    assert q4.top1 == pytest.approx((lp_f16.argmax(-1) == lp_q4.argmax(-1)).mean())
    assert q4.bytes_per_token < f16.bytes_per_token


def test_an_f16_candidate_agrees_with_the_reference_exactly(tiny):
    _, same = score(tiny, IDS, {"again": dict(kv_k="f16", kv_v="f16")}, chunk=5)
    assert same.kl == 0 and same.top1 == 1 and same.ppl_change == 0


def test_bad_arguments(tiny):
    with pytest.raises(ValueError, match="chunk=0"):
        score(tiny, IDS, {}, chunk=0)
    with pytest.raises(ValueError, match="at least 2 ids"):
        score(tiny, IDS[:1], {})


def test_the_command_prints_the_rows(default_gguf, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text("It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                    "must be in want of a wife. However little known the feelings or views of such a man may be.")
    args = ["ppl", str(text), "--tokens", "24", "--chunk", "8", "--device", "host", "--kv-k", "q8", "--kv-v", "q4",
            "--kv-rotate", "--json"]
    assert cli.main(args) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [r["label"] for r in rows] == ["f16", "K q8, V q4, rotated, residual 128"]  # (q4's defaults)
    assert rows[0]["tokens"] == rows[1]["tokens"] == 24 and rows[0]["kl"] is None
    assert rows[1]["bytes_vs_f16"] == pytest.approx(23040 / rows[1]["bytes_per_token"])
    assert 1 < rows[0]["ppl"] < 1000 and rows[1]["kl"] >= 0
    # q2 with its defaults (rotated, window 128), and q4 with a window of its own, not rotated
    assert cli.main(args[:-6] + ["--kv-k", "q2", "--kv-v", "q2", "--json"]) == 0
    q2 = json.loads(capsys.readouterr().out)[1]
    assert cli.main(args[:-6] + ["--kv-k", "q4", "--kv-v", "q4", "--kv-residual", "64", "--no-kv-rotate",
                                 "--json"]) == 0
    q4 = json.loads(capsys.readouterr().out)[1]
    assert q2["label"] == "K q2, V q2, rotated, residual 128" and q4["label"] == "K q4, V q4, residual 64"
    assert q2["bytes_per_token"] < q4["bytes_per_token"] and q2["kl"] >= 0
    assert cli.main(args[:-6] + ["--kv-k", "q4", "--kv-residual", "48"]) == 2
    assert "--kv-residual 48: expected an int >= 0, a multiple of 32" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        cli.main(["ppl", str(text), "--kv-k", "q3"])
    assert cli.main(["ppl", str(tmp_path / "missing.txt"), "--tokens", "4", "--device", "host"]) == 2
    assert cli.main(["ppl", str(text), "--kv-f16-layers", "first,last", "--device", "host"]) == 2
    assert "--kv-f16-layers 'first,last': expected layer indices such as 0,-1" in capsys.readouterr().err
