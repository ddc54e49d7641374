#!/usr/bin/env bash
# Issue 38, round 3 (README.md beside this folder): gemm tile shapes e20..e25 (padded tiles, the main body
# generalized), the tower with the fastest and attention e16 (round 2's lean fetch), on the cuda device.
# With variants.patch applied and its wheel carried.
cd "$(dirname "$0")/../../../.."  # the repository root
OUT=${OUT:-/tmp/exp}
bash tools/cuda_run.sh info install > "$OUT/install.txt" 2>&1; tail -2 "$OUT/install.txt"
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
for e in e20 e21 e22 e23 e24 e25; do
  METALKV_TEST_DEVICE=cuda METALKV_EXP=$e timeout 60 python3 -m pytest -q -p no:cacheprovider tests/ops/test_gemm_mma.py -k 16bit > "$OUT/test_$e.txt" 2>&1
  echo "test gemm $e: $(tail -1 "$OUT/test_$e.txt")"
done
for v in base:: e20:e20:e16 e21:e21: e22:e22: e23:e23: e24:e24: e25:e25: base2:: ; do
  IFS=: read -r name g a <<< "$v"
  METALKV_EXP=$g METALKV_EXP_ATTN=$a timeout 60 python3 bench/gpu/vision_parts.py --repeat 3 > "$OUT/parts_$name.txt" 2>&1
  echo "== $name (gemm $g, attention $a)"; grep -E "half q and p|MLP up gemm: metalkv|^\| (qkv|out|up|down|x 27)" "$OUT/parts_$name.txt"
done
best=$(python3 - "$OUT" <<'P'
import re, sys, os
o = sys.argv[1]
def parse(n):
    try: t = open(os.path.join(o, f"parts_{n}.txt")).read()
    except Exception: return None, None
    g = re.search(r"^\| x 27 layers\s*\|\s*([0-9.]+)", t, re.M)
    a = re.search(r"half q and p\s*\|\s*([0-9.]+)", t)
    return (float(g.group(1)) if g else None), (float(a.group(1)) if a else None)
gs = {n: parse(n)[0] for n in ("base", "e20", "e21", "e22", "e23", "e24", "e25")}
at = {"": parse("base")[1], "e16": parse("e20")[1]}
g = min((n for n in gs if gs[n]), key=lambda n: gs[n])
a = min((n for n in at if at[n]), key=lambda n: at[n])
print(("" if g == "base" else g) + ":" + a)
P
)
echo "best: $best"
IFS=: read -r g a <<< "$best"
timeout 100 python3 bench/gpu/vision.py --no-check --repeat 3 --json "$OUT/vision_base.json" > "$OUT/vision_base.txt" 2>&1
echo "== tower base"; grep -E "transformers_s|metalkv_half_s|half_speed" "$OUT/vision_base.txt"
METALKV_EXP=$g METALKV_EXP_ATTN=$a timeout 100 python3 bench/gpu/vision.py --no-check --repeat 3 --json "$OUT/vision_best.json" > "$OUT/vision_best.txt" 2>&1
echo "== tower best ($best)"; grep -E "transformers_s|metalkv_half_s|half_speed" "$OUT/vision_best.txt"
if [ $SECONDS -lt 200 ]; then
  METALKV_EXP=$g METALKV_EXP_ATTN=$a timeout 100 python3 bench/gpu/ncu.py --targets compute --calls 1 --timeout 90 --json "$OUT/ncu_best.json" > "$OUT/ncu_best.txt" 2>&1
  grep -E "x16|half" "$OUT/ncu_best.txt" | cut -c1-400
fi
if [ $SECONDS -lt 280 ]; then
  METALKV_EXP=$g METALKV_EXP_ATTN=$a TEST_S=90 bash tools/cuda_run.sh test-mma > "$OUT/test_mma_best.txt" 2>&1; tail -2 "$OUT/test_mma_best.txt"
fi
if [ $SECONDS -lt 380 ]; then
  METALKV_EXP=$g METALKV_EXP_ATTN=$a TEST_S=40 bash tools/cuda_run.sh test-vision > "$OUT/test_vision_best.txt" 2>&1; tail -2 "$OUT/test_vision_best.txt"
fi
echo "elapsed $SECONDS s"
