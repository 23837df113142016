// LinkScheduler: shares one direction of one link (a PCIe switch uplink, or a simulated link on
// the shm backend) among the GPUs behind it.
//
// A Transfer (one offload or reload) is cut into chunks of at most `chunk_bytes`, so a 1 GiB
// offload cannot hold the link while a backward pass waits on a reload. Which chunk goes next:
//  1. Class priority: URGENT reloads, then PREFETCH reloads, then OFFLOADs, then PROJECTOR
//     copies (projector refreshes), except that OFFLOAD gets at least `offload_min_share` of
//     the bytes while it has work and a higher class waits (GPU memory is only freed when
//     offloads finish) — enforced by byte accounting over a sliding window.
//  2. Within a class, deficit round robin (Shreedhar & Varghese, "Efficient Fair Queuing Using
//     Deficit Round Robin", SIGCOMM 1995) over GPUs: each visit adds weight x quantum_bytes to a
//     GPU's deficit; a GPU with no queued chunks keeps no deficit, so idle GPUs give their share
//     away.
//  3. Within a GPU and class: earliest deadline first (transfers without a deadline are last),
//     then FIFO.
// Pacing: when bytes_per_second > 0 the link's chunks start no faster than that rate (virtual
// finish time per link direction), which is how the shm backend simulates a PCIe link. The
// virtual clock is work-conserving: while work is queued, a chunk starts at the previous one's
// virtual finish even if its worker woke late (catch-up bounded by 20 ms), so a busy machine
// does not make a saturated simulated link look idle.
// Hierarchy: with a `parent` HostLink (host_link.h: a root port or host memory node shared by
// several links), a worker also takes a turn at the parent before each chunk — one worker of
// this link waits there at a time, and the chunk is picked only once the turn is granted. A
// chunk then finishes when both levels have moved it: max(start + len / bytes_per_second,
// the parent's finish).
//
// The policy itself (1-3) is ChunkQueue in drr.h, deterministic and single-threaded; this class
// adds worker threads, pacing, byte/busy accounting and completion. With several workers and
// pacing, a worker waits for the link's virtual finish time before it picks the next chunk,
// so picks happen as late as possible and chunks never exceed the rate in aggregate; a chunk
// is reported done at its virtual finish (start + bytes / bytes_per_second).
//
// Asynchronous copies: a Transfer with `post_chunk` instead of `copy_chunk` has its
// chunks posted to an asynchronous copy engine (CopyEngine::PostChunk): a worker picks a chunk,
// posts it and goes on picking while up to `max_chunks_in_flight_per_gpu` chunks of that GPU are
// posted; the engine's callback queues the completion and a worker finishes it. The DRR deficit
// and the offload share are charged when a chunk is picked (posted), bytes and busy time are
// counted when it completes, and a GPU at its limit is passed over (its deficit kept), so an
// URGENT chunk waits at most for the chunks already posted on its GPU. With pacing, the link's
// virtual clock gates posts as it gates synchronous copies; completion is the engine's.
// CancelOwner drops the owner's chunks not yet posted; chunks already posted run to completion,
// and the transfer's `done` comes after the last of them.
//
// Producer waits: an engine holds a posted chunk until its transfer's ready event has completed
// (the client's producer kernels are done). While the engine reports a transfer waiting
// (SetWaitingForProducer), its posted chunks do not count towards its GPU's limit and its
// queued chunks are parked (ChunkQueue::Park: passed over, their place kept), so a transfer
// whose producer runs for seconds, or never ends, holds none of its GPU's slots and a ready
// transfer of another session is posted at once. A transfer that is not URGENT thus has at
// most `max_chunks_in_flight_per_gpu` chunks posted while it waits (those posted before the
// engine saw it wait). When the wait ends its posted chunks count again and its queued ones compete
// from their old place; a GPU may then briefly have more chunks posted than its limit (its
// next chunks wait until it is back below).
//
// Submitting thread: on an unpaced link without a parent, Submit posts the chunks of a
// post_chunk transfer itself (posting does not block), and copies a small copy_chunk transfer
// itself when nothing else is queued (`inline_copy_max_bytes`); an engine's completion finishes
// its chunk and posts the next ones on the engine's thread. Only workers run `done` otherwise.
//
// Thread-safety: all public methods are thread-safe. Transfer callbacks run on worker threads
// without the scheduler's mutex held, and a finished Transfer (with whatever its callbacks
// capture: a Session, a Region) is dropped after that mutex is released, so its destructors may
// block without stalling the link. Shutdown() and the destructor must not be called from a
// transfer callback.
#ifndef OFFLOADD_SERVER_SCHED_LINK_SCHEDULER_H_
#define OFFLOADD_SERVER_SCHED_LINK_SCHEDULER_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "common/base/clock.h"

