#include "client/plan/plan_format.h"

#include <algorithm>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace offloadd::plan {
namespace {

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
constexpr double kMiB = 1024.0 * 1024.0;

std::string Ms(double seconds) { return absl::StrFormat("%.2f ms", seconds * 1e3); }
std::string Pct(double fraction) { return absl::StrFormat("%.1f %%", fraction * 1e2); }
std::string GBps(double bytes_per_second) {
  return absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9);
}

std::string JsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(c);
    } else if (static_cast<unsigned char>(c) < 0x20) {
      out += absl::StrFormat("\\u%04x", static_cast<int>(c));
    } else {
      out.push_back(c);
    }
  }
  return out + "\"";
}

std::string JsonDouble(double d) { return absl::StrFormat("%.17g", d); }

// "h100 (pcie5)" for a GPU name, else the link's name.
std::string LinkName(const Link& link) {
  if (link.host_link.empty() || link.host_link == link.name) return link.name;
  return absl::StrCat(link.name, " (", link.host_link, ")");
}

// ", tensor-parallel 8 (sequence-parallel)" with --tp above 1, else "".
std::string TensorParallelNote(const PlanInputs& in) {
  if (in.tensor_parallel_size <= 1) return "";
  return absl::StrCat(", tensor-parallel ", in.tensor_parallel_size, " (sequence-parallel)");
}

std::string Header(const Plan& p) {
  const PlanInputs& in = p.inputs;
  const ModelShape& m = in.model;
  return absl::StrCat(
      m.name.empty() ? "model" : m.name, ": ", m.layers, " layers, hidden ", m.hidden,
      ", attention width ", m.attention_width, ", ", WithThousands(m.params_per_layer),
      " params/layer\n", "  micro-batch ", in.micro_batch, ", ", DtypeName(in.dtype),
      " checkpoints (", p.checkpoint_bytes_per_element, " bytes/element), ", in.gpus_per_node,
      " GPUs/node, ", in.gpus_per_link, " GPU(s) per link", TensorParallelNote(in), "\n", "  link ", LinkName(in.link), " ",
      GBps(in.link.bytes_per_second), " per direction = ", GBps(p.link_bytes_per_second_per_gpu),
      " per GPU; compute ", absl::StrFormat("%g", in.compute_flops_per_second / 1e12),
      " TFLOP/s sustained\n");
}

std::string OverlapLine(const Plan& p) {
  if (p.full_overlap_min_seq_len == kNeverOverlaps) {
    return "never (reload exceeds 3 forwards at every practical length)";
  }
  if (p.full_overlap_min_seq_len <= 1) {
    return "at every sequence length (copy/forward falls as s grows: no largest s)";
  }
  return absl::StrCat("for s >= ", WithThousands(p.full_overlap_min_seq_len),
                      " tokens (copy/forward falls as s grows: no largest s)");
}

// One "label value note" line: label in 28 columns, value in 14, trailing spaces trimmed.
std::string Row(absl::string_view label, const std::string& value, const std::string& note) {
  std::string line = absl::StrFormat("%-28s %-14s", label, value);
  if (!note.empty()) absl::StrAppend(&line, " ", note);
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line + "\n";
}

// ", 22 still copying when backward starts: ..." when offloads fall behind forward, else "".
std::string InFlight(const Plan& p) {
  if (p.offloads_in_flight_at_backward == 0) return "";
  return absl::StrCat(", ", p.offloads_in_flight_at_backward,
                      " still copying when backward starts: copy > forward");
}

// "fits the GPU's 80.00 GiB" or "does not fit the GPU's 80.00 GiB".
std::string FitNote(uint64_t peak_bytes, uint64_t gpu_memory_bytes) {
  return absl::StrCat(peak_bytes <= gpu_memory_bytes ? "fits" : "does not fit", " the GPU's ",
                      FormatBytes(gpu_memory_bytes));
}

