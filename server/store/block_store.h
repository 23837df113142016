// BlockStore: offloaded blocks (block id -> pool extent, owner session, state) and admission of
// new offloads into the pool.
//
// Admission (back-pressure): an offload that does not fit — the pool has no free extent large
// enough, or the owner's session quota or its uid's quota (all sessions of one user together)
// would be exceeded — waits in a bounded queue until space
// is released or its deadline passes (then RESOURCE_EXHAUSTED). When the queue is full a new
// request fails with RESOURCE_EXHAUSTED at once. Waiters are admitted in arrival order among
// those that fit (a small request may pass a large one that still does not fit; the deadline
// bounds how long the large one waits); a new request that fits is admitted at once. Nothing
// is ever evicted to make room.
//
// Block lifecycle:  Reserve -> kOffloading --(copy ok)--> kResident --(Release)--> freed
//                                         \--(copy failed)--> freed
// Reloads may be requested while kOffloading: they start when the offload's copy completes, so a
// reload always returns the offloaded bytes. A block released (or whose session ended) while
// copies are running is freed when the last of them finishes.
//
// Block ids are random 64-bit values (never 0) and scoped to the owning session: another
// session naming them gets NOT_FOUND, exactly as for an id that never existed.
//
// Shared pool (constructed with a BlockTable, pool/block_table.h): every block also holds a
// record slot, taken at admission (a full table is a full pool). The record is written when the
// offload's copy completed, before OffloadFinished returns (so before the client is told
// OffloadDone), and cleared as soon as the block is released, before its extent can be reused.
// After Stop() records are no longer cleared: the blocks of sessions closed by a shutdown are
// handed over to the next daemon. Adopt() takes the blocks a previous daemon recorded: they
// belong to no session until a session presenting the same resume key takes them
// (ResumeSession), and those not taken within the grace period are freed.
//
// Spill tier (constructed with a spill::SpillTier; docs/spill.md): a block has a
// tier besides its state —
//   kPool --(spill starts)--> kSpilling --(write ok)--> kDisk --(stage starts)--> kStaging
//     ^                           |  (failed, cancelled)           (read ok)  |      |
//     +---------------------------+--------------------------------<---------+      |
//                                                           (DATA_LOSS) kLost <-----+
// Policy: when the pool's used bytes (less those being spilled), plus offloads waiting for pool
// space and reloads waiting to stage back, exceed spill_high_water_fraction of the pool,
// resident blocks are spilled, the one whose reload is expected last first. Expected reload
// order: by OrderHint step, and within a step in reverse of position (backward reloads the
// activations of a step last-offloaded first), so (step ascending, position descending); blocks
// without a hint count as step 0 with their admission order as position. Spills free pool
// extents; waiting offloads are admitted to the pool as space frees (never straight to disk).
// A reload of a block on disk stages it back at once (URGENT on the disk link; one whose
// stage-back is already queued at PREFETCH is promoted to URGENT). When the pool has no room
// for it the stage-back waits for space and gets it first: until it has started, no offload
// (waiting or new, even one that fits) is admitted and no stage-ahead starts, and spills
// continue until it fits (a spill cancelled by a reload is replaced by another). When it has
// waited admission_deadline_seconds and no spill is under way (the disk is full, or nothing in
// the pool can be spilled), its reloads fail with RESOURCE_EXHAUSTED and the block stays on disk
// (a later reload tries again); while a spill is under way it waits on. Every reload
// of block k (any tier) also stages back the next stage_ahead_blocks blocks of the session in
// expected order that are on disk (PREFETCH), while that keeps the pool under the high-water
// mark. A reload of a block being spilled is served from the pool and cancels the spill.
// Quotas count a block's bytes in either tier. A spill file removed or truncated under the
// daemon makes that block kLost: its reloads get DATA_LOSS until it is released. Disk full
// (SpillTier::TryReserve fails, or ENOSPC) stops spilling: offloads then wait for pool space
// up to their deadline (RESOURCE_EXHAUSTED), and nothing stored is lost. With a shared pool a
// block's record keeps naming its extent while the spill runs, is marked spilled once the file
// is complete and synced (before the extent is freed), and names the new extent once a
// stage-back completed (before the file is removed): a restarted daemon adopts blocks in both
// tiers (Adopt), and removes only spill files no record names (RemoveUnnamedSpillFiles). Extents
// are sized in multiples of 4096 bytes so the disk moves them with O_DIRECT directly.
//
// Thread-safety: every method is thread-safe. Callbacks run without the store's lock held, on
// the calling thread, the thread that released space, or the store's deadline thread.
#ifndef OFFLOADD_SERVER_STORE_BLOCK_STORE_H_
#define OFFLOADD_SERVER_STORE_BLOCK_STORE_H_

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "server/pool/arena.h"
#include "server/pool/block_table.h"
#include "server/pool/extent_allocator.h"
#include "server/pool/sliced_allocator.h"
#include "server/spill/spill_tier.h"

