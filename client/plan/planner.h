// Capacity planner for activation-checkpoint offload (`offloadctl plan`).
//
// Answers, to first order, three questions about offloading each checkpointed layer's input to
// pinned host RAM: how much host RAM it takes, how long the copies take against the layer's
// compute, and what that costs in step time with a synchronous copy versus an overlapped
// (prefetching) one.
//
// Source of every formula and figure: shared/reference/activation-checkpoint-offload.txt (cited
// below as [ref], by section), which itself takes link figures from Stas Bekman's ml-engineering
// book and the compute rate from the ALST paper. The model, quoted from [ref] "When the copy is
// free: the bandwidth arithmetic":
//   checkpoint per layer = b * s * h * dtype_bytes / tp            ("b*s*h*2 bytes" in bf16)
//   checkpoint per GPU   = L * checkpoint per layer    ([ref] "What it costs": L x b x s x h x 2)
//   pinned host per node = GPUs per node * (L - keep_last_n) * checkpoint per layer (same
//                          section, less the checkpoints keep_last_n leaves on the GPU)
//   copy per layer       = checkpoint per layer / (link rate / GPUs sharing the link)
//   forward per layer    = (2 * b*s * params_per_layer + 2 * b * s^2 * attention_width) / tp
//                          / rate
//   sync slowdown        = 2 copies / 4 forwards  (forward, recompute, backward counting as 2)
//   overlapped slowdown  = max(0, copy - 3 forwards) / 4 forwards
//                          (the reload of layer k-1 hides behind layer k's recompute + backward)
// First-order assumptions, all stated in [ref]: copies run at the full link rate, no HBM
// contention, no embedding or loss layers, no first-step pinning cost. Added here: GPUs that
// share a link copy at the same time and split it evenly; in the overlapped schedule forward
// never waits for an offload (Arctic's design per [ref]: a slow link costs memory, not time),
// so only the backward reload can cost time, and offloads that fall behind forward stay on the
// GPU into backward (Plan::offloads_in_flight_at_backward). Also added: the pool's allocator
// headroom (PoolHeadroom), the GPU memory decision (Decision) and the settings that follow
// (plan_format.h), the host RAM cap on the pool (PlanInputs::host_ram_bytes) and tensor
// parallelism (PlanInputs::tensor_parallel_size).
//
// Units: bytes are exact integers; "GB/s" in names and presets means 1e9 bytes/s (the GBps of
// [ref]); GiB in printed output is 2^30 bytes; times are seconds; slowdowns are fractions of the
// checkpointed step time without offload (0.157 = 15.7%).
#ifndef OFFLOADD_CLIENT_PLAN_PLANNER_H_
#define OFFLOADD_CLIENT_PLAN_PLANNER_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offloadd::plan {

// One transformer layer, as far as the planner needs it.
struct ModelShape {
  std::string name;              // label for output only
  int64_t layers = 0;            // L: checkpointed layers (one checkpoint each)
  int64_t hidden = 0;            // h: residual-stream width = checkpoint elements per token
  int64_t attention_width = 0;   // query heads x head_dim: width of the s^2 attention term
  int64_t params_per_layer = 0;  // matmul parameters of one layer (active ones for MoE)
  // Filled only when derived from a config.json (0 otherwise); informational.
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;
};

enum class CheckpointDtype { kBf16, kFp16, kFp32 };

// "bf16" | "fp16" | "fp32" (also "bfloat16", "float16", "float32"); else INVALID_ARGUMENT.
absl::StatusOr<CheckpointDtype> ParseDtype(absl::string_view text);
int DtypeBytes(CheckpointDtype dtype);  // 2, 2, 4
const char* DtypeName(CheckpointDtype dtype);

// Host link bandwidth per direction for one GPU alone.
struct Link {
  std::string name;               // preset or GPU name as given (lower case), or "custom"
  std::string host_link;          // the link preset it stands for ("pcie5" for "h100")
  double bytes_per_second = 0.0;  // per direction
};

