#include "server/store/block_store.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/base/clock.h"

namespace offloadd::store {

void BlockStore::RunAll(Deferred& deferred) {
  for (auto& fn : deferred) fn();
  deferred.clear();
}

BlockStore::BlockStore(uint64_t capacity_bytes, BlockStoreOptions options,
                       pool::BlockTable* table, spill::SpillTier* spill)
    : BlockStore(pool::ArenaSlices(capacity_bytes, {}), options, table, spill) {}

BlockStore::BlockStore(std::vector<pool::ArenaSlice> slices, BlockStoreOptions options,
                       pool::BlockTable* table, spill::SpillTier* spill)
    : options_(options),
      clock_(options.clock != nullptr ? options.clock : base::Clock::Real()),
      allocator_(std::move(slices)),
      capacity_bytes_(allocator_.stats().capacity_bytes),  // no other thread yet: no lock
      table_(table),
      spill_(spill) {
  for (const pool::ArenaSlice& s : allocator_.slices()) {
    largest_slice_bytes_ = std::max(largest_slice_bytes_, s.size_bytes);
  }
  if (table_ != nullptr) {
    free_slots_.reserve(table_->slots());
    for (uint64_t s = table_->slots(); s > 0; --s) free_slots_.push_back(static_cast<uint32_t>(s - 1));
  }
  deadline_thread_ = std::thread([this] { DeadlineLoop(); });
}

BlockStore::~BlockStore() { Stop(); }

void BlockStore::Stop() {
  std::deque<Waiter> waiters;
  std::vector<ReadableCallback> stages;
  {
    base::MutexLock lock(mu_);
    stopping_ = true;
    waiters.swap(waiters_);
    for (uint64_t id : pending_stages_) {
      auto it = blocks_.find(id);
      if (it == blocks_.end()) continue;
      it->second.stage_pending = false;
      for (auto& cb : it->second.waiting_reloads) stages.push_back(std::move(cb));
      it->second.waiting_reloads.clear();
    }
    pending_stages_.clear();
  }
  for (auto& cb : stages) {
    cb(absl::UnavailableError(
        "offloadd is shutting down: the block is on the spill disk and was not staged back"));
  }
  if (spill_ != nullptr) spill_->Shutdown();
  deadline_cv_.notify_all();
  {
    base::MutexLock lock(stop_mu_);
    if (deadline_thread_.joinable()) deadline_thread_.join();
  }
  for (auto& w : waiters) {
    w.done(absl::UnavailableError(
        "offloadd is shutting down: the offload was not admitted; keep the tensor in process "
        "memory and reconnect when the daemon is back"));
  }
}

int64_t BlockStore::OwnerLocked(uint64_t session_id) const {
  auto it = session_owner_.find(session_id);
  return it == session_owner_.end() ? -1 : static_cast<int64_t>(it->second);
}

void BlockStore::SetSessionOwner(uint64_t session_id, uint32_t uid) {
  base::MutexLock lock(mu_);
  session_owner_[session_id] = uid;
}

void BlockStore::SetSessionNumaNode(uint64_t session_id, int numa_node) {
  base::MutexLock lock(mu_);
  session_numa_node_[session_id] = numa_node;
}

int BlockStore::NumaNodeLocked(uint64_t session_id) const {
  auto it = session_numa_node_.find(session_id);
  return it == session_numa_node_.end() ? -1 : it->second;
}

void BlockStore::SetSessionResumeKey(uint64_t session_id, const pool::ResumeKey& key) {
  base::MutexLock lock(mu_);
  session_resume_key_[session_id] = key;
}

uint64_t BlockStore::ExtentBytes(uint64_t bytes) const {
  return spill_ != nullptr ? spill::SpillTier::DataBytes(bytes)
                           : pool::ExtentAllocator::RoundUp(bytes);
}

bool BlockStore::FitsLocked(uint64_t session_id, uint64_t bytes) const {
  if (table_ != nullptr && free_slots_.empty()) return false;
  return QuotaFitsLocked(session_id, bytes) && allocator_.CanAllocate(ExtentBytes(bytes));
}

bool BlockStore::QuotaFitsLocked(uint64_t session_id, uint64_t bytes) const {
  const uint64_t rounded = ExtentBytes(bytes);
  if (options_.session_quota_bytes > 0) {
    auto it = session_used_bytes_.find(session_id);
    uint64_t used = it == session_used_bytes_.end() ? 0 : it->second;
    if (used + rounded > options_.session_quota_bytes) return false;
  }
  if (options_.uid_quota_bytes > 0) {
    const int64_t uid = OwnerLocked(session_id);
    if (uid >= 0) {
      auto it = uid_used_bytes_.find(static_cast<uint32_t>(uid));
      uint64_t used = it == uid_used_bytes_.end() ? 0 : it->second;
      if (used + rounded > options_.uid_quota_bytes) return false;
    }
  }
  return true;
}

std::string BlockStore::WhyFullLocked(uint64_t session_id, uint64_t bytes) const {
  const uint64_t rounded = ExtentBytes(bytes);
  if (options_.session_quota_bytes > 0) {
    auto it = session_used_bytes_.find(session_id);
    uint64_t used = it == session_used_bytes_.end() ? 0 : it->second;
    if (used + rounded > options_.session_quota_bytes) {
      return absl::StrFormat(
          "the session quota is used (%d of %d bytes): release blocks of this session, or raise "
          "session_quota_bytes",
          used, options_.session_quota_bytes);
    }
  }
  const int64_t uid = OwnerLocked(session_id);
  if (options_.uid_quota_bytes > 0 && uid >= 0) {
    auto it = uid_used_bytes_.find(static_cast<uint32_t>(uid));
    uint64_t used = it == uid_used_bytes_.end() ? 0 : it->second;
    if (used + rounded > options_.uid_quota_bytes) {
      return absl::StrFormat(
          "the quota of uid %d is used (%d of %d bytes by all its sessions): release blocks, "
          "or raise uid_quota_bytes",
          uid, used, options_.uid_quota_bytes);
    }
  }
  if (table_ != nullptr && free_slots_.empty()) {
    return absl::StrFormat(
        "the shared pool's block table is full (%d records, one per 16 KiB of pool): release "
        "blocks, offload fewer larger blocks, or raise pool_bytes",
        table_->slots());
  }
  const pool::AllocatorStats pool = allocator_.stats();
  const uint64_t free_bytes = pool.capacity_bytes - pool.used_bytes;
  if (!pending_stages_.empty() && allocator_.CanAllocate(rounded)) {
    return absl::StrFormat(
        "reloads of %d spilled blocks wait for pool space and get it before new offloads (the "
        "spill tier is making room); retry, or raise pool_bytes",
        pending_stages_.size());
  }
  if (free_bytes >= rounded) {
    return absl::StrFormat(
        "the pool has %d bytes free but no free extent of %d bytes (largest %d, in %d pieces: "
        "fragmented); release blocks, offload in smaller pieces, or raise pool_bytes",
        free_bytes, rounded, pool.largest_free_bytes, pool.free_extents);
  }
  if (spill_ != nullptr) {
    const spill::SpillStats disk = spill_->stats();
    return absl::StrFormat(
        "the pool is full (%d of %d bytes free, largest free extent %d) and the spill tier "
        "could not make room (%d of %d disk bytes used, %d bytes being spilled); release "
        "blocks, retry later, or raise pool_bytes or spill_capacity_bytes",
        free_bytes, pool.capacity_bytes, pool.largest_free_bytes, disk.used_bytes,
        disk.capacity_bytes, spilling_bytes_);
  }
  return absl::StrFormat(
      "the pool is full (%d of %d bytes free, largest free extent %d); release blocks, retry "
      "later, or raise pool_bytes",
      free_bytes, pool.capacity_bytes, pool.largest_free_bytes);
}

BlockRef BlockStore::AdmitLocked(uint64_t session_id, uint64_t bytes, double enqueued_seconds) {
  // The caller checked FitsLocked: some slice has room.
  pool::Extent extent = allocator_.Allocate(ExtentBytes(bytes), NumaNodeLocked(session_id))->extent;
  uint64_t id = 0;
  do {
    id = absl::Uniform<uint64_t>(rng_);
  } while (id == 0 || blocks_.count(id) != 0 || lost_.count(id) != 0);
  Block& b = blocks_[id];
  b.session_id = session_id;
  b.owner_uid = OwnerLocked(session_id);
  b.bytes = bytes;
  b.extent = extent;
  b.state = State::kOffloading;
  b.key = ReloadKey{0, ~next_seq_++};
  if (table_ != nullptr) {  // caller checked FitsLocked: a slot is free
    b.slot = free_slots_.back();
    free_slots_.pop_back();
    auto key = session_resume_key_.find(session_id);
    if (key != session_resume_key_.end()) b.resume_key = key->second;
  }
  session_used_bytes_[session_id] += extent.bytes;
  session_blocks_[session_id] += 1;
  if (b.owner_uid >= 0) uid_used_bytes_[static_cast<uint32_t>(b.owner_uid)] += extent.bytes;
  BlockRef ref;
  ref.block_id = id;
  ref.bytes = bytes;
  ref.extent = extent;
  ref.queued_seconds = enqueued_seconds > 0 ? clock_->NowSeconds() - enqueued_seconds : 0;
  return ref;
}

void BlockStore::Reserve(uint64_t session_id, uint64_t bytes, ReserveCallback done,
                         OrderHint hint) {
  if (bytes == 0) {
    done(absl::InvalidArgumentError("offload of 0 bytes: send a positive byte count"));
    return;
  }
  absl::StatusOr<BlockRef> result;
  Deferred deferred;
  {
    base::MutexLock lock(mu_);
    uint64_t rounded = ExtentBytes(bytes);
    if (rounded > allocator_.stats().capacity_bytes) {
      result = absl::OutOfRangeError(absl::StrFormat(
          "offload of %d bytes is larger than the whole pool (%d bytes): split it, or raise "
          "pool_bytes in the daemon config",
          bytes, allocator_.stats().capacity_bytes));
    } else if (rounded > largest_slice_bytes_) {
      result = absl::OutOfRangeError(absl::StrFormat(
          "offload of %d bytes is larger than the pool's largest NUMA slice (%d bytes; a block "
          "must fit in one node's slice): split it, raise pool_bytes, or set "
          "numa_placement: off in the daemon config",
          bytes, largest_slice_bytes_));
    } else if (options_.session_quota_bytes > 0 && rounded > options_.session_quota_bytes) {
      result = absl::OutOfRangeError(absl::StrFormat(
          "offload of %d bytes is larger than the session quota (%d bytes): split it, or raise "
          "session_quota_bytes in the daemon config",
          bytes, options_.session_quota_bytes));
    } else if (options_.uid_quota_bytes > 0 && OwnerLocked(session_id) >= 0 &&
               rounded > options_.uid_quota_bytes) {
      result = absl::OutOfRangeError(absl::StrFormat(
          "offload of %d bytes is larger than the per-user quota (%d bytes): split it, or raise "
          "uid_quota_bytes in the daemon config",
          bytes, options_.uid_quota_bytes));
    } else if (FitsLocked(session_id, bytes) && pending_stages_.empty()) {
      result = AdmitLocked(session_id, bytes, 0);
      if (hint.valid) blocks_[result->block_id].key = ReloadKey{hint.step, ~hint.position};
      MaybeSpillLocked(&deferred);
    } else if (stopping_) {
      result = absl::UnavailableError(
          "offloadd is shutting down: the pool is full and offloads no longer wait for space");
    } else if (waiters_.size() >= options_.admission_queue_limit) {
      ++refused_total_;
      result = absl::ResourceExhaustedError(absl::StrFormat(
          "%d offloads already wait for space (admission_queue_limit) and this one does not "
          "fit now: %s",
          waiters_.size(), WhyFullLocked(session_id, bytes)));
    } else {
      double now = clock_->NowSeconds();
      waiters_.push_back(Waiter{session_id, bytes, now,
                                now + options_.admission_deadline_seconds, std::move(done),
                                hint});
      deadline_cv_.notify_all();
      MaybeSpillLocked(&deferred);
      done = nullptr;
    }
  }
  RunAll(deferred);
  if (done) done(std::move(result));
}

void BlockStore::AdmitWaitersLocked(Deferred* deferred) {
  if (!pending_stages_.empty()) return;  // urgent stage-backs get freed pool space first
  for (auto it = waiters_.begin(); it != waiters_.end();) {
    if (FitsLocked(it->session_id, it->bytes)) {
      BlockRef ref = AdmitLocked(it->session_id, it->bytes, it->enqueued_seconds);
      if (it->hint.valid) {
        blocks_[ref.block_id].key = ReloadKey{it->hint.step, ~it->hint.position};
      }
      deferred->push_back([cb = std::move(it->done), ref] { cb(ref); });
      it = waiters_.erase(it);
    } else {
      ++it;
    }
  }
}

void BlockStore::ForgetRecordLocked(Block& b) {
  if (!b.recorded || stopping_) return;
  table_->Clear(b.slot);
  b.recorded = false;
}

void BlockStore::FreeLocked(uint64_t block_id, Deferred* deferred) {
  auto it = blocks_.find(block_id);
  if (it == blocks_.end()) return;
  Block& b = it->second;
  if (table_ != nullptr) {
    // The record goes before the extent can be reused; the slot only if it was cleared (after
    // Stop the record stays for the next daemon, and so does its slot).
    ForgetRecordLocked(b);
    if (!b.recorded) free_slots_.push_back(b.slot);
  }
  if (b.tier == Tier::kPool) {
    (void)allocator_.Free(b.extent);
  } else {  // kDisk or kLost (callers check IdleLocked): the file goes
    disk_bytes_ -= b.extent.bytes;
    --disk_blocks_;
    // Under the store's lock: a later spill of the same block must not lose its new file
    // to this unlink (the spill's open runs after the lock is released). After Stop a block
    // still recorded keeps its file for the next daemon.
    if (spill_ != nullptr && !b.recorded) spill_->Remove(block_id, b.extent.bytes);
  }
  const uint64_t session_id = b.session_id;
  session_used_bytes_[b.session_id] -= b.extent.bytes;
  if (b.owner_uid >= 0) {
    auto u = uid_used_bytes_.find(static_cast<uint32_t>(b.owner_uid));
    if (u != uid_used_bytes_.end() && (u->second -= b.extent.bytes) == 0) uid_used_bytes_.erase(u);
  }
  if (--session_blocks_[b.session_id] == 0) {
    session_blocks_.erase(b.session_id);
    session_used_bytes_.erase(b.session_id);
  }
  blocks_.erase(it);
  UsePoolSpaceLocked(session_id, deferred);
}

void BlockStore::OffloadFinished(uint64_t block_id, const absl::Status& copy_status,
                                 std::optional<uint32_t> data_crc32c) {
  Deferred deferred;
  {
    base::MutexLock lock(mu_);
    auto it = blocks_.find(block_id);
    if (it == blocks_.end()) return;
    Block& b = it->second;
    std::vector<ReadableCallback> waiting = std::move(b.waiting_reloads);
    b.waiting_reloads.clear();
    if (copy_status.ok()) {
      b.state = State::kResident;
      b.data_crc32c = data_crc32c;
      WriteRecordLocked(block_id, b, /*spilled=*/false);
      BlockRef ref{block_id, b.bytes, b.extent, 0};
      for (auto& cb : waiting) deferred.push_back([cb, ref] { cb(ref); });
      if (b.released && b.reloads_in_flight == 0) {
        FreeLocked(block_id, &deferred);
      } else {
        MaybeSpillLocked(&deferred);
      }
    } else {
      absl::Status err(copy_status.code(),
                       absl::StrFormat("the offload of block %d failed: %s", block_id,
                                       copy_status.message()));
      for (auto& cb : waiting) deferred.push_back([cb, err] { cb(err); });
      b.offload_failed = true;
      // Reloads that were waiting still call EndReload; the last of them frees the block.
      if (b.reloads_in_flight == 0) FreeLocked(block_id, &deferred);
      else b.released = true;
    }
  }
  RunAll(deferred);
}

absl::Status BlockStore::LostLocked(uint64_t session_id, uint64_t block_id) const {
  auto it = lost_.find(block_id);
  if (it == lost_.end()) return absl::OkStatus();
  auto key = session_resume_key_.find(session_id);
  if (key == session_resume_key_.end() || key->second != it->second.resume_key) {
    return absl::OkStatus();  // another session's block: as unknown as any other
  }
  return absl::DataLossError(absl::StrFormat(
      "block %d was lost when offloadd restarted: its record in the shared pool failed the check "
      "at adoption (%s), so its bytes cannot be trusted; offload the data again (the session's "
      "other blocks are unaffected)",
      block_id, pool::DropReasonName(it->second.reason)));
}

void BlockStore::MarkLost(const std::vector<pool::DroppedBlock>& dropped) {
  base::MutexLock lock(mu_);
  for (const pool::DroppedBlock& d : dropped) {
    if (blocks_.count(d.block_id) == 0) lost_[d.block_id] = d;
  }
}

absl::Status BlockStore::BeginReload(uint64_t session_id, uint64_t block_id,
                                     ReadableCallback ready) {
  BlockRef ref;
  Deferred deferred;
  {
    base::MutexLock lock(mu_);
    auto it = blocks_.find(block_id);
    if (it == blocks_.end() || it->second.session_id != session_id) {
      if (absl::Status lost = LostLocked(session_id, block_id); !lost.ok()) return lost;
      return absl::NotFoundError(absl::StrFormat(
          "block %d is not held by this session (never offloaded here, or already released)",
          block_id));
    }
    Block& b = it->second;
    if (b.released || b.offload_failed) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "block %d is being released; reload it before releasing it", block_id));
    }
    if (b.tier == Tier::kLost) {
      return absl::DataLossError(absl::StrFormat(
          "block %d (spill file %016x.spill) was lost on the spill disk (%s): its bytes are "
          "lost; release the block and recompute what it held",
          block_id, block_id, b.lost_reason));
    }
    ++b.reloads_in_flight;
    if (spill_ != nullptr) session_cursor_[session_id] = b.key;
    if (b.state == State::kOffloading || b.tier == Tier::kDisk || b.tier == Tier::kStaging) {
      b.waiting_reloads.push_back(std::move(ready));
      if (b.tier != Tier::kPool) {
        ++reloads_from_disk_total_;
        b.disk_wait_start = clock_->NowSeconds();
        if (b.tier == Tier::kDisk && !b.stage_pending) {
          StartStageLocked(block_id, b, /*urgent=*/true, &deferred);
        } else if (b.tier == Tier::kStaging && !b.stage_urgent) {
          // Staged ahead at PREFETCH, and now a reload waits on it. Under the lock (the
          // spill tier never calls back under its own): the stage cannot finish meanwhile.
          b.stage_urgent = true;
          ++stages_promoted_total_;
          spill_->Promote(block_id);
        }
      }
      ready = nullptr;
    } else {
      if (b.tier == Tier::kSpilling) b.spill_cancelled = true;  // bytes still in the pool
      ref = BlockRef{block_id, b.bytes, b.extent, 0};
    }
    if (spill_ != nullptr) StageAheadLocked(session_id, &deferred);
  }
  RunAll(deferred);
  if (ready) ready(ref);
  return absl::OkStatus();
}

