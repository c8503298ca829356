# The two commands: `make demo` and `make check`. Both install what is
# missing (tools/setup-deps.sh), configure and build with CMake, and are
# quick when nothing changed.
BUILD      ?= build
BUILD_ASAN ?= build-asan
LLVM_BIN   ?= /usr/lib/llvm-22/bin
JOBS       ?= $(shell nproc)

PYTHON     ?= python3

.PHONY: all deps build demo check check-unit check-lit check-asan check-python python-install gpu-pack gpu-check clean

all: build

deps:
	@tools/setup-deps.sh

$(BUILD)/build.ninja:
	cmake -S . -B $(BUILD) -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo

build: deps $(BUILD)/build.ninja
	@cmake --build $(BUILD) -j $(JOBS)

# The C library on the bundled MLP block (compile time, run time, max error
# against the reference interpreter), then a short kiln-bench: kiln vs eager
# vs Inductor through torch.compile.
demo: python-install
	$(BUILD)/tools/kiln-run --iters=50 examples/mlp.kiln
	kiln-bench --demo --results bench-results

check: check-unit check-lit check-python check-asan

check-unit: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS)

check-lit: build
	$(LLVM_BIN)/lit -sv test/lit --param build_dir=$(abspath $(BUILD))

# The Python package (python/): libkiln built by scikit-build-core into
# build/python (incremental) and installed with the torch_dynamo_backends
# entry point, so backend="kiln" works with no import.
python-install: build
	@$(PYTHON) -m pip install -q --no-build-isolation ./python

check-python: python-install
	$(PYTHON) -m pytest -q test/python

$(BUILD_ASAN)/build.ninja:
	cmake -S . -B $(BUILD_ASAN) -G Ninja -DCMAKE_BUILD_TYPE=Debug -DKILN_ASAN=ON

# The unit tests again under AddressSanitizer + UBSan. Kernels run
# single-threaded here: LeakSanitizer's exit-time scan crashes on libomp's
# worker threads (the threaded path is tested by the normal build).
check-asan: deps $(BUILD_ASAN)/build.ninja
	@cmake --build $(BUILD_ASAN) -j $(JOBS)
	KILN_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:allocator_may_return_null=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
	  ctest --test-dir $(BUILD_ASAN) --output-on-failure -L unit -j $(JOBS)

# The GPU machine has no LLVM/MLIR and no package index: `make gpu-pack`
# (here) builds and packs libkiln, the test binaries, the wheel and Debian's
# LLVM/MLIR runtime into .device/; `make gpu-check` (there, with .device
# carried) runs the CUDA-target tests on the GPU and the suites beside them.
gpu-pack: build
	tools/device/pack.sh

gpu-check:
	bash tools/device/run-gpu-check.sh

clean:
	rm -rf $(BUILD) $(BUILD_ASAN)
