#include "client/plan/plan_command.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/string_view.h"
#include "client/plan/plan_format.h"
#include "client/plan/planner.h"
#include "common/base/bounded_file.h"

namespace offloadd::plan {
namespace {

// A single plan whose pinned host RAM per node exceeds --host-ram (plan_command.h).
constexpr int kExitDoesNotFit = 3;

constexpr const char* kValueFlags[] = {
    "layers", "hidden", "attn-width",    "params-per-layer", "hf-config", "batch",     "seq",
    "dtype",  "link",   "gpus-per-node", "gpus-per-link",    "tflops",    "sweep-seqs",
    "host-ram", "nvme-gbps", "keep-last-n", "gpu-memory", "gpu-peak", "tp"};
constexpr const char* kBoolFlags[] = {"sweep", "json", "help"};

bool IsOneOf(absl::string_view name, const char* const* begin, const char* const* end) {
  for (auto it = begin; it != end; ++it) {
    if (name == *it) return true;
  }
  return false;
}

struct Flags {
  std::map<std::string, std::string> values;
  bool sweep = false, json = false, help = false;
};

absl::StatusOr<Flags> ParseFlags(const std::vector<std::string>& args) {
  Flags f;
  for (size_t i = 0; i < args.size(); ++i) {
    absl::string_view arg = args[i];
    if (!absl::ConsumePrefix(&arg, "--")) {
      return absl::InvalidArgumentError(absl::StrCat("unexpected argument '", args[i], "'"));
    }
    std::string name(arg), value;
    bool has_value = false;
    if (size_t eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    std::replace(name.begin(), name.end(), '_', '-');  // --gpu_memory is --gpu-memory
    if (IsOneOf(name, std::begin(kBoolFlags), std::end(kBoolFlags))) {
      if (has_value) return absl::InvalidArgumentError(absl::StrCat("--", name, " takes no value"));
      (name == "sweep" ? f.sweep : name == "json" ? f.json : f.help) = true;
      continue;
    }
    if (!IsOneOf(name, std::begin(kValueFlags), std::end(kValueFlags))) {
      return absl::InvalidArgumentError(absl::StrCat("unknown flag --", name));
    }
    if (!has_value) {
      if (i + 1 >= args.size()) {
        return absl::InvalidArgumentError(absl::StrCat("--", name, " needs a value"));
      }
      value = args[++i];
    }
    f.values[name] = value;
  }
  return f;
}

// Positive integer, with an optional K (x1024) or M (x1048576) suffix where `allow_suffix`.
absl::StatusOr<int64_t> ParseCount(const std::string& flag, std::string text, bool allow_suffix) {
  int64_t scale = 1;
  if (allow_suffix && !text.empty()) {
    const char last = absl::ascii_toupper(text.back());
    if (last == 'K') scale = 1024;
    if (last == 'M') scale = 1024 * 1024;
    if (scale != 1) text.pop_back();
  }
  int64_t n = 0;
  if (!absl::SimpleAtoi(text, &n) || n <= 0 || n > INT64_MAX / scale) {
    return absl::InvalidArgumentError(absl::StrCat("--", flag, " must be a positive integer",
                                                   allow_suffix ? " (K/M allowed)" : "", ", got '",
                                                   text, "'"));
  }
  return n * scale;
}

// Bytes with an optional binary (KiB, MiB, GiB, TiB) or decimal (KB, MB, GB, TB) suffix.
absl::Status ReadFile(const std::string& path, std::string* out) {
  absl::StatusOr<std::string> text =
      base::ReadBoundedFile(path, kMaxHfConfigBytes, "--hf-config file");
  if (!text.ok()) {
    // NOT_FOUND whatever the cause: every file that cannot be read exits 1 (plan_command.h).
    return absl::NotFoundError(absl::StrCat(
        text.status().message(),
        " (pass a Hugging Face config.json: the model's, or one in tests/fixtures/hf/, e.g. "
        "tests/fixtures/hf/llama-3-70b.json)"));
  }
  *out = *std::move(text);
  return absl::OkStatus();
}

struct Request {
  PlanInputs inputs;
  bool sweep = false, json = false;
  std::vector<int64_t> sweep_seqs;
  uint64_t host_ram_bytes = 0;  // --host-ram; 0 = not given
  double nvme_bytes_per_second = 0;  // --nvme-gbps; 0 = not given
};

absl::StatusOr<Request> BuildRequest(const Flags& f) {
  Request r;
  r.json = f.json;
  r.sweep = f.sweep || f.values.count("sweep-seqs") > 0;
  auto get = [&](const char* key) -> const std::string* {
    auto it = f.values.find(key);
    return it == f.values.end() ? nullptr : &it->second;
  };
  ModelShape& m = r.inputs.model;
  if (const std::string* path = get("hf-config")) {
    std::string text;
    if (absl::Status s = ReadFile(*path, &text); !s.ok()) return s;
    absl::StatusOr<ModelShape> shape = ModelFromHfConfig(text);
    if (!shape.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(*path, ": ", shape.status().message()));
    }
    m = *std::move(shape);
    m.name = m.name.empty() ? *path : absl::StrCat(*path, " (", m.name, ")");
  } else {
    for (const char* required : {"layers", "hidden", "params-per-layer"}) {
      if (get(required) == nullptr) {
        return absl::InvalidArgumentError(absl::StrCat(
            "no model: give --hf-config FILE, or --layers, --hidden and --params-per-layer "
            "(missing --",
            required, ")"));
      }
    }
  }
  struct CountFlag {
    const char* name;
    int64_t* target;
    bool suffix;
  };
  for (const CountFlag& c :
       {CountFlag{"layers", &m.layers, false}, CountFlag{"hidden", &m.hidden, false},
        CountFlag{"attn-width", &m.attention_width, false},
        CountFlag{"params-per-layer", &m.params_per_layer, false},
        CountFlag{"batch", &r.inputs.micro_batch, false}, CountFlag{"seq", &r.inputs.seq_len, true},
        CountFlag{"gpus-per-node", &r.inputs.gpus_per_node, false},
        CountFlag{"gpus-per-link", &r.inputs.gpus_per_link, false},
        CountFlag{"tp", &r.inputs.tensor_parallel_size, false}}) {
    if (const std::string* v = get(c.name)) {
      absl::StatusOr<int64_t> n = ParseCount(c.name, *v, c.suffix);
      if (!n.ok()) return n.status();
      *c.target = *n;
    }
  }
  if (m.attention_width == 0) m.attention_width = m.hidden;  // documented default
  if (const std::string* v = get("keep-last-n")) {
    int64_t n = -1;
    if (!absl::SimpleAtoi(*v, &n) || n < 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--keep-last-n must be 0 or a positive integer, got '", *v, "'"));
    }
    r.inputs.keep_last_n = n;
  }
  for (auto [flag, target] : {std::pair<const char*, uint64_t*>{"gpu-memory",
                                                                &r.inputs.gpu_memory_bytes},
                              {"gpu-peak", &r.inputs.gpu_peak_bytes}}) {
    if (const std::string* v = get(flag)) {
      absl::StatusOr<uint64_t> bytes = ParseSize(flag, *v);
      if (!bytes.ok()) return bytes.status();
      *target = *bytes;
    }
  }
  if (const std::string* v = get("dtype")) {
    absl::StatusOr<CheckpointDtype> d = ParseDtype(*v);
    if (!d.ok()) return d.status();
    r.inputs.dtype = *d;
  }
  if (const std::string* v = get("link")) {
    absl::StatusOr<Link> link = ResolveLink(*v);
    if (!link.ok()) return link.status();
    r.inputs.link = *link;
  }
  if (const std::string* v = get("tflops")) {
    double tflops = 0;
    if (!absl::SimpleAtod(*v, &tflops) || !(tflops > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--tflops must be a positive number, got '", *v, "'"));
    }
    if (!(tflops >= kMinTflops && tflops <= kMaxTflops)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--tflops '", *v, "' is out of range (0.001 to 1000000 TFLOP/s): give one GPU's "
          "sustained rate in TFLOP/s (e.g. 500 for an H100 or H200 in bf16)"));
    }
    r.inputs.compute_flops_per_second = tflops * 1e12;
  }
  if (const std::string* v = get("host-ram")) {
    absl::StatusOr<uint64_t> bytes = ParseSize("host-ram", *v);
    if (!bytes.ok()) return bytes.status();
    if (*bytes < kMinPoolBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--host-ram '", *v, "' is below the daemon's smallest pool (1 MiB, 1048576 bytes): "
          "give the node's host RAM with a unit, e.g. 2TiB"));
    }
    r.host_ram_bytes = *bytes;
  }
  if (const std::string* v = get("nvme-gbps")) {
    double gbps = 0;
    if (!absl::SimpleAtod(*v, &gbps) || !(gbps > 0)) {
      return absl::InvalidArgumentError(
          absl::StrCat("--nvme-gbps must be a positive number of GB/s, got '", *v, "'"));
    }
    if (r.host_ram_bytes == 0) {
      return absl::InvalidArgumentError(
          "--nvme-gbps needs --host-ram (the host pool per node the disk extends)");
    }
    r.nvme_bytes_per_second = gbps * 1e9;
  }
  // Without a spill tier the pool is bounded by the host RAM (planner.h host_ram_bytes); with
  // one, the spill plan sizes the pool and the disk takes the rest.
  if (r.nvme_bytes_per_second == 0) r.inputs.host_ram_bytes = r.host_ram_bytes;
  if (const std::string* v = get("sweep-seqs")) {
    for (absl::string_view part : absl::StrSplit(*v, ',', absl::SkipEmpty())) {
      absl::StatusOr<int64_t> n = ParseCount("sweep-seqs", std::string(part), true);
      if (!n.ok()) return n.status();
      r.sweep_seqs.push_back(*n);
    }
  } else if (r.sweep) {
    r.sweep_seqs = DefaultSweepSeqLens();
  }
  if (r.sweep && r.inputs.gpu_peak_bytes > 0) {
    return absl::InvalidArgumentError(
        "--gpu-peak is one run's measured peak, at one --seq: drop --sweep or --gpu-peak");
  }
  if (r.sweep) {
    r.inputs.seq_len = r.sweep_seqs.empty() ? 0 : r.sweep_seqs.front();
  } else if (get("seq") == nullptr) {
    return absl::InvalidArgumentError("--seq is required (tokens per GPU), or use --sweep");
  }
  return r;
}

