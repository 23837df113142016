#include "server/projector/refresh_queue.h"

namespace offloadd::projector {

void FairRefreshQueue::Push(const std::string& parameter, int64_t step, uint64_t id) {
  PerParameter& p = parameters_[parameter];
  p.by_step.emplace(step, id);
  ++queued_;
  if (!p.running && !p.in_ring) {
    p.in_ring = true;
    ring_.push_back(parameter);
  }
}

absl::optional<FairRefreshQueue::Item> FairRefreshQueue::Pop() {
  if (ring_.empty()) return absl::nullopt;
  std::string parameter = std::move(ring_.front());
  ring_.pop_front();
  PerParameter& p = parameters_[parameter];
  p.in_ring = false;
  auto first = p.by_step.begin();  // never empty while in the ring
  Item item{parameter, first->first, first->second};
  p.by_step.erase(first);
  p.running = true;
  --queued_;
  ++running_;
  return item;
}

void FairRefreshQueue::Done(const std::string& parameter) {
  auto it = parameters_.find(parameter);
  if (it == parameters_.end() || !it->second.running) return;
  PerParameter& p = it->second;
  p.running = false;
  --running_;
  if (p.by_step.empty()) {
    parameters_.erase(it);
  } else {
    p.in_ring = true;
    ring_.push_back(parameter);
  }
}

std::vector<uint64_t> FairRefreshQueue::TakeAll() {
  std::vector<uint64_t> ids;
  for (auto it = parameters_.begin(); it != parameters_.end();) {
    for (const auto& [step, id] : it->second.by_step) ids.push_back(id);
    it->second.by_step.clear();
    it->second.in_ring = false;
    if (it->second.running) {
      ++it;
    } else {
      it = parameters_.erase(it);
    }
  }
  ring_.clear();
  queued_ = 0;
  return ids;
}

}  // namespace offloadd::projector