// The two ends of the peak with offload (planner.h gpu_peak_with_offload_min_bytes), each with
// when it applies and whether it fits the GPU.
std::string PeakWithOffloadRows(const Plan& p) {
  const PlanInputs& in = p.inputs;
  const uint64_t low = p.gpu_peak_with_offload_min_bytes;
  std::string high_note =
      absl::StrCat("if the peak comes elsewhere, where offload does not lower it: ",
                   FitNote(in.gpu_peak_bytes, in.gpu_memory_bytes));
  if (low <= in.gpu_memory_bytes && in.gpu_peak_bytes > in.gpu_memory_bytes) {
    absl::StrAppend(&high_note, "; measure the peak with offload on to tell which");
  }
  return absl::StrCat(
      Row("peak with offload, at least", FormatBytes(low),
          absl::StrCat("if the peak comes at the end of forward, where every checkpoint is "
                       "held: ",
                       FitNote(low, in.gpu_memory_bytes))),
      Row("peak with offload, at most", FormatBytes(in.gpu_peak_bytes), high_note));
}

// The GPU memory lines, with --gpu-memory (and --gpu-peak).
std::string GpuMemoryText(const Plan& p) {
  const PlanInputs& in = p.inputs;
  if (in.gpu_memory_bytes == 0) return "";
  std::string note = "(--gpu-memory)";
  if (in.gpu_peak_bytes == 0) {
    note = absl::StrFormat(
        "(--gpu-memory; the checkpoints alone are %.1f %% of it; give --gpu-peak to decide "
        "whether offload is needed)",
        100.0 * p.checkpoint_bytes_per_gpu / in.gpu_memory_bytes);
  }
  std::string out = Row("GPU memory per GPU", FormatBytes(in.gpu_memory_bytes), note);
  if (in.gpu_peak_bytes == 0) return out;
  absl::StrAppend(&out,
                  Row("peak without offload", FormatBytes(in.gpu_peak_bytes),
                      "(--gpu-peak: measured with checkpointing, offload off)"),
                  PeakWithOffloadRows(p));
  return out;
}

// What to change when the checkpoints do not fit the host RAM.
constexpr const char* kHostRamAdvice =
    "lower --seq or --batch, raise --keep-last-n, or give --nvme-gbps to plan the spill tier";

// "a reload takes 0.61 ms, hidden behind ..." or "... against ...: the step is 4.0 % slower".
std::string ReloadClause(const Plan& p) {
  if (p.overlaps_fully) {
    return absl::StrCat("a reload takes ", Ms(p.copy_seconds_per_layer), ", hidden behind ",
                        Ms(p.overlap_budget_seconds), " of recompute + backward");
  }
  return absl::StrCat("a reload takes ", Ms(p.copy_seconds_per_layer), " against ",
                      Ms(p.overlap_budget_seconds), " of recompute + backward: the step is ",
                      Pct(p.overlap_slowdown), " slower");
}

// The daemon's pool_bytes line (planner.h Plan::pool_bytes): as planned, capped at --host-ram,
// or none when the checkpoints alone exceed it.
std::string PoolLine(const Plan& p) {
  const PlanInputs& in = p.inputs;
  if (in.host_ram_bytes > 0 && p.pinned_host_bytes_per_node > in.host_ram_bytes) {
    return Row("offloadd.conf", "pool_bytes: none",
               absl::StrCat("(no pool fits: the checkpoints need ",
                            FormatBytes(p.pinned_host_bytes_per_node), " pinned per node, the "
                            "node has ", FormatBytes(in.host_ram_bytes), " (--host-ram); ",
                            kHostRamAdvice, ")"));
  }
  if (p.pool_bytes < p.pool_bytes_with_headroom) {
    return Row("offloadd.conf", absl::StrCat("pool_bytes: ", p.pool_bytes),
               absl::StrCat("(capped at the node's host RAM, --host-ram; the allocator "
                            "headroom wants ", p.pool_bytes_with_headroom,
                            ": a step whose pool fragments may wait for space)"));
  }
  return Row("offloadd.conf", absl::StrCat("pool_bytes: ", p.pool_bytes),
             absl::StrFormat("(pinned host RAM per node x %.2f allocator headroom, %d "
                             "rank(s) sharing the pool)",
                             p.pool_headroom, in.gpus_per_node));
}

