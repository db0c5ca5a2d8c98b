# A thin wrapper over CMake; every target installs missing packages first.
#   make train      build Release and train configs/default.yaml
#   make train-gpt  tokenize Debian's licence texts (data/licenses/) and train
#                   configs/tiny-gpt.yaml on them (docs/language-models.md)
#   make tokens     only tokenize them (what configs/tiny-gpt.yaml and
#                   configs/llama-tiny.yaml read)
#   make test       build and run the whole test suite (ctest, TEST_JOBS at
#                   a time, default 2: 1.5x faster on 2 cores than one at a
#                   time; the tests that time or size their own threads run
#                   alone, tests/CMakeLists.txt RUN_SERIAL)
#   make build      just build (build/)
#   make install    build, then install the tools, their man pages, gpipe.h,
#                   libgpipe.a, gpipe.pc and the CMake package under PREFIX
#                   (default /usr/local; PREFIX=$HOME/.local for one user)
#   make bench      build and run the benchmarks (bench/README.md)
# Paths from this file's folder (relative as make was given it: "." from
# the checkout, so a checkout whose path has blanks builds there), so that
# `make -f DIR/Makefile` works from elsewhere too.  CONFIG and BUILD given on
# the command line are taken as given, relative to where make runs.
ROOT := $(patsubst %/,%,$(dir $(lastword $(MAKEFILE_LIST))))
BUILD ?= $(ROOT)/build
JOBS ?= $(shell nproc)
TEST_JOBS ?= 2
CMAKE_FLAGS ?=
CONFIG ?= $(ROOT)/configs/default.yaml
PREFIX ?= /usr/local

.PHONY: all deps build train train-gpt tokens test bench install clean
all: build

deps:
	@"$(ROOT)/scripts/install-deps.sh"

build: deps
	@cmake -S "$(ROOT)" -B "$(BUILD)" -DCMAKE_BUILD_TYPE=Release $(CMAKE_FLAGS) >/dev/null
	@cmake --build "$(BUILD)" -j $(JOBS)

train: build
	"$(BUILD)/gpipe-train" $(CONFIG)

# The byte-level token files configs/tiny-gpt.yaml reads (data.path
# data/licenses, relative to where gpipe-train runs: the checkout's root).
LICENSES := $(ROOT)/data/licenses/licenses_train.bin
$(LICENSES):
	/usr/bin/python3 "$(ROOT)/scripts/tokenize_text.py" encode -o "$(ROOT)/data/licenses" \
	    --name licenses /usr/share/common-licenses/*

tokens: $(LICENSES)

# Snapshots go to runs/tiny-gpt/ (the config's train.snapshot), the final
# weights to runs/tiny-gpt.safetensors; a second `make train-gpt` goes on
# from the newest snapshot (a finished run: it only writes the weights).
train-gpt: build $(LICENSES)
	cd "$(ROOT)" && mkdir -p runs && \
	if ls runs/tiny-gpt/snapshot-*.safetensors >/dev/null 2>&1; then \
	  echo "runs/tiny-gpt/ holds an earlier run's snapshots: going on from the newest (rm -r runs/tiny-gpt to start afresh)"; \
	  "$(abspath $(BUILD))/gpipe-train" configs/tiny-gpt.yaml --resume latest \
	    --export-weights runs/tiny-gpt.safetensors; \
	else \
	  "$(abspath $(BUILD))/gpipe-train" configs/tiny-gpt.yaml \
	    --export-weights runs/tiny-gpt.safetensors; \
	fi

test: build
	cd "$(BUILD)" && ctest --output-on-failure -j $(TEST_JOBS)

bench: build
	"$(BUILD)/bench_step"

install: build
	cmake --install "$(BUILD)" --prefix "$(PREFIX)"

clean:
	rm -rf "$(BUILD)"
