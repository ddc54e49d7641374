"""Lint for MSL that clang's C++-for-OpenCL mode accepts but Apple's compiler
rejects (or that this check could not otherwise see): a token pass over the
source with comments, strings and host-only #if branches removed.

Rules (the id in brackets starts each message):
  lambda            lambda expressions
  goto              goto
  virtual           virtual functions
  new, delete       dynamic allocation
  exceptions        try / catch / throw
  rtti              typeid, dynamic_cast
  std               std:: (MSL has no C++ standard library; use metal::)
  thread_local      thread_local storage
  address-space     a pointer or reference parameter with no address space:
                    clang's OpenCL mode reads it as generic and accepts any
                    memory, so a misuse would go unseen; MSL reads it as thread
  recursion         a function that calls itself, directly or through others
                    (names, not overloads: the calls of one name are merged)
  attribute         an [[attribute]] MSL does not have (clang ignores them all)
  float-literal     a floating literal without an f or h suffix: a float in MSL but
                    a double in C++ and CUDA, where the same kernel also compiles
                    (g++ has -fsingle-precision-constant, clang and nvcc do not)
  attribute-type    a kernel parameter whose type its attribute does not allow:
                    [[thread_position_in_grid]] on a float, [[buffer(0)]] on a
                    value, [[threadgroup(0)]] on a device pointer
"""

from __future__ import annotations

import dataclasses

from msl_source import ADDRESS_SPACES, Source

MSL_ATTRIBUTES = frozenset(
    """
    kernel vertex fragment object mesh visible stitchable host_name max_total_threads_per_threadgroup
    buffer texture sampler threadgroup threadgroup_imageblock function_constant id stage_in payload
    thread_position_in_grid thread_position_in_threadgroup thread_index_in_threadgroup
    threadgroup_position_in_grid threadgroups_per_grid threads_per_grid threads_per_threadgroup
    dispatch_threads_per_threadgroup grid_origin grid_size thread_execution_width
    thread_index_in_simdgroup simdgroup_index_in_threadgroup simdgroups_per_threadgroup threads_per_simdgroup
    dispatch_simdgroups_per_threadgroup thread_index_in_quadgroup quadgroup_index_in_threadgroup
    quadgroups_per_threadgroup dispatch_quadgroups_per_threadgroup
    vertex_id instance_id base_vertex base_instance amplification_id amplification_count position color
    point_size clip_distance render_target_array_index viewport_array_index front_facing sample_id
    sample_mask point_coord barycentric_coord primitive_id patch patch_id user flat invariant depth stencil
    center_perspective centroid_perspective sample_perspective center_no_perspective
    centroid_no_perspective sample_no_perspective raster_order_group early_fragment_tests
    noreturn carries_dependency deprecated fallthrough maybe_unused nodiscard likely unlikely
    """.split()
)

# Kernel parameter attributes and the types MSL allows for them.
_UINT_TYPES = frozenset({"uint", "ushort", "uint32_t", "uint16_t"})
_GRID_ATTRIBUTES = frozenset(
    "thread_position_in_grid thread_position_in_threadgroup threadgroup_position_in_grid threads_per_grid "
    "threads_per_threadgroup threadgroups_per_grid dispatch_threads_per_threadgroup grid_origin grid_size".split()
)
_INDEX_ATTRIBUTES = frozenset(
    "thread_index_in_threadgroup thread_index_in_simdgroup simdgroup_index_in_threadgroup "
    "simdgroups_per_threadgroup threads_per_simdgroup thread_execution_width thread_index_in_quadgroup "
    "quadgroup_index_in_threadgroup quadgroups_per_threadgroup dispatch_simdgroups_per_threadgroup "
    "dispatch_quadgroups_per_threadgroup".split()
)
_GRID_TYPES = _UINT_TYPES | {"uint2", "uint3", "ushort2", "ushort3"}