namespace offloadd::sched {

// Highest priority first (see 1. above). kProjector: a projector refresh's copies (reading a
// gradient, writing its projector; projector/refresh_service.h), below OFFLOAD: a refresh is
// background work whose result a later step picks up, while a reload feeds the backward pass
// now and an offload frees GPU memory now. It has no minimum share: on a link that stays
// saturated by the other classes its chunks wait until the link has room.
enum class TrafficClass { kUrgent = 0, kPrefetch = 1, kOffload = 2, kProjector = 3 };
inline constexpr int kNumClasses = 4;
const char* TrafficClassName(TrafficClass c);

// The injectable monotonic time source (common/base/clock.h; tests: base::FakeClock).
using Clock = base::Clock;

struct Transfer {
  std::string gpu;  // device id; the DRR flow
  TrafficClass cls = TrafficClass::kOffload;
  double deadline_at_seconds = 0;  // absolute: a time of the scheduler's Clock; 0 = none
  uint64_t bytes = 0;           // > 0
  // Copies [offset, offset + len) of this transfer; runs on a worker thread; chunks of one
  // transfer may run concurrently on different workers.
  std::function<absl::Status(uint64_t offset, uint64_t len)> copy_chunk;
  // Instead of copy_chunk (used when set): starts the copy of [offset, offset + len) and calls
  // `chunk_done` exactly once when it has completed or failed, possibly inline, possibly on
  // another thread; chunk_done only queues the completion (it takes the scheduler's lock
  // briefly, never runs `done`).
  std::function<void(uint64_t offset, uint64_t len, std::function<void(absl::Status)> chunk_done)>
      post_chunk;
  // Called exactly once: after the last chunk completed, or with the first chunk's error (the
  // remaining chunks are skipped). Runs on a worker thread (or in Submit/Shutdown on cancel).
  std::function<void(absl::Status)> done;
  // Who submitted it (a session id, or for the spill link the block; 0 = nobody in
  // particular), for CancelOwner and PromoteOwner.
  uint64_t owner_id = 0;
};

class HostLink;

struct LinkSchedulerOptions {
  std::string link_name;
  std::string direction;              // "d2h" / "h2d", for metrics and logs
  uint64_t chunk_bytes = 8ull << 20;  // 8 MiB
  uint64_t quantum_bytes = 8ull << 20;
  uint32_t worker_threads = 2;
  // Chunks of post_chunk transfers posted and not completed, per GPU (>= 1; 0 is treated as 1).
  // URGENT chunks are posted even at the limit (they still count towards it).
  uint32_t max_chunks_in_flight_per_gpu = 2;
  // A copy_chunk transfer of at most this many bytes (one chunk) submitted to an unpaced link
  // without a parent whose queue is empty is copied on the submitting thread, and its `done`
  // runs there, instead of waking a worker (the small-request path). Not from inside
  // another such `done` (no recursion). 0 = never.
  uint64_t inline_copy_max_bytes = 64 * 1024;
  double bytes_per_second = 0;                  // 0 = unpaced
  double offload_min_share = 0.2;               // of bytes while offloads are queued
  std::map<std::string, uint32_t> gpu_weights;  // default weight 1
  // The level above this link (not owned; must outlive the scheduler); null = none. Turns are
  // taken there under the name link_name.
  HostLink* parent = nullptr;
  // Called (on a worker thread, without locks held) when a transfer's first chunk starts, with
  // the seconds it waited since Submit. For the queue-wait metric; may be empty.
  std::function<void(TrafficClass cls, double wait_seconds)> on_queue_wait;
};

struct LinkSchedulerStats {
  uint64_t bytes = 0;                         // copied, all classes
  std::map<std::string, uint64_t> gpu_bytes;  // copied per GPU
  uint64_t class_bytes[kNumClasses] = {};
  double busy_seconds = 0;  // time with at least one chunk being copied
  uint64_t queued_transfers = 0;
  uint64_t chunks_in_flight = 0;
  // Per class: transfers whose first chunk started, and the sum / max of their waits from
  // Submit to that start (seconds; the paced start when bytes_per_second > 0).
  uint64_t started_transfers[kNumClasses] = {};
  double queue_wait_seconds_sum[kNumClasses] = {};
  double queue_wait_seconds_max[kNumClasses] = {};
  // Transfers with a deadline that completed (successfully) after it, per GPU.
  std::map<std::string, uint64_t> gpu_deadline_misses;
  // Times a worker thread was woken from its wait (each costs a thread switch; a small transfer
  // copied on the submitting thread wakes none).
  uint64_t worker_wakeups = 0;
  // Posted chunks of transfers waiting for their producer now (they hold no slot), and the
  // times a transfer was reported waiting (SetWaitingForProducer).
  uint64_t chunks_waiting_for_producer = 0;
  uint64_t producer_waits = 0;
};

class LinkScheduler {
 public:
  LinkScheduler(LinkSchedulerOptions options, Clock* clock = Clock::Real());
  ~LinkScheduler();  // Shutdown()

