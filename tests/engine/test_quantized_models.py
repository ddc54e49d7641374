"""Models quantized by llama.cpp's own quantizer (tests/data/quantized, written by
tools/make_quantized_models.py): the K-quant, Q5 and Q6 blocks llama.cpp lays out,
read in-kernel, against a float64 numpy forward of gguf-py's dequantization of the
same file. Plus BF16 matrices (gguf-py writes them as llama.cpp does), the
loader's message for a row that is not a whole number of super-blocks, and the
warning for a type the kernels do not read."""
from __future__ import annotations

import hashlib
import json
import pathlib
import struct
import warnings

import gguf
import numpy as np
import pytest

import metalkv
from metalkv.models import ModelLoadError, load_model
from devices import TEST_DEVICE  # tests/ is on sys.path
from models.tiny import gguf_layout, write_gguf

from .reference import llama_logits

DATA = pathlib.Path(__file__).resolve().parents[1] / "data" / "quantized"
RECORD = json.loads((DATA / "models.json").read_text(encoding="utf-8"))
FILES = sorted(RECORD["files"])
SIZES = {k: RECORD["source"][k] for k in ("n_layers", "hidden", "n_heads", "n_kv_heads", "head_dim", "ffn",
                                          "vocab")}
IDS = [1, 5, 9, 63, 0, 17, 17, 2, 40, 33]


