#!/usr/bin/env bash
# Issue 38, round 3, second call: where the 16-bit gemm's time goes. Diagnostic
# kernels (wrong results by design; timing only): e26 no global fetch, e27 no
# products, e28 products only (no fetch, no tile stores, no barriers in the
# loop), e29 as e28 with 8 SIMD-groups of 64 x 32. With variants.patch applied.
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${OUT:-/tmp/exp}
bash tools/cuda_run.sh info install > "$OUT/install.txt" 2>&1; tail -2 "$OUT/install.txt"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for g in "" e26 e27 e28 e29 ""; do
  METALKV_EXP=$g timeout 60 python3 bench/gpu/vision_parts.py --repeat 3 > "$OUT/parts_$g.txt" 2>&1
  echo "== gemm '$g'"; grep -E "^\| (qkv|out|up|down|x 27)" "$OUT/parts_$g.txt"
done
for g in "" e28; do
  METALKV_EXP=$g timeout 100 python3 bench/gpu/ncu.py --targets compute --calls 1 --timeout 90 --json "$OUT/ncu_$g.json" > "$OUT/ncu_$g.txt" 2>&1
  echo "== ncu '$g'"; grep -E "x16" "$OUT/ncu_$g.txt" | grep -v "^\\$\|command" | cut -c1-400
done
echo "elapsed $SECONDS s"
