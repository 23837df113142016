// Planner tests. The worked figures come from client/plan/testdata/plan_vectors.json, shared
// with client/python/tests/test_plan.py; each is checked at the precision the reference
// document (shared/reference/activation-checkpoint-offload.txt) prints it.
#include "client/plan/planner.h"

#include <cmath>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "absl/strings/str_cat.h"
#include "client/plan/json_value.h"
#include "client/plan/plan_format.h"
#include "gtest/gtest.h"

namespace offloadd::plan {
namespace {

std::string Runfile(const std::string& rel) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr) return rel;  // run from the repository root
  return absl::StrCat(srcdir, "/", ws ? ws : "offloadd", "/", rel);
}

std::string ReadRunfile(const std::string& rel) {
  std::ifstream in(Runfile(rel), std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << Runfile(rel);
  std::stringstream buf;
  buf << in.rdbuf();
  return buf.str();
}

const JsonValue& Vectors() {
  static const JsonValue* v = [] {
    absl::StatusOr<JsonValue> parsed =
        ParseJson(ReadRunfile("client/plan/testdata/plan_vectors.json"));
    EXPECT_TRUE(parsed.ok()) << parsed.status();
    return new JsonValue(parsed.ok() ? *parsed : JsonValue());
  }();
  return *v;
}

int64_t Int(const JsonValue& obj, const char* key) {
  const JsonValue* v = obj.Find(key);
  EXPECT_NE(v, nullptr) << key;
  return v == nullptr ? 0 : static_cast<int64_t>(v->number());
}

ModelShape VectorModel(const std::string& name) {
  const JsonValue* m = Vectors().Find("models")->Find(name);
  EXPECT_NE(m, nullptr) << name;
  ModelShape shape;
  shape.name = name;
  shape.layers = Int(*m, "layers");
  shape.hidden = Int(*m, "hidden");
  shape.attention_width = Int(*m, "attention_width");
  shape.params_per_layer = Int(*m, "params_per_layer");
  return shape;
}

PlanInputs VectorInputs(const ModelShape& model, const JsonValue& in) {
  PlanInputs p;
  p.model = model;
  p.micro_batch = Int(in, "batch");
  p.seq_len = Int(in, "seq");
  p.dtype = *ParseDtype(in.Find("dtype")->string_value());
  p.gpus_per_node = Int(in, "gpus_per_node");
  p.gpus_per_link = Int(in, "gpus_per_link");
  p.link = *ResolveLink(in.Find("link")->string_value());
  p.compute_flops_per_second = in.Find("tflops")->number() * 1e12;
  // Optional inputs (plan_vectors.json "about"): absent = the planner's defaults.
  if (in.Find("keep_last_n") != nullptr) p.keep_last_n = Int(in, "keep_last_n");
  if (in.Find("gpu_memory") != nullptr) p.gpu_memory_bytes = Int(in, "gpu_memory");
  if (in.Find("gpu_peak") != nullptr) p.gpu_peak_bytes = Int(in, "gpu_peak");
  if (in.Find("tp") != nullptr) p.tensor_parallel_size = Int(in, "tp");
  if (in.Find("host_ram") != nullptr) p.host_ram_bytes = Int(in, "host_ram");
  return p;
}

// The plan's figure in the unit the vector key names (same table as test_plan.py).
double Quantity(const Plan& p, const std::string& key) {
  constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;
  const std::map<std::string, double> q = {
      {"copy_ms", p.copy_seconds_per_layer * 1e3},
      {"forward_ms", p.forward_seconds_per_layer * 1e3},
      {"sync_slowdown_pct", p.sync_slowdown * 100},
      {"overlap_slowdown_pct", p.overlap_slowdown * 100},
      {"copy_to_forward_pct", p.copy_to_forward_ratio * 100},
      {"checkpoint_bytes_per_layer", static_cast<double>(p.checkpoint_bytes_per_layer)},
      {"checkpoint_bytes_per_gpu", static_cast<double>(p.checkpoint_bytes_per_gpu)},
      {"pinned_host_bytes_per_node", static_cast<double>(p.pinned_host_bytes_per_node)},
      {"checkpoint_gib_per_gpu", p.checkpoint_bytes_per_gpu / kGiB},
      {"pinned_host_gib_per_node", p.pinned_host_bytes_per_node / kGiB},
      {"full_overlap_min_seq_len", static_cast<double>(p.full_overlap_min_seq_len)},
      {"link_gbps", p.inputs.link.bytes_per_second / 1e9},
      {"offloaded_layers", static_cast<double>(p.offloaded_layers)},
      {"offloads_in_flight_at_backward", static_cast<double>(p.offloads_in_flight_at_backward)},
      {"gpu_freed_bytes_per_gpu", static_cast<double>(p.gpu_bytes_freed_per_gpu)},
      {"gpu_freed_gib_per_gpu", p.gpu_bytes_freed_per_gpu / kGiB},
      {"pool_headroom", p.pool_headroom},
      {"pool_bytes", static_cast<double>(p.pool_bytes)},
      {"pool_bytes_with_headroom", static_cast<double>(p.pool_bytes_with_headroom)},
      {"pool_gib", p.pool_bytes / kGiB},
      {"checkpoint_pct_of_gpu_memory",
       100.0 * p.checkpoint_bytes_per_gpu / static_cast<double>(p.inputs.gpu_memory_bytes)},
      {"gpu_peak_with_offload_min_bytes", static_cast<double>(p.gpu_peak_with_offload_min_bytes)},
  };
  auto it = q.find(key);
  EXPECT_NE(it, q.end()) << "unknown vector key " << key;
  return it == q.end() ? NAN : it->second;
}

TEST(PlannerVectors, WorkedFiguresAtPrintedPrecision) {
  const JsonValue* cases = Vectors().Find("cases");
  ASSERT_NE(cases, nullptr);
  ASSERT_GE(cases->items().size(), 10u);
  for (const JsonValue& c : cases->items()) {
    const std::string name = c.Find("name")->string_value();
    absl::StatusOr<Plan> p =
        ComputePlan(VectorInputs(VectorModel(c.Find("model")->string_value()), *c.Find("inputs")));
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    for (const auto& [key, want] : c.Find("expect")->members()) {
      const double value = want.Find("value")->number();
      const double tol = 0.5 * std::pow(10.0, -want.Find("decimals")->number()) * (1 + 1e-12);
      EXPECT_LE(std::fabs(Quantity(*p, key) - value), tol)
          << name << ": " << key << " = " << Quantity(*p, key) << ", want " << value;
    }
  }
}

// Inputs both planners refuse, with the sentence each must contain (plan_vectors.json).
TEST(PlannerVectors, InvalidInputsAreRefusedWithASentence) {
  const JsonValue* rows = Vectors().Find("invalid_inputs");
  ASSERT_NE(rows, nullptr);
  ASSERT_GE(rows->items().size(), 6u);
  for (const JsonValue& c : rows->items()) {
    ModelShape model = VectorModel(c.Find("model")->string_value());
    if (c.Find("hidden") != nullptr) model.hidden = Int(c, "hidden");
    absl::StatusOr<Plan> p = ComputePlan(VectorInputs(model, *c.Find("inputs")));
    const std::string want = c.Find("error")->string_value();
    ASSERT_FALSE(p.ok()) << want;
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << p.status();
    EXPECT_NE(p.status().message().find(want), std::string::npos) << p.status() << "\n" << want;
  }
}

// The decision, the enable() call and the peak bracket each case states (plan_vectors.json).
TEST(PlannerVectors, DecisionsEnableCallsAndPeakBrackets) {
  int decisions = 0, calls = 0, brackets = 0;
  for (const JsonValue& c : Vectors().Find("cases")->items()) {
    const std::string name = c.Find("name")->string_value();
    absl::StatusOr<Plan> p =
        ComputePlan(VectorInputs(VectorModel(c.Find("model")->string_value()), *c.Find("inputs")));
    ASSERT_TRUE(p.ok()) << name << ": " << p.status();
    if (const JsonValue* d = c.Find("expect_decision")) {
      ++decisions;
      EXPECT_EQ(DecisionName(p->decision), d->string_value()) << name;
    }
    if (const JsonValue* call = c.Find("expect_enable_call")) {
      ++calls;
      EXPECT_EQ(EnableCall(*p), call->string_value()) << name;
    }
    if (const JsonValue* measured = c.Find("measured_peak_with_offload_bytes")) {
      ++brackets;
      EXPECT_LE(p->gpu_peak_with_offload_min_bytes, measured->number()) << name;
      EXPECT_GE(p->inputs.gpu_peak_bytes, measured->number()) << name;
    }
  }
  EXPECT_GE(decisions, 8);  // every decision name is exercised by the vectors
  EXPECT_GE(calls, 2);
  EXPECT_GE(brackets, 3);
}

TEST(PlannerVectors, HfConfigFixturesParseToVectorModels) {
  for (const JsonValue& entry : Vectors().Find("hf_configs")->items()) {
    const std::string file = entry.Find("file")->string_value();
    absl::StatusOr<ModelShape> m = ModelFromHfConfig(ReadRunfile(file));
    ASSERT_TRUE(m.ok()) << file << ": " << m.status();
    const ModelShape want = VectorModel(entry.Find("model")->string_value());
    EXPECT_EQ(m->layers, want.layers) << file;
    EXPECT_EQ(m->hidden, want.hidden) << file;
    EXPECT_EQ(m->attention_width, want.attention_width) << file;
    EXPECT_EQ(m->params_per_layer, want.params_per_layer) << file;
    const JsonValue& e = *entry.Find("expect");
    EXPECT_EQ(m->num_attention_heads, Int(e, "num_attention_heads")) << file;
    EXPECT_EQ(m->num_key_value_heads, Int(e, "num_key_value_heads")) << file;
    EXPECT_EQ(m->head_dim, Int(e, "head_dim")) << file;
    EXPECT_EQ(m->intermediate_size, Int(e, "intermediate_size")) << file;
    EXPECT_EQ(m->name, e.Find("name")->string_value()) << file;
  }
}

TEST(PlannerVectors, TextMatchesGoldenSharedWithPython) {
  ASSERT_GE(Vectors().Find("golden_texts")->items().size(), 3u);
  for (const JsonValue& g : Vectors().Find("golden_texts")->items()) {
    absl::StatusOr<ModelShape> m =
        ModelFromHfConfig(ReadRunfile(g.Find("hf_config")->string_value()));
    ASSERT_TRUE(m.ok()) << m.status();
    absl::StatusOr<Plan> p = ComputePlan(VectorInputs(*m, *g.Find("inputs")));
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(FormatPlanText(*p) + FormatSettingsText(*p),
              ReadRunfile(g.Find("file")->string_value()))
        << g.Find("file")->string_value();
  }
}

TEST(PlannerVectors, JsonOutputHasTheSharedKeys) {
  const JsonValue& keys = *Vectors().Find("json_keys");
  const JsonValue& c = Vectors().Find("cases")->items().front();
  absl::StatusOr<Plan> p =
      ComputePlan(VectorInputs(VectorModel(c.Find("model")->string_value()), *c.Find("inputs")));
  ASSERT_TRUE(p.ok());
  absl::StatusOr<JsonValue> out = ParseJson(FormatPlanJson(*p));
  ASSERT_TRUE(out.ok()) << out.status();
  auto same_keys = [](const JsonValue& obj, const JsonValue& want) {
    EXPECT_EQ(obj.members().size(), want.items().size());
    for (const JsonValue& k : want.items()) {
      EXPECT_NE(obj.Find(k.string_value()), nullptr) << k.string_value();
    }
  };
  same_keys(*out, *keys.Find("plan"));
  same_keys(*out->Find("inputs"), *keys.Find("inputs"));
  same_keys(*out->Find("model"), *keys.Find("model"));
  EXPECT_EQ(out->Find("checkpoint_bytes_per_layer")->number(), 33554432.0);
  EXPECT_EQ(out->Find("copy_seconds_per_layer")->number(), p->copy_seconds_per_layer);
  EXPECT_EQ(out->Find("inputs")->Find("link")->string_value(), "h200");
}

TEST(Planner, FormulaPieces) {
  PlanInputs in;
  in.model = VectorModel("qwen3-8b");
  in.seq_len = 4096;
  absl::StatusOr<Plan> p = ComputePlan(in);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->matmul_flops_per_layer, 2.0 * 4096 * 192937984);
  EXPECT_EQ(p->attention_flops_per_layer, 2.0 * 4096 * 4096 * 4096);
  EXPECT_DOUBLE_EQ(p->sync_slowdown,
                   2 * p->copy_seconds_per_layer / (4 * p->forward_seconds_per_layer));
  EXPECT_DOUBLE_EQ(p->overlap_budget_seconds, 3 * p->forward_seconds_per_layer);
  EXPECT_EQ(p->inputs.link.bytes_per_second, 55.43e9);  // default link: the H200 figure
  // keep_last_n=1 (the default) keeps the newest of 36 layers on the GPU.
  EXPECT_EQ(p->pinned_host_bytes_per_node, uint64_t{8} * 35 * 33554432);
  EXPECT_EQ(DenseLayerParams(4096, 32, 8, 128, 12288), 192937984);  // [ref]'s Qwen3-8B figure
}

