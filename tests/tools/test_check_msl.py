"""tools/check_msl.py, the address-space check of the Metal kernels: every
kernel passes it, and each planted mistake -- one Apple's compiler rejects --
is reported as an error naming the planted line, by clang (through the MSL
prelude in tools/msl_check/) or by the lint. Runs the tool as a subprocess;
nothing here imports metalkv.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "check_msl.py"
METAL = REPO / "metal"
CLANG = shutil.which("clang-19") or shutil.which("clang")
needs_clang = pytest.mark.skipif(CLANG is None, reason="no clang on PATH (apt-get install clang-19)")


def check(*args: str, cwd: Path = REPO, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, str(TOOL), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=300
    )


@needs_clang
def test_every_kernel_passes():
    r = check()
    assert r.returncode == 0, r.stdout + r.stderr
    kernels = len(list(METAL.glob("*.metal"))) + len(list((METAL / "test").glob("*.metal")))
    summary = r.stdout.strip().splitlines()[-1]
    assert summary.startswith(f"check_msl: {kernels} kernel files"), summary
    assert "no errors" in summary and "warning" not in summary, r.stdout


# ---- planted mistakes -----------------------------------------------------------
# A small kernel for mistakes that need a context of their own. {decls} goes at
# program scope, {body} inside the kernel; the line marked /* PLANTED */ is the one
# the error must name (a block comment: a plant may sit inside a parameter list).
SMALL = """\
#include "mkv_kernel.h"
struct Params {{ uint n; float s; }};
inline float read_tg(threadgroup float* t) {{ return t[0]; }}
inline float read_dev(device float* d) {{ return d[0]; }}
inline void set_thread(thread float& r) {{ r = 1.0f; }}
{decls}
kernel void small(constant Params& p [[buffer(0)]],
                  device float* out [[buffer(1)]],
                  uint tid [[thread_index_in_threadgroup]]) {{
  threadgroup float tg[64];
  float priv[4] = {{0.0f, 0.0f, 0.0f, 0.0f}};
  const int si = int(tid);
  {body}
  out[tid] = tg[tid % 64] + priv[0] + float(si) + p.s;
}}
"""

# (id, file, (old, new) replacement or None, SMALL's decls, SMALL's body, what the error says)
# `file` is a real kernel file (copied) or "small.metal" (SMALL).
PLANTS = [
    # -- clang, through the prelude's address spaces and types --
    ("threadgroup-to-device", "attention_decode_kernels.h",
     ("attn_decode_body<L, D, R, S, RES, LG, EL>(p, q, kv, table, ring, sinks, out,",
      "attn_decode_body<L, D, R, S, RES, LG, EL>(p, q, kv, table, ring, sinks, tg_m,  /* PLANTED */"),
     None, None, "no known conversion from 'threadgroup float[64]' to 'device float *"),
    ("device-to-threadgroup", "sample.metal",
     ("m = group_max<kSimds>(m, slots, simd, lane);", "m = group_max<kSimds>(m, work, simd, lane);  /* PLANTED */"),
     None, None, "cannot pass pointer to address space 'device' as a pointer to address space 'threadgroup'"),
    ("thread-to-device", "small.metal", None, "", "out[0] = read_dev(priv);  /* PLANTED */",
     "no known conversion from 'thread float[4]' to 'device float *"),
    ("device-to-thread-reference", "small.metal", None, "", "set_thread(out[0]);  /* PLANTED */",
     "no matching function for call to 'set_thread'"),
    ("cast-between-address-spaces", "small.metal", None, "",
     "device float* d = (device float*)tg;  /* PLANTED */\n  out[1] = d[0];",
     "converts between mismatching address spaces"),
    ("write-through-constant", "rope.metal",
     ("device float* row = x + t * p.n_heads * p.head_dim;",
      "device float* row = x + t * p.n_heads * p.head_dim;\n  p.n_tokens = 3;  /* PLANTED */"),
     None, None, "read-only variable is not assignable"),
    ("write-to-program-scope-constant", "small.metal", None, "constant float kScale = 2.0f;",
     "kScale = 3.0f;  /* PLANTED */", "read-only variable is not assignable"),
    ("float4-of-float3", "types.metal",
     ("out[0 * n + i] = v.wzyx;", "out[0 * n + i] = float4(v.xyz);  /* PLANTED */"),
     None, None, "no vector constructor float4(float3)"),
    ("int4-of-int3", "small.metal", None, "", "int4 iv = int4(int3(si));  /* PLANTED */\n  out[1] = float(iv.x);",
     "no vector constructor int4(int3)"),
    ("implicit-vector-conversion", "small.metal", None, "",
     "float4 hv = half4(1.0h);  /* PLANTED */\n  out[1] = hv.x;",
     "cannot initialize a variable of type 'thread float4'"),
    ("min-uint-int", "elementwise.h",
     ("const uint n4 = p.dim / 4;",
      "const uint n4 = p.dim / 4;\n  const uint bad = min(lane, int(simd));  /* PLANTED */"),
     None, None, "deduced conflicting types for parameter 'T'"),
    ("max-float-int", "small.metal", None, "", "out[1] = max(p.s, 0);  /* PLANTED */", "deduced conflicting types"),
    ("simd-shuffle-bool", "small.metal", None, "",
     "const bool b = simd_shuffle(tid > 3, ushort(1));  /* PLANTED */\n  out[1] = b ? 1.0f : 0.0f;",
     "no matching function for call to 'simd_shuffle'"),
    ("double", "kv_store.metal",
     ("const uint pos = p.first_pos + t;", "const uint pos = p.first_pos + t;\n  double scale = 1.0;  /* PLANTED */"),
     None, None, "use of type 'double' requires"),
    ("variable-length-array", "reduce.metal",
     ("threadgroup float sums[32];", "threadgroup float sums[32];\n  float vla[nt];  /* PLANTED */"),
     None, None, "array size is not a constant expression"),
    ("non-constant-global", "sample.metal",
     ('#include "sample_params.h"', '#include "sample_params.h"\nfloat g_scratch;  /* PLANTED */'),
     None, None, "program scope variable must reside in constant address space"),
    ("threadgroup-global", "small.metal", None, "threadgroup float g_tile[16];  /* PLANTED */", "",
     "program scope variable must reside in constant address space"),
    ("static-local", "small.metal", None, "", "static float calls = 0.0f;  /* PLANTED */\n  out[1] = calls;",
     "static local variable must reside in constant address space"),
    ("threadgroup-in-helper", "small.metal", None,
     "inline float helper_tile() {\n  threadgroup float tile[4];  /* PLANTED */\n  return tile[0];\n}", "",
     "non-kernel function variable cannot be declared in local address space"),
    ("function-pointer", "small.metal", None, "inline float ident(float x) { return x; }",
     "float (*fp)(float) = ident;  /* PLANTED */\n  out[1] = fp(1.0f);", "pointers to functions are not allowed"),
    ("infinite-recursion", "small.metal", None, "inline float spin(float x) { return spin(x + 1.0f); }  /* PLANTED */",
     "out[1] = spin(1.0f);", "all paths through this function will call itself"),
    # simdgroup_matrix: loads from device or threadgroup memory only, one element type
    ("simdgroup-load-from-thread", "simdgroup_matrix.metal",
     ("simdgroup_load(mb, b, p.ldb, bo, p.tb != 0);",
      "simdgroup_load(mb, b, p.ldb, bo, p.tb != 0);\n    T priv[64];\n    simdgroup_load(mb, priv);  /* PLANTED */"),
     None, None, "no matching function for call to 'simdgroup_load'"),
    ("simdgroup-load-from-constant", "simdgroup_matrix.metal",
     ("simdgroup_load(acc, c, p.ldc);", "simdgroup_load(acc, (constant T*)nullptr);  /* PLANTED */"),
     None, None, "no matching function for call to 'simdgroup_load'"),
    ("simdgroup-accumulator-type", "simdgroup_matrix.metal",
     ("simdgroup_multiply_accumulate(acc, ma, mb, acc);",
      "simdgroup_matrix<half, 8, 8> hm;\n      simdgroup_multiply_accumulate(hm, ma, mb, acc);  /* PLANTED */"),
     None, None, "no matching function for call to 'simdgroup_multiply_accumulate'"),
    ("simdgroup-store-other-type", "simdgroup_matrix.metal",
     ("simdgroup_store(acc, d, p.ldd, ulong2(p.d_x, p.d_y), p.td != 0);",
      "simdgroup_store(acc, (device int*)d, p.ldd);  /* PLANTED */"),
     None, None, "no matching function for call to 'simdgroup_store'"),
    # -- the lint (clang's OpenCL mode accepts these, or cannot see them) --
    ("lambda", "collectives.metal",
     ("const float x = in[gid];\n  out[0 * n + gid] = simd_product(x);",
      "const float x = in[gid];\n  auto twice = [](float v) { return 2.0f * v; };  /* PLANTED */\n"
      "  out[0 * n + gid] = simd_product(twice(x));"),
     None, None, "[lambda]"),
    ("unqualified-pointer-parameter", "attention.h",
     ("inline void load_q_slice(const device float* row,", "inline void load_q_slice(const float* row,  /* PLANTED */"),
     None, None, "[address-space] parameter 'row' of 'load_q_slice'"),
    ("unqualified-reference-parameter", "small.metal", None,
     "inline void bump(float& x) { x += 1.0f; }  /* PLANTED */", "bump(priv[0]);",
     "[address-space] parameter 'x' of 'bump'"),
    ("goto", "small.metal", None, "", "if (tid > 9999) goto done;  /* PLANTED */\n  done:", "[goto]"),
    ("unsuffixed-float-literal", "small.metal", None, "", "out[1] = p.s * 0.5;  /* PLANTED */",
     "[float-literal] floating literal 0.5 has no suffix"),
    ("std", "small.metal", None, "", "out[1] = std::min(1.0f, p.s);  /* PLANTED */", "[std]"),
    ("new", "small.metal", None, "", "float* heap = new float[4];  /* PLANTED */\n  out[1] = heap[0];", "[new]"),
    ("delete", "small.metal", None, "", "thread float* heap = priv;\n  delete[] heap;  /* PLANTED */", "[delete]"),
    ("virtual", "small.metal", None, "struct Shape {\n  virtual float area() { return 0.0f; }  /* PLANTED */\n};", "",
     "[virtual]"),
    ("throw", "small.metal", None, "", "if (tid > 9999) throw 1;  /* PLANTED */", "[exceptions]"),
    ("typeid", "small.metal", None, "", "out[1] = float(sizeof(typeid(p)));  /* PLANTED */", "[rtti]"),
    ("recursion", "small.metal", None,
     "inline float fact(uint n) { return n == 0 ? 1.0f : float(n) * fact(n - 1); }  /* PLANTED */",
     "out[1] = fact(tid);",
     "[recursion] 'fact' calls itself"),
    ("mutual-recursion", "small.metal", None,
     "inline float odd(uint n);\ninline float even(uint n) { return n == 0 ? 1.0f : odd(n - 1); }  /* PLANTED */\n"
     "inline float odd(uint n) { return n == 0 ? 0.0f : even(n - 1); }",
     "out[1] = even(tid);", "[recursion] recursive calls even -> odd -> even"),
    ("attribute-on-wrong-type", "small.metal", None,
     "kernel void by_float(device float* o [[buffer(0)]],\n"
     "                     float gid [[thread_position_in_grid]]) {  /* PLANTED */\n  o[0] = gid;\n}", "",
     "[attribute-type] [[thread_position_in_grid]] takes uint, ushort or a 2- or 3-vector of them, not 'float'"),
    ("buffer-by-value", "reduce.metal",
     ("kernel void test_reduce_tree(constant mkv_test::Reduce& p [[buffer(0)]],",
      "kernel void test_reduce_tree(mkv_test::Reduce p [[buffer(0)]],  /* PLANTED */"),
     None, None, "[attribute-type] [[buffer]] takes a device or constant pointer or reference"),
    ("attribute-typo", "rope.metal",
     ("uint t [[threadgroup_position_in_grid]],", "uint t [[threadgroup_position_in_gird]],  /* PLANTED */"),
     None, None, "[attribute] [[threadgroup_position_in_gird]] is not an MSL attribute"),
]
# The real kernel file that includes each planted header.
INCLUDER = {"attention.h": "attention_decode.metal", "attention_decode_kernels.h": "attention_decode.metal",
            "elementwise.h": "elementwise.metal"}


def plant(root: Path, spec) -> tuple[Path, Path, int]:
    """A copy of metal/ under root with one mistake; (file to check, planted file, planted line)."""
    _, name, replace, decls, body, _ = spec
    shutil.copytree(METAL, root, ignore=shutil.ignore_patterns("*.o", "__pycache__"))
    sub = "test/" if (METAL / "test" / name).is_file() else ""
    target = root / (sub + name)
    if name == "small.metal":
        text = SMALL.format(decls=decls, body=body)
    else:
        text = target.read_text()
        old, new = replace
        assert text.count(old) >= 1, f"{name} no longer has {old!r}: update the plant"
        text = text.replace(old, new, 1)
    target.write_text(text)
    line = next(n for n, l in enumerate(text.splitlines(), 1) if "/* PLANTED */" in l)
    checked = root / (sub + INCLUDER.get(name, name))
    return checked, target, line


@pytest.fixture(scope="module")
def planted_run(tmp_path_factory):
    """All plants, each in its own copy of metal/, checked by one run of the tool."""
    base = tmp_path_factory.mktemp("plants")
    where = {}
    for spec in PLANTS:
        checked, target, line = plant(base / spec[0], spec)
        where[spec[0]] = (checked.relative_to(base), target.relative_to(base), line)
    r = check(*sorted({str(c) for c, _, _ in where.values()}), cwd=base)
    return r, where


@needs_clang
@pytest.mark.parametrize("spec", PLANTS, ids=[p[0] for p in PLANTS])
def test_planted_mistake_is_rejected_at_its_line(planted_run, spec):
    r, where = planted_run
    assert r.returncode == 1, r.stdout + r.stderr
    _, target, line = where[spec[0]]
    prefix = f"{target}:{line}:"
    errors = [l for l in r.stdout.splitlines() if l.startswith(prefix) and ": error: " in l]
    assert errors, f"no error at {prefix}\n" + "\n".join(l for l in r.stdout.splitlines() if str(target.parent) in l)
    block = _blocks(r.stdout)
    said = "\n".join(block[e] for e in errors)
    assert spec[5] in said, f"expected {spec[5]!r} at {prefix}, got:\n{said}"


def _blocks(out: str) -> dict[str, str]:
    """Each headline of the tool's output with the indented lines under it."""
    blocks, head = {}, None
    for l in out.splitlines():
        if l.startswith("    ") and head is not None:
            blocks[head] += "\n" + l
        else:
            head = l
            blocks[head] = l
    return blocks