def load_quietly(path, **kw) -> metalkv.Engine:
    """Engine.load, failing on any warning (a type dequantized at load warns)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        return metalkv.Engine.load(path, device=TEST_DEVICE, context=32, progress=False, **kw)


def check_logits(got: np.ndarray, ref: np.ndarray) -> None:
    # random weights of std ~1 give logits of ~1e2; float32 sums and the f16 K/V
    # cache keep ~1e-3 of that (as tests/engine/test_engine_errors.py's tiny model)
    np.testing.assert_allclose(got, ref, rtol=0, atol=2e-3 * np.abs(ref).max())


def test_record_matches_the_files():
    """The committed files are the ones models.json describes (re-run the tool to change them)."""
    assert RECORD["llama_cpp_python"] and RECORD["command"]
    for name, info in RECORD["files"].items():
        data = (DATA / name).read_bytes()
        assert len(data) == info["bytes"] and hashlib.sha256(data).hexdigest() == info["sha256"], name


def test_files_hold_the_new_formats():
    """Between them the files hold every format of issue 11 that llama.cpp writes."""
    held = {t for info in RECORD["files"].values() for t in info["tensor_types"]}
    assert {"q4_k", "q5_k", "q6_k", "q5_0", "q5_1"} <= held, held


@pytest.mark.parametrize("name", FILES)
@pytest.mark.parametrize("prefill_chunk", [128, 1])  # gemm prefill; 1: every token a gemv decode step
def test_llamacpp_quantized_model_matches_reference(name, prefill_chunk):
    path = DATA / name
    m = load_model(path, progress=False)
    assert {n: t.dtype for n, t in m.tensors.items()} == RECORD["files"][name]["tensors"]
    eng = load_quietly(path, prefill_chunk=prefill_chunk)  # no warning: every type read in-kernel
    check_logits(eng.logits(IDS), llama_logits(m, IDS))


def test_bf16_matrices_are_read_in_kernel(tmp_path):
    """BF16 matrices stay bf16 on the device (2 bytes a weight), not inflated to f32."""
    f = tmp_path / "bf16.gguf"
    bf16 = gguf.GGMLQuantizationType.BF16
    names = ["token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.attn_v.weight",
             "blk.0.attn_output.weight", "blk.0.ffn_gate.weight", "blk.0.ffn_up.weight", "blk.0.ffn_down.weight"]
    write_gguf(f, **SIZES, quantize={n: bf16 for n in names})
    m = load_model(f, progress=False)
    matrices = sum(int(np.prod(t.shape)) for t in m.tensors.values() if len(t.shape) == 2)
    norms = sum(int(np.prod(t.shape)) for t in m.tensors.values() if len(t.shape) == 1)
    for chunk in (128, 1):
        eng = load_quietly(f, prefill_chunk=chunk)
        assert eng.weights_nbytes == 2 * matrices + 4 * norms
        check_logits(eng.logits(IDS), llama_logits(m, IDS))


def test_row_not_a_whole_number_of_super_blocks_names_the_tensor(tmp_path):
    """A Q4_K tensor whose rows are not multiples of 256 is refused by the loader,
    naming the tensor, before any kernel sees it (ggml requires whole blocks)."""
    src = DATA / "tiny_q4_k_m.gguf"
    data = bytearray(src.read_bytes())
    t = gguf_layout(bytes(data)).tensors["blk.0.attn_q.weight"]
    assert t.ggml_type == gguf.GGMLQuantizationType.Q4_K and t.ne[0] == 256
    struct.pack_into("<QQ", data, t.dims_at, 128, t.ne[1] * 2)  # same element count, half-block rows
    f = tmp_path / "bad.gguf"
    f.write_bytes(bytes(data))
    with pytest.raises(ModelLoadError, match=r"blk\.0\.attn_q\.weight.* is q4_k with ne\[0\]=128, not a "
                                             r"multiple of its block size 256"):
        metalkv.Engine.load(f, device=TEST_DEVICE)


def test_types_not_read_in_kernel_warn_with_their_memory_cost(tmp_path):
    """TQ2_0 (gguf-py quantizes it; the kernels do not read it) is dequantized to
    f16 at load, with a warning that names it and says what it costs."""
    f = tmp_path / "tq2.gguf"
    write_gguf(f, **SIZES, quantize={"blk.0.ffn_up.weight": gguf.GGMLQuantizationType.TQ2_0})
    stored = 256 * 256 // 256 * 66  # one (256, 256) matrix of 66-byte blocks
    with pytest.warns(UserWarning, match=r"the tq2_0 matrices of tq2\.gguf are dequantized to f16 "
                                         r"at load: 0\.02 MiB in the file take 0\.12 MiB on the device "
                                         rf"\({2 * 256 * 256 / stored:.1f}x\)"):
        eng = metalkv.Engine.load(f, device=TEST_DEVICE, context=32, progress=False)
    m = load_model(f, progress=False)
    ref = llama_logits(m, IDS)
    # the dequantized weights are rounded to f16 (2^-11 relative) on top of the usual error
    np.testing.assert_allclose(eng.logits(IDS), ref, rtol=0, atol=4e-3 * np.abs(ref).max())


def test_greedy_generation_on_a_llamacpp_q4_k_m_file():
    """Greedy decoding (gemv and gemv_swiglu on Q4_K/Q6_K) picks the reference's
    argmax at every step, except where the reference's top two are closer than
    the logits' tolerance (then either is right)."""
    path = DATA / "tiny_q4_k_m.gguf"
    eng, m = load_quietly(path), load_model(path, progress=False)
    prompt = [1, 5, 9]
    ids = eng.generate_ids(prompt, max_tokens=12, stop_ids=())
    assert len(ids) == 12
    for i, tok in enumerate(ids):
        ref = llama_logits(m, prompt + ids[:i])[-1]
        top = np.sort(ref)[::-1]
        if top[0] - top[1] > 4e-3 * np.abs(ref).max():
            assert tok == int(np.argmax(ref)), f"step {i}"


def test_cli_generate_on_the_q4_k_m_file(capsys):
    """`metalkv generate --model` on a llama.cpp Q4_K_M file, with its tokenizer."""
    from metalkv.cli import main

    rc = main(["generate", "abc", "--model", str(DATA / "tiny_q4_k_m.gguf"), "--no-chat", "--max-tokens", "8",
               "--device", TEST_DEVICE])
    out = capsys.readouterr()
    assert rc in (0, None), out.err
    assert out.out.strip(), out.err  # some text from TINY_VOCAB's letters
    assert set(out.out.strip()) <= set("abcdefghijklmnopqrstuvwxyz \n"), out.out