// The decision line (planner.h Decision) with the figures behind it.
std::string DecisionText(const Plan& p) {
  const PlanInputs& in = p.inputs;
  std::string why;
  switch (p.decision) {
    case Decision::kNothingToOffload:
      why = absl::StrCat("keep_last_n=", in.keep_last_n, " keeps all ", in.model.layers,
                         " checkpoints on the GPU; lower --keep-last-n to offload");
      break;
    case Decision::kNotNeeded:
      why = absl::StrCat("the peak ", FormatBytes(in.gpu_peak_bytes), " fits the GPU's ",
                         FormatBytes(in.gpu_memory_bytes),
                         "; keep checkpointing and leave offload off");
      break;
    case Decision::kDoesNotFit:
      why =
          absl::StrCat("at best the peak falls to ", FormatBytes(p.gpu_peak_with_offload_min_bytes),
                       ", above the GPU's ", FormatBytes(in.gpu_memory_bytes),
                       "; shard further, lower --seq or --batch as well");
      break;
    case Decision::kHostRamShort:
      why = absl::StrCat("the offloaded checkpoints need ",
                         FormatBytes(p.pinned_host_bytes_per_node), " of pinned host RAM per node, "
                         "above the node's ", FormatBytes(in.host_ram_bytes), " (--host-ram); ",
                         kHostRamAdvice);
      break;
    case Decision::kUndecided:
      why = absl::StrCat(
          "whether offload is needed: without the run's peak the planner cannot tell; pass ",
          in.gpu_memory_bytes == 0 ? "--gpu-memory SIZE and " : "",
          "--gpu-peak SIZE (measured with checkpointing on, offload off); if needed, ",
          ReloadClause(p));
      break;
    case Decision::kCannotHide:
      why = absl::StrCat("a reload takes ", Ms(p.copy_seconds_per_layer), " against ",
                         Ms(p.overlap_budget_seconds), " of recompute + backward: the step is ",
                         Pct(p.overlap_slowdown),
                         " slower; a faster link, fewer GPUs per link or a longer --seq hides it");
      break;
    case Decision::kOffload:
      why = absl::StrCat("a reload takes ", Ms(p.copy_seconds_per_layer), ", hidden behind ",
                         Ms(p.overlap_budget_seconds), " of recompute + backward; frees ",
                         FormatBytes(p.gpu_bytes_freed_per_gpu), " per GPU");
      break;
  }
  static const char* const kHeadline[] = {
      "nothing to offload",           "offload not needed", "offload alone does not fit",
      "host RAM short",               "cannot decide",      "offload cannot hide the copy",
      "offload"};
  return Row("decision", kHeadline[static_cast<int>(p.decision)], absl::StrCat("(", why, ")"));
}

}  // namespace

std::string EnableCall(const Plan& p) {
  std::string args = absl::StrCat("keep_last_n=", p.inputs.keep_last_n, ", prefetch=1");
  if (p.checkpoint_bytes_per_layer < kDefaultThresholdBytes) {
    absl::StrAppend(&args, ", threshold_bytes=", p.checkpoint_bytes_per_layer);
  }
  return absl::StrCat("offloadd.transformers.enable(", args, ")");
}

std::string FormatSettingsText(const Plan& p, const std::string& config_lines) {
  if (p.decision == Decision::kNotNeeded || p.decision == Decision::kNothingToOffload) {
    return Row("settings", "none", "(no enable() call and no pool: offload stays off)");
  }
  std::string torch_call = EnableCall(p);
  torch_call.replace(0, torch_call.find('('), "offloadd.torch.offload_checkpoints");
  return absl::StrCat(
      Row("enable()", EnableCall(p), "then model.activation_checkpointing_enable(offload=True)"),
      Row("", absl::StrCat("(plain torch: `with ", torch_call, ":` around forward)"), ""),
      config_lines.empty() ? PoolLine(p) : config_lines);
}

std::string WithThousands(uint64_t n) {
  std::string digits = absl::StrCat(n);
  std::string out;
  const int len = static_cast<int>(digits.size());
  for (int i = 0; i < len; ++i) {
    if (i > 0 && (len - i) % 3 == 0) out.push_back(',');
    out.push_back(digits[i]);
  }
  return out;
}

