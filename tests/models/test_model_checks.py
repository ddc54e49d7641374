"""Each check a model file goes through before any byte is used, with one
malformed file each: the ModelLoadError names the file and the key or tensor,
what was found and what was expected. GGUF files are written with gguf-py and
then edited byte by byte where gguf-py would refuse to write the fault."""
from __future__ import annotations

import json
import pathlib
import struct

import gguf
import numpy as np
import pytest

from metalkv.models import ModelLoadError, load_model
from metalkv.models.finite import _BLOCK_SCALES
from metalkv.models.gguf_loader import config_from_gguf
from metalkv.models.tensor import MATRIX_DTYPES

from .tiny import (TINY_HF, TINY_VOCAB, gguf_layout, llama_config, safetensors_parts, write_gguf,
                   write_hf_dir, write_safetensors_parts)

# head_dim 64 (hidden 128 / 2 heads), as tests/engine uses
TINY = dict(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
V = gguf.GGUFValueType
Q = gguf.GGMLQuantizationType


def tiny_gguf(tmp_path: pathlib.Path, **kw) -> pathlib.Path:
    f = tmp_path / "m.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, **{**TINY, **kw})
    return f


def edit(f: pathlib.Path, *edits: tuple[int, str, object]) -> pathlib.Path:
    """Overwrite fields in place: (byte offset, struct format, value)."""
    data = bytearray(f.read_bytes())
    for at, fmt, value in edits:
        struct.pack_into(fmt, data, at, value)
    f.write_bytes(bytes(data))
    return f


def layout(f: pathlib.Path):
    return gguf_layout(f.read_bytes())


def refused(path: pathlib.Path, match: str) -> str:
    with pytest.raises(ModelLoadError, match=match) as e:
        load_model(path, progress=False)
    assert path.name in str(e.value), "the message names the file"
    return str(e.value)


# -- GGUF structure (gguf_file.py) ---------------------------------------------------

def test_tiny_gguf_with_tokenizer_loads(tmp_path):
    m = load_model(tiny_gguf(tmp_path))
    assert m.config.vocab == 64 and m.config.bos_id == 1 and m.config.eos_ids == (0, 2)
    assert m.tokenizer.encode("ab <|im_end|>") == [56, 29, 2]


def test_unknown_tensor_type(tmp_path):
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).tensors["blk.0.attn_k.weight"].type_at, "<I", 99))
    refused(f, r"tensor blk.0.attn_k.weight has ggml type 99, which is not a known type")


def test_tensor_larger_than_its_slot_overlaps_the_next(tmp_path):
    f = tiny_gguf(tmp_path)
    t = layout(f).tensors["blk.0.attn_q.weight"]
    edit(f, (t.dims_at + 8, "<Q", t.ne[1] + 1))  # one more row
    refused(f, r"tensor blk.0.attn_k.weight has data offset \d+ and overlaps the data of "
               r"blk.0.attn_q.weight; expected offset")


def test_tensor_past_the_end_of_the_file(tmp_path):
    f = tiny_gguf(tmp_path)
    last = list(layout(f).tensors.values())[-1]
    edit(f, (last.dims_at, "<Q", last.ne[0] * 64))
    refused(f, rf"tensor {last.name} ends at byte \d+ but the file has \d+ bytes: the file is truncated")


def test_misaligned_offset(tmp_path):
    f = tiny_gguf(tmp_path)
    t = layout(f).tensors["output_norm.weight"]
    edit(f, (t.offset_at, "<Q", t.offset + 4))
    refused(f, r"tensor output_norm.weight has data offset \d+, not a multiple of the alignment 32")


def test_two_tensors_at_one_offset(tmp_path):
    f = tiny_gguf(tmp_path)
    L = layout(f)
    edit(f, (L.tensors["blk.0.attn_v.weight"].offset_at, "<Q", L.tensors["blk.0.attn_k.weight"].offset))
    refused(f, r"tensor blk.0.attn_v.weight .* overlaps the data of blk.0.attn_k.weight")


def test_gap_between_tensors(tmp_path):
    f = tiny_gguf(tmp_path)
    t = layout(f).tensors["blk.1.ffn_up.weight"]
    edit(f, (t.offset_at, "<Q", t.offset + 64))
    refused(f, r"tensor blk.1.ffn_up.weight .* leaves 64 unused bytes after blk.1.ffn_gate.weight")


