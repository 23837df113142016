// BlockingCopyEngine: the adapter for a backend whose one copy primitive blocks until the bytes
// have landed (the shm engine's memcpy). It implements the rest of CopyEngine from that one
// primitive, and says so in capabilities(): PostChunk runs CopyChunk on the calling thread and
// then `done`, inline; the backend orders no transfer against client GPU work, so BeginTransfer
// returns a null order and the ordered calls are the unordered ones; there is no host pool to
// pin and nothing kept per owner. A backend derived from it implements name(), OpenRegion(),
// CopyChunk(), handle_counts() and ForgetDevice(); a test engine may override the rest (to script
// ordering, say).
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
  // Nothing asynchronous, nothing ordered, nothing pinned.
  CopyCapabilities capabilities() const override { return CopyCapabilities{}; }

  // CopyChunk, then `done` with its status, on the calling thread (urgency has nothing to
  // reorder: nothing is queued).
  void PostChunk(Direction direction, Region& region, uint64_t region_offset, uint8_t* host,
                 uint64_t bytes, ChunkUrgency urgency,
                 std::function<void(absl::Status)> done) override {
    (void)urgency;
    done(CopyChunk(direction, region, region_offset, host, bytes));
  }
  // A null order: the chunks go through the unordered calls; `on_done_recorded` never runs.
  absl::StatusOr<std::shared_ptr<TransferOrder>> BeginTransfer(Region& region,
                                                              TransferSpec spec) override {
    (void)region;
    (void)spec;
    return std::shared_ptr<TransferOrder>();
  }
  absl::Status CopyOrderedChunk(TransferOrder* order, uint64_t transfer_offset,
                                Direction direction, Region& region, uint64_t region_offset,
                                uint8_t* host, uint64_t bytes) override {
    (void)order;
    (void)transfer_offset;
    return CopyChunk(direction, region, region_offset, host, bytes);
  }
  void PostOrderedChunk(TransferOrder* order, uint64_t transfer_offset, Direction direction,
                        Region& region, uint64_t region_offset, uint8_t* host, uint64_t bytes,
                        ChunkUrgency urgency, std::function<void(absl::Status)> done) override {
    (void)order;
    (void)transfer_offset;
    PostChunk(direction, region, region_offset, host, bytes, urgency, std::move(done));
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
