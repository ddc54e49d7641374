"""GGUF mutations for test_fuzz_model_files.py: each case is a named edit of a
well-formed file's bytes (patches, a truncation or an append), found through
tiny.gguf_layout, and the outcome it must have:

    REFUSED  a ModelLoadError (naming `names` when given)
    SAME     loads, and its logits equal the unmutated file's exactly
    EITHER   one of the two (seeded random edits, and edits whose effect depends
             on bytes that happen to follow the edited field)

Edits that make a different but valid model (another rope base, a changed
weight) have no place here: neither outcome would be right. So have two that
no check can see, a matrix's f16 type declared bf16 (same size, both matrix
types) and q4_0 declared iq4_nl (same block size); see docs/MODELS.md.
"""
from __future__ import annotations

import random
import struct
from dataclasses import dataclass
from typing import Callable

from .tiny import GGUFLayout, TensorField

REFUSED, SAME, EITHER = "refused", "same", "either"
_SCALAR_FMT = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<B", 10: "<Q",
               11: "<q", 12: "<d"}
# ggml type ids (gguf.GGMLQuantizationType)
GGML = {"f32": 0, "f16": 1, "q4_0": 2, "q4_1": 3, "q8_0": 8, "q4_k": 12, "i8": 24, "i32": 26,
        "bf16": 30, "unknown99": 99}
NAN32, INF32 = struct.pack("<f", float("nan")), struct.pack("<f", float("inf"))
NAN16, INF16 = struct.pack("<e", float("nan")), struct.pack("<e", float("-inf"))


@dataclass(frozen=True)
class Edit:
    patches: tuple[tuple[int, bytes], ...] = ()
    truncate: int | None = None   # keep this many bytes
    append: bytes = b""


@dataclass(frozen=True)
class Case:
    id: str
    make: Callable[[GGUFLayout], Edit]
    expect: str
    names: str | None = None


def apply_edit(data: bytes, e: Edit) -> bytes:
    out = bytearray(data if e.truncate is None else data[:e.truncate])
    for at, raw in e.patches:
        out[at:at + len(raw)] = raw
    return bytes(out + e.append)


# -- edits ---------------------------------------------------------------------------

def patch(at: Callable[[GGUFLayout], int], fmt: str, value) -> Callable[[GGUFLayout], Edit]:
    return lambda L: Edit(((at(L), struct.pack(fmt, value)),))


def kv_type(key: str, vtype: int):
    return patch(lambda L: L.kv[key].type_at, "<I", vtype)


def kv_value(key: str, value):
    """The value written in the key's own scalar type."""
    return lambda L: Edit(((L.kv[key].value_at, struct.pack(_SCALAR_FMT[L.kv[key].vtype], value)),))


def kv_length(key: str, n: int):
    """A string's byte length or an array's element count."""
    return patch(lambda L: L.kv[key].value_at + (4 if L.kv[key].vtype == 9 else 0), "<Q", n)


def kv_element_type(key: str, sub: int):
    return patch(lambda L: L.kv[key].value_at, "<I", sub)


def kv_text(key: str, new: bytes):
    """Replace the start of a string value with `new` (same length: nothing moves)."""
    return lambda L: Edit(((L.kv[key].value_at + 8, new),))


def array_text(key: str, index: int, text: bytes):
    """Overwrite element `index` of a string array with `text` (its own length)."""
    return lambda L: Edit(((L.kv[key].items[index] + 8, text),))


def tensor_field(name: str, field: str, fmt: str, value: Callable[[TensorField, GGUFLayout], int]):
    return lambda L: Edit(((getattr(L.tensors[name], field), struct.pack(fmt, value(L.tensors[name], L))),))


def tensor_data(name: str, offset: int, raw: bytes):
    return lambda L: Edit(((L.data_start + L.tensors[name].offset + offset, raw),))


def truncate(at: Callable[[GGUFLayout], int]):
    return lambda L: Edit(truncate=at(L))


def flip_byte(region: Callable[[GGUFLayout], tuple[int, int]], seed: int):
    """One byte somewhere in [start, end) set to another printable ASCII byte."""
    def make(L: GGUFLayout) -> Edit:
        rng = random.Random(seed)
        start, end = region(L)
        at = rng.randrange(start, end)
        return Edit(((at, bytes([rng.choice(b"abcdefghijklmnopqrstuvwxyz0123456789._")]),),))
    return make


def _prev_offset(t: TensorField, L: GGUFLayout) -> int:
    names = list(L.tensors)
    i = names.index(t.name)
    return L.tensors[names[i - 1 if i else 1]].offset


# -- cases over any file -----------------------------------------------------------------