def test_declared_type_changed_to_a_smaller_one(tmp_path):
    """f32 -> f16 halves the size: the next tensor no longer starts where it should."""
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).tensors["blk.0.attn_norm.weight"].type_at, "<I", int(Q.F16)))
    refused(f, r"tensor blk.0.attn_q.weight .* leaves 256 unused bytes after blk.0.attn_norm.weight")


def test_last_tensor_type_changed_leaves_trailing_bytes(tmp_path):
    f = tiny_gguf(tmp_path)
    last = list(layout(f).tensors.values())[-1]
    edit(f, (last.type_at, "<I", int(Q.F16)))
    refused(f, rf"goes on \d+ bytes past the data of the last tensor \({last.name}\)")


def test_trailing_garbage(tmp_path):
    f = tiny_gguf(tmp_path)
    f.write_bytes(f.read_bytes() + b"\0" * 64)
    refused(f, r"the file goes on 64 bytes past the data of the last tensor")


def test_block_size(tmp_path):
    f = tiny_gguf(tmp_path, quantize={"blk.0.ffn_up.weight": Q.Q8_0})
    t = layout(f).tensors["blk.0.ffn_up.weight"]
    edit(f, (t.dims_at, "<Q", 48), (t.dims_at + 8, "<Q", t.ne[1] * 128 // 48))
    refused(f, r"tensor blk.0.ffn_up.weight is q8_0 with ne\[0\]=48, not a multiple of its block size 32")


@pytest.mark.parametrize("n_dims", [0, 5])
def test_number_of_dimensions(tmp_path, n_dims):
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).tensors["output_norm.weight"].ndims_at, "<I", n_dims))
    refused(f, rf"tensor output_norm.weight \(info at byte \d+\) has {n_dims} dimensions; expected 1..4")


def test_zero_dimension(tmp_path):
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).tensors["output_norm.weight"].dims_at, "<Q", 0))
    refused(f, r"tensor output_norm.weight has dimensions \[0\]; expected every one >= 1")


def test_duplicate_tensor_name(tmp_path):
    f = tiny_gguf(tmp_path)
    t = layout(f).tensors["blk.0.attn_k.weight"]
    data = bytearray(f.read_bytes())
    at = t.start + 8 + data[t.start + 8:t.ndims_at].index(b"attn_k")
    data[at:at + 6] = b"attn_q"
    f.write_bytes(bytes(data))
    refused(f, r"tensor blk.0.attn_q.weight appears twice")


@pytest.mark.parametrize("version, match", [
    (1, r"version 1; expected one of \(2, 3\)"),
    (3 << 24, r"version 50331648 \(it looks big-endian, which metalkv does not read\)"),
])
def test_version(tmp_path, version, match):
    refused(edit(tiny_gguf(tmp_path), (4, "<I", version)), match)


@pytest.mark.parametrize("at, field", [(8, "tensor_count"), (16, "kv_count")])
def test_huge_counts_are_refused_before_use(tmp_path, at, field):
    refused(edit(tiny_gguf(tmp_path), (at, "<Q", 1 << 60)),
            rf"{field} at byte {at} is {1 << 60}, which needs at least \d+ more bytes, but only \d+ "
            rf"are left: the file is corrupt or truncated")


def test_huge_array_length(tmp_path):
    """gguf-py's reader would loop 2**60 times here."""
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).kv["tokenizer.ggml.tokens"].value_at + 4, "<Q", 1 << 60))
    refused(f, r"the length of array 'tokenizer.ggml.tokens' at byte \d+ is 1152921504606846976")


def test_huge_string_length(tmp_path):
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).kv["tokenizer.ggml.pre"].value_at, "<Q", 1 << 62))
    refused(f, r"the length of the value of 'tokenizer.ggml.pre' at byte \d+ is")


def test_truncated_inside_metadata(tmp_path):
    f = tiny_gguf(tmp_path)
    f.write_bytes(f.read_bytes()[:layout(f).kv["llama.rope.freq_base"].value_at + 2])
    refused(f, r"the value of 'llama.rope.freq_base' at byte \d+ needs 4 bytes but only 2 are left: "
               r"the file is truncated")


