#!/usr/bin/env python3
"""Syntax-check the Metal backend (cpp/gpu/metal) against metal-cpp's real headers, on Linux.

The backend is compiled only on a Mac; this catches a misspelt metal-cpp method, a wrong
argument type or count, or a call on the wrong class anywhere else. metal-cpp comes from the
mlx-metal macOS wheel on PyPI, the same file (URL and SHA256) that
cpp/gpu/metal/metal_backend.cmake downloads on a Mac; the Apple SDK headers that metal-cpp
includes are replaced by the declarations in tools/apple_sdk_stubs/.

  python tools/check_metal_backend.py                  # fetch the headers if needed, check all
  python tools/check_metal_backend.py --download-only  # only fetch them into the cache (CI)
  python tools/check_metal_backend.py FILE...          # check these files (e.g. an edited copy)

Default files: cpp/gpu/metal/*.cpp and every other cpp/ source that tests METALKV_HAVE_METAL.
The file holding NS_PRIVATE_IMPLEMENTATION is compiled once more as for a pre-26 macOS SDK,
because metal-cpp defines its symbols differently there.
Exit status: 0 clean; 1 clang rejected a file (warnings count: the backend is compiled nowhere
else), with clang's messages naming file and line; 2 the check could not run (no clang, no
headers, download failed). Does not import metalkv.
"""
from __future__ import annotations

import argparse
import concurrent.futures
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
BACKEND_DIR = ROOT / "cpp" / "gpu" / "metal"
BACKEND_CMAKE = BACKEND_DIR / "metal_backend.cmake"
SDK_STUBS = Path(__file__).resolve().parent / "apple_sdk_stubs"
WHEEL_HEADERS = "mlx/include/metal_cpp/"  # where the mlx-metal wheel keeps metal-cpp

# As the real build compiles metalkv_core (CMakeLists.txt): C++17, -Wall -Wextra, the
# repo's cpp/ and root on the include path, metal-cpp as a SYSTEM include.
CLANG_FLAGS = ["-x", "c++", "-std=c++17", "-fsyntax-only", "-fblocks", "-Wall", "-Wextra",
               "-Werror", "-ferror-limit=50", "-D__APPLE__=1", "-DMETALKV_HAVE_METAL=1"]
OLD_SDK = "150000"  # METALKV_STUB_MACOS_SDK for the second pass (see Availability.h stub)


class SetupError(Exception):
    """The check could not run; the message says what to do."""


@dataclass(frozen=True)
class Pin:
    version: str   # mlx-metal version, e.g. "0.32.4"
    platform: str  # wheel platform tag, e.g. "macosx_14_0_arm64"
    sha256: str


def read_pin(cmake_file: Path = BACKEND_CMAKE) -> Pin:
    """The mlx-metal wheel that metal_backend.cmake downloads: one pin for both."""
    text = cmake_file.read_text()
    url = re.search(r"mlx_metal-([0-9][^-]*)-py3-none-(macosx_\w+?)\.whl", text)
    digest = re.search(r"SHA256=([0-9a-fA-F]{64})", text)
    if not url or not digest:
        raise SetupError(f"{cmake_file}: no mlx_metal-<version>-py3-none-<platform>.whl URL with "
                         "a SHA256=<hex> hash found; this tool reads its pin from there")
    return Pin(version=url.group(1), platform=url.group(2), sha256=digest.group(1).lower())


def default_cache() -> Path:
    if os.environ.get("METALKV_CACHE_DIR"):
        return Path(os.environ["METALKV_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "metalkv"


def cached_headers(cache: Path, pin: Pin) -> Path:
    """Where the pinned wheel's metal-cpp folder (the one holding Metal/Metal.hpp) lives."""
    return cache / f"mlx-metal-{pin.version}-{pin.sha256[:12]}" / "metal_cpp"


def download_headers(cache: Path, pin: Pin) -> Path:
    """Fetch the pinned wheel with pip (hash-checked), keep only metal-cpp's headers."""
    target = cached_headers(cache, pin)
    if (target / "Metal" / "Metal.hpp").is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix=".download-") as tmp:
        requirements = Path(tmp) / "requirements.txt"
        # A --hash makes pip refuse any other file, as the CMake download does.
        requirements.write_text(f"mlx-metal=={pin.version} --hash=sha256:{pin.sha256}\n")
        command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
                   "--platform", pin.platform, "--python-version", "3.11",
                   "-r", str(requirements), "-d", tmp]
        print(f"check_metal_backend: downloading mlx-metal {pin.version} ({pin.platform}, ~45 MB) "
              f"for metal-cpp's headers", file=sys.stderr)
        done = subprocess.run(command, capture_output=True, text=True)
        wheels = sorted(Path(tmp).glob("mlx_metal-*.whl"))
        if done.returncode != 0 or not wheels:
            raise SetupError(f"could not download mlx-metal {pin.version}:\n  {' '.join(command)}\n"
                             f"{done.stdout[-2000:]}{done.stderr[-2000:]}\nIf this machine is "
                             "offline, pass --headers DIR with a metal-cpp folder")
        digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
        if digest != pin.sha256:
            raise SetupError(f"{wheels[0].name}: SHA256 {digest}, expected {pin.sha256}")
        extracted = Path(tmp) / "extracted"
        with zipfile.ZipFile(wheels[0]) as wheel:
            members = [n for n in wheel.namelist() if n.startswith(WHEEL_HEADERS)]
            wheel.extractall(extracted, members)
        if not (extracted / WHEEL_HEADERS / "Metal" / "Metal.hpp").is_file():
            raise SetupError(f"{wheels[0].name} has no {WHEEL_HEADERS}Metal/Metal.hpp; the wheel's "
                             "layout changed: pin another version in metal_backend.cmake")
        # Renamed into place whole, so an interrupted download never looks complete.
        os.replace(extracted / WHEEL_HEADERS, target)
    return target


