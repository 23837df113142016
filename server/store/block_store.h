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
// Thread-safety: every method is thread-safe. Callbacks run without the store's lock held, on
// the calling thread, the thread that released space, or the store's deadline thread.
#ifndef OFFLOADD_SERVER_STORE_BLOCK_STORE_H_
#define OFFLOADD_SERVER_STORE_BLOCK_STORE_H_

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "absl/random/random.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/pool/block_table.h"
#include "server/pool/extent_allocator.h"

namespace offloadd::store {

struct BlockStoreOptions {
  uint64_t session_quota_bytes = 0;         // 0 = no per-session quota
  // All sessions of one uid together (sessions given an owner with SetSessionOwner); 0 = none.
  uint64_t uid_quota_bytes = 0;
  double admission_deadline_seconds = 5.0;  // how long an offload may wait for space
  uint32_t admission_queue_limit = 1024;    // offloads waiting at once, whole daemon
};

// Where an admitted block's bytes live.
struct BlockRef {
  uint64_t block_id = 0;
  uint64_t bytes = 0;       // requested size
  pool::Extent extent;      // its extent in the arena
  double queued_seconds = 0;  // time spent waiting for space
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
};

class BlockStore {
 public:
  using ReserveCallback = std::function<void(absl::StatusOr<BlockRef>)>;
  using ReadableCallback = std::function<void(absl::StatusOr<BlockRef>)>;

  // `table`: the shared pool's block records (not owned), or null for an anonymous pool.
  BlockStore(uint64_t capacity_bytes, BlockStoreOptions options,
             pool::BlockTable* table = nullptr);
  ~BlockStore();  // Stop()

  // Fails every waiting offload with UNAVAILABLE (shutdown) and stops the deadline thread; no
  // store callback runs on that thread afterwards. Idempotent. Offloads reserved after Stop
  // are still admitted when they fit, but no longer wait for space.
  void Stop();

  // Records the uid a session belongs to, for uid_quota_bytes (call before its first Reserve;
  // sessions without an owner are not subject to the uid quota).
  void SetSessionOwner(uint64_t session_id, uint32_t uid);
  // Records the key of the session's resume token, written into its blocks' records (call
  // before its first Reserve; without one the records carry an all-zero key, which no token
  // hashes to in practice).
  void SetSessionResumeKey(uint64_t session_id, const pool::ResumeKey& key);

  // Takes the blocks of a previous daemon (BlockTable::Adopt's valid records) as resident blocks
  // of no session, held `grace_seconds`; then those not resumed are freed (and counted). Call
  // once, before any Reserve. Returns the number adopted (a record whose extent cannot be
  // allocated is cleared and not adopted; BlockTable::Adopt already drops overlaps).
  uint64_t Adopt(const std::vector<pool::StoredBlock>& blocks, double grace_seconds);
  // Remembers the block ids adoption dropped (BlockTable::Adopt's dropped_blocks): a reload or
  // release naming one then fails with DATA_LOSS (the block was stored and is lost) instead of
  // NOT_FOUND. Kept for the daemon's life (at most one per record slot).
  void MarkLost(const std::vector<pool::DroppedBlock>& dropped);
  // Gives the adopted blocks recorded under `key` to `session_id` (same block ids). `uid`: the
  // presenting peer's uid, pool::kUnknownUid when unknown; it must equal the owner recorded.
  // Returns the number of blocks taken. Errors: NOT_FOUND when no adopted block has that key
  // (never issued, already resumed, or expired); PERMISSION_DENIED for another uid.
  // `block_ids` (optional) receives the ids taken.
  absl::StatusOr<uint64_t> ResumeSession(uint64_t session_id, const pool::ResumeKey& key,
                                         uint32_t uid,
                                         std::vector<uint64_t>* block_ids = nullptr);

  // Admits an offload of `bytes` for `session_id`; `done` gets the new block (state
  // kOffloading) or an error: INVALID_ARGUMENT for 0 bytes; OUT_OF_RANGE when bytes exceed the
  // pool capacity, the session quota or the uid quota (it can never fit); RESOURCE_EXHAUSTED
  // when the wait queue is full or the deadline passed (the message says whether the pool or a
  // quota was full).
  void Reserve(uint64_t session_id, uint64_t bytes, ReserveCallback done);

