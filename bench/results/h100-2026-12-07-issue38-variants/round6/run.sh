#!/usr/bin/env bash
# Issue 38, round 6: the tower's activations held in 16 bits between its ops (LayerNorm ->
# q/k/v and up gemms, up -> down), and the _in16 gemm's fetch depth (e60: 5, e61: 6, e62: 3;
# the default 4). With the round-6 patch applied.
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${OUT:-/tmp/exp}
TEST_S=240 bash tools/cuda_run.sh info install test-mma test-vision > "$OUT/stages.txt" 2>&1
grep -E "passed|failed|error" "$OUT/stages.txt" | tail -8
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for e in e60 e61 e62; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP=$e timeout 60 python3 -m pytest -q -p no:cacheprovider tests/ops/test_gemm_mma.py -k "16bit_x or 16bit_y" > "$OUT/test_$e.txt" 2>&1
  echo "test gemm $e: $(tail -1 "$OUT/test_$e.txt")"
done
for e in "" e60 e61 e62 ""; do
  METALKV_EXP=$e timeout 150 python3 bench/gpu/vision.py > "$OUT/vision_$e.txt" 2>&1
  echo "== tower '$e'"; grep -E "^\| (metalkv|transformers)|max_err" "$OUT/vision_$e.txt"
done
echo "elapsed $SECONDS s"