def find_clang(explicit: str | None) -> str:
    if explicit:
        found = shutil.which(explicit)
        if not found:
            raise SetupError(f"--clang {explicit}: not found or not executable")
        return found
    names = ["clang++"] + [f"clang++-{v}" for v in range(30, 13, -1)]
    found = [path for path in map(shutil.which, names) if path]
    if not found:
        raise SetupError("no clang++ found (tried clang++ and clang++-30 .. clang++-14); install "
                         "one (Debian: apt-get install clang-19) or pass --clang PATH")
    return found[0]


def default_sources() -> list[Path]:
    """The backend, plus any other source whose code changes with METALKV_HAVE_METAL."""
    backend = sorted(BACKEND_DIR.glob("*.cpp"))
    others = sorted(p for p in (ROOT / "cpp").rglob("*.cpp")
                    if p.parent != BACKEND_DIR and "METALKV_HAVE_METAL" in p.read_text())
    return backend + others


def display(path: Path) -> str:
    """Repo files as repo-relative paths (as clang will print them), others absolute."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def clang_jobs(clang: str, headers: Path, sources: list[Path]) -> list[tuple[str, list[str]]]:
    """(label, command) per compile: each file once, the implementation unit twice."""
    base = [clang, *CLANG_FLAGS, f"-I{ROOT / 'cpp'}", f"-I{ROOT}",
            "-isystem", str(headers), "-isystem", str(SDK_STUBS)]
    originals = {p.name: p.parent for p in default_sources()}
    jobs = []
    for source in sources:
        name = display(source)
        command = [*base]
        original = originals.get(source.name)
        if original and source.resolve().parent != original:
            # A copy of a backend file (a test's edited one) is compiled as if it stood in
            # the original's folder: its "metal_objects.h" and "../device.h" resolve there.
            command.append(f"-iquote{original}")
        jobs.append((name, [*command, name]))
        if "NS_PRIVATE_IMPLEMENTATION" in source.read_text():
            jobs.append((f"{name} (pre-26 macOS SDK)",
                         [*command, f"-DMETALKV_STUB_MACOS_SDK={OLD_SDK}", name]))
    return jobs


def run_checks(clang: str, headers: Path, sources: list[Path]) -> int:
    jobs = clang_jobs(clang, headers, sources)
    workers = max(1, min(len(jobs), os.cpu_count() or 1))
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        results = list(pool.map(
            lambda job: subprocess.run(job[1], cwd=ROOT, capture_output=True, text=True), jobs))
    failed = 0
    for (label, _), done in zip(jobs, results):
        output = (done.stdout + done.stderr).strip()
        if done.returncode != 0 or output:
            failed += 1
            print(f"FAIL {label}\n{output}\n")
        else:
            print(f"ok   {label}")
    print(f"check_metal_backend: {len(jobs) - failed} of {len(jobs)} compiles clean against "
          f"metal-cpp in {headers} ({Path(clang).name})")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("files", nargs="*", type=Path,
                        help="sources to check (default: the backend, see above)")
    parser.add_argument("--headers", type=Path,
                        help="an existing metal-cpp folder (holding Metal/Metal.hpp); no download")
    parser.add_argument("--cache", type=Path, default=None,
                        help="where downloaded headers are kept (default: $METALKV_CACHE_DIR, "
                             "else $XDG_CACHE_HOME/metalkv or ~/.cache/metalkv)")
    parser.add_argument("--download-only", action="store_true",
                        help="fetch the pinned headers into the cache and stop")
    parser.add_argument("--clang", help="clang++ to use (default: the first clang++ on PATH)")
    args = parser.parse_args(argv)
    try:
        if args.headers:
            headers = args.headers.resolve()
            if not (headers / "Metal" / "Metal.hpp").is_file():
                raise SetupError(f"--headers {args.headers}: no Metal/Metal.hpp in it; pass the "
                                 "metal-cpp folder itself (the one holding Metal/ and Foundation/)")
        else:
            headers = download_headers(args.cache or default_cache(), read_pin())
        if args.download_only:
            print(f"check_metal_backend: metal-cpp headers in {headers}")
            return 0
        sources = args.files or default_sources()
        missing = [str(p) for p in sources if not p.is_file()]
        if missing:
            raise SetupError(f"no such file: {', '.join(missing)}")
        return run_checks(find_clang(args.clang), headers, sources)
    except SetupError as error:
        print(f"check_metal_backend: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
