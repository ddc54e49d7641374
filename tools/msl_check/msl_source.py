"""Token-level view of a Metal Shading Language file, for tools/check_msl.py.

Not a parser: comments and string contents are blanked (`mask`), the rest is
split into tokens, and braces are classified (namespace, class, function
body, ...) well enough to find function definitions, their parameter lists
and the statements inside them. Two users:

- the lint (msl_lint.py), for what clang's OpenCL mode accepts but Apple's
  compiler does not (lambdas, goto, unqualified pointer parameters, ...);
- `prepare_for_clang`, which rewrites the two constructs clang cannot take at
  all, keeping every line on its line number:
    * `template [[host_name("x")]] [[kernel]] decltype(f<1>) f<1>;` -- clang
      allows no attribute list after `template`: the lists are blanked;
    * `threadgroup float buf[256];` inside a kernel -- clang's kernels cannot
      be templates, so MSL kernels are ordinary functions to it, where __local
      variables are not allowed: the declaration becomes a reference to
      __local memory, `threadgroup __msl_type<float> (&buf)[256] = __msl_threadgroup<float[256]>();`.
"""

from __future__ import annotations

import dataclasses
import re

# Address-space keywords of MSL.
ADDRESS_SPACES = frozenset(
    {"device", "constant", "threadgroup", "thread", "threadgroup_imageblock", "ray_data", "object_data"}
)

_PUNCT = sorted(
    "<<= >>= ... ->* :: -> ++ -- << >> <= >= == != && || += -= *= /= %= &= |= ^= ## # "
    "{ } [ ] ( ) < > ; : , . ? ~ ! + - * / % ^ & | =".split(),
    key=len,
    reverse=True,
)
_TOKEN = re.compile(
    r"(?P<ident>[A-Za-z_]\w*)"
    r"|(?P<number>\.?\d(?:[eEpP][+-]|[\w.'])*)"
    r"|(?P<string>\"[^\"\n]*\"|'[^'\n]*')"
    r"|(?P<punct>" + "|".join(re.escape(p) for p in _PUNCT) + r")"
    r"|(?P<space>\s+)"
    r"|(?P<other>.)",
    re.S,
)


def mask(text: str) -> str:
    """`text` with comments and the insides of string and character literals
    replaced by spaces (newlines kept), so offsets and line numbers stay."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            out[i:j] = " " * (j - i)
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            out[i:j] = [ch if ch == "\n" else " " for ch in text[i:j]]
            i = j
        elif c in "\"'":
            j = i + 1
            while j < n and text[j] != c and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            out[i + 1 : j] = " " * (j - i - 1)
            i = j + 1
        else:
            i += 1
    return "".join(out)


# Macros whose #if branches are decided: what Apple's compiler defines, and the
# host executor's marker, which it does not. Other conditions keep both branches.
METAL_MACROS = {"__METAL_VERSION__": 310, "__METAL_MACOS__": 1, "__METALKV_HOST__": None}


def _condition(expr: str) -> bool | None:
    """Value of an #if expression over METAL_MACROS, or None when undecided."""
    if not set(re.findall(r"[A-Za-z_]\w*", expr)) <= set(METAL_MACROS) | {"defined"}:
        return None

    def is_defined(m: re.Match) -> str:
        return "1" if METAL_MACROS[m.group(1) or m.group(2)] is not None else "0"

    expr = re.sub(r"defined\s*\(\s*(\w+)\s*\)|defined\s+(\w+)", is_defined, expr)
    expr = re.sub(r"[A-Za-z_]\w*", lambda m: str(METAL_MACROS[m.group()] or 0), expr)
    expr = expr.replace("&&", " and ").replace("||", " or ")
    expr = re.sub(r"!(?!=)", " not ", expr)
    if not re.fullmatch(r"(?:\s|\d+|\band\b|\bor\b|\bnot\b|[()]|[<>]=?|[=!]=)*", expr):
        return None
    try:
        return bool(eval(expr, {"__builtins__": {}}))  # numbers, comparisons, and/or/not only
    except Exception:
        return None


