"""tools/sass_count.py's parsing, on text shaped as cuda_pass.py and cuobjdump
write it: only the asked kernels (and their registrations) are kept for nvcc,
and a loop is a backward branch whose body holds no EXIT (the divergent-warp
fallbacks at a kernel's end branch back into its middle, and are not loops)."""
from __future__ import annotations

import pathlib
import re

from scripts import load_script  # tests/ is on sys.path

sass_count, _ = load_script(pathlib.Path(__file__).resolve().parents[2] / "tools" / "sass_count.py")

CU = """#include <metal_stdlib>
namespace mkv_cuda_src {
template <class F> void body();
}
extern "C" __global__ void __launch_bounds__(uint32_t(4 * 32)) gemv_q4_0_r2(::mkv::cuda::bytes_t<int> p) {
  body<int>();
}
namespace {
const ::mkv::cuda::KernelDesc mkv_desc_0 = {"gemv_q4_0_r2"};
const ::mkv::cuda::KernelRegistrar mkv_registrar_0(&mkv_desc_0);
}
extern "C" __global__ void __launch_bounds__(uint32_t(4 * 32)) gemv_q8_0_r2(::mkv::cuda::bytes_t<int> p) {
  body<float>();
}
namespace {
const ::mkv::cuda::KernelDesc mkv_desc_1 = {"gemv_q8_0_r2"};
const ::mkv::cuda::KernelRegistrar mkv_registrar_1(&mkv_desc_1);
}
}}  // namespace mkv_cuda_src::mkv_cuda_thunks
"""


def test_only_the_asked_kernels_are_kept():
    text, kept = sass_count.keep_kernels(CU, [re.compile(r"q8_0")])
    assert kept == ["gemv_q8_0_r2"]
    assert "gemv_q4_0_r2" not in text and "mkv_registrar_0" not in text
    assert "body<float>();" in text and "mkv_registrar_1" in text
    lines = CU.splitlines()
    q4 = lines.index(next(x for x in lines if "gemv_q4_0_r2(" in x))
    assert text.splitlines() == lines[:q4] + lines[q4 + 7:]  # the wrapper and its registration, nothing else


def ins(*ops):
    return [(16 * i, sass_count.opcode(op), op) for i, op in enumerate(ops)]


def test_loops_are_backward_branches_without_an_exit():
    code = ins("S2R R0, SR_TID.X", "LDG.E.128 R4, desc[UR4][R2.64]", "FFMA R8, R4, R5, R8",
               "@!P0 BRA 0x10", "@P1 EXIT", "SHFL.BFLY PT, R1, R8, 0x1, 0x1f", "BRA 0x20", "EXIT", "BRA 0x80")
    # 0x10 .. 0x30: the loop; BRA 0x20 from after the EXIT: a fallback; BRA 0x80 to itself: the end
    assert sass_count.loops(code) == [(1, 3), (8, 8)]
    assert sass_count.classify([op for _, op, _ in code[1:4]]) == {"global loads": 1, "float": 1, "other": 1}


def test_gemv_weights_per_iteration_follow_the_kernel_constants():
    assert sass_count.gemv_weights_per_iteration("q4_0", 2, 1) == 2 * 2 * 16  # kGemvUnrollQuant chunks of 16
    assert sass_count.gemv_weights_per_iteration("f16", 1, 1) == 4 * 8        # kGemvUnroll chunks of FmtF16x8
    assert sass_count.gemv_weights_per_iteration("q6_k", 2, 4) == 2 * 16      # several tokens: no unrolling
