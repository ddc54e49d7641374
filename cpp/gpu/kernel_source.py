"""Reading metal/*.metal for the build-time passes (host/metal_pass.py, cuda/cuda_pass.py).

Both passes run the C preprocessor over a kernel file (our headers and macros
expanded, <metal_stdlib> stubbed out, line markers kept), then need the same
facts about the result: which kernels it defines and instantiates under which
names, what each kernel parameter is bound to ([[buffer(n)]],
[[threadgroup(n)]] or a builtin), the [[max_total_threads_per_threadgroup(n)]]
expression, and where the `threadgroup T name[N];` declarations are. This
module finds them; each pass decides what to write.

Offsets are into the preprocessed text. Edits that must keep offsets valid
(attributes, instantiation statements) blank a span with spaces instead of
deleting it, so `Source.where()` keeps naming the right .metal line.
"""
from __future__ import annotations

import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

# The builtin parameter attributes the host executor binds (lane_api.h's Builtin).
BUILTINS = {
    "thread_position_in_grid", "thread_position_in_threadgroup",
    "thread_index_in_threadgroup", "threadgroup_position_in_grid",
    "threads_per_threadgroup", "threadgroups_per_grid", "threads_per_grid",
    "thread_index_in_simdgroup", "simdgroup_index_in_threadgroup",
    "threads_per_simdgroup", "simdgroups_per_threadgroup",
}
# Apple's headers that each executor's prelude has in its own file rather than
# in its metal_stdlib: a generated file includes those its source included
# (optional_includes), so only the kernels that use them pay for them.
OPTIONAL_HEADERS = ["metal_simdgroup_matrix"]
STUB_HEADERS = ["metal_stdlib", "metal_math", "metal_atomic", "metal_simdgroup",
                "metal_compute", "metal_integer", "metal_common", "metal_geometric",
                "metal_relational"] + OPTIONAL_HEADERS
LINEMARKER = re.compile(r'^# (\d+) "([^"]*)"[^\n]*$', re.M)


class PassError(Exception):
    pass


@dataclass
class Param:
    name: str
    kind: str   # buffer | threadgroup | builtin
    index: int  # binding index (buffer, threadgroup)
    builtin: str = ""
    decl: str = ""  # the declaration without attributes: "constant mkv_params::Matmul& p"

    @property
    def tokens(self) -> list[str]:
        return re.findall(r"\w+|[&*]", self.decl)

    @property
    def is_constant_reference(self) -> bool:
        """`constant T& p [[buffer(n)]]`: bytes bound by value (Metal's setBytes)."""
        t = self.tokens
        return "constant" in t and "&" in t and "*" not in t


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

    def relative_linemarkers(self, text: str) -> str:
        """Line markers of `text` naming files relative to the project root, so
        compiler errors and runtime diagnostics do too."""
        return LINEMARKER.sub(
            lambda m: m.group(0).replace(f'"{m.group(2)}"', f'"{self.rel(m.group(2))}"'), text)


def preprocess(cxx: str, path: str, includes: list[str], device_macro: str = "__METALKV_HOST__") -> str:
    """`cxx -E` over a kernel file with the metal_* headers stubbed out (named "<stub>/...");
    `device_macro` (=1) says which device the text is for."""
    with tempfile.TemporaryDirectory() as stub:
        for name in STUB_HEADERS:
            open(os.path.join(stub, name), "w").close()
        cmd = [cxx, "-E", "-x", "c++", "-std=c++17", "-D__METAL_VERSION__=310",
               f"-D{device_macro}=1", "-I", stub]
        for inc in includes:
            cmd += ["-I", inc]
        cmd.append(path)
        res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise PassError(res.stderr.strip())
    # the stubs lived in a temporary directory: name them by a fixed path, so the output
    # (and a compiler cache's key) does not change from run to run
    return res.stdout.replace(f'"{stub}/', '"<stub>/')


def optional_includes(preprocessed: str) -> list[str]:
    """`#include <h>` for each OPTIONAL_HEADERS header the source included (stubbed by preprocess)."""
    return [f"#include <{h}>" for h in OPTIONAL_HEADERS if f'"<stub>/{h}"' in preprocessed]


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


def blank(text: str, spans: list[tuple[int, int]]) -> str:
    """Spans replaced by spaces (newlines kept), so offsets and lines stay valid."""
    for start, end in spans:
        text = text[:start] + re.sub(r"[^\n]", " ", text[start:end]) + text[end:]
    return text


ATTR = re.compile(r"\[\[\s*(\w+)\s*(?:\(\s*(\d+)\s*\))?\s*\]\]")


