"""cuda_pass.py (metal/*.metal -> CUDA) against the host pass: on every kernel
file it must register exactly the kernels the host executor registers (less
the host-only shapes: the several-token gemv of 8 tokens), with
the same parameter bindings, as `extern "C" __global__` thunks and KernelDesc
tables (cpp/gpu/cuda/kernel_abi.h). With nvcc on PATH (no GPU needed), one
kernel file is also compiled.

    pytest tests/gpu/test_cuda_pass.py
"""
from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

from scripts import load_script  # tests/ is on sys.path

ROOT = pathlib.Path(__file__).resolve().parents[2]
cuda_pass, _siblings = load_script(ROOT / "cpp" / "gpu" / "cuda" / "cuda_pass.py", ROOT / "cpp" / "gpu")
kernel_source = _siblings["kernel_source"]

CXX = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
METAL = ROOT / "metal"
KERNEL_FILES = sorted(METAL.glob("*.metal")) + sorted((METAL / "test").glob("*.metal"))
pytestmark = pytest.mark.skipif(CXX is None, reason="the passes preprocess with a C++ compiler")

THUNK = re.compile(r'extern "C" __global__ void __launch_bounds__\((.*)\) (\w+)\(')
SPEC = re.compile(r'\{::mkv::cuda::ParamSpec::(\w+), (\d+), [^"]*"(\w+)"\}')
DESC = re.compile(r'const ::mkv::cuda::KernelDesc mkv_desc_(\d+) = \{"(\w+)", "([^"]+)", (\d+), '
                  r"reinterpret_cast<const void\*>\(&(\w+)\), (\w+), (\d+), (.*)\};")


# metal/gemv_tokens.metal builds its 8-token shapes for the host executor only,
# metal/attention_decode_host.metal and attention_prefill_host.metal their
# attention shapes (the _h kernels), metal/gemm_host.metal its prefill gemm (gemm_<fmt>_h),
# metal/elementwise_host.metal its RMSNorm (rms_norm_<w>_h).
HOST_ONLY = re.compile(r"^gemv_\w+_t8$|^attn_(decode|prefill|scores)_\w+_h$|^gemm_\w+_h$|^rms_norm_\w+_h$")


def host_kernels(path: pathlib.Path) -> list[kernel_source.Kernel]:
    """What metal_pass.py registers, less the host-only kernels: its parsing, run directly."""
    src = kernel_source.Source(kernel_source.preprocess(CXX, str(path), [str(METAL)]), str(ROOT))
    return [k for k in kernel_source.find_kernels(src)[0] if not HOST_ONLY.match(k.host_name)]


def test_only_the_8_token_gemv_shapes_are_host_only():
    src = kernel_source.Source(kernel_source.preprocess(CXX, str(METAL / "gemv_tokens.metal"), [str(METAL)]),
                               str(ROOT))
    names = [k.host_name for k in kernel_source.find_kernels(src)[0]]
    host_only = [n for n in names if HOST_ONLY.match(n)]
    # 11 formats x (8 rows, 32 rows) x 3 (gemv, swiglu, geglu)
    assert len(host_only) == 66 and sum("_r32_t8" in n for n in host_only) == 33
    assert len(names) - len(host_only) == 78  # the GPU shapes: (11 formats + f16/bf16 c4) x 2 widths x 3


def test_host_decode_shape_is_host_only():
    """Every kernel of attention_decode_host.metal is an _h kernel, and each
    is the host form of a kernel every device has (attention_decode.metal's,
    fixed-format pairs read through kvq)."""
    def names(f):
        src = kernel_source.Source(kernel_source.preprocess(CXX, str(METAL / f), [str(METAL)]), str(ROOT))
        return [k.host_name for k in kernel_source.find_kernels(src)[0]]
    host = names("attention_decode_host.metal")
    everywhere = set(names("attention_decode.metal"))
    # f16 9 D x (plain, _lg), kvq 5 D x (plain, _res, _lg), _r4 2 D x (f16, kvq, kvq_res): x (single, split)
    assert len(host) == 2 * (18 + 15 + 6) and all(HOST_ONLY.match(n) for n in host)
    assert {n[:-len("_h")] for n in host} <= everywhere


