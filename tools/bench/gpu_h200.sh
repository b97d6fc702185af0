#!/bin/bash
# The GPU checks and benchmarks, prepared for an H200 lent through the device
# tool (one short run; see /work/.library/device/README.md where that tool
# exists). In order, each step bounded in time and none stopping the rest:
#
#   1. versions: the GPU, JAX, Flax, Optax, Orbax and the devices JAX sees;
#   2. perf_compare's `llama3-8b` shape (Llama 3 8B's widths at 4 of its 32
#      layers, tools/bench/shapes.py) trained in bfloat16 with attention
#      "auto" (cuDNN) and "pallas_gpu": compile seconds, step time,
#      tokens/s, TFLOP/s and MFU against 989 TFLOP/s (the H100/H200 dense
#      bf16 peak; target >= 55 %) and peak device memory;
#   3. attention_bench at Llama 3 8B's attention widths (32 query / 8 kv
#      heads of 128, bfloat16) for L = 2048 and 8192: tokens/s, scratch
#      memory and each kernel's error against the float32 reference
#      (xla, cudnn, pallas_gpu, blockwise);
#   4. the attention kernel tests run on the GPU itself: pallas_gpu_test's
#      parity cases then run the Triton kernels (not the interpreter), and
#      attention_test runs on the GPU backend (float32 matmuls at "highest"
#      precision, as on CPU).
#
# The device machine's image has JAX for CUDA, flax, optax and orbax, but
# nothing can be fetched there: packages it lacks (ml-collections, grain,
# qwix and their needs) travel as wheels in .whl, made here as that README
# shows; the pins' flax, optax and orbax-checkpoint go in .whl/pinned and
# are installed only if this repository does not import with the image's.
# Everything printed also goes to $OUT/gpu_h200.log. From the repository
# root:
#
#   bash tools/bench/gpu_h200.sh
#
# SHAPE, BATCH and LENGTHS override the train shape, its global batch and
# the attention lengths (a dry run on CPU: SHAPE=tiny LENGTHS=256).
set -uo pipefail
cd "$(dirname "$0")/../.."
out="${OUT:-/tmp/gpu_h200}"
mkdir -p "${out}"
exec > >(tee "${out}/gpu_h200.log") 2>&1

site=/tmp/site
install() {
  python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target "${site}" "$@"
}
if compgen -G ".whl/*.whl" >/dev/null; then
  install .whl/*.whl
  export PYTHONPATH="${site}"
fi
export PYTHONPATH="${PWD}${PYTHONPATH:+:${PYTHONPATH}}" PYTHONUNBUFFERED=1
if ! python3 -c "import tools.bench.perf_compare" 2>/dev/null &&
   compgen -G ".whl/pinned/*.whl" >/dev/null; then
  echo "The image's packages do not import this repository; taking the pins':"
  python3 -c "import tools.bench.perf_compare" 2>&1 | tail -3
  install .whl/pinned/*.whl
fi

step() { echo; echo "=== $* ($(date -u +%T))"; }
# Runs a step's command for at most $1 seconds; a failure is printed, not
# fatal.
bounded() {
  local limit="$1"
  shift
  timeout "${limit}" "$@"
  local rc=$?
  if ((rc != 0)); then echo "--- exit ${rc}: $*"; fi
}

step "1. versions"
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm,driver_version \
  --format=csv
python3 -c "
import flax, jax, optax, orbax.checkpoint as ocp
print('jax', jax.__version__, 'flax', flax.__version__, 'optax',
      optax.__version__, 'orbax', ocp.__version__)
print(jax.devices())"

step "2. train step, ${SHAPE:-llama3-8b}, bfloat16"
bounded 300 python3 -m tools.bench.perf_compare \
  --shapes="${SHAPE:-llama3-8b}" --dtypes=bfloat16 \
  --small_batch="${BATCH:-4}" --steps=5 --warmup_steps=2 \
  --peak_tflops=989 --attention_impls=auto,pallas_gpu --attention_block=128 \
  2>&1 | grep -v "^I[0-9]"

step "3. attention at Llama 3 8B's widths"
bounded 150 python3 -m tools.bench.attention_bench \
  --lengths="${LENGTHS:-2048,8192}" --impls=xla,cudnn,pallas_gpu,blockwise \
  --heads=32 --kv_heads=8 --head_dim=128 --dtype=bfloat16 --block=128 \
  --repeats=10 --check 2>&1 | grep -v "^I[0-9]"

step "4. attention kernel tests on the GPU"
for test in pallas_gpu_test attention_test; do
  JAX_DEFAULT_MATMUL_PRECISION=highest bounded 150 \
    python3 -m "maxtext.kernels.${test}" 2>&1 | grep -v "^I[0-9]" | tail -25
done

if command -v nvidia-smi >/dev/null; then
  nvidia-smi --query-gpu=clocks.sm,temperature.gpu,power.draw --format=csv
fi
step "done"
