#!/usr/bin/env bash
# Issue 38, round 2 (README.md beside this folder), trimmed to a short device budget.
# With variants.patch applied and its wheel carried.
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${OUT:-/tmp/exp}
bash tools/cuda_run.sh install > "$OUT/install.txt" 2>&1; tail -1 "$OUT/install.txt"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for v in base:: e10:e10:e16 e11:e11:e17 e13:e13:e15 e12:e12: ; do
  IFS=: read -r name g a <<< "$v"
  METALKV_EXP=$g METALKV_EXP_ATTN=$a timeout 40 python3 bench/gpu/vision_parts.py --repeat 3 > "$OUT/parts_$name.txt" 2>&1
  echo "== $name (gemm $g, attention $a)"; grep -E "half q and p|^\| (qkv|out|up|down|x 27)" "$OUT/parts_$name.txt" | cut -c1-90
done
echo "elapsed $SECONDS s"
for e in e10 e11 e13; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP=$e timeout 30 python3 -m pytest -q -p no:cacheprovider tests/ops/test_gemm_mma.py -k 16bit > "$OUT/test_$e.txt" 2>&1
  echo "test gemm $e: $(tail -1 "$OUT/test_$e.txt")"
done
for e in e15 e16 e17; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP_ATTN=$e timeout 30 python3 -m pytest -q -p no:cacheprovider tests/kv/test_attention_half.py > "$OUT/test_a$e.txt" 2>&1
  echo "test attn $e: $(tail -1 "$OUT/test_a$e.txt")"
done
echo "elapsed $SECONDS s"
