"""KV sharing (Engine.load(kv_share={reader: source})): a reader layer stores no K and V
and attends over its source layer's, with its own queries (Gemma 3n's last layers;
MiniCache-style reuse for any model). Against the float64 numpy reference with the same
sharing (reference.llama_logits(kv_share=)), through prefill and decode, batched, with
a quantized cache; the cache holds only the layers that store."""
from __future__ import annotations

import numpy as np
import pytest

import metalkv
from metalkv.models import load_model

from .conftest import TINY
from .reference import llama_logits

SHARE = {2: 1, 3: 1, 5: 4}  # layers 2 and 3 read layer 1's K and V, layer 5 layer 4's
IDS = [5, 17, 33, 2, 60, 41, 8, 8, 19, 50, 3, 27, 44, 12, 61, 9, 30, 22, 7, 55]
# float32 and the f16 cache against float64: 0.013 at most without sharing on this model
# (logits up to ~16), as test_default_model's tolerance allows
TOL = 0.02


@pytest.fixture(scope="module")
def six_layers(tmp_path_factory):
    from models.tiny import write_gguf  # tests/ is on sys.path

    f = tmp_path_factory.mktemp("kv_share") / "six.gguf"
    write_gguf(f, **{**TINY, "n_layers": 6})
    return f


def load(path, **kw):
    return metalkv.Engine.load(path, device="host", progress=False, **kw)


@pytest.mark.parametrize("chunk", [128, 1], ids=["prefill", "decode"])
def test_logits_match_the_reference_with_the_same_sharing(six_layers, chunk):
    """prefill_chunk=1 feeds the prompt one token a step: every row through the decode kernel."""
    m = load_model(six_layers, progress=False)
    ref = llama_logits(m, IDS, kv_share=SHARE)
    plain = llama_logits(m, IDS)
    assert np.abs(ref - plain).max() > 10 * TOL  # sharing changes the model: the test can tell
    ours = load(six_layers, kv_share=SHARE, prefill_chunk=chunk).logits(IDS)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=TOL)


def test_the_cache_holds_only_the_layers_that_store(six_layers):
    shared, plain = load(six_layers, kv_share=SHARE), load(six_layers)
    a, b = shared.new_cache(capacity=64), plain.new_cache(capacity=64)
    assert (a.n_layers, b.n_layers) == (3, 6)  # layers 0, 1 and 4 store
    assert a.bytes_per_token * 2 == b.bytes_per_token


def test_negative_indices_and_chains(six_layers):
    """{-1: 4, 4: 3} is layer 5 reading layer 4, which reads layer 3: both read layer 3's."""
    m = load_model(six_layers, progress=False)
    ref = llama_logits(m, IDS, kv_share={5: 3, 4: 3})
    ours = load(six_layers, kv_share={-1: 4, 4: 3}).logits(IDS)
    np.testing.assert_allclose(ours, ref, rtol=0, atol=TOL)


def test_batched_calls_get_what_each_gets_alone(six_layers):
    eng = load(six_layers, kv_share=SHARE)
    prompts = [IDS[:7], IDS[3:15], IDS[::2]]
    alone = [eng.generate_ids(p, max_tokens=6, temperature=0, stop_ids=()) for p in prompts]
    assert eng.generate_ids(prompts, max_tokens=6, temperature=0, stop_ids=()) == alone


def test_a_rotated_q4_cache_gives_the_readers_the_sources_rows(six_layers):
    """q4 K and V, Hadamard-rotated: a reader's queries are rotated as its source's are (in
    the store), and it reads the q4 rows its source stored. Reference: that storage, as a
    prefill stages it (decode rows are quantized from float32, ~7e-3 off it with or
    without sharing)."""
    from .test_kv_quant_engine import storage

    m = load_model(six_layers, progress=False)
    got = load(six_layers, kv_share=SHARE, kv_k="q4", kv_v="q4", kv_rotate=True, kv_residual=0).logits(IDS)
    ref = llama_logits(m, IDS, storage=storage("q4", "q4", True), kv_share=SHARE)
    f16 = llama_logits(m, IDS, kv_share=SHARE)
    scale = np.abs(ref).max()
    err, off = np.abs(got - ref).max() / scale, np.abs(got - f16).max() / scale
    assert err < 1e-3, err  # (2.5e-5 here; a code may move one step on a boundary)
    assert off > 4 * err, (off, err)