void BlockStore::EndReload(uint64_t block_id, bool release) {
  Deferred deferred;
  {
    base::MutexLock lock(mu_);
    auto it = blocks_.find(block_id);
    if (it == blocks_.end()) return;
    Block& b = it->second;
    --b.reloads_in_flight;
    if (release) {
      b.released = true;
      if (table_ != nullptr) ForgetRecordLocked(b);
    }
    if (b.released && IdleLocked(b)) {
      FreeLocked(block_id, &deferred);
    } else if (spill_ != nullptr && b.reloads_in_flight == 0) {
      // The block may be spilled now: stage-backs or offloads may be waiting for room.
      MaybeSpillLocked(&deferred);
    }
  }
  RunAll(deferred);
}

absl::Status BlockStore::Release(uint64_t session_id, uint64_t block_id) {
  Deferred deferred;
  {
    base::MutexLock lock(mu_);
    auto it = blocks_.find(block_id);
    if (it == blocks_.end() || it->second.session_id != session_id || it->second.released) {
      if (absl::Status lost = LostLocked(session_id, block_id); !lost.ok()) return lost;
      return absl::NotFoundError(absl::StrFormat(
          "block %d is not held by this session (never offloaded here, or already released)",
          block_id));
    }
    Block& b = it->second;
    b.released = true;
    if (table_ != nullptr) ForgetRecordLocked(b);
    if (IdleLocked(b)) FreeLocked(block_id, &deferred);
  }
  RunAll(deferred);
  return absl::OkStatus();
}