namespace offloadd::store {

struct BlockStoreOptions {
  uint64_t session_quota_bytes = 0;         // 0 = no per-session quota
  // All sessions of one uid together (sessions given an owner with SetSessionOwner); 0 = none.
  uint64_t uid_quota_bytes = 0;
  double admission_deadline_seconds = 5.0;  // how long an offload may wait for space
  uint32_t admission_queue_limit = 1024;    // offloads waiting at once, whole daemon
  // Spill tier only: spill when the pool is fuller than this fraction, in (0, 1].
  double spill_high_water_fraction = 0.9;
  // Spill tier only: blocks staged back ahead of each reload (0 = only on demand).
  uint32_t stage_ahead_blocks = 2;
  // Time of admission deadlines, queue waits and the adoption grace (not owned; must outlive
  // the store); null = base::Clock::Real(). Tests pass a base::FakeClock.
  base::Clock* clock = nullptr;
};

// Where an offloaded block falls in the client's reload order (Offload's ordering hint):
// training step, and position within the step (offload order). Backward reloads a step's
// blocks in reverse of position.
struct OrderHint {
  bool valid = false;
  uint64_t step = 0;
  uint64_t position = 0;
};

// Where an admitted block's bytes live.
struct BlockRef {
  uint64_t block_id = 0;
  uint64_t bytes = 0;       // requested size
  pool::Extent extent;      // its extent in the arena
  double queued_seconds = 0;  // time spent waiting for space
};

// One NUMA slice of the pool (pool/arena.h ArenaSlice) and its allocated bytes (rounded extents).
struct NumaSliceUsage {
  int numa_node = -1;  // -1: the pool is not sliced
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
};

struct StoreStats {
  pool::AllocatorStats pool;
  uint64_t blocks = 0;
  uint64_t offloads_waiting = 0;
  uint64_t offloads_refused_total = 0;  // RESOURCE_EXHAUSTED from admission
  uint64_t adopted_blocks_waiting = 0;  // adopted, not yet taken by a resumed session
  uint64_t adopted_blocks_expired_total = 0;  // freed: the grace period passed
  uint64_t sessions_resumed_total = 0;
  uint64_t blocks_resumed_total = 0;
  // Spill tier (all 0 without one). Bytes are rounded extents.
  uint64_t disk_bytes = 0;       // blocks whose bytes are only on disk (kDisk, kLost, kStaging)
  uint64_t spilling_bytes = 0;   // being written to disk (still in the pool)
  uint64_t staging_bytes = 0;    // being read back into the pool
  uint64_t disk_blocks = 0;
  uint64_t spilled_blocks_total = 0, staged_blocks_total = 0;
  uint64_t spill_failures_total = 0;   // spills that failed (the block stayed in the pool)
  uint64_t spill_refused_disk_full_total = 0;  // spills not started: the disk was full
  uint64_t reloads_from_disk_total = 0;  // reloads that found their block on disk
  // Stage-backs ahead of need (PREFETCH) raised to URGENT because a reload came for the block.
  uint64_t stages_promoted_total = 0;
  // Urgent stage-backs that found no pool space within the admission deadline while nothing
  // was being spilled (disk full, or nothing spillable): their reloads got RESOURCE_EXHAUSTED.
  uint64_t stages_expired_total = 0;
  double reload_disk_wait_seconds_total = 0;  // their summed wait for the stage-back
  uint64_t blocks_lost_total = 0;  // spill files removed or truncated under the daemon
  // Urgent stage-backs waiting for pool space now (see the spill policy above).
  uint64_t stages_waiting = 0;
  // NUMA placement: allocations per outcome (pool/sliced_allocator.h;
  // adoption not counted) and each slice's bytes, in pool order (one slice of node -1 when the
  // pool is not sliced).
  pool::PlacementCounts placement;
  std::vector<NumaSliceUsage> numa_slices;
};

class BlockStore {
 public:
  using ReserveCallback = std::function<void(absl::StatusOr<BlockRef>)>;
  using ReadableCallback = std::function<void(absl::StatusOr<BlockRef>)>;

