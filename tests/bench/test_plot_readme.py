"""bench/plot_readme.py, the README's pictures: the committed gpu_decode.json is what the
gather makes from the committed H200 results today (so the picture cannot drift from its
sources), the candidates write every KV keyword out, and the plots draw from the committed
JSON (skipped without matplotlib, a bench-only dependency)."""
from __future__ import annotations

import json
import sys
from argparse import Namespace
from pathlib import Path

import pytest

from scripts import load_script  # tests/ is on sys.path

ROOT = Path(__file__).resolve().parents[2]
plot_readme = load_script(ROOT / "bench" / "plot_readme.py")[0]
KV_KEYS = {"kv_k", "kv_v", "kv_rotate", "kv_residual", "kv_f16_layers", "kv_policy"}


def test_gpu_json_is_the_gather_of_its_sources(tmp_path, monkeypatch):
    monkeypatch.setattr(sys, "argv", ["bench/plot_readme.py", "gpu"])
    assert plot_readme.gather_gpu(Namespace(out=str(tmp_path))) == 0
    fresh = json.loads((tmp_path / "gpu_decode.json").read_text())
    committed = json.loads((plot_readme.GPU_DIR / "gpu_decode.json").read_text())
    assert fresh["layer"] == committed["layer"] and fresh["engine"] == committed["engine"]
    assert all((ROOT / r["source"]).exists() for r in fresh["layer"] + fresh["engine"])
    kinds = {(r["engine"], r["kv"]) for r in fresh["layer"]}
    assert {("metalkv", "f16"), ("metalkv", "q8"), ("metalkv", "q4"), ("torch.sdpa[cudnn]", "f16")} <= kinds


def test_candidates_name_every_kv_keyword():
    for group in ("formats", "policies"):
        cands = plot_readme.candidates(group, 1024)
        assert cands and all(KV_KEYS <= set(kw) for kw in cands.values())
    assert {kw["kv_budget"] for kw in plot_readme.candidates("policies", 1024).values()} == {256}
    with pytest.raises(ValueError, match="--groups"):
        plot_readme.candidates("nope", 1024)


@pytest.mark.parametrize("draw, path", [("plot_gpu", plot_readme.GPU_DIR / "gpu_decode.json"),
                                        ("plot_ppl", plot_readme.PPL_DIR / "ppl.json")])
def test_plots_draw_from_the_committed_json(draw, path, tmp_path):
    pytest.importorskip("matplotlib")
    copy = tmp_path / path.name
    copy.write_text(path.read_text())
    png = getattr(plot_readme, draw)(copy)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
