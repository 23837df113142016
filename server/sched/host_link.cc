#include "server/sched/host_link.h"

#include <algorithm>
#include <utility>

#include "common/base/mutex.h"

namespace offloadd::sched {
namespace {

// As in LinkScheduler: while children have been waiting since the level's last virtual finish,
// the next turn starts at that finish even if it was decided late (the simulated level must not
// lose capacity to thread scheduling); after an idle gap it starts when a child began to wait.
// Catch-up is bounded by this much.
constexpr double kMaxCatchUpSeconds = 0.02;

}  // namespace

TurnQueue::TurnQueue(uint64_t quantum_bytes, std::map<std::string, uint32_t> weights)
    : quantum_bytes_(quantum_bytes == 0 ? 8ull << 20 : quantum_bytes),
      weights_(std::move(weights)) {}

int64_t TurnQueue::Quantum(const std::string& child) const {
  auto it = weights_.find(child);
  const uint64_t w = it == weights_.end() || it->second == 0 ? 1 : it->second;
  return static_cast<int64_t>(w * quantum_bytes_);
}

void TurnQueue::Join(const std::string& child) {
  auto [it, inserted] = children_.try_emplace(child);
  if (inserted) round_.push_back(child);
  ++it->second.waiting;
}

std::optional<std::string> TurnQueue::Next() {
  while (!round_.empty()) {
    const std::string child = round_.front();
    Child& c = children_.at(child);
    if (c.waiting == 0) {  // nothing to send: leave the round, drop the deficit
      children_.erase(child);
      round_.pop_front();
      continue;
    }
    if (!c.in_turn) {
      c.deficit_bytes += Quantum(child);
      c.in_turn = true;
    }
    if (c.deficit_bytes > 0) {
      --c.waiting;
      return child;
    }
    // Still in debt after this visit's quantum: next child. (Each visit adds a quantum, so a
    // waiting child is served within ceil(debt / quantum) rounds.)
    c.in_turn = false;
    round_.pop_front();
    round_.push_back(child);
  }
  return std::nullopt;
}

void TurnQueue::Charge(const std::string& child, uint64_t bytes) {
  auto it = children_.find(child);
  if (it == children_.end()) return;
  Child& c = it->second;
  c.deficit_bytes -= static_cast<int64_t>(bytes);
  if (c.deficit_bytes <= 0 && c.in_turn && !round_.empty() && round_.front() == child) {
    c.in_turn = false;
    round_.pop_front();
    round_.push_back(child);
  }
}

int64_t TurnQueue::deficit_bytes(const std::string& child) const {
  auto it = children_.find(child);
  return it == children_.end() ? 0 : it->second.deficit_bytes;
}

uint64_t TurnQueue::waiting(const std::string& child) const {
  auto it = children_.find(child);
  return it == children_.end() ? 0 : it->second.waiting;
}

HostLink::HostLink(HostLinkOptions options, Clock* clock)
    : options_(std::move(options)),
      clock_(clock),
      turns_(options_.quantum_bytes, options_.child_weights) {}

double HostLink::WaitTurn(const std::string& child) {
  const double rate = options_.bytes_per_second;
  base::MutexLock lock(mu_);
  if (waiters_++ == 0) backlog_since_seconds_ = clock_->NowSeconds();
  turns_.Join(child);
  for (;;) {
    if (granted_ && !taken_ && granted_child_ == child) {
      taken_ = true;
      --waiters_;
      return grant_start_seconds_;
    }
    if (!granted_) {
      const double now = clock_->NowSeconds();
      if (rate <= 0 || now >= free_at_seconds_) {
        // Decide the next turn now that the level is free; this waiter has joined, so
        // somebody is waiting.
        std::optional<std::string> next = turns_.Next();
        granted_ = true;
        taken_ = false;
        granted_child_ = *next;
        grant_start_seconds_ =
            rate > 0
                ? std::max({free_at_seconds_, backlog_since_seconds_, now - kMaxCatchUpSeconds})
                : now;
        cv_.notify_all();
        continue;
      }
      if (!sleeper_) {
        sleeper_ = true;
        const double t = free_at_seconds_;
        lock.Unlock();
        clock_->SleepUntil(t);
        lock.Lock();
        sleeper_ = false;
        continue;
      }
    }
    cv_.Wait(mu_);
  }
}

double HostLink::Commit(const std::string& child, uint64_t bytes) {
  base::MutexLock lock(mu_);
  turns_.Charge(child, bytes);
  const double start = grant_start_seconds_;
  double finish = start;
  if (options_.bytes_per_second > 0 && bytes > 0) {
    const double seconds = static_cast<double>(bytes) / options_.bytes_per_second;
    finish = start + seconds;
    free_at_seconds_ = finish;
    stats_.busy_seconds += seconds;
  }
  stats_.bytes += bytes;
  if (bytes > 0) stats_.child_bytes[child] += bytes;
  ++stats_.turns;
  granted_ = false;
  taken_ = false;
  cv_.notify_all();
  return finish;
}

HostLinkStats HostLink::stats() const {
  base::MutexLock lock(mu_);
  return stats_;
}

}  // namespace offloadd::sched