@needs_clang
def test_errors_only_in_planted_files(planted_run):
    """Every error of the planted run is in a planted file: the untouched files
    of each copy (attention_decode.metal under a planted attention.h, the
    headers of every copy) stay clean."""
    r, where = planted_run
    planted = {str(t) for _, t, _ in where.values()}
    heads = [l for l in r.stdout.splitlines() if re.match(r"^\S+:\d+:\d+: error: ", l)]
    assert heads
    assert {h.split(":")[0] for h in heads} <= planted, "\n".join(heads)


# ---- what must pass ---------------------------------------------------------------
VALID = """\
#include "mkv_kernel.h"
struct S { float a; uint b; };
struct Params { uint n; float s; };
constant float4 kOnes = float4(1.0f, 2.0f, 3.0f, 4.0f);
constant float4 kMixed = float4(float2(1.0f), 2.0f, 3.0f);
constant float kTable[4] = {1.0f, 2.0f, 3.0f, 4.0f};
constant constexpr uint kN = 64;
static_assert(sizeof(packed_float3) == 12 && sizeof(float3) == 16 && sizeof(packed_half4) == 8, "MSL sizes");
static_assert(alignof(packed_float4) == 4 && sizeof(bool3) == 4 && sizeof(half) == 2, "MSL alignment");

template <typename T>
inline T twice(T x) { return x + x; }

template <uint N>
MKV_MAX_THREADS(64) kernel void valid(constant Params& p [[buffer(0)]],
                                      device S* structs [[buffer(1)]],
                                      device float4* out [[buffer(2)]],
                                      const device half4* hin [[buffer(3)]],
                                      device atomic_uint* counter [[buffer(4)]],
                                      const device packed_float3* pf [[buffer(5)]],
                                      threadgroup float* scratch [[threadgroup(0)]],
                                      uint2 gid [[thread_position_in_grid]],
                                      ushort lane [[thread_index_in_simdgroup]]) {
  threadgroup float tile[N * 2],
                    other[N];
  threadgroup atomic_int hits;
  const S s = structs[gid.x];   // struct copies to and from device memory
  structs[gid.y] = s;
  float4 v = float4(hin[gid.x]);
  float4 w = float4(v.xy, float2(s.a, 1.0f));
  w.xy += v.zw;
  w.zx = v.yy;
  const float3 f3 = pf[gid.x];
  const float4 z = float4(f3, 1.0f) + kOnes * kTable[lane % 4] + kMixed;
  const bool2 b2 = v.xy > 0.5f;
  const bool4 b4 = v > w;
  const float4 sel = select(w, v, v > 0.5f);
  const uint2 bits = as_type<uint2>(v.xy);
  half h = half(v.x);
  h = clamp(exp(h), 0.0h, 1.0h);
  float m = metal::precise::cos(v.x) + fast::exp(v.y) + metal::fast::length(v.xyz) + dot(v, w);
  m += clamp(m, 0.0f, 1.0f) + max(v.x, w.y) + float(min(bits.x, bits.y)) + M_PI_F;
  m += numeric_limits<float>::max() * 0.0f - FLT_MAX * 0.0f + INFINITY * 0.0f;
  tile[lane] = simd_sum(m);
  other[lane] = simd_shuffle_xor(tile[lane], ushort(1));
  scratch[lane] = simd_broadcast_first(other[lane]);
  threadgroup_barrier(mem_flags::mem_device | mem_flags::mem_threadgroup);
  atomic_fetch_add_explicit(counter, 1u, memory_order_relaxed);
  atomic_store_explicit(&hits, 0, memory_order_relaxed);
  const uint64_t ballot = uint64_t(simd_ballot(lane > 3));
  int2 ii = int2(1, 2);
  ii.yx = ii.xy;
  const ushort2 us = ushort2(ii);
  out[gid.x] = sel + z + float4(any(b2) ? 1.0f : 0.0f) + float(all(b4)) + float(ballot) + float(h) +
               float(us.x) + twice(m);
  out[gid.x][2] = float(p.n) * p.s;
}
MKV_KERNEL("valid_64", valid<kN>)
"""