// A warning on `err` for each plan whose pinned host RAM per node exceeds `host_ram_bytes`;
// whether any did.
bool WarnHostRam(const std::vector<Plan>& plans, uint64_t host_ram_bytes, std::ostream& err) {
  if (host_ram_bytes == 0) return false;  // with --nvme-gbps the spill plan says it instead
  bool exceeded = false;
  for (const Plan& p : plans) {
    if (p.pinned_host_bytes_per_node <= host_ram_bytes) {
      if (p.pool_bytes_with_headroom > host_ram_bytes) {  // fits live, not with the headroom
        err << "offloadctl plan: note: at seq " << WithThousands(p.inputs.seq_len)
            << " pool_bytes with the allocator headroom, "
            << FormatBytes(p.pool_bytes_with_headroom) << ", exceeds the node's "
            << FormatBytes(host_ram_bytes)
            << " (--host-ram): pool_bytes is capped at what the node can pin; a step whose "
               "pool fragments may then wait for space\n";
      }
      continue;
    }
    exceeded = true;
    err << "offloadctl plan: warning: at seq " << WithThousands(p.inputs.seq_len)
        << " the pinned host RAM per node, " << FormatBytes(p.pinned_host_bytes_per_node) << " ("
        << p.inputs.gpus_per_node << " GPUs x " << FormatBytes(p.offloaded_bytes_per_gpu)
        << "), exceeds the node's " << FormatBytes(host_ram_bytes)
        << " (--host-ram): the daemon cannot pin it; lower --seq or --batch, keep more layers "
           "on the GPU (--keep-last-n), plan for more nodes, or give --nvme-gbps to plan the "
           "spill tier\n";
  }
  return exceeded;
}