// Link presets, all "reported" in [ref] "When the copy is free" (from the ml-engineering book):
//   pcie4       31 GB/s    PCIe 4 x16, one direction
//   pcie5       63 GB/s    PCIe 5 x16, one direction
//   h200        55.43 GB/s host-to-device measured with nvbandwidth on an 8x H200 node
//                          (device-to-host measured 55.06; [ref]'s worked figures use 55.43)
//   nvlink-c2c  450 GB/s   Grace CPU to its GPU, one direction (no official spec, per [ref])
// GPU names, each standing for its host link (sources: vendor documents as published):
//   h100   pcie5       H100 SXM5 and H100 PCIe both reach the host over PCIe Gen5 x16 (NVIDIA
//                      H100 PCIe product brief PB-11133-001: "a dual-slot 10.5 inch PCI Express
//                      Gen5 card"; H100 SXM5: PCIe Gen5 128 GB/s both directions together)
//   a100   pcie4       A100 PCIe and SXM4 use PCIe Gen4 x16 (NVIDIA A100 PCIe product brief
//                      PB-10137-001: "a dual-slot 10.5 inch PCI Express Gen4 card"; SXM4:
//                      32+32 GB/s PCIe Gen4 host-to-device)
//   b200   pcie5       the B200 itself has a PCIe Gen6 interface, but the host CPUs of a DGX
//                      B200 are "2 x Intel Xeon 8570 PCIe Gen5 CPUs" (NVIDIA DGX B200 user
//                      guide, hardware overview), so the link runs at Gen5; a Gen6 host: give
//                      its measured GB/s
//   gh200  nvlink-c2c  Grace Hopper's NVLink-C2C, 900 GB/s both directions together = 450 each
//   h200   the measured preset above
// `text` is a preset, a GPU name or a positive number of GB/s ("40", "12.5"); case is ignored.
// Else INVALID_ARGUMENT listing the accepted names.
absl::StatusOr<Link> ResolveLink(absl::string_view text);

// Allocator headroom of the pool: the arena's high-water mark over the peak live bytes, as
// docs/overview.md "Pool" documents it for the daemon's extent allocator on a variable-size checkpoint
// trace: ~1.05x for one rank, ~1.1x (worst seen 1.3x) for four ranks sharing the pool. A pool
// sized for the worst seen does not make a bad step's offloads wait for space; with one GPU per
// node (one rank) the one-rank figure is used, with several the several-rank worst.
inline constexpr double kPoolHeadroomOneRank = 1.05;
inline constexpr double kPoolHeadroomSeveralRanks = 1.3;
double PoolHeadroom(int64_t ranks_sharing_pool);

// offloadd.torch's default threshold_bytes: smaller saved tensors stay on the GPU.
inline constexpr uint64_t kDefaultThresholdBytes = 1 << 20;
// offloadd.torch's default keep_last_n.
inline constexpr int64_t kDefaultKeepLastN = 1;

// Default sustained compute rate: [ref] uses 500 TFLOP/s ("I use 500 below"), below ALST's
// reported 548.7-590.6 TFLOPS on H100s.
inline constexpr double kDefaultComputeFlopsPerSecond = 500e12;

// Bounds the planner accepts (plan() raises InvalidArgument outside them, naming the flag).
// The daemon's smallest pool (server/config.cc: pool_bytes must be at least 1 MiB): --host-ram
// below it would print a pool_bytes the daemon refuses.
inline constexpr uint64_t kMinPoolBytes = 1 << 20;
// Host link GB/s per direction and one GPU's sustained TFLOP/s: wider than any real link or GPU
// by two orders of magnitude or more either way; outside them a figure is a typo or a unit
// mix-up.
inline constexpr double kMinLinkGbps = 0.01, kMaxLinkGbps = 10000;
inline constexpr double kMinTflops = 0.001, kMaxTflops = 1e6;

