# fastloop - build, test, demo.
#   make demo    venv + build + the main job (python -m fastloop demo: train on generated images, log, checkpoint)
#   make test    venv + build + C tests under ASan/UBSan and TSan + fuzz corpus replay + pytest
#   make bench   the full benchmark suite (not part of the tests)
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
CC ?= gcc

# The core: one folder per subsystem (csrc/README.md); csrc/py/ is the binding, built by setup.py.
CORE_SOURCES := $(filter-out csrc/py/%,$(wildcard csrc/*/*.c))
CORE_HEADERS := $(filter-out csrc/py/%,$(wildcard csrc/*/*.h csrc/*/*.inc))
C_TESTS := test_queue test_pool test_ops test_monitor test_checkpoint test_npy test_loader test_procpool test_nn test_image
# The core builds without Python's include path: a Python.h creeping in fails here.
CORE_FLAGS := -std=gnu11 -g -Wall -Wextra -Werror -pthread -Icsrc
ASAN_FLAGS := -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all
TSAN_FLAGS := -O1 -fsanitize=thread
BIN := tests/c/bin
# test_nn's matrix products use the BLAS fastloop.nn picks (it is skipped, saying so, without one).
BLAS_ENV = FASTLOOP_BLAS="$$($(PY) -c 'from fastloop import _blas; print(_blas.path())' 2>/dev/null)"
# test_image and the image fuzz replay decode with the codecs fastloop.images finds (Pillow's).
IMAGE_ENV = FASTLOOP_LIBJPEG="$$($(PY) -c 'from fastloop import images; print(images.info()["jpeg"]["path"])' 2>/dev/null)" \
	FASTLOOP_LIBPNG="$$($(PY) -c 'from fastloop import images; print(images.info()["png"]["path"])' 2>/dev/null)"

.PHONY: all venv build test ctest ctest-asan ctest-tsan fuzz-replay core-warnings pytest demo bench install-check clean

all: build

venv: $(VENV)/.installed
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "setuptools>=70" wheel "numpy>=2.0" "pytest>=7" matplotlib tensorboard nbclient nbformat ipykernel redis "uvicorn[standard]" websockets starlette prometheus_client fastapi flask httpx pillow
	touch $@

build: venv
	FASTLOOP_WERROR=1 $(PY) -m pip install -q --no-build-isolation --no-deps -e .

core-warnings:
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) -O3 -fPIC -c $(CORE_SOURCES) && rm -f *.o

$(BIN)/%_asan: tests/c/%.c tests/c/check.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -o $@ $< $(CORE_SOURCES) -lm -ldl

$(BIN)/%_tsan: tests/c/%.c tests/c/check.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(TSAN_FLAGS) -o $@ $< $(CORE_SOURCES) -lm -ldl

ctest-asan: $(addprefix $(BIN)/,$(addsuffix _asan,$(C_TESTS)))
	@for t in $^; do echo "== $$t"; $(BLAS_ENV) $(IMAGE_ENV) ASAN_OPTIONS=detect_leaks=1 $$t || exit 1; done

ctest-tsan: $(addprefix $(BIN)/,$(addsuffix _tsan,$(C_TESTS)))
	@for t in $^; do echo "== $$t"; $(BLAS_ENV) $(IMAGE_ENV) TSAN_OPTIONS=halt_on_error=1 $$t || exit 1; done

# The .npy parser's and the image decoders' fuzz corpora (tests/fuzz/README.md), replayed
# under ASan/UBSan with gcc.
$(BIN)/replay_npy: tests/fuzz/replay_npy.c tests/fuzz/fuzz_npy.c tests/fuzz/replay.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -o $@ $< csrc/data/fl_npy.c csrc/base/fl_error.c

$(BIN)/replay_image: tests/fuzz/replay_image.c tests/fuzz/fuzz_image.c tests/fuzz/replay.h $(CORE_SOURCES) $(CORE_HEADERS)
	@mkdir -p $(BIN)
	$(CC) $(CORE_FLAGS) $(ASAN_FLAGS) -o $@ $< csrc/data/fl_image*.c csrc/data/fl_pipeline_image.c \
	    csrc/ops/ops_resize.c csrc/base/fl_error.c -lm -ldl

fuzz-replay: $(BIN)/replay_npy $(BIN)/replay_image
	ASAN_OPTIONS=detect_leaks=1 $(BIN)/replay_npy tests/fuzz/corpus/npy
	$(IMAGE_ENV) ASAN_OPTIONS=detect_leaks=1 $(BIN)/replay_image tests/fuzz/corpus/image

ctest: core-warnings ctest-asan ctest-tsan fuzz-replay

pytest: build
	$(PY) -m pytest -q

test: build ctest pytest

demo: build
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
	venv/bin/python -c "import fastloop.demo, fastloop.serve, fastloop.bench.answer, fastloop.nn"

clean:
	rm -rf build $(BIN) python/fastloop/*.so python/fastloop/_build_info.py *.egg-info python/*.egg-info
