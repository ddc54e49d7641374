#!/usr/bin/env python3
"""Static counts of what the CUDA device's kernels compile to, without a GPU:
registers and spills (ptxas -v), and the SASS instructions of each loop.

    python tools/sass_count.py metal/matmul.metal 'gemv_q4_0$' 'gemv_q8_0$'
    python tools/sass_count.py metal/matmul.metal 'gemv_q4_k$' --arch 90 --show-loop

A .metal file goes through cpp/gpu/cuda/cuda_pass.py as the build runs it; only
the kernels whose names match one of the patterns (re.search) are kept, so nvcc
compiles a few kernels, not the file's hundreds. nvcc (PATH) builds a cubin and
cuobjdump -sass (PATH, or the pip wheel nvidia-cuda-cuobjdump's
nvidia/cu13/bin) disassembles it.

Per kernel it prints registers, spill bytes, the instructions in all, and every
loop (a backward branch: the instructions from its target to the branch), the
largest first, with its count of global loads, FMAs/FADDs/FMULs, integer ops,
conversions and shuffles. Dividing a loop's instructions by the weights one
lane handles per iteration gives instructions per weight: the figure issue 33
asks for (docs/KERNELS.md, "Instructions per weight"). A static count: branches
inside the loop are counted once whatever path runs.
"""
from __future__ import annotations

import argparse
import collections
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
KERNEL_START = re.compile(r"^extern \"C\" __global__ .*?\s(?!__launch_bounds__)(\w+)\((?:::mkv|\))")
REGISTRAR = re.compile(r"^const ::mkv::cuda::KernelRegistrar mkv_registrar_\d+")

# Opcode classes (the opcode's first dotted part).
CLASSES = {
    "global loads": ("LDG",), "shared": ("LDS", "STS"), "global stores": ("STG",),
    "float": ("FFMA", "FADD", "FMUL", "FMNMX", "FSETP", "FSEL", "HFMA2", "HADD2", "HMUL2", "FCHK", "MUFU"),
    "integer": ("IMAD", "IADD3", "LOP3", "SHF", "LEA", "ISETP", "IMNMX", "PRMT", "SEL", "BFE", "BFI", "I2IP",
                "VIADD", "IABS", "SGXT", "BMSK", "FLO", "POPC"),
    "conversions": ("I2F", "F2I", "F2F", "F2FP", "I2FP", "F2IP"),
    "shuffles": ("SHFL",), "tensor": ("HMMA", "IMMA", "HGMMA"),
    "moves": ("MOV", "UMOV", "S2R", "S2UR", "CS2R", "ULDC", "LDC", "R2UR"),
}


def tool(name: str) -> str:
    found = shutil.which(name)
    if found:
        return found
    for entry in sys.path:
        p = Path(entry) / "nvidia" / "cu13" / "bin" / name
        if p.exists():
            return str(p)
    raise SystemExit(f"{name} not found: put the CUDA toolkit's bin on PATH, or pip install nvidia-cuda-cuobjdump")


def keep_kernels(cu: str, patterns: list[re.Pattern]) -> tuple[str, list[str]]:
    """The generated .cu with only the matching kernels' wrappers and registrations."""
    out, kept, skipping = [], [], False
    for line in cu.splitlines():
        m = KERNEL_START.match(line)
        if m:
            skipping = not any(p.search(m.group(1)) for p in patterns)
            if not skipping:
                kept.append(m.group(1))
        if not skipping:
            out.append(line)
        elif REGISTRAR.match(line):
            skipping = "close"  # the registration's namespace closes on the next line
        elif skipping == "close":
            skipping = False
    return "\n".join(out) + "\n", kept


