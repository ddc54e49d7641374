"""One KV options object (cpp/kv/kv_options.h, _core.KvOptions): the CLI's flags come from its
table, a cache's options lie over its engine's field by field, a budget's fraction is of the
engine's context unless the cache gives eviction options of its own, and every check speaks in
the words of the door it came through."""
from __future__ import annotations

import argparse
import pathlib
import re

import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path
from metalkv import _core, cli
from metalkv.kv_options import KV_FORMATS, KV_OPTIONS, KV_POLICIES, kv_options

ROOT = pathlib.Path(__file__).resolve().parents[2]


def load(path, **kw):
    kw = {"context": 96, "prefill_chunk": 8, "kv_memory": None, **kw}
    return metalkv.Engine.load(path, device=TEST_DEVICE, progress=False, **kw)


def test_the_cli_flags_are_the_table():
    p = argparse.ArgumentParser()
    cli._add_kv_flags(p)
    flags = {a.dest: a for a in p._actions if a.dest.startswith("kv_")}
    assert sorted(flags) == sorted(row["name"] for row in KV_OPTIONS)
    for row in KV_OPTIONS:
        assert tuple(flags[row["name"]].choices or ()) == row["choices"]
        assert flags[row["name"]].default is None  # a flag left out is not given: the core's default
    by_name = {row["name"]: row for row in KV_OPTIONS}
    assert by_name["kv_k"]["choices"] == KV_FORMATS == ("f16", "q8", "q4", "q2")
    assert by_name["kv_policy"]["choices"] == KV_POLICIES == ("streaming", "keynorm", "h2o", "snapkv", "pyramidkv")
    assert by_name["kv_sinks"]["default"] == "4" and by_name["kv_budget"]["default"] == "0.25"


def test_given_and_defaults():
    o = kv_options(kv_k="q8", kv_budget=0.5, kv_f16_layers=[0, -1])
    assert o.given["kv_k"] == "q8" and o.given["kv_budget"] == 0.5 and o.given["kv_f16_layers"] == (0, -1)
    assert o.given["kv_v"] is None and o.given["kv_policy"] is None  # not given: defaults stay the core's
    r = kv_options(kv_k="q2", kv_v="q4").resolve(4, 64, 100)
    assert r["kv_k"] == ["q2"] * 4 and r["kv_residual"] == 128 and r["quantized"]  # q2 needs KIVI's window
    r = kv_options(kv_k="q8", kv_f16_layers=(0, -1)).resolve(4, 64, 100)
    assert r["kv_k"] == ["f16", "q8", "q8", "f16"] and r["kv_residual"] == 0 and not r["kv_rotate"]
    r = kv_options(kv_policy="h2o").resolve(4, 64, 1000)
    assert r["kv_policy"] == "h2o" and r["kv_budget"] == 250  # a quarter of the context
    assert kv_options(kv_policy="h2o", kv_budget=300).resolve(4, 64, 1000)["kv_budget"] == 300
    assert kv_options(kv_k="q4", kv_policy="snapkv", kv_budget=64).describe(4, 64, 100) == \
        "K q4, V f16, rotated; snapkv 64 (4 sinks)"
    assert kv_options(kv_policy="snapkv", kv_budget=64).describe(4, 64, 100) == "snapkv 64 (4 sinks)"
    assert kv_options(kv_k=["q8", "q4", "q8", "q4"]).describe(4, 64, 100) == \
        "K q8,q4,q8,q4; V f16,f16,f16,f16, rotated, residual 128"


