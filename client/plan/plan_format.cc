#include "client/plan/plan_format.h"

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

std::string Header(const Plan& p) {
  const PlanInputs& in = p.inputs;
  const ModelShape& m = in.model;
  return absl::StrCat(
      m.name.empty() ? "model" : m.name, ": ", m.layers, " layers, hidden ", m.hidden,
      ", attention width ", m.attention_width, ", ", WithThousands(m.params_per_layer),
      " params/layer\n", "  micro-batch ", in.micro_batch, ", ", DtypeName(in.dtype),
      " checkpoints (", p.checkpoint_bytes_per_element, " bytes/element), ", in.gpus_per_node,
      " GPUs/node, ", in.gpus_per_link, " GPU(s) per link\n", "  link ", in.link.name, " ",
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

}  // namespace

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
  auto row = [](absl::string_view label, const std::string& value, const std::string& note) {
    std::string line = absl::StrFormat("%-28s %-14s", label, value);
    if (!note.empty()) absl::StrAppend(&line, " ", note);
    while (!line.empty() && line.back() == ' ') line.pop_back();
    return line + "\n";
  };
  const double fwd = p.forward_seconds_per_layer;
  const double matmul_s = p.matmul_flops_per_layer / p.inputs.compute_flops_per_second;
  const double attn_s = p.attention_flops_per_layer / p.inputs.compute_flops_per_second;
  std::string out = Header(p);
  absl::StrAppend(&out, "  sequence ", WithThousands(p.inputs.seq_len), " tokens per GPU\n");
  absl::StrAppend(&out,
                  row("checkpoint per layer", FormatBytes(p.checkpoint_bytes_per_layer),
                      absl::StrCat("(", WithThousands(p.checkpoint_bytes_per_layer), " bytes)")),
                  row("checkpoint per GPU", FormatBytes(p.checkpoint_bytes_per_gpu),
                      absl::StrCat("(", WithThousands(p.checkpoint_bytes_per_gpu), " bytes)")),
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
      row("reload overlaps fully", OverlapLine(p), ""));
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
      ", \"link_bytes_per_second\": ", JsonDouble(in.link.bytes_per_second),
      ", \"compute_flops_per_second\": ", JsonDouble(in.compute_flops_per_second), "}");
  return absl::StrCat(
      "{\"model\": ", model, ", \"inputs\": ", inputs,
      ", \"checkpoint_bytes_per_element\": ", p.checkpoint_bytes_per_element,
      ", \"checkpoint_bytes_per_layer\": ", p.checkpoint_bytes_per_layer,
      ", \"checkpoint_bytes_per_gpu\": ", p.checkpoint_bytes_per_gpu,
      ", \"pinned_host_bytes_per_node\": ", p.pinned_host_bytes_per_node,
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
      ", \"full_overlap_min_seq_len\": ", p.full_overlap_min_seq_len, "}");
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
