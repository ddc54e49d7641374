#!/usr/bin/env python3
"""Address-space check of the Metal kernels, without Apple's compiler.

    python tools/check_msl.py                 # every kernel file (see KERNEL_DIRS, EXCLUDED)
    python tools/check_msl.py metal/rope.metal [--clang PATH] [-j N]

Each file is compiled by clang in C++-for-OpenCL mode (-x clcpp
-cl-std=clc++2021 -fsyntax-only), where address spaces are part of the type,
against tools/msl_check/metal_stdlib, a prelude that maps MSL onto it (device,
threadgroup, constant, thread -> __global, __local, __constant, __private;
vector types whose constructors count lanes; library functions declared for
one argument type only). So a device pointer passed where a threadgroup one is
expected, a write through constant, float4(float3), min(uint, int), double, a
variable-length array or a non-constant global fails here as on a Mac.

A lint (tools/msl_check/msl_lint.py) covers what clang accepts but Apple's
compiler does not: lambdas, goto, virtual, new/delete, exceptions, RTTI,
std::, recursion, unknown [[attributes]] or ones on a kernel parameter of the
wrong type, and pointer or reference parameters with no address space (which
clang would take as generic, hiding misuse).

Before clang sees a file, two constructs it cannot parse are rewritten in a
copy, line numbers kept (tools/msl_check/msl_source.py): the attribute lists
of `template [[host_name(..)]] [[kernel]] ...` instantiations are blanked, and
a kernel's `threadgroup T name[N];` becomes a reference to __local memory.
The copies reach clang through a VFS overlay, so messages name the real
files. Exit status: 0 clean, 1 errors (each names the .metal/.h line),
2 no clang or bad arguments.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PRELUDE = REPO / "tools" / "msl_check"
METAL = REPO / "metal"
KERNEL_DIRS = (METAL, METAL / "test")
# Left out of the default run, with the reason. (metal/test/broken.metal is
# checked: its kernels are valid MSL that fail the host executor's runtime
# validation, which is a different thing.)
EXCLUDED: dict[str, str] = {}

sys.path.insert(0, str(PRELUDE))
from msl_lint import Finding, lint_file, lint_recursion  # noqa: E402
from msl_source import Source, prepare_for_clang  # noqa: E402

CLANG_FLAGS = [
    "-x", "clcpp", "-cl-std=clc++2021",
    "-cl-no-stdinc",  # no OpenCL builtin header: its min(), float4 ... are not MSL's
    # half arithmetic on; no double; no writable program-scope variables (and the two
    # features that need them). The generic address space stays: without it clang
    # cannot copy a struct to or from device memory (valid MSL); the lint's
    # address-space rule covers what generic would let through.
    "-Xclang",
    "-cl-ext=+cl_khr_fp16,-cl_khr_fp64,-__opencl_c_fp64,-__opencl_c_program_scope_global_variables,"
    "-__opencl_c_device_enqueue,-__opencl_c_pipes",
    "-fsyntax-only",
    "-D__METAL_VERSION__=310", "-D__METAL_MACOS__=1",  # what Apple's compiler predefines
    "-DMKV_CHECK_HOST_SHAPES",  # the host executor's shapes too (metal/mkv_kernel.h)
    "-Wno-unknown-attributes",  # [[buffer(0)]] and the rest: the lint checks their names
    "-Werror=infinite-recursion",
    "-fno-color-diagnostics", "-fno-caret-diagnostics", "-ferror-limit=50",
]
MIN_CLANG = 14  # first with -cl-std=clc++2021


def fail(message: str) -> None:
    print(f"check_msl: {message}", file=sys.stderr)
    sys.exit(2)


def find_clang(explicit: str | None) -> tuple[str, str]:
    """(path, version line) of the clang to use, or exits 2 saying how to get one."""
    candidates = [explicit] if explicit else ["clang-19", "clang"]
    for name in candidates:
        path = shutil.which(name) or (name if explicit and Path(name).is_file() else None)
        if not path:
            continue
        try:
            version = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=30).stdout
        except OSError:
            continue
        first = version.splitlines()[0] if version else name
        m = re.search(r"clang version (\d+)", first)
        if m and int(m.group(1)) < MIN_CLANG:
            fail(f"{path} is {first}; the check needs clang >= {MIN_CLANG} (apt-get install clang-19)")
        return path, first
    if explicit:
        fail(f"--clang {explicit}: not found or not runnable")
    fail("no clang found (looked for clang-19, then clang, on PATH). "
         "Install Debian's clang-19 (apt-get install clang-19) or pass --clang PATH.")


def default_files() -> list[Path]:
    files = []
    for d in KERNEL_DIRS:
        for p in sorted(d.glob("*.metal")):
            if str(p.relative_to(REPO)) not in EXCLUDED:
                files.append(p)
    return files


_INCLUDE = re.compile(r'^[ \t]*#[ \t]*include[ \t]*(?:"([^"]+)"|<([^>]+)>)', re.M)


def translation_unit(path: Path, include_dirs: list[Path], sources: dict[Path, Source]) -> list[Path]:
    """The file and the project headers it includes, transitively (prelude excluded)."""
    order, todo = [], [path]
    while todo:
        p = todo.pop()
        if p in order:
            continue
        order.append(p)
        if p not in sources:
            sources[p] = Source(display(p), p.read_text(encoding="utf-8"))
        # the masked text has no host-only branches (#ifndef __METAL_VERSION__) but
        # blank "names": read those at the same offsets in the real text
        src = sources[p]
        for hit in _INCLUDE.finditer(src.masked):
            m = _INCLUDE.match(src.text, hit.start())
            if m is None:
                continue
            quoted, angled = m.group(1), m.group(2)
            name = quoted or angled
            dirs = ([p.parent] if quoted else []) + include_dirs
            for d in dirs:
                cand = (d / name).resolve()
                if cand.is_file():
                    if PRELUDE not in cand.parents:
                        todo.append(cand)
                    break
    return order


def display(p: Path) -> str:
    try:
        return os.path.relpath(p)
    except ValueError:
        return str(p)


# ---- clang's output, in MSL terms -------------------------------------------
_DIAG = re.compile(
    r"^(?P<path>[^\s:][^:]*):(?P<line>\d+):(?P<col>\d+): (?P<sev>fatal error|error|warning|note): (?P<msg>.*)$"
)
_INCLUDED = re.compile(r"^In file included from (?P<path>[^:]+):(?P<line>\d+):")
_SCALAR_NAMES = {"unsigned char": "uchar", "unsigned short": "ushort", "unsigned int": "uint", "unsigned long": "ulong"}
_TRANSLATE = [
    (re.compile(r"\b__global\b"), "device"),
    (re.compile(r"\b__local\b"), "threadgroup"),
    (re.compile(r"\b__constant\b"), "constant"),
    (re.compile(r"\b__private\b"), "thread"),
    (re.compile(r"\b__msl_name_(\w+)"), r"\1"),
    (re.compile(r"\b__msl_atomic_(\w+)"), r"atomic_\1"),
    (re.compile(r"\b__msl_type<([^<>]+)>"), r"\1"),
    (re.compile(r"\b((?:unsigned )?\w+) __attribute__\(\(ext_vector_type\((\d)\)\)\)"),
     lambda m: _SCALAR_NAMES.get(m.group(1), m.group(1)) + m.group(2)),
    (re.compile(r"'([^']*)' \(aka '\1'\)"), r"'\1'"),  # after the above, often one type twice
]
_HINTS = [
    ("no vector constructor",
     "a vector constructor takes one scalar, one vector of the same width, or scalars and "
     "vectors whose lanes add up to the width (float4(float3) alone does not)"),
    ("non-kernel function variable cannot be declared in local address space",
     "threadgroup variables belong to a kernel function (declare them there, as "
     "`threadgroup T name[N];` with no initializer, and pass a pointer to helpers)"),
    ("deduced conflicting types for parameter 'T'",
     "MSL's library functions take arguments of one type: convert one of them"),
]
# Copying a struct out of constant memory is valid MSL, but clang's implicit copy
# constructor and assignment take generic memory, which excludes constant: such an
# error is shown as a warning. (Writing *into* constant memory has another note.)
_CONSTANT_COPY = re.compile(
    r"candidate (?:constructor|function) \(the implicit (?:copy|move) (?:constructor|assignment operator)\) "
    r"not viable: cannot bind reference in address space '__constant' to object in address space '__generic'"
)


def translate(line: str) -> str:
    for pattern, repl in _TRANSLATE:
        line = pattern.sub(repl, line)
    return line


def in_prelude(path: str) -> bool:
    try:
        return PRELUDE in Path(path).resolve().parents
    except OSError:
        return False


def diagnostics(output: str) -> list[tuple[str, list[str], bool]]:
    """clang's output as (headline, following lines, clang called it an error) per
    error or warning; an error raised inside the prelude gets the headline of the
    first user line in its notes."""
    blocks: list[list[str]] = []
    pending: list[str] = []  # "In file included from" lines before a headline
    for line in output.splitlines():
        m = _DIAG.match(line)
        if _INCLUDED.match(line):
            pending.append(line)
        elif m and m.group("sev") != "note":
            blocks.append(pending + [line])
            pending = []
        elif blocks and not re.match(r"^\d+ (errors?|warnings?)( and \d+ warnings?)? generated\.$", line):
            blocks[-1].append(line)
    out = []
    for block in blocks:
        head_i = next(i for i, line in enumerate(block) if _DIAG.match(line))
        m = _DIAG.match(block[head_i])
        sev, msg = m.group("sev"), m.group("msg")
        where = (m.group("path"), m.group("line"), m.group("col"))
        if in_prelude(where[0]):
            for line in block[head_i + 1 :]:
                n = _DIAG.match(line)
                if n and not in_prelude(n.group("path")):
                    where = (n.group("path"), n.group("line"), n.group("col"))
                    break
        notes = [line for line in block[head_i + 1 :] if ": note: " in line and "candidate" in line]
        if sev == "error" and notes and all(_CONSTANT_COPY.search(line) for line in notes):
            sev = "warning"
            msg += " [a struct copied out of constant memory: valid MSL this check cannot type-check]"
        msg = translate(msg)
        if "'__msl_vector'" in msg:
            found = (re.search(r"\[with V = (\w+), A = <(.*)>\]", translate(line)) for line in block)
            ctor = next((c for c in found if c), None)
            call = f"{ctor.group(1)}({ctor.group(2)})" if ctor else "this call"
            msg = f"no vector constructor {call}: the lanes of the arguments do not add up"
        hints = [hint for needle, hint in _HINTS if needle in msg or any(needle in line for line in block)]
        head = f"{display(Path(where[0]))}:{where[1]}:{where[2]}: {sev}: {msg}"
        keep_head = in_prelude(m.group("path"))  # the headline moved: keep clang's as context
        rest = [translate(_relative(line)) for i, line in enumerate(block) if i != head_i or keep_head]
        rest += [f"hint: {h}" for h in hints]
        out.append((head, rest, m.group("sev") != "warning"))
    return out


def _sort_key(head: str) -> tuple:
    m = re.match(r"^(.+?):(\d+):(\d+): ", head)
    return (m.group(1), int(m.group(2)), int(m.group(3))) if m else (head, 0, 0)


def _relative(line: str) -> str:
    m = _DIAG.match(line) or _INCLUDED.match(line)
    if m and os.path.isabs(m.group("path")):
        return line.replace(m.group("path"), display(Path(m.group("path"))), 1)
    return line


# ---- the run --------------------------------------------------------------------
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("files", nargs="*", type=Path, help="kernel files (default: every .metal in metal/, metal/test/)")
    ap.add_argument("--clang", help="clang to use (default: clang-19, then clang)")
    ap.add_argument("-j", "--jobs", type=int, default=min(2, os.cpu_count() or 1), help="clang processes at once")
    ap.add_argument("-I", dest="include", action="append", type=Path, default=[], help="extra include directory")
    args = ap.parse_args(argv)
    started = time.monotonic()
    clang, version = find_clang(args.clang)
    files = [f.resolve() for f in args.files] or default_files()
    for f in files:
        if not f.is_file():
            print(f"check_msl: {display(f)}: no such file", file=sys.stderr)
            return 2
    include_dirs = [d.resolve() for d in args.include] + [METAL, PRELUDE]

    # 1. Each file's translation unit, lint over all of it.
    sources: dict[Path, Source] = {}
    units = {f: translation_unit(f, include_dirs, sources) for f in files}
    findings: set[Finding] = set()
    for p, src in sources.items():
        findings.update(lint_file(src))
    for f, unit in units.items():
        findings.update(lint_recursion([sources[p] for p in unit]))

    # 2. clang, on rewritten copies reached through a VFS overlay.
    with tempfile.TemporaryDirectory(prefix="check_msl_") as tmp:
        roots = []
        for n, (p, src) in enumerate(sorted(sources.items())):
            prepared = prepare_for_clang(src)
            if prepared != src.text:
                copy = Path(tmp) / f"{n}_{p.name}"
                copy.write_text(prepared, encoding="utf-8")
                roots.append({"type": "file", "name": str(p), "external-contents": str(copy)})
        overlay = Path(tmp) / "overlay.yaml"
        overlay.write_text(json.dumps({"version": 0, "use-external-names": False, "roots": roots}))
        flags = CLANG_FLAGS + ["-ivfsoverlay", str(overlay)] + [f"-I{d}" for d in include_dirs]

        def run(f: Path) -> tuple[int, str]:
            r = subprocess.run([clang, *flags, str(f)], capture_output=True, text=True)
            return r.returncode, r.stderr + r.stdout

        with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, args.jobs)) as pool:
            outputs = dict(zip(files, pool.map(run, files)))

    # 3. Report clang's diagnostics and the lint's findings together, by file and line.
    entries: dict[str, tuple[tuple, list[str], bool]] = {}  # headline -> (sort key, lines under it, error)
    for f in files:
        returncode, output = outputs[f]
        reported = diagnostics(output)
        if returncode != 0 and not any(clang_error for _, _, clang_error in reported):
            # clang failed without a diagnostic we can place (a bad flag, a crash)
            head = f"{display(f)}:0:0: error: clang exited with status {returncode}"
            reported.append((head, output.splitlines(), True))
        for head, rest, _ in reported:  # a header's diagnostic, met again through another file, once
            entries.setdefault(head, (_sort_key(head), rest, ": error: " in head or ": fatal error: " in head))
    for finding in findings:
        entries.setdefault(str(finding), ((finding.path, finding.line, finding.col), [], True))
    errors = sum(1 for _, _, is_error in entries.values() if is_error)
    warnings = len(entries) - errors
    for head, (_, rest, _) in sorted(entries.items(), key=lambda e: e[1][0]):
        print(head)
        for line in rest:
            print("    " + line)
    headers = len(sources) - len(files)
    status = f"{errors} error{'s' * (errors != 1)}" if errors else "no errors"
    if warnings:
        status += f", {warnings} warning{'s' * (warnings != 1)}"
    print(f"check_msl: {len(files)} kernel files (+{headers} headers), {status} "
          f"[{version.strip()}; {time.monotonic() - started:.1f} s]")
    return 1 if errors else 0


if __name__ == "__main__":
    sys.exit(main())
