#!/usr/bin/env bash
# Issue 38 variants side by side in one device call (README.md beside this file).
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${OUT:-/tmp/exp}
bash tools/cuda_run.sh info install > "$OUT/install.txt" 2>&1
tail -3 "$OUT/install.txt"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
# correctness of each variant on the device, and the gelu epilogue
METALKV_TEST_DEVICE=cuda timeout 90 python3 -m pytest -q -p no:cacheprovider tests/ops/test_matmul.py -k "gelu or activation" > "$OUT/test_gelu.txt" 2>&1
echo "test gelu: $(tail -1 "$OUT/test_gelu.txt")"
METALKV_TEST_DEVICE=cuda timeout 120 python3 -m pytest -q -p no:cacheprovider tests/ops/test_gemm_split.py tests/models/test_vision_tower.py > "$OUT/test_split.txt" 2>&1
echo "test split + tower: $(tail -1 "$OUT/test_split.txt")"
for e in e1 e2 e7 e8 e9; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP=$e timeout 60 python3 -m pytest -q -p no:cacheprovider tests/ops/test_gemm_mma.py -k 16bit > "$OUT/test_$e.txt" 2>&1
  echo "test gemm $e: $(tail -1 "$OUT/test_$e.txt")"
done
for e in e5 e6; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP_ATTN=$e timeout 60 python3 -m pytest -q -p no:cacheprovider tests/kv/test_attention_half.py > "$OUT/test_$e.txt" 2>&1
  echo "test attn $e: $(tail -1 "$OUT/test_$e.txt")"
done
# timing: each variant (gemm variants through METALKV_EXP, attention through METALKV_EXP_ATTN)
for v in base:: e1:e1: e2:e2: e7:e7: e8:e8: e9:e9: e5::e5 e6::e6; do
  IFS=: read -r name g a <<< "$v"
  METALKV_EXP=$g METALKV_EXP_ATTN=$a timeout 60 python3 bench/gpu/vision_parts.py --repeat 3 --json "$OUT/parts_$name.json" > "$OUT/parts_$name.txt" 2>&1
  echo "== $name"; grep -E "half q and p|SDPA|bf16 activations|^\| (qkv|out|up|down|x 27)" "$OUT/parts_$name.txt"
done
best=$(python3 - "$OUT" <<'P'
import json, sys, os
o = sys.argv[1]
def load(n):
    try: return json.load(open(os.path.join(o, f"parts_{n}.json")))
    except Exception: return None
g = min((n for n in ("base", "e1", "e2", "e7", "e8", "e9") if load(n)), key=lambda n: load(n)["layer_gemms_16bit_tower_s"])
a = min((n for n in ("base", "e5", "e6") if load(n)), key=lambda n: load(n)["metalkv_attention_half_s"])
print(("" if g == "base" else g) + ":" + ("" if a == "base" else a))
P
)
echo "best: $best"
IFS=: read -r g a <<< "$best"
timeout 100 python3 bench/gpu/vision.py --no-check --repeat 3 --json "$OUT/vision_base.json" > "$OUT/vision_base.txt" 2>&1
echo "== tower base"; tail -8 "$OUT/vision_base.txt"
METALKV_EXP=$g METALKV_EXP_ATTN=$a timeout 100 python3 bench/gpu/vision.py --no-check --repeat 3 --json "$OUT/vision_best.json" > "$OUT/vision_best.txt" 2>&1
echo "== tower best ($best)"; tail -8 "$OUT/vision_best.txt"
# ncu (stall reasons) and the vision suites, as time allows (the call's limit is 540 s)
T0=${T0:-0}
if [ $SECONDS -lt 330 ]; then
  METALKV_EXP=$g METALKV_EXP_ATTN=$a timeout 100 python3 bench/gpu/ncu.py --targets compute --calls 1 --timeout 90 --json "$OUT/ncu_best.json" > "$OUT/ncu_best.txt" 2>&1
  grep -E "x16|half" "$OUT/ncu_best.txt" | cut -c1-400
fi
if [ $SECONDS -lt 420 ]; then
  TEST_S=100 bash tools/cuda_run.sh test-vision > "$OUT/test_vision.txt" 2>&1
  tail -3 "$OUT/test_vision.txt"
fi
echo "elapsed $SECONDS s"