def compile_cubin(metal: Path, patterns: list[re.Pattern], arch: str, work: Path) -> tuple[Path, list[str], str]:
    cu_all = work / (metal.stem + ".all.cu")
    subprocess.run([sys.executable, str(ROOT / "cpp/gpu/cuda/cuda_pass.py"), "--cxx",
                    shutil.which("c++") or "g++", "--root", str(ROOT), "-I", str(ROOT / "metal"), str(metal),
                    str(cu_all)], check=True)
    text, kept = keep_kernels(cu_all.read_text(), patterns)
    if not kept:
        raise SystemExit(f"no kernel of {metal} matches {[p.pattern for p in patterns]}")
    cu = work / (metal.stem + ".cu")
    cu.write_text(text)
    cubin = work / (metal.stem + ".cubin")
    env = {k: v for k, v in os.environ.items() if k != "LD_PRELOAD"}
    res = subprocess.run([tool("nvcc"), "-std=c++17", "-O3", f"-arch=sm_{arch}", "-cubin", "--expt-relaxed-constexpr",
                          "-Xptxas", "-v", "-I", str(ROOT / "cpp/gpu/cuda/prelude"), str(cu), "-o", str(cubin)],
                         capture_output=True, text=True, env=env)
    if res.returncode:
        raise SystemExit(res.stderr)
    return cubin, kept, res.stderr


def ptxas_usage(log: str) -> dict[str, tuple[int, int]]:
    """kernel -> (registers, spill stores + loads in bytes) from ptxas -v."""
    usage, name = {}, None
    for line in log.splitlines():
        m = re.search(r"Compiling entry function '(\w+)'", line)
        if m:
            name = m.group(1)
        m = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line)
        if m and name:
            spill = int(m.group(1)) + int(m.group(2))
            usage[name] = (usage.get(name, (0, 0))[0], spill)
        m = re.search(r"Used (\d+) registers", line)
        if m and name:
            usage[name] = (int(m.group(1)), usage.get(name, (0, 0))[1])
    return usage


def sass_functions(cubin: Path) -> dict[str, list[tuple[int, str, str]]]:
    """kernel -> [(address, opcode, the whole instruction)]."""
    text = subprocess.run([tool("cuobjdump"), "-sass", str(cubin)], check=True, capture_output=True,
                          text=True).stdout
    funcs, cur = {}, None
    for line in text.splitlines():
        m = re.match(r"\s*Function : (\w+)", line)
        if m:
            cur = funcs.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m and cur is not None:
            cur.append((int(m.group(1), 16), opcode(m.group(2)), m.group(2).strip()))
    return funcs


def opcode(instruction: str) -> str:
    """'@!P0 BRA.DIV UR4, 0x10' -> 'BRA': the opcode without its guard and modifiers."""
    return re.sub(r"^@!?U?P\w+\s+", "", instruction.strip()).split()[0].split(".")[0]


def loops(ins: list[tuple[int, str, str]]) -> list[tuple[int, int]]:
    """(first, last) instruction indices of every backward branch's body."""
    index = {addr: i for i, (addr, _, _) in enumerate(ins)}
    found = []
    for i, (_, op, full) in enumerate(ins):
        m = re.search(r"0x([0-9a-f]+)\s*$", full) if op == "BRA" else None
        first = index.get(int(m.group(1), 16), i + 1) if m else i + 1
        # A body with an EXIT is no loop: the divergent-warp fallbacks at a
        # kernel's end branch back into its middle.
        if first <= i and not any(o == "EXIT" for _, o, _ in ins[first:i]):
            found.append((first, i))
    return sorted(found, key=lambda r: r[0] - r[1])


def classify(ops: list[str]) -> dict[str, int]:
    out = collections.Counter()
    for op in ops:
        out[next((c for c, names in CLASSES.items() if op in names), "other")] += 1
    return dict(out)


# The GPU gemv shapes' main loop: kUnroll chunks of each of the lane's R rows
# (metal/gemv.h gemv_lane_dots), chunks of F::kChunk weights (metal/quant.h).
GEMV_CHUNK = {"f32": 4, "f16": 8, "bf16": 8}  # the GPU formats (FmtF16x8, FmtBF16x8); quantized: 16
GEMV_FORMATS = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "q5_0", "q5_1", "q4_k", "q5_k", "q6_k")


def gemv_weights_per_iteration(fmt: str, rows: int, tokens: int) -> int:
    chunk = GEMV_CHUNK.get(fmt, 16)
    unroll = 1 if tokens > 1 else (2 if chunk >= 16 else 4)  # kGemvUnrollQuant, kGemvUnroll
    return unroll * rows * chunk