@pytest.mark.parametrize("share", [{1: 2}, {2: 2}, {0: 0}, {6: 1}, {1: "0"}, [(2, 1)]],
                         ids=["source-after", "itself", "first", "out-of-range", "str", "list"])
def test_bad_sharing_is_refused_by_name(six_layers, share):
    with pytest.raises(metalkv.ArgumentError, match=r"\[engine\] kv_share=.*expected a dict \{reader: source\}"):
        load(six_layers, kv_share=share)


def test_a_reader_needs_its_sources_window(tiny_sliding_dir):
    """The tiny Gemma 3 has sliding layers and one full layer (5): 6 may not read 5's."""
    with pytest.raises(metalkv.ArgumentError, match=r"kv_share=\{6: 5\}.*same attention window"):
        load(tiny_sliding_dir, kv_share={6: 5})
    eng = load(tiny_sliding_dir, kv_share={6: 4, 3: 2})  # sliding reads sliding
    assert eng.new_cache(capacity=64).n_layers == 5


def test_a_saved_cache_continues_and_another_sharing_refuses_it(six_layers, tmp_path):
    """The file holds the 3 stored layers; an engine that shares otherwise (or not at all)
    is another model as far as the cache goes (its fingerprint)."""
    eng = load(six_layers, kv_share=SHARE)
    straight, saved = eng.new_cache(), eng.new_cache()
    for c in (straight, saved):
        eng.generate_ids(IDS, cache=c, max_tokens=4, temperature=0, stop_ids=())
    f = tmp_path / "shared.safetensors"
    saved.save(f)
    loaded = eng.load_cache(f)
    assert loaded.n_layers == 3
    np.testing.assert_array_equal(eng.logits([7, 9], cache=loaded), eng.logits([7, 9], cache=straight))
    for other in (load(six_layers), load(six_layers, kv_share={2: 1})):
        with pytest.raises(metalkv.CacheFileError, match=r"was saved from another model \(fingerprint"):
            other.load_cache(f)


def test_the_cli_flag_reads_reader_source_pairs():
    import argparse

    from metalkv.cli_flags import _kv_share_pairs

    assert _kv_share_pairs("20:19,21:19,-1:-2") == {20: 19, 21: 19, -1: -2}
    for bad in ("20-19", "20:19,20:18", "a:b", "1:2:3"):
        with pytest.raises(argparse.ArgumentTypeError, match="expected READER:SOURCE layer pairs"):
            _kv_share_pairs(bad)


def test_only_the_writers_attention_scores_a_shared_layer(six_layers):
    """h2o: cache layer c's score of each key is the attention its writer's query heads gave
    it (the float64 reference's, summed over every query); its readers add nothing."""
    m = load_model(six_layers, progress=False)
    ids = (IDS * 3)[:48]
    eng = load(six_layers, kv_share=SHARE, kv_policy="h2o", kv_budget=128, context=160)
    cache = eng.new_cache()
    eng.logits(ids[:40], cache=cache)
    for t in ids[40:]:
        eng.logits([t], cache=cache)
    probs = {}
    llama_logits(m, ids, probs=probs, kv_share=SHARE)
    writers, readers = [0, 1, 4], {1: [2, 3], 4: [5]}
    for c, w in enumerate(writers):
        want = sum(probs[w, hq].sum(0) for hq in range(m.config.n_heads))
        np.testing.assert_allclose(cache.scores(c)[0, :len(ids)], want, rtol=1e-2, atol=2e-3)
        for r in readers.get(w, []):  # what summing the readers in would have given
            more = want + sum(probs[r, hq].sum(0) for hq in range(m.config.n_heads))
            assert np.abs(more - want).max() > 0.1


def test_lookup_speculation_gives_what_plain_decoding_gives(six_layers):
    eng = load(six_layers, kv_share=SHARE)
    prompt = (IDS[:6] * 5)[:26]  # a repeated run: lookups propose and some are accepted
    plain = eng.generate_ids(prompt, max_tokens=24, temperature=0, stop_ids=())
    assert eng.generate_ids(prompt, max_tokens=24, temperature=0, stop_ids=(), speculate="lookup") == plain


# ---- eviction policies over shared layers: a cache layer's choice holds for its readers ----
POLICY_IDS = [int(i) for i in np.random.default_rng(3).integers(0, 64, 150)]
KV_OF = [0, 1, 1, 1, 2, 2]  # SHARE's cache layer of each model layer (writers 0, 1 and 4)


