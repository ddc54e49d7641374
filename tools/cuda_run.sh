#!/usr/bin/env bash
# One call on a CUDA machine without network (our H200): install the carried
# wheels, run the kernel and engine suites on the cuda device, compute-sanitizer
# over every kernel family, and the benchmarks. Logs and JSON go to $OUT; a
# short summary is printed last.
#
#   bash tools/cuda_run.sh [STAGE ...]     stages: info build install test sanitize bench-kernels bench-engine engine-variants
#                                                  engine-context engine-kernels ncu test-batching bench-batching
#                                                  test-kv-quant bench-kv-quant engine-context-kv
#                                                  test-kv-policy stress-kv-policy test-server bench-server
#                                                  engine-context-sweep (CONTEXTS="4096 16384 ...") bench-speculative
#                                                  bench-constrained bench-prefix-store bench-preemption
#                                                  bench-prefix-store-redis bench-swap bench-memory test-kv-memory
#                                                  bench-suffix (SUFFIX_ARGS)
#                                                  test-gemma3n bench-gemma3n (GEMMA3N_SHAPE=e4b|e2b, GEMMA3N_ARGS)
#                                                  test-vision bench-vision (VISION_ARGS) bench-vision-parts
#                                                  test-audio bench-audio (AUDIO_ARGS)
#                                                  test-vision3n bench-vision3n (VISION3N_ARGS)
#                                                  tower-kernels (NCU_S)
#                                                  test-mma bench-sampler
#                                          (default: info install test sanitize)
#   env: TEST_S SAN_S BENCH_S ENGINE_S NCU_S (timeouts), KERNELS_ARGS (e.g. --quick), ENGINE_ARGS,
#        NCU_ARGS (e.g. --calls 1), SPEC_ARGS (bench/gpu/speculative.py's), VARIANT_GRAPHS (METALKV_CUDA_GRAPHS of the q8_0/q4_0 engine variants),
#        CONTEXT (engine-context's cached positions, default 32768)
#
# The wheels come from .whl/ (carried: the pure-Python packages the machine
# lacks, gguf) and from build/cuda-wheel/, where the build stage puts metalkv
# built there for the machine's Python (python3.12, METALKV_CUDA=ON,
# METALKV_CUDA_ARCHITECTURES=90; ~3 min on 16 cores). build/ is ignored, so a
# later call on the same warm machine installs it again without building. docs/CUDA.md has the build command and
# the latest results.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/cuda-run}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 METALKV_NO_PROGRESS=1
T0=$(date +%s)
step() { echo "=== [$(( $(date +%s) - T0 ))s] $*"; }
summary=()
note() { summary+=("$*"); echo "$*"; }

stage_info() {
  step "device"
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem --format=csv,noheader | tee "$OUT/device.txt"
  nvcc --version | tail -1 | tee -a "$OUT/device.txt"
  python3 --version | tee -a "$OUT/device.txt"
  uname -r | tee -a "$OUT/device.txt"  # 4.4.0 is gVisor (no ncu counters); Firecracker runs a real kernel
}

stage_build() {
  step "build the metalkv wheel for this machine"
  rm -rf build/cuda-wheel
  CMAKE_BUILD_PARALLEL_LEVEL=$(nproc) timeout ${BUILD_S:-420} python3 -m pip wheel . --no-deps --no-build-isolation \
    -w build/cuda-wheel -Cbuild-dir=build/cp312-cuda -Ccmake.define.METALKV_CUDA=ON \
    -Ccmake.define.METALKV_CUDA_ARCHITECTURES=90 -Ccmake.define.METALKV_HOST_ARCH=x86-64-v3 \
    > "$OUT/build.log" 2>&1
  local rc=$?
  tail -3 "$OUT/build.log"
  note "build: rc=$rc, $(ls build/cuda-wheel 2>/dev/null | tr '\n' ' ')"
}

