// RefreshService: the daemon's GaLore projector refresh service below the RPC layer.
//
// Submit() validates a ServiceRequest (service_request.h), de-duplicates it by its key
// (parameter_id, step) and queues it; it returns at once. Worker threads take refreshes from a
// FairRefreshQueue (round robin over parameters, step order within one, one refresh of a
// parameter at a time), and for each:
//   1. lazy mode: skips it while the parameter's subspace has stayed stable (lazy_policy.h);
//   2. opens G's region through a RegionCache and copies G (rows x cols, dtype) into a
//      per-worker buffer through `copy_through_link` (below; without one, with one
//      CopyEngine::CopyChunk);
//   3. runs RefreshProjector (projector.h) with the parameter's previous projector, if the
//      service still holds it, for similarity and (randomized, warm_start) as the warm start;
//   4. writes P to its region the same way — unless G was all zeros (degenerate: P is left as
//      it was) — and keeps P as the parameter's previous projector;
//   5. records the result and wakes whoever waits for it.
//
// Memory held (all bounded):
//   - per refresh: its estimated peak (RefreshLayout::working_bytes: G, its fp32 copy, the
//     SVD's copies and workspace, P) must be at most max_refresh_bytes, checked at Submit before
//     anything is allocated (OUT_OF_RANGE); an allocation that fails anyway (std::bad_alloc)
//     fails that refresh with RESOURCE_EXHAUSTED, and the worker goes on;
//   - per worker: G's bytes and an fp32 copy for bf16/fp16 (RefreshScratch), grown to the
//     largest gradient seen (so at most workers x max_refresh_bytes in all);
//   - queue: at most max_queued_refreshes refreshes queued or running, and at most
//     max_queued_refreshes_per_uid of one caller uid (RESOURCE_EXHAUSTED beyond);
//   - history: per parameter the last projector as written (side_dim x r in its dtype), its last
//     started step and lazy state; at most history_bytes_per_uid of projectors per caller uid,
//     history_bytes in all and max_parameters entries; least recently refreshed forgotten first:
//     past the per-uid budget the uid's own, past a total the largest holder's (so one uid
//     cannot evict another that stays within its share). A forgotten parameter's next refresh
//     has no similarity and starts cold;
//   - results: finished records (no projector bytes) for GetResult and de-duplication, at most
//     max_results_per_uid per caller uid, max_results in all (past it the largest holder's
//     oldest go first) and result_ttl_seconds each; queued and running ones are never dropped.
// Workers serve the queue round robin over caller uids (FairRefreshQueue), so one uid's backlog
// delays another's refresh by at most one job per worker.
//
// Backends: `cpu_backend` (LapackSvdBackend) for every refresh, unless `gpu_backend_for` returns
// a backend for the gradient's region (e.g. cuSOLVER on the GPU holding a CUDA region).
//
// Metrics (metrics.h): offloadd_projector_refresh_duration_seconds{method, backend} per computed
// refresh (read G to P written), offloadd_projector_queue_depth (queued + running),
// offloadd_projector_refreshes_total{outcome} with outcome ok | degenerate | skipped |
// invalid_input (the refresh's INVALID_ARGUMENT, e.g. NaN in G) | error | cancelled.
//
// Thread-safe. Callbacks given to WhenFinished run on a worker thread (or the caller's, for a
// refresh already finished) without the service's lock held; they must not block for long.
#ifndef OFFLOADD_SERVER_PROJECTOR_REFRESH_SERVICE_H_
#define OFFLOADD_SERVER_PROJECTOR_REFRESH_SERVICE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "server/base/clock.h"
#include "server/copy/copy_engine.h"
#include "server/projector/lapack_backend.h"
#include "server/projector/projector.h"
#include "server/projector/refresh_queue.h"
#include "server/projector/region_cache.h"
#include "server/projector/service_request.h"

namespace offloadd::projector {

enum class RefreshState { kQueued = 0, kRunning = 1, kDone = 2, kFailed = 3 };

// What GetResult reports about one refresh.
struct RefreshRecord {
  uint64_t id = 0;
  std::string parameter_id;
  int64_t step = 0;
  std::string batch_id;
  RefreshState state = RefreshState::kQueued;
  absl::Status status;  // kFailed: why (the message says what to do)

  bool projector_written = false;  // P is in its region now
  bool skipped = false;            // lazy mode skipped it; P left as it was
  bool warm_started = false;
  RefreshResult result;  // kDone and not skipped; projector_bytes is always empty here
  // Shape facts known at submit (also filled for skipped / failed refreshes).
  VectorSide vector_side = VectorSide::kLeft;
  int64_t projector_rows = 0;
  int64_t effective_rank = 0;
  DType dtype = DType::kFloat32;