uint64_t BlockStore::ReleaseSession(uint64_t session_id) {
  Deferred deferred;
  uint64_t released = 0;
  {
    base::MutexLock lock(mu_);
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->session_id == session_id) {
        deferred.push_back([cb = std::move(it->done)] {
          cb(absl::CancelledError("the session ended before the offload was admitted"));
        });
        it = waiters_.erase(it);
      } else {
        ++it;
      }
    }
    session_owner_.erase(session_id);
    session_resume_key_.erase(session_id);
    session_numa_node_.erase(session_id);
    session_cursor_.erase(session_id);
    std::vector<uint64_t> ids;
    for (auto& [id, b] : blocks_) {
      if (b.session_id == session_id && !b.released) ids.push_back(id);
    }
    for (uint64_t id : ids) {
      Block& b = blocks_[id];
      b.released = true;
      if (table_ != nullptr) ForgetRecordLocked(b);
      ++released;
      if (IdleLocked(b)) FreeLocked(id, &deferred);
    }
  }
  RunAll(deferred);
  return released;
}

void BlockStore::DeadlineLoop() {
  base::MutexLock lock(mu_);
  while (!stopping_) {
    double now = clock_->NowSeconds();
    double next = 0;
    Deferred deferred;
    if (adopted_deadline_seconds_ > 0) {
      if (adopted_deadline_seconds_ <= now) {
        ExpireAdoptedLocked(&deferred);
      } else {
        next = adopted_deadline_seconds_;
      }
    }
    if (const double stage_next = ExpireStagesLocked(now, &deferred);
        stage_next > 0 && (next == 0 || stage_next < next)) {
      next = stage_next;
    }
    for (auto it = waiters_.begin(); it != waiters_.end();) {
      if (it->deadline_at_seconds <= now) {
        ++refused_total_;
        double waited = now - it->enqueued_seconds;
        uint64_t bytes = it->bytes;
        std::string why = WhyFullLocked(it->session_id, bytes);
        deferred.push_back([cb = std::move(it->done), waited, bytes, why] {
          cb(absl::ResourceExhaustedError(absl::StrFormat(
              "no space for %d bytes within %.3f s (admission_deadline_seconds): %s", bytes,
              waited, why)));
        });
        it = waiters_.erase(it);
      } else {
        if (next == 0 || it->deadline_at_seconds < next) next = it->deadline_at_seconds;
        ++it;
      }
    }
    if (!deferred.empty()) {
      lock.Unlock();
      RunAll(deferred);
      lock.Lock();
      continue;
    }
    if (next == 0) {
      deadline_cv_.Wait(mu_);
    } else {
      clock_->WaitUntil(mu_, deadline_cv_, next);
    }
  }
}