_BANNED = {
    "goto": ("goto", "goto is not supported in MSL"),
    "virtual": ("virtual", "virtual functions are not supported in MSL"),
    "new": ("new", "dynamic allocation (new) is not supported in MSL"),
    "try": ("exceptions", "exceptions (try) are not supported in MSL"),
    "catch": ("exceptions", "exceptions (catch) are not supported in MSL"),
    "throw": ("exceptions", "exceptions (throw) are not supported in MSL"),
    "typeid": ("rtti", "typeid (RTTI) is not supported in MSL"),
    "dynamic_cast": ("rtti", "dynamic_cast (RTTI) is not supported in MSL"),
    "thread_local": ("thread_local", "thread_local storage is not supported in MSL"),
}
# Tokens after which `[` starts a subscript (or a declarator), not a lambda.
_EXPRESSION_END_KEYWORDS = frozenset("return case else do co_return throw".split())
_METAL_NAMESPACES = frozenset({"metal", "fast", "precise"})


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    path: str
    line: int
    col: int
    rule: str
    message: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}:{self.col}: error: [{self.rule}] {self.message}"


def lint_file(src: Source) -> list[Finding]:
    """Every rule except recursion (which needs the whole translation unit)."""
    out: list[Finding] = []
    toks = src.tokens

    def add(i: int, rule: str, message: str) -> None:
        line, col = src.line_col(toks[i].start)
        out.append(Finding(src.path, line, col, rule, message))

    define_line = _define_lines(src)
    for i, tok in enumerate(toks):
        if tok.directive and src.line_col(tok.start)[0] not in define_line:
            continue  # #include, #pragma, #if ...: not code
        if tok.kind == "ident" and tok.text in _BANNED:
            add(i, *_BANNED[tok.text])
        elif tok.text == "delete" and (i == 0 or toks[i - 1].text != "="):
            add(i, "delete", "dynamic allocation (delete) is not supported in MSL")
        elif tok.kind == "number" and _unsuffixed_float(tok.text):
            add(i, "float-literal", f"floating literal {tok.text} has no suffix: MSL reads it as float, the host "
                                    f"and CUDA builds as double; write {tok.text}f")
        elif tok.text == "std" and i + 1 < len(toks) and toks[i + 1].text == "::":
            add(i, "std", "std:: is not available in MSL (there is no C++ standard library; use metal::)")
        end = src.attribute_end(i) if tok.text == "[" else None
        if end is not None:
            for name_i in _attribute_names(src, i, end):
                name = toks[name_i].text
                if name not in MSL_ATTRIBUTES:
                    message = f"[[{name}]] is not an MSL attribute (clang ignores unknown ones; is it a typo?)"
                    add(name_i, "attribute", message)
    out += _lambdas(src)
    out += _unqualified_pointer_parameters(src)
    out += _kernel_parameter_types(src)
    return out


def _unsuffixed_float(text: str) -> bool:
    """A decimal floating literal (1.0, .5, 2e3, 1.) with no f/h suffix; hex and
    integer literals are not floating."""
    t = text.replace("'", "").lower()
    if t.startswith("0x") or t.endswith(("f", "h")):
        return False
    return "." in t or "e" in t


def _define_lines(src: Source) -> set[int]:
    """Line numbers of #define directives, continuation lines included."""
    lines, cont = set(), False
    for n, line in enumerate(src.masked.split("\n"), start=1):
        if cont or line.lstrip().startswith("#") and line.lstrip()[1:].lstrip().startswith("define"):
            lines.add(n)
            cont = line.endswith("\\")
    return lines


def _attribute_names(src: Source, open_i: int, close_i: int) -> list[int]:
    """Token indices of the attribute names in [[a, b(1), ns::c]] (namespaced ones skipped)."""
    toks, names, depth, expect = src.tokens, [], 0, True
    for k in range(open_i + 2, close_i - 1):
        t = toks[k].text
        if t in "([{":
            depth += 1
        elif t in ")]}":
            depth -= 1
        elif depth == 0 and t == ",":
            expect = True
        elif depth == 0 and expect and toks[k].kind == "ident":
            expect = False
            if not (k + 1 < close_i and toks[k + 1].text == "::"):
                names.append(k)
    return names