  // The offload copy of a block finished: kResident on success; on failure the block is freed.
  // Runs reloads that were waiting for it (with the block, or the copy's error).
  void OffloadFinished(uint64_t block_id, const absl::Status& copy_status);

  // Starts a reload of a block of `session_id`: `ready` is called with the block once its bytes
  // are in the pool (at once if resident). The block stays allocated until EndReload.
  // Errors (returned, `ready` not called): NOT_FOUND for an unknown block or one of another
  // session; FAILED_PRECONDITION when the block has been released.
  absl::Status BeginReload(uint64_t session_id, uint64_t block_id, ReadableCallback ready);
  // A reload started with BeginReload finished; `release` frees the block afterwards.
  void EndReload(uint64_t block_id, bool release);

  // Releases a block of `session_id`. NOT_FOUND for unknown / foreign / already released ids.
  absl::Status Release(uint64_t session_id, uint64_t block_id);
  // Releases every block of the session and fails its waiting offloads with CANCELLED; forgets
  // its owner. Returns the number of blocks released.
  uint64_t ReleaseSession(uint64_t session_id);

  // Bytes (rounded extents) held by a session, and blocks held.
  uint64_t SessionUsedBytes(uint64_t session_id) const;
  uint64_t SessionBlocks(uint64_t session_id) const;
  // Bytes (rounded extents) held by each uid's sessions, for uids holding any.
  std::map<uint32_t, uint64_t> UidUsedBytes() const;
  StoreStats stats() const;
  uint64_t capacity_bytes() const;
  // True on a shared pool (constructed with a BlockTable): confirmed blocks outlive the daemon.
  bool survives_restart() const { return table_ != nullptr; }

 private:
  enum class State { kOffloading, kResident };
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
  };
  static constexpr uint64_t kAdoptedSession = 0;
  struct Waiter {
    uint64_t session_id;
    uint64_t bytes;
    double enqueued_seconds;
    double deadline_seconds;
    ReserveCallback done;
  };
  using Deferred = std::vector<std::function<void()>>;

  // All *Locked methods require mu_.
  bool FitsLocked(uint64_t session_id, uint64_t bytes) const;
  // Why a request does not fit now: "the pool is full", "the session quota ... is used", ...
  std::string WhyFullLocked(uint64_t session_id, uint64_t bytes) const;
  int64_t OwnerLocked(uint64_t session_id) const;
  BlockRef AdmitLocked(uint64_t session_id, uint64_t bytes, double enqueued_seconds);
  void FreeLocked(uint64_t block_id, Deferred* deferred);
  // Clears the block's record (shared pool; not after Stop, see above).
  void ForgetRecordLocked(Block& b);
  void ExpireAdoptedLocked(Deferred* deferred);
  void AdmitWaitersLocked(Deferred* deferred);
  void DeadlineLoop();

  const BlockStoreOptions options_;
  mutable std::mutex mu_;
  std::condition_variable deadline_cv_;
  pool::ExtentAllocator allocator_;
  std::unordered_map<uint64_t, Block> blocks_;
  std::unordered_map<uint64_t, uint64_t> session_used_bytes_;
  std::unordered_map<uint64_t, uint64_t> session_blocks_;
  std::unordered_map<uint64_t, uint32_t> session_owner_;
  std::map<uint32_t, uint64_t> uid_used_bytes_;
  std::deque<Waiter> waiters_;
  uint64_t refused_total_ = 0;
  // DATA_LOSS for a block id adoption dropped; OK otherwise. mu_ held.
  absl::Status LostLocked(uint64_t block_id) const;
  pool::BlockTable* const table_;
  std::unordered_map<uint64_t, pool::DropReason> lost_;  // dropped at adoption (MarkLost)
  std::vector<uint32_t> free_slots_;
  std::unordered_map<uint64_t, pool::ResumeKey> session_resume_key_;
  std::map<pool::ResumeKey, std::vector<uint64_t>> adopted_by_key_;
  double adopted_deadline_seconds_ = 0;  // 0: nothing adopted waits
  uint64_t adopted_expired_total_ = 0, sessions_resumed_total_ = 0, blocks_resumed_total_ = 0;
  absl::BitGen rng_;
  bool stopping_ = false;
  std::mutex stop_mu_;  // serialises Stop()
  std::thread deadline_thread_;
};

}  // namespace offloadd::store

#endif  // OFFLOADD_SERVER_STORE_BLOCK_STORE_H_