void BlockStore::AdoptSpilledLocked(const pool::StoredBlock& r, Block& b) {
  b.extent = pool::Extent{0, ExtentBytes(r.bytes)};
  b.tier = Tier::kDisk;
  if (spill_ == nullptr) {
    b.tier = Tier::kLost;
    b.lost_reason = "offloadd restarted without a spill_directory, so its spill file is not read";
  } else if (absl::Status st = spill_->AdoptFile(r.block_id, b.extent.bytes); !st.ok()) {
    b.tier = Tier::kLost;
    b.lost_reason = std::string(st.message());
  }
  if (b.tier == Tier::kLost) ++blocks_lost_total_;
  disk_bytes_ += b.extent.bytes;
  ++disk_blocks_;
}

uint64_t BlockStore::Adopt(const std::vector<pool::StoredBlock>& adopted, double grace_seconds) {
  base::MutexLock lock(mu_);
  if (table_ == nullptr) return 0;
  uint64_t n = 0;
  std::vector<bool> slot_used(table_->slots(), false);
  for (const pool::StoredBlock& r : adopted) {
    const pool::Extent extent{r.extent_offset, pool::ExtentAllocator::RoundUp(r.bytes)};
    if (r.slot >= table_->slots() || blocks_.count(r.block_id) != 0 ||
        (!r.spilled && !allocator_.AllocateAt(extent).ok())) {
      if (r.slot < table_->slots()) table_->Clear(r.slot);
      if (blocks_.count(r.block_id) == 0) {
        lost_[r.block_id] = pool::DroppedBlock{r.block_id, pool::DropReason::kOverlap, r.resume_key};
      }
      continue;
    }
    Block& b = blocks_[r.block_id];
    b.extent = extent;
    if (r.spilled) AdoptSpilledLocked(r, b);
    b.session_id = kAdoptedSession;
    b.owner_uid = r.owner_uid == pool::kUnknownUid ? -1 : static_cast<int64_t>(r.owner_uid);
    b.bytes = r.bytes;
    b.state = State::kResident;
    b.slot = r.slot;
    b.recorded = true;
    b.resume_key = r.resume_key;
    if (r.has_data_crc32c) b.data_crc32c = r.data_crc32c;
    slot_used[r.slot] = true;
    session_used_bytes_[kAdoptedSession] += b.extent.bytes;
    session_blocks_[kAdoptedSession] += 1;
    if (b.owner_uid >= 0) uid_used_bytes_[static_cast<uint32_t>(b.owner_uid)] += b.extent.bytes;
    adopted_by_key_[r.resume_key].push_back(r.block_id);
    ++n;
  }
  free_slots_.clear();
  for (uint64_t s = table_->slots(); s > 0; --s) {
    if (!slot_used[s - 1]) free_slots_.push_back(static_cast<uint32_t>(s - 1));
  }
  if (n > 0) {
    adopted_deadline_seconds_ = clock_->NowSeconds() + std::max(grace_seconds, 0.0);
    deadline_cv_.notify_all();
  }
  return n;
}

