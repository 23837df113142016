#include "server/pool/workload_trace.h"

#include <algorithm>
#include <cmath>
#include <random>
#include <utility>

namespace offloadd::pool {
namespace {

// One rank's operations in program order, built step by step.
struct RankProgram {
  std::vector<TraceOp> ops;
};

uint64_t LogUniform(std::mt19937_64& rng, uint64_t lo, uint64_t hi) {
  std::uniform_real_distribution<double> u(std::log(static_cast<double>(lo)),
                                           std::log(static_cast<double>(hi)));
  const auto v = static_cast<uint64_t>(std::exp(u(rng)));
  return std::clamp(v, lo, hi);
}

RankProgram MakeRank(const TraceOptions& o, std::mt19937_64& rng, uint32_t* next_block) {
  RankProgram p;
  std::uniform_real_distribution<double> coin(0.0, 1.0);
  std::uniform_int_distribution<int> layers_dist(o.min_layers, o.max_layers);
  std::uniform_int_distribution<int> life_dist(1, 2 * o.max_layers);
  // Side blocks waiting to be freed: (operation index at which to free, op).
  std::vector<std::pair<size_t, TraceOp>> pending;
  auto emit = [&](const TraceOp& op) {
    p.ops.push_back(op);
    // Free side blocks whose time has come, in order of their due time.
    std::sort(pending.begin(), pending.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    while (!pending.empty() && pending.front().first <= p.ops.size()) {
      TraceOp f = pending.front().second;
      pending.erase(pending.begin());
      p.ops.push_back(f);
    }
    if (coin(rng) < o.side_probability) {
      TraceOp side{true, (*next_block)++, LogUniform(rng, o.min_block_bytes, o.max_block_bytes)};
      p.ops.push_back(side);
      pending.push_back({p.ops.size() + life_dist(rng), TraceOp{false, side.block, side.bytes}});
    }
  };
  for (int step = 0; step < o.steps; ++step) {
    const int layers = layers_dist(rng);
    std::vector<TraceOp> stack;
    for (int l = 0; l < layers; ++l) {
      TraceOp a{true, (*next_block)++, LogUniform(rng, o.min_block_bytes, o.max_block_bytes)};
      stack.push_back(a);
      emit(a);
    }
    for (int l = layers - 1; l >= 0; --l) emit(TraceOp{false, stack[l].block, stack[l].bytes});
  }
  std::sort(pending.begin(), pending.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [due, op] : pending) p.ops.push_back(op);
  return p;
}

}  // namespace

Trace MakeTrace(const TraceOptions& options) {
  std::mt19937_64 rng(options.seed);
  uint32_t next_block = 0;
  std::vector<RankProgram> ranks;
  for (int r = 0; r < options.ranks; ++r) ranks.push_back(MakeRank(options, rng, &next_block));

  Trace t;
  t.blocks = next_block;
  // Interleave: each time pick a rank at random among those with operations left.
  std::vector<size_t> cursor(ranks.size(), 0);
  std::vector<int> live_ranks;
  for (int r = 0; r < options.ranks; ++r) {
    if (!ranks[r].ops.empty()) live_ranks.push_back(r);
  }
  uint64_t live = 0;
  while (!live_ranks.empty()) {
    std::uniform_int_distribution<size_t> pick(0, live_ranks.size() - 1);
    const size_t i = pick(rng);
    const int r = live_ranks[i];
    const TraceOp& op = ranks[r].ops[cursor[r]++];
    t.ops.push_back(op);
    if (op.allocate) {
      live += op.bytes;
      t.total_requested_bytes += op.bytes;
      t.peak_live_requested_bytes = std::max(t.peak_live_requested_bytes, live);
    } else {
      live -= op.bytes;
    }
    if (cursor[r] == ranks[r].ops.size()) live_ranks.erase(live_ranks.begin() + i);
  }
  return t;
}

ReplayResult Replay(const Trace& trace, ExtentAllocator* allocator) {
  ReplayResult res;
  std::vector<Extent> extents(trace.blocks);
  std::vector<bool> live(trace.blocks, false);
  for (const TraceOp& op : trace.ops) {
    if (op.allocate) {
      ++res.allocations;
      auto e = allocator->Allocate(op.bytes);
      if (!e.ok()) {
        ++res.failed_allocations;
        continue;
      }
      extents[op.block] = *e;
      live[op.block] = true;
      const uint64_t rounding = e->bytes - op.bytes;
      res.max_rounding_bytes = std::max(res.max_rounding_bytes, rounding);
      res.total_rounding_bytes += rounding;
    } else if (live[op.block]) {
      // A Free error here would be an allocator bug; the tests check stats afterwards.
      (void)allocator->Free(extents[op.block]);
      live[op.block] = false;
    }
  }
  return res;
}

}  // namespace offloadd::pool
