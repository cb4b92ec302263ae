# Entry points for building and testing kiln. CMake does the real work; this file only
# sequences setup -> configure -> build -> run, so `make test` works on a fresh machine.

NPROC      := $(shell nproc 2>/dev/null || echo 2)
BUILD_DIR  ?= build
ASAN_DIR   ?= build-asan
BUILD_TYPE ?= Release
GENERATOR  ?= $(if $(shell command -v ninja 2>/dev/null),Ninja,Unix Makefiles)
CTEST_ARGS ?= --output-on-failure -j$(NPROC)
FORMAT_DIRS := $(wildcard core ops memory jit frontend tools tests bench examples)

.PHONY: all setup configure build demo test bench asan format clean

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

# Separate tree so that sanitizer objects never mix with the release build.
asan: | setup
	@if [ ! -f $(ASAN_DIR)/CMakeCache.txt ]; then \
	  cmake -S . -B $(ASAN_DIR) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DKILN_SANITIZE=ON \
	    -G "$(GENERATOR)"; \
	fi
	cmake --build $(ASAN_DIR) -j$(NPROC)
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
	  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
	  ctest --test-dir $(ASAN_DIR) $(CTEST_ARGS)

format:
	@files=$$(find $(FORMAT_DIRS) -type f \( -name '*.h' -o -name '*.cpp' \) 2>/dev/null); \
	if [ -n "$$files" ]; then echo "$$files" | xargs clang-format -i; fi

clean:
	rm -rf $(BUILD_DIR) $(ASAN_DIR)
