#include "server/sched/drr.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace offloadd::sched {

ChunkQueueOptions ChunkQueueOptions::From(const LinkSchedulerOptions& options) {
  ChunkQueueOptions q;
  q.chunk_bytes = options.chunk_bytes;
  q.quantum_bytes = options.quantum_bytes;
  q.offload_min_share = options.offload_min_share;
  q.gpu_weights = options.gpu_weights;
  return q;
}

ChunkQueue::ChunkQueue(ChunkQueueOptions options) : options_(std::move(options)) {
  if (options_.chunk_bytes == 0) options_.chunk_bytes = 8ull << 20;
  if (options_.quantum_bytes == 0) options_.quantum_bytes = options_.chunk_bytes;
  options_.offload_min_share = std::clamp(options_.offload_min_share, 0.0, 1.0);
  if (options_.share_window_bytes == 0) options_.share_window_bytes = 32 * options_.chunk_bytes;
}

uint64_t ChunkQueue::Weight(const std::string& gpu) const {
  auto it = options_.gpu_weights.find(gpu);
  if (it == options_.gpu_weights.end() || it->second == 0) return 1;
  return it->second;
}

absl::StatusOr<uint64_t> ChunkQueue::Push(std::shared_ptr<Transfer> transfer) {
  if (transfer == nullptr) return absl::InvalidArgumentError("null transfer");
  if (transfer->bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("transfer for GPU '", transfer->gpu, "' has 0 bytes; send bytes > 0"));
  }
  const int c = static_cast<int>(transfer->cls);
  if (c < 0 || c >= kNumClasses) {
    return absl::InvalidArgumentError(absl::StrCat("unknown traffic class ", c));
  }
  const uint64_t id = next_id_++;
  Queued q;
  q.deadline_key = transfer->deadline_at_seconds > 0 ? transfer->deadline_at_seconds
                                                  : std::numeric_limits<double>::infinity();
  q.transfer = std::move(transfer);
  Enqueue(id, q, q.transfer->bytes);
  transfers_.emplace(id, std::move(q));
  return id;
}

void ChunkQueue::Enqueue(uint64_t id, const Queued& t, uint64_t bytes) {
  ClassQueue& cq = classes_[static_cast<int>(t.transfer->cls)];
  auto [it, inserted] = cq.flows.try_emplace(t.transfer->gpu);
  if (inserted) cq.active.push_back(t.transfer->gpu);
  it->second.order.insert({t.deadline_key, id});
  cq.queued_bytes += bytes;
}

void ChunkQueue::Dequeue(uint64_t id, const Queued& t, uint64_t bytes) {
  ClassQueue& q = classes_[static_cast<int>(t.transfer->cls)];
  q.queued_bytes -= bytes;
  const std::string gpu = t.transfer->gpu;
  Flow& f = q.flows.at(gpu);
  f.order.erase({t.deadline_key, id});
  if (f.order.empty()) RemoveFlow(q, gpu);
}

uint64_t ChunkQueue::NextChunkLen(const Flow& flow) const {
  const Queued& q = transfers_.at(flow.order.begin()->second);
  return std::min(options_.chunk_bytes, q.transfer->bytes - q.next_offset);
}

void ChunkQueue::RemoveFlow(ClassQueue& q, const std::string& gpu) {
  q.flows.erase(gpu);  // the deficit goes with it: an idle GPU banks nothing
  auto it = std::find(q.active.begin(), q.active.end(), gpu);
  if (it != q.active.end()) q.active.erase(it);
}

bool ChunkQueue::Eligible(const ClassQueue& q, TrafficClass cls, const GpuFilter& eligible) {
  if (eligible == nullptr) return !q.active.empty();
  for (const std::string& gpu : q.active) {
    if (eligible(cls, gpu)) return true;
  }
  return false;
}

bool ChunkQueue::HasEligible(const GpuFilter& eligible) const {
  for (int c = 0; c < kNumClasses; ++c) {
    if (Eligible(classes_[c], static_cast<TrafficClass>(c), eligible)) return true;
  }
  return false;
}

