# trident's front door. `make run` trains the default deck; `make test` runs the tests.
BUILD      ?= build
BUILD_TYPE ?= Release
JOBS       ?= $(shell nproc)
NP         ?= 1
DECK       ?= input/default.toml
PYTHON     ?= /usr/bin/python3
CMAKE_ARGS ?=
TRIDENT    := $(BUILD)/trident

# Open MPI refuses to run as root unless told; CI and containers run as root.
ifeq ($(shell id -u),0)
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
endif

.PHONY: all build deps check-deps test test-asan test-timing test-cuda-emu run data bench clean

all: build

deps:
	@tools/deps.sh install

check-deps:
	@tools/deps.sh check

$(BUILD)/CMakeCache.txt: | check-deps
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) $(CMAKE_ARGS)

build: check-deps $(BUILD)/CMakeCache.txt
	cmake --build $(BUILD) -j $(JOBS)

# Tests that measure this machine's speed (label `timing`: mpi.plan_validate) are left out of
# `make test`, whose 2 CI cores are shared by the other tests; `make test-timing` runs them.
test: build
	cd $(BUILD) && ctest -LE timing --output-on-failure -j $(JOBS)

test-timing: build
	cd $(BUILD) && ctest -L timing --output-on-failure

# `make test-asan`: the unit and MPI tests (ctest -L 'unit|mpi') built with AddressSanitizer
# and UBSan in build-asan/ (-DTRIDENT_SANITIZE=ON, CPU only). Leak checking is off: Open MPI,
# PMIx and their dlopen'ed plugins keep allocations until exit that LeakSanitizer reports as
# leaks, with one-frame stacks (no frame pointers there) that no suppression file can match.
# (The build runs the test binaries too, to list their tests: the same options apply.)
ASAN_BUILD ?= build-asan
ASAN_ENV   := ASAN_OPTIONS=detect_leaks=0:detect_stack_use_after_return=1 \
              UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
test-asan: check-deps
	cmake -S . -B $(ASAN_BUILD) -DCMAKE_BUILD_TYPE=RelWithDebInfo -DTRIDENT_SANITIZE=ON \
	      -DTRIDENT_CUDA=OFF $(CMAKE_ARGS)
	$(ASAN_ENV) cmake --build $(ASAN_BUILD) -j $(JOBS)
	cd $(ASAN_BUILD) && $(ASAN_ENV) ctest -L 'unit|mpi' -LE timing --output-on-failure -j $(JOBS)

# `make test-cuda-emu`: the CUDA backend without a GPU. Its kernels (emulate/run.sh) and then
# the whole program with runtime.device = "cuda" (emulate/train.sh: mpi.device_layouts and
# oracle.grad against "cpu" and PyTorch) on a CPU stand-in for the CUDA runtime and cuBLAS,
# linked with a CPU-only build in build-cpu/ (~8 min on 2 cores; CI runs it).
EMU_BUILD ?= build-cpu
test-cuda-emu: check-deps
	cmake -S . -B $(EMU_BUILD) -DCMAKE_BUILD_TYPE=Release -DTRIDENT_CUDA=OFF -DTRIDENT_TESTS=OFF \
	      $(CMAKE_ARGS)
	cmake --build $(EMU_BUILD) -j $(JOBS)
	test/unit/ops/cuda/emulate/run.sh $(EMU_BUILD)
	TRIDENT_PYTHON=$(PYTHON) test/unit/ops/cuda/emulate/train.sh $(EMU_BUILD)

# The default corpus (King James Bible) and its token datasets; see input/data.mk.
include input/data.mk

run: build data
	mpirun -np $(NP) --oversubscribe --bind-to none $(TRIDENT) train $(DECK)
	@$(PYTHON) tools/plot_metrics.py output/default/metrics.h5 --out output/default/metrics.png || true
	@echo
	@echo "Outputs in output/default/: metrics.h5 (per-step metrics), checkpoints/ (HDF5), config.toml"
	@echo "Sample from the trained model (build/trident sample --checkpoint CK --prompt TEXT):"
	@$(TRIDENT) sample --checkpoint "$$(ls output/default/checkpoints/step-*.h5 | tail -1)" --prompt "And God said" --tokens 60 --temperature 0.8 --top-k 40

bench: build
	bench/run.sh $(BUILD)

clean:
	rm -rf $(BUILD)
