// RefreshService: the daemon's GaLore projector refresh service below the RPC layer.
//
// Submit() validates a ServiceRequest (service_request.h) and queues it; it returns at once.
// Keys are (job_id, parameter_id, step) per caller uid. A second submission of a key (the ranks
// of a data-parallel job on one node, or a micro-batch resubmitting) is queued behind the first
// and, when its turn comes, its own gradient is read and its SHA-256 compared with the first's:
// bitwise the same (and the same request parameters) -> it takes the first's outcome, P copied
// byte for byte into its own region ("deduplicated": one SVD for all of them); different -> it
// is computed on its own, without the parameter's history ("content mismatch"). So two
// submissions of one key never share a result unless their gradients are identical. Worker threads take refreshes from a
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
// invalid_input (the refresh's INVALID_ARGUMENT, e.g. NaN in G) | error | cancelled,
// offloadd_projector_refresh_sources_total{source} with source computed (an SVD ran) |
// deduplicated (took a first submission's outcome), offloadd_projector_content_mismatches_total
// (a repeated key whose gradient differed, computed on its own).
//
// Thread-safe. Callbacks given to WhenFinished run on a worker thread (or the caller's, for a
// refresh already finished) without the service's lock held; they must not block for long.
#ifndef OFFLOADD_SERVER_PROJECTOR_REFRESH_SERVICE_H_
#define OFFLOADD_SERVER_PROJECTOR_REFRESH_SERVICE_H_

#include <array>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "server/base/log_limiter.h"
#include "server/copy/copy_engine.h"
#include "server/projector/lapack_backend.h"
#include "server/projector/projector.h"
#include "server/projector/refresh_queue.h"
#include "server/projector/region_cache.h"
#include "server/projector/service_request.h"

namespace offloadd::projector {

enum class RefreshState { kQueued = 0, kRunning = 1, kDone = 2, kFailed = 3 };

// SHA-256 of a gradient's bytes as read (row-major, its dtype).
using GradientDigest = std::array<uint8_t, 32>;
GradientDigest DigestOf(const uint8_t* data, uint64_t bytes);

// What GetResult reports about one refresh.
struct RefreshRecord {
  uint64_t id = 0;
  std::string job_id;
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

  // A repeated key (see the top of this file): `deduplicated` when this refresh took the outcome
  // of refresh `shared_from_id` (its P, skip, degenerate or invalid-input verdict) because its
  // gradient was bitwise the same; `content_mismatch` when the first submission's gradient (or
  // request parameters) differed, so this one was computed on its own.
  bool deduplicated = false;
  bool content_mismatch = false;
  uint64_t shared_from_id = 0;
  bool digest_known = false;        // G was read; gradient_digest is its SHA-256
  GradientDigest gradient_digest{};

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
  std::string gpu_backend_name;  // its name for stats ("cusolver")
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

  // Queues a refresh; for a key already submitted, a new refresh bound to the first one
  // (deduplicated = true: it takes the first one's outcome if its gradient is bitwise the same,
  // see above). Errors: ValidateServiceRequest's; OUT_OF_RANGE when the
  // refresh would need more than max_refresh_bytes; RESOURCE_EXHAUSTED past the queue bounds;
  // FAILED_PRECONDITION
  // when `step` is older than a step of this parameter that has already started (steps must
  // increase; set reset_history to start over); UNAVAILABLE after Shutdown.
  absl::StatusOr<SubmitOutcome> Submit(const ServiceRequest& request) EXCLUDES(mu_);

  // Names are scoped by owner: a refresh belongs to the caller_uid that submitted it, and its
  // parameter_id, step and batch_id name it only for that uid (another uid's refresh with the
  // same key is a different refresh, with its own history and step order). `owner_uid`: the
  // caller's uid (-1 = unknown credentials); kAnyOwner skips the check (tests, internal).
  // Ids are random 64-bit values (getrandom), so one user cannot guess another's.
  static constexpr int64_t kAnyOwner = INT64_MIN;

  // NOT_FOUND when unknown, expired, or another owner's (the same message for each).
  absl::StatusOr<RefreshRecord> Get(uint64_t id, int64_t owner_uid = kAnyOwner) const EXCLUDES(mu_);
  // The first refresh submitted for the key.
  absl::StatusOr<uint64_t> Find(int64_t owner_uid, const std::string& job_id,
                                const std::string& parameter_id, int64_t step) const
      EXCLUDES(mu_);
  // Ids `owner_uid` submitted with this batch id and still held (oldest first); empty when none.
  std::vector<uint64_t> BatchIds(int64_t owner_uid, const std::string& batch_id) const
      EXCLUDES(mu_);

