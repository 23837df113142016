// Core::CopyOverLink: a copy for a caller outside the session layer (the projector refresh
// service), scheduled on a device's link like a session's offload or reload.
#include <condition_variable>
#include <mutex>

#include "absl/status/status.h"
#include "server/session/core.h"

namespace offloadd::session {
namespace {

// The transfer's `done`, waited for on the calling thread.
struct DoneWaiter {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  absl::Status status;

  void Set(absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    status = std::move(s);
    done = true;
    cv.notify_all();
  }
  absl::Status Wait() {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [this] { return done; });
    return status;
  }
};

}  // namespace

absl::Status Core::CopyOverLink(const std::string& device_id, sched::TrafficClass cls,
                                copy::CopyEngine& engine, copy::Direction direction,
                                std::shared_ptr<copy::Region> region, uint64_t region_offset,
                                uint8_t* host, uint64_t bytes) {
  if (bytes == 0) return absl::OkStatus();
  if (absl::Status admitted = AcquireLink(device_id); !admitted.ok()) return admitted;
  if (!BeginTransfer()) {
    ReleaseLink(device_id, /*remove_if_unused=*/false);
    return absl::UnavailableError(
        "the daemon is shutting down: this copy did not start; retry when it is back");
  }
  auto waiter = std::make_shared<DoneWaiter>();
  auto t = std::make_shared<sched::Transfer>();
  t->gpu = device_id;
  t->cls = cls;
  t->bytes = bytes;
  t->copy_chunk = [&engine, region, direction, region_offset, host](uint64_t o, uint64_t len) {
    return engine.CopyChunk(direction, *region, region_offset + o, host + o, len);
  };
  if (engine.asynchronous()) {
    t->post_chunk = [&engine, region, direction, region_offset, host](
                        uint64_t o, uint64_t len, std::function<void(absl::Status)> done) {
      engine.PostChunk(direction, *region, region_offset + o, host + o, len,
                       copy::ChunkUrgency::kNormal, std::move(done));
    };
  }
  t->done = [waiter](absl::Status s) { waiter->Set(std::move(s)); };
  std::shared_ptr<Link> link = LinkFor(device_id);
  (direction == copy::Direction::kDeviceToHost ? link->d2h : link->h2d)->Submit(std::move(t));
  absl::Status status = waiter->Wait();
  EndTransfer();
  ReleaseLink(device_id, /*remove_if_unused=*/false);
  return status;
}

}  // namespace offloadd::session