def header_cases(prefix: str) -> list[Case]:
    return [
        Case(f"{prefix}/header/magic=GGUX", patch(lambda L: 0, "4s", b"GGUX"), REFUSED, "GGUF"),
        Case(f"{prefix}/header/version=1", patch(lambda L: 4, "<I", 1), REFUSED, "version 1"),
        Case(f"{prefix}/header/version=4", patch(lambda L: 4, "<I", 4), REFUSED, "version 4"),
        Case(f"{prefix}/header/version=big-endian-3", patch(lambda L: 4, "<I", 3 << 24), REFUSED, "big-endian"),
        Case(f"{prefix}/header/version=2", patch(lambda L: 4, "<I", 2), SAME),
        Case(f"{prefix}/header/tensor_count+1", lambda L: patch(lambda _: 8, "<Q", len(L.tensors) + 1)(L),
             REFUSED),
        Case(f"{prefix}/header/tensor_count-1", lambda L: patch(lambda _: 8, "<Q", len(L.tensors) - 1)(L),
             REFUSED),
        Case(f"{prefix}/header/tensor_count=2^60", patch(lambda L: 8, "<Q", 1 << 60), REFUSED, "tensor_count"),
        Case(f"{prefix}/header/kv_count=2^60", patch(lambda L: 16, "<Q", 1 << 60), REFUSED, "kv_count"),
        Case(f"{prefix}/header/kv_count=0", patch(lambda L: 16, "<Q", 0), REFUSED),
        Case(f"{prefix}/header/kv_count-1", lambda L: patch(lambda _: 16, "<Q", len(L.kv) - 1)(L), REFUSED),
        Case(f"{prefix}/header/kv_count+1", lambda L: patch(lambda _: 16, "<Q", len(L.kv) + 1)(L), REFUSED),
        Case(f"{prefix}/append/1-byte", lambda L: Edit(append=b"\0"), REFUSED, "past the"),
        Case(f"{prefix}/append/32-bytes", lambda L: Edit(append=b"\0" * 32), REFUSED, "past the"),
    ]


def count_cases(prefix: str, arch: str, values: dict[str, list[tuple[int, str]]],
                int32_same: tuple[str, ...]) -> list[Case]:
    """values: {key suffix: [(value, expectation), ...]} for uint32 keys;
    int32_same: the keys for which uint32 -> int32 (same bytes, same value) is tried."""
    out = []
    for suffix, vals in values.items():
        key = f"{arch}.{suffix}"
        for v, expect in vals:
            out.append(Case(f"{prefix}/kv/{key}={v}", kv_value(key, v), expect,
                            key if expect == REFUSED and v in (0, 2**32 - 1, 2**31) else None))
        if suffix in int32_same:
            out.append(Case(f"{prefix}/kv/{key}/type=int32", kv_type(key, 5), SAME))
        out += [
            Case(f"{prefix}/kv/{key}/type=float32", kv_type(key, 6), REFUSED, key),
            Case(f"{prefix}/kv/{key}/type=bool", kv_type(key, 7), REFUSED),
            Case(f"{prefix}/kv/{key}/type=string", kv_type(key, 8), REFUSED),
            Case(f"{prefix}/kv/{key}/type=13", kv_type(key, 13), REFUSED, "value type 13"),
        ]
    return out


def float_cases(prefix: str, key: str, values: list[float]) -> list[Case]:
    return [Case(f"{prefix}/kv/{key}={v}", kv_value(key, v), REFUSED, key) for v in values] + \
        [Case(f"{prefix}/kv/{key}/type=uint32", kv_type(key, 4), REFUSED, key),
         Case(f"{prefix}/kv/{key}/type=array", kv_type(key, 9), REFUSED)]


def special_id_cases(prefix: str, vocab: int, keys: list[str]) -> list[Case]:
    out = []
    for k in keys:
        key = f"tokenizer.ggml.{k}_token_id"
        out += [Case(f"{prefix}/kv/{key}={vocab}", kv_value(key, vocab), REFUSED, key),
                Case(f"{prefix}/kv/{key}=2^32-1", kv_value(key, 2**32 - 1), REFUSED, key),
                Case(f"{prefix}/kv/{key}/type=float32", kv_type(key, 6), REFUSED, key)]
    return out