// A warning on `err` when offload alone does not make the run fit --gpu-memory; whether so.
bool WarnGpuShort(const Plan& p, std::ostream& err) {
  if (p.decision != Decision::kDoesNotFit) return false;
  err << "offloadctl plan: warning: offload alone does not make the run fit: at best the peak "
         "falls to "
      << FormatBytes(p.gpu_peak_with_offload_min_bytes) << ", above the "
      << FormatBytes(p.inputs.gpu_memory_bytes)
      << " of --gpu-memory; shard further, or lower --seq or --batch as well\n";
  return true;
}

// The daemon's config lines for a plan with a spill tier: the pool is the host RAM given and
// the spill tier takes the rest (spill_capacity_bytes at least what a step spills). Empty when
// no spill is needed: FormatSettingsText's pool_bytes line holds.
std::string SpillConfigLines(const SpillPlan& s) {
  if (!s.needs_spill) return "";
  return absl::StrCat("offloadd.conf                pool_bytes: ", s.host_ram_bytes,
                      "   (the host RAM per node given)\n",
                      "                             spill_directory: \"/var/lib/offloadd/spill\"",
                      "   spill_capacity_bytes: ", s.spill_bytes_per_node,
                      "   (a local NVMe of at least that)\n");
}

// The spill tier's plan, as text lines.
std::string FormatSpillText(const SpillPlan& s) {
  std::ostringstream o;
  o << "spill tier (host RAM " << FormatBytes(s.host_ram_bytes) << ", NVMe "
    << absl::StrFormat("%.1f", s.nvme_bytes_per_second / 1e9) << " GB/s):\n";
  if (!s.needs_spill) {
    o << "  not needed: the checkpoints fit the host RAM\n";
    return o.str();
  }
  o << "  needed: " << FormatBytes(s.spill_bytes_per_node)
    << " per node go to disk each step (spill_directory)\n"
    << absl::StrFormat("  write %.3f s during forward (%.3f s), read back %.3f s during "
                       "backward (%.3f s): disk busy %.0f%% of the busier phase\n",
                       s.spill_write_seconds_per_step, s.forward_seconds_per_step,
                       s.stage_read_seconds_per_step, s.backward_seconds_per_step,
                       100 * s.disk_utilisation)
    << (s.disk_keeps_up
            ? "  the disk keeps up: reloads are staged back before backward needs them\n"
            : "  the disk does NOT keep up: offloads wait for spills (forward slows) and "
              "reloads wait for the disk; add host RAM, a faster disk, or lower --seq\n");
  return o.str();
}

