// ExtentAllocator throughput and overhead on the synthetic offload trace (server/pool/
// workload_trace.h): layers of log-uniform 4 KiB..64 MiB blocks allocated forward and freed in
// reverse each step, with side blocks interleaved; Arg(0) = ranks sharing the pool.
//
// Counters: ops/s (allocations + frees), overhead_ratio = arena high-water / peak live requested
// bytes, max_rounding_bytes and mean_rounding_bytes per block (granule rounding waste).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <vector>

#include "server/pool/extent_allocator.h"
#include "server/pool/workload_trace.h"

namespace offloadd::pool {
namespace {

void BM_TraceReplay(benchmark::State& state) {
  TraceOptions o;
  o.seed = 7;
  o.ranks = static_cast<int>(state.range(0));
  o.side_probability = o.ranks == 1 ? 0.15 : 0.10;
  const Trace trace = MakeTrace(o);
  ReplayResult result;
  AllocatorStats stats;
  for (auto _ : state) {
    ExtentAllocator allocator(uint64_t{1} << 40);
    result = Replay(trace, &allocator);
    stats = allocator.stats();
    benchmark::DoNotOptimize(stats);
  }
  if (result.failed_allocations != 0) state.SkipWithError("allocation failed in the trace");
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * trace.ops.size()));
  state.counters["overhead_ratio"] =
      static_cast<double>(stats.high_water_bytes) / trace.peak_live_requested_bytes;
  state.counters["max_rounding_bytes"] = static_cast<double>(result.max_rounding_bytes);
  state.counters["mean_rounding_bytes"] =
      static_cast<double>(result.total_rounding_bytes) / result.allocations;
}
BENCHMARK(BM_TraceReplay)->Arg(1)->Arg(4)->ArgName("ranks");

// One Allocate + Free of a random size while Arg(0) free extents exist (every other 64 KiB slot
// of the pool is live): the cost as the free set grows (O(log n) expected).
void BM_AllocateFreeFragmented(benchmark::State& state) {
  const uint64_t holes = static_cast<uint64_t>(state.range(0));
  constexpr uint64_t kSlot = 64 << 10;
  ExtentAllocator allocator(2 * holes * kSlot + kSlot);
  std::vector<Extent> slots;
  for (uint64_t i = 0; i < 2 * holes; ++i) slots.push_back(*allocator.Allocate(kSlot));
  for (uint64_t i = 0; i < slots.size(); i += 2) (void)allocator.Free(slots[i]);
  std::mt19937_64 rng(1);
  std::vector<uint64_t> sizes(4096);
  for (auto& s : sizes) s = 4096 + rng() % (kSlot - 4096);
  size_t k = 0;
  for (auto _ : state) {
    auto e = allocator.Allocate(sizes[k++ & 4095]);
    benchmark::DoNotOptimize(e);
    (void)allocator.Free(*e);
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * 2));
  state.counters["free_extents"] = static_cast<double>(allocator.stats().free_extents);
}
BENCHMARK(BM_AllocateFreeFragmented)->Arg(16)->Arg(1024)->Arg(65536)->ArgName("holes");

}  // namespace
}  // namespace offloadd::pool

BENCHMARK_MAIN();
