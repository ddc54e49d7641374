"""GGUF tensors: canonical names, logical shapes, raw (still quantized) bytes, and
clear errors for files that are incomplete or wrong."""
from __future__ import annotations

import collections

import gguf
import numpy as np
import pytest

from metalkv.models import ModelLoadError, expected_shapes, load_model
from metalkv.models.gguf_loader import load_gguf
from metalkv.models.tensor import bf16_to_f32

from .tiny import write_gguf


def test_smollm2_tensors(smollm):
    t = smollm.tensors
    assert set(t) == set(expected_shapes(smollm.config))  # nothing missing, nothing extra
    assert len(t) == 272 and "output.weight" not in t      # tied: the embedding is the output
    kinds = collections.Counter(x.dtype for x in t.values())
    assert kinds == {"q4_1": 210, "f32": 61, "q8_0": 1}
    emb = t["token_embd.weight"]
    assert (emb.shape, emb.dtype, emb.data.shape, emb.data.dtype) == ((49152, 576), "q8_0", (49152, 612), np.uint8)
    q = t["blk.0.attn_q.weight"]  # 576 inputs = 18 Q4_1 blocks of 20 bytes per row
    assert (q.shape, q.data.shape) == ((576, 576), (576, 360))
    assert t["blk.29.ffn_down.weight"].shape == (576, 1536)
    norm = t["output_norm.weight"]
    assert (norm.shape, norm.dtype, norm.data.dtype) == ((576,), "f32", np.float32)
    assert not q.data.flags.writeable  # a view of the read-only memory map, not a copy


