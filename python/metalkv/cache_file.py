"""Saved KV caches: `cache.save(path)` and `Engine.load_cache(path)`.

One safetensors file (docs/KV_CACHE.md "Saved caches"): per layer the K and V
rows of the positions it holds, in position order (`layer.<l>.k`, `layer.<l>.v`,
float16 (n, n_kv_heads, head_dim)), and in `__metadata__` (strings, as the
format wants): the format name and version, the model fingerprint, the KV
format, the cache's shape (layers, heads, head_dim, windows, capacity), its
length, the first position each layer holds, the token ids and chat messages
(JSON), and a SHA-256 of the data section. Rows are stored by position, not by
block, so a file does not depend on the pool it came from or on the block size.

Written atomically: a temporary file in the same directory, flushed and
fsynced, then renamed over the target (and the directory fsynced), so a
crash leaves the old file or the new one, never half of one.
"""
from __future__ import annotations

import hashlib
import json
import os
import pathlib
import tempfile

import numpy as np

from .errors import CacheFileError

FORMAT = "metalkv-kv-cache"
VERSION = 1
READABLE_VERSIONS = (1,)  # every version this reader understands; a new one adds its reader


def _held_rows(cache, layer: int) -> tuple[int, np.ndarray, np.ndarray]:
    """(first position, K, V) of the positions the layer holds, in order."""
    pos = np.asarray(cache.positions(layer))
    slots = np.flatnonzero(pos >= 0)
    order = slots[np.argsort(pos[slots], kind="stable")]
    held = pos[order]
    n = cache.length(layer)
    first = int(held[0]) if len(held) else n
    if len(held) != n - first or (len(held) and int(held[-1]) != n - 1):
        raise CacheFileError(f"[cache_file] layer {layer} holds positions that are not one run ending at "
                             f"{n - 1}; cannot save it")
    keys, values = np.asarray(cache.keys(layer)), np.asarray(cache.values(layer))
    return first, np.ascontiguousarray(keys[order]), np.ascontiguousarray(values[order])


