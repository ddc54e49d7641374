#!/usr/bin/env python3
"""Build-time pass over metal/*.metal, run by CMake.

Mode `host` turns one .metal file into a C++ translation unit for the host
executor. Macros cannot do two things, so this pass does them:
  * a `threadgroup` variable declared in a kernel body becomes one copy per
    threadgroup, looked up by declaration site at run time;
  * every kernel (and every `[[host_name("...")]]` template instantiation) gets
    a registration thunk that binds buffers, threadgroup memory and builtins by
    their Metal attributes.
The source is first run through the C preprocessor (our own headers and macros
expanded, <metal_stdlib> stubbed out), and the preprocessor's line markers are
kept so compiler errors and runtime diagnostics name .metal lines.

Mode `embed` writes a C++ file holding every .metal source, with our headers
inlined, for the Metal backend to compile at run time.

    metal_pass.py host  --cxx g++ --root DIR -I metal IN.metal OUT.cpp
    metal_pass.py embed --root DIR -I metal OUT.cpp IN.metal...
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import dataclass

BUILTINS = {
    "thread_position_in_grid", "thread_position_in_threadgroup",
    "thread_index_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid",
    "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup",
    "threads_per_simdgroup", "simdgroups_per_threadgroup",
}
STUB_HEADERS = ["metal_stdlib", "metal_math", "metal_atomic", "metal_simdgroup",
                "metal_compute", "metal_integer", "metal_common", "metal_geometric",
                "metal_relational"]
LINEMARKER = re.compile(r'^# (\d+) "([^"]*)"[^\n]*$', re.M)


class PassError(Exception):
    pass


@dataclass
class Param:
    name: str
    kind: str   # buffer | threadgroup | builtin
    index: int  # binding index (buffer, threadgroup)
    builtin: str = ""


@dataclass
class Kernel:
    host_name: str
    expr: str       # callable expression: name or name<args>
    params: list
    file: str
    line: int
    max_threads: str | None = None  # the expression of [[max_total_threads_per_threadgroup(n)]]


class Source:
    """Preprocessed text plus a map from offsets back to .metal lines."""

    def __init__(self, text: str, root: str):
        self.text = text
        self.root = root
        self.marks = []  # (offset of the line after the marker, file, line)
        for m in LINEMARKER.finditer(text):
            self.marks.append((m.end() + 1, self.rel(m.group(2)), int(m.group(1))))

    def rel(self, path: str) -> str:
        if os.path.isabs(path):
            rel = os.path.relpath(path, self.root)
            if not rel.startswith(".."):
                return rel
        return path

    def where(self, offset: int) -> tuple[str, int]:
        file, line, start = "?", 1, 0
        for mark_offset, mark_file, mark_line in self.marks:
            if mark_offset > offset:
                break
            file, line, start = mark_file, mark_line, mark_offset
        return file, line + self.text.count("\n", start, offset)


def preprocess(cxx: str, path: str, includes: list[str]) -> str:
    with tempfile.TemporaryDirectory() as stub:
        for name in STUB_HEADERS:
            open(os.path.join(stub, name), "w").close()
        cmd = [cxx, "-E", "-x", "c++", "-std=c++17", "-D__METAL_VERSION__=310",
               "-D__METALKV_HOST__=1", "-I", stub]
        for inc in includes:
            cmd += ["-I", inc]
        cmd.append(path)
        res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise PassError(res.stderr.strip())
    return res.stdout


def matching(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index of the bracket closing the one at text[start]."""
    depth = 0
    for i in range(start, len(text)):
        if text[i] == open_ch:
            depth += 1
        elif text[i] == close_ch:
            depth -= 1
            if depth == 0:
                return i
    raise PassError(f"unbalanced '{open_ch}'")


def split_top_level(text: str) -> list[str]:
    parts, depth, cur = [], 0, ""
    for ch in text:
        if ch in "([{<":
            depth += 1
        elif ch in ")]}>":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    if cur.strip():
        parts.append(cur)
    return parts


ATTR = re.compile(r"\[\[\s*(\w+)\s*(?:\(\s*(\d+)\s*\))?\s*\]\]")


def parse_params(src: Source, text: str, offset: int, kernel: str) -> list[Param]:
    params = []
    for raw in split_top_level(text):
        decl = LINEMARKER.sub("", raw).strip()
        m = ATTR.search(decl)
        names = re.findall(r"\b(\w+)\b", ATTR.sub("", decl))
        name = names[-1] if names else "?"
        file, line = src.where(offset)
        if not m:
            raise PassError(f"{file}:{line}: parameter '{name}' of kernel '{kernel}' has no "
                            "[[buffer(n)]], [[threadgroup(n)]] or builtin attribute")
        attr, index = m.group(1), m.group(2)
        if attr in ("buffer", "threadgroup"):
            if index is None:
                raise PassError(f"{file}:{line}: [[{attr}]] of '{name}' needs an index")
            params.append(Param(name, attr, int(index)))
        elif attr in BUILTINS:
            params.append(Param(name, "builtin", 0, attr))
        else:
            raise PassError(f"{file}:{line}: parameter '{name}' of kernel '{kernel}' has "
                            f"attribute [[{attr}]], which the host executor does not support")
    return params


