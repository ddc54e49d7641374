"""Saved KV caches: `cache.save(path)` and `Engine.load_cache(path)`.

One safetensors file (docs/KV_CACHE.md "Saved caches"): per layer the K and V
rows of the positions it holds, in position order, as the cache stores them:
an f16 section as float16 (n, n_kv_heads, head_dim) (`layer.<l>.k`,
`layer.<l>.v`), a quantized one (docs/KV_QUANT.md) as its uint8 data rows
(n, data row bytes) and parameter rows (`layer.<l>.k_params`, ...), so a
quantized cache stays quantized on disk and comes back bit for bit. In
`__metadata__` (strings, as the format wants): the format name and version,
the model fingerprint, each layer's K and V formats and the rotation, the
cache's shape (layers, heads, head_dim, windows, capacity), its length, the
first position each layer holds, the token ids and chat messages (JSON), and a
SHA-256 of the data section. Rows are stored by position, not by block, so a
file does not depend on the pool it came from or on the block size.

A cache with an eviction policy (kv_policy; version 3) keeps its evicting
layers by index instead: `layer.<l>.k`/`v` (and params) hold the rows of its
count indices in index order, `layer.<l>.positions` (n_kv_heads, count)
uint32 the position each index holds per KV head, `layer.<l>.scores` the
policy's float32 scores (a scoring policy); `kv_policy` in the metadata (the
policy's options with its budget and prompt mode; files before them: the budget
is `capacity`, prompts streamed), `counts` per layer. It comes
back with the same budget, kept tokens, positions and scores.

A cache with a residual window (kv_residual) also keeps, per layer that has
one, its ring's f16 rows (`layer.<l>.ring_k`, `ring_v`: positions
ring_first[l] .. length - 1, `ring_first` in the metadata, -1 for none), so
it comes back with its window; a q2 K section's rows stop at the last whole
block (the rest of its K is in the ring until its block is full).

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
from .kv_options import KV_FORMATS
from .models.progress import progress_bar

FORMAT = "metalkv-kv-cache"
# 3: an eviction policy's layers by index (written only for such a cache); 2: per-layer
# KV formats, rows as stored; 1: f16 rows only
VERSION = 3
READABLE_VERSIONS = (1, 2, 3)  # every version this reader understands; a new one adds its reader


def _held(cache, layer: int) -> int:
    """The first position the layer holds (it holds one run up to its length)."""
    pos = np.asarray(cache.positions(layer))
    slots = np.flatnonzero(pos >= 0)
    order = slots[np.argsort(pos[slots], kind="stable")]
    held = pos[order]
    n = cache.length(layer)
    first = int(held[0]) if len(held) else n
    if len(held) != n - first or (len(held) and int(held[-1]) != n - 1):
        raise CacheFileError(f"[cache_file] layer {layer} holds positions that are not one run ending at "
                             f"{n - 1}; cannot save it")
    return first


B = 32  # tokens a KV block holds (metalkv._core.BLOCK_TOKENS): a q2 K block is quantized whole


def _rows_held(cache, layer: int, kv: int, first: int, length: int) -> int:
    """Rows of section kv kept in the file from `first`: all of them, q2 K's up to its last whole block."""
    if kv == 0 and cache.formats(layer)[0] == "q2":
        return max(0, length // B * B - first)
    return length - first


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
    tensors, firsts, formats, rings, counts = {}, [], [], [], []
    shape = (cache.n_kv_heads, cache.head_dim)
    for layer in progress_bar(range(cache.n_layers), desc="saving the KV cache", unit="layer"):
        counts.append(cache.count(layer))
        if cache.evicts(layer):  # by index: the rows, and the position each index holds per head
            _save_by_index(cache, layer, tensors, shape)
            firsts.append(0)
            formats.append(list(cache.formats(layer)))
            rings.append(-1)
            continue
        first = _held(cache, layer)
        length = cache.length(layer)
        firsts.append(first)
        formats.append(list(cache.formats(layer)))
        ring_first = cache.ring_lo(layer) if cache.has_ring(layer) else -1
        if ring_first >= 0 and _rows_held(cache, layer, 0, first, length) + first < min(ring_first, length):
            raise CacheFileError(f"[cache_file] layer {layer}'s q2 K rows of positions from "
                                 f"{length // B * B} are neither in a whole block nor in the ring (it holds "
                                 f"{ring_first}..); cannot save it")
        rings.append(ring_first)
        if ring_first >= 0:
            k, v = cache.read_ring(layer, ring_first, length - ring_first)
            tensors[f"layer.{layer}.ring_k"] = np.asarray(k).view(np.float16)
            tensors[f"layer.{layer}.ring_v"] = np.asarray(v).view(np.float16)
        for kv, name in enumerate(("k", "v")):
            n = _rows_held(cache, layer, kv, first, length)
            data, params = (np.asarray(a) for a in cache.read_rows(layer, kv, first, n))
            if formats[-1][kv] == "f16":
                tensors[f"layer.{layer}.{name}"] = data.view(np.float16).reshape((n,) + shape)
            else:
                tensors[f"layer.{layer}.{name}"] = data
                tensors[f"layer.{layer}.{name}_params"] = params
    evicting = any(cache.evicts(layer) for layer in range(cache.n_layers))
    data = b"".join(t.tobytes() for t in tensors.values())
    meta = {
        "format": FORMAT, "format_version": str(VERSION if evicting else 2), "model_fingerprint": fingerprint,
        "kv_formats": json.dumps(formats), "kv_rotate": json.dumps(any(cache.rotated(l) for l in range(cache.n_layers))),
        "kv_residual": str(cache.residual), "ring_first": json.dumps(rings),
        "n_layers": str(cache.n_layers), "n_kv_heads": str(cache.n_kv_heads), "head_dim": str(cache.head_dim),
        "windows": json.dumps(list(cache.windows)), "capacity": str(cache.capacity),
        "length": str(lengths.pop()), "first_positions": json.dumps(firsts),
        "tokens": json.dumps(list(cache.tokens)), "messages": json.dumps(cache.messages),
        "data_sha256": hashlib.sha256(data).hexdigest(),
    }
    if evicting:  # version 3 (a file without them stays readable by version-2 readers)
        meta.update(kv_policy=json.dumps(cache.policy_options), counts=json.dumps(counts))
    header, offset = {"__metadata__": meta}, 0
    for name, t in tensors.items():
        dtype = {np.dtype(np.float16): "F16", np.dtype(np.float32): "F32", np.dtype(np.uint32): "U32"}.get(t.dtype, "U8")
        header[name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + t.nbytes]}
        offset += t.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # the data section 8-byte aligned
    write_atomically(pathlib.Path(path), [len(blob).to_bytes(8, "little"), blob, data])


