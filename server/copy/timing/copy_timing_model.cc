#include "server/copy/timing/copy_timing_model.h"

#include <algorithm>
#include <limits>

namespace offloadd::copy {
namespace {

// A copy with at most this many bytes left is complete (floating-point residue of the fluid
// steps; a real copy is whole bytes).
constexpr double kResidueBytes = 1e-3;

double Share(double s) { return s > 0 && s <= 1 ? s : 1.0; }

}  // namespace

CopyTimingModel::CopyTimingModel(CopyModelOptions options) : options_(options) {
  options_.gpus = std::max(1, options_.gpus);
  options_.gpus_per_switch = std::max(1, options_.gpus_per_switch);
  if (!(options_.engine_bytes_per_second > 0)) options_.engine_bytes_per_second = 55e9;
  options_.h2d_share_while_d2h_busy = Share(options_.h2d_share_while_d2h_busy);
  options_.d2h_share_while_h2d_busy = Share(options_.d2h_share_while_h2d_busy);
  options_.switch_bytes_per_second = std::max(0.0, options_.switch_bytes_per_second);
  options_.gpus_per_numa_node = std::max(0, options_.gpus_per_numa_node);
  options_.first_gpu = std::max(0, options_.first_gpu);
  options_.cross_node_rate_factor = Share(options_.cross_node_rate_factor);
  engines_.resize(2 * static_cast<size_t>(options_.gpus));
}

CopyTimingModel::OpId CopyTimingModel::Enqueue(double now, int gpu, Direction direction,
                                               uint64_t bytes, const std::vector<OpId>& after,
                                               int host_numa_node) {
  AdvanceTo(now);
  if (gpu < 0 || gpu >= options_.gpus) gpu = 0;
  Op op{next_id_++, static_cast<double>(bytes), bytes, {}};
  if (host_numa_node >= 0 && host_numa_node != numa_node_of_gpu(gpu)) {
    op.rate_factor = options_.cross_node_rate_factor;
  }
  for (OpId a : after) {
    if (a != 0 && pending_.count(a) != 0) op.after.push_back(a);
  }
  pending_.insert(op.id);
  engine(gpu, direction).queue.push_back(std::move(op));
  // A 0-byte copy at the head with nothing to wait for completes now.
  AdvanceTo(now_seconds_);
  return next_id_ - 1;
}

int CopyTimingModel::numa_node_of_gpu(int gpu) const {
  return options_.gpus_per_numa_node > 0 ? (options_.first_gpu + gpu) / options_.gpus_per_numa_node
                                          : 0;
}

bool CopyTimingModel::HeadReady(const Engine& e) const {
  if (e.queue.empty()) return false;
  for (OpId a : e.queue.front().after) {
    if (pending_.count(a) != 0) return false;
  }
  return true;
}

void CopyTimingModel::Rates(std::vector<double>* rates) const {
  const int n = options_.gpus;
  rates->assign(engines_.size(), 0.0);
  std::vector<bool> ready(engines_.size());
  for (size_t i = 0; i < engines_.size(); ++i) ready[i] = HeadReady(engines_[i]);
  for (int g = 0; g < n; ++g) {
    const size_t d2h = 2 * g, h2d = 2 * g + 1;
    if (ready[d2h]) {
      (*rates)[d2h] =
          options_.engine_bytes_per_second * (ready[h2d] ? options_.d2h_share_while_h2d_busy : 1.0);
    }
    if (ready[h2d]) {
      (*rates)[h2d] =
          options_.engine_bytes_per_second * (ready[d2h] ? options_.h2d_share_while_d2h_busy : 1.0);
    }
  }
  for (size_t i = 0; i < engines_.size(); ++i) {
    if (ready[i]) (*rates)[i] *= engines_[i].queue.front().rate_factor;
  }
  if (options_.switch_bytes_per_second <= 0) return;
  const int per = options_.gpus_per_switch;
  for (int first = 0; first < n; first += per) {
    for (int dir = 0; dir < 2; ++dir) {
      double asked = 0;
      for (int g = first; g < std::min(n, first + per); ++g) asked += (*rates)[2 * g + dir];
      if (asked <= options_.switch_bytes_per_second) continue;
      const double f = options_.switch_bytes_per_second / asked;
      for (int g = first; g < std::min(n, first + per); ++g) (*rates)[2 * g + dir] *= f;
    }
  }
}

void CopyTimingModel::Complete(Engine& e, double at) {
  const Op& op = e.queue.front();
  ++e.stats.copies_done;
  e.stats.bytes_done += op.bytes;
  if (op.rate_factor < 1.0) ++e.stats.cross_node_copies;
  pending_.erase(op.id);
  completions_[op.id] = at;
  if (completions_.size() > kRememberedCompletions) completions_.erase(completions_.begin());
  e.queue.pop_front();
}

void CopyTimingModel::AdvanceTo(double now) {
  if (!started_) {
    started_ = true;
    now_seconds_ = now;
  }
  std::vector<double> rates;
  for (;;) {
    Rates(&rates);
    // Copies of 0 bytes (or residue) at a ready head complete at once.
    bool completed = false;
    for (size_t i = 0; i < engines_.size(); ++i) {
      if (rates[i] > 0 && engines_[i].queue.front().remaining_bytes <= kResidueBytes) {
        Complete(engines_[i], now_seconds_);
        completed = true;
      }
    }
    if (completed) continue;
    double step = std::numeric_limits<double>::infinity();
    size_t first_done = 0;
    for (size_t i = 0; i < engines_.size(); ++i) {
      if (rates[i] <= 0) continue;
      const double dt = engines_[i].queue.front().remaining_bytes / rates[i];
      if (dt < step) {
        step = dt;
        first_done = i;
      }
    }
    const bool reaches = now_seconds_ + step <= now;
    if (!reaches) step = std::max(0.0, now - now_seconds_);
    for (size_t i = 0; i < engines_.size(); ++i) {
      if (rates[i] <= 0) continue;
      engines_[i].queue.front().remaining_bytes -= rates[i] * step;
      engines_[i].stats.busy_seconds += step;
    }
    now_seconds_ += step;
    if (!reaches) return;  // also when nothing moves (step was infinite)
    engines_[first_done].queue.front().remaining_bytes = 0;  // exactly, whatever the rounding
  }
}

bool CopyTimingModel::Done(OpId op) const {
  return op == 0 || (op < next_id_ && pending_.count(op) == 0);
}

double CopyTimingModel::CompletionSeconds(OpId op) const {
  auto it = completions_.find(op);
  return it == completions_.end() ? -1 : it->second;
}

size_t CopyTimingModel::queued(int gpu, Direction direction) const {
  if (gpu < 0 || gpu >= options_.gpus) return 0;
  return engines_[2 * gpu + static_cast<int>(direction)].queue.size();
}

ModelEngineStats CopyTimingModel::engine_stats(int gpu, Direction direction) const {
  if (gpu < 0 || gpu >= options_.gpus) return {};
  return engines_[2 * gpu + static_cast<int>(direction)].stats;
}

}  // namespace offloadd::copy
