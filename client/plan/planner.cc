// [ref] = shared/reference/activation-checkpoint-offload.txt, section "When the copy is free: the
// bandwidth arithmetic" unless named; planner.h lists the formulas and assumptions.
#include "client/plan/planner.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/plan/json_value.h"

namespace offloadd::plan {
namespace {

absl::Status Invalid(const std::string& message) { return absl::InvalidArgumentError(message); }

// a*b into *out, false on uint64 overflow.
bool MulU64(uint64_t a, uint64_t b, uint64_t* out) { return !__builtin_mul_overflow(a, b, out); }

// [ref] "When the copy is free": the link is divided among the GPUs that share it.
double PerGpuLinkRate(const PlanInputs& in) {
  return in.link.bytes_per_second / static_cast<double>(in.gpus_per_link);
}

// One direction's copy of one GPU's share of a layer's checkpoint: b*s*h*dtype/tp bytes
// (planner.h PlanInputs::tensor_parallel_size) at the per-GPU link rate.
double CopySeconds(const PlanInputs& in, int64_t seq_len) {
  const double bytes = static_cast<double>(in.micro_batch) * seq_len * in.model.hidden *
                       DtypeBytes(in.dtype) / static_cast<double>(in.tensor_parallel_size);
  return bytes / PerGpuLinkRate(in);
}

// [ref]: "2 x tokens x (layer parameters) for the matmuls"; one GPU computes 1/tp of them.
double MatmulFlops(const PlanInputs& in, int64_t seq_len) {
  return 2.0 * static_cast<double>(in.micro_batch) * seq_len * in.model.params_per_layer /
         static_cast<double>(in.tensor_parallel_size);
}

// [ref]: "2 x b x s² x (attention width) for causal attention"; heads are split over tp.
double AttentionFlops(const PlanInputs& in, int64_t seq_len) {
  const double s = static_cast<double>(seq_len);
  return 2.0 * in.micro_batch * s * s * in.model.attention_width /
         static_cast<double>(in.tensor_parallel_size);
}

double ForwardSeconds(const PlanInputs& in, int64_t seq_len) {
  return (MatmulFlops(in, seq_len) + AttentionFlops(in, seq_len)) / in.compute_flops_per_second;
}

// [ref]: the reload of layer k-1 "hides behind layer k's recompute and backward, three
// forwards' worth of time, so it costs nothing until the copy is three times the forward".
constexpr double kForwardsToHideReload = 3.0;
// [ref]: "With checkpointing a step is about four forwards per layer: forward, recompute, and
// a backward that costs two."
constexpr double kForwardsPerStep = 4.0;
// [ref]: "The synchronous slowdown is two copies per layer over four forwards per layer."
constexpr double kSyncCopiesPerLayer = 2.0;

bool OverlapsFully(const PlanInputs& in, int64_t seq_len) {
  return CopySeconds(in, seq_len) <= kForwardsToHideReload * ForwardSeconds(in, seq_len);
}

// Smallest s with copy(s) <= 3*forward(s). Dividing both sides by b*s: the per-token copy
// time h*d/rate_per_gpu is constant while the per-token forward (2P + 2sw)/R grows with s, so
// the predicate is monotone and the crossover is s* = (R*h*d/(3*rate) - 2P) / (2w). The closed
// form gives a start; the loops settle it against the exact predicate used by the plan.
int64_t FullOverlapMinSeqLen(const PlanInputs& in) {
  const double per_token_copy =
      static_cast<double>(in.model.hidden) * DtypeBytes(in.dtype) / PerGpuLinkRate(in);
  const double crossover = (per_token_copy * in.compute_flops_per_second / kForwardsToHideReload -
                            2.0 * in.model.params_per_layer) /
                           (2.0 * in.model.attention_width);
  if (!(crossover < 1e18)) return kNeverOverlaps;
  int64_t s = crossover <= 1.0 ? 1 : static_cast<int64_t>(std::ceil(crossover));
  while (s > 1 && OverlapsFully(in, s - 1)) --s;
  while (!OverlapsFully(in, s)) ++s;
  return s;
}

// The link and compute rates within kMin/kMax (planner.h); a rate outside is a typo or a
// unit mix-up (bytes for GB/s, FLOP/s for TFLOP/s), and its figures would print hundreds of
// digits.
absl::Status CheckRates(const PlanInputs& in) {
  const double gbps = in.link.bytes_per_second / 1e9;
  if (!(gbps >= kMinLinkGbps && gbps <= kMaxLinkGbps)) {
    return Invalid(absl::StrFormat(
        "link bandwidth %g GB/s is out of range (0.01 to 10000 GB/s): set --link to the host "
        "link's GB/s per direction, or a preset (pcie4, pcie5, h200, nvlink-c2c)", gbps));
  }
  const double tflops = in.compute_flops_per_second / 1e12;
  if (!(tflops > 0)) {
    return Invalid("compute rate must be a positive number of TFLOP/s: set --tflops");
  }
  if (!(tflops >= kMinTflops && tflops <= kMaxTflops)) {
    return Invalid(absl::StrFormat(
        "compute rate %g TFLOP/s is out of range (0.001 to 1000000 TFLOP/s): set --tflops to "
        "one GPU's sustained rate in TFLOP/s (e.g. 500 for an H100 or H200 in bf16)", tflops));
  }
  return absl::OkStatus();
}

absl::Status HostRamTooSmall(const PlanInputs& in) {
  return Invalid(absl::StrCat("--host-ram (", in.host_ram_bytes,
                              " bytes) is below the daemon's smallest pool (1 MiB, 1048576 "
                              "bytes): give the node's host RAM with a unit, e.g. 2TiB"));
}

absl::Status Validate(const PlanInputs& in) {
  const ModelShape& m = in.model;
  if (m.layers <= 0) return Invalid("layers must be positive: set --layers or --hf-config");
  if (m.hidden <= 0) return Invalid("hidden size must be positive: set --hidden or --hf-config");
  if (m.attention_width <= 0) {
    return Invalid("attention width must be positive: set --attn-width (heads x head_dim)");
  }
  if (m.params_per_layer <= 0) {
    return Invalid("parameters per layer must be positive: set --params-per-layer or --hf-config");
  }
  if (in.micro_batch <= 0) return Invalid("micro-batch must be positive: set --batch");
  if (in.seq_len <= 0)
    return Invalid("sequence length must be positive: set --seq (tokens per GPU)");
  if (in.gpus_per_node <= 0) return Invalid("GPUs per node must be positive: set --gpus-per-node");
  if (in.gpus_per_link <= 0) return Invalid("GPUs per link must be positive: set --gpus-per-link");
  if (in.gpus_per_link > in.gpus_per_node) {
    return Invalid(absl::StrCat("--gpus-per-link (", in.gpus_per_link,
                                ") cannot exceed --gpus-per-node (", in.gpus_per_node, ")"));
  }
  if (!(in.link.bytes_per_second > 0)) {
    return Invalid("link bandwidth must be a positive number of GB/s: set --link");
  }
  if (absl::Status s = CheckRates(in); !s.ok()) return s;
  if (in.host_ram_bytes != 0 && in.host_ram_bytes < kMinPoolBytes) return HostRamTooSmall(in);
  if (in.keep_last_n < 0) return Invalid("--keep-last-n must be 0 or more");
  if (in.gpu_peak_bytes > 0 && in.gpu_memory_bytes == 0) {
    return Invalid("--gpu-peak needs --gpu-memory (the GPU memory the run may use per GPU)");
  }
  if (in.tensor_parallel_size <= 0) {
    return Invalid("tensor-parallel degree must be positive: set --tp (1 without tensor "
                   "parallelism)");
  }
  if (in.seq_len % in.tensor_parallel_size != 0) {
    return Invalid(absl::StrCat("--seq (", in.seq_len, ") must be a multiple of --tp (",
                                in.tensor_parallel_size,
                                "): sequence parallelism splits each layer's input along the "
                                "sequence over the tensor-parallel ranks"));
  }
  if (m.hidden % in.tensor_parallel_size != 0) {
    return Invalid(absl::StrCat("hidden size (", m.hidden, ") must be a multiple of --tp (",
                                in.tensor_parallel_size,
                                "): tensor parallelism splits each layer's weights along the "
                                "hidden dimension over the tensor-parallel ranks"));
  }
  return absl::OkStatus();
}

// The pool_bytes line: the live bytes times the headroom (PoolHeadroom), up to a whole MiB.
uint64_t PoolBytesWithHeadroom(uint64_t live_bytes, double headroom) {
  constexpr double kMiB = 1024.0 * 1024.0;
  const double mib = std::ceil(static_cast<double>(live_bytes) * headroom / kMiB);
  return static_cast<uint64_t>(mib) * (1u << 20);
}

// planner.h Plan::offloads_in_flight_at_backward: the serial copy queue of forward's offloads.
int64_t OffloadsInFlightAtBackward(const Plan& p) {
  if (p.copy_seconds_per_layer <= p.forward_seconds_per_layer) return 0;
  const double done = std::floor(static_cast<double>(p.offloaded_layers) *
                                 p.forward_seconds_per_layer / p.copy_seconds_per_layer);
  return p.offloaded_layers - static_cast<int64_t>(done);
}

// pool_bytes: the pool with its headroom, capped at the host RAM given (planner.h Plan).
uint64_t PoolBytes(const Plan& p) {
  const uint64_t host_ram = p.inputs.host_ram_bytes;
  if (host_ram == 0) return p.pool_bytes_with_headroom;
  if (p.pinned_host_bytes_per_node > host_ram) return 0;
  return std::min(p.pool_bytes_with_headroom, host_ram);
}

// The fields that follow from keep_last_n and the GPU memory figures (planner.h Decision).
absl::Status Decide(Plan* p) {
  const PlanInputs& in = p->inputs;
  if (in.gpu_peak_bytes > 0) {
    if (in.gpu_peak_bytes < p->checkpoint_bytes_per_gpu) {
      return Invalid(absl::StrCat(
          "--gpu-peak (", in.gpu_peak_bytes, " bytes) is below the checkpoints alone (",
          p->checkpoint_bytes_per_gpu,
          " bytes per GPU): measure the peak with checkpointing on and offload off, at the same "
          "--seq and --batch"));
    }
    p->gpu_peak_with_offload_min_bytes = in.gpu_peak_bytes - p->gpu_bytes_freed_per_gpu;
  }
  if (p->offloaded_layers == 0) {
    p->decision = Decision::kNothingToOffload;
  } else if (in.gpu_peak_bytes > 0 && in.gpu_peak_bytes <= in.gpu_memory_bytes) {
    p->decision = Decision::kNotNeeded;
  } else if (in.gpu_peak_bytes > 0 && p->gpu_peak_with_offload_min_bytes > in.gpu_memory_bytes) {
    p->decision = Decision::kDoesNotFit;
  } else if (in.host_ram_bytes > 0 && p->pinned_host_bytes_per_node > in.host_ram_bytes) {
    p->decision = Decision::kHostRamShort;
  } else if (in.gpu_peak_bytes == 0) {
    p->decision = Decision::kUndecided;
  } else if (!p->overlaps_fully) {
    p->decision = Decision::kCannotHide;
  } else {
    p->decision = Decision::kOffload;
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<CheckpointDtype> ParseDtype(absl::string_view text) {
  const std::string t = absl::AsciiStrToLower(text);
  if (t == "bf16" || t == "bfloat16") return CheckpointDtype::kBf16;
  if (t == "fp16" || t == "float16" || t == "half") return CheckpointDtype::kFp16;
  if (t == "fp32" || t == "float32" || t == "float") return CheckpointDtype::kFp32;
  return Invalid(absl::StrCat("unknown checkpoint dtype '", text, "': use bf16, fp16 or fp32"));
}

int DtypeBytes(CheckpointDtype dtype) { return dtype == CheckpointDtype::kFp32 ? 4 : 2; }

const char* DtypeName(CheckpointDtype dtype) {
  switch (dtype) {
    case CheckpointDtype::kBf16:
      return "bf16";
    case CheckpointDtype::kFp16:
      return "fp16";
    case CheckpointDtype::kFp32:
      return "fp32";
  }
  return "?";
}

absl::StatusOr<Link> ResolveLink(absl::string_view text) {
  // Link figures: [ref] "When the copy is free" (reported from the ml-engineering book); GPU
  // names and their sources: planner.h.
  static const std::pair<const char*, double> kLinks[] = {
      {"pcie4", 31e9}, {"pcie5", 63e9}, {"h200", 55.43e9}, {"nvlink-c2c", 450e9}};
  // GPU names (and the "c2c" alias) -> the link preset they stand for.
  static const std::pair<const char*, const char*> kGpus[] = {
      {"h100", "pcie5"}, {"a100", "pcie4"}, {"b200", "pcie5"}, {"gh200", "nvlink-c2c"},
      {"c2c", "nvlink-c2c"}};
  std::string t = absl::AsciiStrToLower(text);
  std::string name = t;
  for (const auto& [gpu, link] : kGpus) {
    if (t == gpu) t = link;
  }
  if (name == "c2c") name = "nvlink-c2c";
  for (const auto& [link, rate] : kLinks) {
    if (t == link) return Link{name, link, rate};
  }
  double gb_per_second = 0;
  if (absl::SimpleAtod(t, &gb_per_second) && gb_per_second > 0 && std::isfinite(gb_per_second)) {
    return Link{"custom", "custom", gb_per_second * 1e9};
  }
  return Invalid(absl::StrCat("unknown link '", text,
                              "': use a link (pcie4, pcie5, h200, nvlink-c2c), a GPU (h100, "
                              "a100, b200, gh200, h200) or a positive GB/s number"));
}

double PoolHeadroom(int64_t ranks_sharing_pool) {
  return ranks_sharing_pool <= 1 ? kPoolHeadroomOneRank : kPoolHeadroomSeveralRanks;
}

const char* DecisionName(Decision decision) {
  switch (decision) {
    case Decision::kNothingToOffload:
      return "nothing_to_offload";
    case Decision::kNotNeeded:
      return "not_needed";
    case Decision::kDoesNotFit:
      return "does_not_fit";
    case Decision::kHostRamShort:
      return "host_ram_short";
    case Decision::kUndecided:
      return "undecided";
    case Decision::kCannotHide:
      return "cannot_hide";
    case Decision::kOffload:
      return "offload";
  }
  return "?";
}

absl::StatusOr<Plan> ComputePlan(const PlanInputs& in) {
  if (absl::Status s = Validate(in); !s.ok()) return s;
  Plan p;
  p.inputs = in;
  p.checkpoint_bytes_per_element = DtypeBytes(in.dtype);
  uint64_t tokens = 0, per_token = 0;
  p.offloaded_layers = std::max<int64_t>(0, in.model.layers - in.keep_last_n);
  const int64_t tokens_per_gpu = in.seq_len / in.tensor_parallel_size;  // Validate: divides
  if (!MulU64(in.micro_batch, tokens_per_gpu, &tokens) ||
      !MulU64(in.model.hidden, p.checkpoint_bytes_per_element, &per_token) ||
      !MulU64(tokens, per_token, &p.checkpoint_bytes_per_layer) ||
      !MulU64(p.checkpoint_bytes_per_layer, in.model.layers, &p.checkpoint_bytes_per_gpu) ||
      !MulU64(p.checkpoint_bytes_per_layer, p.offloaded_layers, &p.offloaded_bytes_per_gpu) ||
      !MulU64(p.offloaded_bytes_per_gpu, in.gpus_per_node, &p.pinned_host_bytes_per_node) ||
      p.pinned_host_bytes_per_node > (uint64_t{1} << 62)) {
    return Invalid("checkpoint bytes overflow 64 bits: check --layers/--hidden/--batch/--seq");
  }
  p.pool_headroom = PoolHeadroom(in.gpus_per_node);
  p.pool_bytes_with_headroom = PoolBytesWithHeadroom(p.pinned_host_bytes_per_node, p.pool_headroom);
  p.pool_bytes = PoolBytes(p);
  p.link_bytes_per_second_per_gpu = PerGpuLinkRate(in);
  p.copy_seconds_per_layer = CopySeconds(in, in.seq_len);
  p.matmul_flops_per_layer = MatmulFlops(in, in.seq_len);
  p.attention_flops_per_layer = AttentionFlops(in, in.seq_len);
  p.forward_seconds_per_layer = ForwardSeconds(in, in.seq_len);
  p.copy_to_forward_ratio = p.copy_seconds_per_layer / p.forward_seconds_per_layer;
  const double step_seconds = kForwardsPerStep * p.forward_seconds_per_layer;
  p.sync_slowdown = kSyncCopiesPerLayer * p.copy_seconds_per_layer / step_seconds;
  p.overlap_budget_seconds = kForwardsToHideReload * p.forward_seconds_per_layer;
  p.overlaps_fully = OverlapsFully(in, in.seq_len);
  p.overlap_slowdown =
      p.overlaps_fully ? 0.0 : (p.copy_seconds_per_layer - p.overlap_budget_seconds) / step_seconds;
  p.full_overlap_min_seq_len = FullOverlapMinSeqLen(in);
  p.offloads_in_flight_at_backward = OffloadsInFlightAtBackward(p);
  p.gpu_bytes_freed_per_gpu =
      p.checkpoint_bytes_per_layer *
      static_cast<uint64_t>(p.offloaded_layers - p.offloads_in_flight_at_backward);
  if (absl::Status s = Decide(&p); !s.ok()) return s;
  return p;
}

absl::StatusOr<std::vector<Plan>> Sweep(const PlanInputs& inputs,
                                        const std::vector<int64_t>& seq_lens) {
  if (seq_lens.empty()) return Invalid("sweep needs at least one sequence length");
  std::vector<Plan> rows;
  rows.reserve(seq_lens.size());
  for (int64_t s : seq_lens) {
    PlanInputs in = inputs;
    in.seq_len = s;
    absl::StatusOr<Plan> p = ComputePlan(in);
    if (!p.ok()) return p.status();
    rows.push_back(*std::move(p));
  }
  return rows;
}

std::vector<int64_t> DefaultSweepSeqLens() {
  std::vector<int64_t> out;
  for (int64_t s = 1024; s <= 512 * 1024; s *= 2) out.push_back(s);
  return out;
}

int64_t DenseLayerParams(int64_t hidden, int64_t heads, int64_t kv_heads, int64_t head_dim,
                         int64_t intermediate) {
  const int64_t q_and_o = 2 * hidden * heads * head_dim;
  const int64_t k_and_v = 2 * hidden * kv_heads * head_dim;
  const int64_t swiglu_mlp = 3 * hidden * intermediate;  // gate, up, down
  return q_and_o + k_and_v + swiglu_mlp;
}

namespace {

// A positive integer field of a config object. `required` false: returns 0 when absent/null.
absl::StatusOr<int64_t> IntField(const JsonValue& obj, absl::string_view key, bool required) {
  const JsonValue* v = obj.Find(key);
  if (v == nullptr || v->is_null()) {
    if (!required) return 0;
    return Invalid(absl::StrCat("config.json has no \"", key,
                                "\": a dense Llama/Qwen-style config is needed, or give "
                                "--layers/--hidden/--attn-width/--params-per-layer"));
  }
  const double d = v->number();
  if (!v->is_number() || d < 1 || d > 1e12 || d != std::floor(d)) {
    return Invalid(absl::StrCat("config.json field \"", key, "\" must be a positive integer"));
  }
  return static_cast<int64_t>(d);
}

}  // namespace

absl::StatusOr<ModelShape> ModelFromHfConfig(absl::string_view json_text) {
  absl::StatusOr<JsonValue> root = ParseJson(json_text);
  if (!root.ok()) return Invalid(absl::StrCat("config.json: ", root.status().message()));
  if (!root->is_object()) return Invalid("config.json must hold a JSON object");
  const JsonValue* cfg = &*root;
  if (cfg->Find("num_hidden_layers") == nullptr) {
    const JsonValue* text = cfg->Find("text_config");
    if (text != nullptr && text->is_object()) cfg = text;
  }
  for (const char* moe_key : {"num_experts", "num_local_experts", "n_routed_experts"}) {
    const JsonValue* v = cfg->Find(moe_key);
    if (v != nullptr && v->is_number() && v->number() > 0) {
      return Invalid(absl::StrCat(
          "config.json describes a mixture-of-experts model (", moe_key,
          "): derivation covers dense models only; give --layers/--hidden/--attn-width and "
          "--params-per-layer counting the active experts"));
    }
  }
  ModelShape m;
  auto get = [&](absl::string_view key, bool required, int64_t* out) -> absl::Status {
    absl::StatusOr<int64_t> v = IntField(*cfg, key, required);
    if (!v.ok()) return v.status();
    *out = *v;
    return absl::OkStatus();
  };
  for (auto [key, out] : {std::pair<const char*, int64_t*>{"num_hidden_layers", &m.layers},
                          {"hidden_size", &m.hidden},
                          {"num_attention_heads", &m.num_attention_heads},
                          {"intermediate_size", &m.intermediate_size}}) {
    if (absl::Status s = get(key, true, out); !s.ok()) return s;
  }
  if (absl::Status s = get("num_key_value_heads", false, &m.num_key_value_heads); !s.ok()) return s;
  if (m.num_key_value_heads == 0) m.num_key_value_heads = m.num_attention_heads;
  if (absl::Status s = get("head_dim", false, &m.head_dim); !s.ok()) return s;
  if (m.head_dim == 0) {
    if (m.hidden % m.num_attention_heads != 0) {
      return Invalid(absl::StrCat("config.json: hidden_size ", m.hidden,
                                  " is not divisible by num_attention_heads ",
                                  m.num_attention_heads, "; add \"head_dim\""));
    }
    m.head_dim = m.hidden / m.num_attention_heads;
  }
  m.attention_width = m.num_attention_heads * m.head_dim;
  m.params_per_layer = DenseLayerParams(m.hidden, m.num_attention_heads, m.num_key_value_heads,
                                        m.head_dim, m.intermediate_size);
  for (const char* name_key : {"_name_or_path", "model_type"}) {
    const JsonValue* v = root->Find(name_key);
    if (v != nullptr && v->is_string() && !v->string_value().empty()) {
      m.name = v->string_value();
      break;
    }
  }
  return m;
}

absl::StatusOr<SpillPlan> PlanSpill(const Plan& plan, uint64_t host_ram_bytes,
                                    double nvme_bytes_per_second) {
  if (host_ram_bytes == 0) {
    return absl::InvalidArgumentError("--host-ram must be given (the pool size per node)");
  }
  if (host_ram_bytes < kMinPoolBytes) {
    PlanInputs in;
    in.host_ram_bytes = host_ram_bytes;
    return HostRamTooSmall(in);
  }
  if (!(nvme_bytes_per_second > 0) || !std::isfinite(nvme_bytes_per_second)) {
    return absl::InvalidArgumentError("--nvme-gbps must be a positive number of GB/s");
  }
  SpillPlan s;
  s.host_ram_bytes = host_ram_bytes;
  s.nvme_bytes_per_second = nvme_bytes_per_second;
  s.needs_spill = plan.pinned_host_bytes_per_node > host_ram_bytes;
  s.spill_bytes_per_node = s.needs_spill ? plan.pinned_host_bytes_per_node - host_ram_bytes : 0;
  const double layers = static_cast<double>(plan.inputs.model.layers);
  s.forward_seconds_per_step = layers * plan.forward_seconds_per_layer;
  s.backward_seconds_per_step = 3 * layers * plan.forward_seconds_per_layer;
  s.spill_write_seconds_per_step =
      static_cast<double>(s.spill_bytes_per_node) / nvme_bytes_per_second;
  s.stage_read_seconds_per_step = s.spill_write_seconds_per_step;
  if (s.needs_spill) {
    s.disk_utilisation =
        std::max(s.spill_write_seconds_per_step / s.forward_seconds_per_step,
                 s.stage_read_seconds_per_step / s.backward_seconds_per_step);
  }
  s.disk_keeps_up = s.disk_utilisation <= 1.0;
  return s;
}

}  // namespace offloadd::plan
