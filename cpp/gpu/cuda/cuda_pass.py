#!/usr/bin/env python3
"""Build-time pass: one metal/*.metal file -> one CUDA translation unit for nvcc.

The kernel source is read as the host pass reads it (cpp/gpu/kernel_source.py:
preprocessed with <metal_stdlib> stubbed out, kernels, instantiations,
parameter bindings), then turned into CUDA where a macro in the prelude
(cpp/gpu/cuda/prelude/metal_stdlib) cannot do it:
  * `threadgroup T name[N];` at statement start -> `__shared__ T name[N];`;
  * the address-space words go: `device`, `thread`, `threadgroup`, `kernel`
    become spaces (`device` cannot be a macro: CUDA's __device__ expands to
    __attribute__((device))), `constant` becomes `const`; program-scope
    `constant` data that is not a constexpr scalar becomes `__constant__`;
  * `[[kernel]]`, `[[max_total_threads_per_threadgroup(n)]]` and the parameter
    attributes are blanked (they were read first);
  * every function definition gets `__device__` (`__host__ __device__` when
    constexpr: the params headers' constexpr helpers also run on the host);
  * every kernel and `[[host_name]]` instantiation gets an `extern "C"
    __global__` thunk named by its host name, with __launch_bounds__ from
    [[max_total_threads_per_threadgroup(n)]] (else 1024), and a KernelDesc +
    KernelRegistrar (the ABI is cpp/gpu/cuda/kernel_abi.h).
Edits keep the text's length until the __device__ insertions, and the
preprocessor's line markers stay, so nvcc's errors name .metal lines.

    cuda_pass.py [--cxx c++] --root DIR -I metal IN.metal OUT.cu

Then: nvcc -std=c++17 -O3 -arch=sm_90 --expt-relaxed-constexpr -I cpp/gpu/cuda/prelude -c OUT.cu
(no -use_fast_math: metalkv's Metal backend compiles with fast math off too).
Function declarations without a body get no __device__ (metal/ has none).
"""
from __future__ import annotations

import argparse
import os
import re
import sys

sys.dont_write_bytecode = True  # run by the build: leave no __pycache__ in the source tree
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
from kernel_source import (BUILTINS, LINEMARKER, STUB_HEADERS, Kernel, PassError,  # noqa: E402
                           Source, blank, find_kernels, kernel_attribute_spans, optional_includes,
                           preprocess,
                           threadgroup_declarations, write_if_changed)