std::string FormatSpillJson(const SpillPlan& s) {
  return absl::StrFormat(
      "{\"host_ram_bytes\": %d, \"nvme_bytes_per_second\": %.17g, \"needs_spill\": %s, "
      "\"spill_bytes_per_node\": %d, \"forward_seconds_per_step\": %.17g, "
      "\"backward_seconds_per_step\": %.17g, \"spill_write_seconds_per_step\": %.17g, "
      "\"stage_read_seconds_per_step\": %.17g, \"disk_utilisation\": %.17g, "
      "\"disk_keeps_up\": %s}",
      s.host_ram_bytes, s.nvme_bytes_per_second, s.needs_spill ? "true" : "false",
      s.spill_bytes_per_node, s.forward_seconds_per_step, s.backward_seconds_per_step,
      s.spill_write_seconds_per_step, s.stage_read_seconds_per_step, s.disk_utilisation,
      s.disk_keeps_up ? "true" : "false");
}

}  // namespace

absl::StatusOr<uint64_t> ParseSize(const std::string& flag, const std::string& text) {
  static const std::pair<const char*, double> kSuffixes[] = {
      {"TiB", 1099511627776.0}, {"GiB", 1073741824.0}, {"MiB", 1048576.0}, {"KiB", 1024.0},
      {"TB", 1e12}, {"GB", 1e9}, {"MB", 1e6}, {"KB", 1e3}, {"B", 1},
      {"T", 1099511627776.0}, {"G", 1073741824.0}, {"M", 1048576.0}, {"K", 1024.0}};
  absl::string_view number = absl::StripAsciiWhitespace(text);
  double scale = 1;
  for (const auto& [suffix, factor] : kSuffixes) {
    if (absl::ConsumeSuffix(&number, suffix)) {
      scale = factor;
      break;
    }
  }
  double value = 0;
  if (!absl::SimpleAtod(number, &value) || !(value > 0) || value * scale > 1.8e19) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--", flag, " must be a positive size like 2TiB, 1536GiB or 2000GB, got '", text, "'"));
  }
  return static_cast<uint64_t>(value * scale);
}