def test_key_not_utf8(tmp_path):
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).kv["llama.block_count"].start + 8, "<B", 0xFF))
    refused(f, r"the key of metadata entry 1 at byte \d+ is not valid UTF-8")


def test_duplicate_key(tmp_path):
    f = tiny_gguf(tmp_path)
    at = layout(f).kv["llama.rope.freq_base"].start + 8
    data = bytearray(f.read_bytes())
    data[at:at + 20] = b"llama.context_length"  # the same length
    f.write_bytes(bytes(data))
    refused(f, r"metadata key 'llama.context_length' appears twice")


def test_unknown_value_type(tmp_path):
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).kv["llama.block_count"].type_at, "<I", 13))
    refused(f, r"metadata 'llama.block_count' at byte \d+ has value type 13; expected 0..12")


def test_nested_array(tmp_path):
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).kv["tokenizer.ggml.merges"].value_at, "<I", 9))
    refused(f,
            r"array 'tokenizer.ggml.merges' at byte \d+ has element type 9 \(nested arrays are not supported\)")


def test_bool_byte(tmp_path):
    f = tiny_gguf(tmp_path)
    edit(f, (layout(f).kv["tokenizer.ggml.add_bos_token"].value_at, "<B", 2))
    refused(f, r"bool metadata 'tokenizer.ggml.add_bos_token' holds byte 2, expected 0 or 1")


@pytest.mark.parametrize("value, vtype", [(3, V.UINT32), (0, V.UINT32), (64, V.UINT64)])
def test_alignment(tmp_path, value, vtype):
    f = tiny_gguf(tmp_path, set_kv={"general.alignment": (value, vtype)})
    refused(f, rf"general.alignment is {vtype.name.lower()} {value}; expected a uint32 power of two")


def test_other_alignment_loads(tmp_path):
    m = load_model(tiny_gguf(tmp_path, alignment=64))
    assert m.tensors["output_norm.weight"].shape == (128,)


# -- GGUF metadata (gguf_loader.py, values.py) ------------------------------------------

@pytest.mark.parametrize("key, value, match", [
    ("llama.block_count", ("2", V.STRING),
     r"llama.block_count is a string '2'; expected an integer in \[1, 1024\]"),
    ("llama.block_count", (2.0, V.FLOAT32), r"llama.block_count is a float 2.0; expected an integer"),
    ("llama.block_count", (True, V.BOOL), r"llama.block_count is a bool True; expected an integer"),
    ("llama.block_count", (1 << 40, V.UINT64),
     r"llama.block_count is an int 1099511627776; expected an integer in \[1, 1024\]"),
    ("llama.attention.head_count", (0, V.UINT32),
     r"llama.attention.head_count is an int 0; expected an integer in \[1, 4096\]"),
    ("llama.attention.head_count", ([2, 2, 2], V.ARRAY, V.UINT32),
     r"llama.attention.head_count is a per-layer list \[2, 2, 2\] of 3 values; metalkv needs one "
     r"value for all 2 layers"),
    ("llama.attention.head_count_kv", (-1, V.INT32), r"llama.attention.head_count_kv is an int -1"),
    ("llama.attention.head_count", (3, V.UINT32),
     r"llama.embedding_length 128 is not a multiple of llama.attention.head_count 3"),
    ("llama.attention.value_length", (32, V.UINT32),
     r"llama.attention.value_length 32 differs from the key length 64"),
    ("llama.context_length", (0, V.UINT32), r"llama.context_length is an int 0; expected an integer in \[1, "),
    ("llama.embedding_length", ([128], V.ARRAY, V.UINT32),
     r"llama.embedding_length is a list \[128\]; expected an integer"),
    ("llama.attention.layer_norm_rms_epsilon", (float("nan"), V.FLOAT32),
     r"llama.attention.layer_norm_rms_epsilon is a float nan; expected a finite number in \(0.0, 1.0\]"),
    ("llama.attention.layer_norm_rms_epsilon", (0.0, V.FLOAT32), r"layer_norm_rms_epsilon is a float 0.0"),
    ("llama.rope.freq_base", (0.0, V.FLOAT32),
     r"llama.rope.freq_base is a float 0.0; expected a finite number > 1.0"),
    ("llama.rope.scaling.factor", (float("inf"), V.FLOAT32), r"llama.rope.scaling.factor is a float inf"),
    ("llama.rope.scaling.type", ("linear", V.STRING),
     r"rope.scaling.type is 'linear' but no llama.rope.scaling.factor > 0"),
    ("llama.vocab_size", (65, V.UINT32), r"llama.vocab_size is 65 but tokenizer.ggml.tokens has 64 tokens"),
    ("llama.block_count", (1, V.UINT32),
     r"tensor blk.1.attn_norm.weight belongs to layer 1, but the config says the model has 1 layers"),
    ("general.architecture", (7, V.UINT32), r"general.architecture is an int 7; expected a string"),
])
def test_metadata_values(tmp_path, key, value, match):
    refused(tiny_gguf(tmp_path, set_kv={key: value}), match)


