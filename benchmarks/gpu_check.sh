#!/usr/bin/env bash
# The GPU check: one prepared run for one NVIDIA GPU machine (H100/H200, 16 cores, no network)
# with python3 (and its Python.h), nvcc, numpy, pytest (pytest-xdist used where installed),
# Pillow, torch (CUDA) and torchvision. It fits 8 minutes with the machine's start: its steps'
# caps add up to at most 420 s, build included (printed first; the script refuses to start if
# they add up to more). The steps, in order:
#   preflight  (20 s) Python.h, nvcc, the driver, a JPEG codec and libnvjpeg, each where the build
#              and fastloop.cuda.load_nvjpeg() look (benchmarks/gpu_preflight.py). One line says
#              what is missing, and the check stops there.
#   build      FASTLOOP_CUDA_ARCHS=90 (override it in the environment), in place
#   cuda_info  fastloop.cuda.is_available() and which libnvjpeg loads
#   tests      the CUDA tests (-n 4 with pytest-xdist), then test_nn.py -k cuda
#   bench_gpu  benchmarks/bench_gpu.py --quick
#   gpu_feed   benchmarks/bench_gpu_feed.py --quick: ResNets fed by torch's DataLoader, fastloop CPU
#              decode and nvJPEG; each row names which decoder ran (hardware engine / fallback / CPU
#              images, regions used)
# and at the end a summary (Markdown, ready for BENCHMARKS.md): the steps and the feed table.
# A step that fails or runs out of its cap is reported and the next one still runs (a failed
# preflight or build stops the check); the exit status is 1 if any step failed.
#
#   bash benchmarks/gpu_check.sh             # the check above
#   bash benchmarks/gpu_check.sh --sanitize  # its own run, also <= 420 s: preflight, build (skipped
#        when the in-place build is newer than every source), compute-sanitizer's memcheck over the
#        CUDA tests and the leak check (tests/test_gpu_leaks.py: few vs many batches, no leak may
#        grow), both with torch hidden: torch under compute-sanitizer cannot finish in a cap
#   bash benchmarks/gpu_check.sh --wheel     # dist/'s cp312 manylinux wheel (make wheel; carry
#        dist/) instead of a source build: into a fresh venv over the system's packages, no nvcc
#        on PATH, no CUDA_HOME; the same tests and benchmarks run against it
#   bash benchmarks/gpu_check.sh --preflight # the preflight alone
#   ... --dry-run    the whole script with every GPU step stubbed (what it would run is logged,
#        with made-up output the report and the summary parse): runs anywhere, in seconds;
#        tests/test_gpu_check.py runs it. GPU_CHECK_DRY_FAIL=STEP makes that step's stub fail.
# With $OUT set, everything goes under it: gpu_check.md (the report), gpu_summary.md (the summary
# table), gpu_feed.md (the feed benchmark's table) and a log per step (<step>.log).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

PY=${PYTHON:-python3}
MODE=check
DRY_RUN=0
for arg in "$@"; do
    case $arg in
        --wheel) MODE=wheel ;;
        --sanitize) MODE=sanitize ;;
        --preflight) MODE=preflight ;;
        --dry-run) DRY_RUN=1 ;;
        *)
            echo "usage: bash benchmarks/gpu_check.sh [--sanitize | --wheel | --preflight] [--dry-run]" >&2
            exit 2
            ;;
    esac
done
if [ "$MODE" = preflight ]; then
    exec "$PY" benchmarks/gpu_preflight.py
fi

# each mode's steps and their caps in seconds, in the order they run
case $MODE in
    check) STEPS="preflight:20 build:110 cuda_info:10 tests:120 tests_nn:30 bench_gpu:30 gpu_feed:90" ;;
    wheel) STEPS="preflight:20 install:60 cuda_info:10 tests:120 tests_nn:30 bench_gpu:30 gpu_feed:90" ;;
    sanitize) STEPS="preflight:20 build:110 memcheck:150 leaks:130" ;;