def test_streaming_over_shared_layers_matches_the_reference(six_layers):
    """150 tokens through a budget of 64 in chunks of 8: readers see exactly the positions
    their writer's cache layer holds (the sinks and the latest), at their true positions."""
    from kv import kv_policy_ref as pref  # tests/ is on sys.path

    m = load_model(six_layers, progress=False)
    eng = load(six_layers, kv_share=SHARE, kv_policy="streaming", kv_budget=64, context=96, prefill_chunk=8,
               kv_memory=None)
    cache = eng.new_cache()
    got = eng.logits(POLICY_IDS, cache=cache)
    assert cache.n_layers == 3 and cache.evicted == len(POLICY_IDS) - cache.count(0)
    st, n = pref.HeadState({"policy": "streaming", "sinks": 4}, 64), len(POLICY_IDS)
    vis = np.zeros((n, n), bool)
    for a in range(0, n, 8):
        st.store(min(8, n - a))
        vis[a:a + 8, st.held] = True
    ref = llama_logits(m, POLICY_IDS, kv_share=SHARE, visible=lambda layer, g: vis)
    whole = llama_logits(m, POLICY_IDS, kv_share=SHARE)
    scale = np.abs(ref).max()
    err, off = np.abs(got - ref).max() / scale, np.abs(got - whole).max() / scale
    assert err < 4e-3 and off > 4 * err, (err, off)


@pytest.mark.parametrize("name", ["snapkv", "pyramidkv"])
def test_a_compressed_prompt_is_compressed_once_for_a_writer_and_its_readers(six_layers, name):
    """SnapKV / PyramidKV with sharing: budgets are the cache layers' (pyramidkv's split
    over the 3 that store, not the 6 layers), each cache layer's pick comes from its
    writer's last queries alone, and every layer reading it then sees what was kept."""
    from kv import kv_policy_ref as pref  # tests/ is on sys.path

    m = load_model(six_layers, progress=False)
    window, n, budget = 8, 140, 96
    policy = {"policy": name, "sinks": 4, "window": window, "budget": budget}
    eng = load(six_layers, kv_share=SHARE, kv_policy=name, kv_budget=budget, kv_window=window, context=200,
               kv_memory=None, prefill_chunk=8)
    cache = eng.new_cache()
    budgets = pref.layer_budgets(policy, [0] * 3)
    assert [cache.layer_budget(c) for c in range(3)] == budgets
    eng.logits(POLICY_IDS[:n], cache=cache)
    probs = {}
    llama_logits(m, POLICY_IDS[:n], probs=probs, kv_share=SHARE)
    kept = []
    for c, writer in enumerate([0, 1, 4]):
        want = sum(probs[writer, hq][n - window:].sum(0) for hq in range(m.config.n_heads))
        np.testing.assert_allclose(cache.scores(c)[0, :n], want, rtol=1e-2, atol=2e-3)
        kept.append(sorted(pref.select_kept(policy, np.arange(n), cache.scores(c)[0, :n].copy(),
                                            pref.keep_after_eviction(budgets[c], 1))))
    got = eng.logits(POLICY_IDS[n:n + 1], cache=cache)
    for c in range(3):
        assert sorted(cache.kept_positions(c)) == kept[c] + [n]
    seen = [np.isin(np.arange(n + 1), kept[c] + [n]) for c in range(3)]
    ref = llama_logits(m, POLICY_IDS[:n + 1], kv_share=SHARE,
                       visible=lambda layer, g: np.vstack([np.ones((n, n + 1), bool), seen[KV_OF[layer]][None]]))
    np.testing.assert_allclose(got[-1], ref[-1], atol=4e-3 * np.abs(ref).max())


def test_a_draft_model_gives_what_decoding_alone_gives(six_layers):
    """A target that shares K/V, with a draft model (the same file, not sharing: its
    proposals mostly differ where sharing changed the model): greedy ids as without it."""
    plain = load(six_layers, kv_share=SHARE, context=128)
    spec = load(six_layers, kv_share=SHARE, context=128, draft=six_layers)
    prompt = (IDS * 2)[:30]
    want = plain.generate_ids(prompt, max_tokens=24, stop_ids=())
    assert spec.generate_ids(prompt, max_tokens=24, stop_ids=(), speculate="draft") == want
    assert spec.last_stats["draft_proposed"] > 0