int BlockStore::RemoveUnnamedSpillFiles() {
  base::MutexLock lock(mu_);
  if (spill_ == nullptr) return 0;
  std::unordered_set<uint64_t> keep;
  for (const auto& [id, b] : blocks_) {
    if (b.tier == Tier::kDisk || b.tier == Tier::kLost) keep.insert(id);
  }
  return spill_->RemoveFilesExcept(keep);
}

absl::StatusOr<uint64_t> BlockStore::ResumeSession(uint64_t session_id,
                                                   const pool::ResumeKey& key, uint32_t uid,
                                                   std::vector<uint64_t>* block_ids) {
  base::MutexLock lock(mu_);
  auto it = adopted_by_key_.find(key);
  if (it == adopted_by_key_.end()) {
    return absl::NotFoundError(
        "no blocks wait for this resume token: it was never issued, its session already "
        "resumed, or the daemon's resume_grace_seconds passed (its blocks are lost); open a "
        "new session without a token");
  }
  for (uint64_t id : it->second) {
    const Block& b = blocks_.at(id);
    const uint32_t owner =
        b.owner_uid >= 0 ? static_cast<uint32_t>(b.owner_uid) : pool::kUnknownUid;
    if (owner != uid) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "this resume token belongs to another user's session (the presenting uid is %d): a "
          "token can only be resumed by the uid it was issued to",
          static_cast<int64_t>(uid == pool::kUnknownUid ? -1 : uid)));
    }
  }
  uint64_t n = 0;
  for (uint64_t id : it->second) {
    Block& b = blocks_.at(id);
    b.session_id = session_id;
    session_used_bytes_[kAdoptedSession] -= b.extent.bytes;
    session_used_bytes_[session_id] += b.extent.bytes;
    if (--session_blocks_[kAdoptedSession] == 0) {
      session_blocks_.erase(kAdoptedSession);
      session_used_bytes_.erase(kAdoptedSession);
    }
    session_blocks_[session_id] += 1;
    if (block_ids != nullptr) block_ids->push_back(id);
    ++n;
  }
  adopted_by_key_.erase(it);
  session_resume_key_[session_id] = key;
  ++sessions_resumed_total_;
  blocks_resumed_total_ += n;
  return n;
}

