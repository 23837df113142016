#include "server/projector/refresh_queue.h"

namespace offloadd::projector {

void FairRefreshQueue::Push(const std::string& parameter, int64_t step, uint64_t id,
                            int64_t owner) {
  PerParameter& p = parameters_[parameter];
  p.owner = owner;
  p.by_step.emplace(step, id);
  ++queued_;
  if (!p.running && !p.in_ring) Enter(parameter, p);
}

void FairRefreshQueue::Enter(const std::string& parameter, PerParameter& p) {
  p.in_ring = true;
  PerOwner& o = owners_[p.owner];
  o.ring.push_back(parameter);
  if (!o.in_ring) {
    o.in_ring = true;
    owner_ring_.push_back(p.owner);
  }
}

absl::optional<FairRefreshQueue::Item> FairRefreshQueue::Pop() {
  // The owner served last goes behind every owner that has work now, including those that
  // arrived since: a newcomer waits for at most the one job handed out before it came.
  if (served_.has_value()) {
    owner_ring_.push_back(*served_);
    served_.reset();
  }
  if (owner_ring_.empty()) return absl::nullopt;
  const int64_t owner = owner_ring_.front();
  owner_ring_.pop_front();
  PerOwner& o = owners_[owner];
  std::string parameter = std::move(o.ring.front());  // never empty while in the owner ring
  o.ring.pop_front();
  if (o.ring.empty()) {
    owners_.erase(owner);
  } else {
    served_ = owner;  // stays in_ring: Enter only adds parameters to its ring
  }
  PerParameter& p = parameters_[parameter];
  p.in_ring = false;
  auto first = p.by_step.begin();  // never empty while in the ring
  Item item{parameter, first->first, first->second, owner};
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
    Enter(parameter, p);
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
  owners_.clear();
  owner_ring_.clear();
  served_.reset();
  queued_ = 0;
  return ids;
}

}  // namespace offloadd::projector
