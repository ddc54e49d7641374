"""The stress suite (tests/stress): concurrency, a pool kept near full, long
generation, random arrivals. Its quick form runs with every `pytest` (CI);
METALKV_STRESS=long runs each for minutes and at full size:

    METALKV_STRESS=long pytest tests/stress -s      # -s shows the throughput lines

Each test prints what it measured (tokens/s, bytes, RSS) on a `[stress]` line."""
from __future__ import annotations

import os
import pathlib

import pytest

import metalkv
from devices import TEST_DEVICE  # tests/ is on sys.path

LONG = os.environ.get("METALKV_STRESS", "quick") == "long"


def size(quick, long):
    """A count or duration: the quick form's, or the long form's."""
    return long if LONG else quick


def rss_bytes() -> int:
    for line in pathlib.Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def report(what: str, **numbers) -> None:
    print(f"[stress] {what}: " + ", ".join(f"{k}={v}" for k, v in numbers.items()))


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("METALKV_NO_PROGRESS", "1")


@pytest.fixture(scope="session")
def tiny_text(tmp_path_factory):
    """A tiny llama GGUF with a real 64-token byte-level vocabulary: text in and out."""
    from models.tiny import TINY_VOCAB, write_gguf  # tests/ is on sys.path

    f = tmp_path_factory.mktemp("stress_text") / "tiny_text.gguf"
    write_gguf(f, tokenizer=TINY_VOCAB, hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)
    return f


@pytest.fixture(scope="session")
def tiny_sliding(tmp_path_factory):
    """A tiny Gemma 3 (random safetensors): window 8 on all layers but layer 5."""
    from models.tiny import gemma3_config, write_hf_dir

    d = tmp_path_factory.mktemp("stress_sliding")
    write_hf_dir(d, gemma3_config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                  query_pre_attn_scalar=64), dtype="F32")
    return d


def load(path, **kw):
    kw = {"context": 256, "prefill_chunk": 16, **kw}
    return metalkv.Engine.load(path, device=TEST_DEVICE, progress=False, **kw)