def test_q4_1_bytes_are_gguf_blocks(smollm):
    """The engine decodes the raw bytes itself; pin the layout it will rely on:
    per row, blocks of 32 weights = f16 scale d, f16 min m, 16 bytes of nibbles
    (low nibbles are weights 0..15, high nibbles 16..31); w = d * q + m."""
    t = smollm.tensors["blk.0.attn_k.weight"]
    row = t.data[5]
    ours = []
    for b in range(t.shape[1] // 32):
        blk = row[b * 20:(b + 1) * 20]
        d, m = blk[:4].view(np.float16).astype(np.float64)
        qs = blk[4:]
        ours += [d * q + m for q in np.concatenate([qs & 0xF, qs >> 4])]
    ref = gguf.quants.dequantize(t.data, gguf.GGMLQuantizationType.Q4_1)[5]
    np.testing.assert_allclose(ours, ref, rtol=1e-6, atol=1e-7)


def test_q8_0_embedding_bytes(smollm):
    t = smollm.tensors["token_embd.weight"]
    row = t.data[1000]  # 18 blocks: f16 scale + 32 int8
    ours = np.concatenate([row[b * 34:b * 34 + 2].view(np.float16).astype(np.float64)
                           * row[b * 34 + 2:(b + 1) * 34].view(np.int8) for b in range(18)])
    ref = gguf.quants.dequantize(t.data[1000:1001], gguf.GGMLQuantizationType.Q8_0)[0]
    np.testing.assert_allclose(ours, ref, rtol=1e-6)


def test_tiny_gguf_values_round_trip(tmp_path):
    f = tmp_path / "tiny.gguf"
    arrays = write_gguf(f, quantize={"blk.1.ffn_up.weight": gguf.GGMLQuantizationType.Q8_0})
    m = load_model(f)
    assert m.tokenizer is None and m.chat_template.is_fallback
    c = m.config
    assert (c.n_layers, c.hidden, c.n_heads, c.n_kv_heads, c.head_dim, c.ffn_hidden, c.vocab) == \
        (2, 32, 4, 2, 8, 48, 64)
    for name, a in arrays.items():
        if name == "blk.1.ffn_up.weight":
            continue
        t = m.tensors[name]
        assert t.dtype == "f32" and t.shape == a.shape
        np.testing.assert_array_equal(t.data, a)
    up = m.tensors["blk.1.ffn_up.weight"]
    assert (up.dtype, up.shape, up.data.shape) == ("q8_0", (48, 32), (48, 34))
    np.testing.assert_array_equal(up.data, gguf.quants.quantize(arrays["blk.1.ffn_up.weight"],
                                                                gguf.GGMLQuantizationType.Q8_0))


def test_phi3_fused_quantized_tensors_split_into_block_rows(tmp_path):
    """llama.cpp's phi3 layout: attn_qkv (q + k + v rows) and ffn_up holding gate then up
    (2 ffn rows). Each part is a row range of the raw blocks (a Q8_0 row here is one
    34-byte block), a view of the memory map."""
    f = tmp_path / "phi3.gguf"
    q8 = gguf.GGMLQuantizationType.Q8_0
    per = [f"blk.{i}.{n}.weight" for i in range(2) for n in ("attn_q", "attn_k", "attn_v", "ffn_gate")]
    arrays = write_gguf(f, arch="phi3", omit=tuple(per),
                        extra_shapes={f"blk.{i}.attn_qkv.weight": (64, 32) for i in range(2)},
                        reshape={f"blk.{i}.ffn_up.weight": (96, 32) for i in range(2)},
                        quantize={n: q8 for i in range(2) for n in (f"blk.{i}.attn_qkv.weight",
                                                                    f"blk.{i}.ffn_up.weight")})
    cfg, tensors, _ = load_gguf(f)
    assert cfg.arch == "phi3" and not any("qkv" in n or "gate_up" in n for n in tensors)
    qkv = gguf.quants.quantize(arrays["blk.1.attn_qkv.weight"], q8)
    up = gguf.quants.quantize(arrays["blk.1.ffn_up.weight"], q8)
    for name, rows, whole in [("attn_q", slice(0, 32), qkv), ("attn_k", slice(32, 48), qkv),
                              ("attn_v", slice(48, 64), qkv), ("ffn_gate", slice(0, 48), up),
                              ("ffn_up", slice(48, 96), up)]:
        t = tensors[f"blk.1.{name}.weight"]
        assert t.dtype == "q8_0" and t.shape == (rows.stop - rows.start, 32)
        np.testing.assert_array_equal(t.data, whole[rows], err_msg=name)
        assert not t.data.flags.owndata
    write_gguf(tmp_path / "bad.gguf", arch="phi3", omit=tuple(per),
               extra_shapes={f"blk.{i}.attn_qkv.weight": (64, 32) for i in range(2)},
               reshape={"blk.0.ffn_up.weight": (90, 32), "blk.1.ffn_up.weight": (96, 32)})
    with pytest.raises(ModelLoadError, match=r"fused tensor blk\.0\.ffn_gate_up\.weight \(in the file: "
                                             r"blk\.0\.ffn_up\.weight\) has shape \(90, 32\), expected \(96, 32\)"):
        load_gguf(tmp_path / "bad.gguf")


def test_missing_tensor(tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(f, omit=("blk.1.attn_v.weight",))
    with pytest.raises(ModelLoadError, match=r"m.gguf: missing tensor\(s\) blk.1.attn_v.weight for a llama"):
        load_gguf(f)


def test_misshapen_tensor(tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(f, reshape={"blk.0.ffn_down.weight": (32, 40)})
    with pytest.raises(ModelLoadError, match=r"blk.0.ffn_down.weight has shape \(32, 40\), expected \(32, 48\)"):
        load_gguf(f)


@pytest.mark.parametrize("keep", [0.999, 0.5, 0.01])
def test_truncated_file(tmp_path, keep):
    f = tmp_path / "m.gguf"
    write_gguf(f)
    data = f.read_bytes()
    f.write_bytes(data[:int(len(data) * keep)])
    with pytest.raises(ModelLoadError, match=r"m.gguf: .*truncated"):
        load_gguf(f)


def test_corrupt_magic(tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(f)
    f.write_bytes(b"GGUX" + f.read_bytes()[4:])
    with pytest.raises(ModelLoadError, match=r"not a readable GGUF file"):
        load_gguf(f)
    with pytest.raises(ModelLoadError, match=r"not a GGUF file"):
        load_model(f)


def test_unsupported_architecture(tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(f, arch="gptneox")
    with pytest.raises(ModelLoadError, match=r"architecture 'gptneox' is not supported; metalkv supports llama, qwen3, phi3, gemma2, gemma3"):
        load_gguf(f)


def test_bf16_tensors_are_bit_patterns_of_the_logical_shape(tmp_path):
    f = tmp_path / "m.gguf"
    q = gguf.GGMLQuantizationType
    arrays = write_gguf(f, quantize={"blk.0.ffn_gate.weight": q.BF16, "output_norm.weight": q.BF16})
    t = load_model(f).tensors
    for name in ("blk.0.ffn_gate.weight", "output_norm.weight"):
        got = t[name]
        assert (got.dtype, got.shape, got.data.dtype, got.data.shape) == ("bf16", arrays[name].shape, np.uint16,
                                                                          arrays[name].shape)
        want = gguf.quants.dequantize(gguf.quants.quantize(arrays[name], q.BF16), q.BF16)
        np.testing.assert_array_equal(bf16_to_f32(got.data), want)


def test_tokenizer_and_template_errors_name_the_file(tmp_path):
    """The tokenizer and the chat template are built from the file too: what is
    wrong in them is a ModelLoadError that names it."""
    from gguf import GGUFValueType

    from .tiny import TINY_VOCAB

    f = tmp_path / "bert.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, set_kv={"tokenizer.ggml.model": ("bert", GGUFValueType.STRING)})
    with pytest.raises(ModelLoadError, match=r"bert.gguf: \[tokenizer\] GGUF tokenizer model 'bert'"):
        load_model(f)
    f = tmp_path / "template.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, set_kv={"tokenizer.chat_template": ("{% for m in messages %}",
                                                                            GGUFValueType.STRING)})
    with pytest.raises(ModelLoadError, match=r"template.gguf: \[chat\] template does not parse"):
        load_model(f)
