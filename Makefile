# offloadd — every target installs the Debian packages it needs first (deploy/install-deps.sh,
# idempotent) and the pinned Python environment .venv/ (deploy/python-env.sh, idempotent, from
# client/python/requirements.lock: torch, Transformers, grpcio, pytest), then builds with Bazel. Binaries are copied to build/bin so scripts have stable
# paths whatever Bazel configuration ran last.
SHELL := /bin/bash
BAZEL ?= bazel
BIN := build/bin
TARGETS := //server:offloadd //client/cli:offloadctl //bench:checkpoint_workload \
  //client/core:liboffloadd_core.so //client/core:ring_fast.so //client/core:store_front.so

.PHONY: deps venv wheel build run demo demo-torch test bench gpu-bundle image fmt clean fuzz soak test-asan test-tsan tsa

deps:
	@bash deploy/install-deps.sh

PY := .venv/bin/python
venv: deps
	@bash deploy/python-env.sh

# The Python package as a wheel in build/wheel, its path printed last: stubs, the native core
# liboffloadd_core.so and the extension modules _ring_fast.abi3.so and _store_front.abi3.so inside,
# cp310-abi3-manylinux_2_N (deploy/wheel.sh; depends on grpcio and protobuf). pip install it where the training runs: docs/install-wheel.md.
wheel: venv
	@bash deploy/wheel.sh

build: venv
	$(BAZEL) build $(TARGETS)
	@mkdir -p $(BIN)
	@for t in server/offloadd client/cli/offloadctl bench/checkpoint_workload \
	  client/core/liboffloadd_core.so client/core/ring_fast.so client/core/store_front.so; do \
	  install -m 0755 bazel-out/k8-opt/bin/$$t $(BIN)/; done
	@bash client/python/gen_proto.sh >/dev/null

# The daemon alone, in the foreground, on its embedded default config (Ctrl-C stops it).
run: build
	$(BIN)/offloadd $(ARGS)

# Daemon + N simulated GPUs running an activation-checkpoint schedule; prints a report.
demo: build
	/usr/bin/python3 bench/demo.py --bin $(BIN) $(ARGS)

# The PyTorch example model trained through a daemon.
demo-torch: build
	PYTHON=$(PY) bash client/python/examples/demo_torch.sh $(BIN)

# Every unit, integration and Python test, and the thread-safety build below; ends with one
# "N passed, N failed" line.
test: build
	bash tests/run_all.sh

# Clang thread-safety analysis (-Wthread-safety -Werror, .bazelrc --config=tsa) over the
# sources of server/, client/ and common/: compile only, its own output tree.
tsa: deps
	BAZEL=$(BAZEL) bash tests/tsa_build.sh

bench: build
	bash bench/run_bench.sh

# Chaos soak (docs/bounds-and-failure-tests.md): 8 clients with checksums, a SIGKILL every ~3 s,
# the daemon SIGKILLed 3 times and SIGTERMed once on a shared pool (0 lost); SOAK_SECONDS (120)
# and SOAK_ARGS pass through. A 24 s run is in `make test`.
SOAK_SECONDS ?= 120
soak: build
	$(BAZEL) build //tests/soak:soak_client
	@install -m 0755 bazel-out/k8-opt/bin/tests/soak/soak_client $(BIN)/
	/usr/bin/python3 tests/soak/soak.py --bin $(BIN) --seconds $(SOAK_SECONDS) $(SOAK_ARGS)