TEST(Planner, SharedLinkDividesBandwidth) {
  PlanInputs in;
  in.model = VectorModel("qwen3-1.7b");
  in.seq_len = 4096;
  in.link = *ResolveLink("pcie5");
  absl::StatusOr<Plan> one = ComputePlan(in);
  in.gpus_per_link = 4;
  absl::StatusOr<Plan> four = ComputePlan(in);
  ASSERT_TRUE(one.ok() && four.ok());
  EXPECT_DOUBLE_EQ(four->copy_seconds_per_layer, 4 * one->copy_seconds_per_layer);
  EXPECT_EQ(four->link_bytes_per_second_per_gpu, 63e9 / 4);
}

TEST(Planner, FullOverlapThresholdIsExact) {
  PlanInputs in;
  in.model = VectorModel("qwen3-1.7b");
  in.link = *ResolveLink("pcie4");
  in.gpus_per_link = 8;
  in.seq_len = 18435;
  absl::StatusOr<Plan> at = ComputePlan(in);
  in.seq_len = 18434;
  absl::StatusOr<Plan> below = ComputePlan(in);
  ASSERT_TRUE(at.ok() && below.ok());
  EXPECT_EQ(at->full_overlap_min_seq_len, 18435);
  EXPECT_TRUE(at->overlaps_fully);
  EXPECT_EQ(at->overlap_slowdown, 0.0);
  EXPECT_FALSE(below->overlaps_fully);
  EXPECT_GT(below->overlap_slowdown, 0.0);
}