  // `table`: the shared pool's block records (not owned), or null for an anonymous pool.
  // `spill`: the spill tier (not owned; must outlive the store), or null for none.
  // A pool of `capacity_bytes` in one unbound slice (no NUMA placement).
  BlockStore(uint64_t capacity_bytes, BlockStoreOptions options,
             pool::BlockTable* table = nullptr, spill::SpillTier* spill = nullptr);
  // A pool laid out in `slices` (Arena::slices(): in offset order, covering the pool). With
  // slices bound to NUMA nodes, each offload and stage-back of a session goes to the slice of
  // the session's node (SetSessionNumaNode) and falls back to another slice with a counted
  // reason (pool/sliced_allocator.h); reloads read wherever the block is. A block must fit in
  // one slice: larger ones get OUT_OF_RANGE.
  BlockStore(std::vector<pool::ArenaSlice> slices, BlockStoreOptions options,
             pool::BlockTable* table = nullptr, spill::SpillTier* spill = nullptr);
  ~BlockStore();  // Stop()

  // Fails every waiting offload, and every reload waiting for pool space to stage back, with
  // UNAVAILABLE (shutdown), finishes the spill tier's queued transfers (SpillTier::Shutdown)
  // and stops the deadline thread; no store callback runs on that thread afterwards; no spill
  // starts afterwards. Idempotent. Offloads reserved after Stop
  // are still admitted when they fit, but no longer wait for space.
  void Stop() EXCLUDES(stop_mu_);

  // Records the uid a session belongs to, for uid_quota_bytes (call before its first Reserve;
  // sessions without an owner are not subject to the uid quota).
  void SetSessionOwner(uint64_t session_id, uint32_t uid) EXCLUDES(mu_);
  // Records the key of the session's resume token, written into its blocks' records (call
  // before its first Reserve; without one the records carry an all-zero key, which no token
  // hashes to in practice).
  void SetSessionResumeKey(uint64_t session_id, const pool::ResumeKey& key) EXCLUDES(mu_);
  // Records the NUMA node of the session's GPU (sched::TopologyGpu::numa_node; -1 unknown), whose
  // slice takes its blocks (call before its first Reserve; without it the node is unknown and
  // a sliced pool places its blocks as "unknown_node"). Forgotten with ReleaseSession.
  void SetSessionNumaNode(uint64_t session_id, int numa_node) EXCLUDES(mu_);

  // Takes the blocks of a previous daemon (BlockTable::Adopt's valid records) as resident blocks
  // of no session, held `grace_seconds`; then those not resumed are freed (and counted). Call
  // once, before any Reserve. Returns the number adopted (a record whose extent cannot be
  // allocated is cleared and not adopted; BlockTable::Adopt already drops overlaps).
  // A record marked spilled (pool::StoredBlock::spilled) is adopted on the disk tier when its
  // spill file exists with the right size (SpillTier::AdoptFile); a missing or short file, or a
  // daemon without a spill tier, adopts it as lost: its resumed session gets DATA_LOSS for that
  // block only.
  uint64_t Adopt(const std::vector<pool::StoredBlock>& blocks, double grace_seconds) EXCLUDES(mu_);
  // Unlinks the spill files no block of this store names (a previous daemon's files whose record
  // was not adopted). Call once after Adopt (or instead of it), before any Reserve. Returns how
  // many were removed.
  int RemoveUnnamedSpillFiles() EXCLUDES(mu_);
  // Remembers the block ids adoption dropped (BlockTable::Adopt's dropped_blocks): a reload or
  // release naming one, from the session resumed with the resume key its record names, then
  // fails with DATA_LOSS (the block was stored and is lost) instead of NOT_FOUND; any other
  // session gets NOT_FOUND, as for an id it never held. Kept for the daemon's life (at most one
  // per record slot).
  void MarkLost(const std::vector<pool::DroppedBlock>& dropped) EXCLUDES(mu_);
  // Gives the adopted blocks recorded under `key` to `session_id` (same block ids). `uid`: the
  // presenting peer's uid, pool::kUnknownUid when unknown; it must equal the owner recorded.
  // Returns the number of blocks taken. Errors: NOT_FOUND when no adopted block has that key
  // (never issued, already resumed, or expired); PERMISSION_DENIED for another uid.
  // `block_ids` (optional) receives the ids taken.
  absl::StatusOr<uint64_t> ResumeSession(uint64_t session_id, const pool::ResumeKey& key,
                                         uint32_t uid, std::vector<uint64_t>* block_ids = nullptr)
      EXCLUDES(mu_);

