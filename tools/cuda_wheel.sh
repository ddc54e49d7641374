#!/usr/bin/env bash
# Build metalkv's CUDA wheel on this machine (no GPU needed: nvcc compiles, the
# GPU machine runs) and put it, with the pure-Python wheels the GPU machine lacks,
# in build/cuda-wheel/, where tools/cuda_run.sh's install stage looks. Then call
# the device tool with carry ["build/cuda-wheel"] and leave out the build stage:
# every call then skips the ~3 min build there.
#
#   bash tools/cuda_wheel.sh [--with-bench] [EXTRA_WHEEL ...]
#
# - Python 3.12 (the GPU machine's): $PY312, else python3.12 on PATH, else pyenv's.
#   A venv with nanobind, scikit-build-core and numpy is made in /tmp/venv312 once.
# - METALKV_CUDA_ARCHITECTURES=90 (H100/H200), ccache for nvcc and g++ where
#   installed: 5 min cold on 2 cores, under a minute when only a kernel changed.
# - metalkv-bench (as large as the module) is left out of the copy unless
#   --with-bench: the working tree plus carry must stay under 64 MiB.
# - gguf's wheel (tests/ops need it) comes from .whl/ when there; EXTRA_WHEELs
#   (timm for the Gemma 3n vision tests and bench) are copied as given.
set -euo pipefail
cd "$(dirname "$0")/.."
with_bench=0
extra=()
for a in "$@"; do
  case "$a" in
    --with-bench) with_bench=1 ;;
    *) extra+=("$a") ;;
  esac
done
py=${PY312:-$(command -v python3.12 || true)}
if [ -z "$py" ] || ! "$py" -V >/dev/null 2>&1; then
  py=$(ls "$(pyenv root 2>/dev/null)"/versions/3.12*/bin/python3.12 2>/dev/null | tail -1)
fi
[ -n "$py" ] || { echo "cuda_wheel.sh: no Python 3.12 found (set PY312)" >&2; exit 1; }
if [ ! -x /tmp/venv312/bin/python ]; then
  "$py" -m venv /tmp/venv312
  /tmp/venv312/bin/pip install -q nanobind scikit-build-core numpy
fi
launcher=()
if command -v ccache >/dev/null; then
  launcher=(-Ccmake.define.CMAKE_CUDA_COMPILER_LAUNCHER=ccache -Ccmake.define.CMAKE_CXX_COMPILER_LAUNCHER=ccache)
fi
tmp=$(mktemp -d)
/tmp/venv312/bin/pip wheel . --no-deps --no-build-isolation -w "$tmp" -Cbuild-dir=build/cp312-cuda \
  -Ccmake.define.METALKV_CUDA=ON -Ccmake.define.METALKV_CUDA_ARCHITECTURES=90 \
  -Ccmake.define.METALKV_HOST_ARCH=x86-64-v3 "${launcher[@]}" >"$tmp/build.log" 2>&1 \
  || { tail -30 "$tmp/build.log"; exit 1; }
rm -rf build/cuda-wheel && mkdir -p build/cuda-wheel
whl=$(ls "$tmp"/metalkv-*.whl)
if [ $with_bench = 1 ]; then
  cp "$whl" build/cuda-wheel/
else  # the same wheel without scripts/metalkv-bench (and its RECORD line)
  /tmp/venv312/bin/python - "$whl" "build/cuda-wheel/$(basename "$whl")" <<'EOF'
import sys, zipfile
src, dst = sys.argv[1:]
with zipfile.ZipFile(src) as zi, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as zo:
    for item in zi.infolist():
        if item.filename.endswith("scripts/metalkv-bench"):
            continue
        data = zi.read(item.filename)
        if item.filename.endswith(".dist-info/RECORD"):
            data = b"\n".join(l for l in data.split(b"\n") if b"scripts/metalkv-bench" not in l)
        zo.writestr(item, data)
EOF
fi
cp .whl/gguf-*.whl build/cuda-wheel/ 2>/dev/null || echo "cuda_wheel.sh: no gguf wheel in .whl/ (tests/ops need it there)"
[ ${#extra[@]} -gt 0 ] && cp "${extra[@]}" build/cuda-wheel/
rm -rf "$tmp"
du -sh build/cuda-wheel && ls build/cuda-wheel
