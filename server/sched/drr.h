// ChunkQueue: the chunk-picking policy of one link direction, without threads or clocks.
//
// LinkScheduler (link_scheduler.h) wraps one ChunkQueue with worker threads and pacing; this
// class only decides, deterministically, which chunk goes next. Tests drive it directly.
//
// Flows are (traffic class, GPU). A pushed Transfer of `bytes` is cut into chunks of at most
// `chunk_bytes` (a 20 MiB transfer with 8 MiB chunks -> offsets 0, 8, 16 MiB, lengths 8, 8, 4
// MiB). Pop() picks:
//  1. the class: URGENT, else PREFETCH, else OFFLOAD, else PROJECTOR — except that while OFFLOAD and a higher
//     class both have queued chunks ("contended"), OFFLOAD is served whenever its share of the
//     bytes served under contention is below `offload_min_share`. The byte counters are halved
//     whenever their total passes `share_window_bytes`, so they cover roughly the last window
//     (between half and all of it) and never reset (bytes served while offload is alone do
//     not count). Offload's share of the counted bytes thus never falls more than one chunk
//     below the minimum; halving makes the served share run slightly above it (drr_test: 80
//     to 84 of 400 chunks at 0.2).
//  2. the GPU within the class: deficit round robin (Shreedhar & Varghese, SIGCOMM 1995). The
//     active list holds GPUs with queued chunks in that class; a visit adds
//     weight x quantum_bytes to the GPU's deficit and serves chunks while the deficit covers the
//     next chunk, then the GPU goes to the tail. A GPU whose queue empties leaves the list with
//     its deficit reset to 0 (idle GPUs give their share away and bank nothing). Rounds in
//     which nobody could be served (quantum < chunk) are skipped arithmetically, not looped.
//  3. the transfer within (class, GPU): earliest deadline first (deadline 0 = none = last),
//     then FIFO by push order. A newly pushed earlier-deadline transfer overtakes the remaining
//     chunks of a transfer in progress.
// A parked transfer (Park: LinkScheduler parks one whose chunks wait for its producer) keeps
// its place but offers no chunk: its flow is served as if it were not queued, and an emptied
// flow leaves the round like any idle one. Unpark puts it back at its (deadline, push order).
//
// Not thread-safe: the caller (LinkScheduler) holds its mutex around every call.
#ifndef OFFLOADD_SERVER_SCHED_DRR_H_
#define OFFLOADD_SERVER_SCHED_DRR_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <utility>

#include "absl/status/statusor.h"
#include "server/sched/link_scheduler.h"

namespace offloadd::sched {

struct ChunkQueueOptions {
  uint64_t chunk_bytes = 8ull << 20;            // > 0 (0 is treated as 8 MiB)
  uint64_t quantum_bytes = 8ull << 20;          // DRR quantum per weight unit (0 = chunk_bytes)
  double offload_min_share = 0.2;               // clamped to [0, 1]
  uint64_t share_window_bytes = 0;              // 0 = 32 x chunk_bytes
  std::map<std::string, uint32_t> gpu_weights;  // default 1; 0 is treated as 1

  // The policy part of LinkSchedulerOptions.
  static ChunkQueueOptions From(const LinkSchedulerOptions& options);
};

// One chunk to copy: bytes [offset, offset + len) of `transfer`.
struct Chunk {
  uint64_t transfer_id = 0;  // as returned by Push()
  std::shared_ptr<Transfer> transfer;
  uint64_t offset = 0;
  uint64_t len = 0;
  bool last = false;  // no chunk of this transfer remains queued after this one
};

class ChunkQueue {
 public:
  explicit ChunkQueue(ChunkQueueOptions options);

