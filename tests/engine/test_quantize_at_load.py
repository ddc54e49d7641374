"""Engine.load(quantize='q8_0' | 'q4_0'): float matrices quantized at load
(model_spec.device_tensor -> ops.quantize). The logits are those of the same
model quantized by gguf-py and written as a GGUF file (exactly: the same bytes
reach the same kernels), whichever float type the source holds; Q4_0 stays near
the float model; what is left unquantized is said once."""
from __future__ import annotations

import json
import warnings

import gguf
import numpy as np
import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path
from models.tiny import TINY_HF, llama_config, write_gguf, write_hf_dir, write_safetensors

TINY = dict(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=96, vocab=64, n_layers=2)
IDS = [int(i) for i in np.random.default_rng(0).integers(0, 64, 40)]
MATRICES = ["token_embd.weight"] + [  # write_gguf ties the output to the embedding
    f"blk.{i}.{k}.weight" for i in range(TINY["n_layers"])
    for k in ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")]
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}


def load(path, **kw) -> metalkv.Engine:
    return metalkv.Engine.load(path, device=TEST_DEVICE, context=64, progress=False, **kw)


def load_quietly(path, **kw) -> metalkv.Engine:
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # every matrix quantizable: nothing to warn about
        return load(path, **kw)


def scaled_f16_gguf(path, seed=0, **sizes) -> None:
    """A tiny llama GGUF of f16 matrices scaled by 1/sqrt(row length), as trained
    models are (std-1 weights make a random model chaotic: any rounding flips it)."""
    arrays = write_gguf(path, seed=seed, **sizes)
    raw = {n: (a / np.sqrt(a.shape[1]) if a.ndim == 2 and n != "token_embd.weight" else a).astype(np.float16)
           for n, a in arrays.items()}
    write_gguf(path, seed=seed, raw_arrays=raw, **sizes)


@pytest.mark.parametrize("wtype", ["q8_0", "q4_0"])
def test_logits_equal_a_file_quantized_by_gguf_py(tmp_path, wtype):
    qtype = gguf.GGMLQuantizationType[wtype.upper()]
    write_gguf(tmp_path / "f32.gguf", **TINY)
    write_gguf(tmp_path / "ref.gguf", quantize={n: qtype for n in MATRICES}, **TINY)
    got, ref = load_quietly(tmp_path / "f32.gguf", quantize=wtype), load_quietly(tmp_path / "ref.gguf")
    np.testing.assert_array_equal(got.logits(IDS), ref.logits(IDS))
    # norms stay f32 (4 bytes a value); every matrix is whole blocks of 32
    shapes = metalkv.models.expected_shapes(got.config)
    row = lambda cols: -(-cols // 32 * BLOCK_BYTES[wtype] // 16) * 16  # noqa: E731  (rows packed, padded to 16)
    want = sum(int(np.prod(s)) * 4 if n not in MATRICES else s[0] * row(s[1]) for n, s in shapes.items())
    assert got.weights_nbytes == ref.weights_nbytes == want
    assert {n: t.dtype for n, t in got.weight_tensors.items() if n in MATRICES} == dict.fromkeys(MATRICES, wtype)
    assert {t.dtype for n, t in got.weight_tensors.items() if n not in MATRICES} == {"f32"}
    assert sum(t.nbytes for t in got.weight_tensors.values()) == want


@pytest.mark.parametrize("source", ["F16", "BF16"])
def test_f16_and_bf16_sources_quantize_their_values(tmp_path, source):
    """A safetensors directory in f16 or bf16 (tied embeddings: the quantized table is
    also the output matrix) gives the logits of an f32 directory holding the same
    values, quantized the same way. The bf16 matrices are scaled to ~1e-5, below f16's
    normal range: a detour through f16 would round them."""
    config = llama_config(**TINY_HF, tie_word_embeddings=True)
    arrays = write_hf_dir(tmp_path / "src", config, dtype=source)
    if source == "BF16":
        arrays = {n: a * np.float32(2.0**-17) if a.ndim == 2 else a for n, a in arrays.items()}
        write_safetensors(tmp_path / "src" / "model-00001-of-00001.safetensors", arrays, "BF16")
        # write_safetensors truncates to bf16: the values the file holds
        values = {n: ((a.view(np.uint32) >> 16) << 16).view(np.float32) for n, a in arrays.items()}
    else:
        values = {n: a.astype(np.float16).astype(np.float32) for n, a in arrays.items()}
    (tmp_path / "f32").mkdir()
    (tmp_path / "f32" / "config.json").write_text(json.dumps(config))
    write_safetensors(tmp_path / "f32" / "model-00001-of-00001.safetensors", values, "F32")
    got, ref = load_quietly(tmp_path / "src", quantize="q8_0"), load_quietly(tmp_path / "f32", quantize="q8_0")
    np.testing.assert_array_equal(got.logits(IDS), ref.logits(IDS))
    assert got.weights_nbytes == ref.weights_nbytes


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_quantized_logits_stay_near_the_float_model(tmp_path, seed):
    """Measured on seeds 0-5 of this model: relative rms error of the logits 1.2-1.4 %
    for Q8_0, 17-23 % for Q4_0 (whose step is 127/8 times coarser: the ratio holds);
    top-1 agreement over 40 positions >= 0.975 and 0.60-0.78 (random logits have small
    top-2 gaps). The bounds leave a margin for other devices' float sums."""
    f = tmp_path / "f16.gguf"
    scaled_f16_gguf(f, seed=seed, **TINY)
    base = load_quietly(f)
    ref = base.logits(IDS)
    for wtype, rel_bound, top1_bound in (("q8_0", 0.03, 0.9), ("q4_0", 0.35, 0.45)):
        eng = load_quietly(f, quantize=wtype)
        got = eng.logits(IDS)
        assert np.linalg.norm(got - ref) / np.linalg.norm(ref) < rel_bound, wtype
        assert (got.argmax(1) == ref.argmax(1)).mean() >= top1_bound, wtype
        # matrices: 2 bytes a weight -> 34 or 18 bytes a block of 32, rows padded to 16; the norms stay
        row = lambda cols: -(-cols // 32 * BLOCK_BYTES[wtype] // 16) * 16  # noqa: E731
        shapes = metalkv.models.expected_shapes(eng.config).values()
        assert eng.weights_nbytes == sum(4 * int(np.prod(s)) if len(s) == 1 else s[0] * row(s[1]) for s in shapes)
        assert base.weights_nbytes == sum((4 if len(s) == 1 else 2) * int(np.prod(s)) for s in shapes)


def test_what_is_left_is_said_once(tmp_path):
    """ffn_down rows of 80 values are not whole blocks: they stay f32; a Q4_1 matrix
    stays Q4_1; the 1-D norms are not matrices and are not counted."""
    sizes = dict(TINY, ffn=80)
    f = tmp_path / "mixed.gguf"
    write_gguf(f, quantize={"blk.0.attn_q.weight": gguf.GGMLQuantizationType.Q4_1}, **sizes)
    with pytest.warns(UserWarning) as record:
        eng = load(f, quantize="q8_0")
    msgs = [str(w.message) for w in record]
    assert len(msgs) == 1, msgs
    assert msgs[0] == ("quantize='q8_0': 3 of the 15 matrices of mixed.gguf are not quantized to q8_0: "
                       "1 already quantized (q4_1) stay in their own type; 2 whose rows are not a multiple "
                       "of 32 values (ffn_down.weight: 80 columns) stay f32")
    assert np.isfinite(eng.logits(IDS)).all()