KERNEL_DEF = re.compile(r"(?:\[\[\s*kernel\s*\]\]|\bkernel\b)\s*void\s+(\w+)\s*\(")
MAX_THREADS = re.compile(r"\[\[\s*max_total_threads_per_threadgroup\s*\((.*?)\)\s*\]\]", re.S)
INSTANTIATION = re.compile(
    r'\btemplate\s*\[\[\s*host_name\s*\(\s*"([^"]+)"\s*\)\s*\]\]\s*'
    r"(?:\[\[\s*kernel\s*\]\]\s*)?decltype\s*\(")


def find_kernels(src: Source) -> tuple[list[Kernel], list[tuple[int, int]]]:
    """Kernels to register, and the spans to blank out: instantiation
    statements (the thunks instantiate the templates instead) and parameter
    attributes (`threadgroup` is a macro, so [[threadgroup(0)]] would not
    survive as an attribute)."""
    text = src.text
    templates, kernels, drops = {}, [], []
    for m in KERNEL_DEF.finditer(text):
        name = m.group(1)
        close = matching(text, m.end() - 1, "(", ")")
        params = parse_params(src, text[m.end():close], m.start(), name)
        drops += [(a.start(), a.end()) for a in ATTR.finditer(text, m.end(), close)]
        file, line = src.where(m.start())
        before = text[max(text.rfind(";", 0, m.start()), text.rfind("}", 0, m.start())) + 1:m.start()]
        limit = MAX_THREADS.search(before)
        max_threads = " ".join(LINEMARKER.sub("", limit.group(1)).split()) if limit else None
        if re.search(r"\btemplate\b", before):
            templates[name] = (params, file, line, max_threads)
        else:
            kernels.append(Kernel(name, name, params, file, line, max_threads))
    for m in INSTANTIATION.finditer(text):
        close = matching(text, m.end() - 1, "(", ")")
        expr = " ".join(text[m.end():close].split())
        base = expr.split("<")[0].strip()
        end = text.index(";", close) + 1
        drops.append((m.start(), end))
        if base not in templates:
            file, line = src.where(m.start())
            raise PassError(f"{file}:{line}: host_name '{m.group(1)}' instantiates '{base}', "
                            "which is not a template kernel in this file")
        params, file, line, max_threads = templates[base]
        kernels.append(Kernel(m.group(1), expr, params, file, line, max_threads))
    return kernels, drops


TG_DECL = re.compile(r"threadgroup\s+(?P<type>[^;]*?)\s*\b(?P<name>\w+)\s*"
                     r"(?P<dims>(?:\[[^\]]*\]\s*)*);", re.S)


def statement_start(text: str, pos: int) -> bool:
    i = pos - 1
    while i >= 0:
        if text[i].isspace():
            i -= 1
            continue
        line_start = text.rfind("\n", 0, i) + 1
        if text[line_start] == "#":  # a line marker between statements
            i = line_start - 1
            continue
        return text[i] in "{};"
    return True


def rewrite_threadgroup_vars(src: Source) -> tuple[str, int]:
    """`threadgroup T name[N];` -> a reference to per-threadgroup storage."""
    text, out, last, sites = src.text, [], 0, 0
    for m in re.finditer(r"\bthreadgroup\b", text):
        if m.start() < last or not statement_start(text, m.start()):
            continue
        d = TG_DECL.match(text, m.start())
        file, line = src.where(m.start())
        if not d or not d.group("type").strip():
            raise PassError(f"{file}:{line}: cannot parse this threadgroup declaration; "
                            "write one variable per statement: threadgroup T name[N];")
        if "=" in d.group(0) or split_top_level(d.group("type"))[1:]:
            raise PassError(f"{file}:{line}: threadgroup variables take no initializer and "
                            "one name per declaration")
        type_id = f"{d.group('type').strip()} {''.join(d.group('dims').split())}".strip()
        newlines = d.group(0).count("\n")
        out.append(text[last:m.start()])
        out.append(f"auto& {d.group('name')} = ::mkv::host::threadgroup_var<{type_id}>"
                   f"(&::mkv_tg_site_{sites});" + "\n" * newlines)
        last = d.end()
        sites += 1
    out.append(text[last:])
    return "".join(out), sites


