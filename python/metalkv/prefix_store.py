"""Prefix blocks beyond the device pool: a host-memory tier and a disk tier under the
engine's prefix cache (docs/KV_CACHE.md, "Prefix store").

    store = PrefixStore(engine, "/var/cache/metalkv", disk_bytes="20GB", host_bytes="2GB",
                        redis="redis://cache-host:6379/0")           # (the Redis tier is optional)
    store.warm(ids)    # before a call: the prompt's blocks found in a tier go back to the pool
    store.save(ids)    # after it: the prompt's blocks the tiers lack are written to them

A block is the prefix cache's unit: 32 positions' K and V rows in every layer, keyed by
the chain hash of every token up to its end (_core.prefix_hashes, the device cache's own
key), so a key names a whole prefix, and each entry also carries its 32 token ids and its
parent's hash, checked on every read: a hash collision can never hand out another
prefix's rows. Only the prefix cache's blocks are stored: rows a prefill computed, which
are the same bits however the prompt was cut into chunks, so a call that takes them back
gets the reply it would get computing them.

An entry is a block's record: its rows in every layer as the pool holds them, in the
pool's formats (kv/prefix_cache.h). `warm` reads the longest run of the prompt's blocks
the tiers hold (host first) and puts them into the device prefix cache (the engine's
import_prefix: fresh blocks, written, registered, evictable); the call then takes them as
any cached prefix. `save` reads the records of the prompt's cached blocks back from the
device (export_prefix) and writes each block the tiers lack.

Disk: one file per block, `<dir>/<namespace>/<hash>.blk`, where the namespace is a hash
of the model's fingerprint, each layer's KV formats, the rotation, the shapes and this
format's version: another model or another cache format never reads them. Files are
written atomically (a temporary file, fsynced, renamed), so processes may share a
directory; an entry that fails its checks (magic, header, SHA-256 of the data, tokens,
parent) is refused, deleted, and counted in `stats["corrupt"]`. The directory is kept
under disk_bytes by deleting the least recently used files (their modification time is
touched on each hit). The host tier is a dict in this process under host_bytes, least
recently used first out. With `redis=URL` the entries also go to a Redis (metalkv.prefix_redis),
shared by every server pointed at it.

With a residual window (q4 and q2 caches by default) a record also carries the block's
window rows in f16 (kv/prefix_rows.h), which a call taking the prefix reads into its ring.
Not stored: caches with sliding-window layers or an eviction policy (their layers do not
keep every block of a prefix, or rewrite them).
"""
from __future__ import annotations

import collections
import concurrent.futures
import hashlib
import json
import os
import pathlib
import re
import struct
import threading
import time

import numpy as np

from . import _core
from .cache_file import write_atomically
from .errors import ArgumentError, argument_error

MAGIC = b"MKVB"
VERSION = 2  # 2: a block's record as the pool holds it (1: rows as read_rows gave them)
READERS = min(8, os.cpu_count() or 1)  # threads that read and check a prompt's entries
IMPORT_BLOCKS = 16  # warm() puts the blocks read into the pool in runs of this many, as they come
B = 32  # the pool's block: _core.BLOCK_TOKENS