def blank_inactive(masked: str) -> str:
    """Blanks the lines of #if branches Apple's compiler never sees (such as
    `#ifndef __METAL_VERSION__`); undecided conditions keep every branch."""
    lines = masked.split("\n")
    stack: list[list] = []  # [parent active, branch value (True/False/None), a branch taken]
    active = True
    for n, line in enumerate(lines):
        m = re.match(r"\s*#\s*(ifdef|ifndef|if|elif|else|endif)\b(.*)", line)
        if m:
            kind, rest = m.group(1), m.group(2).strip()
            if kind in ("if", "ifdef", "ifndef"):
                if kind == "if":
                    value = _condition(rest)
                else:
                    value = METAL_MACROS.get(rest, 0) is not None if rest in METAL_MACROS else None
                    if kind == "ifndef" and value is not None:
                        value = not value
                stack.append([active, value, value is True])
            elif stack and kind == "elif":
                top = stack[-1]
                value = _condition(rest)
                if top[2]:
                    value = False
                elif top[1] is None or value is None:
                    value = None
                top[1] = value
                top[2] = top[2] or value is True
            elif stack and kind == "else":
                top = stack[-1]
                top[1] = None if top[1] is None else not top[2]
            elif stack and kind == "endif":
                stack.pop()
            active = all(level[0] and level[1] is not False for level in stack[-1:]) if stack else True
            continue
        if not active:
            lines[n] = " " * len(line)
    return "\n".join(lines)


@dataclasses.dataclass
class Token:
    kind: str  # ident, number, string, punct, other
    text: str
    start: int
    end: int
    directive: bool  # on a preprocessor line (#include, #define, ...)


@dataclasses.dataclass
class Function:
    name: str
    kernel: bool
    params: tuple[int, int]  # token indices of the parameter list's ( and )
    body: tuple[int, int] | None  # token indices of { and }; None for a declaration