void BlockStore::ExpireAdoptedLocked(Deferred* deferred) {
  adopted_deadline_seconds_ = 0;
  for (auto& [key, ids] : adopted_by_key_) {
    for (uint64_t id : ids) {
      Block& b = blocks_.at(id);
      b.released = true;
      ForgetRecordLocked(b);
      ++adopted_expired_total_;
      FreeLocked(id, deferred);
    }
  }
  adopted_by_key_.clear();
}

uint64_t BlockStore::SessionUsedBytes(uint64_t session_id) const {
  base::MutexLock lock(mu_);
  auto it = session_used_bytes_.find(session_id);
  return it == session_used_bytes_.end() ? 0 : it->second;
}

uint64_t BlockStore::SessionBlocks(uint64_t session_id) const {
  base::MutexLock lock(mu_);
  auto it = session_blocks_.find(session_id);
  return it == session_blocks_.end() ? 0 : it->second;
}

std::map<uint32_t, uint64_t> BlockStore::UidUsedBytes() const {
  base::MutexLock lock(mu_);
  return uid_used_bytes_;
}

StoreStats BlockStore::stats() const {
  base::MutexLock lock(mu_);
  StoreStats s;
  s.pool = allocator_.stats();
  s.blocks = blocks_.size();
  s.offloads_waiting = waiters_.size();
  s.offloads_refused_total = refused_total_;
  for (const auto& [key, ids] : adopted_by_key_) s.adopted_blocks_waiting += ids.size();
  s.adopted_blocks_expired_total = adopted_expired_total_;
  s.sessions_resumed_total = sessions_resumed_total_;
  s.blocks_resumed_total = blocks_resumed_total_;
  s.disk_bytes = disk_bytes_;
  s.spilling_bytes = spilling_bytes_;
  s.staging_bytes = staging_bytes_;
  s.disk_blocks = disk_blocks_;
  s.spilled_blocks_total = spilled_total_;
  s.staged_blocks_total = staged_total_;
  s.spill_failures_total = spill_failures_total_;
  s.spill_refused_disk_full_total = spill_refused_disk_full_total_;
  s.reloads_from_disk_total = reloads_from_disk_total_;
  s.reload_disk_wait_seconds_total = reload_disk_wait_seconds_total_;
  s.stages_promoted_total = stages_promoted_total_;
  s.stages_expired_total = stages_expired_total_;
  s.blocks_lost_total = blocks_lost_total_;
  s.stages_waiting = pending_stages_.size();
  s.placement = allocator_.placement_counts();
  for (size_t i = 0; i < allocator_.slices().size(); ++i) {
    const pool::ArenaSlice& slice = allocator_.slices()[i];
    s.numa_slices.push_back({slice.numa_node, slice.size_bytes, allocator_.slice_stats(i).used_bytes});
  }
  return s;
}

}  // namespace offloadd::store
