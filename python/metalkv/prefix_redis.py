"""The prefix store's shared tier in Redis (metalkv.prefix_store): entries are the disk
tier's bytes under `metalkv:<namespace>:<hash>`, so servers on several machines that
point at one Redis share the prefixes any of them computed, with the same checks on
every read (another model's or format's namespace is never read; a damaged entry is
refused and deleted).

Redis owns its memory: give it a `maxmemory` and `maxmemory-policy allkeys-lru`, and it
drops the least recently used prefixes itself (docs/KV_CACHE.md). A Redis that cannot be
reached is never a failed request: the tier says so once (a warning), counts the error,
is skipped for RETRY_SECONDS, then tried again; the host and disk tiers go on.
"""
from __future__ import annotations

import threading
import time
import warnings

from .errors import MetalkvWarning

RETRY_SECONDS = 10.0
TIMEOUT_SECONDS = 2.0
READ_BYTES = 1 << 20  # a socket read: an entry is megabytes (redis-py's 64 KiB reads cost a third
                      # of the rate with eight readers; measured 780 -> 1,170 MB/s on a 2-core host)


class RedisTier:
    def __init__(self, url: str, namespace: str, stats):
        try:
            import redis
        except ImportError as e:
            raise ImportError("the prefix store's Redis tier needs the redis package: "
                              "pip install 'redis[hiredis]'") from e
        self.url = url
        self.prefix = f"metalkv:{namespace}:"
        self.stats = stats
        self._errors = redis.exceptions.RedisError, OSError
        self._client = redis.Redis.from_url(url, socket_timeout=TIMEOUT_SECONDS,
                                            socket_connect_timeout=TIMEOUT_SECONDS,
                                            socket_read_size=READ_BYTES)
        self._down_until = 0.0
        self._warned = False
        self._lock = threading.Lock()

    def _key(self, h: int) -> str:
        return f"{self.prefix}{h:016x}"

    def _call(self, fn, *args):
        """fn(*args) on the client, or None while Redis is down (said once)."""
        if time.monotonic() < self._down_until:
            return None
        try:
            return fn(*args)
        except self._errors as e:
            with self._lock:
                self.stats["redis_errors"] += 1
                self._down_until = time.monotonic() + RETRY_SECONDS
                if not self._warned:
                    self._warned = True
                    warnings.warn(f"the prefix store's Redis at {self.url} failed ({e}); going on with the local "
                                  f"tiers, trying it again every {RETRY_SECONDS:.0f} s", MetalkvWarning, stacklevel=3)
            return None

    def get(self, h: int) -> bytes | None:
        return self._call(self._client.get, self._key(h))

    def has(self, h: int) -> bool:
        return bool(self._call(self._client.exists, self._key(h)))

    def put(self, h: int, blob: bytes) -> None:
        self._call(self._client.set, self._key(h), blob)

    def delete(self, h: int) -> None:
        self._call(self._client.delete, self._key(h))
