"""`GET /metrics`: the server in Prometheus' text format (prometheus_client), for a
scraper or a router that balances replicas on load.

Counted as calls end (each choice of a request is a call):
- metalkv_requests_total{finish_reason}: calls ended (stop, length, cancelled, ...);
- metalkv_prompt_tokens_total, metalkv_generation_tokens_total;
- metalkv_prompt_tokens_cached_total{tier}: prompt tokens taken from the prefix cache
  instead of computed (tier "device": the KV pool; the only tier so far);
- metalkv_time_to_first_token_seconds, metalkv_request_seconds: histograms of the time in
  the queue plus the prompt's, and of the whole call;
- metalkv_preemptions_total, metalkv_recomputed_tokens_total: times a call gave its KV
  blocks back for others and waited (optimistic admission, docs/BATCHING.md), and the
  tokens it fed again to resume.
Read at each scrape:
- metalkv_requests_running, metalkv_requests_waiting: calls in the engine's batch, and
  queued for room in it;
- metalkv_kv_blocks{window, state}: the shared KV pool's blocks per window group, by
  state (used by live caches, cached prefixes, reserved for calls' coming tokens, free);
  metalkv_kv_pool_bytes and metalkv_kv_pool_usage (the fraction not free);
  metalkv_kv_memory_bytes{kind}: kv_memory's cap (total), what is charged to it now (used:
  the pool and every running sequence's own buffers; sequences: theirs alone), its peak;
- with a prefix store (metalkv serve --prefix-store): metalkv_prefix_store_loaded_tokens_total
  {tier} (prompt tokens put back into the pool from the host, disk or Redis tier),
  metalkv_prefix_store_saved_blocks_total, metalkv_prefix_store_corrupt_entries_total,
  metalkv_prefix_store_redis_errors_total and metalkv_prefix_store_bytes{tier}.
"""
from __future__ import annotations

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

BUCKETS_TTFT = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
BUCKETS_CALL = (0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class _Live:
    """The gauges, read from the engine (and the prefix store) when scraped."""

    def __init__(self, engine, store=None):
        self.engine = engine
        self.store = store

    def collect(self):
        yield from self._store()
        core = self.engine._core
        yield GaugeMetricFamily("metalkv_requests_running", "Calls in the engine's batch.", value=core.running)
        yield GaugeMetricFamily("metalkv_requests_waiting", "Calls queued for room in the batch or the KV pool.",
                                value=core.queued)
        pool = self.engine.kv_pool
        if pool is None:  # each cache its own buffers: no pool to report
            return
        blocks = GaugeMetricFamily("metalkv_kv_blocks", "The KV pool's blocks by window group and state.",
                                   labels=["window", "state"])
        total = free = 0
        for g in pool["groups"]:
            cached, reserved = g["cached_blocks"], g["reserved_blocks"]
            free_now = g["free_blocks"] - g["evictable_blocks"]  # (free_blocks counts evictable ones)
            states = {"used": g["blocks"] - g["free_blocks"], "cached": cached, "reserved": reserved,
                      "free": max(free_now - reserved, 0)}
            for state, n in states.items():
                blocks.add_metric([str(g["window"]), state], n)
            total += g["blocks"]
            free += states["free"]
        yield blocks
        yield GaugeMetricFamily("metalkv_kv_pool_bytes", "Bytes of the shared KV pool.", value=pool["nbytes"])
        yield GaugeMetricFamily("metalkv_kv_pool_usage", "Fraction of the KV pool's blocks not free.",
                                value=1.0 - free / total if total else 0.0)
        cap = GaugeMetricFamily("metalkv_kv_memory_bytes", "kv_memory: its cap, the bytes charged to it now "
                                "(the pool and sequences' own buffers), sequences' own alone, the peak.",
                                labels=["kind"])
        for kind, key in (("total", "kv_memory"), ("used", "used_bytes"), ("sequences", "sequence_bytes"),
                          ("peak", "peak_bytes")):
            cap.add_metric([kind], pool[key])
        yield cap


    def _store(self):
        if self.store is None:
            return
        loaded = CounterMetricFamily("metalkv_prefix_store_loaded_tokens", "Prompt tokens the prefix store put back "
                                     "into the KV pool, by the tier that held them.", labels=["tier"])
        for tier in ("host", "disk", "redis"):
            loaded.add_metric([tier], self.store.stats[f"loaded_{tier}"])
        yield loaded
        yield CounterMetricFamily("metalkv_prefix_store_saved_blocks", "Blocks written to the prefix store.",
                                  value=self.store.stats["saved"])
        yield CounterMetricFamily("metalkv_prefix_store_corrupt_entries", "Entries refused and deleted.",
                                  value=self.store.stats["corrupt"])
        held = GaugeMetricFamily("metalkv_prefix_store_bytes", "Bytes each tier of the prefix store holds.",
                                 labels=["tier"])
        for tier, t in self.store.tiers().items():
            if "bytes" in t:  # (Redis keeps its own count)
                held.add_metric([tier], t["bytes"])
        yield held
        yield CounterMetricFamily("metalkv_prefix_store_redis_errors", "Calls to the Redis tier that failed.",
                                  value=self.store.stats["redis_errors"])


class Metrics:
    """The server's registry (one per app, so several apps in one process keep apart)."""

    def __init__(self, engine, store=None):
        self.registry = r = CollectorRegistry()
        self.requests = Counter("metalkv_requests", "Calls ended, by finish reason.", ["finish_reason"], registry=r)
        self.prompt_tokens = Counter("metalkv_prompt_tokens", "Prompt tokens of ended calls.", registry=r)
        self.cached_tokens = Counter("metalkv_prompt_tokens_cached", "Prompt tokens found in the prefix cache.",
                                     ["tier"], registry=r)
        self.preemptions = Counter("metalkv_preemptions", "Times a call gave its KV blocks back and waited.",
                                   registry=r)
        self.recomputed = Counter("metalkv_recomputed_tokens", "Tokens calls fed again to resume after a preemption.",
                                  registry=r)
        self.generated = Counter("metalkv_generation_tokens", "Tokens generated by ended calls.", registry=r)
        self.ttft = Histogram("metalkv_time_to_first_token_seconds", "Queue plus prompt time of a call.",
                              buckets=BUCKETS_TTFT, registry=r)
        self.seconds = Histogram("metalkv_request_seconds", "Queue, prompt and decode time of a call.",
                                 buckets=BUCKETS_CALL, registry=r)
        r.register(_Live(engine, store))

    def ended(self, stats: dict) -> None:
        """One call's end (Call.stats())."""
        self.requests.labels(stats["finish_reason"]).inc()
        self.prompt_tokens.inc(stats["prompt_tokens"])
        self.cached_tokens.labels("device").inc(stats["prompt_tokens_cached"])
        self.generated.inc(stats["generated_tokens"])
        self.preemptions.inc(stats["preemptions"])
        self.recomputed.inc(stats["recomputed_tokens"])
        first = stats["queue_seconds"] + stats["prefill_seconds"]
        self.ttft.observe(first)
        self.seconds.observe(first + stats["decode_seconds"])

    def text(self) -> tuple[bytes, str]:
        """(the exposition, its content type)."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