const char* PlanUsage() {
  return "usage: offloadctl plan (--hf-config FILE | --layers N --hidden N --params-per-layer N\n"
         "                        [--attn-width N]) --seq N [--batch N] [--dtype bf16|fp16|fp32]\n"
         "                       [--gpus-per-node N] [--gpus-per-link N] [--tp N]\n"
         "                       [--link pcie4|pcie5|h200|nvlink-c2c|h100|a100|b200|gh200|GB/s]\n"
         "                       [--tflops X] [--keep-last-n N (default 1)]\n"
         "                       [--gpu-memory SIZE [--gpu-peak SIZE (measured, offload off)]]\n"
         "                       [--host-ram SIZE (e.g. 2TiB: the pool never exceeds it)]\n"
         "                       [--nvme-gbps X (with --host-ram: plan the spill tier)]\n"
         "                       [--sweep [--sweep-seqs 4K,32K,...]] [--json]\n"
         "SIZE: a number with a unit, binary (KiB MiB GiB TiB, or K M G T) or decimal (KB MB GB\n"
         "TB), e.g. 80GiB or 141GB; a bare number is bytes. --seq and --sweep-seqs take K (x1024)\n"
         "or M (x1048576): 4K is 4096 tokens.\n"
         "Plans activation-checkpoint offload: host RAM, GPU memory freed, copy vs forward time\n"
         "per layer, the step slowdown of a synchronous and of an overlapped (prefetching) copy,\n"
         "whether to offload at all, and the enable() call and pool_bytes line that follow.\n"
         "Exit status: 0 planned; 1 --hf-config cannot be read; 2 usage or invalid input; 3 the\n"
         "run does not fit (offload alone leaves --gpu-peak above --gpu-memory, the pinned host\n"
         "RAM exceeds --host-ram, or the spill disk does not keep up): stderr says what to change.\n";
}

int RunPlanCommand(const std::vector<std::string>& args, std::ostream& out, std::ostream& err) {
  absl::StatusOr<Flags> flags = ParseFlags(args);
  if (!flags.ok()) {
    err << "offloadctl plan: " << flags.status().message() << "\n" << PlanUsage();
    return 2;
  }
  if (flags->help) {
    out << PlanUsage();
    return 0;
  }
  absl::StatusOr<Request> req = BuildRequest(*flags);
  if (!req.ok()) {
    err << "offloadctl plan: " << req.status().message() << "\n";
    return absl::IsNotFound(req.status()) ? 1 : 2;
  }
  if (req->inputs.tensor_parallel_size > req->inputs.gpus_per_node) {
    err << "offloadctl plan: warning: --tp " << req->inputs.tensor_parallel_size
        << " exceeds --gpus-per-node " << req->inputs.gpus_per_node
        << ": tensor parallelism then spans nodes and its all-reduces cross the network "
           "(Megatron allows it; usually tp <= GPUs per node); the plan assumes it as given\n";
  }
  if (req->sweep) {
    absl::StatusOr<std::vector<Plan>> rows = Sweep(req->inputs, req->sweep_seqs);
    if (!rows.ok()) {
      err << "offloadctl plan: " << rows.status().message() << "\n";
      return 2;
    }
    out << (req->json ? FormatSweepJson(*rows) + "\n" : FormatSweepText(*rows));
    WarnHostRam(*rows, req->host_ram_bytes, err);
    return 0;
  }
  absl::StatusOr<Plan> plan = ComputePlan(req->inputs);
  if (!plan.ok()) {
    err << "offloadctl plan: " << plan.status().message() << "\n";
    return 2;
  }
  if (req->nvme_bytes_per_second > 0) {
    absl::StatusOr<SpillPlan> spill =
        PlanSpill(*plan, req->host_ram_bytes, req->nvme_bytes_per_second);
    if (!spill.ok()) {
      err << "offloadctl plan: " << spill.status().message() << "\n";
      return 2;
    }
    if (req->json) {
      std::string json = FormatPlanJson(*plan);
      json.insert(json.rfind('}'), ", \"spill\": " + FormatSpillJson(*spill));
      out << json << "\n";
    } else {
      out << FormatPlanText(*plan) << FormatSpillText(*spill)
          << FormatSettingsText(*plan, SpillConfigLines(*spill));
    }
    if (spill->disk_keeps_up) return WarnGpuShort(*plan, err) ? kExitDoesNotFit : 0;
    err << "offloadctl plan: warning: the disk does not keep up with the spill this plan needs "
        << "(busy " << absl::StrFormat("%.0f", 100 * spill->disk_utilisation)
        << "% of a phase): add host RAM, a faster disk, or lower --seq\n";
    return kExitDoesNotFit;
  }
  out << (req->json ? FormatPlanJson(*plan) + "\n"
                    : FormatPlanText(*plan) + FormatSettingsText(*plan));
  const bool host_short = WarnHostRam({*plan}, req->host_ram_bytes, err);
  return WarnGpuShort(*plan, err) || host_short ? kExitDoesNotFit : 0;
}

int RunPlanCommand(int argc, char** argv) {
  std::vector<std::string> args;
  for (int i = 1; i < argc; ++i) args.emplace_back(argv[i]);
  return RunPlanCommand(args, std::cout, std::cerr);
}

}  // namespace offloadd::plan
