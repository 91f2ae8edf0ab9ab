#!/usr/bin/env bash
# The GPU check, in one prepared run: build with CUDA, the GPU tests, the GPU benchmark, the GPU
# feed benchmark (ResNets fed by torch's DataLoader, fastloop CPU decode and nvJPEG), then
# compute-sanitizer's memcheck over the CUDA tests and the leak check (no leak grows with batches).
# Meant for one NVIDIA GPU machine with python3, numpy, pytest, Pillow, torch (CUDA), torchvision
# and compute-sanitizer installed and no network; under 10 minutes on an H200 with 16 cores.
# Every step runs under `timeout`, within what is left of CHECK_BUDGET_S (570 s); a step that fails
# or runs out of time is reported and the next one still runs; the exit status is 1 if any failed.
# With $OUT set, the report goes to $OUT/gpu_check.md, the feed benchmark's table to
# $OUT/gpu_feed.md and each step's output to $OUT/<step>.log (8 files in all).
#   bash benchmarks/gpu_check.sh
# --wheel proves the wheel instead of a source build: the cp312 manylinux wheel from dist/
# (make wheel; carry dist/ to the GPU machine) goes into a fresh venv that sees the system's
# numpy, pytest and torch (no network there), with no nvcc on PATH and no CUDA_HOME, and the
# tests run against it (the checkout's python/ is not on the path; the tests' C hooks are
# absent from a wheel, so the tests needing them skip). Needs a python3.12.
#   bash benchmarks/gpu_check.sh --wheel
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PY=${PYTHON:-python3}
WHEEL_MODE=0
if [ "${1:-}" = --wheel ]; then WHEEL_MODE=1; fi
BUDGET=${CHECK_BUDGET_S:-570}
LOGS=${OUT:-$(mktemp -d)}
REPORT=${OUT:+$OUT/gpu_check.md}
export PYTHONPATH=python PYTHONUNBUFFERED=1
status=0
report() { if [ -n "$REPORT" ]; then tee -a "$REPORT"; else cat; fi; }
indent() { sed 's/^/    /'; }
if [ -n "$REPORT" ]; then : >"$REPORT"; fi
rm -f "$LOGS"/{build,tests,bench_gpu,gpu_feed,memcheck,leaks}.log "$LOGS/gpu_feed.md"
# a log over 4 MB keeps its head and its end (a sanitizer's can be huge; $OUT brings back files up to 16 MB)
trim() {
    if [ "$(stat -c %s "$1")" -gt 4000000 ]; then
        { head -c 500000 "$1"; printf '\n[... trimmed ...]\n'; tail -c 3000000 "$1"; } >"$1.trim" && mv "$1.trim" "$1"
    fi
}

# step NAME CAP COMMAND...: runs COMMAND with its output added to $LOGS/NAME.log, for at most CAP
# seconds or what is left of the budget; says in the report how it ended. Returns COMMAND's status.
step() {
    local name=$1 cap=$2 left=$((BUDGET - SECONDS)) rc
    shift 2
    touch "$LOGS/$name.log"
    if [ "$left" -lt 15 ]; then
        echo "    $name: not run, the check's ${BUDGET} s are spent" | report
        status=1
        return 1
    fi
    if [ "$cap" -gt "$left" ]; then cap=$left; fi
    timeout --kill-after=10 "$cap" "$@" >>"$LOGS/$name.log" 2>&1
    rc=$?
    if [ -n "$(tail -c 1 "$LOGS/$name.log")" ]; then echo >>"$LOGS/$name.log"; fi  # a line cut off
    trim "$LOGS/$name.log"
    case $rc in
        0) ;;
        124 | 137) echo "    $name: stopped after its ${cap} s" | report ;;
        *) echo "    $name: exit status $rc" | report ;;
    esac
    if [ $rc -ne 0 ]; then status=1; fi
    return $rc
}

echo "## fastloop GPU check, $(date -u +%Y-%m-%dT%H:%MZ)" | report
if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | indent | report
fi

# without_nvcc: PATH with every folder holding an nvcc left out, and no CUDA_HOME/CUDA_PATH
without_nvcc() {
    local kept="" dir
    local IFS=:
    for dir in $PATH; do
        if [ -n "$dir" ] && [ ! -x "$dir/nvcc" ]; then kept=${kept:+$kept:}$dir; fi
    done
    PATH=$kept
    unset CUDA_HOME CUDA_PATH IFS
}

