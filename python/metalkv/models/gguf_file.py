"""A GGUF file, read and checked against itself before any byte of it is used.

    f = read_gguf("model.gguf")    # ModelLoadError naming the byte, key or tensor that is wrong
    f.metadata["llama.block_count"], f.tensors[0].name, f.tensor_array(f.tensors[0])

Layout (little-endian; https://github.com/ggml-org/ggml/blob/master/docs/gguf.md):

    magic "GGUF" | version u32 (2, 3) | tensor_count u64 | kv_count u64
    kv_count x   (key: string, value_type u32, value)        string = len u64 + UTF-8 bytes
    tensor_count x (name: string, n_dims u32, ne[n_dims] u64, ggml_type u32, offset u64)
    padding to general.alignment (default 32), then the data section

We parse it ourselves rather than through gguf-py's GGUFReader: the reader trusts
its counts (an array length of 2**60 loops or allocates without end, a bad type
raises whatever Python raises there) and takes ~2 s on the default model's 49k
tokens and merges; this takes ~0.15 s. Every count is bounded by the bytes left in
the file before it is used. Tensors must tile the data section the way llama.cpp
requires (gguf.cpp): in header order, each at the previous one's end rounded up to
the alignment, so an overlap, a gap, a misaligned offset or a declared type whose
size differs from the stored bytes is refused, not read.
"""
from __future__ import annotations

import math
import mmap
import os
import struct
from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import ModelLoadError

GGUF_MAGIC = b"GGUF"
SUPPORTED_VERSIONS = (2, 3)
DEFAULT_ALIGNMENT = 32
MAX_DIMS = 4  # GGML_MAX_DIMS

# value_type -> (name, struct format); 8 string and 9 array are read apart
_SCALARS = {0: ("uint8", "<B"), 1: ("int8", "<b"), 2: ("uint16", "<H"), 3: ("int16", "<h"),
            4: ("uint32", "<I"), 5: ("int32", "<i"), 6: ("float32", "<f"), 7: ("bool", "<B"),
            10: ("uint64", "<Q"), 11: ("int64", "<q"), 12: ("float64", "<d")}
_STRING, _ARRAY = 8, 9
_NUMPY = {"uint8": "<u1", "int8": "<i1", "uint16": "<u2", "int16": "<i2", "uint32": "<u4",
          "int32": "<i4", "float32": "<f4", "bool": "<u1", "uint64": "<u8", "int64": "<i8",
          "float64": "<f8"}
# Smallest encoding of one kv pair (1-byte key, u8 value) and of one tensor info
# (1-byte name, 1 dim): counts beyond what the rest of the file could hold are refused.
_MIN_KV_BYTES = 8 + 1 + 4 + 1
_MIN_TENSOR_INFO_BYTES = 8 + 1 + 4 + 8 + 4 + 8


def ggml_types() -> dict[int, tuple[str, int, int]]:
    """ggml_type id -> (lower-case name, elements per block, bytes per block)."""
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    return {int(t): (t.name.lower(), *GGML_QUANT_SIZES[t]) for t in GGMLQuantizationType
            if t in GGML_QUANT_SIZES}


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    ne: tuple[int, ...]     # GGUF order: ne[0] is the contiguous dimension
    ggml_type: str          # "f32", "f16", "bf16", "q4_1", ...
    offset: int             # absolute byte offset in the file
    nbytes: int

    @property
    def shape(self) -> tuple[int, ...]:
        """Logical row-major shape (out, in): ne reversed."""
        return tuple(reversed(self.ne))


