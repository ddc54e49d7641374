#!/usr/bin/env bash
# Issue 38, round 4: producer and consumer SIMD-groups (e40-e43). With the round-4 patch applied.
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${OUT:-/tmp/exp}
bash tools/cuda_run.sh info install > "$OUT/install.txt" 2>&1; tail -2 "$OUT/install.txt"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for e in e40 e41 e42 e43; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP=$e timeout 60 python3 -m pytest -q -p no:cacheprovider tests/ops/test_gemm_mma.py -k 16bit > "$OUT/test_$e.txt" 2>&1
  echo "test gemm $e: $(tail -1 "$OUT/test_$e.txt")"
done
for g in "" e40 e41 e42 e43 ""; do
  METALKV_EXP=$g timeout 60 python3 bench/gpu/vision_parts.py --repeat 3 > "$OUT/parts_$g.txt" 2>&1
  echo "== gemm '$g'"; grep -E "^\| (qkv|out|up|down|x 27)" "$OUT/parts_$g.txt"
done
echo "elapsed $SECONDS s"