DEVICE = "CUDA device"
# CUDA expressions (x, y, z) of each builtin the thunks compute.
BUILTIN_EXPR = {
    "thread_position_in_grid": "blockIdx.x * blockDim.x + threadIdx.x, blockIdx.y * blockDim.y + threadIdx.y, "
                               "blockIdx.z * blockDim.z + threadIdx.z",
    "thread_position_in_threadgroup": "threadIdx.x, threadIdx.y, threadIdx.z",
    "thread_index_in_threadgroup": "::mkv::cuda::linear_tid(), 0u, 0u",
    "threadgroup_position_in_grid": "blockIdx.x, blockIdx.y, blockIdx.z",
    "threads_per_threadgroup": "blockDim.x, blockDim.y, blockDim.z",
    "threadgroups_per_grid": "gridDim.x, gridDim.y, gridDim.z",
    "threads_per_grid": "gridDim.x * blockDim.x, gridDim.y * blockDim.y, gridDim.z * blockDim.z",
    "thread_index_in_simdgroup": "::mkv::cuda::linear_tid() % 32u, 0u, 0u",
    "simdgroup_index_in_threadgroup": "::mkv::cuda::linear_tid() / 32u, 0u, 0u",
    "threads_per_simdgroup": "32u, 0u, 0u",
    "simdgroups_per_threadgroup": "(::mkv::cuda::block_threads() + 31u) / 32u, 0u, 0u",
    "thread_execution_width": "32u, 0u, 0u",
}
CUDA_BUILTINS = set(BUILTIN_EXPR)
assert BUILTINS <= CUDA_BUILTINS
ADDRESS_SPACE = {"device": "", "thread": "", "threadgroup": "", "kernel": "", "constant": "const"}
# Preprocessor lines, string and character literals (left alone), braces and semicolons.
TOKEN = re.compile(r'^[ \t]*#[^\n]*$|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|[{};]', re.M)
WORDS = re.compile(r'^[ \t]*#[^\n]*$|"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'|\b(?:' +
                   "|".join(ADDRESS_SPACE) + r")\b", re.M)


def rewrite_threadgroup_vars(src: Source) -> tuple[str, int]:
    """`threadgroup T name[N];` -> `__shared__ T name[N];` (same length)."""
    text = src.text
    decls = threadgroup_declarations(src)
    for d in decls:
        text = text[:d.start] + "__shared__ " + text[d.start + len("threadgroup"):]
    return text, len(decls)


def remove_address_spaces(text: str) -> str:
    """MSL's address-space words, padded to their length: CUDA pointers are
    generic, and `constant` keeps its read-only meaning."""
    def sub(m: re.Match) -> str:
        word = m.group(0)
        if word not in ADDRESS_SPACE:
            return word  # a preprocessor line or a literal
        return ADDRESS_SPACE[word].ljust(len(word))
    return WORDS.sub(sub, text)


def skip_template_headers(text: str, i: int, end: int) -> int:
    """Index after whitespace, line markers, `template <...>` headers and access
    specifiers starting at i."""
    while True:
        while i < end and (text[i].isspace() or (text[i] == "#" and text.rfind("\n", 0, i) + 1 == i)):
            i = text.index("\n", i) if text[i] == "#" else i + 1
        access = re.compile(r"(public|private|protected)\s*:").match(text, i, end)
        if access:
            i = access.end()
            continue
        if not re.compile(r"template\b").match(text, i, end):
            return i
        depth, k = 0, text.index("<", i)
        while True:
            depth += {"<": 1, ">": -1}.get(text[k], 0)
            if depth == 0:
                break
            k += 1
        i = k + 1


FUNCTION_HEAD = re.compile(r"\)\s*(?:const\s*)?(?:noexcept\s*)?(?:->[^{;]*)?$")


def declaration_kind(core: str) -> str:
    """What a `{` after this declaration head opens: ns, class, body (a
    function definition) or other (enum, initializer)."""
    if re.match(r"\s*(inline\s+)?namespace\b", core) or re.match(r'\s*extern\s*"C"', core):
        return "ns"
    if re.search(r"=\s*$", core) or re.match(r"\s*(typedef\s+)?enum\b", core):
        return "other"
    if "(" in core and FUNCTION_HEAD.search(core):
        return "body"
    if re.match(r"\s*(typedef\s+)?(struct|class|union)\b", core):
        return "class"
    return "other"


def add_device_specifiers(src: Source, text: str) -> tuple[str, int]:
    """`__device__` before every function definition at namespace or class
    scope, `__constant__` before program-scope constant data that is not a
    constexpr scalar. `text` has src.text's length (offsets agree)."""
    stack = ["ns"]
    decl_start = 0  # start of the current declaration in the innermost ns/class scope
    inserts = []
    for m in TOKEN.finditer(text):
        tok = m.group(0)
        if tok not in "{};":
            continue
        scope = stack[-1]
        if tok == "{":
            if scope not in ("ns", "class"):
                stack.append("other" if scope == "other" else "body")
                continue
            at = skip_template_headers(text, decl_start, m.start())
            core = " ".join(LINEMARKER.sub(" ", text[at:m.start()]).split())
            kind = declaration_kind(core)
            if kind == "body" and not re.search(r"\b__(device|global|host)__\b", core):
                constexpr = re.search(r"\bconstexpr\b", core)
                inserts.append((at, "__host__ __device__ " if constexpr else "__device__ "))
            stack.append(kind)
            if kind in ("ns", "class"):
                decl_start = m.end()
        elif tok == "}":
            # An enum or a braced initializer is part of a declaration that
            # goes on to its `;`; a class, namespace or function body ends one.
            if stack.pop() != "other" and stack[-1] in ("ns", "class"):
                decl_start = m.end()
        else:  # ;
            if scope == "ns":
                at = skip_template_headers(text, decl_start, m.start())
                core = " ".join(LINEMARKER.sub(" ", src.text[at:m.start()]).split())
                declarator = core.split("=")[0]
                if re.search(r"\bconstant\b", core) and "(" not in declarator and (
                        not re.search(r"\bconstexpr\b", core) or "[" in declarator):
                    inserts.append((at, "__constant__ "))
            if scope in ("ns", "class"):
                decl_start = m.end()
    for at, spec in sorted(inserts, reverse=True):
        text = text[:at] + spec + text[at:]
    return text, len(inserts)


def thunk(k: Kernel, n: int) -> str:
    """The __global__ thunk of one kernel, and its registration."""
    if not re.fullmatch(r"[A-Za-z_]\w*", k.host_name):
        raise PassError(f"{k.file}:{k.line}: kernel name '{k.host_name}' is not a C identifier; "
                        "the CUDA device names each kernel's extern \"C\" thunk by it")
    fn = f"mkv_fn_{n}"
    formals, actuals, specs = [], [], []
    for i, p in enumerate(k.params):
        pt = f"::mkv::cuda::param_t<{fn}, {i}>"
        if p.kind == "builtin":
            actuals.append(f"::mkv::cuda::builtin<{pt}>({BUILTIN_EXPR[p.builtin]})")
            continue
        if p.kind == "threadgroup":
            formals.append(f"uint32_t {p.name}_offset")
            actuals.append(f"::mkv::cuda::bind_threadgroup<{pt}>({p.name}_offset)")
            specs.append(f'{{::mkv::cuda::ParamSpec::threadgroup_memory, {p.index}, 4, "{p.name}"}}')
        elif p.is_constant_reference:
            formals.append(f"::mkv::cuda::bytes_t<{pt}> {p.name}")
            actuals.append(p.name)
            specs.append(f"{{::mkv::cuda::ParamSpec::bytes, {p.index}, "
                         f'uint32_t(sizeof(::mkv::cuda::bytes_t<{pt}>)), "{p.name}"}}')
        else:
            formals.append(f"::mkv::cuda::buffer_t<{pt}> {p.name}")
            actuals.append(f"::mkv::cuda::bind_buffer<{pt}>({p.name})")
            specs.append(f"{{::mkv::cuda::ParamSpec::buffer, {p.index}, "
                         f'uint32_t(sizeof(::mkv::cuda::buffer_t<{pt}>)), "{p.name}"}}')
    # [[max_total_threads_per_threadgroup(n)]]: a constant expression of the kernel
    # file; it also bounds the registers nvcc may use, so n threads always launch.
    limit = f"uint32_t({k.max_threads})" if k.max_threads else "::mkv::cuda::kMaxThreadsPerThreadgroup"
    # The thunks live in a namespace of their own: a kernel that is not a
    # template has the same name as its thunk (extern "C" names the symbol only).
    # It is nested in the kernels' namespace, where the template arguments and the
    # launch bound (mkv_params::...) are looked up.
    lines = [f'#line {k.line} "{k.file}"',
             f"namespace mkv_cuda_src {{ namespace mkv_cuda_thunks {{",
             f"using {fn} = decltype(&::mkv_cuda_src::{k.expr});",
             f'extern "C" __global__ void __launch_bounds__({limit}) {k.host_name}({", ".join(formals)}) {{',
             f"  ::mkv_cuda_src::{k.expr}({', '.join(actuals)});",
             "}",
             "namespace {"]
    table = "nullptr"
    if specs:
        lines.append(f"const ::mkv::cuda::ParamSpec mkv_params_{n}[] = {{{', '.join(specs)}}};")
        table = f"mkv_params_{n}"
    lines += [f'const ::mkv::cuda::KernelDesc mkv_desc_{n} = {{"{k.host_name}", "{k.file}", {k.line}, '
              f"reinterpret_cast<const void*>(&{k.host_name}), {table}, {len(specs)}, {limit}}};",
              f"const ::mkv::cuda::KernelRegistrar mkv_registrar_{n}(&mkv_desc_{n});",
              "}", "}}  // namespace mkv_cuda_src::mkv_cuda_thunks"]
    return "\n".join(lines)


def absolute_line_names(text: str, root: str) -> str:
    """Line markers and #line directives naming root-relative files name them by
    their absolute path: nvcc's dependency file lists every file they name, and
    ninja, which runs nvcc in the build directory, would never find
    `metal/quant.h` there and so recompile every kernel on every build."""
    def absolute(m: re.Match) -> str:
        name = m.group(2)
        if name.startswith(("/", "<")):
            return m.group(0)
        return f'{m.group(1)}"{os.path.join(root, name)}"'
    return re.sub(r'^(#line \d+ |# \d+ )"([^"]*)"', absolute, text, flags=re.M)


def translate(cxx: str, path: str, includes: list[str], root: str) -> tuple[str, list[Kernel]]:
    pre = preprocess(cxx, path, includes, "__METALKV_CUDA__")
    src = Source(pre, root)
    kernels, drops = find_kernels(src, CUDA_BUILTINS, DEVICE)
    text = blank(src.text, drops + kernel_attribute_spans(src.text))
    text, n_shared = rewrite_threadgroup_vars(Source(text, root))
    spaced = remove_address_spaces(text)
    body, n_device = add_device_specifiers(Source(text, root), spaced)
    body = src.relative_linemarkers(body)
    rel = src.rel(os.path.abspath(path))
    head = [f"// Generated by cpp/gpu/cuda/cuda_pass.py from {rel}: {len(kernels)} kernels, "
            f"{n_shared} __shared__ declarations, {n_device} __device__/__constant__ insertions. Do not edit.",
            "#include <metal_stdlib>"] + optional_includes(pre)
    # The kernel code in a namespace of its own: the host executor's translation of
    # the same file defines the same C++ functions, and both are linked into _core.
    out = "\n".join(head) + "\nnamespace mkv_cuda_src {\n" + body + "\n}  // namespace mkv_cuda_src\n" + "\n".join(
        thunk(k, i) for i, k in enumerate(kernels)) + "\n"
    return absolute_line_names(out, os.path.abspath(root)), kernels


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cxx", default="c++", help="C++ compiler used as the preprocessor")
    ap.add_argument("--root", required=True, help="project root: file names are relative to it")
    ap.add_argument("-I", dest="include", action="append", default=[])
    ap.add_argument("input")
    ap.add_argument("output")
    args = ap.parse_args()
    try:
        out, _ = translate(args.cxx, args.input, args.include, args.root)
    except PassError as e:
        print(f"cuda_pass: error: {e}", file=sys.stderr)
        return 1
    write_if_changed(args.output, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