def gemv_table(arch: str, rows: tuple[int, ...] = (1, 2, 4)) -> list[dict]:
    """Per format and GPU width R (one token, and R = 2 with 4 tokens): registers,
    spills and the main loop's instructions per weight a lane reads."""
    names = [f"gemv_{f}_r{r}" for f in GEMV_FORMATS for r in rows] + [f"gemv_{f}_r2_t4" for f in GEMV_FORMATS]
    out = []
    with tempfile.TemporaryDirectory() as tmp:
        for metal in ("matmul.metal", "gemv_tokens.metal"):
            pats = [re.compile(re.escape(n) + "$") for n in names]
            cubin, kept, log = compile_cubin(ROOT / "metal" / metal, pats, arch, Path(tmp))
            usage, funcs = ptxas_usage(log), sass_functions(cubin)
            for name in kept:
                m = re.match(r"gemv_(\w+?)_r(\d)(?:_t(\d))?$", name)
                fmt, r, t = m.group(1), int(m.group(2)), int(m.group(3) or 1)
                ins = funcs[name]
                # the main loop: the most global loads (weights and activations), then the smallest
                first, last = max(loops(ins), key=lambda fl: (sum(op == "LDG" for _, op, _ in ins[fl[0]:fl[1] + 1]),
                                                              fl[0] - fl[1]))
                body = [op for _, op, _ in ins[first:last + 1]]
                w = gemv_weights_per_iteration(fmt, r, t)
                out.append({"kernel": name, "format": fmt, "rows": r, "tokens": t, "registers": usage[name][0],
                            "spill_bytes": usage[name][1], "loop_instructions": len(body), "loop_weights": w,
                            "per_weight": len(body) / w, "classes": classify(body)})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("metal", type=Path, nargs="?")
    ap.add_argument("patterns", nargs="*", help="kernel name regexes (re.search)")
    ap.add_argument("--gemv-table", action="store_true",
                    help="every weight format's GPU gemv shapes: instructions per weight of the main loop")
    ap.add_argument("--json", type=Path, help="--gemv-table: write the rows here too")
    ap.add_argument("--arch", default="90")
    ap.add_argument("--loops", type=int, default=3, help="loops shown per kernel, largest first")
    ap.add_argument("--show-loop", action="store_true", help="print the largest loop's instructions")
    a = ap.parse_args(argv)
    if a.gemv_table:
        rows = gemv_table(a.arch)
        print(f"{'kernel':<18}{'regs':>6}{'spill':>7}{'loop':>6}{'weights':>9}{'instr/weight':>14}")
        for r in rows:
            print(f"{r['kernel']:<18}{r['registers']:>6}{r['spill_bytes']:>7}{r['loop_instructions']:>6}"
                  f"{r['loop_weights']:>9}{r['per_weight']:>14.2f}")
        if a.json:
            import datetime
            import json
            a.json.write_text(json.dumps({"date": datetime.date.today().isoformat(), "arch": f"sm_{a.arch}",
                                          "nvcc": subprocess.run([tool("nvcc"), "--version"], capture_output=True,
                                                                 text=True).stdout.splitlines()[-1],
                                          "rows": rows}, indent=1))
        return 0
    if not a.metal or not a.patterns:
        ap.error("give a .metal file and kernel patterns, or --gemv-table")
    with tempfile.TemporaryDirectory() as tmp:
        cubin, kept, log = compile_cubin(a.metal.resolve(), [re.compile(p) for p in a.patterns], a.arch, Path(tmp))
        usage = ptxas_usage(log)
        funcs = sass_functions(cubin)
    for name in kept:
        ins = funcs.get(name, [])
        regs, spill = usage.get(name, (0, 0))
        print(f"{name}: {regs} registers, {spill} spill bytes, {len(ins)} instructions")
        for first, last in loops(ins)[:a.loops]:
            body = ins[first:last + 1]
            hist = ", ".join(f"{k} {v}" for k, v in sorted(classify([op for _, op, _ in body]).items(),
                                                               key=lambda kv: -kv[1]))
            print(f"  loop at {ins[first][0]:#06x}: {len(body)} instructions ({hist})")
        if a.show_loop and loops(ins):
            first, last = loops(ins)[0]
            for addr, _, full in ins[first:last + 1]:
                print(f"    {addr:#06x}  {full}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