  // Calls `done` exactly once with the record when refresh `id` has finished (kDone or
  // kFailed) — at once, on this thread, if it already has. NOT_FOUND when unknown (or
  // another owner's); RESOURCE_EXHAUSTED (done is not called) when `owner_uid` already has
  // max_waiters_per_uid callbacks waiting, or the service max_waiters.
  absl::Status WhenFinished(uint64_t id, int64_t owner_uid,
                            std::function<void(const RefreshRecord&)> done) EXCLUDES(mu_) {
    return WhenFinished(id, owner_uid, std::move(done), nullptr);
  }
  // As above; `*waiter` (when not null) is set to a token for CancelWait, or 0 when `done` was
  // called at once.
  absl::Status WhenFinished(uint64_t id, int64_t owner_uid,
                            std::function<void(const RefreshRecord&)> done, uint64_t* waiter)
      EXCLUDES(mu_);
  // Withdraws a callback WhenFinished is holding (a call cancelled or past its deadline): its
  // slot under max_waiters / max_waiters_per_uid is free at once and `done` is never called.
  // Returns false when it is no longer held (the refresh finished: `done` has run or is
  // running). Any thread; not from inside `done`.
  bool CancelWait(uint64_t id, uint64_t waiter) EXCLUDES(mu_);
  absl::Status WhenFinished(uint64_t id, std::function<void(const RefreshRecord&)> done)
      EXCLUDES(mu_) {
    return WhenFinished(id, kAnyOwner, std::move(done));
  }
  // Blocks until refresh `id` has finished (tests, benchmarks).
  absl::StatusOr<RefreshRecord> Wait(uint64_t id) EXCLUDES(mu_);

  // Stops taking work: queued refreshes fail with UNAVAILABLE (their waiters are told), running
  // ones finish, workers are joined. Idempotent.
  void Shutdown() EXCLUDES(shutdown_mu_);

  struct Stats {
    size_t queued = 0, running = 0, results_held = 0, parameters_held = 0;
    uint64_t history_bytes = 0;
    size_t regions_cached = 0;
    uint64_t region_opens_total = 0;
    // Since start: refreshes whose SVD ran (a first submission, or a repeated key computed on
    // its own), repeated keys that took the first one's outcome, and repeated keys whose
    // gradient (or parameters) differed from the first one's (these are in computed_total).
    uint64_t computed_total = 0;
    uint64_t deduplicated_total = 0;
    uint64_t content_mismatches_total = 0;
    std::string backend;  // "lapack", or "lapack+<gpu backend>" with gpu_backend_for set
    bool cuda_regions = false;  // CUDA IPC regions can be opened (a cuda engine was given)
  };
  Stats stats() const EXCLUDES(mu_);

 private:
  struct History {
    std::shared_ptr<const std::vector<uint8_t>> projector;  // as written; null = none
    int64_t projector_rows = 0, projector_cols = 0;
    DType dtype = DType::kFloat32;
    VectorSide side = VectorSide::kLeft;
    int64_t last_started_step = -1;
    int64_t projector_step = -1;         // the step whose refresh wrote `projector`
    GradientDigest projector_digest{};   // and its gradient's SHA-256
    LazyRefreshState lazy;
    uint64_t last_used = 0;  // LRU tick
    int64_t owner = -1;      // caller uid
  };
  struct Entry {
    RefreshRecord record;
    ServiceRequest request;  // cleared once finished
    double submitted_at = 0;
    struct Waiter {
      uint64_t token = 0;     // CancelWait's
      int64_t owner_uid = kAnyOwner;  // counted in waiters_by_uid_ unless kAnyOwner
      std::function<void(const RefreshRecord&)> done;
    };
    std::vector<Waiter> waiters;
    int64_t caller_uid = -1;  // counted in unfinished_by_uid_ until finished
    std::string parameter;    // ParameterKey: its queue and history name
    uint64_t primary_id = 0;  // a repeated key: the key's first refresh (0: this is the first)
    std::string signature;    // the request parameters that must match for sharing
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
    // A repeated key: the first refresh's finished record (when still held), whether the
    // request parameters match it, and the P it wrote (from the history, when still there).
    bool attached = false;
    absl::optional<RefreshRecord> primary;
    bool same_signature = false;
    std::shared_ptr<const std::vector<uint8_t>> shared;
  };

