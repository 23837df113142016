// BlockingCopyEngine: the adapter for a backend whose one copy primitive blocks until the bytes
// have landed (the shm engine's memcpy). The backend implements that primitive,
// BlockingCopyChunk; the adapter implements CopyEngine's copy calls from it and says so in
// capabilities(): a chunk, ordered or not, is BlockingCopyChunk on the calling thread; a posted
// one runs it and then `done`, inline; the backend orders no transfer against client GPU work,
// so BeginTransfer returns a null order; there is no host pool to pin and nothing kept per
// owner. A backend derived from it implements name(), OpenRegion(), BlockingCopyChunk(),
// handle_counts() and ForgetDevice(); a test engine may override the rest (to script ordering,
// say).
#ifndef OFFLOADD_SERVER_COPY_BLOCKING_COPY_ENGINE_H_
#define OFFLOADD_SERVER_COPY_BLOCKING_COPY_ENGINE_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/copy/copy_engine.h"

namespace offloadd::copy {

class BlockingCopyEngine : public CopyEngine {
 public:
  // Nothing asynchronous, nothing ordered.
  CopyCapabilities capabilities() const override { return CopyCapabilities{}; }

  // Copies `bytes` between region[region_offset, +bytes) and host[0, bytes) on the calling
  // thread, returning when they have landed (CopyEngine::CopyOrderedChunk's contract, without
  // an order). Called concurrently from several worker threads.
  virtual absl::Status BlockingCopyChunk(Direction direction, Region& region,
                                         uint64_t region_offset, uint8_t* host,
                                         uint64_t bytes) = 0;

  // A null order: `on_done_recorded` never runs.
  absl::StatusOr<std::shared_ptr<TransferOrder>> BeginTransfer(Region& region,
                                                              TransferSpec spec) override {
    (void)region;
    (void)spec;
    return std::shared_ptr<TransferOrder>();
  }
  // BlockingCopyChunk (the order, null here, changes nothing).
  absl::Status CopyOrderedChunk(TransferOrder* order, uint64_t transfer_offset,
                                Direction direction, Region& region, uint64_t region_offset,
                                uint8_t* host, uint64_t bytes) override {
    (void)order;
    (void)transfer_offset;
    return BlockingCopyChunk(direction, region, region_offset, host, bytes);
  }
  // CopyOrderedChunk, then `done` with its status, on the calling thread (urgency has nothing
  // to reorder: nothing is queued).
  void PostOrderedChunk(TransferOrder* order, uint64_t transfer_offset, Direction direction,
                        Region& region, uint64_t region_offset, uint8_t* host, uint64_t bytes,
                        ChunkUrgency urgency, std::function<void(absl::Status)> done) override {
    (void)urgency;
    done(CopyOrderedChunk(order, transfer_offset, direction, region, region_offset, host, bytes));
  }
  absl::Status PrepareHostPool(uint8_t* base, uint64_t size_bytes) override {
    (void)base;
    (void)size_bytes;
    return absl::OkStatus();
  }
  void ReleaseOwner(uint64_t owner_id) override { (void)owner_id; }
  uint64_t pinned_bytes() const override { return 0; }
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_BLOCKING_COPY_ENGINE_H_
