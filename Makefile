# llmhpc - a thin wrapper over CMake.
#   make run    install what is missing, build, run the default 2-rank benchmark (1 rank on one GPU)
#   make test   install what is missing, build, run every test (ctest)
BUILD      ?= build
BUILD_TYPE ?= Release
CUDA_ARCH  ?= 90
JOBS       ?= $(shell nproc)
PYTHON     ?= python3
MPIRUN     ?= mpirun
# Open MPI refuses to run as root unless told; CI containers run as root.
export OMPI_ALLOW_RUN_AS_ROOT := 1
export OMPI_ALLOW_RUN_AS_ROOT_CONFIRM := 1
# Never let NCCL use NVLink multicast (NVLS) on shared multi-GPU hosts.
export NCCL_NVLS_ENABLE := 0

# The default job: a small model on a GPU, the tiny one on CPUs (minutes, not hours); 2 ranks,
# or 1 on a host with one GPU (llmhpc starts at most one rank per GPU).
RUN_GPUS   := $(shell nvidia-smi -L 2>/dev/null | grep -c '^GPU')
RUN_MODEL  ?= $(if $(filter 0,$(RUN_GPUS)),tiny,small)
RUN_RANKS  ?= $(if $(filter 1,$(RUN_GPUS)),1,2)
RUN_ARGS   ?= --mode bench --model $(RUN_MODEL) --phase train-step

.PHONY: all deps build run test clean

all: build

deps:
	@./scripts/install-deps.sh

$(BUILD)/Makefile:
	cmake -S . -B $(BUILD) -DCMAKE_BUILD_TYPE=$(BUILD_TYPE) -DCMAKE_CUDA_ARCHITECTURES=$(CUDA_ARCH)

build: $(BUILD)/Makefile
	cmake --build $(BUILD) -j $(JOBS)

run: deps build
	$(MPIRUN) -np $(RUN_RANKS) --oversubscribe --bind-to none $(BUILD)/llmhpc $(RUN_ARGS)
	$(PYTHON) analysis/report.py $$(ls -td results/bench-* | head -1)

test: deps build
	cd $(BUILD) && ctest --output-on-failure -j $(JOBS)

clean:
	rm -rf $(BUILD)