  // One worker: pops refreshes in the queue's fair order until Shutdown.
  void WorkerLoop(int index) EXCLUDES(mu_);
  // Marks `item` running, updates its parameter's history and takes the lazy decision.
  Started StartLocked(const FairRefreshQueue::Item& item) REQUIRES(mu_);
  // StartLocked for a repeated key: what the first refresh of the key left.
  void StartAttachedLocked(const Entry& e, const FairRefreshQueue::Item& item, Started& s)
      REQUIRES(mu_);
  // Runs a repeated key: reads its G, takes the first refresh's outcome when G is bitwise the
  // same (TakePrimaryOutcome), else computes it on its own, without history.
  void RunAttached(Started& s, WorkerBuffers& buffers) EXCLUDES(mu_);
  // The first refresh's outcome into s.record (P written to this request's region); false when
  // it cannot be taken (its P is no longer held, or it failed for a reason of its own).
  bool TakePrimaryOutcome(Started& s, const RefreshLayout& layout) EXCLUDES(mu_);
  // Queues an entry for `request` (a repeated key when primary_id != 0); returns its id.
  uint64_t AddEntryLocked(const ServiceRequest& request, const RefreshLayout& layout,
                          const std::string& parameter, uint64_t primary_id) REQUIRES(mu_);
  // Runs (or skips) the refresh outside the lock; returns the projector bytes written (empty if
  // none) and fills s.record's outcome and elapsed time.
  std::vector<uint8_t> Run(Started& s, WorkerBuffers& buffers) EXCLUDES(mu_);
  // Keeps a finished refresh's projector and lazy state in the history.
  void RecordOutcomeLocked(const FairRefreshQueue::Item& item, const Started& s,
                           std::vector<uint8_t> written) REQUIRES(mu_);
  // Opens, checks and reads the gradient into buffers (lock not held); returns the host copy of
  // G. NOT_FOUND / PERMISSION_DENIED / OUT_OF_RANGE / the copy's status, each naming the region.
  absl::StatusOr<uint8_t*> ReadGradient(const ServiceRequest& request, const RefreshLayout& layout,
                                        WorkerBuffers& buffers) EXCLUDES(mu_);
  // Opens, checks and writes `projector_bytes` into the projector region (lock not held);
  // statuses as above.
  absl::Status WriteProjector(const ServiceRequest& request, const RefreshLayout& layout,
                              std::vector<uint8_t>& projector_bytes) EXCLUDES(mu_);
  // Runs one refresh outside the lock: reads G, fills and runs *refresh (whose
  // previous_projector the caller has set), writes P; fills *record (state kDone or kFailed).
  void Execute(const ServiceRequest& request, WorkerBuffers& buffers, RefreshRequest* refresh,
               RefreshRecord* record);
  // Execute after G was read into `g`: the SVD and P written.
  void Compute(const ServiceRequest& request, const RefreshLayout& layout, uint8_t* g,
               WorkerBuffers& buffers, RefreshRequest* refresh, RefreshRecord* record);
  void Finish(uint64_t id, RefreshRecord record) EXCLUDES(mu_);  // lock not held
  // Copies `bytes` between `host` and `opened` at `region_offset` (copy_through_link, else one
  // CopyChunk); lock not held.
  absl::Status CopyRegion(const RegionCache::Opened& opened, const copy::RegionSpec& spec,
                          copy::Direction direction, uint64_t region_offset, uint8_t* host,
                          uint64_t bytes) const EXCLUDES(mu_);
  // OUT_OF_RANGE / RESOURCE_EXHAUSTED when a new refresh would pass a bound; lock held.
  absl::Status AdmitLocked(const ServiceRequest& request, const RefreshLayout& layout) const
      REQUIRES(mu_);
  // Runs `body`, with a failed allocation turned into the refresh's RESOURCE_EXHAUSTED.
  static void Guarded(RefreshRecord* record, const std::function<void()>& body);
  // A name as seen by one owner: "<uid>:<name>" (the uid has no ':').
  static std::string Scoped(int64_t owner_uid, const std::string& name);
  // A parameter's queue and history name: uid, job and parameter id, unambiguously joined.
  static std::string ParameterKey(int64_t owner_uid, const std::string& job_id,
                                  const std::string& parameter_id);
  // A random id not in use; mu_ held.
  uint64_t NewIdLocked() const REQUIRES(mu_);
  // The entry `id` when `owner_uid` may see it, else nullptr; mu_ held.
  const Entry* FindEntryLocked(uint64_t id, int64_t owner_uid) const REQUIRES(mu_);
  // Forgets expired results, then results past `owner`'s budget, then the largest holder's
  // oldest past max_results.
  void EvictResultsLocked(double now, int64_t owner) REQUIRES(mu_);
  void EraseResultLocked(uint64_t id) REQUIRES(mu_);
  // Forgets projectors past `owner`'s budget, then the largest holder's least recently used
  // past the totals.
  void EvictHistoryLocked(int64_t owner) REQUIRES(mu_);
  // Forgets the least recently used entries of the uid holding the most until at most `keep`
  // remain (max_parameters; one less before a new parameter is added).
  void ForgetParametersPastLocked(size_t keep) REQUIRES(mu_);
  // The least recently used history entry of `owner` (holding a projector when
  // `with_projector`), or history_.end(): from by_use_, without scanning the history.
  std::map<std::string, History>::iterator LeastRecentLocked(int64_t owner, bool with_projector)
      REQUIRES(mu_);
  // Marks `it` used now (a new LRU tick, kept in by_use_).
  void TouchLocked(std::map<std::string, History>::iterator it) REQUIRES(mu_);
  void EraseHistoryLocked(std::map<std::string, History>::iterator it) REQUIRES(mu_);
  // A new projector (or none) for a history entry: keeps the byte counts.
  void SetProjectorLocked(History& h, std::shared_ptr<const std::vector<uint8_t>> projector)
      REQUIRES(mu_);
  void UpdateQueueGaugeLocked() REQUIRES(mu_);
  // Counts one more waiter of `owner_uid`, or RESOURCE_EXHAUSTED naming the bound; mu_ held.
  absl::Status AdmitWaiterLocked(int64_t owner_uid) REQUIRES(mu_);
  void ForgetWaiterLocked(int64_t owner_uid) REQUIRES(mu_);
  double Now() const;
  // `options` with the clock defaulted and the region cache reading it.
  static RefreshServiceOptions WithClock(RefreshServiceOptions options);