@dataclass
class GGUFFile:
    path: str
    version: int
    metadata: dict[str, Any]        # key -> str | int | float | bool | list of one of those
    value_types: dict[str, str]     # key -> "uint32", "string", "array[string]", ...
    tensors: list[GGUFTensorInfo]   # header order
    alignment: int
    data_offset: int                # where the data section starts
    buffer: Any                     # the read-only memory map the tensor arrays view

    def tensor_array(self, t: GGUFTensorInfo) -> np.ndarray:
        """f32 / f16 as float arrays of t.shape, bf16 as uint16 bit patterns of t.shape,
        every other type as raw bytes, uint8 (rows, bytes_per_row); a read-only view."""
        raw = np.frombuffer(self.buffer, np.uint8, t.nbytes, t.offset)
        if t.ggml_type in ("f32", "f16", "bf16"):
            dtype = {"f32": np.float32, "f16": np.float16, "bf16": np.uint16}[t.ggml_type]
            return raw.view(dtype).reshape(t.shape)
        rows = math.prod(t.shape[:-1])
        return raw.reshape(rows, t.nbytes // rows)


def read_gguf(path: str | os.PathLike) -> GGUFFile:
    """Parse and check the header of a GGUF file; see the module docstring."""
    path = os.fspath(path)
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) if size else b""
    except FileNotFoundError:
        raise ModelLoadError(f"[gguf] {path}: no such file") from None
    except OSError as e:
        raise ModelLoadError(f"[gguf] {path}: cannot read ({e})") from None
    r = _Reader(buf, size, path)
    if r.take(4, "the magic") != GGUF_MAGIC:
        raise ModelLoadError(f"[gguf] {path}: not a readable GGUF file: it does not start with "
                             f"the magic 'GGUF'")
    version = r.scalar("<I", "the version")
    if version not in SUPPORTED_VERSIONS:
        endian = " (it looks big-endian, which metalkv does not read)" if version & 0xFFFF == 0 else ""
        raise ModelLoadError(f"[gguf] {path}: not a readable GGUF file: version {version}{endian}; "
                             f"expected one of {SUPPORTED_VERSIONS}")
    n_tensors = r.scalar("<Q", "tensor_count")
    n_kv = r.count("<Q", "kv_count", _MIN_KV_BYTES)
    metadata, value_types = _read_metadata(r, n_kv)
    r.bound(n_tensors, "tensor_count", 8, _MIN_TENSOR_INFO_BYTES)  # the infos follow the metadata
    alignment = _alignment(metadata, value_types, path)
    infos = [_read_tensor_info(r, i) for i in range(n_tensors)]
    data_offset = _align(r.pos, alignment)
    if data_offset > size:
        raise ModelLoadError(f"[gguf] {path}: the data section would start at byte {data_offset} but "
                             f"the file has {size} bytes: the file is truncated")
    tensors = _place_tensors(infos, data_offset, alignment, size, path)
    return GGUFFile(path, version, metadata, value_types, tensors, alignment, data_offset, buf)