  // Admits an offload of `bytes` for `session_id`; `done` gets the new block (state
  // kOffloading) or an error: INVALID_ARGUMENT for 0 bytes; OUT_OF_RANGE when bytes exceed the
  // pool capacity, the session quota or the uid quota (it can never fit); RESOURCE_EXHAUSTED
  // when the wait queue is full or the deadline passed (the message says whether the pool or a
  // quota was full). `hint`: where the block falls in the reload order (spill tier policy).
  void Reserve(uint64_t session_id, uint64_t bytes, ReserveCallback done, OrderHint hint = {})
      EXCLUDES(mu_);

  // The offload copy of a block finished: kResident on success; on failure the block is freed.
  // Runs reloads that were waiting for it (with the block, or the copy's error).
  // `data_crc32c`: the CRC32C of the block's bytes as they landed in the pool (the caller
  // computes it outside the store's lock, with pool_data_checksums); kept with the block and
  // written in its record wherever the block is recorded, so a restart can check the data.
  void OffloadFinished(uint64_t block_id, const absl::Status& copy_status,
                       std::optional<uint32_t> data_crc32c = std::nullopt) EXCLUDES(mu_);

  // Starts a reload of a block of `session_id`: `ready` is called with the block once its bytes
  // are in the pool (at once if resident). The block stays allocated until EndReload.
  // A block on disk is staged back first (URGENT); `ready` gets DATA_LOSS when its spill file
  // was removed or truncated, UNAVAILABLE at shutdown, RESOURCE_EXHAUSTED when the pool had no
  // room for it within admission_deadline_seconds and nothing could be spilled (block kept).
  // Errors (returned, `ready` not called): NOT_FOUND for an unknown block or one of another
  // session; FAILED_PRECONDITION when the block has been released; DATA_LOSS for a block whose
  // spill file was lost before.
  absl::Status BeginReload(uint64_t session_id, uint64_t block_id, ReadableCallback ready)
      EXCLUDES(mu_);
  // A reload started with BeginReload finished; `release` frees the block afterwards.
  void EndReload(uint64_t block_id, bool release) EXCLUDES(mu_);

  // Releases a block of `session_id`. NOT_FOUND for unknown / foreign / already released ids.
  absl::Status Release(uint64_t session_id, uint64_t block_id) EXCLUDES(mu_);
  // Releases every block of the session and fails its waiting offloads with CANCELLED; forgets
  // its owner. Returns the number of blocks released.
  uint64_t ReleaseSession(uint64_t session_id) EXCLUDES(mu_);

  // Bytes (rounded extents) held by a session, and blocks held.
  uint64_t SessionUsedBytes(uint64_t session_id) const EXCLUDES(mu_);
  uint64_t SessionBlocks(uint64_t session_id) const EXCLUDES(mu_);
  // Bytes (rounded extents) held by each uid's sessions, for uids holding any.
  std::map<uint32_t, uint64_t> UidUsedBytes() const EXCLUDES(mu_);
  StoreStats stats() const EXCLUDES(mu_);
  // The pool's bytes (every slice's); fixed at construction, so read without the lock.
  uint64_t capacity_bytes() const { return capacity_bytes_; }
  // True on a shared pool (constructed with a BlockTable): confirmed blocks outlive the daemon.
  bool survives_restart() const { return table_ != nullptr; }