esac
MAX_BUDGET=420
cap_of() {
    local entry
    for entry in $STEPS; do
        if [ "${entry%%:*}" = "$1" ]; then
            echo "${entry#*:}"
            return
        fi
    done
    echo 0
}
caps_sum=0
caps_text=""
for entry in $STEPS; do
    caps_sum=$((caps_sum + ${entry#*:}))
    caps_text="${caps_text:+$caps_text + }${entry%%:*} ${entry#*:}"
done
BUDGET=${CHECK_BUDGET_S:-$caps_sum}

TEMPS=()  # removed at exit: the dry run's stub folder, --sanitize's torch-hiding folder
trap 'rm -rf "${TEMPS[@]}"' EXIT
LOGS=${OUT:-$(mktemp -d)}
mkdir -p "$LOGS"
REPORT=$LOGS/gpu_check.md
SUMMARY=$LOGS/gpu_summary.md
FEED_TABLE=$LOGS/gpu_feed.md
export PYTHONPATH=python PYTHONUNBUFFERED=1
status=0
report() { tee -a "$REPORT"; }
indent() { sed 's/^/    /'; }
: >"$REPORT"
rm -f "$SUMMARY" "$FEED_TABLE"
for entry in $STEPS; do rm -f "$LOGS/${entry%%:*}.log"; done

# a log over 4 MB keeps its head and its end (a sanitizer's can be huge; $OUT brings back files up to 16 MB)
trim() {
    if [ "$(stat -c %s "$1")" -gt 4000000 ]; then
        { head -c 500000 "$1"; printf '\n[... trimmed ...]\n'; tail -c 3000000 "$1"; } >"$1.trim" && mv "$1.trim" "$1"
    fi
}

# --dry-run: a folder put first on PATH with a stand-in nvidia-smi (so the preflight's and the
# header's parsing run), and stub_output's made-up output for each stubbed step
STUB_BIN=""
if [ "$DRY_RUN" = 1 ]; then
    STUB_BIN=$(mktemp -d)
    TEMPS+=("$STUB_BIN")
    cat >"$STUB_BIN/nvidia-smi" <<'EOF'
#!/bin/sh
echo "NVIDIA H100 80GB HBM3 (dry-run stub), 570.00, 81559 MiB"
EOF
    chmod +x "$STUB_BIN/nvidia-smi"
    PATH=$STUB_BIN:$PATH
fi

# stub_output NAME COMMAND...: what a step's log would hold (made up), for the report's parsing in
# a dry run; the feed benchmark's is its own --dry-run (made-up rows through its real report code)
stub_output() {
    local name=$1
    shift
    case $name in
        tests) echo "============ 84 passed, 3 skipped in 41.20s (dry run: made up) ============" ;;
        tests_nn) echo "============ 12 passed, 40 deselected in 9.80s (dry run: made up) ============" ;;
        bench_gpu) printf 'row         fastloop  reference  ratio\ntrain step  1.00      1.00       1.00x (made up)\n' ;;
        gpu_feed) env PYTHONPATH=python "$@" --dry-run ;;
        memcheck)
            echo "========= COMPUTE-SANITIZER"
            echo "12 passed in 80.00s (dry run: made up)"
            echo "========= LEAK SUMMARY: 0 bytes leaked in 0 allocations"
            echo "========= ERROR SUMMARY: 0 errors"
            ;;
        leaks)
            echo "4 batches: 0 bytes leaked in 0 allocations, 0 other errors; torch imported: False"
            echo "16 batches: 0 bytes leaked in 0 allocations, 0 other errors; torch imported: False"
            echo "2 passed in 60.00s (dry run: made up)"
            ;;
        cuda_info) echo "fastloop.cuda: usable (dry run: made up); nvJPEG: libnvjpeg.so.13 (dry run: made up)" ;;
        *) ;;
    esac
}