  // Queues a transfer. After Shutdown, `done` is called at once with UNAVAILABLE; a transfer
  // with 0 bytes or neither copy_chunk nor post_chunk gets INVALID_ARGUMENT the same way. A
  // null transfer is ignored. May post chunks, or copy a small transfer and run its `done`, on
  // the calling thread (see above): call it without locks that `done` takes.
  void Submit(std::shared_ptr<Transfer> transfer);
  // Drops the queued chunks of every transfer with this owner_id (> 0): a transfer with no chunk
  // being copied gets `done(status)` before this returns (on this thread, without the
  // scheduler's lock); one with chunks being copied gets it when they finish. Chunks already
  // handed to copy_chunk or posted with post_chunk are not interrupted. Returns the number of
  // transfers cancelled.
  size_t CancelOwner(uint64_t owner_id, const absl::Status& status);
  // Raises the queued chunks of every transfer with this owner_id (> 0) to class `cls` when it
  // is above the transfer's (a PREFETCH read a reload now waits on becomes URGENT): they then
  // go before the chunks of lower classes, as if submitted with `cls`. The transfer's `cls`
  // field is set to it (bytes already copied stay counted in the old class). Chunks already
  // picked are not affected. Returns the number of transfers promoted (0: none queued with that
  // owner below `cls`).
  size_t PromoteOwner(uint64_t owner_id, TrafficClass cls);
  // The engine's word that the posted chunks of `transfer` (submitted here, with post_chunk)
  // wait for its producer (`waiting`), or no longer do (see "Producer waits"). Never posts or
  // copies on the calling thread and never calls the transfer's callbacks, so an engine may
  // call it from its issue loop; it wakes a worker to post what may go now. Returns false (and
  // does nothing) for a transfer not in flight here, one without post_chunk, or no change.
  bool SetWaitingForProducer(const Transfer* transfer, bool waiting);
  // Finishes every queued and in-flight transfer, then stops the workers. Idempotent; a second
  // concurrent caller returns once the workers have stopped.
  void Shutdown();
  LinkSchedulerStats stats() const;
  // The options it was made with (bytes_per_second as made; see bytes_per_second()).
  const LinkSchedulerOptions& options() const;
  // Changes the pacing rate from now on (bytes/s; 0 = unpaced), e.g. to a link's capacity
  // measured at run time (session/link_calibration.h). Chunks already started keep their paced
  // finish; the next one starts at the new rate. Turning pacing on also moves a post_chunk
  // link's posting from the engine's threads to the workers (see "Submitting thread").
  void SetBytesPerSecond(double bytes_per_second);
  double bytes_per_second() const;
  // For tests: whether any thread holds the scheduler's mutex at this moment. Asked from a
  // thread of its own, so it may be called from a destructor that runs on a worker.
  bool MutexHeldForTesting() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace offloadd::sched

#endif  // OFFLOADD_SERVER_SCHED_LINK_SCHEDULER_H_