def test_host_prefill_shape_is_host_only():
    """Every kernel of attention_prefill_host.metal is the _h form of one of
    attention_prefill.metal's (f16 at 9 D, kvq at 5)."""
    def names(f):
        src = kernel_source.Source(kernel_source.preprocess(CXX, str(METAL / f), [str(METAL)]), str(ROOT))
        return [k.host_name for k in kernel_source.find_kernels(src)[0]]
    host = names("attention_prefill_host.metal")
    assert len(host) == 9 + 5 and all(HOST_ONLY.match(n) for n in host)
    assert {n[:-len("_h")] for n in host} == set(names("attention_prefill.metal"))


def expected_specs(k: kernel_source.Kernel) -> list[tuple[str, int, str]]:
    """The CUDA thunk's parameters: builtins are computed, not passed."""
    kinds = {"buffer": "buffer", "threadgroup": "threadgroup_memory"}
    return [("bytes" if p.is_constant_reference else kinds[p.kind], p.index, p.name)
            for p in k.params if p.kind != "builtin"]


def registered(cu: str) -> dict[str, dict]:
    """Thunks and KernelDesc tables of a generated .cu, by kernel name."""
    thunks = {m.group(2): m.group(1) for m in THUNK.finditer(cu)}
    tables = {m.group(1): SPEC.findall(m.group(2))
              for m in re.finditer(r"ParamSpec mkv_params_(\d+)\[\] = \{(.*)\};", cu)}
    out = {}
    for m in DESC.finditer(cu):
        n, name, file, line, fn, table, n_params, limit = m.groups()
        assert f"KernelRegistrar mkv_registrar_{n}(&mkv_desc_{n});" in cu
        specs = [(kind, int(index), pname) for kind, index, pname in tables.get(n, [])]
        assert table == (f"mkv_params_{n}" if specs else "nullptr")
        out[name] = dict(file=file, line=int(line), fn=fn, specs=specs, n_params=int(n_params),
                         limit=limit, launch_bounds=thunks.get(name))
    return out