class PrefixStore:
    def __init__(self, engine, directory: str | os.PathLike | None = None, *, disk_bytes: int | str = "20GB",
                 host_bytes: int | str = "1GB", redis: str | None = None):
        if engine.kv_pool is None:
            raise ArgumentError("[prefix_store] the engine has no shared KV pool (kv_memory=None): there is no "
                                "prefix cache to keep blocks of")
        probe = engine.new_cache(capacity=B)
        if any(probe.windows):
            raise ArgumentError("[prefix_store] this engine's caches have sliding-window layers, which do not "
                                "keep every block of a prefix: not supported")
        self.engine = engine
        engine.prefix_store = self  # (Engine.memory() reports its tiers)
        self.residual = probe.residual  # (its chains' root; the records carry window rows)
        self.record_bytes = engine._core.prefix_record_bytes(self.residual)  # one block, every layer
        layers = range(probe.n_layers)
        ident = {"version": VERSION, "model": engine.fingerprint, "formats": [list(probe.formats(l)) for l in layers],
                 "rotate": [bool(probe.rotated(l)) for l in layers],
                 "shape": [probe.n_layers, probe.n_kv_heads, probe.head_dim], "block": B}
        if self.residual:
            ident["residual"] = self.residual
        self.namespace = hashlib.sha256(json.dumps(ident, sort_keys=True).encode()).hexdigest()[:16]
        self.dir = pathlib.Path(directory) / self.namespace if directory is not None else None
        if self.dir is not None:
            self.dir.mkdir(parents=True, exist_ok=True)
        self.disk_bytes, self.host_bytes = check_size(disk_bytes, "disk_bytes"), check_size(host_bytes, "host_bytes")
        self._host: collections.OrderedDict[int, bytes] = collections.OrderedDict()
        self._host_used = 0
        self._lock = threading.Lock()
        self.stats = collections.Counter()  # loaded_<tier> (tokens), saved (blocks), corrupt, redis_errors,
        #                                     import_seconds (warm's writes into the pool), ...
        self.redis = None
        if redis is not None:
            from .prefix_redis import RedisTier

            self.redis = RedisTier(redis, self.namespace, self.stats)

    # ---- entries --------------------------------------------------------------------
    def _path(self, h: int) -> pathlib.Path:
        return self.dir / f"{h:016x}.blk"

    @staticmethod
    def _encode(h: int, parent: int, tokens: list[int], record: bytes) -> bytes:
        header = json.dumps({"hash": h, "parent": parent, "tokens": tokens,
                             "sha256": hashlib.sha256(record).hexdigest()}).encode()
        return MAGIC + struct.pack("<II", VERSION, len(header)) + header + record

    def _decode(self, blob: bytes, h: int, parent: int, tokens: list[int]) -> memoryview | None:
        """The entry's record, or None when it is not this block's, or is damaged."""
        try:
            if blob[:4] != MAGIC:
                return None
            version, n = struct.unpack("<II", blob[4:12])
            header = json.loads(blob[12:12 + n])
            record = memoryview(blob)[12 + n:]  # (no copy: a record is megabytes)
            if version != VERSION or len(record) != self.record_bytes:
                return None
            if header["hash"] != h or header["parent"] != parent or header["tokens"] != tokens:
                return None
            if hashlib.sha256(record).hexdigest() != header["sha256"]:
                return None
        except (ValueError, KeyError, TypeError, struct.error):
            return None
        return record

    def _host_put(self, h: int, blob: bytes) -> None:
        if len(blob) > self.host_bytes:
            return
        old = self._host.pop(h, None)
        self._host_used -= len(old) if old else 0
        self._host[h] = blob
        self._host_used += len(blob)
        while self._host_used > self.host_bytes:
            _, dropped = self._host.popitem(last=False)
            self._host_used -= len(dropped)

    def _get(self, h: int, parent: int, tokens: list[int]) -> tuple[memoryview, str] | None:
        """A block's record and the tier that had it (host, then disk, then Redis)."""
        with self._lock:
            blob = self._host.get(h)
            if blob is not None:
                self._host.move_to_end(h)
                record = self._decode(blob, h, parent, tokens)
                if record is not None:
                    return record, "host"
                self._host_used -= len(self._host.pop(h))
        for tier in ("disk", "redis"):
            if tier == "disk" and self.dir is not None:
                try:
                    blob = self._path(h).read_bytes()
                except OSError:
                    continue
            elif tier == "redis" and self.redis is not None:
                blob = self.redis.get(h)
                if blob is None:
                    continue
            else:
                continue
            record = self._decode(blob, h, parent, tokens)
            if record is None:  # damaged, or another prefix's (a collision): never used
                self.stats["corrupt"] += 1
                if tier == "disk":
                    self._path(h).unlink(missing_ok=True)
                else:
                    self.redis.delete(h)
                continue
            if tier == "disk":
                os.utime(self._path(h))  # recently used
            with self._lock:
                self._host_put(h, blob)
            return record, tier
        return None

    def _present(self, h: int) -> bool:
        """Whether some tier has an entry for the block (not yet checked)."""
        with self._lock:
            if h in self._host:
                return True
        if self.dir is not None and self._path(h).exists():
            return True
        return self.redis is not None and self.redis.has(h)

    def _has(self, h: int) -> bool:
        """Whether every tier that should hold the block does (the host's: any)."""
        with self._lock:
            if h in self._host:
                return True
        if self.dir is None and self.redis is None:
            return False  # (a host-only store: its one tier lacks it)
        if self.dir is not None and not self._path(h).exists():
            return False
        return self.redis is None or self.redis.has(h)

    # ---- warm: the tiers into the device pool -----------------------------------------
    def warm(self, ids) -> int:
        """Puts the prompt's longest run of blocks the tiers hold into the device prefix
        cache (as much as a call could take: up to two tokens before the prompt's end).
        The tokens the device cache holds for the prompt afterwards."""
        ids = [int(i) for i in ids]
        usable = max(len(ids) - 2, 0) // B * B
        have = self.engine._core.cached_prefix(ids[:usable], self.residual)
        hashes = _core.prefix_hashes(ids[:usable], self.residual)
        # Each block read and checked in a thread of its own (file reads and SHA-256 let
        # the GIL go): in order, up to the first block no tier has.
        run = 0
        while run < len(hashes) and self._present(hashes[run]):
            run += 1
        if run * B <= have:
            return have
        got, tiers, now = [], [], have
        with concurrent.futures.ThreadPoolExecutor(min(READERS, run)) as pool:
            found = pool.map(lambda i: self._get(hashes[i], hashes[i - 1] if i else 0, ids[i * B:(i + 1) * B]),
                             range(run))
            for f in found:  # (in order, as the readers finish them)
                if f is None:
                    break
                got.append(np.frombuffer(f[0], np.uint8))
                tiers.append(f[1])
                if len(got) % IMPORT_BLOCKS == 0:  # into the pool while the readers go on
                    now = self._import(ids, got)
                    if now < len(got) * B:
                        break  # (no room for more)
            pool.shutdown(cancel_futures=True)  # (after a break: the reads not yet begun)
        if len(got) * B <= have:
            return have
        if len(got) % IMPORT_BLOCKS:
            now = self._import(ids, got)
        if now < len(got) * B:  # the pool had no room for all of them: the call computes the rest
            self.stats["warm_short"] += 1
        for i, tier in enumerate(tiers):
            if have < (i + 1) * B <= now:
                self.stats[f"loaded_{tier}"] += B
        return now

    def _import(self, ids: list[int], got: list) -> int:
        """The blocks read so far into the device prefix cache (those it has are skipped)."""
        t = time.perf_counter()
        now = self.engine._core.import_prefix(ids[:len(got) * B], got, self.residual)
        self.stats["import_seconds"] += time.perf_counter() - t
        return now

    # ---- save: the device pool into the tiers --------------------------------------------
    def save(self, ids) -> int:
        """Writes the prompt's blocks the device prefix cache holds and the tiers lack;
        the number written."""
        ids = [int(i) for i in ids]
        usable = max(len(ids) - 2, 0) // B * B
        core = self.engine._core
        hashes = _core.prefix_hashes(ids[:usable], self.residual)
        if all(self._has(h) for h in hashes[:core.cached_prefix(ids[:usable], self.residual) // B]):
            return 0
        records = core.export_prefix(ids[:usable], self.residual)
        missing = [i for i in range(len(records)) if not self._has(hashes[i])]
        for i in missing:
            blob = self._encode(hashes[i], hashes[i - 1] if i else 0, ids[i * B:(i + 1) * B], records[i])
            with self._lock:
                self._host_put(hashes[i], blob)
            if self.dir is not None:
                write_atomically(self._path(hashes[i]), [blob])
            if self.redis is not None:
                self.redis.put(hashes[i], blob)
        self.stats["saved"] += len(missing)
        if self.dir is not None and missing:
            self._trim()
        return len(missing)

    def _trim(self) -> None:
        """The directory back under disk_bytes: least recently used files out."""
        entries = []
        for p in self.dir.glob("*.blk"):
            try:
                st = p.stat()
            except OSError:
                continue
            entries.append((st.st_mtime, st.st_size, p))
        total = sum(e[1] for e in entries)
        for _, size, p in sorted(entries, key=lambda e: e[0]):
            if total <= self.disk_bytes:
                break
            p.unlink(missing_ok=True)
            total -= size
            self.stats["evicted_disk"] += 1

    def tiers(self) -> dict:
        """What each tier holds now: blocks and bytes."""
        out = {"host": {"blocks": len(self._host), "bytes": self._host_used, "max_bytes": self.host_bytes}}
        if self.dir is not None:
            sizes = [p.stat().st_size for p in self.dir.glob("*.blk")]
            out["disk"] = {"blocks": len(sizes), "bytes": sum(sizes), "max_bytes": self.disk_bytes,
                           "directory": str(self.dir)}
        if self.redis is not None:
            out["redis"] = {"url": self.redis.url, "errors": self.stats["redis_errors"]}
        return out


_UNITS = {"": 1, "b": 1, "kb": 1e3, "mb": 1e6, "gb": 1e9, "tb": 1e12, "kib": 2**10, "mib": 2**20, "gib": 2**30,
          "tib": 2**40}


def check_size(value, name: str) -> int:
    """Bytes: an int >= 0, or a size such as '20GB' or '512MiB' (as kv_memory takes them)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    m = re.fullmatch(r"\s*(\d+(?:\.\d*)?)\s*([a-zA-Z]*)\s*", value) if isinstance(value, str) else None
    if m is None or m.group(2).lower() not in _UNITS:
        raise argument_error("prefix_store", name, value, "an int (bytes) or a size such as '20GB' or '512MiB'")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])