std::string FormatBytes(uint64_t bytes) {
  const double b = static_cast<double>(bytes);
  if (b < kGiB) return absl::StrFormat("%.2f MiB", b / kMiB);
  return absl::StrFormat("%.2f GiB", b / kGiB);
}

std::string FormatPlanText(const Plan& p) {
  const auto& row = Row;
  const double fwd = p.forward_seconds_per_layer;
  const double matmul_s = p.matmul_flops_per_layer / p.inputs.compute_flops_per_second;
  const double attn_s = p.attention_flops_per_layer / p.inputs.compute_flops_per_second;
  std::string out = Header(p);
  absl::StrAppend(&out, "  sequence ", WithThousands(p.inputs.seq_len), " tokens per GPU");
  if (p.inputs.tensor_parallel_size > 1) {
    absl::StrAppend(&out, " group, ",
                    WithThousands(p.inputs.seq_len / p.inputs.tensor_parallel_size),
                    " in each GPU's checkpoint share");
  }
  absl::StrAppend(&out, "\n");
  absl::StrAppend(
      &out,
      row("checkpoint per layer", FormatBytes(p.checkpoint_bytes_per_layer),
          absl::StrCat("(", WithThousands(p.checkpoint_bytes_per_layer), " bytes)")),
      row("checkpoint per GPU", FormatBytes(p.checkpoint_bytes_per_gpu),
          absl::StrCat("(", WithThousands(p.checkpoint_bytes_per_gpu), " bytes)")),
      row("GPU memory freed per GPU", FormatBytes(p.gpu_bytes_freed_per_gpu),
          absl::StrCat("(", p.offloaded_layers, " of ", p.inputs.model.layers, " layers offloaded",
                       InFlight(p), "; keep_last_n=", p.inputs.keep_last_n, " keeps ",
                       std::min(p.inputs.keep_last_n, p.inputs.model.layers), " on the GPU)")),
      row("pinned host RAM per node", FormatBytes(p.pinned_host_bytes_per_node),
          absl::StrCat("(", WithThousands(p.pinned_host_bytes_per_node), " bytes)")),
      row("copy per layer, each way", Ms(p.copy_seconds_per_layer), ""),
      row("forward per layer", Ms(fwd),
          absl::StrCat("(matmul ", Ms(matmul_s), " + attention ", Ms(attn_s), ")")));
  absl::StrAppend(
      &out, row("copy / forward", Pct(p.copy_to_forward_ratio), ""),
      row("synchronous slowdown", Pct(p.sync_slowdown), "(2 copies over 4 forwards per layer)"),
      row("overlapped slowdown", Pct(p.overlap_slowdown),
          absl::StrCat("(reload hides behind 3 forwards = ", Ms(p.overlap_budget_seconds), ")")),
      row("reload overlaps fully", OverlapLine(p), ""), GpuMemoryText(p), DecisionText(p));
  return out;
}