# step NAME COMMAND...: runs COMMAND with its output added to $LOGS/NAME.log, for at most the
# step's cap (or what is left of the budget); says in the report how it ended, and keeps the
# step's time and result for the summary. Returns COMMAND's status. A dry run logs the command
# and stub_output's made-up output instead of running it.
STEP_ROWS=""
step() {
    local name=$1 cap left=$((BUDGET - SECONDS)) rc start=$SECONDS result
    cap=$(cap_of "$1")
    shift
    touch "$LOGS/$name.log"
    if [ "$left" -lt 5 ]; then
        echo "    $name: not run, the check's ${BUDGET} s are spent" | report
        STEP_ROWS="$STEP_ROWS| $name | $cap | 0 | not run: no time left |"$'\n'
        status=1
        return 1
    fi
    if [ "$cap" -gt "$left" ]; then cap=$left; fi
    if [ "$DRY_RUN" = 1 ] && [ "$name" != preflight ]; then  # the preflight runs for real
        {
            printf 'dry run: would run, for at most %s s:' "$cap"
            printf ' %q' "$@"
            echo
            stub_output "$name" "$@" 2>&1
        } >>"$LOGS/$name.log"
        rc=$?
        if [ "${GPU_CHECK_DRY_FAIL:-}" = "$name" ]; then rc=1; fi
    else
        timeout --kill-after=10 "$cap" "$@" >>"$LOGS/$name.log" 2>&1
        rc=$?
    fi
    if [ -n "$(tail -c 1 "$LOGS/$name.log")" ]; then echo >>"$LOGS/$name.log"; fi  # a line cut off
    trim "$LOGS/$name.log"
    case $rc in
        0) result=ok ;;
        124 | 137) result="stopped after its ${cap} s" ;;
        *) result="exit status $rc" ;;
    esac
    if [ $rc -ne 0 ]; then
        echo "    $name: $result" | report
        status=1
    fi
    STEP_ROWS="$STEP_ROWS| $name | $cap | $((SECONDS - start)) | $result |"$'\n'
    return $rc
}

# summary: the Markdown table for BENCHMARKS.md (steps, then the feed benchmark's table), into
# $SUMMARY and the report
summary() {
    {
        echo "### GPU check summary ($MODE$([ "$DRY_RUN" = 1 ] && echo ', DRY RUN: made-up numbers'))"
        echo
        echo "$(date -u +%Y-%m-%d), ${GPU_NAME:-GPU unknown}, fastloop $(git rev-parse --short HEAD 2>/dev/null || echo '?')" \
            "($caps_sum s of step caps, $SECONDS s taken)"
        echo
        echo "| step | cap s | took s | result |"
        echo "|---|---|---|---|"
        printf '%s' "$STEP_ROWS"
        for name in tests tests_nn memcheck leaks; do
            if [ -s "$LOGS/$name.log" ]; then
                line=$(grep -E "[0-9]+ (passed|failed|error)" "$LOGS/$name.log" | tail -1 | sed 's/^=* *//; s/ *=*$//')
                if [ -n "$line" ]; then echo; echo "$name: $line"; fi
            fi
        done
        if [ -s "$FEED_TABLE" ]; then
            echo
            cat "$FEED_TABLE"
        fi
    } >"$SUMMARY"
    echo | report
    report <"$SUMMARY"
}

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

# install_wheel: the cp312 wheel into a fresh venv over the system's packages; prints its python
install_wheel() {
    local wheel venv
    wheel=$(find dist -maxdepth 1 -name 'fastloop-*-cp312-cp312-*manylinux*.whl' 2>/dev/null | sort | tail -1)
    if [ -z "$wheel" ]; then
        echo "no cp312 manylinux wheel in dist/ (make wheel builds it; carry dist/ here)" >&2
        return 1
    fi
    venv=$(mktemp -d)/venv
    "$PY" -m venv --system-site-packages "$venv" >&2 &&
        "$venv/bin/python" -m pip install -q --no-deps --no-index --force-reinstall "$wheel" >&2 || return 1
    "$venv/bin/python" -c 'import sys; assert sys.version_info[:2] == (3, 12), sys.version' >&2 || return 1
    echo "installed $wheel into $venv" >&2
    echo "$venv/bin/python"
}

