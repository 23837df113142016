// Synthetic offload trace for ExtentAllocator tests and benchmarks (testonly).
//
// Models activation-checkpoint offload (docs/ARCHITECTURE.md, "The workload"): each training step a
// rank offloads layers 1..L in order during forward and frees them L..1 during backward. Per step,
// L is uniform in [min_layers, max_layers] and every layer's size is drawn log-uniformly from
// [min_block_bytes, max_block_bytes] in whole bytes (not granule-aligned), so sizes change from
// step to step. Between layer operations, with side_probability each, a "side" block (same size
// law) is offloaded and freed after a uniform 1..2*max_layers further operations of its rank, so
// it may outlive the step and sit between stack blocks: the source of fragmentation.
// With ranks > 1 the steps of that many ranks sharing one pool are interleaved at random, one
// operation at a time (several GPUs' processes sharing the node's daemon).
#ifndef OFFLOADD_SERVER_POOL_WORKLOAD_TRACE_H_
#define OFFLOADD_SERVER_POOL_WORKLOAD_TRACE_H_

#include <cstdint>
#include <vector>

#include "server/pool/extent_allocator.h"

namespace offloadd::pool {

struct TraceOptions {
  uint64_t seed = 1;
  int steps = 40;
  int ranks = 1;
  int min_layers = 8;
  int max_layers = 48;
  uint64_t min_block_bytes = 4 << 10;
  uint64_t max_block_bytes = 64 << 20;
  double side_probability = 0.15;
};

struct TraceOp {
  bool allocate = true;  // false: free
  uint32_t block = 0;    // dense id, unique over the trace
  uint64_t bytes = 0;    // requested bytes (both for allocate and free)
};

struct Trace {
  std::vector<TraceOp> ops;
  uint32_t blocks = 0;                     // number of distinct block ids
  uint64_t peak_live_requested_bytes = 0;  // max over time of the sum of live requested bytes
  uint64_t total_requested_bytes = 0;      // sum over all allocations
};

Trace MakeTrace(const TraceOptions& options);

struct ReplayResult {
  uint64_t allocations = 0;
  uint64_t failed_allocations = 0;    // Allocate errors (the block is then skipped)
  uint64_t max_rounding_bytes = 0;    // max over blocks of (extent.bytes - requested)
  uint64_t total_rounding_bytes = 0;  // sum over blocks of (extent.bytes - requested)
};

// Replays `trace` on `allocator`, which must start empty; frees everything it allocated.
ReplayResult Replay(const Trace& trace, ExtentAllocator* allocator);

}  // namespace offloadd::pool

#endif  // OFFLOADD_SERVER_POOL_WORKLOAD_TRACE_H_