def vocab_cases(prefix: str, n_tokens: int) -> list[Case]:
    t, ty, m = "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges"
    return [
        Case(f"{prefix}/kv/{t}/length=2^60", kv_length(t, 1 << 60), REFUSED, t),
        Case(f"{prefix}/kv/{t}/length-1", kv_length(t, n_tokens - 1), REFUSED),
        Case(f"{prefix}/kv/{t}/length+1", kv_length(t, n_tokens + 1), REFUSED),
        Case(f"{prefix}/kv/{t}/element-type=13", kv_element_type(t, 13), REFUSED, t),
        Case(f"{prefix}/kv/{t}/element-type=array", kv_element_type(t, 9), REFUSED, "nested arrays"),
        Case(f"{prefix}/kv/{t}/element-type=uint64", kv_element_type(t, 10), EITHER),
        Case(f"{prefix}/kv/{t}/first-string-length=2^62",
             patch(lambda L: L.kv[t].value_at + 12, "<Q", 1 << 62), REFUSED, t),
        Case(f"{prefix}/kv/{ty}/length=2^60", kv_length(ty, 1 << 60), REFUSED, ty),
        Case(f"{prefix}/kv/{ty}/element-type=uint32", kv_element_type(ty, 4), SAME),
        Case(f"{prefix}/kv/{ty}/element-type=float32", kv_element_type(ty, 6), REFUSED, ty),
        Case(f"{prefix}/kv/{ty}/element-type=uint8", kv_element_type(ty, 0), REFUSED),
        Case(f"{prefix}/kv/{ty}/first=9", patch(lambda L: L.kv[ty].value_at + 12, "<i", 9), REFUSED, ty),
        Case(f"{prefix}/kv/{m}/length=2^60", kv_length(m, 1 << 60), REFUSED, m),
        Case(f"{prefix}/kv/{m}[0]=no-space", array_text(m, 0, b"xxx"), REFUSED, f"{m}[0]"),
        Case(f"{prefix}/kv/{t}[5]/length=2^40", patch(lambda L: L.kv[t].items[5], "<Q", 1 << 40), REFUSED,
             f"element 5 of '{t}'"),
        Case(f"{prefix}/kv/{m}/element-type=int32", kv_element_type(m, 5), EITHER),
        Case(f"{prefix}/kv/tokenizer.ggml.add_bos_token=2", kv_value("tokenizer.ggml.add_bos_token", 2),
             REFUSED, "tokenizer.ggml.add_bos_token"),
        Case(f"{prefix}/kv/tokenizer.ggml.add_bos_token/type=uint8", kv_type("tokenizer.ggml.add_bos_token", 0),
             REFUSED, "tokenizer.ggml.add_bos_token"),
        Case(f"{prefix}/kv/tokenizer.ggml.model/type=13", kv_type("tokenizer.ggml.model", 13), REFUSED),
        Case(f"{prefix}/kv/tokenizer.ggml.pre/length=2^62", kv_length("tokenizer.ggml.pre", 1 << 62),
             REFUSED, "tokenizer.ggml.pre"),
        Case(f"{prefix}/kv/general.architecture=llamb", kv_text("general.architecture", b"llamb"),
             REFUSED, "'llamb' is not supported"),
        Case(f"{prefix}/kv/general.architecture/length+1", kv_length("general.architecture", 6), REFUSED),
        Case(f"{prefix}/kv/general.architecture/not-utf8", kv_text("general.architecture", b"\xff"),
             REFUSED, "UTF-8"),
    ]


def tensor_cases(prefix: str, name: str, own_type: str, kind: str, alignment: int = 32) -> list[Case]:
    """kind: "vector", "square" or "matrix" (non-square: its dimensions can be swapped)."""
    p = f"{prefix}/tensor/{name}"
    out = [Case(f"{p}/type={t}", tensor_field(name, "type_at", "<I", lambda *_, i=i: i), REFUSED, name)
           for t, i in GGML.items() if t not in (own_type, "bf16")]
    out += [
        Case(f"{p}/n_dims=0", tensor_field(name, "ndims_at", "<I", lambda *_: 0), REFUSED, name),
        Case(f"{p}/n_dims=3", tensor_field(name, "ndims_at", "<I", lambda *_: 3), REFUSED),
        Case(f"{p}/n_dims=5", tensor_field(name, "ndims_at", "<I", lambda *_: 5), REFUSED, name),
        Case(f"{p}/ne0*2", tensor_field(name, "dims_at", "<Q", lambda t, L: t.ne[0] * 2), REFUSED),
        Case(f"{p}/ne0+1", tensor_field(name, "dims_at", "<Q", lambda t, L: t.ne[0] + 1), REFUSED),
        Case(f"{p}/ne0=0", tensor_field(name, "dims_at", "<Q", lambda t, L: 0), REFUSED, name),
        Case(f"{p}/ne0=2^40", tensor_field(name, "dims_at", "<Q", lambda t, L: 1 << 40), REFUSED),
        Case(f"{p}/offset+1", tensor_field(name, "offset_at", "<Q", lambda t, L: t.offset + 1), REFUSED,
             f"{name} has data offset"),
        Case(f"{p}/offset+{alignment}", tensor_field(name, "offset_at", "<Q", lambda t, L: t.offset + alignment),
             REFUSED, name),
        Case(f"{p}/offset-{alignment}",
             tensor_field(name, "offset_at", "<Q", lambda t, L: (t.offset - alignment) % 2**64), REFUSED, name),
        Case(f"{p}/offset=previous-tensor's", tensor_field(name, "offset_at", "<Q", _prev_offset),
             REFUSED, name),
        Case(f"{p}/offset=2^60", tensor_field(name, "offset_at", "<Q", lambda t, L: 1 << 60), REFUSED, name),
    ]
    if kind == "matrix":
        out.append(Case(f"{p}/ne-swapped", lambda L: Edit((
            (L.tensors[name].dims_at, struct.pack("<QQ", *reversed(L.tensors[name].ne))),)), REFUSED, name))
    if kind != "vector":
        out.append(Case(f"{p}/ne1+1", lambda L: Edit(((L.tensors[name].dims_at + 8,
                                                       struct.pack("<Q", L.tensors[name].ne[1] + 1)),)),
                                                                   REFUSED))
    return out


