"""Fuzz the model loaders: several hundred mutated files, made deterministically
from the default GGUF, a tiny GGUF and two tiny Hugging Face directories (header
fields, metadata values and types, tensor infos, truncation at every section
boundary, aliasing, misalignment, NaN / Inf data; see fuzz_gguf_cases.py and
fuzz_st_cases.py). Each goes through the real path, Engine.load(device="host")
and .logits(ids), and must be refused with a ModelLoadError that names the file
(and the key or tensor where the case says), or load to exactly the logits of
the file it was made from; any other exception, a crash or a hang fails.

    pytest tests/models/test_fuzz_model_files.py                       # every case
    METALKV_FUZZ_QUICK=1 pytest tests/models/test_fuzz_model_files.py  # a subset: ~50

The default model's cases edit one working copy in place and put the bytes back
after each case (98 MB is not copied per case); the reference logits of each
unmutated file are computed once.
"""
from __future__ import annotations

import os
import pathlib
import shutil

import gguf
import numpy as np
import pytest

import metalkv
from metalkv.models import ModelLoadError

from . import fuzz_gguf_cases as g
from . import fuzz_st_cases as st
from .tiny import (TINY_HF, TINY_VOCAB, gemma3_config, gguf_layout, llama_config, write_gguf,
                   write_hf_dir)