def save_cache(cache, path: str | os.PathLike) -> None:
    """Writes `cache` to `path` (see the module doc)."""
    fingerprint = cache.model_fingerprint
    if not fingerprint:
        raise CacheFileError("[cache_file] this cache was not made by an Engine (it has no model fingerprint); "
                             "save caches from engine.new_cache() or a generate call")
    lengths = {cache.length(l) for l in range(cache.n_layers)}
    if len(lengths) != 1:
        raise CacheFileError(f"[cache_file] the layers hold different lengths {sorted(lengths)}; a cache is saved "
                             f"between calls, when they are equal")
    tensors, firsts = {}, []
    for layer in range(cache.n_layers):
        first, k, v = _held_rows(cache, layer)
        firsts.append(first)
        tensors[f"layer.{layer}.k"], tensors[f"layer.{layer}.v"] = k, v
    data = b"".join(t.tobytes() for t in tensors.values())
    meta = {
        "format": FORMAT, "format_version": str(VERSION), "model_fingerprint": fingerprint, "kv_format": "f16",
        "n_layers": str(cache.n_layers), "n_kv_heads": str(cache.n_kv_heads), "head_dim": str(cache.head_dim),
        "windows": json.dumps(list(cache.windows)), "capacity": str(cache.capacity),
        "length": str(lengths.pop()), "first_positions": json.dumps(firsts),
        "tokens": json.dumps(list(cache.tokens)), "messages": json.dumps(cache.messages),
        "data_sha256": hashlib.sha256(data).hexdigest(),
    }
    header, offset = {"__metadata__": meta}, 0
    for name, t in tensors.items():
        header[name] = {"dtype": "F16", "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section 8-byte aligned
    _write_atomically(pathlib.Path(path), [len(blob).to_bytes(8, "little"), blob, data])


def _write_atomically(path: pathlib.Path, parts: list[bytes]) -> None:
    directory = path.parent if str(path.parent) else pathlib.Path(".")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
    try:
        with os.fdopen(fd, "wb") as f:
            for p in parts:
                f.write(p)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    try:  # the rename itself survives a crash once the directory is on disk
        dfd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(dfd)
        finally:
            os.close(dfd)
    except OSError:
        pass  # some filesystems refuse fsync on a directory; the data is already synced


def _read(path: str) -> tuple[dict, dict[str, np.ndarray], bytes]:
    """(metadata, tensors, data bytes); CacheFileError for anything that is not a
    well-formed safetensors file."""
    from .models import ModelLoadError
    from .models.safetensors_loader import read_safetensors, _read_header

    try:
        size = os.path.getsize(path)
        header, start = _read_header(path, size)
        tensors = {name: arr for name, (_, arr) in read_safetensors(path).items()}
    except ModelLoadError as e:
        raise CacheFileError(str(e).replace("[safetensors]", "[cache_file]", 1)) from None
    except OSError as e:
        raise CacheFileError(f"[cache_file] {path}: {e.strerror or e}") from None
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read()
    return header.get("__metadata__", {}), tensors, data


def _field(meta: dict, name: str, path: str, parse=int):
    if name not in meta:
        raise CacheFileError(f"[cache_file] {path}: the metadata has no {name!r}: corrupt or not a metalkv cache")
    try:
        return parse(meta[name])
    except (TypeError, ValueError) as e:
        raise CacheFileError(f"[cache_file] {path}: metadata {name}={meta[name]!r} does not parse ({e}): "
                             f"corrupt file") from None


def load_cache(engine, path: str | os.PathLike):
    """The cache saved at `path`, on `engine`, as it was (see Engine.load_cache)."""
    path = str(path)
    meta, tensors, data = _read(path)
    if meta.get("format") != FORMAT:
        raise CacheFileError(f"[cache_file] {path} is not a metalkv cache file (format {meta.get('format')!r})")
    version = _field(meta, "format_version", path)
    if version not in READABLE_VERSIONS:
        raise CacheFileError(f"[cache_file] {path} has format version {version}; this metalkv reads versions "
                             f"{', '.join(map(str, READABLE_VERSIONS))} (a newer metalkv wrote it)")
    if hashlib.sha256(data).hexdigest() != meta.get("data_sha256"):
        raise CacheFileError(f"[cache_file] {path}: the data does not match its SHA-256: the file is corrupt")
    return _load_v1(engine, path, meta, tensors)


def _load_v1(engine, path: str, meta: dict, tensors: dict[str, np.ndarray]):
    if meta.get("model_fingerprint") != engine.fingerprint:
        raise CacheFileError(f"[cache_file] {path} was saved from another model (fingerprint "
                             f"{meta.get('model_fingerprint')}, this engine's {engine.fingerprint})")
    if meta.get("kv_format") != "f16":
        raise CacheFileError(f"[cache_file] {path} holds a {meta.get('kv_format')!r} cache; this engine "
                             f"makes f16 caches")
    capacity = _field(meta, "capacity", path)
    length = _field(meta, "length", path)
    cache = engine.new_cache(capacity=max(capacity, 1))
    shape = {"n_layers": cache.n_layers, "n_kv_heads": cache.n_kv_heads, "head_dim": cache.head_dim}
    for name, want in shape.items():
        if _field(meta, name, path) != want:
            raise CacheFileError(f"[cache_file] {path}: {name} {meta[name]}, this engine's caches have {want}")
    if _field(meta, "windows", path, json.loads) != list(cache.windows):
        raise CacheFileError(f"[cache_file] {path}: layer windows {meta['windows']}, this engine's "
                             f"{list(cache.windows)}")
    firsts = _field(meta, "first_positions", path, json.loads)
    tokens = _field(meta, "tokens", path, json.loads)
    messages = _field(meta, "messages", path, json.loads)
    if not isinstance(firsts, list) or len(firsts) != cache.n_layers or \
            not all(isinstance(f, int) and 0 <= f <= length for f in firsts):
        raise CacheFileError(f"[cache_file] {path}: first_positions {firsts!r} is not one position <= length "
                             f"{length} per layer: corrupt file")
    rows = []
    for layer, first in enumerate(firsts):
        k, v = tensors.get(f"layer.{layer}.k"), tensors.get(f"layer.{layer}.v")
        want = (length - first, cache.n_kv_heads, cache.head_dim)
        for name, t in ((f"layer.{layer}.k", k), (f"layer.{layer}.v", v)):
            if t is None or t.dtype != np.float16 or t.shape != want:
                got = "missing" if t is None else f"{t.dtype} {t.shape}"
                raise CacheFileError(f"[cache_file] {path}: tensor {name} is {got}; expected float16 {want}")
        rows.append((k, v))
    cache.begin_at(firsts)
    # Chunk by chunk through every layer, so the layers of a sliding group move together.
    step = cache.max_chunk
    for c in range(min(firsts), length, step):
        for layer, first in enumerate(firsts):
            lo, hi = max(c, first), min(c + step, length)
            if lo < hi:
                k, v = rows[layer]
                cache.append(layer, k[lo - first:hi - first].astype(np.float32),
                             v[lo - first:hi - first].astype(np.float32))
    cache.record_tokens(tokens)
    cache.messages = messages
    return cache