def _save_by_index(cache, layer: int, tensors: dict, shape: tuple) -> None:
    n = cache.count(layer)
    for kv, name in enumerate(("k", "v")):
        data, params = (np.asarray(a) for a in cache.read_rows(layer, kv, 0, n, by_index=True))
        if cache.formats(layer)[kv] == "f16":
            tensors[f"layer.{layer}.{name}"] = data.view(np.float16).reshape((n,) + shape)
        else:
            tensors[f"layer.{layer}.{name}"] = data
            tensors[f"layer.{layer}.{name}_params"] = params
    tensors[f"layer.{layer}.positions"] = np.array([cache.kept_positions(layer, h) for h in range(shape[0])],
                                                   np.uint32).reshape(shape[0], n)
    scores = cache.scores(layer)
    if scores is not None:
        tensors[f"layer.{layer}.scores"] = np.ascontiguousarray(np.asarray(scores)[:, :n], np.float32)


def write_atomically(path: pathlib.Path, parts: list[bytes]) -> None:
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
    from .models.safetensors_loader import CACHE_DTYPES, read_safetensors, _read_header

    try:
        size = os.path.getsize(path)
        header, start = _read_header(path, size)
        tensors = {name: arr for name, (_, arr) in read_safetensors(path, CACHE_DTYPES).items()}
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


def _check_meta(meta: dict, path: str) -> int:
    """The file's format version, once its metadata says it is a cache this metalkv reads."""
    if meta.get("format") != FORMAT:
        raise CacheFileError(f"[cache_file] {path} is not a metalkv cache file (format {meta.get('format')!r})")
    version = _field(meta, "format_version", path)
    if version not in READABLE_VERSIONS:
        raise CacheFileError(f"[cache_file] {path} has format version {version}; this metalkv reads versions "
                             f"{', '.join(map(str, READABLE_VERSIONS))} (a newer metalkv wrote it)")
    return version


def check_file(path: str | os.PathLike) -> dict:
    """The metadata of the cache saved at `path`, read from its header alone (the data is
    checked when it is loaded): CacheFileError when it is missing, unreadable or not a
    cache this metalkv reads. The CLI runs it before the model loads (--load-cache)."""
    from .models import ModelLoadError
    from .models.safetensors_loader import _read_header

    path = str(path)
    try:
        header, _ = _read_header(path, os.path.getsize(path))
    except ModelLoadError as e:
        raise CacheFileError(str(e).replace("[safetensors]", "[cache_file]", 1)) from None
    except OSError as e:
        raise CacheFileError(f"[cache_file] {path}: {e.strerror or e}") from None
    meta = header.get("__metadata__", {})
    _check_meta(meta, path)
    return meta