def thunk(k: Kernel, n: int) -> str:
    fn = f"mkv_fn_{n}"
    args, specs = [], []
    for i, p in enumerate(k.params):
        pt = f"::mkv::host::param_t<{fn}, {i}>"
        if p.kind == "buffer":
            args.append(f"::mkv::host::bind_buffer<{pt}>(c, {p.index})")
            specs.append(f"{{::mkv::host::ParamSpec::buffer, {p.index}, "
                         f"::mkv::host::reference_bytes<{pt}>(), \"{p.name}\"}}")
        elif p.kind == "threadgroup":
            args.append(f"::mkv::host::bind_threadgroup<{pt}>(c, {p.index})")
            specs.append(f"{{::mkv::host::ParamSpec::threadgroup_memory, {p.index}, 0, \"{p.name}\"}}")
        else:
            b = f"::mkv::host::Builtin::{p.builtin}"
            args.append(f"::mkv::host::bind_builtin<{pt}>(c, {b})")
            specs.append(f"{{::mkv::host::ParamSpec::builtin, uint8_t({b}), 0, \"{p.name}\"}}")
    table = "nullptr"
    lines = [f'#line {k.line} "{k.file}"', "namespace {", f"using {fn} = decltype(&{k.expr});",
             f"void mkv_invoke_{n}(const ::mkv::host::LaneContext& c) {{",
             f"  (void)c;", f"  {k.expr}({', '.join(args)});", "}"]
    if specs:
        lines.append(f"const ::mkv::host::ParamSpec mkv_params_{n}[] = {{{', '.join(specs)}}};")
        table = f"mkv_params_{n}"
    # [[max_total_threads_per_threadgroup(n)]]: n is evaluated by the compiler (a
    # constant expression of the kernel file, e.g. mkv_params::kAttnSimdgroups * 32)
    limit = f"uint32_t({k.max_threads})" if k.max_threads else "::mkv::host::kMaxThreadsPerThreadgroup"
    lines += [f'const ::mkv::host::KernelDesc mkv_desc_{n} = {{"{k.host_name}", "{k.file}", '
              f"{k.line}, &mkv_invoke_{n}, {table}, {len(k.params)}, {limit}}};",
              f"const ::mkv::host::KernelRegistrar mkv_registrar_{n}(&mkv_desc_{n});", "}"]
    return "\n".join(lines)


def host_mode(args) -> None:
    src = Source(preprocess(args.cxx, args.input, args.include), args.root)
    kernels, drops = find_kernels(src)
    text = src.text
    for start, end in drops:  # same length, so offsets and lines stay valid
        text = text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]
    body, n_sites = rewrite_threadgroup_vars(Source(text, args.root))
    # Diagnostics (compiler errors, __builtin_FILE in the executor's messages)
    # name files relative to the project root.
    body = LINEMARKER.sub(lambda m: m.group(0).replace(f'"{m.group(2)}"', f'"{src.rel(m.group(2))}"'),
                          body)
    rel = Source("", args.root).rel(os.path.abspath(args.input))
    head = [f"// Generated by cpp/gpu/host/metal_pass.py from {rel}. Do not edit.",
            "#include <metal_stdlib>"]
    head += [f"static char mkv_tg_site_{i};" for i in range(n_sites)]
    out = "\n".join(head) + "\n" + body + "\n" + "\n".join(
        thunk(k, i) for i, k in enumerate(kernels)) + "\n"
    write_if_changed(args.output, out)


def inline_includes(path: str, includes: list[str], seen: set, root: str) -> str:
    """Our own "quoted" headers inlined once each; <system> includes kept."""
    real = os.path.realpath(path)
    if real in seen:
        return ""
    seen.add(real)
    out = []
    for line in open(path, encoding="utf-8").read().splitlines():
        m = re.match(r'\s*#\s*include\s*"([^"]+)"', line)
        if re.match(r"\s*#\s*pragma\s+once", line):
            continue
        if not m:
            out.append(line)
            continue
        for base in [os.path.dirname(path)] + includes:
            cand = os.path.join(base, m.group(1))
            if os.path.exists(cand):
                out.append(inline_includes(cand, includes, seen, root))
                break
        else:
            raise PassError(f"{path}: cannot find included \"{m.group(1)}\"")
    return "\n".join(out)


def embed_mode(args) -> None:
    entries = []
    for path in args.inputs:
        source = inline_includes(path, args.include, set(), args.root)
        if ")mkv_metal\"" in source:
            raise PassError(f"{path}: contains the raw-string delimiter )mkv_metal\"")
        rel = os.path.relpath(os.path.abspath(path), args.root)
        entries.append(f'    {{"{rel}", R"mkv_metal({source})mkv_metal"}},')
    out = "\n".join([
        "// Generated by cpp/gpu/host/metal_pass.py (embed). Do not edit.",
        '#include "gpu/embedded_sources.h"', "", "namespace mkv::gpu {", "",
        "const std::vector<EmbeddedSource>& embedded_metal_sources() {",
        "  static const std::vector<EmbeddedSource> sources = {", *entries, "  };",
        "  return sources;", "}", "", "}  // namespace mkv::gpu", ""])
    write_if_changed(args.output, out)


def write_if_changed(path: str, text: str) -> None:
    if os.path.exists(path) and open(path, encoding="utf-8").read() == text:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="mode", required=True)
    host = sub.add_parser("host")
    host.add_argument("--cxx", default="c++")
    host.add_argument("--root", required=True)
    host.add_argument("-I", dest="include", action="append", default=[])
    host.add_argument("input")
    host.add_argument("output")
    embed = sub.add_parser("embed")
    embed.add_argument("--root", required=True)
    embed.add_argument("-I", dest="include", action="append", default=[])
    embed.add_argument("output")
    embed.add_argument("inputs", nargs="+")
    args = ap.parse_args()
    try:
        host_mode(args) if args.mode == "host" else embed_mode(args)
    except PassError as e:
        print(f"metal_pass: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