# build_is_current: the in-place CUDA build is newer than every source it is made of
build_is_current() {
    local built
    built=$(find python/fastloop -maxdepth 1 -name '_cuda*.so' 2>/dev/null | head -1)
    [ -n "$built" ] && [ -z "$(find cuda csrc setup.py setup_codecs.py -newer "$built" -type f 2>/dev/null | head -1)" ]
}

echo "## fastloop GPU check ($MODE$([ "$DRY_RUN" = 1 ] && echo ', dry run: GPU steps stubbed')), $(date -u +%Y-%m-%dT%H:%MZ)" | report
echo "step caps: $caps_text = $caps_sum s (at most $MAX_BUDGET)" | report
if [ "$caps_sum" -gt "$MAX_BUDGET" ]; then
    echo "the step caps add up to $caps_sum s, over the $MAX_BUDGET s a run may take: fix STEPS" | report
    exit 2
fi
GPU_NAME=""
if command -v nvidia-smi >/dev/null; then
    GPU_NAME=$(timeout 10 nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)
    echo "$GPU_NAME" | indent | report
fi

echo "### preflight" | report
if [ "$MODE" = wheel ]; then
    PY=$(command -v "$PY")  # found before the folders holding an nvcc leave PATH
    without_nvcc
    unset PYTHONPATH  # the wheel's fastloop, not the checkout's python/
    step preflight "$PY" benchmarks/gpu_preflight.py --wheel
else
    step preflight "$PY" benchmarks/gpu_preflight.py
fi
preflight_rc=$?
grep -E "^preflight" "$LOGS/preflight.log" | tail -1 | indent | report
if [ $preflight_rc -ne 0 ]; then
    if [ "$DRY_RUN" = 1 ]; then
        echo "    (dry run: a real run stops here; the dry run goes on)" | report
        status=0  # what this machine lacks is no failure of the dry run
    else
        summary
        exit 1
    fi
fi

if [ "$MODE" = wheel ]; then
    echo "### the cp312 wheel, no nvcc on PATH" | report
    # in this shell, not through step: it sets PY
    if [ "$DRY_RUN" = 1 ]; then
        step install install_wheel
    elif ! wheel_py=$(install_wheel 2>>"$LOGS/install.log"); then
        tail -20 "$LOGS/install.log" | indent | report
        STEP_ROWS="$STEP_ROWS| install | $(cap_of install) | - | failed |"$'\n'
        summary
        exit 1
    else
        PY=$wheel_py
        STEP_ROWS="$STEP_ROWS| install | $(cap_of install) | - | ok |"$'\n'
        tail -1 "$LOGS/install.log" | indent | report
        export FASTLOOP_EXPECT_CORE  # tests/conftest.py fails unless the tests import this _core
        FASTLOOP_EXPECT_CORE=$("$PY" -c 'from fastloop import _core; print(_core.__file__)')
    fi
    if command -v nvcc >/dev/null; then echo "    nvcc is still on PATH: $(command -v nvcc)" | report; status=1; fi
else
    echo "### build (sm_${FASTLOOP_CUDA_ARCHS:-90})" | report
    if [ "$MODE" = sanitize ] && [ "$DRY_RUN" = 0 ] && build_is_current; then
        echo "    skipped: the in-place build is newer than every source" | report
        STEP_ROWS="$STEP_ROWS| build | $(cap_of build) | 0 | skipped: current |"$'\n'
    elif ! step build env FASTLOOP_CUDA=1 FASTLOOP_TESTING=1 FASTLOOP_CUDA_ARCHS="${FASTLOOP_CUDA_ARCHS:-90}" \
        "$PY" setup.py -q build_ext --inplace; then
        tail -40 "$LOGS/build.log" | indent | report
        summary
        exit 1
    fi
fi

# -n 4 where pytest-xdist is installed (the tests share the GPU; none measures its memory)
XDIST=()
if [ "$DRY_RUN" = 1 ] || "$PY" -c 'import xdist' 2>/dev/null; then XDIST=(-n 4); fi
CUDA_TESTS=(tests/test_cuda.py tests/test_device_feed.py tests/test_gpu_decode.py)