@pytest.mark.parametrize("path", KERNEL_FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_same_kernels_and_bindings_as_the_host_pass(path):
    host = host_kernels(path)
    cu, kernels = cuda_pass.translate(CXX, str(path), [str(METAL)], str(ROOT))
    got = registered(cu)
    assert [k.host_name for k in kernels] == [k.host_name for k in host]
    assert sorted(got) == sorted(k.host_name for k in host)
    for k in host:
        g = got[k.host_name]
        assert g["fn"] == k.host_name, "the thunk is found by the kernel's name"
        assert (g["file"], g["line"]) == (k.file, k.line)
        assert g["specs"] == expected_specs(k), k.host_name
        assert g["n_params"] == len(g["specs"])
        limit = f"uint32_t({k.max_threads})" if k.max_threads else "::mkv::cuda::kMaxThreadsPerThreadgroup"
        assert g["limit"] == limit and g["launch_bounds"] == limit, k.host_name
    # Nothing of MSL's address spaces or kernel attributes is left for nvcc.
    code = "\n".join(line for line in cu.splitlines() if not line.startswith("#"))
    assert not re.search(r"\b(device|constant|thread|threadgroup|kernel)\b", code)
    assert not re.search(r"\[\[\s*(kernel|buffer|threadgroup|max_total_threads_per_threadgroup|host_name)", code)


def test_bindings_spelled_out():
    """A few kernels whose thunk parameters are known by heart."""
    def specs(rel: str, name: str) -> list:
        cu, _ = cuda_pass.translate(CXX, str(ROOT / rel), [str(METAL)], str(ROOT))
        return registered(cu)[name]["specs"]
    assert specs("metal/attention_decode.metal", "attn_decode_f16_d128") == [
        ("bytes", 0, "p"), ("buffer", 1, "q"), ("buffer", 2, "kv"), ("buffer", 3, "sinks"), ("buffer", 4, "out"),
        ("buffer", 5, "table"), ("buffer", 6, "ring"), ("buffer", 7, "logits")]
    assert specs("metal/test/reduce.metal", "test_reduce_tree") == [
        ("bytes", 0, "p"), ("buffer", 1, "in"), ("buffer", 2, "partial"), ("threadgroup_memory", 0, "scratch")]
    assert specs("metal/test/collectives.metal", "test_simd_reduce_f16") == [
        ("buffer", 0, "in"), ("buffer", 1, "out"), ("bytes", 2, "active")]
    cu, _ = cuda_pass.translate(CXX, str(METAL / "attention_decode.metal"), [str(METAL)], str(ROOT))
    shared = re.findall(r"^\s*__shared__\s+float\s+(\w+)\[", cu, re.M)
    assert shared == ["tg_m", "tg_l", "tg_acc"] * 2  # in attn_decode and attn_decode_split


def test_pass_errors_name_the_metal_line(tmp_path):
    bad = tmp_path / "bad.metal"
    bad.write_text('#include "mkv_kernel.h"\n'
                   "kernel void k(device float* a [[buffer(0)]],\n"
                   "              uint q [[quad_lane_id]]) { a[0] = 1.0f; }\n")
    with pytest.raises(kernel_source.PassError, match=r"bad.metal:2: .*\[\[quad_lane_id\]\], which the CUDA device"):
        cuda_pass.translate(CXX, str(bad), [str(METAL)], str(tmp_path))
    bad.write_text('#include "mkv_kernel.h"\n'
                   "template <uint N> kernel void k(device float* a [[buffer(0)]]) { a[0] = N; }\n"
                   'MKV_KERNEL("k-1", k<1>)\n')
    with pytest.raises(kernel_source.PassError, match=r"'k-1' is not a C identifier"):
        cuda_pass.translate(CXX, str(bad), [str(METAL)], str(tmp_path))


def _env_without_preload() -> dict[str, str]:
    """The sanitizer CI stage preloads libasan into Python; nvcc crashes under it."""
    return {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}


# types.metal: half arithmetic, swizzles, atomics on device and threadgroup memory;
# simdgroup_matrix.metal: <metal_simdgroup_matrix> (its own prelude file) for float, half, bfloat.
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
@pytest.mark.parametrize("name", ["types", "simdgroup_matrix"])
def test_a_kernel_file_compiles_with_nvcc(tmp_path, name):
    cu, _ = cuda_pass.translate(CXX, str(METAL / f"test/{name}.metal"), [str(METAL)], str(ROOT))
    (tmp_path / f"{name}.cu").write_text(cu)
    res = subprocess.run(["nvcc", "-std=c++17", "-O3", "-arch=sm_90", "-I", str(ROOT / "cpp/gpu/cuda/prelude"),
                          "-c", str(tmp_path / f"{name}.cu"), "-o", str(tmp_path / f"{name}.o")],
                         capture_output=True, text=True, env=_env_without_preload())
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr, res.stderr


def test_pointers_into_threadgroup_memory_are_thread_variables():
    """`threadgroup float* p = ...;` declares a pointer in thread space, not a
    threadgroup variable: both passes leave it as it is (an array is rewritten)."""
    text = ("kernel void k(device float* out) {\n"
            "  threadgroup float tile[64];\n"
            "  threadgroup float* half_tile = tile + 32;\n"
            "  threadgroup float& first = tile[0];\n"
            "  out[0] = half_tile[0] + first;\n"
            "}\n")
    decls = kernel_source.threadgroup_declarations(kernel_source.Source(text, str(ROOT)))
    assert [(d.name, d.type, d.dims) for d in decls] == [("tile", "float", "[64]")]
