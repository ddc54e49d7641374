"""tools/check_metal_backend.py: the Metal backend against metal-cpp's real headers.

Each planted API mistake (in a copy of a backend source) must be rejected with clang's message
naming the planted line; the sources as they are must pass. The headers come from the tool's
cache and are never downloaded here: CI fetches them first with
`python tools/check_metal_backend.py --download-only`; without them these tests skip.
"""
from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOOL = ROOT / "tools" / "check_metal_backend.py"
METAL = ROOT / "cpp" / "gpu" / "metal"


def _load_tool():
    # By path, not as a package: tools/ is not one, and metalkv must not be imported.
    spec = importlib.util.spec_from_file_location("check_metal_backend", TOOL)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up here
    spec.loader.exec_module(module)
    return module


tool = _load_tool()

# (name, source file, text as it is, text with the mistake, what clang must say)
PLANTS = [
    ("misspelt method", METAL / "metal_device.cpp",
     "device_->newBuffer(length, ", "device_->newBufferWithLength(length, ",
     "no member named 'newBufferWithLength' in 'MTL::Device'"),
    ("wrong argument type (our wrapper, not the MTL::Buffer)", METAL / "metal_command.cpp",
     "encoder->setBuffer(bound.mtl(), offset, index);",
     "encoder->setBuffer(&bound, offset, index);",
     "no matching member function for call to 'setBuffer'"),
    ("missing argument", METAL / "metal_command.cpp",
     "encoder->dispatchThreadgroups(to_mtl(threadgroups), to_mtl(tpg));",
     "encoder->dispatchThreadgroups(to_mtl(threadgroups));",
     "no matching member function for call to 'dispatchThreadgroups'"),
    ("call on the wrong class", METAL / "metal_command.cpp",
     "queue_->commandBuffer();", "queue_->computeCommandEncoder();",
     "no member named 'computeCommandEncoder' in 'MTL::CommandQueue'"),
    ("NS::Error* where NS::Error** is expected", METAL / "metal_library.cpp",
     "newLibrary(ns_text, options.get(), &error)", "newLibrary(ns_text, options.get(), error)",
     "no matching member function for call to 'newLibrary'"),
    ("misspelt enum constant", METAL / "metal_command.cpp",
     "MTL::CommandBufferStatusError", "MTL::CommandBufferStatusFailed",
     "no member named 'CommandBufferStatusFailed' in namespace 'MTL'"),
    ("a warning fails too (signed index against NS::UInteger)", METAL / "metal_library.cpp",
     "for (NS::UInteger i = 0; i < count; ++i)", "for (int i = 0; i < count; ++i)",
     "comparison of integers of different signs"),
]


@pytest.fixture(scope="module")
def headers() -> Path:
    path = tool.cached_headers(tool.default_cache(), tool.read_pin())
    if not (path / "Metal" / "Metal.hpp").is_file():
        pytest.skip(f"metal-cpp headers are not in the cache ({path}); fetch them once with: "
                    "python tools/check_metal_backend.py --download-only")
    try:
        tool.find_clang(None)
    except tool.SetupError as error:
        pytest.skip(str(error))
    return path


def run_tool(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(TOOL), *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=300)


def test_backend_as_it_is_passes(headers):
    done = run_tool("--headers", str(headers))
    assert done.returncode == 0, done.stdout + done.stderr
    for source in tool.default_sources():
        assert f"ok   {source.relative_to(ROOT)}" in done.stdout
    assert "(pre-26 macOS SDK)" in done.stdout  # the implementation unit, both ways


def test_planted_mistakes_are_rejected_at_their_line(headers, tmp_path):
    planted = []  # (name, path, line, message)
    for i, (name, source, original, mistake, message) in enumerate(PLANTS):
        text = source.read_text()
        assert text.count(original) == 1, (f"[{name}] {original!r} is no longer once in {source}; "
                                           "update PLANTS to plant the mistake elsewhere")
        at = text.index(original)
        line = text.count("\n", 0, at) + 1
        copy = tmp_path / f"plant{i}" / source.name
        copy.parent.mkdir()
        copy.write_text(text.replace(original, mistake))
        planted.append((name, copy, line, message))

    done = run_tool("--headers", str(headers), *(str(p) for _, p, _, _ in planted))
    assert done.returncode == 1, done.stdout + done.stderr
    # The tool prints "FAIL <file>" and clang's messages, one block per compile.
    blocks = {}
    for block in done.stdout.split("FAIL ")[1:]:
        label, _, body = block.partition("\n")
        blocks.setdefault(label.split(" (")[0], body)
    for name, path, line, message in planted:
        body = blocks.get(str(path))
        assert body is not None, f"[{name}] {path} was not rejected:\n{done.stdout}"
        assert f"{path}:{line}:" in body and "error:" in body, f"[{name}] line {line}:\n{body}"
        assert message in body, f"[{name}] expected {message!r}:\n{body}"
    assert f"0 of {len(planted) + 1} compiles clean" in done.stdout  # + metal_device.cpp's 2nd pass


def test_unusable_headers_folder_is_a_setup_error(tmp_path):
    done = run_tool("--headers", str(tmp_path))
    assert done.returncode == 2
    assert "no Metal/Metal.hpp" in done.stderr and "--headers" in done.stderr


def test_pin_is_the_wheel_that_cmake_downloads():
    pin = tool.read_pin()
    cmake = tool.BACKEND_CMAKE.read_text()
    assert f"mlx_metal-{pin.version}-py3-none-{pin.platform}.whl" in cmake
    assert f"SHA256={pin.sha256}" in cmake