@pytest.mark.parametrize("key", ["bos", "eos", "padding", "unknown", "seperator", "eot", "fim_pre"])
def test_special_token_ids_inside_the_vocabulary(tmp_path, key):
    full = f"tokenizer.ggml.{key}_token_id"
    refused(tiny_gguf(tmp_path, set_kv={full: (64, V.UINT32)}),
            rf"{full} is an int 64; expected a token id in \[0, 63\] \(the vocabulary has 64 tokens\)")


@pytest.mark.parametrize("key, value, match", [
    ("tokenizer.ggml.token_type", ([1] * 63, V.ARRAY, V.INT32), r"token_type has 63 entries for 64 tokens"),
    ("tokenizer.ggml.token_type", ([1] * 63 + [9], V.ARRAY, V.INT32),
     r"token_type\[63\] is 9; expected a token type 0..6"),
    ("tokenizer.ggml.merges", (["a b", "a z"], V.ARRAY, V.STRING),
     r"merges\[1\] is 'a z'; expected 'left right' with left, right and left\+right all in"),
    ("tokenizer.ggml.merges", (["ab"], V.ARRAY, V.STRING), r"merges\[0\] is 'ab'"),
    ("tokenizer.ggml.merges", ([1, 2], V.ARRAY, V.UINT32),
     r"tokenizer.ggml.merges\[0\] is an int 1; expected a list of str"),
    ("tokenizer.ggml.add_bos_token", (1, V.UINT8),
     r"tokenizer.ggml.add_bos_token is an int 1; expected true or false"),
    ("tokenizer.chat_template", (["x"], V.ARRAY, V.STRING),
     r"tokenizer.chat_template is a list \['x'\]; expected a string"),
    ("tokenizer.ggml.pre", (3, V.UINT32), r"tokenizer.ggml.pre is an int 3; expected a string"),
    ("tokenizer.ggml.tokens", (TINY_VOCAB.tokens[:63] + ["a"], V.ARRAY, V.STRING),
     r"tokenizer.ggml.tokens\[63\] 'a' repeats token 3; expected every token string once"),
])
def test_tokenizer_metadata(tmp_path, key, value, match):
    refused(tiny_gguf(tmp_path, set_kv={key: value}), match)


def test_gemma3_sliding_pattern():
    md = {"general.architecture": "gemma3", "gemma3.block_count": 6, "gemma3.embedding_length": 64,
          "gemma3.attention.head_count": 4, "gemma3.attention.key_length": 32,
          "gemma3.feed_forward_length": 96, "gemma3.attention.layer_norm_rms_epsilon": 1e-6,
          "gemma3.context_length": 1024, "gemma3.attention.sliding_window": 16, "gemma3.vocab_size": 100}
    with pytest.raises(ModelLoadError, match=r"gemma3.attention.sliding_window_pattern has 5 values for 6 layers"):
        config_from_gguf({**md, "gemma3.attention.sliding_window_pattern": [True] * 5}, set(), "g.gguf")
    with pytest.raises(ModelLoadError, match=r"sliding_window_pattern is an int -1; expected an integer in \[0, "):
        config_from_gguf({**md, "gemma3.attention.sliding_window_pattern": -1}, set(), "g.gguf")
    c = config_from_gguf({**md, "gemma3.attention.sliding_window_pattern": [True] * 5 + [False]}, set(), "g.gguf")
    assert c.layer_types == ("sliding",) * 5 + ("full",)