def parse_params(src: Source, text: str, offset: int, kernel: str,
                 builtins: set = BUILTINS, device: str = "host executor") -> list[Param]:
    params = []
    for raw in split_top_level(text):
        decl = LINEMARKER.sub("", raw).strip()
        m = ATTR.search(decl)
        bare = " ".join(ATTR.sub("", decl).split())
        names = re.findall(r"\b(\w+)\b", bare)
        name = names[-1] if names else "?"
        file, line = src.where(offset)
        if not m:
            raise PassError(f"{file}:{line}: parameter '{name}' of kernel '{kernel}' has no "
                            "[[buffer(n)]], [[threadgroup(n)]] or builtin attribute")
        attr, index = m.group(1), m.group(2)
        if attr in ("buffer", "threadgroup"):
            if index is None:
                raise PassError(f"{file}:{line}: [[{attr}]] of '{name}' needs an index")
            params.append(Param(name, attr, int(index), decl=bare))
        elif attr in builtins:
            params.append(Param(name, "builtin", 0, attr, decl=bare))
        else:
            raise PassError(f"{file}:{line}: parameter '{name}' of kernel '{kernel}' has "
                            f"attribute [[{attr}]], which the {device} does not support")
    return params


KERNEL_DEF = re.compile(r"(?:\[\[\s*kernel\s*\]\]|\bkernel\b)\s*void\s+(\w+)\s*\(")
MAX_THREADS = re.compile(r"\[\[\s*max_total_threads_per_threadgroup\s*\((.*?)\)\s*\]\]", re.S)
KERNEL_ATTR = re.compile(r"\[\[\s*kernel\s*\]\]")
INSTANTIATION = re.compile(
    r'\btemplate\s*\[\[\s*host_name\s*\(\s*"([^"]+)"\s*\)\s*\]\]\s*'
    r"(?:\[\[\s*kernel\s*\]\]\s*)?decltype\s*\(")


def find_kernels(src: Source, builtins: set = BUILTINS,
                 device: str = "host executor") -> tuple[list[Kernel], list[tuple[int, int]]]:
    """Kernels to register, and the spans to blank out: instantiation
    statements (the thunks instantiate the templates instead) and parameter
    attributes (`threadgroup` is an address-space word, so [[threadgroup(0)]]
    would not survive as an attribute)."""
    text = src.text
    templates, kernels, drops = {}, [], []
    for m in KERNEL_DEF.finditer(text):
        name = m.group(1)
        close = matching(text, m.end() - 1, "(", ")")
        params = parse_params(src, text[m.end():close], m.start(), name, builtins, device)
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


def kernel_attribute_spans(text: str) -> list[tuple[int, int]]:
    """Spans of `[[kernel]]` and `[[max_total_threads_per_threadgroup(n)]]`, for
    a compiler that does not know them (find_kernels has read them already)."""
    return sorted([(m.start(), m.end()) for m in KERNEL_ATTR.finditer(text)] +
                  [(m.start(), m.end()) for m in MAX_THREADS.finditer(text)])


TG_DECL = re.compile(r"threadgroup\s+(?P<type>[^;]*?)\s*\b(?P<name>\w+)\s*"
                     r"(?P<dims>(?:\[[^\]]*\]\s*)*);", re.S)


@dataclass
class ThreadgroupDecl:
    """`threadgroup T name[N]...;` at the start of a statement (a threadgroup
    variable, as opposed to a pointer type or cast that merely names the
    address space)."""
    start: int
    end: int
    type: str  # "float", "half4", "atomic_uint"
    name: str
    dims: str  # "[kRowSimds]", "" for a scalar
    newlines: int


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


# `threadgroup T* p = ...;` or `threadgroup T& r = ...;`: a thread variable that
# points into threadgroup memory, not a threadgroup variable.
TG_POINTER = re.compile(r"threadgroup\s+[^;=\[{}]*[*&]")


def threadgroup_declarations(src: Source) -> list[ThreadgroupDecl]:
    text, decls, last = src.text, [], 0
    for m in re.finditer(r"\bthreadgroup\b", text):
        if m.start() < last or not statement_start(text, m.start()) or TG_POINTER.match(text, m.start()):
            continue
        d = TG_DECL.match(text, m.start())
        file, line = src.where(m.start())
        if not d or not d.group("type").strip():
            raise PassError(f"{file}:{line}: cannot parse this threadgroup declaration; "
                            "write one variable per statement: threadgroup T name[N];")
        if "=" in d.group(0) or split_top_level(d.group("type"))[1:]:
            raise PassError(f"{file}:{line}: threadgroup variables take no initializer and "
                            "one name per declaration")
        decls.append(ThreadgroupDecl(m.start(), d.end(), d.group("type").strip(), d.group("name"),
                                     "".join(d.group("dims").split()), d.group(0).count("\n")))
        last = d.end()
    return decls


def write_if_changed(path: str, text: str) -> None:
    if os.path.exists(path) and open(path, encoding="utf-8").read() == text:
        return
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
