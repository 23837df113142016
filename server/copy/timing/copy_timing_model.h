// CopyTimingModel: the timing of a node's GPU copy engines, as arithmetic. No bytes
// move and no thread runs here: callers say what was queued when, and ask what has completed by
// a given time. SimCudaApi (cuda/cuda_api_sim.h) puts it behind CudaApi so the real cuda engine
// can be measured on a machine without a GPU. Every figure it produces is SIMULATED.
//
// What is modelled:
//  - Each GPU has one device-to-host (D2H) and one host-to-device (H2D) copy engine. An engine
//    serves the copies queued on it one at a time, in the order they were queued, at
//    `engine_bytes_per_second` (default 55e9: nvbandwidth on an 8x H200 node measured 55.43 GB/s
//    H2D and 55.06 GB/s D2H; shared/reference/activation-checkpoint-offload.txt).
//  - A copy starts only once every operation it was queued after has completed (`after`: the
//    previous copy on its stream, events the stream waits on), even if that holds the engine.
//  - Contention between directions (optional): while a GPU's D2H engine is moving bytes, its H2D
//    engine runs at `h2d_share_while_d2h_busy` of its rate (nvbandwidth#11: ~0.5 on A100), and
//    the reverse with `d2h_share_while_h2d_busy`. 1 = none (default).
//  - Contention among GPUs behind one switch (optional): GPUs 0..n-1 are grouped by
//    `gpus_per_switch`; when the engines of one direction behind a switch ask for more than
//    `switch_bytes_per_second` together, each gets the same fraction of what it asks for.
//    0 = no limit (default).
//  - NUMA placement (optional): GPUs are grouped into host memory (NUMA) nodes by
//    `gpus_per_numa_node` (GPU g is on node g / gpus_per_numa_node; 0 = every GPU on node 0). A
//    copy whose host buffer is on another node than its GPU runs at `cross_node_rate_factor` of
//    the rate it would get otherwise. Default 1 (no penalty). For scale: torchtitan#3519
//    measured ~330 GB/s D2H into NUMA-local pinned memory against ~115 GB/s across nodes on a
//    GB200 (a factor of ~0.35), and pytorch#160420 reports pinned blocks reused across nodes
//    ~30 % slower (~0.7). Copies whose host node is unknown (-1) pay nothing.
// Rates change only when a copy starts or ends, so the model is a fluid simulation between those
// events: exact up to floating point, whatever order or time callers ask in.
//
// Units: seconds (any monotonic origin, as long as one model sees one clock), bytes, bytes/s.
// Not thread-safe: SimCudaApi serialises calls.
#ifndef OFFLOADD_SERVER_COPY_TIMING_COPY_TIMING_MODEL_H_
#define OFFLOADD_SERVER_COPY_TIMING_COPY_TIMING_MODEL_H_

#include <cstdint>
#include <deque>
#include <map>
#include <unordered_set>
#include <vector>

#include "server/copy/copy_engine.h"

namespace offloadd::copy {

struct CopyModelOptions {
  int gpus = 8;
  int gpus_per_switch = 4;                // GPUs g and h share a switch when g/n == h/n; >= 1
  double engine_bytes_per_second = 55e9;  // per GPU and direction, > 0
  double h2d_share_while_d2h_busy = 1.0;  // in (0, 1]
  double d2h_share_while_h2d_busy = 1.0;  // in (0, 1]
  double switch_bytes_per_second = 0;     // per switch and direction; 0 = no limit
  int gpus_per_numa_node = 0;             // GPU g on node g / n; 0 = all GPUs on node 0
  double cross_node_rate_factor = 1.0;    // in (0, 1]; rate factor of a cross-node copy
  // The node-wide ordinal of this model's GPU 0, when a model holds only some of a node's GPUs
  // (SimCudaApi keeps one model per group of coupled GPUs): NUMA nodes count from it. >= 0; a
  // multiple of gpus_per_switch when a switch limit is set.
  int first_gpu = 0;
};

// What one engine has done since the model started.
struct ModelEngineStats {
  uint64_t copies_done = 0;
  uint64_t bytes_done = 0;
  double busy_seconds = 0;  // time with a copy moving bytes
  uint64_t cross_node_copies = 0;  // completed copies that paid the cross-node factor
};

class CopyTimingModel {
 public:
  using OpId = uint64_t;  // 0 = no operation (always complete)

  // Options out of range are clamped (gpus >= 1, gpus_per_switch >= 1, shares into (0, 1]).
  explicit CopyTimingModel(CopyModelOptions options);

  // Queues a copy of `bytes` on the engine of (`gpu`, `direction`) at time `now`, behind every
  // copy queued on that engine before and after the operations in `after` (0 entries ignored).
  // Advances the model to `now` first. gpu outside [0, gpus): the copy goes to gpu 0's engine
  // (callers validate). A copy of 0 bytes completes as soon as it reaches the engine.
  // `host_numa_node`: the node of the copy's host buffer; when >= 0 and not numa_node_of_gpu(gpu)
  // the copy moves at cross_node_rate_factor of its rate. -1 = unknown (no penalty).
  OpId Enqueue(double now, int gpu, Direction direction, uint64_t bytes,
               const std::vector<OpId>& after, int host_numa_node = -1);

  // The NUMA node the model puts `gpu` on (see gpus_per_numa_node).
  int numa_node_of_gpu(int gpu) const;

  // Moves the model's time to `now` (earlier times are ignored: time never goes back).
  void AdvanceTo(double now);
  double now_seconds() const { return now_seconds_; }

  // Whether `op` has completed by the model's time (call AdvanceTo first). Unknown ids that were
  // never issued count as not complete.
  bool Done(OpId op) const;
  // Completion time of `op` if it completed by the model's time and is among the last
  // kRememberedCompletions completions; -1 otherwise.
  double CompletionSeconds(OpId op) const;
  static constexpr size_t kRememberedCompletions = 1 << 16;

  // Copies queued on an engine and not completed.
  size_t queued(int gpu, Direction direction) const;
  ModelEngineStats engine_stats(int gpu, Direction direction) const;
  const CopyModelOptions& options() const { return options_; }

 private:
  struct Op {
    OpId id;
    double remaining_bytes;
    uint64_t bytes;
    std::vector<OpId> after;
    double rate_factor = 1.0;  // cross_node_rate_factor for a cross-node copy
  };
  struct Engine {
    std::deque<Op> queue;
    ModelEngineStats stats;
  };
  Engine& engine(int gpu, Direction d) { return engines_[2 * gpu + static_cast<int>(d)]; }
  bool HeadReady(const Engine& e) const;
  // Fills `rates` (bytes/s per engine; 0 = not moving) for the current state.
  void Rates(std::vector<double>* rates) const;
  void Complete(Engine& e, double at);

  CopyModelOptions options_;
  std::vector<Engine> engines_;  // index 2 * gpu + direction
  std::unordered_set<OpId> pending_;
  std::map<OpId, double> completions_;  // recent ones, for CompletionSeconds
  OpId next_id_ = 1;
  double now_seconds_ = 0;
  bool started_ = false;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_TIMING_COPY_TIMING_MODEL_H_