@needs_clang
def test_valid_msl_passes(tmp_path):
    """MSL that Apple's compiler takes must pass: vector constructors and
    swizzles, struct copies through device memory, program-scope constant
    vectors, half math, select on a comparison, atomics, simd functions,
    multi-line threadgroup declarations in a template kernel."""
    root = tmp_path / "metal"
    shutil.copytree(METAL, root)
    (root / "valid.metal").write_text(VALID)
    r = check("valid.metal", cwd=root)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "no errors" in r.stdout


@needs_clang
def test_lines_survive_the_rewrites(tmp_path):
    """The copies clang compiles rewrite threadgroup declarations (spanning
    lines here) and explicit instantiations; errors after them keep their lines."""
    root = tmp_path / "metal"
    shutil.copytree(METAL, root)
    anchor = "  m += clamp(m, 0.0f, 1.0f)"
    text = VALID.replace(anchor, "  m += min(lane, 1u);  /* PLANTED */\n" + anchor)
    text += 'MKV_KERNEL("valid_32", valid<32>)\nconstant float kAfter = min(1.0f, 2);  /* PLANTED */ 2\n'
    (root / "valid.metal").write_text(text)
    lines = [n for n, l in enumerate(text.splitlines(), 1) if "/* PLANTED */" in l]
    r = check("valid.metal", cwd=root)
    assert r.returncode == 1
    for n in lines:
        assert any(l.startswith(f"valid.metal:{n}:") and "error" in l for l in r.stdout.splitlines()), r.stdout


