# offloadd — every target installs the Debian packages it needs first (deploy/install-deps.sh,
# idempotent), then builds with Bazel. Binaries are copied to build/bin so scripts have stable
# paths whatever Bazel configuration ran last.
SHELL := /bin/bash
BAZEL ?= bazel
BIN := build/bin
TARGETS := //server:offloadd //client/cli:offloadctl //bench:checkpoint_workload

.PHONY: deps build run demo demo-torch test bench gpu-bundle fmt clean

deps:
	@bash deploy/install-deps.sh

build: deps
	$(BAZEL) build $(TARGETS)
	@mkdir -p $(BIN)
	@for t in server/offloadd client/cli/offloadctl bench/checkpoint_workload; do \
	  install -m 0755 bazel-out/k8-opt/bin/$$t $(BIN)/; done
	@bash client/python/gen_proto.sh >/dev/null 2>&1 || true

# The daemon alone, in the foreground, on its embedded default config (Ctrl-C stops it).
run: build
	$(BIN)/offloadd $(ARGS)

# Daemon + N simulated GPUs running an activation-checkpoint schedule; prints a report.
demo: build
	/usr/bin/python3 bench/demo.py --bin $(BIN) $(ARGS)

# The PyTorch example model trained through a daemon.
demo-torch: build
	bash client/python/examples/demo_torch.sh $(BIN)

# Every unit, integration and Python test; ends with one "N passed, N failed" line.
test: build
	bash tests/run_all.sh

bench: build
	bash bench/run_bench.sh

gpu-bundle: deps
	bash deploy/make_gpu_bundle.sh

clean:
	$(BAZEL) clean
	rm -rf build
