#!/usr/bin/env bash
# The GPU check: build with CUDA, run the CUDA tests, then the GPU benchmark table.
# Meant for one NVIDIA GPU machine with python3, numpy, pytest and torch (CUDA) installed
# and no network; finishes in under 5 minutes on an H200. With $OUT set, the table and the
# test summary also go to $OUT/gpu_check.md.
#   bash benchmarks/gpu_check.sh
set -euo pipefail
cd "$(dirname "$0")/.."

PY=${PYTHON:-python3}
REPORT=${OUT:+$OUT/gpu_check.md}
report() { if [ -n "$REPORT" ]; then tee -a "$REPORT"; else cat; fi; }
if [ -n "$REPORT" ]; then : >"$REPORT"; fi

echo "## fastloop GPU check, $(date -u +%Y-%m-%dT%H:%MZ)" | report
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | sed 's/^/    /' | report || true
fi

echo "### build" | report
export FASTLOOP_CUDA=1 FASTLOOP_CUDA_ARCHS=${FASTLOOP_CUDA_ARCHS:-90}
"$PY" setup.py -q build_ext --inplace >/tmp/fastloop_gpu_build.log 2>&1 ||
    { tail -40 /tmp/fastloop_gpu_build.log; exit 1; }
PYTHONPATH=python "$PY" -c "import fastloop; print('   ', fastloop.cuda.is_available().reason)" | report

echo "### tests" | report
status=0
PYTHONPATH=python PYTHONUNBUFFERED=1 timeout 240 "$PY" -m pytest -q -p no:cacheprovider \
    tests/test_cuda.py tests/test_device_feed.py tests/test_nn.py -k "cuda or device" 2>&1 | tail -30 | sed 's/^/    /' | report || status=1

echo "### benchmark" | report
PYTHONPATH=python PYTHONUNBUFFERED=1 timeout 200 "$PY" benchmarks/bench_gpu.py 2>&1 | report || status=1
exit $status
