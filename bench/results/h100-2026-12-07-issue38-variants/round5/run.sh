#!/usr/bin/env bash
# Issue 38, round 5: two tile buffers in the gemm (e50-e55) and in the half prefill attention (e56),
# 64-key attention tiles (e57). With the round-5 patch applied.
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${OUT:-/tmp/exp}
bash tools/cuda_run.sh info install > "$OUT/install.txt" 2>&1; tail -2 "$OUT/install.txt"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for e in e50 e51 e52 e53 e55; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP=$e timeout 60 python3 -m pytest -q -p no:cacheprovider tests/ops/test_gemm_mma.py -k 16bit > "$OUT/test_$e.txt" 2>&1
  echo "test gemm $e: $(tail -1 "$OUT/test_$e.txt")"
done
for e in e56 e57; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP_ATTN=$e timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kv/test_attention_half.py -k "80 or 64" > "$OUT/test_$e.txt" 2>&1
  echo "test attention $e: $(tail -1 "$OUT/test_$e.txt")"
done
for g in "" e50 e51 e52 e53 e55 ""; do
  METALKV_EXP=$g timeout 60 python3 bench/gpu/vision_parts.py --repeat 3 > "$OUT/parts_g$g.txt" 2>&1
  echo "== gemm '$g'"; grep -E "^\| (qkv|out|up|down|x 27)" "$OUT/parts_g$g.txt"
done
for a in "" e56 e57 ""; do
  METALKV_EXP_ATTN=$a timeout 60 python3 bench/gpu/vision_parts.py --repeat 3 > "$OUT/parts_a$a.txt" 2>&1
  echo "== attention '$a'"; grep -E "^\| attention" "$OUT/parts_a$a.txt"
done
timeout 150 python3 bench/gpu/vision.py > "$OUT/vision.txt" 2>&1; grep -E "^\| (metalkv|transformers)" "$OUT/vision.txt"
echo "elapsed $SECONDS s"