 private:
  enum class State { kOffloading, kResident };
  enum class Tier { kPool, kSpilling, kDisk, kStaging, kLost };
  // Expected reload order: ascending.
  struct ReloadKey {
    uint64_t step, reverse_position;
    bool operator<(const ReloadKey& o) const {
      return step != o.step ? step < o.step : reverse_position < o.reverse_position;
    }
  };
  struct Block {
    uint64_t session_id;  // kAdoptedSession: adopted, not yet resumed
    int64_t owner_uid;  // -1: none
    uint64_t bytes;
    pool::Extent extent;
    State state;
    int reloads_in_flight = 0;
    bool released = false;  // free when the last copy finishes
    bool offload_failed = false;
    std::vector<ReadableCallback> waiting_reloads;
    uint32_t slot = 0;      // record slot (shared pool only)
    bool recorded = false;  // its record is written
    pool::ResumeKey resume_key{};
    std::optional<uint32_t> data_crc32c;  // of its bytes, with pool_data_checksums
    // Spill tier. `extent.bytes` stays the block's rounded size in every tier; `extent.offset`
    // is meaningful in kPool, kSpilling and kStaging only.
    Tier tier = Tier::kPool;
    ReloadKey key{0, 0};
    bool spill_cancelled = false;  // a reload came while kSpilling: keep it in the pool
    bool stage_pending = false;    // in pending_stages_
    bool stage_urgent = false;     // kStaging: the read is URGENT (else PREFETCH)
    double disk_wait_start = 0;    // a reload waits for its stage-back since (0 = none)
    double stage_deadline_at = 0;  // in pending_stages_: its reloads fail then (see above)
    std::string lost_reason;       // kLost: what the stage-back found (names the file)
  };
  static constexpr uint64_t kAdoptedSession = 0;
  struct Waiter {
    uint64_t session_id;
    uint64_t bytes;
    double enqueued_seconds;     // base::SteadyNowSeconds() at Reserve
    double deadline_at_seconds;  // absolute, on the same clock
    ReserveCallback done;
    OrderHint hint;
  };
  using Deferred = std::vector<std::function<void()>>;
  // Runs the callbacks collected under mu_, after it is released, and empties the list.
  static void RunAll(Deferred& deferred);

  // All *Locked methods require mu_.
  bool FitsLocked(uint64_t session_id, uint64_t bytes) const REQUIRES(mu_);
  bool QuotaFitsLocked(uint64_t session_id, uint64_t bytes) const REQUIRES(mu_);
  // The extent size a block of `bytes` takes (4096-multiples with a spill tier).
  uint64_t ExtentBytes(uint64_t bytes) const;
  // Whether a block may be freed now (no copy or disk transfer running on it).
  static bool IdleLocked(const Block& b);
  // Spill tier (block_store_spill.cc).
  void MaybeSpillLocked(Deferred* deferred) REQUIRES(mu_);
  void StartSpillLocked(uint64_t block_id, Block& b, Deferred* deferred) REQUIRES(mu_);
  void SpillFinished(uint64_t block_id, const absl::Status& st) EXCLUDES(mu_);
  // Allocates a pool extent and starts reading the block back; false when the pool has no room
  // (an urgent stage then waits in pending_stages_).
  bool StartStageLocked(uint64_t block_id, Block& b, bool urgent, Deferred* deferred) REQUIRES(mu_);
  void StageFinished(uint64_t block_id, const absl::Status& st) EXCLUDES(mu_);
  void StageAheadLocked(uint64_t session_id, Deferred* deferred) REQUIRES(mu_);
  // After pool space was freed: pending stages, then waiting offloads, then stage-ahead.
  void UsePoolSpaceLocked(uint64_t session_id, Deferred* deferred) REQUIRES(mu_);
  // Deadline thread: fails the reloads of urgent stage-backs past their deadline while no spill
  // is under way; returns the next such deadline (0 = none).
  double ExpireStagesLocked(double now, Deferred* deferred) REQUIRES(mu_);
  // (Re)writes the block's record: naming its extent, or marked spilled (its file is synced).
  void WriteRecordLocked(uint64_t block_id, Block& b, bool spilled = false) REQUIRES(mu_);
  // Adopt's step for a record marked spilled: the block goes to kDisk, or kLost without its file.
  void AdoptSpilledLocked(const pool::StoredBlock& r, Block& b) REQUIRES(mu_);
  uint64_t HighWaterBytesLocked() const REQUIRES(mu_);
  // Why a request does not fit now: "the pool is full", "the session quota ... is used", ...
  std::string WhyFullLocked(uint64_t session_id, uint64_t bytes) const REQUIRES(mu_);
  int64_t OwnerLocked(uint64_t session_id) const REQUIRES(mu_);
  // -1 when not recorded.
  int NumaNodeLocked(uint64_t session_id) const REQUIRES(mu_);
  BlockRef AdmitLocked(uint64_t session_id, uint64_t bytes, double enqueued_seconds) REQUIRES(mu_);
  void FreeLocked(uint64_t block_id, Deferred* deferred) REQUIRES(mu_);
  // Clears the block's record (shared pool; not after Stop, see above).
  void ForgetRecordLocked(Block& b) REQUIRES(mu_);
  void ExpireAdoptedLocked(Deferred* deferred) REQUIRES(mu_);
  void AdmitWaitersLocked(Deferred* deferred) REQUIRES(mu_);
  void DeadlineLoop() EXCLUDES(mu_);