std::string FormatPlanJson(const Plan& p) {
  const PlanInputs& in = p.inputs;
  const ModelShape& m = in.model;
  std::string model =
      absl::StrCat("{\"name\": ", JsonString(m.name), ", \"layers\": ", m.layers,
                   ", \"hidden\": ", m.hidden, ", \"attention_width\": ", m.attention_width,
                   ", \"params_per_layer\": ", m.params_per_layer, "}");
  std::string inputs = absl::StrCat(
      "{\"micro_batch\": ", in.micro_batch, ", \"seq_len\": ", in.seq_len, ", \"dtype\": \"",
      DtypeName(in.dtype), "\", \"gpus_per_node\": ", in.gpus_per_node,
      ", \"gpus_per_link\": ", in.gpus_per_link, ", \"link\": ", JsonString(in.link.name),
      ", \"host_link\": ", JsonString(in.link.host_link),
      ", \"link_bytes_per_second\": ", JsonDouble(in.link.bytes_per_second),
      ", \"compute_flops_per_second\": ", JsonDouble(in.compute_flops_per_second),
      ", \"keep_last_n\": ", in.keep_last_n, ", \"gpu_memory_bytes\": ", in.gpu_memory_bytes,
      ", \"gpu_peak_bytes\": ", in.gpu_peak_bytes,
      ", \"tensor_parallel_size\": ", in.tensor_parallel_size,
      ", \"host_ram_bytes\": ", in.host_ram_bytes, "}");
  return absl::StrCat(
      "{\"model\": ", model, ", \"inputs\": ", inputs,
      ", \"checkpoint_bytes_per_element\": ", p.checkpoint_bytes_per_element,
      ", \"checkpoint_bytes_per_layer\": ", p.checkpoint_bytes_per_layer,
      ", \"checkpoint_bytes_per_gpu\": ", p.checkpoint_bytes_per_gpu,
      ", \"offloaded_layers\": ", p.offloaded_layers,
      ", \"offloaded_bytes_per_gpu\": ", p.offloaded_bytes_per_gpu,
      ", \"offloads_in_flight_at_backward\": ", p.offloads_in_flight_at_backward,
      ", \"gpu_bytes_freed_per_gpu\": ", p.gpu_bytes_freed_per_gpu,
      ", \"pinned_host_bytes_per_node\": ", p.pinned_host_bytes_per_node,
      ", \"pool_headroom\": ", JsonDouble(p.pool_headroom),
      ", \"pool_bytes_with_headroom\": ", p.pool_bytes_with_headroom,
      ", \"pool_bytes\": ", p.pool_bytes,
      ", \"link_bytes_per_second_per_gpu\": ", JsonDouble(p.link_bytes_per_second_per_gpu),
      ", \"copy_seconds_per_layer\": ", JsonDouble(p.copy_seconds_per_layer),
      ", \"matmul_flops_per_layer\": ", JsonDouble(p.matmul_flops_per_layer),
      ", \"attention_flops_per_layer\": ", JsonDouble(p.attention_flops_per_layer),
      ", \"forward_seconds_per_layer\": ", JsonDouble(p.forward_seconds_per_layer),
      ", \"copy_to_forward_ratio\": ", JsonDouble(p.copy_to_forward_ratio),
      ", \"sync_slowdown\": ", JsonDouble(p.sync_slowdown),
      ", \"overlap_budget_seconds\": ", JsonDouble(p.overlap_budget_seconds),
      ", \"overlap_slowdown\": ", JsonDouble(p.overlap_slowdown),
      ", \"overlaps_fully\": ", p.overlaps_fully ? "true" : "false",
      ", \"full_overlap_min_seq_len\": ", p.full_overlap_min_seq_len,
      ", \"gpu_peak_with_offload_min_bytes\": ", p.gpu_peak_with_offload_min_bytes,
      ", \"decision\": \"", DecisionName(p.decision),
      "\", \"enable_call\": ", JsonString(EnableCall(p)), "}");
}

std::string FormatSweepText(const std::vector<Plan>& rows) {
  if (rows.empty()) return "";
  std::string out = Header(rows.front());
  absl::StrAppend(
      &out, absl::StrFormat("%10s %14s %16s %9s %9s %8s %10s\n", "seq", "ckpt/GPU", "host RAM/node",
                            "copy ms", "fwd ms", "sync %", "overlap %"));
  for (const Plan& p : rows) {
    absl::StrAppend(
        &out, absl::StrFormat("%10d %14s %16s %9.2f %9.2f %8.1f %10.1f\n", p.inputs.seq_len,
                              FormatBytes(p.checkpoint_bytes_per_gpu),
                              FormatBytes(p.pinned_host_bytes_per_node),
                              p.copy_seconds_per_layer * 1e3, p.forward_seconds_per_layer * 1e3,
                              p.sync_slowdown * 1e2, p.overlap_slowdown * 1e2));
  }
  absl::StrAppend(&out, "reload overlaps fully ", OverlapLine(rows.front()), "\n");
  return out;
}

std::string FormatSweepJson(const std::vector<Plan>& rows) {
  std::vector<std::string> items;
  items.reserve(rows.size());
  for (const Plan& p : rows) items.push_back(FormatPlanJson(p));
  return absl::StrCat("{\"sweep\": [", absl::StrJoin(items, ", "), "]}");
}

}  // namespace offloadd::plan