struct PlanInputs {
  ModelShape model;
  int64_t micro_batch = 1;  // b
  // s: tokens per GPU after any context-parallel (Ulysses, ring attention) split, before the
  // tensor-parallel split below (the sequence the tensor-parallel group works on).
  int64_t seq_len = 0;
  CheckpointDtype dtype = CheckpointDtype::kBf16;
  int64_t gpus_per_node = 8;  // GPUs whose checkpoints share the node's pinned host RAM
  int64_t gpus_per_link = 1;  // GPUs behind one link (PCIe switch / host memory controller)
  Link link = {"h200", "h200", 55.43e9};
  double compute_flops_per_second = kDefaultComputeFlopsPerSecond;
  // offloadd.torch's keep_last_n: the newest n checkpoints of a step stay on the GPU (backward
  // needs them first) and are never offloaded. 0..; >= layers offloads nothing.
  int64_t keep_last_n = kDefaultKeepLastN;
  // GPU memory the run may use per GPU (bytes; 0 = not given) and the run's measured peak per
  // GPU with checkpointing and without offload (bytes, e.g. torch.cuda.max_memory_allocated();
  // 0 = not given). They decide whether offload is needed at all.
  uint64_t gpu_memory_bytes = 0;
  uint64_t gpu_peak_bytes = 0;
  // Tensor-parallel degree tp (Megatron-LM's tensor_model_parallel_size; 1 = none). Assumed
  // with Megatron sequence parallelism (--sequence-parallel), the setting Megatron pairs with
  // tensor parallelism: Korthikanti et al., "Reducing Activation Recomputation in Large
  // Transformer Models" (2022), section 4.2.2, split the activations of the layer-norm/dropout
  // regions, the layer input among them, along the sequence over the tp ranks, so each GPU
  // holds (and offloads) b*s*h/tp of every checkpoint. The matmuls are split over the ranks
  // (column/row parallel) and attention over heads, so each GPU's forward is 1/tp of the
  // layer's FLOPs. Without sequence parallelism every rank holds the whole layer input (b*s*h,
  // replicated): this model then understates the checkpoint bytes per GPU tp times. seq_len
  // must be a multiple of tp (Megatron's own requirement with sequence parallelism), and so must
  // the hidden size (the column-parallel split of each layer's weights). tp above gpus_per_node
  // (tensor parallelism across nodes) is accepted: Megatron allows it, though its all-reduces
  // then cross the network; `offloadctl plan` warns about it on stderr.
  int64_t tensor_parallel_size = 1;
  // The host RAM the node can pin for the pool (bytes; 0 = not given). When given, pool_bytes
  // never exceeds it: capped at it when the live checkpoints fit but the allocator headroom
  // does not, 0 (no pool that works) and Decision::kHostRamShort when the checkpoints alone do
  // not fit.
  uint64_t host_ram_bytes = 0;
};

// What the plan advises, first match wins:
//   kNothingToOffload  keep_last_n >= layers: every checkpoint stays on the GPU
//   kNotNeeded         the measured peak (--gpu-peak) fits --gpu-memory: leave offload off
//   kDoesNotFit        even freeing every offloaded checkpoint at the peak leaves more than
//                      --gpu-memory: offload alone does not make the run fit
//   kHostRamShort      the pinned host RAM per node the offloaded checkpoints need exceeds
//                      --host-ram: the pool cannot hold them (lower --seq or --batch, raise
//                      --keep-last-n, or plan the spill tier with --nvme-gbps)
//   kUndecided         no --gpu-peak (and so no way to tell whether the run fits the GPU
//                      without offload): whether offload is needed cannot be decided; the
//                      figures and settings hold if it is
//   kCannotHide        the reload takes longer than the 3 forwards it hides behind: offload
//                      works but costs overlap_slowdown of the step
//   kOffload           offload, and the overlapped copy costs nothing to first order
enum class Decision {
  kNothingToOffload,
  kNotNeeded,
  kDoesNotFit,
  kHostRamShort,
  kUndecided,
  kCannotHide,
  kOffload
};
// "nothing_to_offload", "not_needed", "does_not_fit", "host_ram_short", "undecided",
// "cannot_hide", "offload".
const char* DecisionName(Decision decision);

