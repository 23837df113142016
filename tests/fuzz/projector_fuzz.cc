// libFuzzer target over the Projector service's requests: the bytes a caller can send
// to Submit, parsed as offloadd.v1.RefreshRequest, translated (rpc::FromProto) and submitted to
// a projector::RefreshService on the shm backend and LAPACK, exactly as the gRPC service does.
//
// Input format: frames of [1 byte: caller][2-byte little-endian length][that many bytes of a
// serialized RefreshRequest]; a frame that does not parse is skipped. The caller byte picks the
// caller uid (even: -1, odd: 4242) so owner scoping is exercised. A gradient or projector region
// whose shm_name is at most one byte long is pointed at one of two shared-memory objects the
// harness created (1 MiB of a decaying test matrix, 64 KiB of zeros).
//
// Invariants checked (abort() = a finding):
//  - Submit answers OK or a status with a message; a Submit that is OK finishes (Wait) in
//    kDone or kFailed, a failure with a non-OK status and a message;
//  - a finished refresh's shape facts agree with its request (rank <= min(rows, cols)) unless
//    the Submit was deduplicated (the first request of that key and uid stands);
//  - another caller's uid sees none of it (Get is NOT_FOUND);
//  - after each input nothing is queued or running.
// The service's memory bound (max_refresh_bytes) is 32 MiB here so every accepted refresh is
// quick; larger shapes must be refused at Submit, which is itself checked.
//
// Built by Bazel into //tests/fuzz:projector_fuzz_replay_test (replay_main.cc over
// tests/fuzz/projector_corpus); with clang -fsanitize=fuzzer it is a libFuzzer target.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "proto/projector.pb.h"
#include "server/copy/shm/shm_engine.h"
#include "server/projector/refresh_service.h"
#include "server/rpc/projector_service.h"

namespace {

namespace pj = offloadd::projector;

constexpr uint64_t kRegionBytes[2] = {1 << 20, 64 << 10};
constexpr uint64_t kMaxRefreshBytes = 32 << 20;

void Check(bool ok, const char* what) {
  if (ok) return;
  std::fprintf(stderr, "projector_fuzz invariant broken: %s\n", what);
  abort();
}

struct Harness {
  std::string shm_names[2];
  offloadd::copy::ShmCopyEngine engine;
  std::unique_ptr<pj::RefreshService> service;

  Harness() {
    for (int i = 0; i < 2; ++i) {
      shm_names[i] = "/ofd-pfuzz-" + std::to_string(getpid()) + "-" + std::to_string(i);
      int fd = shm_open(shm_names[i].c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(kRegionBytes[i])) != 0) abort();
      auto* p = static_cast<float*>(
          mmap(nullptr, kRegionBytes[i], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
      if (i == 0) {
        for (uint64_t j = 0; j < kRegionBytes[i] / 4; ++j) {
          p[j] = static_cast<float>((j * 2654435761u) % 1000) / (1.0f + static_cast<float>(j % 97));
        }
      }
      munmap(p, kRegionBytes[i]);
      close(fd);
    }
    pj::RefreshServiceOptions o;
    o.workers = 1;
    o.max_refresh_bytes = kMaxRefreshBytes;
    o.max_queued_refreshes = 64;
    o.max_queued_refreshes_per_uid = 32;
    service = std::make_unique<pj::RefreshService>(o, &engine, nullptr);
  }
  ~Harness() {
    service->Shutdown();
    for (const auto& n : shm_names) shm_unlink(n.c_str());
  }

  void Redirect(offloadd::copy::RegionSpec* spec) const {
    if (spec->shm_name.size() > 1 || !spec->cuda_ipc_handle.empty()) return;
    const int which = spec->shm_name.empty() ? 0 : spec->shm_name[0] & 1;
    spec->shm_name = shm_names[which];
  }

  void Run(const offloadd::v1::RefreshRequest& proto, int64_t caller) {
    absl::StatusOr<pj::ServiceRequest> request = offloadd::rpc::FromProto(proto);
    if (!request.ok()) {
      Check(!request.status().message().empty(), "a translation error without a message");
      return;
    }
    Redirect(&request->gradient.region);
    Redirect(&request->projector.region);
    request->caller_uid = caller;
    absl::StatusOr<pj::SubmitOutcome> submitted = service->Submit(*request);
    if (!submitted.ok()) {
      Check(!submitted.status().message().empty(), "a Submit error without a message");
      return;
    }
    absl::StatusOr<pj::RefreshRecord> record = service->Wait(submitted->id);
    Check(record.ok(), "an accepted refresh was lost");
    Check(record->state == pj::RefreshState::kDone || record->state == pj::RefreshState::kFailed,
          "Wait returned an unfinished refresh");
    if (record->state == pj::RefreshState::kFailed) {
      Check(!record->status.ok() && !record->status.message().empty(),
            "a failed refresh without a status message");
    }
    // A deduplicated Submit returns the first request's refresh: its shape may differ.
    if (!submitted->deduplicated && request->shape.size() == 2) {
      const int64_t rows = request->shape[0], cols = request->shape[1];
      Check(record->effective_rank <= std::min(rows, cols), "effective rank above min(m, n)");
      Check(record->projector_rows == rows || record->projector_rows == cols,
            "projector rows are neither dimension");
    }
    const int64_t other = caller == -1 ? 4242 : -1;
    Check(!service->Get(submitted->id, other).ok(), "another uid saw a refresh");
  }
};

// The harness's shm names, removed when the process exits (the harness itself is never
// destroyed: libFuzzer ends the process with exit()), so no object outlives the fuzzer.
std::string g_shm_names[2];
void UnlinkShmNames() {
  for (const auto& n : g_shm_names) {
    if (!n.empty()) shm_unlink(n.c_str());
  }
}

Harness& TheHarness() {
  static Harness* h = [] {
    auto* made = new Harness();
    for (int i = 0; i < 2; ++i) g_shm_names[i] = made->shm_names[i];
    std::atexit(UnlinkShmNames);
    return made;
  }();  // lives for the process: libFuzzer never returns
  return *h;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness& h = TheHarness();
  size_t pos = 0;
  while (pos + 3 <= size) {
    const int64_t caller = (data[pos] & 1) ? 4242 : -1;
    const size_t len = data[pos + 1] | (static_cast<size_t>(data[pos + 2]) << 8);
    pos += 3;
    if (len > size - pos) break;
    offloadd::v1::RefreshRequest proto;
    if (proto.ParseFromArray(data + pos, static_cast<int>(len))) h.Run(proto, caller);
    pos += len;
  }
  const pj::RefreshService::Stats stats = h.service->stats();
  Check(stats.queued == 0 && stats.running == 0, "work left queued or running after an input");
  return 0;
}
