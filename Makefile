# Entry points for building and testing kiln. CMake does the real work; this file only
# sequences setup -> configure -> build -> run, so `make test` works on a fresh machine.

NPROC      := $(shell nproc 2>/dev/null || echo 2)
BUILD_DIR  ?= build
ASAN_DIR   ?= build-asan
TSAN_DIR   ?= build-tsan
BUILD_TYPE ?= Release
GENERATOR  ?= $(if $(shell command -v ninja 2>/dev/null),Ninja,Unix Makefiles)
CTEST_ARGS ?= --output-on-failure -j$(NPROC)
FORMAT_DIRS := $(wildcard core ops memory jit frontend tools tests bench examples)

.PHONY: all setup configure build demo test bench asan tsan format clean

all: build

# Fast when nothing is missing (a few dpkg-query calls), so it runs every time instead of
# trusting a stamp that could outlive an uninstalled package.
setup:
	@bash scripts/setup.sh

# Configure once; later builds let CMake re-run itself when CMakeLists.txt files change.
# `setup` is order-only so that its always-out-of-date phony status does not force a
# reconfigure on every run.
configure: $(BUILD_DIR)/CMakeCache.txt

$(BUILD_DIR)/CMakeCache.txt: | setup
	cmake -S . -B $(BUILD_DIR) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -G "$(GENERATOR)"

build: configure
	cmake --build $(BUILD_DIR) -j$(NPROC)

# The main demo: train an MLP on the handwritten digits (examples/digits_mlp). The tour of
# the tensor API is `./build/examples/quickstart`.
demo: setup build
	./$(BUILD_DIR)/examples/digits_mlp

test: setup build
	ctest --test-dir $(BUILD_DIR) $(CTEST_ARGS)

# Builds, runs every benchmark and writes bench/results/latest.json (docs/benchmarks.md).
bench: setup build
	@bash scripts/setup_torch.sh || echo "make bench: PyTorch unavailable, baselines will be skipped"
	@bash bench/run_all.sh $(BUILD_DIR)

# --- Sanitizers (docs/threads.md) ---------------------------------------------------------
# Each sanitizer has its own tree so that its objects never mix with the release build, and
# builds only the test binary (plus the kiln tool it runs). Neither is part of `make test`.
# Each run is time-boxed: `timeout` ends it (exit 124) when it takes longer than *_TIMEOUT
# seconds; the build before it is not, since a rebuild from ccache takes a few minutes and a
# killed build only loses work. Kernels go to a cache directory inside the tree, never
# ~/.cache. Override the case selection with ASAN_TESTS / TSAN_TESTS (Catch2 test specs).
CCACHE := $(shell command -v ccache 2>/dev/null)
SANITIZER_CMAKE_ARGS := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_BUILD_EXAMPLES=OFF \
  -DKILN_BUILD_BENCH=OFF -G "$(GENERATOR)" \
  $(if $(CCACHE),-DCMAKE_CXX_COMPILER_LAUNCHER=ccache -DCMAKE_C_COMPILER_LAUNCHER=ccache)

# AddressSanitizer + UBSan, leaks included, on a subset that covers every stage (graph,
# autograd, simplify, fusion, kernel cache, pools, random numbers, errors, every nn layer,
# optimizers, safetensors, data, threads). Left out: the op sweeps ([elementwise],
# [reduce], [shape]: every op over every dtype and shape, minutes each even in a release
# build) and the 1,000-graph differential runs, which would take hours under ASan on two
# cores. ASAN_TESTS= (empty) runs every case.
ASAN_TESTS ?= [graph],[autograd],[dtype],[simplify],[fusion],[cache],[pool],[rng],[errors],[nn],[optim],[safetensors],[data],[threads]
ASAN_TIMEOUT ?= 1200
asan: | setup
	@if [ ! -f $(ASAN_DIR)/CMakeCache.txt ]; then \
	  cmake -S . -B $(ASAN_DIR) -DKILN_SANITIZE=ON $(SANITIZER_CMAKE_ARGS); \
	fi
	cmake --build $(ASAN_DIR) -j$(NPROC) --target kiln_tests
	mkdir -p $(ASAN_DIR)/kernel-cache
	KILN_CACHE_DIR=$(CURDIR)/$(ASAN_DIR)/kernel-cache \
	  ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  timeout $(ASAN_TIMEOUT) $(ASAN_DIR)/tests/kiln_tests '$(ASAN_TESTS)' --durations yes

# ThreadSanitizer on the cases that test docs/threads.md's promise plus the other
# multithreaded ones (compilers, kernel cache), once with each CPU compiler: the default
# in-process LLVM and the external one. Left out: the [threads] case of test_graph.cpp that
# forks a child (to contain crashes) and starts threads there; TSan does not support
# threads after a multithreaded fork (it dies, or with die_after_fork=0 confuses thread ids).
TSAN_TESTS ?= [threads]~"graph: evaluating in one thread while others*",[compiler],[cache]
TSAN_TIMEOUT ?= 600
TSAN_RUN = KILN_CACHE_DIR=$(CURDIR)/$(TSAN_DIR)/kernel-cache \
  TSAN_OPTIONS="halt_on_error=1 second_deadlock_stack=1" \
  timeout $(TSAN_TIMEOUT) $(TSAN_DIR)/tests/kiln_tests '$(TSAN_TESTS)' --durations yes
tsan: | setup
	@if [ ! -f $(TSAN_DIR)/CMakeCache.txt ]; then \
	  cmake -S . -B $(TSAN_DIR) -DKILN_SANITIZE_THREAD=ON $(SANITIZER_CMAKE_ARGS); \
	fi
	cmake --build $(TSAN_DIR) -j$(NPROC) --target kiln_tests
	mkdir -p $(TSAN_DIR)/kernel-cache
	$(TSAN_RUN)
	KILN_CPU_COMPILER=external $(TSAN_RUN)

format:
	@files=$$(find $(FORMAT_DIRS) -type f \( -name '*.h' -o -name '*.cpp' \) 2>/dev/null); \
	if [ -n "$$files" ]; then echo "$$files" | xargs clang-format -i; fi

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR) $(TSAN_DIR)