TEST(Planner, SweepCoversDefaultLengthsAndGetsCheaper) {
  PlanInputs in;
  in.model = VectorModel("qwen3-8b");
  absl::StatusOr<std::vector<Plan>> rows = Sweep(in, DefaultSweepSeqLens());
  ASSERT_TRUE(rows.ok()) << rows.status();
  ASSERT_EQ(rows->size(), 10u);
  EXPECT_EQ(rows->front().inputs.seq_len, 1024);
  EXPECT_EQ(rows->back().inputs.seq_len, 512 * 1024);
  for (size_t i = 0; i < rows->size(); ++i) {
    EXPECT_EQ((*rows)[i].overlap_slowdown, 0.0);  // [ref]: 0% in every row for Qwen3-8B
    if (i > 0) {
      EXPECT_LT((*rows)[i].sync_slowdown, (*rows)[i - 1].sync_slowdown);
    }
  }
  const std::string text = FormatSweepText(*rows);
  EXPECT_NE(text.find("    131072"), std::string::npos) << text;
  EXPECT_EQ(Sweep(in, {}).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Planner, LinksAndDtypes) {
  EXPECT_EQ(ResolveLink("PCIe4")->bytes_per_second, 31e9);
  EXPECT_EQ(ResolveLink("nvlink-c2c")->bytes_per_second, 450e9);
  EXPECT_EQ(ResolveLink("12.5")->bytes_per_second, 12.5e9);
  EXPECT_EQ(ResolveLink("12.5")->name, "custom");
  EXPECT_EQ(ResolveLink("pcie9").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ResolveLink("-3").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DtypeBytes(*ParseDtype("fp16")), 2);
  EXPECT_EQ(DtypeBytes(*ParseDtype("float32")), 4);
  EXPECT_EQ(ParseDtype("int8").status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(Planner, GpuNamesStandForTheirHostLinks) {
  const std::pair<const char*, const char*> gpus[] = {
      {"h100", "pcie5"}, {"A100", "pcie4"}, {"b200", "pcie5"}, {"gh200", "nvlink-c2c"},
      {"h200", "h200"}};
  for (const auto& [gpu, link] : gpus) {
    absl::StatusOr<Link> by_gpu = ResolveLink(gpu);
    absl::StatusOr<Link> by_link = ResolveLink(link);
    ASSERT_TRUE(by_gpu.ok() && by_link.ok()) << gpu;
    EXPECT_EQ(by_gpu->bytes_per_second, by_link->bytes_per_second) << gpu;
    EXPECT_EQ(by_gpu->host_link, link) << gpu;
  }
  EXPECT_EQ(ResolveLink("H100")->name, "h100");
  absl::StatusOr<Link> unknown = ResolveLink("v100");
  EXPECT_EQ(unknown.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(unknown.status().message()).find("a GPU (h100, a100, b200, gh200, h200)"),
            std::string::npos)
      << unknown.status().message();
}

TEST(Planner, KeepLastNAndPoolHeadroom) {
  PlanInputs in;
  in.model = VectorModel("qwen3-8b");
  in.seq_len = 4096;
  in.gpus_per_node = 4;
  in.keep_last_n = 0;
  absl::StatusOr<Plan> all = ComputePlan(in);
  in.keep_last_n = 3;
  absl::StatusOr<Plan> kept = ComputePlan(in);
  ASSERT_TRUE(all.ok() && kept.ok());
  EXPECT_EQ(all->pinned_host_bytes_per_node, uint64_t{4} * 36 * 33554432);
  EXPECT_EQ(kept->pinned_host_bytes_per_node, uint64_t{4} * 33 * 33554432);
  EXPECT_EQ(kept->gpu_bytes_freed_per_gpu, uint64_t{33} * 33554432);
  EXPECT_EQ(kept->checkpoint_bytes_per_gpu, uint64_t{36} * 33554432);  // unchanged by it
  EXPECT_EQ(kept->pool_bytes, uint64_t{5492} << 20);  // 4224 MiB x 1.3 = 5491.2, up to a MiB
  EXPECT_EQ(PoolHeadroom(1), 1.05);
  EXPECT_EQ(PoolHeadroom(2), 1.3);
  EXPECT_NE(EnableCall(*kept).find("keep_last_n=3"), std::string::npos) << EnableCall(*kept);
}

// --host-ram bounds pool_bytes: capped when only the headroom does not fit, none (and the
// decision says so) when the checkpoints alone do not.
TEST(Planner, HostRamCapsThePool) {
  PlanInputs in;
  in.model = VectorModel("qwen3-8b");
  in.seq_len = 131072;  // 8 GPUs x 35 x 1 GiB = 280 GiB per node, 364 GiB with the headroom
  absl::StatusOr<Plan> free_pool = ComputePlan(in);
  ASSERT_TRUE(free_pool.ok());
  EXPECT_EQ(free_pool->pool_bytes, uint64_t{364} << 30);
  in.host_ram_bytes = uint64_t{300} << 30;
  absl::StatusOr<Plan> capped = ComputePlan(in);
  ASSERT_TRUE(capped.ok());
  EXPECT_EQ(capped->pool_bytes, uint64_t{300} << 30);
  EXPECT_EQ(capped->pool_bytes_with_headroom, uint64_t{364} << 30);
  EXPECT_EQ(capped->decision, Decision::kUndecided);
  EXPECT_NE(FormatSettingsText(*capped).find("pool_bytes: 322122547200 (capped at the node's "
                                             "host RAM"),
            std::string::npos)
      << FormatSettingsText(*capped);
  in.host_ram_bytes = uint64_t{256} << 30;
  absl::StatusOr<Plan> short_ram = ComputePlan(in);
  ASSERT_TRUE(short_ram.ok());
  EXPECT_EQ(short_ram->pool_bytes, 0u);
  EXPECT_EQ(short_ram->decision, Decision::kHostRamShort);
  const std::string settings = FormatSettingsText(*short_ram);
  EXPECT_EQ(settings.find("pool_bytes: 3"), std::string::npos) << settings;
  EXPECT_NE(settings.find("pool_bytes: none (no pool fits"), std::string::npos) << settings;
}

// --tp with sequence parallelism: each GPU holds and copies 1/tp of a checkpoint and computes
// 1/tp of the layer, so the copy/forward ratio stays and the bytes per GPU fall tp times.
TEST(Planner, TensorParallelSplitsTheCheckpoint) {
  PlanInputs in;
  in.model = VectorModel("qwen3-8b");
  in.seq_len = 131072;
  absl::StatusOr<Plan> one = ComputePlan(in);
  in.tensor_parallel_size = 8;
  absl::StatusOr<Plan> eight = ComputePlan(in);
  ASSERT_TRUE(one.ok() && eight.ok());
  EXPECT_EQ(eight->checkpoint_bytes_per_layer * 8, one->checkpoint_bytes_per_layer);
  EXPECT_EQ(eight->pinned_host_bytes_per_node * 8, one->pinned_host_bytes_per_node);
  EXPECT_DOUBLE_EQ(eight->copy_seconds_per_layer * 8, one->copy_seconds_per_layer);
  EXPECT_DOUBLE_EQ(eight->forward_seconds_per_layer * 8, one->forward_seconds_per_layer);
  EXPECT_DOUBLE_EQ(eight->copy_to_forward_ratio, one->copy_to_forward_ratio);
  EXPECT_NE(FormatPlanText(*eight).find("tensor-parallel 8 (sequence-parallel)"),
            std::string::npos);
}

TEST(Planner, GpuMemoryDecides) {
  PlanInputs in;
  in.model = VectorModel("qwen3-1.7b");
  in.seq_len = 32768;
  in.keep_last_n = 0;
  in.gpu_memory_bytes = 12'000'000'000;
  in.gpu_peak_bytes = 12'000'000'000;
  EXPECT_EQ(ComputePlan(in)->decision, Decision::kNotNeeded);  // equal fits
  in.gpu_peak_bytes += 1;
  EXPECT_EQ(ComputePlan(in)->decision, Decision::kOffload);
  in.gpu_peak_bytes = 0;  // no peak: whether it fits is not known, so no "offload" either
  absl::StatusOr<Plan> no_peak = ComputePlan(in);
  ASSERT_TRUE(no_peak.ok());
  EXPECT_EQ(no_peak->decision, Decision::kUndecided);
  const std::string text = FormatPlanText(*no_peak);
  EXPECT_NE(text.find("give --gpu-peak to decide"), std::string::npos);
  EXPECT_NE(text.find("decision                     cannot decide  (whether offload is needed: "
                      "without the run's peak the planner cannot tell; pass --gpu-peak SIZE"),
            std::string::npos)
      << text;
  in.gpu_memory_bytes = 0;  // neither figure: both flags are named
  EXPECT_NE(FormatPlanText(*ComputePlan(in)).find("pass --gpu-memory SIZE and --gpu-peak SIZE"),
            std::string::npos);
  in.gpu_memory_bytes = 12'000'000'000;
  in.gpu_peak_bytes = 1'000'000'000;  // below the 3.5 GiB of checkpoints: not that run's peak
  absl::StatusOr<Plan> low = ComputePlan(in);
  EXPECT_EQ(low.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(low.status().message()).find("below the checkpoints alone"),
            std::string::npos)
      << low.status().message();
  in.gpu_memory_bytes = 0;
  in.gpu_peak_bytes = 11'130'000'000;
  EXPECT_NE(std::string(ComputePlan(in).status().message()).find("--gpu-peak needs --gpu-memory"),
            std::string::npos);
}

TEST(Planner, BadInputsAreInvalidArgumentWithTheFlagToFix) {
  PlanInputs good;
  good.model = VectorModel("qwen3-8b");
  good.seq_len = 4096;
  ASSERT_TRUE(ComputePlan(good).ok());
  struct Bad {
    void (*mutate)(PlanInputs*);
    const char* needle;
  };
  const Bad cases[] = {
      {[](PlanInputs* p) { p->model.layers = 0; }, "--layers"},
      {[](PlanInputs* p) { p->model.hidden = -1; }, "--hidden"},
      {[](PlanInputs* p) { p->model.attention_width = 0; }, "--attn-width"},
      {[](PlanInputs* p) { p->model.params_per_layer = 0; }, "--params-per-layer"},
      {[](PlanInputs* p) { p->micro_batch = 0; }, "--batch"},
      {[](PlanInputs* p) { p->seq_len = 0; }, "--seq"},
      {[](PlanInputs* p) { p->gpus_per_node = 0; }, "--gpus-per-node"},
      {[](PlanInputs* p) { p->gpus_per_link = 9; }, "cannot exceed --gpus-per-node"},
      {[](PlanInputs* p) { p->link.bytes_per_second = 0; }, "--link"},
      {[](PlanInputs* p) { p->compute_flops_per_second = NAN; }, "--tflops"},
      {[](PlanInputs* p) { p->seq_len = int64_t{1} << 50; }, "overflow"},
      {[](PlanInputs* p) { p->keep_last_n = -1; }, "--keep-last-n"},
      {[](PlanInputs* p) { p->tensor_parallel_size = 0; }, "--tp"},
      {[](PlanInputs* p) { p->tensor_parallel_size = 3; }, "must be a multiple of --tp (3)"},
  };
  for (const Bad& b : cases) {
    PlanInputs in = good;
    b.mutate(&in);
    absl::StatusOr<Plan> p = ComputePlan(in);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << b.needle;
    EXPECT_NE(std::string(p.status().message()).find(b.needle), std::string::npos)
        << p.status().message();
  }
}

TEST(HfConfig, DerivesDefaultsAndRejectsWhatItCannotDerive) {
  const std::string base =
      R"("num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, )"
      R"("intermediate_size": 128)";
  absl::StatusOr<ModelShape> m = ModelFromHfConfig("{" + base + "}");
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->num_key_value_heads, 4);  // defaults to the query heads
  EXPECT_EQ(m->head_dim, 16);            // hidden / heads
  EXPECT_EQ(m->params_per_layer, 4 * 64 * 64 + 3 * 64 * 128);
  absl::StatusOr<ModelShape> nested =
      ModelFromHfConfig(R"({"model_type": "x", "text_config": {)" + base + "}}");
  ASSERT_TRUE(nested.ok()) << nested.status();
  EXPECT_EQ(nested->layers, 2);
  EXPECT_EQ(nested->name, "x");
  const std::pair<std::string, const char*> bad[] = {
      {R"({"hidden_size": 64})", "num_hidden_layers"},
      {"{" + base + R"(, "num_local_experts": 8})", "mixture-of-experts"},
      {R"({"num_hidden_layers": 2.5, "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128})",
       "positive integer"},
      {R"({"num_hidden_layers": "2", "hidden_size": 64, "num_attention_heads": 4,
           "intermediate_size": 128})",
       "positive integer"},
      {R"({"num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 5,
           "intermediate_size": 128})",
       "divisible"},
      {R"({"num_hidden_layers": 2,)", "invalid JSON"},
      {"[1, 2]", "JSON object"},
  };
  for (const auto& [text, needle] : bad) {
    absl::StatusOr<ModelShape> r = ModelFromHfConfig(text);
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_NE(std::string(r.status().message()).find(needle), std::string::npos)
        << r.status().message();
  }
}

TEST(Format, BytesAndThousands) {
  EXPECT_EQ(WithThousands(192937984), "192,937,984");
  EXPECT_EQ(WithThousands(999), "999");
  EXPECT_EQ(FormatBytes(33554432), "32.00 MiB");
  EXPECT_EQ(FormatBytes(38654705664ull), "36.00 GiB");
  EXPECT_EQ(FormatBytes(983040000000ull), "915.53 GiB");
}

}  // namespace
}  // namespace offloadd::plan
