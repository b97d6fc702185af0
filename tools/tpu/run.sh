#!/usr/bin/env bash
# The command a run on a TPU machine executes (docs/tpu.md):
#
#   bash tools/tpu/run.sh kernels,models [harness flags...]
#
# from the repository root, with .whl-tpu/ (tools/tpu/wheels.py) beside it.
# Installs the wheels and the machine index's large packages under /tmp
# (its JAX stays first on PYTHONPATH), then runs the harness's suites;
# everything lands in $OUT (default /tmp/tpu-out): install.log, log.txt,
# summary.json and a JSON file per suite. Every step is bounded in time.
set -uo pipefail
cd "$(dirname "$0")/../.."
suites="${1:-kernels,models}"
shift || true
out="${OUT:-/tmp/tpu-out}"
mkdir -p "${out}"
site=/tmp/maxtext-site
index_site=/tmp/maxtext-site-index
start=${SECONDS}
if ! {
  PIP_CONFIG_FILE=/dev/null timeout 300 python3 -m pip install --isolated \
    -q --no-index --no-deps --no-cache-dir --upgrade --target "${site}" \
    .whl-tpu/*.whl &&
    PIP_CONFIG_FILE=/dev/null timeout 300 python3 -m pip install --isolated \
      -q --only-binary=:all: --no-deps --no-cache-dir \
      --index-url file:///opt/pypi/simple --target "${index_site}" \
      $(python3 -c 'from tools.tpu import wheels
print(*wheels.FROM_MACHINE_INDEX)')
} >"${out}/install.log" 2>&1; then
  echo "tools/tpu/run.sh: installing failed; ${out}/install.log:" >&2
  tail -20 "${out}/install.log" >&2
  exit 1
fi
echo "== installed in $((SECONDS - start)) s"
export PYTHONPATH="${PYTHONPATH:+${PYTHONPATH}:}${site}:${index_site}:${PWD}"
export MAXTEXT_ASSET_CACHE="${PWD}/.whl-tpu/assets"
exec python3 -m tools.tpu.harness --suites="${suites}" --out="${out}" "$@"