class _Reader:
    """A cursor over the file that refuses to read past its end."""

    def __init__(self, buf, size: int, path: str):
        self.buf, self.size, self.path, self.pos = buf, size, path, 0

    def need(self, n: int, what: str) -> None:
        if n > self.size - self.pos:
            raise ModelLoadError(f"[gguf] {self.path}: {what} at byte {self.pos} needs {n} bytes but "
                                 f"only {self.size - self.pos} are left: the file is truncated or corrupt")

    def take(self, n: int, what: str) -> bytes:
        self.need(n, what)
        self.pos += n
        return self.buf[self.pos - n:self.pos]

    def scalar(self, fmt: str, what: str):
        n = struct.calcsize(fmt)
        self.need(n, what)
        (v,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += n
        return v

    def count(self, fmt: str, what: str, min_item_bytes: int) -> int:
        """A count of items each at least min_item_bytes long that follow it."""
        at = self.pos
        return self.bound(self.scalar(fmt, what), what, at, min_item_bytes)

    def bound(self, n: int, what: str, at: int, min_item_bytes: int) -> int:
        """n, if n items of at least min_item_bytes each fit in what is left of the file."""
        if n * min_item_bytes > self.size - self.pos:
            raise ModelLoadError(f"[gguf] {self.path}: {what} at byte {at} is {n}, which needs at least "
                                 f"{n * min_item_bytes} more bytes, but only {self.size - self.pos} are "
                                 f"left: the file is corrupt or truncated")
        return n

    def string(self, what: str) -> str:
        n = self.count("<Q", f"the length of {what}", 1)
        try:
            return str(self.buf[self.pos:self.pos + n], "utf-8")
        except UnicodeDecodeError as e:
            raise ModelLoadError(f"[gguf] {self.path}: {what} at byte {self.pos} is not valid UTF-8 "
                                 f"({e.reason} at byte {self.pos + e.start}): corrupt file") from None
        finally:
            self.pos += n


def _read_metadata(r: _Reader, n_kv: int) -> tuple[dict[str, Any], dict[str, str]]:
    metadata: dict[str, Any] = {}
    types: dict[str, str] = {}
    for i in range(n_kv):
        key = r.string(f"the key of metadata entry {i}")
        if key in metadata:
            raise ModelLoadError(f"[gguf] {r.path}: metadata key {key!r} appears twice")
        at = r.pos
        vtype = r.scalar("<I", f"the value type of {key!r}")
        if vtype == _ARRAY:
            metadata[key], sub = _read_array(r, key)
            types[key] = f"array[{sub}]"
        else:
            metadata[key], types[key] = _read_value(r, key, vtype, at)
    return metadata, types


def _read_value(r: _Reader, key: str, vtype: int, at: int) -> tuple[Any, str]:
    """A scalar or string value of type `vtype` (read at byte `at`)."""
    if vtype == _STRING:
        return r.string(f"the value of {key!r}"), "string"
    if vtype not in _SCALARS:
        raise ModelLoadError(f"[gguf] {r.path}: metadata {key!r} at byte {at} has value type {vtype}; "
                             f"expected 0..12 (a GGUF value type): corrupt file")
    name, fmt = _SCALARS[vtype]
    v = r.scalar(fmt, f"the value of {key!r}")
    if name == "bool":
        if v > 1:
            raise ModelLoadError(f"[gguf] {r.path}: bool metadata {key!r} holds byte {v}, expected 0 or 1")
        v = bool(v)
    return v, name


def _read_array(r: _Reader, key: str) -> tuple[list, str]:
    at = r.pos
    sub = r.scalar("<I", f"the element type of {key!r}")
    if sub == _STRING:
        n = r.count("<Q", f"the length of array {key!r}", 8)
        return [r.string(f"element {j} of {key!r}") for j in range(n)], "string"
    if sub not in _SCALARS:
        what = "nested arrays are not supported" if sub == _ARRAY else "unknown type"
        raise ModelLoadError(f"[gguf] {r.path}: array {key!r} at byte {at} has element type {sub} "
                             f"({what}); expected 0..8, 10..12")
    name, fmt = _SCALARS[sub]
    size = struct.calcsize(fmt)
    n = r.count("<Q", f"the length of array {key!r}", size)
    values = np.frombuffer(r.take(n * size, f"array {key!r}"), _NUMPY[name], n)
    if name == "bool":
        if n and values.max() > 1:
            raise ModelLoadError(f"[gguf] {r.path}: bool array {key!r} holds byte {values.max()}, "
                                 f"expected 0 or 1")
        values = values.astype(bool)
    return values.tolist(), name


def _alignment(metadata: dict[str, Any], types: dict[str, str], path: str) -> int:
    if "general.alignment" not in metadata:
        return DEFAULT_ALIGNMENT
    a = metadata["general.alignment"]
    if types["general.alignment"] != "uint32" or a <= 0 or a & (a - 1):
        raise ModelLoadError(f"[gguf] {path}: general.alignment is {types['general.alignment']} {a!r}; "
                             f"expected a uint32 power of two (the default is {DEFAULT_ALIGNMENT})")
    return a


@dataclass(frozen=True)
class _RawInfo:
    name: str
    ne: tuple[int, ...]
    type_id: int
    offset: int     # relative to the data section
    header_at: int  # where its info starts, for messages


def _read_tensor_info(r: _Reader, i: int) -> _RawInfo:
    at = r.pos
    name = r.string(f"the name of tensor {i}")
    n_dims = r.scalar("<I", f"n_dims of tensor {name}")
    if not 1 <= n_dims <= MAX_DIMS:
        raise ModelLoadError(f"[gguf] {r.path}: tensor {name} (info at byte {at}) has {n_dims} "
                             f"dimensions; expected 1..{MAX_DIMS}")
    ne = struct.unpack_from(f"<{n_dims}Q", r.take(8 * n_dims, f"the dimensions of tensor {name}"))
    type_id = r.scalar("<I", f"the type of tensor {name}")
    offset = r.scalar("<Q", f"the data offset of tensor {name}")
    return _RawInfo(name, tuple(ne), type_id, offset, at)


def _place_tensors(infos: list[_RawInfo], data_offset: int, alignment: int, size: int,
                   path: str) -> list[GGUFTensorInfo]:
    """Check each tensor's type, size and offset; they must tile the data section."""
    types = ggml_types()
    out: list[GGUFTensorInfo] = []
    seen: set[str] = set()
    expected = 0  # where the next tensor must start, relative to the data section
    for t in infos:
        where = f"[gguf] {path}: tensor {t.name}"
        if t.name in seen:
            raise ModelLoadError(f"{where} appears twice in the tensor list")
        seen.add(t.name)
        nbytes = _tensor_nbytes(t, types, where)
        if t.offset % alignment:
            raise ModelLoadError(f"{where} has data offset {t.offset}, not a multiple of the "
                                 f"alignment {alignment}: corrupt header")
        if t.offset != expected:
            prev = out[-1].name if out else None
            what = (f"overlaps the data of {prev}" if t.offset < expected else
                    f"leaves {t.offset - expected} unused bytes after {prev or 'the start of the data'}")
            raise ModelLoadError(
                f"{where} has data offset {t.offset} and {what}; expected offset {expected} (tensors "
                f"lie one after the other in header order, each padded to {alignment} bytes): a "
                f"tensor's offset, type or shape in the header does not match its data")
        end = data_offset + t.offset + nbytes
        if end > size:
            raise ModelLoadError(f"{where} ends at byte {end} but the file has {size} bytes: the "
                                 f"file is truncated")
        out.append(GGUFTensorInfo(t.name, t.ne, types[t.type_id][0], data_offset + t.offset, nbytes))
        expected = _align(t.offset + nbytes, alignment)
    extra = size - (data_offset + expected)
    if extra > 0:
        last = f"the last tensor ({out[-1].name})" if out else "the header (no tensors)"
        raise ModelLoadError(f"[gguf] {path}: the file goes on {_bytes(extra)} past the data of {last}; "
                             f"expected it to end there: a tensor's type or shape in the header does "
                             f"not match its data, or the file has trailing garbage")
    return out


def _tensor_nbytes(t: _RawInfo, types: dict[int, tuple[str, int, int]], where: str) -> int:
    if t.type_id not in types:
        raise ModelLoadError(f"{where} has ggml type {t.type_id}, which is not a known type (not one "
                             f"the installed gguf package knows): a corrupt header, or a type newer "
                             f"than that package")
    if min(t.ne) < 1:
        raise ModelLoadError(f"{where} has dimensions {list(t.ne)}; expected every one >= 1")
    name, block, block_bytes = types[t.type_id]
    if t.ne[0] % block:
        raise ModelLoadError(f"{where} is {name} with ne[0]={t.ne[0]}, not a multiple of its block "
                             f"size {block}: corrupt header")
    return math.prod(t.ne) // block * block_bytes


def _bytes(n: int) -> str:
    return f"{n} byte" if n == 1 else f"{n} bytes"


def _align(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment
