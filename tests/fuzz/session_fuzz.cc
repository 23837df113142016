// libFuzzer target over the daemon's request handling: the bytes a client can put on its
// session stream, parsed as offloadd.v1.ClientMessage protobufs (rpc/translate.h), handed to a
// session::Session on the shm backend exactly as the gRPC reactor does.
//
// Input format: frames of [2-byte little-endian length][that many bytes of a serialized
// ClientMessage]; a frame that does not parse is skipped. After each frame the harness waits
// for every request to be answered (a session never keeps a request without an answer, so a
// wait over 10 s is reported as a hang). A register_region whose shm_name is at most one byte
// long is pointed at one of two shared-memory objects the harness created (1 MiB and 64 KiB),
// so offloads and reloads reach the copy path; other names go to the engine unchanged.
//
// Invariants checked (abort() = a finding):
//  - each handled request got exactly one completion once the session is idle;
//  - at most one successful Hello per session;
//  - after Close() the pool returns to zero blocks and zero bytes (no leaked extents).
//
// Built two ways: by `make fuzz` with clang -fsanitize=fuzzer,address,undefined (libFuzzer's
// main), and by Bazel into //tests/fuzz:session_fuzz_replay_test, whose main (replay_main.cc)
// runs every file of the seed corpus and of the regressions folder through this function.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <thread>

#include "common/base/clock.h"
#include "proto/offload.pb.h"
#include "server/copy/shm/shm_engine.h"
#include "server/pool/arena.h"
#include "server/rpc/translate.h"
#include "server/session/core.h"
#include "server/session/session.h"

namespace {

using offloadd::session::Completion;
using offloadd::session::CompletionKind;

constexpr uint64_t kRegionBytes[2] = {1 << 20, 64 << 10};

struct Harness {
  std::string shm_names[2];
  std::unique_ptr<offloadd::session::Core> core;

  Harness() {
    for (int i = 0; i < 2; ++i) {
      shm_names[i] = "/ofd-fuzz-" + std::to_string(getpid()) + "-" + std::to_string(i);
      int fd = shm_open(shm_names[i].c_str(), O_RDWR | O_CREAT | O_TRUNC, 0600);
      if (fd < 0 || ftruncate(fd, static_cast<off_t>(kRegionBytes[i])) != 0) abort();
      void* p = mmap(nullptr, kRegionBytes[i], PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
      for (uint64_t j = 0; j < kRegionBytes[i]; ++j) static_cast<uint8_t*>(p)[j] = j * 131 + i;
      munmap(p, kRegionBytes[i]);
      close(fd);
    }
    offloadd::session::CoreOptions o;
    o.chunk_bytes = 64 << 10;
    o.copy_threads = 1;
    o.store.admission_deadline_seconds = 0.01;
    o.store.admission_queue_limit = 8;
    o.store.session_quota_bytes = 2 << 20;
    o.max_requests_in_flight = 32;
    o.max_sessions = 4;
    o.watch_pids = false;
    offloadd::pool::ArenaOptions a;
    a.size_bytes = 4 << 20;
    core = std::make_unique<offloadd::session::Core>(
        o, *offloadd::pool::Arena::Create(a), std::make_unique<offloadd::copy::ShmCopyEngine>());
  }
  ~Harness() {
    for (const auto& n : shm_names) shm_unlink(n.c_str());
  }
};

Harness& Get() {
  static Harness* h = [] {
    auto* h = new Harness();
    std::atexit([] {
      for (const auto& n : Get().shm_names) shm_unlink(n.c_str());
    });
    return h;
  }();
  return *h;
}

bool WaitFor(const std::function<bool()>& pred, double seconds) {
  return offloadd::base::PollUntil(pred, seconds, /*poll_seconds=*/0.0002);
}

[[noreturn]] void Finding(const char* what) {
  std::fprintf(stderr, "session_fuzz: %s\n", what);
  abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Harness& h = Get();
  static const bool verbose = std::getenv("SESSION_FUZZ_VERBOSE") != nullptr;
  std::atomic<uint64_t> completions{0}, hellos{0};
  offloadd::session::PeerCredentials peer;
  peer.known = true;
  peer.pid = getpid();
  peer.uid = geteuid();
  peer.gid = getegid();
  auto session = offloadd::session::Session::Create(
      h.core.get(),
      [&](Completion c) {
        completions.fetch_add(1);
        if (c.kind == CompletionKind::kHello) hellos.fetch_add(1);
        if (verbose) {
          std::fprintf(stderr, "  request %llu -> kind %d %s\n",
                       static_cast<unsigned long long>(c.request_id), static_cast<int>(c.kind),
                       c.status.ToString().c_str());
        }
      },
      peer, [](const absl::Status&) {});
  uint64_t handled = 0;
  size_t pos = 0;
  while (pos + 2 <= size) {
    size_t len = data[pos] | (static_cast<size_t>(data[pos + 1]) << 8);
    pos += 2;
    len = std::min(len, size - pos);
    offloadd::v1::ClientMessage m;
    const bool parsed = m.ParseFromArray(data + pos, static_cast<int>(len));
    pos += len;
    if (!parsed) continue;
    for (offloadd::v1::Request& r : *m.mutable_requests()) {
      if (r.has_register_region() && r.register_region().handle().shm_name().size() <= 1) {
        auto* handle = r.mutable_register_region()->mutable_handle();
        const std::string& n = handle->shm_name();
        handle->set_shm_name(h.shm_names[(n.empty() ? 0 : static_cast<uint8_t>(n[0])) % 2]);
      }
      session->Handle(offloadd::rpc::FromProto(r));
      ++handled;
    }
    if (!WaitFor([&] { return session->info().requests_in_flight == 0; }, 10)) {
      Finding("a request was never answered (session not idle after 10 s)");
    }
    // Completions are emitted before the in-flight count drops (same lock), so they are in.
    if (completions.load() != handled) Finding("requests and completions differ");
    if (hellos.load() > 1) Finding("two successful hellos on one session");
  }
  session->Close(offloadd::session::EndCause::kClosed);
  session.reset();
  if (!WaitFor(
          [&] {
            auto s = h.core->store().stats();
            return s.blocks == 0 && s.pool.used_bytes == 0;
          },
          10)) {
    Finding("pool extents not returned after the session closed");
  }
  return 0;
}