  std::string backend;         // backend name ("" when nothing was computed)
  double queued_seconds = 0;   // submit to start
  double elapsed_seconds = 0;  // start to finish: read G, compute, write P
};

struct SubmitOutcome {
  uint64_t id = 0;
  bool deduplicated = false;
  RefreshState state = RefreshState::kQueued;
};

// One copy between a worker's host buffer and client memory (G read, P written), as the
// service hands it to RefreshServiceOptions::copy_through_link.
struct RegionCopy {
  copy::CopyEngine* engine = nullptr;    // the engine that opened `region`; not null
  std::shared_ptr<copy::Region> region;  // open for the whole copy
  copy::Direction direction = copy::Direction::kDeviceToHost;  // d2h: read G; h2d: write P
  uint64_t region_offset = 0;            // bytes into the region
  uint8_t* host = nullptr;               // `bytes` bytes of the worker's buffer
  uint64_t bytes = 0;                    // > 0
  std::string device_id;                 // RegionSpec::device_id: whose link carries it
};
// Moves a RegionCopy's bytes and returns when all have landed, or with the first error (the
// message says what failed). Supplied by the layer that owns the links (main wires
// session::Core::CopyOverLink: chunked, paced and DRR-scheduled on the device's link in the
// PROJECTOR class, counted in the link metrics), so this layer does not depend on it. Runs on
// a refresh worker, without the service's lock held; may block for as long as the link needs.
using CopyThroughLink = std::function<absl::Status(const RegionCopy&)>;

struct RefreshServiceOptions {
  int workers = 1;
  // Must outlive the service; nullptr = a LapackSvdBackend owned by the service.
  const SvdBackend* cpu_backend = nullptr;
  // Optional: a backend for gradients in this region (nullptr = cpu_backend).
  std::function<const SvdBackend*(const copy::RegionSpec&)> gpu_backend_for;
  uint64_t history_bytes = 256ull << 20;
  uint64_t history_bytes_per_uid = 64ull << 20;  // 0 = only the total
  size_t max_parameters = 65536;
  size_t max_results = 4096;
  size_t max_results_per_uid = 1024;  // 0 = only the total
  double result_ttl_seconds = 600;
  RegionCacheOptions region_cache;
  // Time of queue waits, durations and result expiry (and of the region cache's idle time
  // unless region_cache.now_seconds is set). Not owned, must outlive the service; null =
  // base::Clock::Real(). Tests pass a base::FakeClock.
  base::Clock* clock = nullptr;
  // How G and P are copied (see CopyThroughLink). Empty: one CopyEngine::CopyChunk per matrix,
  // outside any link (tests of this layer alone).
  CopyThroughLink copy_through_link;
  // See "Memory held" above. 0 = no bound.
  uint64_t max_refresh_bytes = 8ull << 30;
  size_t max_queued_refreshes = 4096;
  size_t max_queued_refreshes_per_uid = 1024;
  // Callbacks waiting in WhenFinished (each a GetResult with wait, or one refresh of a
  // WatchBatch, holding a gRPC call), per owner uid and in total; kAnyOwner is not counted.
  size_t max_waiters = 4096;
  size_t max_waiters_per_uid = 256;
};

class RefreshService {
 public:
  // `shm_engine` opens shm regions, `cuda_engine` CUDA IPC handles (either may be null; see
  // RegionCache). Both must outlive the service. Starts the workers.
  RefreshService(RefreshServiceOptions options, copy::CopyEngine* shm_engine,
                 copy::CopyEngine* cuda_engine);
  ~RefreshService();  // Shutdown()

  // Queues a refresh, or returns the existing one for a known key (deduplicated = true; the
  // first request's parameters stand). Errors: ValidateServiceRequest's; OUT_OF_RANGE when the
  // refresh would need more than max_refresh_bytes; RESOURCE_EXHAUSTED past the queue bounds;
  // FAILED_PRECONDITION
  // when `step` is older than a step of this parameter that has already started (steps must
  // increase; set reset_history to start over); UNAVAILABLE after Shutdown.
  absl::StatusOr<SubmitOutcome> Submit(const ServiceRequest& request);