struct Plan {
  PlanInputs inputs;
  int64_t checkpoint_bytes_per_element = 0;
  uint64_t checkpoint_bytes_per_layer = 0;  // b*s*h*dtype / tp: one GPU's share
  uint64_t checkpoint_bytes_per_gpu = 0;    // L * per layer: held on the GPU without offload
  int64_t offloaded_layers = 0;             // max(0, L - keep_last_n)
  uint64_t offloaded_bytes_per_gpu = 0;     // offloaded_layers * per layer
  // Offloads still copying when forward ends. Forward never waits for an offload ([ref],
  // Arctic's design): with a copy slower than a forward they queue on the link and the
  // checkpoints wait on the GPU ("the cost shows up as memory"). Offload j (1-based) is issued
  // when layer j + keep_last_n saves its input and the link copies one at a time, so when
  // copy > forward the ones not done by the end of forward are offloaded_layers -
  // floor(offloaded_layers * forward / copy); 0 when copy <= forward.
  int64_t offloads_in_flight_at_backward = 0;
  // (offloaded_layers - in flight) * per layer: the GPU memory offload frees per GPU at the end
  // of forward, where every checkpoint is held; an upper bound on how far the peak falls ([ref]:
  // offload lowers the peak only if the checkpoints are part of what is held at the peak).
  uint64_t gpu_bytes_freed_per_gpu = 0;
  uint64_t pinned_host_bytes_per_node = 0;  // gpus_per_node * offloaded per GPU: the pool's peak
  double pool_headroom = 0.0;               // PoolHeadroom(gpus_per_node)
  // Pinned host * headroom, rounded up to a MiB: the pool the checkpoints want.
  uint64_t pool_bytes_with_headroom = 0;
  // The pool_bytes line: pool_bytes_with_headroom, at most host_ram_bytes when that is given;
  // 0 when the checkpoints alone exceed host_ram_bytes (kHostRamShort).
  uint64_t pool_bytes = 0;
  double link_bytes_per_second_per_gpu = 0.0;
  double copy_seconds_per_layer = 0.0;     // one direction; offload and reload each take this
  double matmul_flops_per_layer = 0.0;     // 2 * b*s * params_per_layer / tp (one GPU's)
  double attention_flops_per_layer = 0.0;  // 2 * b * s^2 * attention_width / tp
  double forward_seconds_per_layer = 0.0;
  double copy_to_forward_ratio = 0.0;
  double sync_slowdown = 0.0;           // 2*copy / (4*forward)
  double overlap_budget_seconds = 0.0;  // 3*forward: what a reload can hide behind
  double overlap_slowdown = 0.0;        // max(0, copy - 3*forward) / (4*forward)
  bool overlaps_fully = false;          // copy <= 3*forward
  // Smallest s (same b, model, link) from which the reload overlaps fully; 1 when it does at
  // every length; kNeverOverlaps if not below 1e18 tokens. The copy/forward ratio only falls as
  // s grows (copy ~ s, attention ~ s^2, [ref]), so full overlap holds for every s >= this value
  // and there is no largest overlapping length.
  int64_t full_overlap_min_seq_len = 0;
  // With gpu_peak_bytes: the peak with offload lies in [peak - freed, peak]; 0 without it.
  uint64_t gpu_peak_with_offload_min_bytes = 0;
  Decision decision = Decision::kOffload;
};

inline constexpr int64_t kNeverOverlaps = -1;