def load_cache(engine, path: str | os.PathLike):
    """The cache saved at `path`, on `engine`, as it was (see Engine.load_cache)."""
    path = str(path)
    meta, tensors, data = _read(path)
    version = _check_meta(meta, path)
    if hashlib.sha256(data).hexdigest() != meta.get("data_sha256"):
        raise CacheFileError(f"[cache_file] {path}: the data does not match its SHA-256: the file is corrupt")
    return _load(engine, path, meta, tensors, version)


def _formats(meta: dict, path: str, version: int, n_layers: int) -> tuple[list[list[str]], bool]:
    """Each layer's [K, V] format and the rotation the file was saved with."""
    if version == 1:
        if meta.get("kv_format") != "f16":
            raise CacheFileError(f"[cache_file] {path} holds a {meta.get('kv_format')!r} cache; version 1 files "
                                 f"hold f16 caches only: corrupt file")
        return [["f16", "f16"]] * n_layers, False
    formats = _field(meta, "kv_formats", path, json.loads)
    rotate = _field(meta, "kv_rotate", path, json.loads)
    if not (isinstance(formats, list) and len(formats) == n_layers and isinstance(rotate, bool) and
            all(isinstance(f, list) and len(f) == 2 and all(x in KV_FORMATS for x in f) for f in formats)):
        raise CacheFileError(f"[cache_file] {path}: kv_formats {meta['kv_formats']} is not a [K, V] pair of "
                             f"{', '.join(KV_FORMATS)} per layer: corrupt file")
    return formats, rotate


def _load(engine, path: str, meta: dict, tensors: dict[str, np.ndarray], version: int):
    if meta.get("model_fingerprint") != engine.fingerprint:
        raise CacheFileError(f"[cache_file] {path} was saved from another model (fingerprint "
                             f"{meta.get('model_fingerprint')}, this engine's {engine.fingerprint})")
    capacity = _field(meta, "capacity", path)
    length = _field(meta, "length", path)
    cfg = engine.config
    for name, want in {"n_layers": engine.n_kv_layers, "n_kv_heads": cfg.n_kv_heads, "head_dim": cfg.head_dim}.items():
        if _field(meta, name, path) != want:
            raise CacheFileError(f"[cache_file] {path}: {name} {meta[name]}, this engine's caches have {want}")
    formats, rotate = _formats(meta, path, version, engine.n_kv_layers)
    try:
        # the residual window's f16 rows are not saved: the loaded cache reads its rows from the pool
        residual = _field(meta, "kv_residual", path) if "kv_residual" in meta else 0
        policy = _policy(meta, path)
        cache = engine.new_cache(capacity=max(capacity, 1), kv_k=[f[0] for f in formats],
                                 kv_v=[f[1] for f in formats], kv_f16_layers=(), kv_rotate=rotate,
                                 kv_residual=residual, **policy)
    except ValueError as e:  # a shared pool of other formats
        raise CacheFileError(f"[cache_file] {path} holds a cache of other KV formats than this engine's shared "
                             f"pool ({e}); load it into an engine made with kv_memory=None or its formats") from None
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
    counts = _field(meta, "counts", path, json.loads) if "counts" in meta else [length] * cache.n_layers
    if not isinstance(counts, list) or len(counts) != cache.n_layers or \
            not all(isinstance(c, int) and 0 <= c <= min(length, cache.capacity) for c in counts):
        raise CacheFileError(f"[cache_file] {path}: counts {counts!r} is not one count <= length per layer")
    kept = [_kept(tensors, path, cache, layer, counts[layer]) if cache.evicts(layer) else None
            for layer in range(cache.n_layers)]
    for layer, k in enumerate(kept):  # an evicting layer's rows are by index: its first `count` "positions"
        if k is not None:
            firsts[layer] = 0
    rows = [[_rows(tensors, path, cache, layer, kv, counts[layer] if kept[layer] is not None else
                   _rows_held(cache, layer, kv, first, length)) for kv in (0, 1)]
            for layer, first in enumerate(firsts)]
    rings = _rings(meta, tensors, path, cache, length) if "ring_first" in meta else []
    cache.begin_at(firsts)
    # Chunk by chunk through every layer, so the layers of a sliding group move
    # together: an append makes room (its rows are then overwritten with the
    # saved bytes, nothing requantized).
    step = cache.max_chunk
    zeros = np.zeros((step, cache.n_kv_heads, cache.head_dim), np.float32)
    ends = [counts[layer] if kept[layer] is not None else length for layer in range(cache.n_layers)]
    for c in progress_bar(range(min(firsts), length, step), desc="loading the KV cache", unit="chunk"):
        for layer, first in enumerate(firsts):
            lo, hi = max(c, first), min(c + step, ends[layer])
            if lo < hi:
                cache.append(layer, zeros[:hi - lo], zeros[:hi - lo])
                for kv, (data, params) in enumerate(rows[layer]):
                    end = min(hi, first + len(data))  # q2 K: whole blocks only
                    if lo < end:
                        cache.write_rows(layer, kv, lo, data[lo - first:end - first], params[lo - first:end - first])
    for layer, k in enumerate(kept):
        if k is not None:
            cache.set_kept(layer, length, *k)
    for layer, (ring_first, k, v) in enumerate(rings):
        if ring_first >= 0:
            cache.write_ring(layer, ring_first, k, v)
    cache.record_tokens(tokens)
    cache.messages = messages
    return cache