# install_wheel: the cp312 wheel into a fresh venv over the system's packages; PY becomes its python
install_wheel() {
    local wheel venv
    wheel=$(find dist -maxdepth 1 -name 'fastloop-*-cp312-cp312-*manylinux*.whl' | sort | tail -1)
    if [ -z "$wheel" ]; then
        echo "no cp312 manylinux wheel in dist/ (make wheel builds it; carry dist/ here)"
        return 1
    fi
    venv=$(mktemp -d)/venv
    "$PY" -m venv --system-site-packages "$venv" &&
        "$venv/bin/python" -m pip install -q --no-deps --no-index --force-reinstall "$wheel" || return 1
    PY=$venv/bin/python
    echo "installed $wheel into $venv"
}

if [ "$WHEEL_MODE" = 1 ]; then
    echo "### the cp312 wheel, no nvcc on PATH" | report
    without_nvcc
    unset PYTHONPATH  # the wheel's fastloop, not the checkout's python/
    # in this shell, not through step: it sets PY
    if ! install_wheel >>"$LOGS/build.log" 2>&1 ||
        ! "$PY" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' >>"$LOGS/build.log" 2>&1; then
        tail -20 "$LOGS/build.log" | indent | report
        exit 1
    fi
    tail -1 "$LOGS/build.log" | indent | report
    export FASTLOOP_EXPECT_CORE  # tests/conftest.py fails unless the tests import this _core
    FASTLOOP_EXPECT_CORE=$("$PY" -c 'from fastloop import _core; print(_core.__file__)')
    if command -v nvcc >/dev/null; then echo "    nvcc is still on PATH: $(command -v nvcc)" | report; status=1; fi
else
    echo "### build" | report
    if ! step build 240 env FASTLOOP_CUDA=1 FASTLOOP_TESTING=1 FASTLOOP_CUDA_ARCHS="${FASTLOOP_CUDA_ARCHS:-90}" \
        "$PY" setup.py -q build_ext --inplace; then
        tail -40 "$LOGS/build.log" | indent | report
        exit 1
    fi
fi
"$PY" -c "import fastloop; print(fastloop.cuda.is_available().reason)" 2>&1 | indent | report

echo "### tests" | report
cuda_tests="tests/test_cuda.py tests/test_device_feed.py tests/test_gpu_decode.py"
# shellcheck disable=SC2086 # the file lists are split on purpose
step tests 180 "$PY" -m pytest -q -p no:cacheprovider $cuda_tests tests/test_loader_torch.py tests/test_gpu_stage.py
tail -30 "$LOGS/tests.log" | indent | report
step tests 60 "$PY" -m pytest -q -p no:cacheprovider tests/test_nn.py -k cuda
tail -1 "$LOGS/tests.log" | indent | report  # the summary line of test_nn.py

echo "### benchmark (bench_gpu.py)" | report
step bench_gpu 90 "$PY" benchmarks/bench_gpu.py
report <"$LOGS/bench_gpu.log"

echo "### GPU feed (bench_gpu_feed.py)" | report
feed_table=$LOGS/gpu_feed.md
step gpu_feed 240 "$PY" benchmarks/bench_gpu_feed.py --out "$feed_table"
if [ -f "$feed_table" ]; then report <"$feed_table"; fi  # what it measured, also when cut short
grep -E "^\(.* s in all\)$" "$LOGS/gpu_feed.log" | report
if grep -qE "Traceback|^no GPU feed" "$LOGS/gpu_feed.log"; then
    grep -E -B2 -A12 "Traceback|^no GPU feed" "$LOGS/gpu_feed.log" | tail -60 | indent | report
fi

echo "### memcheck (compute-sanitizer over the CUDA tests)" | report
if command -v compute-sanitizer >/dev/null; then
    # shellcheck disable=SC2086
    if step memcheck 150 env FASTLOOP_TEST_TIMEOUT=600 compute-sanitizer --tool memcheck --leak-check full \
        "$PY" -m pytest -q -p no:cacheprovider $cuda_tests ||
        [ -s "$LOGS/memcheck.log" ]; then
        tail -3 "$LOGS/memcheck.log" | indent | report
        # leaks at exit here include torch's cached blocks; the leak check below compares batch counts
        "$PY" tests/test_gpu_leaks.py --parse "$LOGS/memcheck.log" | indent | report || status=1
        grep -E "^=+ (Invalid|Misaligned|Out-of-range|Program hit|Malloc|Hardware)" "$LOGS/memcheck.log" |
            sort | uniq -c | sort -rn | head -20 | indent | report
    fi
    echo "### leak check (memcheck, 8 vs 40 batches)" | report
    step leaks 150 env FASTLOOP_TEST_TIMEOUT=600 "$PY" -m pytest -q -s -p no:cacheprovider tests/test_gpu_leaks.py
    grep -E "batches: |passed|failed|skipped|Error" "$LOGS/leaks.log" | tail -8 | indent | report
else
    echo "    compute-sanitizer is not on PATH: memcheck not run" | report
    status=1
fi

echo "($SECONDS s in all; logs: $LOGS)" | report
exit $status