def _lambdas(src: Source) -> list[Finding]:
    toks, out, code = src.tokens, [], src.code
    skip_until = -1
    for k, i in enumerate(code):
        if i <= skip_until or toks[i].text != "[":
            continue
        end = src.attribute_end(i)
        if end is not None:
            skip_until = end  # [[attribute]]
            continue
        prev = toks[code[k - 1]] if k else None
        if prev is not None and (
            prev.kind in ("number", "string")
            or prev.text in (")", "]")
            or (prev.kind == "ident" and prev.text not in _EXPRESSION_END_KEYWORDS)
        ):
            continue  # a subscript or an array declarator
        close = src.match.get(i)
        if close is None or close + 1 >= len(toks):
            continue
        nxt = toks[close + 1].text
        if nxt in ("(", "{", "<", "->", "mutable", "constexpr", "noexcept"):
            line, col = src.line_col(toks[i].start)
            out.append(Finding(src.path, line, col, "lambda", "lambda expressions are not supported in MSL"))
    return out


def _split_parameters(src: Source, open_i: int, close_i: int) -> list[list[int]]:
    toks, params, cur, depth = src.tokens, [], [], 0
    for i in range(open_i + 1, close_i):
        if toks[i].directive:
            continue
        t = toks[i].text
        if t in ("(", "[", "{", "<"):
            depth += 1
        elif t in (")", "]", "}", ">"):
            depth -= 1
        elif t == ">>":
            depth -= 2
        if t == "," and depth == 0:
            params.append(cur)
            cur = []
        else:
            cur.append(i)
    if cur:
        params.append(cur)
    return params


def _unqualified_pointer_parameters(src: Source) -> list[Finding]:
    toks, out = src.tokens, []
    for f in src.functions:
        for param in _split_parameters(src, *f.params):
            first_ptr, spaces, k = None, False, 0
            depth_angle, depth_square, skip_parens = 0, 0, 0
            while k < len(param):
                i = param[k]
                t = toks[i].text
                end = src.attribute_end(i) if t == "[" else None
                if end is not None:
                    while k < len(param) and param[k] <= end:
                        k += 1
                    continue
                if t == "=" and depth_angle == 0 and depth_square == 0 and not skip_parens:
                    break  # a default argument follows
                if t in ("decltype", "sizeof", "alignof") and k + 1 < len(param) and toks[param[k + 1]].text == "(":
                    skip_parens = src.match.get(param[k + 1], -1)
                elif skip_parens and i >= skip_parens:
                    skip_parens = 0
                elif t == "<":
                    depth_angle += 1
                elif t == ">":
                    depth_angle -= 1
                elif t == ">>":
                    depth_angle -= 2
                elif t == "[":
                    depth_square += 1
                elif t == "]":
                    depth_square -= 1
                elif skip_parens or depth_angle > 0 or depth_square > 0:
                    pass
                elif t in ADDRESS_SPACES and first_ptr is None:
                    spaces = True
                elif t in ("*", "&", "&&") and first_ptr is None:
                    first_ptr = i
                k += 1
            if first_ptr is not None and not spaces:
                names = [toks[i].text for i in param if toks[i].kind == "ident"]
                name = names[-1] if names else "?"
                line, col = src.line_col(toks[first_ptr].start)
                out.append(
                    Finding(
                        src.path,
                        line,
                        col,
                        "address-space",
                        f"parameter '{name}' of '{f.name}' is a pointer or reference with no address space: "
                        "write device, constant, threadgroup or thread (MSL reads it as thread; "
                        "clang's OpenCL mode would accept any memory, so misuse would go unseen)",
                    )
                )
    return out