class Source:
    """A file's masked text, tokens, and the functions found in it."""

    def __init__(self, path: str, text: str):
        self.path = path
        self.text = text
        self.masked = blank_inactive(mask(text))
        self._line_starts = [0] + [m.end() for m in re.finditer("\n", text)]
        self.tokens = self._tokenize()
        self.code = [i for i, t in enumerate(self.tokens) if not t.directive]  # outside directives
        self.match = self._match_brackets()
        self.functions: list[Function] = []
        self._scan_scopes()

    def line_col(self, offset: int) -> tuple[int, int]:
        lo, hi = 0, len(self._line_starts) - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._line_starts[mid] <= offset:
                lo = mid
            else:
                hi = mid - 1
        return lo + 1, offset - self._line_starts[lo] + 1

    # ---- tokens --------------------------------------------------------------
    def _tokenize(self) -> list[Token]:
        directive_spans = []
        for m in re.finditer(r"^[ \t]*#(?:[^\n]*\\\n)*[^\n]*", self.masked, re.M):
            directive_spans.append((m.start(), m.end()))
        tokens, d = [], 0
        for m in _TOKEN.finditer(self.masked):
            kind = m.lastgroup
            if kind == "space":
                continue
            while d < len(directive_spans) and directive_spans[d][1] <= m.start():
                d += 1
            in_directive = d < len(directive_spans) and directive_spans[d][0] <= m.start()
            tokens.append(Token(kind, m.group(), m.start(), m.end(), in_directive))
        return tokens

    def _match_brackets(self) -> dict[int, int]:
        """Matching ( ) [ ] { } among code tokens, both directions."""
        match, stack = {}, []
        pairs = {")": "(", "]": "[", "}": "{"}
        for i in self.code:
            t = self.tokens[i].text
            if t in "([{":
                stack.append(i)
            elif t in pairs:
                while stack and self.tokens[stack[-1]].text != pairs[t]:
                    stack.pop()  # unbalanced: recover
                if stack:
                    j = stack.pop()
                    match[i], match[j] = j, i
        return match

    def attribute_end(self, i: int) -> int | None:
        """If code token i opens `[[`, the index of the second `]` that closes it."""
        toks = self.tokens
        if i + 1 >= len(toks) or toks[i].text != "[" or toks[i + 1].text != "[":
            return None
        if toks[i + 1].start != toks[i].end:
            return None
        close = self.match.get(i + 1)
        if close is None or close + 1 >= len(toks) or toks[close + 1].text != "]":
            return None
        return close + 1

    # ---- scopes and functions ------------------------------------------------
    _NOT_NAMES = frozenset(
        "static_assert decltype alignas alignof sizeof __attribute__ noexcept requires if for while "
        "switch return template operator".split()
    )
    _TRAILING = frozenset(
        "const volatile noexcept override final constant device thread threadgroup".split() + ["&", "&&"]
    )

    def _scan_scopes(self) -> None:
        """Classifies every `{` and records function declarations/definitions at
        namespace and class scope."""
        stack: list[str] = []  # kinds of the open braces
        header: list[int] = []  # code tokens of the current namespace/class-scope statement
        for i in self.code:
            t = self.tokens[i].text
            inside_function = any(k in ("function", "block") for k in stack)
            if t == "{":
                if inside_function:
                    kind = "block"
                else:
                    kind = self._classify(header)
                    if kind == "function":
                        self._record_function(header, body_open=i)
                stack.append(kind)
                header = []
            elif t == "}":
                if stack:
                    stack.pop()
                header = []
            elif t == ";":
                if not inside_function and stack[-1:] != ["init"]:
                    self._record_function(header, body_open=None)
                    header = []
            elif not inside_function:
                header.append(i)

    def _classify(self, header: list[int]) -> str:
        words = [self.tokens[i].text for i in header]
        if "namespace" in words or (words[:1] == ["extern"] and len(words) == 2):
            return "namespace"
        if "enum" in words:
            return "enum"
        if self._function_group(header) is not None:
            return "function"
        if any(w in ("struct", "class", "union") for w in words):
            return "class"
        return "init"

    def _function_group(self, header: list[int]) -> tuple[int, int] | None:
        """The ( ) of a function's parameter list in a statement header: a group
        after a name, followed only by qualifiers, attributes, a trailing return
        type or a constructor's initializers. None for a variable (an `=` comes
        first) or anything else."""
        toks, pos = self.tokens, {idx: k for k, idx in enumerate(header)}
        k = 0
        while k < len(header):
            i = header[k]
            t = toks[i].text
            if t == "template" and k + 1 < len(header) and toks[header[k + 1]].text == "<":
                depth, k = 0, k + 1  # skip the template parameter list (defaults may hold `=`)
                while k < len(header):
                    depth += {"<": 1, ">": -1, ">>": -2}.get(toks[header[k]].text, 0)
                    k += 1
                    if depth <= 0:
                        break
                continue
            if t == "=" and not (k > 0 and toks[header[k - 1]].text == "operator"):
                return None  # an initialized variable
            if t == "(" and k > 0 and toks[header[k - 1]].text == "operator" and k + 1 < len(header) \
                    and toks[header[k + 1]].text == ")":
                k += 2  # operator(): the next group is the parameter list
                if k < len(header) and toks[header[k]].text == "(" and self.match.get(header[k]) in pos:
                    close = self.match[header[k]]
                    if self._only_trailing(header[pos[close] + 1 :]):
                        return header[k], close
                continue
            if t == "(" and i in self.match and self.match[i] in pos:
                close_k = pos[self.match[i]]
                if k > 0:
                    name = toks[header[k - 1]]
                    named = (name.kind == "ident" and name.text not in self._NOT_NAMES) or (
                        k > 1 and toks[header[k - 2]].text == "operator"
                    )
                    if named and self._only_trailing(header[close_k + 1 :]):
                        return i, self.match[i]
                k = close_k + 1
                continue
            k += 1
        return None

    def _only_trailing(self, rest: list[int]) -> bool:
        k = 0
        while k < len(rest):
            tok = self.tokens[rest[k]]
            if tok.text in (":", "->", "="):
                return True  # constructor initializers, trailing return, = default/delete/0
            end = self.attribute_end(rest[k])
            if end is not None:
                k = rest.index(end, k) + 1 if end in rest else len(rest)
                continue
            if tok.text not in self._TRAILING:
                return False
            k += 1
        return True

    def _record_function(self, header: list[int], body_open: int | None) -> None:
        if not header or (self.tokens[header[0]].text == "template" and self._is_explicit_instantiation(header)):
            return
        group = self._function_group(header)
        if group is None:
            return
        name_tok = self.tokens[group[0] - 1]
        name = name_tok.text
        if name_tok.text == ")":  # operator()
            name = "operator()"
        elif name_tok.kind != "ident":  # operator@
            name = "operator" + name_tok.text
        kernel = any(self.tokens[i].text == "kernel" for i in header if i < group[0])
        body = (body_open, self.match[body_open]) if body_open is not None and body_open in self.match else None
        self.functions.append(Function(name, kernel, group, body))

    def _is_explicit_instantiation(self, header: list[int]) -> bool:
        return len(header) > 1 and self.tokens[header[1]].text != "<"

    def function_at(self, i: int) -> Function | None:
        """The function whose body holds token i."""
        for f in self.functions:
            if f.body and f.body[0] < i < f.body[1]:
                return f
        return None

    # ---- threadgroup object declarations -----------------------------------
    def threadgroup_declarations(self):
        """(first token, last token, type text, [(name, extents text)]) for each
        `threadgroup T name[...], ...;` inside a function body."""
        toks = self.tokens
        for k, i in enumerate(self.code):
            if toks[i].text != "threadgroup" or self.function_at(i) is None:
                continue
            prev = toks[self.code[k - 1]].text if k else ";"
            if prev not in (";", "{", "}"):
                continue  # a qualifier inside an expression or parameter list
            decl = self._parse_object_declaration(k + 1)
            if decl is not None:
                yield (i,) + decl

    def _parse_object_declaration(self, k: int):
        toks, code = self.tokens, self.code
        seq, angles, squares = [], 0, 0
        while k < len(code):
            t = toks[code[k]].text
            if t == "[":
                squares += 1
            elif t == "]":
                squares -= 1
            elif squares:
                pass  # an array bound: any expression
            elif t == "<":
                angles += 1
            elif t == ">":
                angles -= 1
            elif t == ">>":
                angles -= 2
            elif t in ("*", "&", "&&", "(", ")", "{", "}", "=") and angles <= 0:
                return None  # a pointer, a reference, an initializer: not ours
            if t == ";" and angles <= 0 and not squares:
                break
            seq.append(code[k])
            k += 1
        else:
            return None
        end = code[k]
        parts, cur, depth = [], [], 0
        for i in seq:
            t = toks[i].text
            depth += {"<": 1, ">": -1, ">>": -2, "[": 1, "]": -1}.get(t, 0)
            if t == "," and depth == 0:
                parts.append(cur)
                cur = []
            else:
                cur.append(i)
        parts.append(cur)
        declarators = []
        type_text = None
        for n, part in enumerate(parts):
            # the declarator name: the last identifier not inside [...]
            depth, name_at = 0, None
            for m, i in enumerate(part):
                t = toks[i].text
                if t == "[":
                    depth += 1
                elif t == "]":
                    depth -= 1
                elif depth == 0 and toks[i].kind == "ident":
                    name_at = m
            if name_at is None or (n == 0 and name_at == 0) or (n > 0 and name_at != 0):
                return None
            extents = part[name_at + 1 :]
            if extents and toks[extents[0]].text != "[":
                return None
            if n == 0:
                type_text = self._text(part[0], part[name_at - 1])
            ext_text = self._text(extents[0], extents[-1]) if extents else ""
            declarators.append((toks[part[name_at]].text, ext_text))
        return end, type_text, declarators

    def _text(self, first: int, last: int) -> str:
        return " ".join(self.masked[self.tokens[first].start : self.tokens[last].end].split())