// Checks `inputs` and computes the plan. INVALID_ARGUMENT (naming the flag to fix) when a count
// is not positive (keep_last_n: negative), gpus_per_link > gpus_per_node, a rate is not
// positive, the link's GB/s or the TFLOP/s is outside [kMin, kMax] above ("out of range"),
// host_ram_bytes is given but below kMinPoolBytes, gpu_peak_bytes is given without
// gpu_memory_bytes or is below the checkpoints per GPU alone (then it was not measured with
// checkpointing on and offload off at these inputs), tensor_parallel_size is below 1 or does
// not divide seq_len or the model's hidden size, or the byte totals overflow 64 bits. Without
// gpu_peak_bytes the decision is kUndecided (or kNothingToOffload, kHostRamShort): whether
// offload is needed takes the run's measured peak.
absl::StatusOr<Plan> ComputePlan(const PlanInputs& inputs);

// The plan at each of `seq_lens` (other inputs unchanged), in the given order.
absl::StatusOr<std::vector<Plan>> Sweep(const PlanInputs& inputs,
                                        const std::vector<int64_t>& seq_lens);

// The spill tier (docs/spill.md): whether the node's checkpoints need local
// NVMe below a host pool of `host_ram_bytes`, and whether a disk of `nvme_bytes_per_second`
// (node-wide, one direction at a time) keeps up. Model, first order: the bytes that do not fit
// the pool are written to disk once per step while forward runs (L forwards) and read back
// once while backward runs (recompute + backward, 3L forwards); the disk keeps up when both
// fit in those times (the daemon's stage-ahead then has them back before they are reloaded).
struct SpillPlan {
  uint64_t host_ram_bytes = 0;
  double nvme_bytes_per_second = 0.0;
  bool needs_spill = false;           // pinned host bytes per node > host_ram_bytes
  uint64_t spill_bytes_per_node = 0;  // the excess, written and read once per step
  double forward_seconds_per_step = 0.0;   // L * forward per layer
  double backward_seconds_per_step = 0.0;  // 3 * L * forward per layer
  double spill_write_seconds_per_step = 0.0;  // spill bytes / nvme rate
  double stage_read_seconds_per_step = 0.0;
  // max(write / forward, read / backward): the disk's busy share in the busier phase.
  double disk_utilisation = 0.0;
  bool disk_keeps_up = true;  // disk_utilisation <= 1
};

// INVALID_ARGUMENT for a zero host RAM or a rate that is not positive and finite.
absl::StatusOr<SpillPlan> PlanSpill(const Plan& plan, uint64_t host_ram_bytes,
                                    double nvme_bytes_per_second);

// 1K, 2K, ... 512K tokens: the range of [ref]'s examples (4K to 128K, 93,750 for Llama-70B).
std::vector<int64_t> DefaultSweepSeqLens();

// Matmul parameters of one dense Llama/Qwen-style layer, as [ref] derives Qwen3-8B's
// 192,937,984: q and o projections of hidden x (heads*head_dim), grouped k and v projections of
// hidden x (kv_heads*head_dim), and a SwiGLU MLP of three hidden x intermediate matrices. Norm
// weights and biases are left out (as in [ref]'s figure).
int64_t DenseLayerParams(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         int64_t intermediate);

// Derives a ModelShape from the text of a Hugging Face config.json of a dense Llama/Qwen-style
// model. Reads num_hidden_layers, hidden_size, num_attention_heads, intermediate_size,
// num_key_value_heads (default: num_attention_heads) and head_dim (default: hidden_size /
// num_attention_heads, the Llama convention; Qwen3 configs on the Hub state head_dim). If the
// top level lacks num_hidden_layers but has a "text_config" object, that object is read.
// INVALID_ARGUMENT for malformed JSON, a missing or non-positive-integer field, a head_dim that
// does not divide hidden_size when derived, or a mixture-of-experts config (num_experts,
// num_local_experts or n_routed_experts > 0: give --params-per-layer with the active
// parameters instead).
absl::StatusOr<ModelShape> ModelFromHfConfig(absl::string_view json_text);

}  // namespace offloadd::plan

#endif  // OFFLOADD_CLIENT_PLAN_PLANNER_H_
