"""Saved caches (cache.save / Engine.load_cache): a loaded cache continues exactly
as the uninterrupted one (the same logits, bit for bit, and the same ids), on
full and sliding models, own and shared pools; the file is a safetensors file
the safetensors package reads; another model, another version, a truncated or
corrupt file are clear errors."""
from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest

import metalkv
from metalkv import cache_file
from devices import TEST_DEVICE  # tests/ is on sys.path


def load(path, **kw):
    return metalkv.Engine.load(path, device=TEST_DEVICE, context=64, prefill_chunk=4, progress=False, **kw)


@pytest.fixture(scope="module")
def engines(tiny_gguf, tiny_sliding_dir):
    return {"tiny": load(tiny_gguf), "sliding": load(tiny_sliding_dir),
            "shared": load(tiny_sliding_dir, kv_memory="1MB"),
            # quantized and rotated, K and V apart, one layer kept at f16 (issue 14)
            "quantized": load(tiny_sliding_dir, kv_k="q4", kv_v="q8", kv_rotate=True, kv_f16_layers=[1],
                              kv_residual=0),  # (no f16 window: its file holds the quantized rows alone)
            "quantized_shared": load(tiny_gguf, kv_k="q8", kv_v="q4", kv_memory="1MB"),
            # a residual window: q2 (its last partial block's K only in the ring), and sliding layers
            "residual_q2": load(tiny_gguf, kv_k="q2", kv_v="q2", kv_rotate=True, kv_residual=32),
            # (2MB: kv_memory holds the three caches' rings beside the blocks)
            "residual_sliding": load(tiny_sliding_dir, kv_k="q4", kv_v="q8", kv_residual=32, kv_memory="2MB")}


def greedy(engine, ids, cache, n=6):
    return engine.generate_ids(ids, cache=cache, max_tokens=n, temperature=0.0, stop_ids=())


@pytest.mark.parametrize("model", ["tiny", "sliding", "shared", "quantized", "quantized_shared", "residual_q2",
                                   "residual_sliding"])
def test_a_loaded_cache_continues_as_if_never_saved(engines, model, tmp_path):
    engine = engines[model]
    first, second = list(range(1, 46)), [5, 9, 2]  # 45 + 5 stored: the sliding layers have let a block go
    straight = engine.new_cache()
    greedy(engine, first, straight)
    saved = engine.new_cache()
    greedy(engine, first, saved)
    saved.messages = [{"role": "user", "content": "hi"}]
    straight.messages = [{"role": "user", "content": "hi"}]
    f = tmp_path / "c.safetensors"
    saved.save(f)
    loaded = engine.load_cache(f)
    assert [loaded.length(l) for l in range(loaded.n_layers)] == [straight.length(l) for l in range(straight.n_layers)]
    assert list(loaded.tokens) == list(straight.tokens) and loaded.messages == straight.messages
    for l in range(loaded.n_layers):  # the same rows at the same positions
        for c in (loaded, straight):
            assert (np.asarray(c.positions(l)) >= 0).sum() == (np.asarray(straight.positions(l)) >= 0).sum()
    np.testing.assert_array_equal(engine.logits(second, cache=loaded), engine.logits(second, cache=straight))
    assert greedy(engine, [7, 7], loaded) == greedy(engine, [7, 7], straight)


def test_the_file_is_safetensors_with_its_metadata(engines, tmp_path):
    from safetensors import safe_open

    engine = engines["sliding"]
    cache = engine.new_cache()
    greedy(engine, list(range(1, 46)), cache)
    f = tmp_path / "c.safetensors"
    cache.save(f)
    with safe_open(str(f), framework="numpy") as st:
        meta = st.metadata()
        assert meta["format"] == "metalkv-kv-cache" and meta["format_version"] == "2"
        assert meta["model_fingerprint"] == engine.fingerprint
        assert json.loads(meta["kv_formats"]) == [["f16", "f16"]] * cache.n_layers
        assert json.loads(meta["kv_rotate"]) is False
        assert json.loads(meta["tokens"]) == list(cache.tokens) and int(meta["length"]) == cache.length(0)
        firsts = json.loads(meta["first_positions"])
        for l in range(cache.n_layers):
            k = st.get_tensor(f"layer.{l}.k")
            assert k.dtype == np.float16 and k.shape == (cache.length(l) - firsts[l], cache.n_kv_heads, cache.head_dim)
            pos = np.asarray(cache.positions(l))
            slot = int(np.flatnonzero(pos == cache.length(l) - 1)[0])  # the last position's row
            np.testing.assert_array_equal(k[-1], np.asarray(cache.keys(l))[slot])
        windows = json.loads(meta["windows"])
        assert any(w and f > 0 for w, f in zip(windows, firsts))  # sliding layers saved only what they hold
        assert all(f == 0 for w, f in zip(windows, firsts) if w == 0)
    assert not list(tmp_path.glob(".c.safetensors.*"))  # no temporary file left


def saved(engines, tmp_path, model="tiny") -> pathlib.Path:
    engine = engines[model]
    cache = engine.new_cache()
    greedy(engine, list(range(1, 20)), cache)
    f = tmp_path / "c.safetensors"
    cache.save(f)
    return f


