"""cpp/gpu/metal/metal_backend.cmake: where metal-cpp is found, in which order, and the fallback.

Each case configures a tiny CMake project (no compiler, about half a second) that includes the
module as the top-level CMakeLists.txt does on a Mac, with fake metal-cpp folders, a fake
installed mlx-metal and file:// downloads. No network: every case points the download at a
local file. The order: METALKV_METAL_CPP_DIR, then an installed mlx-metal, then the download;
with none, AUTO builds the host device only and warns with the three ways to get the GPU, ON
stops, OFF does not look.
"""
from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MODULE = ROOT / "cpp" / "gpu" / "metal" / "metal_backend.cmake"
CMAKE = shutil.which("cmake")
METAL_CPP_FILES = ["Metal/Metal.hpp", "Foundation/Foundation.hpp"]

pytestmark = pytest.mark.skipif(CMAKE is None, reason="cmake is not on PATH")


@dataclass
class Configured:
    rc: int
    output: str        # cmake's stdout and stderr
    origin: str        # METALKV_METAL_CPP_ORIGIN
    include_dir: str   # METALKV_METAL_CPP_INCLUDE_DIR
    backend: bool      # METALKV_METAL_BACKEND_SOURCES set: the build defines METALKV_HAVE_METAL

    @property
    def warnings(self) -> str:
        return " ".join(self.output.split())  # CMake rewraps warning text


def make_metal_cpp(folder: Path) -> Path:
    for name in METAL_CPP_FILES:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text("// fake\n")
    return folder