  // Names are scoped by owner: a refresh belongs to the caller_uid that submitted it, and its
  // parameter_id, step and batch_id name it only for that uid (another uid's refresh with the
  // same key is a different refresh, with its own history and step order). `owner_uid`: the
  // caller's uid (-1 = unknown credentials); kAnyOwner skips the check (tests, internal).
  // Ids are random 64-bit values (getrandom), so one user cannot guess another's.
  static constexpr int64_t kAnyOwner = INT64_MIN;

  // NOT_FOUND when unknown, expired, or another owner's (the same message for each).
  absl::StatusOr<RefreshRecord> Get(uint64_t id, int64_t owner_uid = kAnyOwner) const;
  absl::StatusOr<uint64_t> Find(int64_t owner_uid, const std::string& parameter_id,
                                int64_t step) const;
  // Ids `owner_uid` submitted with this batch id and still held (oldest first); empty when none.
  std::vector<uint64_t> BatchIds(int64_t owner_uid, const std::string& batch_id) const;

  // Calls `done` exactly once with the record when refresh `id` has finished (kDone or
  // kFailed) — at once, on this thread, if it already has. NOT_FOUND when unknown (or
  // another owner's); RESOURCE_EXHAUSTED (done is not called) when `owner_uid` already has
  // max_waiters_per_uid callbacks waiting, or the service max_waiters.
  absl::Status WhenFinished(uint64_t id, int64_t owner_uid,
                            std::function<void(const RefreshRecord&)> done);
  absl::Status WhenFinished(uint64_t id, std::function<void(const RefreshRecord&)> done) {
    return WhenFinished(id, kAnyOwner, std::move(done));
  }
  // Blocks until refresh `id` has finished (tests, benchmarks).
  absl::StatusOr<RefreshRecord> Wait(uint64_t id);

  // Stops taking work: queued refreshes fail with UNAVAILABLE (their waiters are told), running
  // ones finish, workers are joined. Idempotent.
  void Shutdown();

  struct Stats {
    size_t queued = 0, running = 0, results_held = 0, parameters_held = 0;
    uint64_t history_bytes = 0;
    size_t regions_cached = 0;
    uint64_t region_opens_total = 0;
  };
  Stats stats() const;

 private:
  struct History {
    std::shared_ptr<const std::vector<uint8_t>> projector;  // as written; null = none
    int64_t projector_rows = 0, projector_cols = 0;
    DType dtype = DType::kFloat32;
    VectorSide side = VectorSide::kLeft;
    int64_t last_started_step = -1;
    LazyRefreshState lazy;
    uint64_t last_used = 0;  // LRU tick
    int64_t owner = -1;      // caller uid
  };
  struct Entry {
    RefreshRecord record;
    ServiceRequest request;  // cleared once finished
    double submitted_at = 0;
    std::vector<std::function<void(const RefreshRecord&)>> waiters;
    int64_t caller_uid = -1;  // counted in unfinished_by_uid_ until finished
    std::vector<int64_t> waiter_uids;  // owners of counted waiters (waiters_by_uid_)
  };
  struct WorkerBuffers;
  // A refresh taken off the queue, carried from StartLocked through Run to RecordOutcomeLocked.
  struct Started {
    ServiceRequest request;
    RefreshRecord record;  // state kRunning until Run fills the outcome
    double start_seconds = 0;
    bool skip = false;                                     // a lazy refresh decided to skip
    std::shared_ptr<const std::vector<uint8_t>> previous;  // the projector to warm-start from
    History previous_shape;                                // its shape (when `previous`)
  };