def rewrite_metadata(f: pathlib.Path, **changes) -> None:
    raw = f.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + n])
    for key, value in changes.items():  # None: the key goes
        header["__metadata__"].pop(key, None) if value is None else header["__metadata__"].update({key: value})
    blob = json.dumps(header).encode()
    blob += b" " * (-len(blob) % 8)
    f.write_bytes(len(blob).to_bytes(8, "little") + blob + raw[8 + n:])


def test_another_model_is_refused(engines, tmp_path):
    f = saved(engines, tmp_path, "tiny")
    with pytest.raises(metalkv.CacheFileError, match=r"was saved from another model \(fingerprint"):
        engines["sliding"].load_cache(f)


def test_an_unknown_version_is_refused(engines, tmp_path):
    f = saved(engines, tmp_path)
    rewrite_metadata(f, format_version="4")
    with pytest.raises(metalkv.CacheFileError, match=r"has format version 4; this metalkv reads versions 1, 2, 3 "
                                                     r"\(a newer metalkv wrote it\)"):
        engines["tiny"].load_cache(f)


def test_a_version_1_file_still_loads(engines, tmp_path):
    """Version 1 (f16 rows, kv_format 'f16') is version 2's f16 case with other metadata."""
    engine = engines["tiny"]
    f = saved(engines, tmp_path)
    straight = engine.load_cache(f)
    rewrite_metadata(f, format_version="1", kv_format="f16", kv_formats=None, kv_rotate=None)
    old = engine.load_cache(f)
    np.testing.assert_array_equal(engine.logits([3, 4], cache=old), engine.logits([3, 4], cache=straight))


def test_a_quantized_cache_stays_quantized_on_disk(engines, tmp_path):
    from safetensors import safe_open

    engine = engines["quantized"]
    cache = engine.new_cache()
    greedy(engine, list(range(1, 40)), cache)
    f = tmp_path / "q.safetensors"
    cache.save(f)
    with safe_open(str(f), framework="numpy") as st:
        meta = st.metadata()
        formats = json.loads(meta["kv_formats"])
        assert formats[0] == ["q4", "q8"] and formats[1] == ["f16", "f16"] and json.loads(meta["kv_rotate"])
        k, kp = st.get_tensor("layer.0.k"), st.get_tensor("layer.0.k_params")
        n = cache.length(0) - json.loads(meta["first_positions"])[0]
        assert k.dtype == np.uint8 and k.shape == (n, cache.n_kv_heads * cache.head_dim // 2)  # two codes a byte
        assert kp.dtype == np.uint8 and kp.shape == (n, 4)  # one (scale, lo) pair of halfs per head
        assert st.get_tensor("layer.1.k").dtype == np.float16
    f16 = engines["sliding"].new_cache()
    greedy(engines["sliding"], list(range(1, 40)), f16)
    f16.save(tmp_path / "f16.safetensors")
    assert f.stat().st_size < 0.6 * (tmp_path / "f16.safetensors").stat().st_size
    # an engine whose shared pool holds other formats cannot take it
    with pytest.raises(metalkv.CacheFileError, match=r"other KV formats than this engine's shared pool"):
        engines["shared"].load_cache(f)


def test_truncated_and_corrupt_files_are_refused(engines, tmp_path):
    f = saved(engines, tmp_path)
    good = f.read_bytes()
    f.write_bytes(good[:-100])
    with pytest.raises(metalkv.CacheFileError, match=r"\[cache_file\] .*truncated"):
        engines["tiny"].load_cache(f)
    flipped = bytearray(good)
    flipped[-7] ^= 0x40  # one bit of the last V row
    f.write_bytes(bytes(flipped))
    with pytest.raises(metalkv.CacheFileError, match=r"does not match its SHA-256: the file is corrupt"):
        engines["tiny"].load_cache(f)
    f.write_bytes(b"not a cache at all")
    with pytest.raises(metalkv.CacheFileError, match=r"\[cache_file\]"):
        engines["tiny"].load_cache(f)
    f.write_bytes(good)
    rewrite_metadata(f, format="something-else")
    with pytest.raises(metalkv.CacheFileError, match=r"is not a metalkv cache file"):
        engines["tiny"].load_cache(f)
    with pytest.raises(metalkv.CacheFileError, match=r"No such file"):
        engines["tiny"].load_cache(tmp_path / "missing.safetensors")


def test_saving_replaces_the_file_whole(engines, tmp_path):
    engine = engines["tiny"]
    f = saved(engines, tmp_path)
    small = engine.new_cache()
    greedy(engine, [1, 2, 3], small)
    small.save(f)
    assert engine.load_cache(f).length(0) == small.length(0)


def test_a_cache_without_an_engine_cannot_be_saved(tmp_path):
    cache = metalkv.KVCache(metalkv.device("host"), 1, 1, 32, 64)
    with pytest.raises(metalkv.CacheFileError, match=r"was not made by an Engine"):
        cache.save(tmp_path / "c.safetensors")


def test_reading_stays_for_every_version_written():
    """Older versions of our own format stay readable: every version ever written
    keeps its reader (a new version adds one)."""
    assert cache_file.VERSION in cache_file.READABLE_VERSIONS
    assert list(cache_file.READABLE_VERSIONS) == list(range(1, cache_file.VERSION + 1))