def _policy(meta: dict, path: str) -> dict:
    """new_cache's eviction keywords of the saved cache (none: kv_policy=None, whatever the engine's)."""
    opts = _field(meta, "kv_policy", path, json.loads) if "kv_policy" in meta else None
    if opts is None:
        return dict(kv_policy="none")
    if not isinstance(opts, dict) or not {"policy", "sinks", "recent", "window"} <= opts.keys():
        raise CacheFileError(f"[cache_file] {path}: kv_policy {meta['kv_policy']} is not a policy's options")
    from . import _core

    observes = _core.KV_POLICY_TRAITS.get(opts["policy"], {}).get("observes", True)  # (an unknown name: refused)
    return dict(kv_policy=opts["policy"], kv_budget=opts.get("budget", _field(meta, "capacity", path)),
                kv_sinks=opts["sinks"], kv_recent=None if opts["recent"] < 0 else opts["recent"],
                kv_window=opts["window"] if observes else None, kv_prompt=opts.get("prompt", "stream"))


def _kept(tensors: dict, path: str, cache, layer: int, count: int) -> tuple:
    """An evicting layer's (positions, scores) as saved."""
    want = (cache.n_kv_heads, count)
    pos, scores = tensors.get(f"layer.{layer}.positions"), tensors.get(f"layer.{layer}.scores")
    if pos is None or pos.shape != want:
        raise CacheFileError(f"[cache_file] {path}: layer {layer}'s positions are missing or not {want}: corrupt file")
    if scores is not None and scores.shape != want:
        raise CacheFileError(f"[cache_file] {path}: layer {layer}'s scores are not {want}: corrupt file")
    return (np.ascontiguousarray(pos, np.uint32),
            None if scores is None else np.ascontiguousarray(scores, np.float32))


def _rings(meta: dict, tensors: dict, path: str, cache, length: int) -> list:
    """Per layer (ring_first, k, v): the window's saved f16 rows as uint16 (-1, None, None: none)."""
    firsts = _field(meta, "ring_first", path, json.loads)
    if not isinstance(firsts, list) or len(firsts) != cache.n_layers or \
            not all(isinstance(f, int) and -1 <= f <= length for f in firsts):
        raise CacheFileError(f"[cache_file] {path}: ring_first {meta['ring_first']} is not one position <= "
                             f"length {length} (or -1) per layer: corrupt file")
    out = []
    for layer, first in enumerate(firsts):
        if first < 0 or not cache.has_ring(layer):
            out.append((-1, None, None))
            continue
        want = (length - first, cache.n_kv_heads, cache.head_dim)
        kv = [tensors.get(f"layer.{layer}.ring_{x}") for x in "kv"]
        if any(t is None or t.dtype != np.float16 or t.shape != want for t in kv):
            raise CacheFileError(f"[cache_file] {path}: layer {layer}'s ring rows are missing or not float16 "
                                 f"{want}: corrupt file")
        out.append((first, *(np.ascontiguousarray(t).view(np.uint16) for t in kv)))
    return out


def _rows(tensors: dict, path: str, cache, layer: int, kv: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """The saved (data rows, parameter rows) uint8 of one section, checked against the cache's layout."""
    name = f"layer.{layer}.{'kv'[kv]}"
    fmt = cache.formats(layer)[kv]
    data_row, param_row = cache.row_bytes(layer, kv)
    if fmt == "f16":
        t = tensors.get(name)
        want = (n, cache.n_kv_heads, cache.head_dim)
        if t is None or t.dtype != np.float16 or t.shape != want:
            got = "missing" if t is None else f"{t.dtype} {t.shape}"
            raise CacheFileError(f"[cache_file] {path}: tensor {name} is {got}; expected float16 {want}")
        return np.ascontiguousarray(t).view(np.uint8).reshape(n, data_row), np.zeros((n, 0), np.uint8)
    out = []
    for tname, width in ((name, data_row), (name + "_params", param_row)):
        t = tensors.get(tname)
        if t is None or t.dtype != np.uint8 or t.shape != (n, width):
            got = "missing" if t is None else f"{t.dtype} {t.shape}"
            raise CacheFileError(f"[cache_file] {path}: tensor {tname} is {got}; expected uint8 {(n, width)} "
                                 f"({fmt} rows)")
        out.append(np.ascontiguousarray(t))
    return out[0], out[1]