  const BlockStoreOptions options_;
  base::Clock* const clock_;  // options_.clock, or the steady clock
  mutable base::Mutex mu_;
  base::CondVar deadline_cv_;
  pool::SlicedExtentAllocator allocator_ GUARDED_BY(mu_);
  // Set by the constructor from the slices and never changed (read without mu_).
  const uint64_t capacity_bytes_;
  uint64_t largest_slice_bytes_ = 0;  // a block must fit in one slice; set by the constructor
  std::unordered_map<uint64_t, int> session_numa_node_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, Block> blocks_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, uint64_t> session_used_bytes_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, uint64_t> session_blocks_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, uint32_t> session_owner_ GUARDED_BY(mu_);
  std::map<uint32_t, uint64_t> uid_used_bytes_ GUARDED_BY(mu_);
  std::deque<Waiter> waiters_ GUARDED_BY(mu_);
  uint64_t refused_total_ GUARDED_BY(mu_) = 0;
  // DATA_LOSS for a block id adoption dropped; OK otherwise. mu_ held.
  // DATA_LOSS when `block_id` was dropped at adoption and `session_id` resumed the session that
  // owned it (same resume key); OK otherwise (the caller answers NOT_FOUND).
  absl::Status LostLocked(uint64_t session_id, uint64_t block_id) const REQUIRES(mu_);
  pool::BlockTable* const table_;
  // Dropped at adoption (MarkLost)
  std::unordered_map<uint64_t, pool::DroppedBlock> lost_ GUARDED_BY(mu_);
  std::vector<uint32_t> free_slots_ GUARDED_BY(mu_);
  std::unordered_map<uint64_t, pool::ResumeKey> session_resume_key_ GUARDED_BY(mu_);
  std::map<pool::ResumeKey, std::vector<uint64_t>> adopted_by_key_ GUARDED_BY(mu_);
  double adopted_deadline_seconds_ GUARDED_BY(mu_) = 0;  // 0: nothing adopted waits
  uint64_t adopted_expired_total_ GUARDED_BY(mu_) = 0;
  uint64_t sessions_resumed_total_ GUARDED_BY(mu_) = 0;
  uint64_t blocks_resumed_total_ GUARDED_BY(mu_) = 0;
  absl::BitGen rng_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  base::Mutex stop_mu_;  // serialises Stop()
  std::thread deadline_thread_ GUARDED_BY(stop_mu_);
  // Spill tier.
  spill::SpillTier* const spill_;
  uint64_t next_seq_ GUARDED_BY(mu_) = 1;
  uint64_t spilling_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t staging_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t disk_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t disk_blocks_ GUARDED_BY(mu_) = 0;
  // Urgent stage-backs waiting for pool space
  std::deque<uint64_t> pending_stages_ GUARDED_BY(mu_);
  // Key of the session's last reload
  std::unordered_map<uint64_t, ReloadKey> session_cursor_ GUARDED_BY(mu_);
  uint64_t spilled_total_ GUARDED_BY(mu_) = 0;
  uint64_t staged_total_ GUARDED_BY(mu_) = 0;
  uint64_t spill_failures_total_ GUARDED_BY(mu_) = 0;
  uint64_t spill_refused_disk_full_total_ GUARDED_BY(mu_) = 0;
  uint64_t reloads_from_disk_total_ GUARDED_BY(mu_) = 0;
  uint64_t blocks_lost_total_ GUARDED_BY(mu_) = 0;
  uint64_t stages_promoted_total_ GUARDED_BY(mu_) = 0;
  uint64_t stages_expired_total_ GUARDED_BY(mu_) = 0;
  double reload_disk_wait_seconds_total_ GUARDED_BY(mu_) = 0;
};

}  // namespace offloadd::store

#endif  // OFFLOADD_SERVER_STORE_BLOCK_STORE_H_