@needs_clang
def test_constant_struct_copy_is_only_a_warning(tmp_path):
    """Copying a struct out of constant memory is valid MSL that clang's OpenCL
    mode cannot type-check: reported as a warning, exit status 0."""
    root = tmp_path / "metal"
    shutil.copytree(METAL, root)
    (root / "copy.metal").write_text(
        '#include "mkv_kernel.h"\nstruct Params { uint n; float s; };\n'
        "kernel void copy(constant Params& p [[buffer(0)]], device float* out [[buffer(1)]]) {\n"
        "  const Params local_copy = p;\n  out[0] = local_copy.s;\n}\n"
    )
    r = check("copy.metal", cwd=root)
    assert r.returncode == 0, r.stdout
    assert re.search(r"^copy\.metal:4:\d+: warning: .*struct copied out of constant memory", r.stdout, re.M), r.stdout


def test_without_clang_it_says_how_to_get_one(tmp_path):
    env = dict(os.environ, PATH=str(tmp_path))  # an empty directory: no clang on PATH
    r = check("metal/rope.metal", env=env)
    assert r.returncode == 2
    assert "apt-get install clang-19" in r.stderr
    r = check("--clang", str(tmp_path / "no-such-clang"), "metal/rope.metal")
    assert r.returncode == 2 and "no-such-clang" in r.stderr
