// BlockStore's spill-tier policy: which blocks go to disk, staging them back, and
// handing freed pool space to pending stage-backs and waiting offloads. See block_store.h.
#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "server/store/block_store.h"

namespace offloadd::store {

bool BlockStore::IdleLocked(const Block& b) {
  const bool tier_idle = b.tier != Tier::kSpilling && b.tier != Tier::kStaging;
  return tier_idle && b.reloads_in_flight == 0 &&
         (b.state == State::kResident || b.offload_failed);
}

uint64_t BlockStore::HighWaterBytesLocked() const {
  const double f = std::clamp(options_.spill_high_water_fraction, 0.0, 1.0);
  return static_cast<uint64_t>(static_cast<double>(allocator_.stats().capacity_bytes) * f);
}

void BlockStore::WriteRecordLocked(uint64_t block_id, Block& b, bool spilled) {
  if (table_ == nullptr || b.released) return;
  const uint32_t uid = b.owner_uid >= 0 ? static_cast<uint32_t>(b.owner_uid) : pool::kUnknownUid;
  table_->Write({b.slot, block_id, b.resume_key, spilled ? 0 : b.extent.offset, b.bytes, uid,
                 spilled, b.data_crc32c.has_value(), b.data_crc32c.value_or(0)});
  b.recorded = true;
}

void BlockStore::MaybeSpillLocked(Deferred* deferred) {
  if (spill_ == nullptr || stopping_) return;
  // Bytes that want pool space: offloads waiting only for the pool (a quota is not helped by
  // spilling, since quotas count both tiers) and urgent stage-backs waiting for room.
  uint64_t wanted = 0;
  for (const Waiter& w : waiters_) {
    if (QuotaFitsLocked(w.session_id, w.bytes)) wanted += ExtentBytes(w.bytes);
  }
  for (uint64_t id : pending_stages_) {
    auto it = blocks_.find(id);
    if (it != blocks_.end()) wanted += it->second.extent.bytes;
  }
  const uint64_t used = allocator_.stats().used_bytes - spilling_bytes_;
  const uint64_t high = HighWaterBytesLocked();
  uint64_t excess = used + wanted > high ? used + wanted - high : 0;
  // Fragmentation: something waits although the sums fit; spill one more block.
  if (excess == 0 && wanted > 0 && spilling_bytes_ == 0) excess = 1;
  if (excess == 0) return;
  std::vector<std::pair<ReloadKey, uint64_t>> candidates;
  for (auto& [id, b] : blocks_) {
    if (b.tier == Tier::kPool && b.state == State::kResident && !b.released &&
        b.reloads_in_flight == 0 && b.session_id != kAdoptedSession) {
      candidates.emplace_back(b.key, id);
    }
  }
  // Expected last reload first.
  std::sort(candidates.begin(), candidates.end(),
            [](const auto& x, const auto& y) { return y.first < x.first; });
  for (const auto& [key, id] : candidates) {
    if (excess == 0) break;
    Block& b = blocks_[id];
    if (!spill_->TryReserve(b.extent.bytes)) {
      ++spill_refused_disk_full_total_;
      break;
    }
    excess -= std::min(excess, b.extent.bytes);
    StartSpillLocked(id, b, deferred);
  }
}

void BlockStore::StartSpillLocked(uint64_t block_id, Block& b, Deferred* deferred) {
  b.tier = Tier::kSpilling;
  b.spill_cancelled = false;
  spilling_bytes_ += b.extent.bytes;
  // The record keeps naming the extent until the file is complete and synced (a crash
  // mid-spill leaves the pool copy authoritative); SpillFinished then marks it spilled.
  deferred->push_back([this, block_id, extent = b.extent, flow = absl::StrCat(b.session_id)] {
    spill_->Spill(block_id, extent, flow,
                  [this, block_id](absl::Status st) { SpillFinished(block_id, st); });
  });
}

void BlockStore::SpillFinished(uint64_t block_id, const absl::Status& st) {
  Deferred deferred;
  {
    base::MutexLock lock(mu_);
    auto it = blocks_.find(block_id);
    if (it == blocks_.end() || it->second.tier != Tier::kSpilling) return;
    Block& b = it->second;
    spilling_bytes_ -= b.extent.bytes;
    const bool keep_in_pool = !st.ok() || b.released || b.spill_cancelled ||
                              b.reloads_in_flight > 0;
    if (keep_in_pool) {
      if (!st.ok()) ++spill_failures_total_;
      b.tier = Tier::kPool;
      b.spill_cancelled = false;
      // Under the store's lock: a later spill of the same block must not lose its new file
      // to this unlink (the spill's open runs after the lock is released).
      spill_->Remove(block_id, b.extent.bytes);
      if (b.released && IdleLocked(b)) {
        FreeLocked(block_id, &deferred);
      } else if (st.ok()) {
        // Cancelled by a reload: whatever this spill was to make room for (an urgent
        // stage-back, a waiting offload) still waits; spill another block (or this one again
        // once its reload ended). A failed spill is not retried here (the disk refused it).
        MaybeSpillLocked(&deferred);
      }
    } else {
      // The file is synced: the record names it before the extent can be reused (also after
      // Stop, so the next daemon adopts the block from its file).
      if (b.recorded) WriteRecordLocked(block_id, b, /*spilled=*/true);
      (void)allocator_.Free(b.extent);
      b.extent.offset = 0;
      b.tier = Tier::kDisk;
      disk_bytes_ += b.extent.bytes;
      ++disk_blocks_;
      ++spilled_total_;
      UsePoolSpaceLocked(b.session_id, &deferred);
    }
  }
  RunAll(deferred);
}

bool BlockStore::StartStageLocked(uint64_t block_id, Block& b, bool urgent,
                                  Deferred* deferred) {
  auto placed = allocator_.Allocate(b.extent.bytes, NumaNodeLocked(b.session_id));
  if (!placed.ok()) {
    if (urgent && !b.stage_pending) {
      b.stage_pending = true;
      b.stage_deadline_at = base::SteadyNowSeconds() + options_.admission_deadline_seconds;
      pending_stages_.push_back(block_id);
      deadline_cv_.notify_all();
      MaybeSpillLocked(deferred);
    }
    return false;
  }
  b.tier = Tier::kStaging;
  b.stage_urgent = urgent;
  b.extent = placed->extent;
  staging_bytes_ += b.extent.bytes;
  deferred->push_back([this, block_id, extent = placed->extent, urgent,
                       flow = absl::StrCat(b.session_id)] {
    spill_->Stage(block_id, extent, urgent ? spill::DiskClass::kUrgent : spill::DiskClass::kPrefetch,
                  flow, [this, block_id](absl::Status st) { StageFinished(block_id, st); });
  });
  return true;
}

void BlockStore::StageFinished(uint64_t block_id, const absl::Status& st) {
  Deferred deferred;
  {
    base::MutexLock lock(mu_);
    auto it = blocks_.find(block_id);
    if (it == blocks_.end() || it->second.tier != Tier::kStaging) return;
    Block& b = it->second;
    staging_bytes_ -= b.extent.bytes;
    std::vector<ReadableCallback> waiting = std::move(b.waiting_reloads);
    b.waiting_reloads.clear();
    if (b.disk_wait_start > 0) {
      reload_disk_wait_seconds_total_ += clock_->NowSeconds() - b.disk_wait_start;
      b.disk_wait_start = 0;
    }
    if (st.ok()) {
      b.tier = Tier::kPool;
      disk_bytes_ -= b.extent.bytes;
      --disk_blocks_;
      ++staged_total_;
      // The record names the new extent before the file goes (a crash in between leaves an
      // orphan file, removed at start-up). Under the store's lock: a later spill of the same
      // block must not lose its new file to this unlink (its open runs after the lock is
      // released).
      WriteRecordLocked(block_id, b, /*spilled=*/false);
      spill_->Remove(block_id, b.extent.bytes);
      BlockRef ref{block_id, b.bytes, b.extent, 0};
      for (auto& cb : waiting) deferred.push_back([cb, ref] { cb(ref); });
      if (b.released && IdleLocked(b)) {
        FreeLocked(block_id, &deferred);
      } else {
        MaybeSpillLocked(&deferred);  // a staged-ahead block may now be a candidate for others
      }
    } else {
      (void)allocator_.Free(b.extent);
      b.extent.offset = 0;
      if (st.code() == absl::StatusCode::kDataLoss) {
        b.tier = Tier::kLost;
        b.lost_reason = std::string(st.message());
        ++blocks_lost_total_;
      } else {
        b.tier = Tier::kDisk;
      }
      absl::Status err(
          st.code(),
          absl::StrFormat("block %d (spill file %016x.spill) could not be read back from the "
                          "spill disk: %s%s",
                          block_id, block_id, st.message(),
                          st.code() == absl::StatusCode::kDataLoss
                              ? "; release the block and recompute what it held"
                              : ""));
      for (auto& cb : waiting) deferred.push_back([cb, err] { cb(err); });
      if (b.released && IdleLocked(b)) {
        FreeLocked(block_id, &deferred);
      } else {
        UsePoolSpaceLocked(b.session_id, &deferred);
      }
    }
  }
  RunAll(deferred);
}

void BlockStore::StageAheadLocked(uint64_t session_id, Deferred* deferred) {
  if (spill_ == nullptr || options_.stage_ahead_blocks == 0 || stopping_) return;
  if (!pending_stages_.empty()) return;  // freed pool space goes to urgent stage-backs first
  auto cursor = session_cursor_.find(session_id);
  if (cursor == session_cursor_.end()) return;
  std::vector<std::pair<ReloadKey, uint64_t>> next;
  for (auto& [id, b] : blocks_) {
    if (b.session_id == session_id && !b.released && cursor->second < b.key) {
      next.emplace_back(b.key, id);
    }
  }
  const size_t n = std::min<size_t>(next.size(), options_.stage_ahead_blocks);
  std::partial_sort(next.begin(), next.begin() + n, next.end(),
                    [](const auto& x, const auto& y) { return x.first < y.first; });
  const uint64_t high = HighWaterBytesLocked();
  for (size_t i = 0; i < n; ++i) {
    Block& b = blocks_[next[i].second];
    if (b.tier != Tier::kDisk || b.stage_pending) continue;
    if (allocator_.stats().used_bytes + b.extent.bytes > high) break;
    if (!StartStageLocked(next[i].second, b, /*urgent=*/false, deferred)) break;
  }
}

void BlockStore::UsePoolSpaceLocked(uint64_t session_id, Deferred* deferred) {
  while (!pending_stages_.empty()) {
    auto it = blocks_.find(pending_stages_.front());
    if (it == blocks_.end() || it->second.tier != Tier::kDisk) {
      if (it != blocks_.end()) it->second.stage_pending = false;
      pending_stages_.pop_front();
      continue;
    }
    if (!allocator_.CanAllocate(it->second.extent.bytes)) break;
    it->second.stage_pending = false;
    pending_stages_.pop_front();
    StartStageLocked(it->first, it->second, /*urgent=*/true, deferred);
  }
  // An urgent stage-back still waiting keeps the freed space: an offload taking it could leave
  // a reload starving while every spill's hole is refilled (AdmitWaitersLocked holds off).
  AdmitWaitersLocked(deferred);
  if (spill_ != nullptr) {
    StageAheadLocked(session_id, deferred);
    MaybeSpillLocked(deferred);
  }
}

double BlockStore::ExpireStagesLocked(double now, Deferred* deferred) {
  double next = 0;
  const size_t before = pending_stages_.size();
  for (auto it = pending_stages_.begin(); it != pending_stages_.end();) {
    auto found = blocks_.find(*it);
    if (found == blocks_.end() || found->second.tier != Tier::kDisk) {
      ++it;  // UsePoolSpaceLocked drops it
      continue;
    }
    Block& b = found->second;
    if (b.stage_deadline_at > now || spilling_bytes_ > 0) {
      // Not yet, or a spill is making room: wait (another period from now for the latter).
      if (b.stage_deadline_at <= now) {
        b.stage_deadline_at = now + options_.admission_deadline_seconds;
      }
      if (next == 0 || b.stage_deadline_at < next) next = b.stage_deadline_at;
      ++it;
      continue;
    }
    b.stage_pending = false;
    if (b.disk_wait_start > 0) {
      reload_disk_wait_seconds_total_ += now - b.disk_wait_start;
      b.disk_wait_start = 0;
    }
    const pool::AllocatorStats pool = allocator_.stats();
    const spill::SpillStats disk = spill_->stats();
    const absl::Status err = absl::ResourceExhaustedError(absl::StrFormat(
        "block %d is on the spill disk and the pool had no room to stage its %d bytes back "
        "within %.3f s (admission_deadline_seconds; %d of %d pool bytes free, largest free "
        "extent %d), and nothing could be spilled to make room (%d of %d disk bytes used); the "
        "block is kept: release blocks and reload it again, or raise pool_bytes or "
        "spill_capacity_bytes",
        *it, b.extent.bytes, options_.admission_deadline_seconds,
        pool.capacity_bytes - pool.used_bytes, pool.capacity_bytes, pool.largest_free_bytes,
        disk.used_bytes, disk.capacity_bytes));
    for (auto& cb : b.waiting_reloads) deferred->push_back([cb, err] { cb(err); });
    b.waiting_reloads.clear();
    ++stages_expired_total_;
    it = pending_stages_.erase(it);
  }
  if (before > 0 && pending_stages_.empty()) AdmitWaitersLocked(deferred);
  return next;
}

}  // namespace offloadd::store