@pytest.mark.parametrize("op,kw,message", [
    ("engine", dict(kv_rotate=1), "[engine] kv_rotate=1: expected None (on for q4 and q2), True or False"),
    ("new_cache", dict(kv_k=3), "[new_cache] kv_k=3: expected 'f16', 'q8', 'q4' or 'q2', or a list"),
    ("engine", dict(kv_k="q5"), "kv_k='q5': expected one of 'f16', 'q8', 'q4' or 'q2'"),
    ("engine", dict(kv_budget=1.5), "[engine] kv_budget=1.5: expected None, a token count >= 1 or a fraction"),
    ("engine", dict(kv_budget=0), "[engine] kv_budget=0: expected None, a token count >= 1"),
    ("engine", dict(kv_budget=True), "[engine] kv_budget=True: expected None"),
    ("ppl", dict(kv_sinks=-1), "[ppl] kv_sinks=-1: expected an int >= 0"),
    ("engine", dict(kv_window=0), "[engine] kv_window=0: expected an int >= 1"),
    ("engine", dict(kv_prompt="all"), "kv_prompt='all': expected None, 'whole' or 'stream'"),
    ("engine", dict(kv_policy="lru"), "kv_policy='lru': expected None or one of streaming, keynorm"),
    ("engine", dict(kv_residual=48), "[engine] kv_residual=48: expected None or an int >= 0, a multiple of 32"),
    ("engine", dict(kv_f16_layers="0"), "[engine] kv_f16_layers='0': expected a list of layer indices"),
    ("engine", dict(kv_memory="4 parsecs"), "[engine] kv_memory='4 parsecs': expected 'auto', None or 0"),
])
def test_each_check_names_the_option(op, kw, message):
    with pytest.raises(metalkv.ArgumentError, match=re.escape(message)) as e:
        kv_options(op, **kw)
    assert e.value.argument == next(iter(kw))


@pytest.mark.parametrize("kw,rotate,residual", [
    (dict(kv_k="q4", kv_v="q4"), True, 128),                   # the safe defaults (docs/KV_QUANT.md "Defaults")
    (dict(kv_k="q4", kv_v="q8"), True, 128),
    (dict(kv_k="q8", kv_v="q8"), False, 0),                    # 8 bits need neither
    (dict(kv_k="q2"), True, 128),
    (dict(kv_k="q4", kv_rotate=False), False, 128),            # what the user says stays
    (dict(kv_k="q4", kv_residual=0), True, 0),
    (dict(kv_k="q4", kv_policy="h2o"), True, 0),               # a policy and a window do not go together
    (dict(kv_k=["q4", "f16", "f16", "f16"]), True, 128),       # one q4 layer is enough
])
def test_four_and_two_bits_rotate_and_keep_a_window_unless_told(kw, rotate, residual):
    r = kv_options(**kw).resolve(4, 64, 1000)
    assert (r["kv_rotate"], r["kv_residual"]) == (rotate, residual)


def test_rotation_by_default_only_where_the_head_dim_has_it():
    assert not kv_options(kv_k="q4").resolve(4, 80, 1000)["kv_rotate"]  # 80: no Hadamard transform
    assert kv_options(kv_k="q4").resolve(4, 128, 1000)["kv_rotate"]


def test_an_unrotated_four_bit_cache_says_what_it_costs():
    assert "+14.1 % perplexity for q4/q4" in kv_options(kv_k="q4", kv_rotate=False).caution(4, 64, 1000)
    assert "q2" in kv_options(kv_k="q2", kv_rotate=False).caution(4, 64, 1000)
    for kw in (dict(kv_k="q4"), dict(kv_k="q8", kv_rotate=False), dict()):
        assert kv_options(**kw).caution(4, 64, 1000) == ""


@pytest.mark.parametrize("kw,name,message", [
    (dict(kv_budget=64), "kv_budget", "kv_budget does nothing without kv_policy"),
    (dict(kv_sinks=2), "kv_sinks", "kv_sinks does nothing without kv_policy"),
    (dict(kv_prompt="whole"), "kv_prompt", "kv_prompt does nothing without kv_policy"),
    (dict(kv_policy="h2o", kv_window=8), "kv_window", "kv_window does nothing with kv_policy 'h2o'"),
])
def test_options_that_do_nothing_alone_are_refused(kw, name, message):
    with pytest.raises(metalkv.ArgumentError, match=re.escape(message)) as e:
        kv_options(**kw).check_together()
    assert e.value.argument == name
    with pytest.raises(metalkv.ArgumentError, match=re.escape(message)):
        kv_options(**kw).resolve(4, 64, 1000)
    kv_options(**kw)  # alone they are fine: a cache's may lie over an engine's policy