# The built wheel into $OUT in parts of 15 MB (a file comes back only under 16
# MB; the wheel is ~50 MB) and its name. Copied into .whl/ here and carried,
# they spare a later call on a fresh machine the build: install joins them.
# Only in a call of its own: at most 8 files and 64 MiB come back from $OUT (2026-12-06:
# beside the benches' files, 2 of the 4 parts came back), and the carried tree must stay
# under 64 MiB with the wheel in it (not with .whl/redis/ beside it: 12 + 17 + 50 MB).
stage_keep_wheel() {
  local whl; whl=$(ls build/cuda-wheel/*.whl) || { note "keep-wheel: no wheel built"; return 1; }
  split -b 15M "$whl" "$OUT/metalkv-wheel.part-" && basename "$whl" > "$OUT/metalkv-wheel.name"
  note "keep-wheel: $(basename "$whl") in $(ls "$OUT"/metalkv-wheel.part-* | wc -l) parts"
}

stage_install() {
  step "install the wheels (carried and built here)"
  if [ -f .whl/metalkv-wheel.name ] && [ ! -d build/cuda-wheel ]; then  # a carried build (keep-wheel)
    mkdir -p build/cuda-wheel && cat .whl/metalkv-wheel.part-* > "build/cuda-wheel/$(cat .whl/metalkv-wheel.name)"
  fi
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    $(ls .whl/*.whl build/cuda-wheel/*.whl 2>/dev/null) \
    || { note "install: FAILED"; return 1; }
  export PYTHONPATH=/tmp/site
  python3 -c "import metalkv; print('metalkv', metalkv.__version__, metalkv._core.build_info(), metalkv.devices()); \
d = metalkv.device('cuda'); print('cuda device:', d.name, len(d.kernel_names()), 'kernels')" | tee "$OUT/install.txt"
}

stage_test() {
  step "kernel and engine suites on the cuda device"
  METALKV_TEST_DEVICE=cuda timeout ${TEST_S:-420} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfEs \
    tests/gpu tests/kv tests/ops tests/engine \
    --ignore=tests/engine/test_cli.py --ignore=tests/engine/test_cli_terminal.py \
    --junitxml="$OUT/junit.xml" > "$OUT/pytest.log" 2>&1
  local rc=$?
  tail -25 "$OUT/pytest.log"
  note "pytest (METALKV_TEST_DEVICE=cuda): rc=$rc, $(tail -1 "$OUT/pytest.log")"
}

stage_sanitize() {
  step "compute-sanitizer over every kernel family (tools/cuda_smoke.py) and the test kernels"
  for tool in memcheck racecheck synccheck initcheck; do
    # a graph whose launches changed shape fails cudaGraphExecUpdate and is instantiated anew
    # (cuda_command.cpp GraphCache): an API error by design, not one of the kernels
    local api=""; [ $tool = memcheck ] && api="--report-api-errors no"
    timeout ${SAN_S:-100} compute-sanitizer --tool $tool --error-exitcode 1 --print-limit 20 $api \
      python3 tools/cuda_smoke.py > "$OUT/sanitizer_$tool.txt" 2>&1
    local rc=$?
    note "compute-sanitizer --tool $tool tools/cuda_smoke.py: rc=$rc; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY|Timeout|error' "$OUT/sanitizer_$tool.txt" | tail -1)"
  done
  # the collective/reduce/type test kernels (not test_neighbour_no_barrier: a race on purpose)
  METALKV_TEST_DEVICE=cuda timeout ${SAN_S:-100} compute-sanitizer --tool memcheck --error-exitcode 1 \
    python3 -m pytest -q -p no:cacheprovider tests/gpu/test_collectives.py tests/gpu/test_reduce.py tests/gpu/test_types.py \
    > "$OUT/sanitizer_tests.txt" 2>&1
  note "compute-sanitizer --tool memcheck on tests/gpu (collectives, reduce, types): rc=$?; $(grep -E 'ERROR SUMMARY' "$OUT/sanitizer_tests.txt" | tail -1)"
}

stage_bench_kernels() {
  step "kernel benchmark with torch peers"
  timeout ${BENCH_S:-300} python3 bench/gpu/kernels.py --bench /tmp/site/bin/metalkv-bench --json "$OUT/bench_kernels.json" ${KERNELS_ARGS:-} \
    > "$OUT/bench_kernels.txt" 2>&1
  note "bench/gpu/kernels.py: rc=$?"
  tail -60 "$OUT/bench_kernels.txt"
}

stage_bench_engine() {
  step "engine benchmark: Llama-3-8B shape, metalkv vs transformers"
  timeout ${ENGINE_S:-420} python3 bench/gpu/engine.py --json "$OUT/bench_engine.json" ${ENGINE_ARGS:-} \
    > "$OUT/bench_engine.txt" 2>&1
  note "bench/gpu/engine.py: rc=$?"
  tail -30 "$OUT/bench_engine.txt"
}

# Constrained decoding's cost at the 8B shape, 128k vocabulary (bench/gpu/constrained.py):
stage_bench_constrained() {
  step "constrained decoding: 8B shape, synthetic 128k byte-level BPE, plain against a JSON schema"
  timeout ${ENGINE_S:-420} python3 bench/gpu/constrained.py --json "$OUT/bench_constrained.json" \
    > "$OUT/bench_constrained.txt" 2>&1
  note "bench/gpu/constrained.py: rc=$?"
  tail -8 "$OUT/bench_constrained.txt"
}

# Issue 36: a 4,096-token prompt from the prefix store's disk tier after a restart, beside
# computing it (bench/prefix_store.py), and 64 clients without max_tokens, preempting or
# reserving (bench/preemption.py), on a random Llama-3-8B shape.
stage_bench_prefix_store() {
  step "prefix store: 8B shape, 4096-token prompt, disk tier after a restart against computing it"
  timeout ${ENGINE_S:-420} python3 bench/prefix_store.py --random-llama 8b --device cuda --kv-memory 4GB \
    --json "$OUT/bench_prefix_store.json" > "$OUT/bench_prefix_store.txt" 2>&1
  note "bench/prefix_store.py: rc=$?"
  tail -8 "$OUT/bench_prefix_store.txt"
}

# A chat's next turn: a few new tokens over a long cached prefix, beside transformers' forward
# over a DynamicCache of the same prefix, and the call's kernels (torch.profiler).
stage_bench_suffix() {
  step "suffix: 8B shape, 1-256 new tokens over 4096 cached ones, beside transformers"
  timeout ${ENGINE_S:-420} python3 bench/gpu/suffix.py --random-llama 8b --device cuda ${SUFFIX_ARGS:-} \
    --json "$OUT/bench_suffix.json" > "$OUT/bench_suffix.txt" 2>&1
  note "bench/gpu/suffix.py: rc=$?"
  tail -40 "$OUT/bench_suffix.txt"
}

# The Redis tier on a machine without Redis: the carried Debian redis-server and the
# libraries it links (.whl/redis/, tools/carry_redis.sh), a second engine as the second server.
stage_bench_prefix_store_redis() {
  step "prefix store: 8B shape, a second server's time to first token from a shared Redis against computing it"
  # io-threads: Redis writes a 4 MB reply from its one main thread otherwise (docs/KV_CACHE.md)
  LD_LIBRARY_PATH=$PWD/.whl/redis/lib .whl/redis/redis-server --port 6399 --save '' --appendonly no \
    --io-threads 4 --daemonize yes --logfile "$OUT/redis.log" || { note "redis-server: FAILED to start"; return 1; }
  sleep 1
  timeout ${ENGINE_S:-420} python3 bench/prefix_store.py --random-llama 8b --device cuda --kv-memory 4GB \
    --redis redis://127.0.0.1:6399/0 --json "$OUT/bench_prefix_store_redis.json" > "$OUT/bench_prefix_store_redis.txt" 2>&1
  note "bench/prefix_store.py --redis: rc=$?"
  LD_LIBRARY_PATH=$PWD/.whl/redis/lib .whl/redis/redis-cli -p 6399 shutdown nosave >/dev/null 2>&1 || true
  tail -8 "$OUT/bench_prefix_store_redis.txt"
}

stage_bench_swap() {
  step "a preempted sequence: recompute against a swap to host memory, 8B shape"
  timeout ${ENGINE_S:-420} python3 bench/swap_recompute.py --random-llama 8b --device cuda --kv-memory 8GB \
    --tokens 512,2048,4096 --json "$OUT/bench_swap.json" > "$OUT/bench_swap.txt" 2>&1
  note "bench/swap_recompute.py: rc=$?"
  tail -8 "$OUT/bench_swap.txt"
}

stage_bench_memory() {
  step "memory under load: 8B shape, q4 KV with its rings, 64 clients, kv_memory 4GB"
  timeout ${ENGINE_S:-420} python3 bench/memory_load.py --random-llama 8b --device cuda --context 4096 --kv-memory 4GB \
    --clients 64 --calls 2 --prompt 1024 --max-tokens 64 --json "$OUT/bench_memory.json" > "$OUT/bench_memory.txt" 2>&1
  note "bench/memory_load.py: rc=$?"
  tail -8 "$OUT/bench_memory.txt"
}

stage_test_kv_memory() {
  step "kv_memory's cap, residual prefixes, preemption and the prefix store on the cuda device"
  METALKV_TEST_DEVICE=cuda timeout ${TEST_S:-420} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfEs \
    tests/engine/test_kv_memory.py tests/engine/test_kv_residual_engine.py tests/engine/test_preemption.py \
    tests/engine/test_prefix_cache.py tests/engine/test_prefix_store.py tests/engine/test_kv_pool.py \
    > "$OUT/test_kv_memory.txt" 2>&1
  note "test-kv-memory: rc=$?"
  tail -3 "$OUT/test_kv_memory.txt"
}

# Issue 37: Gemma 3n on the cuda device: its kernels and its parity with transformers on tiny
# random configs, then a random E4B-shaped model beside transformers (bench/gpu/gemma3n.py).
stage_test_gemma3n() {
  step "Gemma 3n: the AltUp kernels and tiny-model parity with transformers on the cuda device"
  METALKV_TEST_DEVICE=cuda timeout ${TEST_S:-420} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfEs \
    tests/ops/test_altup.py tests/engine/test_gemma3n.py > "$OUT/test_gemma3n.txt" 2>&1
  note "test-gemma3n: rc=$?"
  tail -3 "$OUT/test_gemma3n.txt"
}

stage_bench_gemma3n() {
  step "Gemma 3n: a random ${GEMMA3N_SHAPE:-e4b}-shaped model, KV bytes per token and decode beside transformers"
  timeout ${ENGINE_S:-420} python3 bench/gpu/gemma3n.py --shape "${GEMMA3N_SHAPE:-e4b}" ${GEMMA3N_ARGS:-} \
    --json "$OUT/bench_gemma3n.json" > "$OUT/bench_gemma3n.txt" 2>&1
  note "bench/gpu/gemma3n.py: rc=$?"
  tail -12 "$OUT/bench_gemma3n.txt"
}

# The media towers' stages (issue 38) share two shapes:
#   media_tests NAME FILES...   pytest on the cuda device -> $OUT/test_NAME.txt, noted as test-NAME
#   media_bench NAME ARGS...    bench/gpu/NAME.py ARGS --json $OUT/bench_NAME.json -> $OUT/bench_NAME.txt
media_tests() {
  local name=$1
  shift
  METALKV_TEST_DEVICE=cuda timeout ${TEST_S:-420} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfEs \
    "$@" > "$OUT/test_$name.txt" 2>&1
  note "test-$name: rc=$?"
  tail -3 "$OUT/test_$name.txt"
}

media_bench() {
  local name=$1
  shift
  timeout ${ENGINE_S:-420} python3 "bench/gpu/$name.py" "$@" --json "$OUT/bench_$name.json" > "$OUT/bench_$name.txt" 2>&1
  note "bench/gpu/$name.py: rc=$?"
  tail -22 "$OUT/bench_$name.txt"
}

# Gemma 3's vision tower: the kernels, the tower's and the whole model's parity with transformers on
# tiny random checkpoints, then SigLIP-so400m at 896 px beside transformers.
stage_test_vision() {
  step "Gemma 3 vision: bidirectional attention blocks, the tower kernels, tower and model parity on the cuda device"
  media_tests vision tests/kv/test_attention_blocks.py tests/ops/test_vision.py tests/models/test_vision_tower.py \
    tests/engine/test_gemma3_vision.py
}

# The matrix-unit paths (simdgroup_matrix on mma.sync): the prelude's own tests, prefill
# attention in every shape and head_dim (and with half operands), the mma gemm.
stage_test_mma() {
  step "simdgroup_matrix, prefill attention and the mma gemm on the cuda device"
  media_tests mma tests/gpu/test_simdgroup_matrix.py tests/kv/test_attention.py tests/kv/test_attention_half.py \
    tests/ops/test_gemm_mma.py
}

stage_bench_vision() {
  step "Gemma 3 vision: SigLIP-so400m (896 px) encode time beside transformers"
  media_bench vision ${VISION_ARGS:-}
}

stage_bench_vision_parts() {
  step "Gemma 3 vision: one layer's attention at SigLIP-so400m's shape beside SDPA"
  media_bench vision_parts
}

# Gemma 3n's audio tower: its kernels, the tower's and the whole model's parity with transformers
# on tiny random checkpoints, then the released conformer on a 30 s clip beside transformers.
stage_test_audio() {
  step "Gemma 3n audio: the tower kernels, tower and model parity on the cuda device"
  media_tests audio tests/ops/test_audio.py tests/models/test_audio_tower.py tests/engine/test_gemma3n_audio.py
}

stage_bench_audio() {
  step "Gemma 3n audio: a 30 s clip's encode time beside transformers"
  media_bench audio ${AUDIO_ARGS:-}
}

# Gemma 3n's vision tower (MobileNet-V5): its kernels, the tower's and the whole model's parity with
# transformers + timm on tiny random checkpoints, then the released 300M tower at 768 x 768 beside
# transformers. timm comes carried in .whl/.
stage_test_vision3n() {
  step "Gemma 3n vision: the tower kernels, tower and model parity on the cuda device"
  media_tests vision3n tests/ops/test_vision.py tests/models/test_vision3n_tower.py tests/engine/test_gemma3n_vision.py
}

stage_bench_vision3n() {
  step "Gemma 3n vision: a 768 x 768 image's encode time beside transformers"
  media_bench vision3n ${VISION3N_ARGS:-}
}

stage_bench_preemption() {
  step "preemption: 8B shape, 64 clients without max_tokens, preempting against reserving"
  timeout ${ENGINE_S:-420} python3 bench/preemption.py --random-llama 8b --device cuda --context 4096 \
    ${PREEMPT_ARGS:-} --json "$OUT/bench_preemption.json" > "$OUT/bench_preemption.txt" 2>&1
  note "bench/preemption.py: rc=$?"
  tail -8 "$OUT/bench_preemption.txt"
}

# Speculative decoding's mechanics on walk models of the 8B and 1B shapes (bench/gpu/speculative.py):
# lookup (no match, copy, edited copy), the target as its own draft, a 1B-shaped draft, each beside plain decode.
stage_bench_speculative() {
  step "speculative decoding: 8B-shaped walk target, lookup and drafts beside plain decode"
  timeout ${ENGINE_S:-420} python3 bench/gpu/speculative.py --json "$OUT/bench_speculative.json" ${SPEC_ARGS:-} \
    > "$OUT/bench_speculative.txt" 2>&1
  note "bench/gpu/speculative.py: rc=$?"
  tail -20 "$OUT/bench_speculative.txt"
}

# metalkv alone (no transformers) on the model bench-engine saved: without the
# CUDA graphs (METALKV_CUDA_GRAPHS=0; on by default), then Q8_0 and Q4_0 quantized at load.
stage_engine_variants() {
  step "engine variants: no CUDA graphs, q8_0, q4_0 (metalkv only)"
  local args="${ENGINE_ARGS:-} --hf-cache ''"
  for v in "nographs:METALKV_CUDA_GRAPHS=0:" "q8_0:METALKV_CUDA_GRAPHS=${VARIANT_GRAPHS:-1}:--quantize q8_0" \
           "q4_0:METALKV_CUDA_GRAPHS=${VARIANT_GRAPHS:-1}:--quantize q4_0"; do
    IFS=: read -r name env extra <<< "$v"
    env $env timeout ${ENGINE_S:-420} bash -c "python3 bench/gpu/engine.py --json '$OUT/bench_engine_$name.json' $args $extra" \
      > "$OUT/bench_engine_$name.txt" 2>&1
    note "bench/gpu/engine.py [$name: $env $extra]: rc=$?; $(grep -m1 -E 'metalkv' "$OUT/bench_engine_$name.txt" | tail -c 200)"
  done
}

# Decode with CONTEXT positions of random K/V already cached (engine.py --context): f16 beside
# transformers' dynamic cache, then metalkv alone quantized at load to q8_0 and q4_0.
stage_engine_context() {
  step "engine at ${CONTEXT:-32768} cached positions: f16 (+ transformers), q8_0, q4_0"
  context_runs "" "f16:--hf-cache dynamic" "q8_0:--hf-cache '' --quantize q8_0" "q4_0:--hf-cache '' --quantize q4_0"
}

# bench/gpu/engine.py at CONTEXT cached positions once per "name:extra flags" variant,
# its output in $OUT/bench_context_<prefix><name>.{txt,json}.
context_runs() {
  local prefix=$1; shift
  local args="--context ${CONTEXT:-32768} --prompt 64 --new-tokens 64 --repeat 1 ${ENGINE_ARGS:-}"
  for v in "$@"; do
    IFS=: read -r name extra <<< "$v"
    timeout ${ENGINE_S:-420} bash -c "python3 bench/gpu/engine.py --json '$OUT/bench_context_$prefix$name.json' $args $extra" \
      > "$OUT/bench_context_$prefix$name.txt" 2>&1
    note "bench/gpu/engine.py --context [$prefix$name]: rc=$?; $(grep -m1 -E '^\| metalkv' "$OUT/bench_context_$prefix$name.txt" | tail -c 220)"
  done
}

# Decode against context, the whole engine (the README's second picture): per context in CONTEXTS,
# f16 beside transformers' dynamic cache, q8 and q4 (their defaults). The JSON and logs go into one
# archive, $OUT/context_sweep.tgz (a call brings back at most 8 files).
stage_engine_context_sweep() {
  step "engine decode against context: ${CONTEXTS:=4096 16384 65536 131072}"
  local dir=/tmp/context_sweep; rm -rf $dir; mkdir -p $dir
  for c in $CONTEXTS; do
    for v in "f16:--hf-cache dynamic" "q8:--hf-cache '' --kv-k q8 --kv-v q8" "q4:--hf-cache '' --kv-k q4 --kv-v q4"; do
      IFS=: read -r name extra <<< "$v"
      timeout ${ENGINE_S:-240} bash -c "python3 bench/gpu/engine.py --context $c --prompt 64 --new-tokens 64 --repeat 1 \
        --json '$dir/context_${c}_$name.json' $extra" > "$dir/context_${c}_$name.txt" 2>&1
      note "context $c $name: rc=$?; $(grep -m2 -E '^\| (metalkv|transformers)' "$dir/context_${c}_$name.txt" | tr '\n' ' ' | tail -c 260)"
    done
  done
  tar czf "$OUT/context_sweep.tgz" -C /tmp context_sweep
}

# ncu time of every kernel of one decode step of the model bench-engine saved.
stage_engine_kernels() {
  step "one decode step's kernels under ncu (bench/gpu/engine_kernels.py)"
  local dir; dir=$(ls -d /tmp/metalkv-llama3-random-l32_* 2>/dev/null | head -1)
  [ -n "$dir" ] || { note "engine-kernels: no saved model (run bench-engine first)"; return 1; }
  timeout ${NCU_S:-150} python3 bench/gpu/engine_kernels.py --dir "$dir" --json "$OUT/engine_kernels.json" \
    > "$OUT/engine_kernels.txt" 2>&1
  note "bench/gpu/engine_kernels.py: rc=$?"
  head -20 "$OUT/engine_kernels.txt"
}

stage_ncu() {
  step "ncu counters (bench/gpu/ncu.py ${NCU_ARGS:-}: the bandwidth-bound kernels unless --targets says)"
  # ncu gets NCU_S less 20 s, so the script still writes its JSON (or the error) within the timeout.
  timeout ${NCU_S:-150} python3 bench/gpu/ncu.py --timeout $(( ${NCU_S:-150} - 20 )) --json "$OUT/ncu.json" ${NCU_ARGS:-} \
    > "$OUT/ncu.txt" 2>&1
  note "bench/gpu/ncu.py: rc=$?; $(grep -m1 '^ncu: ' "$OUT/ncu.txt")"
  tail -20 "$OUT/ncu.txt"
}

# Gemma 3's tower kernel by kernel: ncu's duration of every kernel of a SigLIP-so400m encode
# (bench/gpu/vision.py --encode-only), the second encode's summed by name (bench/gpu/tower_kernels.py).
stage_tower_kernels() {
  step "Gemma 3 vision: every kernel of one SigLIP-so400m encode under ncu"
  local ncu; ncu=$(command -v ncu || echo /usr/local/cuda/bin/ncu)
  timeout ${NCU_S:-300} "$ncu" --csv --page raw --print-units base --metrics gpu__time_duration.sum \
    --log-file "$OUT/tower_ncu.csv" python3 bench/gpu/vision.py --encode-only > "$OUT/tower_ncu.log" 2>&1
  note "tower-kernels (ncu): rc=$?"
  python3 bench/gpu/tower_kernels.py "$OUT/tower_ncu.csv" --json "$OUT/tower_kernels.json" > "$OUT/tower_kernels.txt" 2>&1
  note "bench/gpu/tower_kernels.py: rc=$?"
  head -30 "$OUT/tower_kernels.txt"
}

# The batching suites on the cuda device: several-token gemv bit-identity,
# chunk-invariant prefill attention, batched calls = lone calls, the prefix cache.
# pytest on the cuda device over the given suites, its log in $OUT/pytest_NAME.log.
pytest_cuda() {
  local name=$1; shift
  METALKV_TEST_DEVICE=cuda timeout ${TEST_S:-300} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfEs \
    "$@" > "$OUT/pytest_$name.log" 2>&1
  local rc=$?
  tail -15 "$OUT/pytest_$name.log"
  note "pytest $name suites (cuda): rc=$rc, $(tail -1 "$OUT/pytest_$name.log")"
}

stage_test_batching() {
  step "batching suites on the cuda device"
  pytest_cuda batching tests/ops/test_matmul_tokens.py tests/kv/test_attention_invariance.py tests/kv/test_block_cache.py \
    tests/engine/test_batching.py tests/engine/test_prefix_cache.py tests/engine/test_cache_state.py \
    tests/engine/test_kv_pool.py
}

# Quantized KV (issue 14): its suites on the cuda device, and decode attention per format.
stage_test_kv_quant() {
  step "quantized KV suites on the cuda device"
  pytest_cuda kv_quant tests/kv/test_kv_quant.py tests/engine/test_kv_quant_engine.py tests/engine/test_cache_file.py \
    tests/engine/test_ppl.py tests/kv/test_kv_residual.py tests/engine/test_kv_residual_engine.py
}

# Decode at CONTEXT cached positions, metalkv alone, per KV cache format (f16, q8, q4; q4 rotated).
stage_engine_context_kv() {
  step "engine at ${CONTEXT:-32768} cached positions per KV format"
  context_runs kv_ "f16:--hf-cache ''" "q8:--hf-cache '' --kv-k q8 --kv-v q8" "q4:--hf-cache '' --kv-k q4 --kv-v q4 --no-kv-rotate --kv-residual 0" \
    "q4rot:--hf-cache '' --kv-k q4 --kv-v q4 --kv-rotate --kv-residual 0" "q4rotr128:--hf-cache '' --kv-k q4 --kv-v q4 --kv-rotate --kv-residual 128" \
    "q2r128:--hf-cache '' --kv-k q2 --kv-v q2 --kv-rotate --kv-residual 128"
}

stage_test_kv_policy() {
  step "eviction policy suites on the cuda device"
  METALKV_TEST_DEVICE=cuda timeout ${TEST_S:-420} python3 -X faulthandler -m pytest -q -p no:cacheprovider -rfEs \
    tests/kv/test_kv_policy.py tests/kv/test_attention_scores.py tests/engine/test_kv_policy_engine.py \
    > "$OUT/pytest_kv_policy.log" 2>&1
  local rc=$?
  tail -15 "$OUT/pytest_kv_policy.log"
  note "pytest kv policy (METALKV_TEST_DEVICE=cuda): rc=$rc, $(tail -1 "$OUT/pytest_kv_policy.log")"
}

# 20,000 tokens per policy on a random-weight Llama (16 layers, hidden 2048, GQA 32/8):
# memory, RSS and tokens/s sampled as the cache keeps its budget (bench/kv_policy_stress.py).
stage_stress_kv_policy() {
  step "eviction policies: flat memory over ${STRESS_TOKENS:-20000} tokens"
  timeout ${ENGINE_S:-420} python3 bench/kv_policy_stress.py --device cuda --random --tokens ${STRESS_TOKENS:-20000} \
    --context 4096 --budget 0.5 --every 1000 --policy none streaming keynorm h2o snapkv pyramidkv --json "$OUT/kv_policy_stress.json" \
    > "$OUT/kv_policy_stress.txt" 2>&1
  note "bench/kv_policy_stress.py: rc=$?"
  tail -8 "$OUT/kv_policy_stress.txt"
}

stage_bench_kv_quant() {
  step "decode attention per KV format (metalkv-bench --filter kv_quant)"
  timeout ${BENCH_S:-300} /tmp/site/bin/metalkv-bench --filter kv_quant --device cuda --json "$OUT/bench_kv_quant.json" \
    > "$OUT/bench_kv_quant.txt" 2>&1
  note "metalkv-bench --filter kv_quant: rc=$?"
  tail -30 "$OUT/bench_kv_quant.txt"
}

# The server suites on the cuda device (the tiny model's: the default model is not on that machine)
# and the engine suites the server relies on (penalties, logprobs, the messages API).
stage_test_server() {
  step "server and sampling suites on the cuda device"
  pytest_cuda server tests/server tests/engine/test_sampling.py tests/engine/test_logprobs.py tests/engine/test_chat_api.py
}

# metalkv serve on a random-weight Llama (SERVER_SHAPE, default 8b) with the default model's
# tokenizer (.whl/tokenizer.json or .json.gz, carried: `python bench/server.py --export-tokenizer`), 1/8/32 clients.
stage_bench_server() {
  step "bench/server.py: metalkv serve on the cuda device, random Llama ${SERVER_SHAPE:-8b}"
  local tok=.whl/tokenizer.json
  [ -f $tok ] || { gunzip -c $tok.gz > /tmp/tokenizer.json && tok=/tmp/tokenizer.json; }  # carried gzipped
  timeout ${BENCH_S:-400} python3 bench/server.py --servers metalkv --device cuda --random-llama ${SERVER_SHAPE:-8b} \
    --tokenizer $tok ${SERVER_ARGS:---concurrency 1 8 32 --requests 2 --max-tokens 64} \
    --json "$OUT/bench_server.json" > "$OUT/bench_server.txt" 2>&1
  note "bench/server.py: rc=$?"
  tail -8 "$OUT/bench_server.txt"
}

# Aggregate decode tok/s at 1..64 sequences, weight bytes per token, cached-prefix TTFT.
stage_bench_batching() {
  step "bench/batching.py: random Llama shapes (${BATCH_SHAPES:-8b})"
  for shape in ${BATCH_SHAPES:-8b}; do
    timeout ${BENCH_S:-400} python3 bench/batching.py --random-llama "$shape" --device cuda ${BATCH_ARGS:---prompt 128 --new-tokens 64} \
      --json "$OUT/batching_$shape.json" > "$OUT/batching_$shape.txt" 2>&1
    note "bench/batching.py --random-llama $shape: rc=$?"
    tail -8 "$OUT/batching_$shape.txt"
  done
}

# ops.sample's two shapes at Gemma 3's vocabulary beside torch's sampling, and the sampler's tests.
stage_bench_sampler() {
  step "bench/sampler.py and the sampling suites on the cuda device"
  timeout ${BENCH_S:-300} python3 bench/sampler.py --device cuda --vocab 262144 --calls 200 > "$OUT/sampler.txt" 2>&1
  note "bench/sampler.py: rc=$?"
  cat "$OUT/sampler.txt"
  pytest_cuda sampling tests/engine/test_sampling.py tests/engine/test_logit_edits.py
}

stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(info install test sanitize)
export PYTHONPATH=/tmp/site
for s in "${stages[@]}"; do "stage_${s//-/_}"; done
step "done"
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