  // One worker: pops refreshes in the queue's fair order until Shutdown.
  void WorkerLoop(int index);
  // Marks `item` running, updates its parameter's history and takes the lazy decision; mu_ held.
  Started StartLocked(const FairRefreshQueue::Item& item);
  // Runs (or skips) the refresh outside the lock; returns the projector bytes written (empty if
  // none) and fills s.record's outcome and elapsed time.
  std::vector<uint8_t> Run(Started& s, WorkerBuffers& buffers);
  // Keeps a finished refresh's projector and lazy state in the history; mu_ held.
  void RecordOutcomeLocked(const FairRefreshQueue::Item& item, const Started& s,
                           std::vector<uint8_t> written);
  // Opens, checks and reads the gradient into buffers; returns the host copy of G. NOT_FOUND /
  // PERMISSION_DENIED / OUT_OF_RANGE / the copy's status, each naming the region.
  absl::StatusOr<uint8_t*> ReadGradient(const ServiceRequest& request, const RefreshLayout& layout,
                                        WorkerBuffers& buffers);
  // Opens, checks and writes `projector_bytes` into the projector region; statuses as above.
  absl::Status WriteProjector(const ServiceRequest& request, const RefreshLayout& layout,
                              std::vector<uint8_t>& projector_bytes);
  // Runs one refresh outside the lock: reads G, fills and runs *refresh (whose
  // previous_projector the caller has set), writes P; fills *record (state kDone or kFailed).
  void Execute(const ServiceRequest& request, WorkerBuffers& buffers, RefreshRequest* refresh,
               RefreshRecord* record);
  void Finish(uint64_t id, RefreshRecord record);  // lock not held
  // Copies `bytes` between `host` and `opened` at `region_offset` (copy_through_link, else one
  // CopyChunk); lock not held.
  absl::Status CopyRegion(const RegionCache::Opened& opened, const copy::RegionSpec& spec,
                          copy::Direction direction, uint64_t region_offset, uint8_t* host,
                          uint64_t bytes) const;
  // OUT_OF_RANGE / RESOURCE_EXHAUSTED when a new refresh would pass a bound; lock held.
  absl::Status AdmitLocked(const ServiceRequest& request, const RefreshLayout& layout) const;
  // Execute, with a failed allocation turned into the refresh's RESOURCE_EXHAUSTED.
  void ExecuteGuarded(const ServiceRequest& request, WorkerBuffers& buffers,
                      RefreshRequest* refresh, RefreshRecord* record);
  // A name as seen by one owner: "<uid>:<name>" (the uid has no ':').
  static std::string Scoped(int64_t owner_uid, const std::string& name);
  // A random id not in use; mu_ held.
  uint64_t NewIdLocked() const;
  // The entry `id` when `owner_uid` may see it, else nullptr; mu_ held.
  const Entry* FindEntryLocked(uint64_t id, int64_t owner_uid) const;
  // Forgets expired results, then results past `owner`'s budget, then the largest holder's
  // oldest past max_results.
  void EvictResultsLocked(double now, int64_t owner);
  void EraseResultLocked(uint64_t id);
  // Forgets projectors past `owner`'s budget, then the largest holder's least recently used
  // past the totals.
  void EvictHistoryLocked(int64_t owner);
  // The least recently used history entry of `owner` (holding a projector when
  // `with_projector`), or history_.end().
  std::map<std::string, History>::iterator LeastRecentLocked(int64_t owner, bool with_projector);
  void EraseHistoryLocked(std::map<std::string, History>::iterator it);
  // A new projector (or none) for a history entry: keeps the byte counts.
  void SetProjectorLocked(History& h, std::shared_ptr<const std::vector<uint8_t>> projector);
  void UpdateQueueGaugeLocked();
  // Counts one more waiter of `owner_uid`, or RESOURCE_EXHAUSTED naming the bound; mu_ held.
  absl::Status AdmitWaiterLocked(int64_t owner_uid);
  void ForgetWaiterLocked(int64_t owner_uid);
  double Now() const;
  // `options` with the clock defaulted and the region cache reading it.
  static RefreshServiceOptions WithClock(RefreshServiceOptions options);

  LapackSvdBackend own_lapack_;  // the cpu_backend when none was given
  RefreshServiceOptions options_;
  RegionCache regions_;
  std::mutex shutdown_mu_;  // serialises Shutdown calls
  mutable std::mutex mu_;
  std::condition_variable work_cv_;
  bool stopping_ = false;
  uint64_t tick_ = 0;
  FairRefreshQueue queue_;
  std::map<uint64_t, Entry> entries_;
  std::map<std::pair<std::string, int64_t>, uint64_t> by_key_;  // (Scoped parameter, step)
  std::map<std::string, std::vector<uint64_t>> by_batch_;       // by Scoped batch id, oldest first
  // (finish time, id) of finished results held, oldest first, by caller uid.
  std::map<int64_t, std::deque<std::pair<double, uint64_t>>> finished_by_uid_;
  size_t finished_count_ = 0;
  std::map<std::string, History> history_;                      // by Scoped parameter
  uint64_t history_bytes_ = 0;
  std::map<int64_t, uint64_t> history_bytes_by_uid_;  // projector bytes held, by owner
  std::map<int64_t, size_t> parameters_by_uid_;       // history entries, by owner
  size_t unfinished_ = 0;                        // queued or running
  std::map<int64_t, size_t> unfinished_by_uid_;  // the same, by caller uid
  std::map<int64_t, size_t> waiters_by_uid_;     // counted WhenFinished callbacks, by owner
  size_t waiters_total_ = 0;
  std::vector<std::thread> workers_;
};

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_REFRESH_SERVICE_H_