# libFuzzer over the session request handling, built with Debian's clang outside Bazel
# (ASan + UBSan); runs FUZZ_SECONDS (60) from the seed corpus. New inputs go to
# build/fuzz/corpus, crashes to build/fuzz/crash-*: copy those to tests/fuzz/regressions.
# Each source compiles to its own object under build/fuzz/obj (with a .d file of the headers it
# includes, so a header change rebuilds what includes it): `make -j$(nproc) fuzz` compiles them
# in parallel (make test does).
FUZZ_SECONDS ?= 60
# Every non-test source of the layers the session path runs through (a new .cc there is picked
# up without editing this list), plus the shm engine, metrics and the proto translation.
FUZZ_SRCS := tests/fuzz/session_fuzz.cc \
  $(filter-out %_test.cc,$(wildcard server/session/*.cc server/store/*.cc server/spill/*.cc \
    server/pool/*.cc server/sched/*.cc)) \
  $(filter-out %_test.cc,$(wildcard server/base/*.cc common/base/*.cc)) \
  server/copy/shm/shm_engine.cc server/copy/cuda/cuda_api.cc server/copy/cuda/sim_gpu_table.cc \
  common/sim_gpu_table.cc \
  server/projector/blas_core.cc server/metrics/metrics.cc \
  server/rpc/translate.cc
FUZZ_GEN := build/fuzz/gen/proto/offload.pb
FUZZ_OBJ := build/fuzz/obj
FUZZ_CXXFLAGS := -std=c++17 -O1 -g -fsanitize=fuzzer,address,undefined \
  -fno-sanitize-recover=undefined -I. -Ibuild/fuzz/gen
fuzz_objs = $(patsubst %.cc,$(FUZZ_OBJ)/%.o,$(1))
$(FUZZ_GEN).cc $(FUZZ_GEN).h &: proto/offload.proto
	@mkdir -p build/fuzz/gen
	protoc -I. --cpp_out=build/fuzz/gen proto/offload.proto
# The generated header before any object: a first build has no .d file saying who includes it.
$(FUZZ_OBJ)/%.o: %.cc | $(FUZZ_GEN).h
	@mkdir -p $(@D)
	clang++ $(FUZZ_CXXFLAGS) -MMD -MP -c $< -o $@
build/fuzz/session_fuzz: $(call fuzz_objs,$(FUZZ_SRCS) $(FUZZ_GEN).cc)
	@mkdir -p build/fuzz/corpus
	clang++ $(FUZZ_CXXFLAGS) $^ -o $@ \
	  $$(pkg-config --libs grpc++ protobuf prometheus-cpp-pull prometheus-cpp-core) -lglog -lcrypto -luring -lnuma -lrt -lpthread
# The request ring's descriptor parsing (tests/fuzz/ring_fuzz.cc): what the daemon reads from
# memory a client can write.
RING_FUZZ_SRCS := tests/fuzz/ring_fuzz.cc common/futex.cc common/ring_format.cc common/ring_memfd.cc \
  server/rpc/ring_translate.cc
build/fuzz/ring_fuzz: $(call fuzz_objs,$(filter-out %_test.cc,$(RING_FUZZ_SRCS)))
	@mkdir -p build/fuzz/ring_corpus
	clang++ $(FUZZ_CXXFLAGS) $^ -o $@ $$(pkg-config --libs grpc++) -lpthread
-include $(patsubst %.o,%.d,$(call fuzz_objs,$(FUZZ_SRCS) $(FUZZ_GEN).cc $(RING_FUZZ_SRCS)))
# deps first (it installs clang and protoc on a fresh machine), then the two fuzzers, each run
# once its binary is linked: one after the other, or side by side under -j (one core each).
.PHONY: fuzz-session fuzz-ring
fuzz: deps
	@$(MAKE) --no-print-directory fuzz-session fuzz-ring
fuzz-session: build/fuzz/session_fuzz
	cd build/fuzz && ./session_fuzz -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	  -artifact_prefix=./ corpus ../../tests/fuzz/corpus
fuzz-ring: build/fuzz/ring_fuzz
	cd build/fuzz && ./ring_fuzz -max_total_time=$(FUZZ_SECONDS) -print_final_stats=1 \
	  -artifact_prefix=./ring- ring_corpus ../../tests/fuzz/ring_corpus

# The daemon and its tests under sanitizers (.bazelrc configs; each keeps its own output tree).
# TSan runs the layers below rpc only: Debian's gRPC, protobuf, absl and OpenBLAS are not built
# with TSan, so every test that runs gRPC reports races inside them
# (docs/bounds-and-failure-tests.md).
ASAN_TESTS := //server/... //client:all //common/... //tests/e2e:e2e_test //tests/e2e:multiprocess_test \
  //tests/faults/... //tests/fuzz/... //tests/soak:soak_quick_test
TSAN_TESTS := //common/base/... //server/base/... //server/session/... //server/store/... //server/sched/... //server/pool/... //server/spill/... \
  //server/copy/shm:shm_engine_test //server/copy/cuda:cuda_engine_test \
  //server/copy/cuda:cuda_api_sim_test //server/copy/timing:copy_timing_model_test //tests/fuzz/...
test-asan: deps
	$(BAZEL) test --config=asan $(ASAN_TESTS)
test-tsan: deps
	$(BAZEL) test --config=tsan $(TSAN_TESTS)

# Binaries, the systemd unit, the documentation its Documentation= names and the Grafana
# dashboard and Prometheus files those pages name (share/doc/offloadd/monitoring/), under PREFIX
# (DESTDIR= for staging): deploy/install.sh. It installs what `make build` left in build/bin and
# builds nothing, so `sudo make install` runs no apt, pip or Bazel as root and writes nothing
# into the source tree: `make build` as yourself first.
PREFIX ?= /usr/local
.PHONY: install
install:
	bash deploy/install.sh --bin $(BIN) $(PREFIX) $(DESTDIR)

# The DaemonSet's container image (deploy/container/): binaries built here with Bazel (the cuda
# backend needs the CUDA toolkit), then buildah, podman or docker. IMAGE defaults to
# offloadd:<offloadd --version>.
IMAGE ?=
image: deps
	bash deploy/container/build-image.sh $(IMAGE)

gpu-bundle: deps
	bash deploy/make_gpu_bundle.sh

clean:
	$(BAZEL) clean
	rm -rf build