Chunk ChunkQueue::PopFromClass(TrafficClass cls, const GpuFilter& eligible) {
  ClassQueue& q = classes_[static_cast<int>(cls)];
  auto ok = [&](const std::string& gpu) { return eligible == nullptr || eligible(cls, gpu); };
  size_t eligible_flows = 0;  // >= 1: the caller checked
  for (const std::string& gpu : q.active) eligible_flows += ok(gpu);
  size_t unserved_visits = 0;
  for (;;) {
    if (unserved_visits == eligible_flows) {
      // A whole round served nobody (quantum < chunk): add the rounds that would also serve
      // nobody to every deficit at once; the next round then serves at least one GPU.
      uint64_t skip = std::numeric_limits<uint64_t>::max();
      for (const std::string& gpu : q.active) {
        if (!ok(gpu)) continue;
        const Flow& f = q.flows.at(gpu);
        const uint64_t per_round = Weight(gpu) * options_.quantum_bytes;
        const uint64_t need = NextChunkLen(f) - f.deficit_bytes;  // > 0 here
        skip = std::min(skip, (need + per_round - 1) / per_round - 1);
      }
      for (const std::string& gpu : q.active) {
        if (ok(gpu)) q.flows.at(gpu).deficit_bytes += skip * Weight(gpu) * options_.quantum_bytes;
      }
      unserved_visits = 0;
    }
    const std::string gpu = q.active.front();
    if (!ok(gpu)) {  // passed over: keeps its deficit and its turn state
      q.active.pop_front();
      q.active.push_back(gpu);
      continue;
    }
    Flow& f = q.flows.at(gpu);
    if (!f.in_turn) {
      f.deficit_bytes += Weight(gpu) * options_.quantum_bytes;
      f.in_turn = true;
    }
    const uint64_t len = NextChunkLen(f);
    if (f.deficit_bytes < len) {
      f.in_turn = false;
      q.active.pop_front();
      q.active.push_back(gpu);
      ++unserved_visits;
      continue;
    }
    f.deficit_bytes -= len;
    const uint64_t id = f.order.begin()->second;
    Queued& t = transfers_.at(id);
    Chunk chunk;
    chunk.transfer_id = id;
    chunk.transfer = t.transfer;
    chunk.offset = t.next_offset;
    chunk.len = len;
    t.next_offset += len;
    q.queued_bytes -= len;
    if (t.next_offset == t.transfer->bytes) {
      chunk.last = true;
      f.order.erase(f.order.begin());
      transfers_.erase(id);
      if (f.order.empty()) RemoveFlow(q, gpu);
    }
    return chunk;
  }
}

std::optional<Chunk> ChunkQueue::Pop(const GpuFilter& eligible) {
  const bool offload_waiting =
      Eligible(classes_[static_cast<int>(TrafficClass::kOffload)], TrafficClass::kOffload, eligible);
  int higher = -1;
  for (int c = 0; c < static_cast<int>(TrafficClass::kOffload); ++c) {
    if (Eligible(classes_[c], static_cast<TrafficClass>(c), eligible)) {
      higher = c;
      break;
    }
  }
  if (higher < 0 && !offload_waiting) {
    // Only the lowest class may be left: projector copies go when nothing else waits.
    if (!Eligible(classes_[static_cast<int>(TrafficClass::kProjector)], TrafficClass::kProjector,
                  eligible)) {
      return std::nullopt;
    }
    return PopFromClass(TrafficClass::kProjector, eligible);
  }
  const bool contended = offload_waiting && higher >= 0;
  TrafficClass cls;
  if (higher < 0) {
    cls = TrafficClass::kOffload;
  } else if (contended &&
             static_cast<double>(contended_offload_bytes_) <
                 options_.offload_min_share * static_cast<double>(contended_total_bytes_)) {
    cls = TrafficClass::kOffload;
  } else {
    cls = static_cast<TrafficClass>(higher);
  }
  Chunk chunk = PopFromClass(cls, eligible);
  if (contended) {
    contended_total_bytes_ += chunk.len;
    if (cls == TrafficClass::kOffload) contended_offload_bytes_ += chunk.len;
    if (contended_total_bytes_ > options_.share_window_bytes) {
      contended_total_bytes_ /= 2;
      contended_offload_bytes_ /= 2;
    }
  }
  return chunk;
}

uint64_t ChunkQueue::Cancel(uint64_t transfer_id) {
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end()) return 0;
  const uint64_t dropped = it->second.transfer->bytes - it->second.next_offset;
  if (!it->second.parked) Dequeue(transfer_id, it->second, dropped);
  transfers_.erase(it);
  return dropped;
}

uint64_t ChunkQueue::Promote(uint64_t transfer_id, TrafficClass cls) {
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end()) return 0;
  Queued& t = it->second;
  if (static_cast<int>(cls) >= static_cast<int>(t.transfer->cls)) return 0;
  const uint64_t moved = t.transfer->bytes - t.next_offset;
  if (!t.parked) Dequeue(transfer_id, t, moved);
  t.transfer->cls = cls;
  if (!t.parked) Enqueue(transfer_id, t, moved);  // a parked one joins its new class at Unpark
  return moved;
}

uint64_t ChunkQueue::Park(uint64_t transfer_id) {
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end() || it->second.parked) return 0;
  Queued& t = it->second;
  const uint64_t parked = t.transfer->bytes - t.next_offset;
  Dequeue(transfer_id, t, parked);
  t.parked = true;
  return parked;
}

uint64_t ChunkQueue::Unpark(uint64_t transfer_id) {
  auto it = transfers_.find(transfer_id);
  if (it == transfers_.end() || !it->second.parked) return 0;
  Queued& t = it->second;
  const uint64_t back = t.transfer->bytes - t.next_offset;
  t.parked = false;
  Enqueue(transfer_id, t, back);
  return back;
}

uint64_t ChunkQueue::queued_bytes(TrafficClass cls) const {
  return classes_[static_cast<int>(cls)].queued_bytes;
}

uint64_t ChunkQueue::deficit_bytes(TrafficClass cls, const std::string& gpu) const {
  const ClassQueue& q = classes_[static_cast<int>(cls)];
  auto it = q.flows.find(gpu);
  return it == q.flows.end() ? 0 : it->second.deficit_bytes;
}

}  // namespace offloadd::sched