def make_archive(path: Path, members: dict[str, str]) -> str:
    """A zip (a wheel is one) with these members; returns its SHA256=... for the cache var."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return "SHA256=" + hashlib.sha256(path.read_bytes()).hexdigest()


def fake_wheel(path: Path) -> str:
    return make_archive(path, {f"mlx/include/metal_cpp/{n}": "// fake\n" for n in METAL_CPP_FILES}
                        | {"mlx/lib/libmlx.dylib": "not extracted"})


def fake_site_packages(site: Path, version: str = "9.9.9") -> Path:
    """An installed mlx-metal as importlib.metadata sees it: dist-info with a RECORD."""
    make_metal_cpp(site / "mlx" / "include" / "metal_cpp")
    info = site / f"mlx_metal-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: mlx-metal\nVersion: {version}\n")
    (info / "RECORD").write_text("".join(f"mlx/include/metal_cpp/{n},,\n" for n in METAL_CPP_FILES))
    return site


@pytest.fixture
def configure(tmp_path):
    """configure(name, site=None, **cache_vars): one fresh configure of the tiny project."""
    project = tmp_path / "project"
    project.mkdir()
    (project / "CMakeLists.txt").write_text(
        "cmake_minimum_required(VERSION 3.18)\n"
        "project(metal_cpp_discovery LANGUAGES NONE)\n"
        f'include("{MODULE.as_posix()}")\n'
        'message(STATUS "RESULT|${METALKV_METAL_CPP_ORIGIN}|${METALKV_METAL_CPP_INCLUDE_DIR}|'
        '${METALKV_METAL_BACKEND_SOURCES}")\n')
    # A Python that sees no site-packages (so a real mlx-metal on this machine is invisible);
    # PYTHONPATH, unless -I, stands for the environment the build runs in.
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\nexec "{sys.executable}" -S "$@"\n')
    python.chmod(0o755)

    def run(name: str, site: Path | None = None, build: Path | None = None, **cache) -> Configured:
        cache.setdefault("METALKV_METAL_CPP_URL", (tmp_path / "no-such-file.whl").as_uri())
        cache.setdefault("METALKV_METAL_CPP_URL_HASH", "")
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
        if site:
            env["PYTHONPATH"] = str(site)
        command = [CMAKE, "-S", str(project), "-B", str(build or tmp_path / f"build-{name}"),
                   f"-DPython_EXECUTABLE={python}"] + [f"-D{k}={v}" for k, v in cache.items()]
        done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
        output = done.stdout + done.stderr
        result = next((line.split("|") for line in done.stdout.splitlines() if "RESULT|" in line),
                      ["", "", "", ""])
        return Configured(done.returncode, output, result[1], result[2], bool(result[3]))

    return run


def test_given_folder_comes_first(configure, tmp_path):
    # Apple's zip layout: metal-cpp/ beside __MACOSX/.
    given = make_metal_cpp(tmp_path / "apple" / "metal-cpp").parent
    (given / "__MACOSX").mkdir()
    url = (tmp_path / "pinned.whl").as_uri()
    digest = fake_wheel(tmp_path / "pinned.whl")
    got = configure("dir", site=fake_site_packages(tmp_path / "site"), METALKV_METAL_CPP_DIR=given,
                    METALKV_METAL_CPP_URL=url, METALKV_METAL_CPP_URL_HASH=digest)
    assert got.rc == 0, got.output
    assert got.origin == "METALKV_METAL_CPP_DIR" and got.backend
    assert got.include_dir == str(given / "metal-cpp")
    assert "downloading" not in got.output and "[metal]" not in got.output


def test_installed_mlx_metal_before_the_download(configure, tmp_path):
    site = fake_site_packages(tmp_path / "site", version="9.9.9")
    digest = fake_wheel(tmp_path / "pinned.whl")
    got = configure("mlx", site=site, METALKV_METAL_CPP_URL=(tmp_path / "pinned.whl").as_uri(),
                    METALKV_METAL_CPP_URL_HASH=digest)
    assert got.rc == 0, got.output
    assert got.origin.startswith("mlx-metal 9.9.9 installed for") and got.backend
    assert got.include_dir == str(site / "mlx" / "include" / "metal_cpp")
    assert "downloading" not in got.output


def test_unusable_given_folder_is_reported_and_the_next_way_used(configure, tmp_path):
    (tmp_path / "empty").mkdir()
    got = configure("bad-dir", site=fake_site_packages(tmp_path / "site"),
                    METALKV_METAL_CPP_DIR=tmp_path / "empty")
    assert got.rc == 0, got.output
    assert got.origin.startswith("mlx-metal") and got.backend
    assert f"METALKV_METAL_CPP_DIR={tmp_path / 'empty'}: no Metal/Metal.hpp" in got.warnings
    assert "using mlx-metal 9.9.9" in got.warnings


def test_pinned_download_when_nothing_is_installed(configure, tmp_path):
    wheel = tmp_path / "mlx_metal-0.0.0-py3-none-macosx_14_0_arm64.whl"
    digest = fake_wheel(wheel)
    build = tmp_path / "build-download"
    got = configure("download", build=build, METALKV_METAL_CPP_URL=wheel.as_uri(),
                    METALKV_METAL_CPP_URL_HASH=digest)
    assert got.rc == 0, got.output
    assert got.origin == f"the download of {wheel.as_uri()}" and got.backend
    include = Path(got.include_dir)
    assert include.is_relative_to(build) and include.as_posix().endswith("mlx/include/metal_cpp")
    assert not list(include.parents[2].rglob("libmlx.dylib"))  # only the headers are extracted
    # A second configure reuses what was extracted, even with the archive gone.
    wheel.unlink()
    again = configure("download", build=build, METALKV_METAL_CPP_URL=wheel.as_uri(),
                      METALKV_METAL_CPP_URL_HASH=digest)
    assert again.rc == 0 and again.include_dir == got.include_dir, again.output
    assert "downloading" not in again.output


def test_download_of_apples_zip_layout(configure, tmp_path):
    archive = tmp_path / "metal-cpp_macOS14.2_iOS17.2.zip"
    make_archive(archive, {f"metal-cpp/{n}": "// fake\n" for n in METAL_CPP_FILES}
                 | {"__MACOSX/metal-cpp/._README.md": ""})
    got = configure("apple-zip", METALKV_METAL_CPP_URL=archive.as_uri())  # no hash: not checked
    assert got.rc == 0 and got.backend, got.output
    assert got.include_dir.endswith("/src/metal-cpp")


@pytest.mark.parametrize("case", ["bad hash", "unreachable", "no headers inside"])
def test_nothing_found_builds_host_only_with_the_three_ways(configure, tmp_path, case):
    wheel = tmp_path / "pinned.whl"
    if case == "no headers inside":
        digest = make_archive(wheel, {"mlx/lib/libmlx.dylib": "no headers"})
    else:
        digest = fake_wheel(wheel)
    if case == "bad hash":
        digest = "SHA256=" + "0" * 64
    url = (tmp_path / "missing.whl" if case == "unreachable" else wheel).as_uri()
    got = configure(case.replace(" ", "-"), METALKV_METAL_CPP_URL=url,
                    METALKV_METAL_CPP_URL_HASH=digest)
    assert got.rc == 0, got.output  # installing never fails for want of metal-cpp
    assert not got.backend and not got.include_dir
    text = got.warnings
    assert "Building the host device only (no Metal GPU)" in text
    reason = {"bad hash": f"expected {'0' * 64}",
              "unreachable": f"download of {url} failed",
              "no headers inside": "no Metal/Metal.hpp and Foundation/Foundation.hpp in the archive"}
    assert reason[case] in text
    assert "METALKV_METAL_CPP_DIR: not set" in text and "mlx-metal: not installed" in text
    for way in ["pip install . -Ccmake.define.METALKV_METAL_CPP_DIR=/path/to/metal-cpp",
                "pip install mlx-metal",
                "-Ccmake.define.METALKV_METAL_CPP_URL=...",
                "-Ccmake.define.METALKV_METAL_CPP_URL_HASH=SHA256="]:
        assert way in text


def test_on_makes_a_missing_metal_cpp_an_error(configure):
    got = configure("on", METALKV_METAL="ON")
    assert got.rc != 0
    assert "METALKV_METAL=ON, but metal-cpp was not found" in got.warnings
    assert "pip install . -Ccmake.define.METALKV_METAL_CPP_DIR=" in got.warnings


def test_off_does_not_look(configure, tmp_path):
    given = make_metal_cpp(tmp_path / "mc")
    got = configure("off", METALKV_METAL="off", METALKV_METAL_CPP_DIR=given)
    assert got.rc == 0 and not got.backend and not got.include_dir, got.output
    assert "METALKV_METAL=OFF" in got.output and "[metal]" not in got.output


def test_unknown_mode_is_an_error(configure):
    got = configure("bad-mode", METALKV_METAL="maybe")
    assert got.rc != 0 and "METALKV_METAL='maybe'; expected AUTO, ON or OFF" in got.warnings