  // Queues all chunks of `transfer`; returns its id (> 0, increasing). INVALID_ARGUMENT when
  // the transfer is null or has 0 bytes. Only gpu, cls, deadline_at_seconds and bytes are read
  // (Promote also writes cls).
  absl::StatusOr<uint64_t> Push(std::shared_ptr<Transfer> transfer);
  // Which GPUs may be served now in a class (LinkScheduler: those below their limit of chunks
  // posted to an asynchronous engine, and every GPU for URGENT). A GPU filtered out is passed
  // over without losing its deficit, as if it had nothing queued in that class for this pick.
  using GpuFilter = std::function<bool(TrafficClass cls, const std::string& gpu)>;
  // The next chunk by the policy above among GPUs passing `eligible` (null: all); nullopt when
  // no such chunk is queued.
  std::optional<Chunk> Pop(const GpuFilter& eligible = nullptr);
  // Whether Pop(eligible) would return a chunk.
  bool HasEligible(const GpuFilter& eligible) const;
  // Drops the not-yet-popped chunks of a transfer; returns how many bytes were dropped (0 for
  // an unknown id or a transfer whose chunks were all popped).
  uint64_t Cancel(uint64_t transfer_id);
  // Moves the not-yet-popped chunks of a transfer to the higher class `cls` (a PREFETCH
  // stage-back a reload now waits on becomes URGENT) and sets transfer->cls to it; in the new
  // class it is ordered by its deadline, then its push order, like any other. Returns
  // the bytes moved: 0 for an unknown id, a transfer whose chunks were all popped, or `cls` not
  // above the transfer's class (never demotes).
  uint64_t Promote(uint64_t transfer_id, TrafficClass cls);
  // Takes the not-yet-popped chunks of a transfer out of its flow until Unpark (see above);
  // Pop never returns them meanwhile. Cancel and Promote work on a parked transfer (a promoted
  // one stays parked and comes back in its new class). Returns the bytes parked: 0 for an unknown id, a
  // transfer whose chunks were all popped, or one already parked.
  uint64_t Park(uint64_t transfer_id);
  // Puts a parked transfer's chunks back in its flow, ordered by its deadline and push order as
  // before. Returns the bytes put back (0 for an unknown or unparked transfer).
  uint64_t Unpark(uint64_t transfer_id);

  bool empty() const { return transfers_.empty(); }
  // Transfers with at least one chunk still queued (parked ones included).
  uint64_t queued_transfers() const { return transfers_.size(); }
  uint64_t queued_bytes(TrafficClass cls) const;
  // Current DRR deficit of a flow (0 when the flow is idle). For tests and debugging.
  uint64_t deficit_bytes(TrafficClass cls, const std::string& gpu) const;
  // Bytes counted for the offload minimum share (see above), for tests and debugging.
  std::pair<uint64_t, uint64_t> contended_offload_and_total_bytes() const {
    return {contended_offload_bytes_, contended_total_bytes_};
  }
  const ChunkQueueOptions& options() const { return options_; }

 private:
  struct Queued {
    std::shared_ptr<Transfer> transfer;
    uint64_t next_offset = 0;
    double deadline_key = 0;  // deadline, or +inf for none
    bool parked = false;      // out of its flow (Park)
  };
  using OrderKey = std::pair<double, uint64_t>;  // (deadline_key, id)
  struct Flow {
    std::set<OrderKey> order;
    uint64_t deficit_bytes = 0;
    bool in_turn = false;  // the quantum of the current visit was already added
  };
  struct ClassQueue {
    std::map<std::string, Flow> flows;  // only flows with queued chunks
    std::deque<std::string> active;     // DRR round-robin order of `flows`
    uint64_t queued_bytes = 0;
  };

  uint64_t Weight(const std::string& gpu) const;
  uint64_t NextChunkLen(const Flow& flow) const;
  Chunk PopFromClass(TrafficClass cls, const GpuFilter& eligible);
  static bool Eligible(const ClassQueue& q, TrafficClass cls, const GpuFilter& eligible);
  void RemoveFlow(ClassQueue& q, const std::string& gpu);
  // Adds / takes the queued chunks of transfer `id` to / from its class's flow of its GPU.
  void Enqueue(uint64_t id, const Queued& t, uint64_t bytes);
  void Dequeue(uint64_t id, const Queued& t, uint64_t bytes);

  ChunkQueueOptions options_;
  uint64_t next_id_ = 1;
  std::unordered_map<uint64_t, Queued> transfers_;
  ClassQueue classes_[kNumClasses];
  uint64_t contended_offload_bytes_ = 0;
  uint64_t contended_total_bytes_ = 0;
};

}  // namespace offloadd::sched

#endif  // OFFLOADD_SERVER_SCHED_DRR_H_