# -- tensor types and values (tensor.py, finite.py) -------------------------------------

def test_quantized_norm(tmp_path):
    f = tiny_gguf(tmp_path, quantize={"output_norm.weight": Q.Q8_0})
    refused(f, r"tensor output_norm.weight of shape \(128,\) has type q8_0; a 1-D tensor \(norm, bias, "
               r"rope factors\) must be one of f32, f16, bf16")


def test_integer_matrix(tmp_path):
    f = tiny_gguf(tmp_path, raw_arrays={"blk.1.ffn_gate.weight": np.zeros((64, 128), np.int32)})
    refused(f, r"tensor blk.1.ffn_gate.weight of shape \(64, 128\) has type i32; a matrix must be one of f32")


def test_every_matrix_type_is_one_gguf_py_dequantizes():
    from gguf.quants import dequantize

    for name in MATRIX_DTYPES:
        qt = Q[name.upper()]
        block, block_bytes = gguf.GGML_QUANT_SIZES[qt]
        out = dequantize(np.zeros((2, 2 * block_bytes), np.uint8), qt) if qt not in (Q.F32, Q.F16, Q.BF16) else None
        assert out is None or out.shape == (2, 2 * block), name


@pytest.mark.parametrize("qtype", sorted(_BLOCK_SCALES))
def test_block_scale_offsets_are_scales(qtype):
    """Each listed f16 field, set to NaN, makes gguf-py's dequantization of the
    block NaN: the offsets name real scales."""
    from gguf.quants import dequantize

    block_bytes, offsets = _BLOCK_SCALES[qtype]
    qt = Q[qtype.upper()]
    assert gguf.GGML_QUANT_SIZES[qt][1] == block_bytes
    rng = np.random.default_rng(0)
    for o in offsets:
        blk = rng.integers(0, 256, (1, block_bytes), dtype=np.uint8)
        for other in offsets:  # finite, small scales elsewhere
            blk[0, other:other + 2] = np.frombuffer(np.float16(0.5).tobytes(), np.uint8)
        blk[0, o:o + 2] = np.frombuffer(np.float16(np.nan).tobytes(), np.uint8)
        with np.errstate(invalid="ignore"):
            assert np.isnan(dequantize(blk, qt)).any(), (qtype, o)


@pytest.mark.parametrize("name, qtype, where, value", [
    ("output_norm.weight", None, 5, np.float32(np.nan)),
    ("blk.1.ffn_down.weight", Q.F16, 100, np.float16(np.inf)),
    ("token_embd.weight", Q.Q8_0, 34 * 7, np.float16(-np.inf)),    # the scale d of block 7
    ("blk.0.ffn_up.weight", Q.Q4_1, 20 * 3 + 2, np.float16(np.nan)),  # the min m of block 3
    ("blk.0.attn_q.weight", Q.Q4_0, 18 * 11, np.float16(np.nan)),
])
def test_nonfinite_weights(tmp_path, name, qtype, where, value):
    f = tiny_gguf(tmp_path, quantize={name: qtype} if qtype else None)
    t = layout(f).tensors[name]
    data = bytearray(f.read_bytes())
    raw = value.tobytes()
    at = layout(f).data_start + t.offset + (where * len(raw) if qtype is None else where)
    if qtype == Q.F16:
        at = layout(f).data_start + t.offset + where * 2
    data[at:at + len(raw)] = raw
    f.write_bytes(bytes(data))
    what = "values" if qtype in (None, Q.F16) else "block scales"
    refused(f, rf"tensor {name} \(\w+, shape \([\d, ]+\)\) has 1 NaN or Inf {what}; expected finite")


def test_rope_freqs_must_be_positive(tmp_path):
    freqs = np.ones(32, np.float32)
    freqs[7] = 0.0
    f = tmp_path / "m.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, raw_arrays={"rope_freqs.weight": freqs},
               extra_shapes={"rope_freqs.weight": (32,)}, **TINY)
    refused(f, r"tensor rope_freqs.weight holds values <= 0 \(min 0\); expected frequency divisors > 0")


# -- safetensors (safetensors_loader.py) ------------------------------------------------