if [ "$MODE" = sanitize ]; then
    # torch hidden: a package named torch that raises ImportError comes first on the path (its
    # tests skip; tests/test_gpu_leaks.py checks that the workload never imported torch)
    NO_TORCH=$(mktemp -d)
    TEMPS+=("$NO_TORCH")
    mkdir -p "$NO_TORCH/torch"
    # ModuleNotFoundError: pytest.importorskip skips on that one only
    echo 'raise ModuleNotFoundError("torch is hidden by gpu_check.sh --sanitize (too slow under compute-sanitizer)", name="torch")' \
        >"$NO_TORCH/torch/__init__.py"
    echo "### memcheck (compute-sanitizer over the CUDA tests, torch hidden)" | report
    if [ "$DRY_RUN" = 0 ] && ! command -v compute-sanitizer >/dev/null; then
        echo "    compute-sanitizer is not on PATH: memcheck not run" | report
        status=1
    else
        step memcheck env FASTLOOP_TEST_TIMEOUT=150 PYTHONPATH="$NO_TORCH:${PYTHONPATH:-python}" \
            compute-sanitizer --tool memcheck --leak-check full \
            "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" "${CUDA_TESTS[@]}"
        tail -3 "$LOGS/memcheck.log" | indent | report
        # leaks at exit include what the CUDA libraries keep; the leak check compares batch counts
        "$PY" tests/test_gpu_leaks.py --parse "$LOGS/memcheck.log" | indent | report || status=1
        grep -E "^=+ (Invalid|Misaligned|Out-of-range|Program hit|Malloc|Hardware)" "$LOGS/memcheck.log" |
            sort | uniq -c | sort -rn | head -20 | indent | report
        echo "### leak check (memcheck, few vs many batches, torch hidden)" | report
        step leaks env FASTLOOP_TEST_TIMEOUT=125 PYTHONPATH="$NO_TORCH:${PYTHONPATH:-python}" \
            "$PY" -m pytest -q -s -p no:cacheprovider tests/test_gpu_leaks.py -k leak
        grep -E "batches: |passed|failed|skipped|Error" "$LOGS/leaks.log" | tail -8 | indent | report
    fi
    summary
    echo "($SECONDS s in all; logs: $LOGS)" | report
    exit $status
fi

echo "### CUDA available, nvJPEG" | report
step cuda_info "$PY" -c "
import fastloop
print('fastloop.cuda:', fastloop.cuda.is_available().reason)
try:
    print('nvJPEG:', fastloop.cuda.load_nvjpeg())
except fastloop.CudaUnavailable as error:
    print('nvJPEG: not loaded:', error)
"
indent <"$LOGS/cuda_info.log" | report

echo "### tests" | report
step tests "$PY" -m pytest -q -p no:cacheprovider "${XDIST[@]}" "${CUDA_TESTS[@]}" tests/test_loader_torch.py \
    tests/test_gpu_stage.py
tail -30 "$LOGS/tests.log" | indent | report
step tests_nn "$PY" -m pytest -q -p no:cacheprovider tests/test_nn.py -k cuda
tail -1 "$LOGS/tests_nn.log" | indent | report  # its summary line

echo "### benchmark (bench_gpu.py --quick)" | report
step bench_gpu "$PY" benchmarks/bench_gpu.py --quick
indent <"$LOGS/bench_gpu.log" | report

echo "### GPU feed (bench_gpu_feed.py --quick)" | report
step gpu_feed "$PY" benchmarks/bench_gpu_feed.py --quick --out "$FEED_TABLE"
grep -E "^\(.* s in all\)$" "$LOGS/gpu_feed.log" | report
if grep -qE "Traceback|^no GPU feed" "$LOGS/gpu_feed.log"; then
    grep -E -B2 -A12 "Traceback|^no GPU feed" "$LOGS/gpu_feed.log" | tail -60 | indent | report
fi

summary
echo "($SECONDS s in all; logs: $LOGS)" | report
exit $status
