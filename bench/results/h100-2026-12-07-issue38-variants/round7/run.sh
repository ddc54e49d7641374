#!/usr/bin/env bash
# Issue 38, round 7: 32 query rows a SIMD-group in the half prefill attention at D = 80 (e70:
# with the K/V register prefetch, e71: without, e73: 16-key tiles with it) and e72 (16 rows,
# without the prefetch). With the round-7 patch applied.
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${OUT:-/tmp/exp}
bash tools/cuda_run.sh info install > "$OUT/install.txt" 2>&1; tail -1 "$OUT/install.txt"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for e in e70 e71 e72 e73; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP_ATTN=$e timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kv/test_attention_half.py -k "80" > "$OUT/test_$e.txt" 2>&1
  echo "test attention $e: $(tail -1 "$OUT/test_$e.txt")"
done
for a in "" e70 e71 e72 e73 ""; do
  METALKV_EXP_ATTN=$a timeout 60 python3 bench/gpu/vision_parts.py --repeat 5 > "$OUT/parts_a$a.txt" 2>&1
  echo "== attention '$a'"; grep -E "^\| attention: (metalkv, half|torch)" "$OUT/parts_a$a.txt"
done
echo "elapsed $SECONDS s"