def truncation_cases(prefix: str, keys: list[str], tensors: list[str]) -> list[Case]:
    """At every section boundary: inside the fixed header, at each key and value,
    each tensor info, the data start, inside each tensor, one byte short."""
    out = [Case(f"{prefix}/truncate/at={n}", truncate(lambda L, n=n: n), REFUSED, None)
           for n in (0, 3, 4, 8, 16, 23, 24)]
    for k in keys:
        out.append(Case(f"{prefix}/truncate/at-key[{k}]", truncate(lambda L, k=k: L.kv[k].start),
                   REFUSED, "truncated"))
        out.append(Case(f"{prefix}/truncate/in-value[{k}]", truncate(lambda L, k=k: L.kv[k].value_at + 1),
                   REFUSED, "truncated"))
    out.append(Case(f"{prefix}/truncate/at-tensor-infos", truncate(lambda L: L.kv_end), REFUSED, "truncated"))
    for t in tensors:
        out.append(Case(f"{prefix}/truncate/at-info[{t}]", truncate(lambda L, t=t: L.tensors[t].start),
                   REFUSED, "truncated"))
        out.append(Case(f"{prefix}/truncate/in-data[{t}]",
                        truncate(lambda L, t=t: L.data_start + L.tensors[t].offset + 1), REFUSED, "truncated"))
    out += [Case(f"{prefix}/truncate/at-padding", truncate(lambda L: L.infos_end), REFUSED, "truncated"),
            Case(f"{prefix}/truncate/at-data", truncate(lambda L: L.data_start), REFUSED, "truncated"),
            Case(f"{prefix}/truncate/last-byte", truncate(lambda L: L.size - 1), REFUSED, "truncated")]
    return out


def nonfinite_cases(prefix: str, tensors: dict[str, str]) -> list[Case]:
    """NaN / Inf in the first value (f32, f16) or the first block scale."""
    out = []
    for name, ty in tensors.items():
        if ty == "f32":
            raws = [("nan", NAN32), ("inf", INF32)]
        elif ty in ("f16", "q8_0", "q4_0"):
            raws = [("nan", NAN16), ("-inf", INF16)]
        elif ty == "q4_1":  # d, then the min m
            raws = [("nan-d", NAN16), ("inf-m", None)]
        else:
            continue
        for label, raw in raws:
            make = tensor_data(name, 2, INF16) if raw is None else tensor_data(name, 0, raw)
            out.append(Case(f"{prefix}/data/{name}/{label}", make, REFUSED, f"{name} ({ty}"))
    return out


def random_flip_cases(prefix: str, keys: list[str], tensors: list[str], n: int, seed: int) -> list[Case]:
    """A byte of a key or a tensor name changed: a missing, unknown or duplicated
    name (refused), or a key no one reads (same)."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        if i % 2 == 0:
            k = rng.choice(keys)
            region = (lambda L, k=k: (L.kv[k].start + 8, L.kv[k].type_at))
            out.append(Case(f"{prefix}/flip/key[{k}]/seed{i}", flip_byte(region, seed * 1000 + i), EITHER))
        else:
            t = rng.choice(tensors)
            region = (lambda L, t=t: (L.tensors[t].start + 8, L.tensors[t].ndims_at))
            out.append(Case(f"{prefix}/flip/name[{t}]/seed{i}", flip_byte(region, seed * 1000 + i), EITHER))
    return out
