// Core::CopyOverLink: a copy for a caller outside the session layer (the projector refresh
// service), scheduled on a device's link like a session's offload or reload. The link is
// released as a probe's is (remove_if_unused): one made for the copy alone, on a device id no
// session used, goes with its series when the copy ends, so refreshes naming ever new device
// ids leave no links, threads or metrics series behind.
#include "absl/status/status.h"
#include "common/base/mutex.h"
#include "server/session/core.h"

namespace offloadd::session {
namespace {

// The transfer's `done`, waited for on the calling thread.
struct DoneWaiter {
  base::Mutex mu;
  base::CondVar cv;
  bool done GUARDED_BY(mu) = false;
  absl::Status status GUARDED_BY(mu);

  void Set(absl::Status s) EXCLUDES(mu) {
    base::MutexLock lock(mu);
    status = std::move(s);
    done = true;
    cv.NotifyAll();
  }
  absl::Status Wait() EXCLUDES(mu) {
    base::MutexLock lock(mu);
    while (!done) cv.Wait(mu);
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
    ReleaseLink(device_id, /*remove_if_unused=*/true);
    return absl::UnavailableError(
        "the daemon is shutting down: this copy did not start; retry when it is back");
  }
  copy::TransferSpec spec;
  spec.direction = direction;
  spec.bytes = bytes;
  // One ordering (one mapping held) for the whole copy, not one per chunk.
  absl::StatusOr<std::shared_ptr<copy::TransferOrder>> order =
      engine.BeginTransfer(*region, std::move(spec));
  if (!order.ok()) {
    EndTransfer();
    ReleaseLink(device_id, /*remove_if_unused=*/true);
    return order.status();
  }
  auto waiter = std::make_shared<DoneWaiter>();
  auto t = std::make_shared<sched::Transfer>();
  t->gpu = device_id;
  t->cls = cls;
  t->bytes = bytes;
  t->copy_chunk = [&engine, region, order = *order, direction, region_offset, host](
                      uint64_t o, uint64_t len) {
    return engine.CopyOrderedChunk(order.get(), o, direction, *region, region_offset + o,
                                   host + o, len);
  };
  if (engine.asynchronous()) {
    t->post_chunk = [&engine, region, order = *order, direction, region_offset, host](
                        uint64_t o, uint64_t len, std::function<void(absl::Status)> done) {
      engine.PostOrderedChunk(order.get(), o, direction, *region, region_offset + o, host + o,
                              len, copy::ChunkUrgency::kNormal, std::move(done));
    };
  }
  t->done = [waiter](absl::Status s) { waiter->Set(std::move(s)); };
  std::shared_ptr<Link> link = LinkFor(device_id);
  (direction == copy::Direction::kDeviceToHost ? link->d2h : link->h2d)->Submit(std::move(t));
  absl::Status status = waiter->Wait();
  EndTransfer();
  ReleaseLink(device_id, /*remove_if_unused=*/true);
  return status;
}

}  // namespace offloadd::session