def hf_dir(tmp_path: pathlib.Path, **config) -> pathlib.Path:
    """A tiny HF directory whose config.json then gets `config` (the weights are
    written for the unchanged config)."""
    d = tmp_path / "hf"
    write_hf_dir(d, llama_config(**TINY_HF))
    (d / "config.json").write_text(json.dumps(llama_config(**{**TINY_HF, **config})))
    return d


def edit_header(d: pathlib.Path, change) -> pathlib.Path:
    """Rewrite the safetensors header through change(header dict) (or change(...) -> text)."""
    f = next(d.glob("*.safetensors"))
    header, body = safetensors_parts(f)
    out = change(header)
    write_safetensors_parts(f, out if isinstance(out, str) else header, body)
    return d


def refused_dir(d: pathlib.Path, match: str) -> str:
    with pytest.raises(ModelLoadError, match=match) as e:
        load_model(d, progress=False)
    assert str(d) in str(e.value), "the message names the directory or file"
    return str(e.value)


def test_tiny_hf_loads(tmp_path):
    assert load_model(hf_dir(tmp_path)).config.head_dim == 64


def _alias(h):
    h["model.norm.weight"]["data_offsets"] = h["model.embed_tokens.weight"]["data_offsets"][:1] + \
        [h["model.embed_tokens.weight"]["data_offsets"][0] + 256]


def _shift_first(h, by):
    first = min((v for k, v in h.items() if k != "__metadata__"), key=lambda v: v["data_offsets"])
    b, e = first["data_offsets"]
    first["data_offsets"] = [b + by, e + by]


@pytest.mark.parametrize("change, match", [
    (_alias,
     r"tensor model.embed_tokens.weight has data_offsets \[\d+, \d+\] and overlaps tensor model.norm.weight"),
    (lambda h: _shift_first(h, 2), r"has data_offsets \[2, \d+\] and leaves 2 unused bytes after the header"),
    (lambda h: h["model.norm.weight"].update(shape=[128.0]),
     r"tensor model.norm.weight: shape is a list \[128.0\]; expected a list of integers >= 0"),
    (lambda h: h["model.norm.weight"].update(shape=[-128]), r"shape is a list \[-128\]"),
    (lambda h: h["model.norm.weight"].update(shape=[True]), r"shape is a list \[True\]"),
    (lambda h: h["model.norm.weight"].update(shape=[1 << 40, 1 << 40]),
     r"of shape \(1099511627776, 1099511627776\) F16 needs \d+ bytes but its offsets span 256"),
    (lambda h: h["model.norm.weight"].update(data_offsets=[0, 256, 512]),
     r"data_offsets is a list \[0, 256, 512\]; expected \[begin, end\]"),
    (lambda h: h["model.norm.weight"].update(data_offsets=["0", "256"]),
     r"data_offsets is a list \['0', '256'\]"),
    (lambda h: h.update({"model.norm.weight": [1, 2]}),
     r"tensor model.norm.weight: malformed header entry a list \[1, 2\]"),
    (lambda h: h.update({"__metadata__": [1]}), r"__metadata__ is a list \[1\]; expected an object"),
    (lambda h: json.dumps(h).replace('"model.norm.weight"', '"model.embed_tokens.weight"'),
     r"header names 'model.embed_tokens.weight' twice"),
])
def test_safetensors_header(tmp_path, change, match):
    refused_dir(edit_header(hf_dir(tmp_path), change), match)


def test_safetensors_trailing_bytes(tmp_path):
    d = hf_dir(tmp_path)
    f = next(d.glob("*.safetensors"))
    f.write_bytes(f.read_bytes() + b"\0" * 10)
    refused_dir(d,
                r"goes on 10 bytes past the last tensor \(.*\); expected the tensors to cover the data exactly")