def _kernel_parameter_types(src: Source) -> list[Finding]:
    toks, out = src.tokens, []
    for f in src.functions:
        if not f.kernel:
            continue
        for param in _split_parameters(src, *f.params):
            attrs, decl, k = [], [], 0
            while k < len(param):
                end = src.attribute_end(param[k]) if toks[param[k]].text == "[" else None
                if end is None:
                    decl.append(param[k])
                    k += 1
                    continue
                attrs += _attribute_names(src, param[k], end)
                while k < len(param) and param[k] <= end:
                    k += 1
            words = [toks[i].text for i in decl]
            if not attrs or len(words) < 2:
                continue
            type_words = [w for w in words[:-1] if w != "const"]  # the last word is the name
            pointer = any(w in ("*", "&") for w in type_words)
            for a in attrs:
                name = toks[a].text
                have = " ".join(type_words)
                if name in _GRID_ATTRIBUTES and (pointer or have not in _GRID_TYPES):
                    problem = "uint, ushort or a 2- or 3-vector of them"
                elif name in _INDEX_ATTRIBUTES and (pointer or have not in _UINT_TYPES):
                    problem = "uint or ushort"
                elif name == "buffer" and not (pointer and ({"device", "constant"} & set(type_words))):
                    problem = "a device or constant pointer or reference"
                elif name == "threadgroup" and not (pointer and "threadgroup" in type_words):
                    problem = "a threadgroup pointer"
                else:
                    continue
                line, col = src.line_col(toks[a].start)
                out.append(
                    Finding(src.path, line, col, "attribute-type", f"[[{name}]] takes {problem}, not '{have}'")
                )
    return out


def lint_recursion(sources: list[Source]) -> list[Finding]:
    """Calls of a translation unit's functions (by name) that close a cycle."""
    defined: dict[str, list[tuple[Source, object]]] = {}
    for src in sources:
        for f in src.functions:
            if f.body is not None:
                defined.setdefault(f.name, []).append((src, f))
    calls: dict[str, dict[str, tuple[Source, int]]] = {}  # caller -> callee -> first call site
    for name, defs in defined.items():
        for src, f in defs:
            for i, callee in _calls(src, f.body, defined):
                calls.setdefault(name, {}).setdefault(callee, (src, i))
    out = []
    for cycle in _cycles(calls):
        src, i = calls[cycle[0]][cycle[1 % len(cycle)]]
        line, col = src.line_col(src.tokens[i].start)
        path = " -> ".join(cycle + [cycle[0]])
        what = f"'{cycle[0]}' calls itself" if len(cycle) == 1 else f"recursive calls {path}"
        out.append(Finding(src.path, line, col, "recursion", f"{what}: MSL does not support recursion"))
    return out


def _calls(src: Source, body: tuple[int, int], defined) -> list[tuple[int, str]]:
    toks, out = src.tokens, []
    for i in range(body[0] + 1, body[1]):
        tok = toks[i]
        if tok.kind != "ident" or tok.text not in defined or tok.directive:
            continue
        nxt = i + 1
        if nxt < len(toks) and toks[nxt].text == "<":  # f<...>(
            depth = 0
            for j in range(nxt, body[1]):
                depth += {"<": 1, ">": -1, ">>": -2}.get(toks[j].text, 0)
                if depth <= 0:
                    nxt = j + 1
                    break
        if nxt >= len(toks) or toks[nxt].text != "(":
            continue
        prev = toks[i - 1].text if i else ""
        if prev in (".", "->"):
            continue  # a member call: another object's function
        if prev == "::" and i >= 2 and toks[i - 2].text in _METAL_NAMESPACES:
            continue  # metal::dot inside a struct's own dot
        out.append((i, tok.text))
    return out


def _cycles(calls: dict[str, dict[str, object]]) -> list[list[str]]:
    """Strongly connected components that contain a cycle (Tarjan)."""
    index, low, stack, on_stack, result, counter = {}, {}, [], set(), [], [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on_stack.add(v)
        for w in calls.get(v, {}):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1 or v in calls.get(v, {}):
                result.append(_ordered_cycle(comp, calls))

    for v in sorted(calls):
        if v not in index:
            visit(v)
    return result


def _ordered_cycle(comp: list[str], calls) -> list[str]:
    """The component's names in call order, starting from the first by name."""
    members, start = set(comp), min(comp)
    order, v = [start], start
    while True:
        nxt = next((w for w in calls.get(v, {}) if w in members and w not in order), None)
        if nxt is None:
            return order
        order.append(nxt)
        v = nxt
