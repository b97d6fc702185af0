#!/bin/bash
# Issue #14's GPU check, prepared for an H200 lent through the device tool
# (one short run; see /work/.library/device/README.md where that tool exists).
#
# Trains the `llama3-8b` shape (Llama 3 8B's widths at 4 of its 32 layers,
# tools/bench/shapes.py) in bfloat16 on one GPU, where attention "auto" is
# jax.nn.dot_product_attention's cuDNN kernel, and prints compile seconds,
# step time, tokens/s, TFLOP/s and MFU against 989 TFLOP/s (the H100/H200
# dense bf16 peak; target >= 55 %) and peak device memory.
#
# The device machine's image has JAX for CUDA, flax, optax and orbax, but
# nothing can be fetched there: packages it lacks (ml-collections, grain and
# their needs) travel as wheels in .whl, made here as that README shows,
# and this script installs them first. Run from the repository root:
#
#   bash tools/bench/gpu_h200.sh [--small_batch=N] [--steps=N]
set -euo pipefail
cd "$(dirname "$0")/../.."
if compgen -G ".whl/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile \
    --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,memory.total,clocks.max.sm --format=csv
python3 -m tools.bench.perf_compare --shapes=llama3-8b --dtypes=bfloat16 \
  --small_batch=2 --steps=5 --warmup_steps=2 --peak_tflops=989 "$@"