@pytest.mark.parametrize("dtype", ["F16", "BF16", "F32"])
def test_safetensors_nonfinite(tmp_path, dtype):
    d = tmp_path / "hf"
    arrays = write_hf_dir(d, llama_config(**TINY_HF), dtype=dtype)
    f = next(d.glob("*.safetensors"))
    data = bytearray(f.read_bytes())
    n = int.from_bytes(data[:8], "little")
    b, _ = json.loads(data[8:8 + n])["model.layers.1.mlp.up_proj.weight"]["data_offsets"]
    nan = {"F16": np.float16(np.nan).tobytes(), "F32": np.float32(np.inf).tobytes(),
           "BF16": (np.float32(np.nan).view(np.uint32) >> 16).astype(np.uint16).tobytes()}[dtype]
    data[8 + n + b:8 + n + b + len(nan)] = nan
    f.write_bytes(bytes(data))
    assert arrays  # written
    refused_dir(d, rf"tensor blk.1.ffn_up.weight \(.*model.layers.1.mlp.up_proj.weight\) \({dtype.lower()}, "
                   rf"shape \(64, 128\)\) has 1 NaN or Inf values")


# -- config.json (hf_config.py, config.py) -------------------------------------------------

@pytest.mark.parametrize("over, match", [
    ({"num_attention_heads": "2"}, r"num_attention_heads is a string '2'; expected an integer in \[1, 4096\]"),
    ({"num_hidden_layers": True}, r"num_hidden_layers is a bool True; expected an integer"),
    ({"num_hidden_layers": 1},
     r"tensor blk.1.attn_norm.weight \(model.layers.1.input_layernorm.weight\) belongs to layer 1"),
    ({"num_key_value_heads": 0}, r"num_key_value_heads is an int 0"),
    ({"hidden_size": 129},
     r"hidden_size 129 is not a multiple of num_attention_heads 2, and config.json has no head_dim"),
    ({"intermediate_size": 64.0}, r"intermediate_size is a float 64.0; expected an integer"),
    ({"vocab_size": [64]}, r"vocab_size is a list \[64\]"),
    ({"rms_norm_eps": float("nan")}, r"rms_norm_eps is a float nan; expected a finite number in \(0.0, 1.0\]"),
    ({"rope_theta": -1}, r"rope_theta is an int -1; expected a finite number > 1.0"),
    ({"tie_word_embeddings": "no"}, r"tie_word_embeddings is a string 'no'; expected true or false"),
    ({"attention_bias": 1}, r"attention_bias is an int 1; expected true or false"),
    ({"max_position_embeddings": 0}, r"max_position_embeddings is an int 0"),
    ({"rope_scaling": "linear"}, r"rope_scaling is a string 'linear'; expected an object"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 0}},
     r"rope_scaling.factor is a float 0.0; expected a finite number > 0.0"),
    ({"rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 4.0, "high_freq_factor": 4.0,
                       "original_max_position_embeddings": 8192}},
     r"rope_scaling.high_freq_factor is a float 4.0; expected a finite number > 4.0"),
    ({"eos_token_id": [2, 64]}, r"eos_token_id\[1\] is an int 64; expected a token id in \[0, 63\]"),
    ({"bos_token_id": "1"}, r"bos_token_id is a string '1'; expected a token id"),
    ({"pad_token_id": -1}, r"pad_token_id is an int -1; expected a token id"),
    ({"layer_types": ["full_attention"]}, r"layer_types has 1 entries for num_hidden_layers=2"),
    ({"model_type": 5}, r"model_type is an int 5; expected a string"),
])
def test_config_json(tmp_path, over, match):
    refused_dir(hf_dir(tmp_path, **over), match)


def test_config_json_not_an_object(tmp_path):
    d = hf_dir(tmp_path)
    (d / "config.json").write_text("[1, 2]")
    refused_dir(d, r"config.json: holds a list \[1, 2\]; expected a JSON object")


def test_gemma3_text_config_not_an_object(tmp_path):
    d = hf_dir(tmp_path)
    (d / "config.json").write_text(json.dumps({"model_type": "gemma3", "text_config": [1]}))
    refused_dir(d, r"text_config is a list \[1\]; expected an object")


def test_generation_config_eos(tmp_path):
    d = hf_dir(tmp_path)
    (d / "generation_config.json").write_text(json.dumps({"eos_token_id": 99}))
    refused_dir(d, r"generation_config.json: eos_token_id is an int 99; expected a token id in \[0, 63\]")


def test_tokenizer_json_added_tokens(tmp_path):
    d = hf_dir(tmp_path)
    (d / "tokenizer.json").write_text(json.dumps({"added_tokens": [{"content": 5, "id": 1}]}))
    refused_dir(d, r"added_tokens is not a list of \{content: string, id: integer >= 0\} objects")