  LapackSvdBackend own_lapack_;  // the cpu_backend when none was given
  base::LogLimiter failure_log_{1.0};  // a failed refresh's WARNING: one a second at most
  const bool cuda_regions_;
  RefreshServiceOptions options_;
  RegionCache regions_;
  base::Mutex shutdown_mu_;  // serialises Shutdown calls
  mutable base::Mutex mu_;
  base::CondVar work_cv_;
  bool stopping_ GUARDED_BY(mu_) = false;
  uint64_t tick_ GUARDED_BY(mu_) = 0;
  FairRefreshQueue queue_ GUARDED_BY(mu_);
  std::map<uint64_t, Entry> entries_ GUARDED_BY(mu_);
  // (ParameterKey, step) -> the key's first refresh
  std::map<std::pair<std::string, int64_t>, uint64_t> by_key_ GUARDED_BY(mu_);
  // By Scoped batch id, oldest first
  std::map<std::string, std::vector<uint64_t>> by_batch_ GUARDED_BY(mu_);
  // (finish time, id) of finished results held, oldest first, by caller uid.
  std::map<int64_t, std::deque<std::pair<double, uint64_t>>> finished_by_uid_ GUARDED_BY(mu_);
  size_t finished_count_ GUARDED_BY(mu_) = 0;
  // By ParameterKey
  std::map<std::string, History> history_ GUARDED_BY(mu_);
  uint64_t computed_total_ GUARDED_BY(mu_) = 0;
  uint64_t deduplicated_total_ GUARDED_BY(mu_) = 0;
  uint64_t content_mismatches_total_ GUARDED_BY(mu_) = 0;
  uint64_t history_bytes_ GUARDED_BY(mu_) = 0;
  // Projector bytes held, by owner
  std::map<int64_t, uint64_t> history_bytes_by_uid_ GUARDED_BY(mu_);
  std::map<int64_t, size_t> parameters_by_uid_ GUARDED_BY(mu_);  // history entries, by owner
  // Owner -> LRU tick -> ParameterKey of every history entry (History::last_used).
  std::map<int64_t, std::map<uint64_t, std::string>> by_use_ GUARDED_BY(mu_);
  size_t unfinished_ GUARDED_BY(mu_) = 0;                        // queued or running
  std::map<int64_t, size_t> unfinished_by_uid_ GUARDED_BY(mu_);  // the same, by caller uid
  // Counted WhenFinished callbacks, by owner
  std::map<int64_t, size_t> waiters_by_uid_ GUARDED_BY(mu_);
  size_t waiters_total_ GUARDED_BY(mu_) = 0;
  uint64_t next_waiter_token_ GUARDED_BY(mu_) = 1;
  std::vector<std::thread> workers_ GUARDED_BY(shutdown_mu_);
};

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_REFRESH_SERVICE_H_