QUICK = os.environ.get("METALKV_FUZZ_QUICK", "") not in ("", "0")
_Q = gguf.GGMLQuantizationType
TINY = dict(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
TINY_QUANT = {"blk.0.attn_q.weight": _Q.Q4_0, "blk.0.ffn_up.weight": _Q.Q4_1,
              "blk.1.attn_output.weight": _Q.Q8_0, "blk.1.ffn_down.weight": _Q.F16}
TINY_IDS = [1, 5, 9, 63, 0, 17]
DEFAULT_IDS = [1, 504, 3459]


def params(cases: list, *, quick_same: bool = False) -> list:
    """Every case; in the quick form every 25th, plus (quick_same) every case that
    must load, since those are the ones that reach the C++ engine."""
    if QUICK:
        cases = [c for i, c in enumerate(cases) if i % 25 == 0 or (quick_same and c.expect == g.SAME)]
    return [pytest.param(c, id=c.id) for c in cases]


def loads_or_refuses(path: pathlib.Path, case, ref: np.ndarray, ids: list[int], label: str) -> None:
    """The assertion every case makes."""
    try:
        eng = metalkv.Engine.load(path, device="host", context=32, progress=False)
    except ModelLoadError as e:
        msg = str(e)
        assert case.expect != g.SAME, f"refused a harmless mutation: {msg}"
        assert label in msg, f"the error does not name {label}: {msg}"
        assert case.names is None or case.names in msg, f"the error does not name {case.names!r}: {msg}"
        return
    assert case.expect != g.REFUSED, "loaded a file that should be refused"
    got = eng.logits(ids)
    assert np.isfinite(got).all()
    np.testing.assert_array_equal(got, ref, err_msg="loaded, but computes other logits")


def reference_logits(path: pathlib.Path, ids: list[int]) -> np.ndarray:
    logits = metalkv.Engine.load(path, device="host", context=32, progress=False).logits(ids)
    assert np.isfinite(logits).all()
    return logits


# -- the tiny GGUF (~600 KB): every field of it ---------------------------------------

_TINY_KEYS = ["general.architecture", "llama.block_count", "llama.context_length",
              "llama.embedding_length", "llama.feed_forward_length", "llama.attention.head_count",
              "llama.attention.head_count_kv", "llama.rope.freq_base",
              "llama.attention.layer_norm_rms_epsilon", "llama.vocab_size", "tokenizer.ggml.model",
              "tokenizer.ggml.pre", "tokenizer.ggml.tokens", "tokenizer.ggml.token_type",
              "tokenizer.ggml.merges", "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id",
              "tokenizer.ggml.padding_token_id", "tokenizer.ggml.add_bos_token"]
_TINY_TENSORS = {"token_embd.weight": "f32", "output_norm.weight": "f32"}
for _i in range(2):
    _TINY_TENSORS.update({f"blk.{_i}.{n}.weight": "f32" for n in (
        "attn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "ffn_norm", "ffn_gate", "ffn_up",
        "ffn_down")})
_TINY_TENSORS.update({n: q.name.lower() for n, q in TINY_QUANT.items()})


def _tiny_gguf_cases() -> list[g.Case]:
    R, S = g.REFUSED, g.SAME
    p = "tiny"
    cases = g.header_cases(p) + g.count_cases(p, "llama", {
        "block_count": [(0, R), (1, R), (3, R), (2**31, R)],
        "context_length": [(0, R), (1, S), (2**31 - 1, S), (2**32 - 1, R)],
        "embedding_length": [(0, R), (127, R), (256, R)],
        "feed_forward_length": [(0, R), (63, R), (128, R)],
        "attention.head_count": [(0, R), (1, R), (4, R)],
        "attention.head_count_kv": [(0, R), (2, R), (3, R)],
        "vocab_size": [(0, R), (63, R), (65, R)],
    }, int32_same=("block_count", "context_length", "attention.head_count_kv"))
    cases += g.float_cases(p, "llama.rope.freq_base", [float("nan"), float("inf"), 0.0, -1.0, 1.0])
    cases += g.float_cases(p, "llama.attention.layer_norm_rms_epsilon", [float("nan"), 0.0, -1e-5, 2.0])
    cases += g.special_id_cases(p, 64, ["bos", "eos", "padding"])
    cases += [g.Case(f"{p}/kv/tokenizer.ggml.{k}_token_id={v}", g.kv_value(f"tokenizer.ggml.{k}_token_id", v), S)
              for k in ("bos", "eos") for v in (0, 63)]
    cases += [g.Case(f"{p}/kv/tokenizer.ggml.add_bos_token=1", g.kv_value("tokenizer.ggml.add_bos_token", 1), S)]
    cases += g.vocab_cases(p, 64)
    cases += [g.Case(f"{p}/kv/tokenizer.ggml.tokens[57]=tokens[56]",
                     g.array_text("tokenizer.ggml.tokens", 57, b"ab"), R, "repeats token 56")]
    for name, ty, kind in [("token_embd.weight", "f32", "matrix"), ("output_norm.weight", "f32", "vector"),
                           ("blk.0.attn_q.weight", "q4_0", "square"), ("blk.0.ffn_up.weight", "q4_1", "matrix"),
                           ("blk.1.attn_output.weight", "q8_0", "square"),
                           ("blk.1.ffn_down.weight", "f16", "matrix"), ("blk.1.ffn_norm.weight", "f32", "vector")]:
        cases += g.tensor_cases(p, name, ty, kind)
    cases += g.truncation_cases(p, _TINY_KEYS, list(_TINY_TENSORS))
    cases += g.nonfinite_cases(p, _TINY_TENSORS)
    cases += g.random_flip_cases(p, _TINY_KEYS, list(_TINY_TENSORS), n=30, seed=8)
    return cases


def _tiny_aligned_cases() -> list[g.Case]:
    """A tiny GGUF written with general.alignment = 64: the same model."""
    key = "general.alignment"
    p = "tiny-align64"
    return [g.Case(f"{p}/unmutated", lambda L: g.Edit(), g.SAME),
            g.Case(f"{p}/kv/{key}=32", g.kv_value(key, 32), g.EITHER),
            g.Case(f"{p}/kv/{key}=128", g.kv_value(key, 128), g.REFUSED),
            g.Case(f"{p}/kv/{key}=3", g.kv_value(key, 3), g.REFUSED, key),
            g.Case(f"{p}/kv/{key}=0", g.kv_value(key, 0), g.REFUSED, key),
            g.Case(f"{p}/kv/{key}/type=int32", g.kv_type(key, 5), g.REFUSED, key),
            g.Case(f"{p}/kv/{key}/type=uint64", g.kv_type(key, 10), g.REFUSED)]


@pytest.fixture(scope="module")
def tiny_gguf(tmp_path_factory):
    """(bytes, layout, reference logits) of the tiny GGUF, and of its 64-aligned twin."""
    out = {}
    root = tmp_path_factory.mktemp("fuzz-gguf")
    for label, kw in (("tiny", {}), ("tiny-align64", {"alignment": 64})):
        f = root / f"{label}.gguf"
        write_gguf(f, tokenizer=TINY_VOCAB, quantize=TINY_QUANT, **TINY, **kw)
        data = f.read_bytes()
        out[label] = (data, gguf_layout(data))
    return out, reference_logits(root / "tiny.gguf", TINY_IDS)


@pytest.mark.parametrize("case", params(_tiny_gguf_cases() + _tiny_aligned_cases(), quick_same=True))
def test_tiny_gguf(case, tiny_gguf, tmp_path):
    files, ref = tiny_gguf
    data, layout = files["tiny-align64" if case.id.startswith("tiny-align64/") else "tiny"]
    f = tmp_path / "mutated.gguf"
    f.write_bytes(g.apply_edit(data, case.make(layout)))
    try:
        loads_or_refuses(f, case, ref, TINY_IDS, f.name)
    finally:
        f.unlink()  # ~900 cases: keep pytest's kept temp directories small


# -- the default model (98 MB): the header, edited in place --------------------------

def _default_cases() -> list[g.Case]:
    R = g.REFUSED
    p = "smollm2"
    cases = g.header_cases(p) + g.count_cases(p, "llama", {
        "block_count": [(0, R), (29, R), (31, R), (2**31, R)],
        "context_length": [(0, R), (2**32 - 1, R)],
        "embedding_length": [(0, R), (575, R), (577, R)],
        "feed_forward_length": [(0, R), (1535, R)],
        "attention.head_count": [(0, R), (8, R), (10, R)],
        "attention.head_count_kv": [(0, R), (2, R), (9, R)],
        "vocab_size": [(0, R), (49151, R), (49153, R)],
        "rope.dimension_count": [(0, R), (32, R)],
    }, int32_same=("block_count",))
    cases += g.float_cases(p, "llama.rope.freq_base", [float("nan"), 0.0, -1.0])
    cases += g.float_cases(p, "llama.attention.layer_norm_rms_epsilon", [float("inf"), 0.0])
    cases += g.special_id_cases(p, 49152, ["bos", "eos", "unknown", "padding"])
    cases += g.vocab_cases(p, 49152)
    cases += [g.Case(f"{p}/kv/general.name=changed", g.kv_text("general.name", b"Fuzzed"), g.SAME),
              g.Case(f"{p}/kv/general.languages/element-type=array",
                     g.kv_element_type("general.languages", 9), R, "nested arrays")]
    for name, ty, kind in [("token_embd.weight", "q8_0", "matrix"), ("blk.0.attn_q.weight", "q4_1", "square"),
                           ("output_norm.weight", "f32", "vector")]:
        cases += g.tensor_cases(p, name, ty, kind)
    keys = ["general.architecture", "llama.block_count", "tokenizer.ggml.tokens", "tokenizer.ggml.merges",
            "tokenizer.chat_template"]
    cases += g.truncation_cases(p, keys, ["token_embd.weight", "blk.0.attn_q.weight", "output_norm.weight"])
    cases += g.nonfinite_cases(p, {"output_norm.weight": "f32", "blk.3.attn_norm.weight": "f32",
                                   "token_embd.weight": "q8_0", "blk.7.ffn_up.weight": "q4_1"})
    cases += g.random_flip_cases(p, keys + ["llama.embedding_length", "tokenizer.ggml.token_type"],
                                 ["token_embd.weight", "blk.0.attn_q.weight", "blk.12.ffn_down.weight",
                                  "output_norm.weight"], n=8, seed=5)
    return cases


@pytest.fixture(scope="module")
def default_copy(default_gguf, tmp_path_factory):
    """(working copy, its layout, reference logits); the copy is deleted afterwards."""
    work = tmp_path_factory.mktemp("fuzz-default") / "smollm2.gguf"
    shutil.copyfile(default_gguf, work)
    layout = gguf_layout(work.read_bytes())
    yield work, layout, reference_logits(work, DEFAULT_IDS)
    work.unlink()


def _edited(work: pathlib.Path, e: g.Edit, tmp_path: pathlib.Path):
    """The working copy with `e` applied, and a function that undoes it."""
    if e.truncate is not None:
        out = tmp_path / "smollm2-truncated.gguf"
        with open(work, "rb") as src, open(out, "wb") as dst:
            done = 0
            while done < e.truncate:  # in the kernel: no 98 MB through Python
                done += os.sendfile(dst.fileno(), src.fileno(), done, e.truncate - done)
        return out, out.unlink
    size = work.stat().st_size
    saved = []
    with open(work, "r+b") as f:
        for at, raw in e.patches:
            f.seek(at)
            saved.append((at, f.read(len(raw))))
            f.seek(at)
            f.write(raw)
        f.seek(0, os.SEEK_END)
        f.write(e.append)

    def undo() -> None:
        with open(work, "r+b") as f:
            for at, raw in reversed(saved):
                f.seek(at)
                f.write(raw)
            f.truncate(size)
    return work, undo


@pytest.mark.parametrize("case", params(_default_cases()))
def test_default_gguf(case, default_copy, tmp_path):
    work, layout, ref = default_copy
    path, undo = _edited(work, case.make(layout), tmp_path)
    try:
        loads_or_refuses(path, case, ref, DEFAULT_IDS, path.name)
    finally:
        undo()


# -- tiny Hugging Face directories -------------------------------------------------------

_LLAMA_TENSORS = [("model.embed_tokens.weight", (64, 128), "model.norm.weight"),
                  ("model.norm.weight", (128,), "model.layers.0.input_layernorm.weight"),
                  ("model.layers.0.self_attn.q_proj.weight", (128, 128), "model.layers.0.self_attn.o_proj.weight"),
                  ("model.layers.1.mlp.down_proj.weight", (128, 64), "model.layers.1.mlp.up_proj.weight"),
                  ("lm_head.weight", (64, 128), "model.embed_tokens.weight")]


def _hf_cases() -> list[st.DirCase]:
    cases = st.file_cases("hf-llama") + st.config_cases("hf-llama")
    for name, shape, other in _LLAMA_TENSORS:
        cases += st.tensor_cases("hf-llama", name, shape, other)
    return cases + st.gemma3_cases("hf-gemma3")


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """{label: (directory, reference logits)}: a llama in F16, a gemma3 in BF16."""
    out = {}
    root = tmp_path_factory.mktemp("fuzz-hf")
    llama = root / "hf-llama"
    write_hf_dir(llama, llama_config(**TINY_HF), dtype="F16")
    gemma = root / "hf-gemma3"
    write_hf_dir(gemma, gemma3_config(**{k: v for k, v in TINY_HF.items() if k in (
        "hidden_size", "num_attention_heads", "num_key_value_heads", "intermediate_size", "vocab_size")},
        head_dim=64, query_pre_attn_scalar=64, num_hidden_layers=7), dtype="BF16")
    for d in (llama, gemma):
        out[d.name] = (d, reference_logits(d, TINY_IDS))
    return out


@pytest.mark.parametrize("case", params(_hf_cases()))
def test_hf_dir(case, hf_dirs, tmp_path):
    base, ref = hf_dirs[case.id.split("/", 1)[0]]
    d = tmp_path / base.name
    shutil.copytree(base, d)
    try:
        case.mutate(d)
        loads_or_refuses(d, case, ref, TINY_IDS, base.name)
    finally:
        shutil.rmtree(d)


def test_enough_cases():
    """The issue asks for at least 200 mutated files (the quick form runs a subset)."""
    n = len(_tiny_gguf_cases()) + len(_tiny_aligned_cases()) + len(_default_cases()) + len(_hf_cases())
    assert n >= 200
    ids = [c.id for c in _tiny_gguf_cases() + _tiny_aligned_cases() + _default_cases() + _hf_cases()]
    assert len(set(ids)) == len(ids), "every case id says what was mutated, once"