def test_layer_checks_wait_for_the_model():
    o = kv_options(kv_f16_layers=(0, 7))
    with pytest.raises(metalkv.ArgumentError, match=re.escape("kv_f16_layers=[0, 7]: expected layer indices in -4..3")):
        o.resolve(4, 64, 100)
    with pytest.raises(metalkv.ArgumentError, match="kv_k=\\['q8', 'q4'\\]: expected one format per layer: 4"):
        kv_options(kv_k=["q8", "q4"]).resolve(4, 64, 100)
    with pytest.raises(TypeError, match="unexpected keyword argument 'kv_colour'"):
        _core.KvOptions("engine", kv_colour="red")


def test_a_cache_lies_over_its_engine_field_by_field(tiny_gguf):
    eng = load(tiny_gguf, context=192, kv_k="q8", kv_policy="streaming", kv_budget=0.5)  # 96 of 192
    assert eng.kv_options.given["kv_k"] == "q8" and eng.kv_options.given["kv_memory"] == 0
    base = eng.new_cache(capacity=128)
    assert base.formats(0) == ("q8", "f16") and base.policy == "streaming" and base.budget == 96
    own = eng.new_cache(capacity=128, kv_v="q4")  # formats of its own: the engine's policy and budget stay
    assert own.formats(0) == ("q8", "q4") and own.policy == "streaming" and own.budget == 96
    sinks = eng.new_cache(capacity=128, kv_sinks=2)  # an eviction option of its own: the fraction is of 128
    assert sinks.formats(0) == ("q8", "f16") and sinks.budget == 64 and sinks.policy_options["sinks"] == 2
    off = eng.new_cache(capacity=128, kv_policy="none")  # the engine's eviction options are moot then
    assert off.policy == "none" and off.capacity == 128
    snap = eng.new_cache(capacity=128, kv_policy="snapkv", kv_window=8)
    assert snap.policy == "snapkv" and snap.policy_options["window"] == 8
    with pytest.raises(TypeError, match="no kv_memory"):
        eng.new_cache(kv_memory="1GB")


def test_a_bad_option_fails_before_the_model_is_read(tmp_path):
    missing = tmp_path / "no-such-model.gguf"  # the options are checked first: no ModelLoadError
    with pytest.raises(metalkv.ArgumentError, match="kv_window=0"):
        metalkv.Engine.load(missing, device=TEST_DEVICE, kv_window=0)
    with pytest.raises(metalkv.ArgumentError, match=re.escape("[engine] max_seqs=5000: expected an int in 1..4096")):
        metalkv.Engine.load(missing, device=TEST_DEVICE, max_seqs=5000)
    with pytest.raises(metalkv.ArgumentError, match="kv_budget does nothing without kv_policy"):
        metalkv.Engine.load(missing, device=TEST_DEVICE, kv_budget=64)


def test_no_policy_is_named_outside_its_table():
    """Every difference between eviction policies is a row of kv_policy.cpp's table
    (PolicyTraits): no C++ file branches on a policy by name (docs/KV_CACHE.md, "Adding an
    eviction policy")."""
    named = re.compile(r"PolicyKind::(streaming|keynorm|h2o|snapkv|pyramidkv)\b")
    offenders = [f"{p.relative_to(ROOT)}:{i + 1}" for p in sorted((ROOT / "cpp").rglob("*.[ch]*"))
                 if p.name not in ("kv_policy.h", "kv_policy.cpp")
                 for i, line in enumerate(p.read_text().splitlines()) if named.search(line)]
    assert offenders == []