def prepare_for_clang(src: Source) -> str:
    """The text clang compiles: explicit instantiations without their attribute
    lists, kernels' threadgroup declarations as references. Line numbers kept."""
    text = list(src.text)
    toks = src.tokens
    # 1. template [[...]] [[...]] decltype(f<X>) f<X>;  (also inside #define)
    for i, tok in enumerate(toks):
        if tok.text != "template" or tok.kind != "ident":
            continue
        j = i + 1
        while j + 1 < len(toks) and toks[j].text == "[" and toks[j + 1].text == "[":
            end = _attribute_end_any(toks, j)
            if end is None:
                break
            for p in range(toks[j].start, toks[end].end):
                if text[p] != "\n":
                    text[p] = " "
            j = end + 1
    # 2. threadgroup arrays of kernels (others are left to clang, which rejects them)
    edits = []
    for first, last, type_text, declarators in src.threadgroup_declarations():
        f = src.function_at(first)
        if f is None or not f.kernel:
            continue
        refs = ", ".join(
            f"(&{name}){ext} = __msl_threadgroup<{type_text}{ext}>()" for name, ext in declarators
        )
        start, end = toks[first].start, toks[last].end
        newlines = src.text.count("\n", start, end)
        # __msl_type<T> is T; it keeps `half4 (&name)` from reading as the half4(...) constructor macro
        edits.append((start, end, f"threadgroup __msl_type<{type_text}> {refs};" + "\n" * newlines))
    out = "".join(text)
    for start, end, repl in sorted(edits, reverse=True):
        out = out[:start] + repl + out[end:]
    return out


def _attribute_end_any(toks: list[Token], j: int) -> int | None:
    """Closing `]` of the `[[` at j, counting brackets (directive lines too)."""
    depth = 0
    for k in range(j, len(toks)):
        t = toks[k].text
        if t == "[":
            depth += 1
        elif t == "]":
            depth -= 1
            if depth == 0:
                return k
    return None
