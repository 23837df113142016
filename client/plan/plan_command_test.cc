#include "client/plan/plan_command.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "client/plan/json_value.h"
#include "gtest/gtest.h"

namespace offloadd::plan {
namespace {

std::string Fixture(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* ws = std::getenv("TEST_WORKSPACE");
  const std::string rel = "tests/fixtures/hf/" + name;
  return srcdir == nullptr ? rel : std::string(srcdir) + "/" + (ws ? ws : "offloadd") + "/" + rel;
}

struct Result {
  int code;
  std::string out, err;
};

Result RunPlan(const std::vector<std::string>& args) {
  std::ostringstream out, err;
  const int code = RunPlanCommand(args, out, err);
  return {code, out.str(), err.str()};
}

TEST(PlanCommand, HfConfigPrintsTheWorkedFigures) {
  Result r = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--link=h200"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("copy per layer, each way     0.61 ms"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("forward per layer            3.44 ms"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("192,937,984 params/layer"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("(qwen3)"), std::string::npos) << r.out;
}

TEST(PlanCommand, ExplicitShapeOnPcie4) {
  // Qwen3-1.7B by hand: [ref] "28.1% on PCIe 4" at 4K tokens.
  Result r = RunPlan({"--layers",
                      "28",
                      "--hidden",
                      "2048",
                      "--params-per-layer",
                      "50331648",
                      "--seq",
                      "4096",
                      "--link",
                      "pcie4",
                      "--dtype",
                      "bf16",
                      "--batch",
                      "1",
                      "--gpus-per-node",
                      "8",
                      "--gpus-per-link",
                      "1",
                      "--tflops",
                      "500"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("synchronous slowdown         28.1 %"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("attention width 2048"), std::string::npos) << r.out;  // default: hidden
}

TEST(PlanCommand, JsonIsParseableAndFlagsOverrideConfig) {
  Result r = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "128K", "--layers", "10",
                      "--link", "40", "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<JsonValue> v = ParseJson(r.out);
  ASSERT_TRUE(v.ok()) << v.status() << "\n" << r.out;
  EXPECT_EQ(v->Find("model")->Find("layers")->number(), 10);
  EXPECT_EQ(v->Find("inputs")->Find("seq_len")->number(), 131072);
  EXPECT_EQ(v->Find("inputs")->Find("link_bytes_per_second")->number(), 40e9);
  EXPECT_EQ(v->Find("checkpoint_bytes_per_gpu")->number(), 10.0 * 131072 * 4096 * 2);
}

TEST(PlanCommand, SweepTextAndJson) {
  Result text = RunPlan({"--hf-config", Fixture("qwen3-1.7b.json"), "--sweep"});
  ASSERT_EQ(text.code, 0) << text.err;
  EXPECT_NE(text.out.find("    524288"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("reload overlaps fully at every sequence length"), std::string::npos);
  Result json = RunPlan({"--hf-config", Fixture("qwen3-1.7b.json"), "--sweep-seqs", "4K,32K",
                         "--link", "pcie4", "--gpus-per-link", "8", "--json"});
  ASSERT_EQ(json.code, 0) << json.err;
  absl::StatusOr<JsonValue> v = ParseJson(json.out);
  ASSERT_TRUE(v.ok()) << v.status();
  ASSERT_EQ(v->Find("sweep")->items().size(), 2u);
  EXPECT_EQ(v->Find("sweep")->items()[1].Find("inputs")->Find("seq_len")->number(), 32768);
  EXPECT_EQ(v->Find("sweep")->items()[0].Find("full_overlap_min_seq_len")->number(), 18435);
}

TEST(PlanCommand, SpillTierNeededAndWhetherTheDiskKeepsUp) {
  // Qwen3-8B at 128K tokens, 8 GPUs, every layer offloaded (keep_last_n 0): 36 layers x 128K x
  // 4096 x 2 bytes = 36 GiB per GPU, 288 GiB per node; with 64 GiB of host RAM, 224 GiB per
  // node go to disk each step.
  const std::vector<std::string> base = {"--hf-config", Fixture("qwen3-8b.json"), "--seq",
                                         "128K", "--keep-last-n", "0", "--host-ram", "64GiB",
                                         "--json"};
  std::vector<std::string> fast = base, slow = base;
  fast.insert(fast.end(), {"--nvme-gbps", "1000"});
  slow.insert(slow.end(), {"--nvme-gbps", "1"});
  Result r = RunPlan(fast);
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<JsonValue> v = ParseJson(r.out);
  ASSERT_TRUE(v.ok()) << v.status() << "\n" << r.out;
  const JsonValue* spill = v->Find("spill");
  ASSERT_NE(spill, nullptr) << r.out;
  EXPECT_TRUE(spill->Find("needs_spill")->bool_value());
  EXPECT_EQ(spill->Find("spill_bytes_per_node")->number(), 224.0 * (1ull << 30));
  const double fwd = spill->Find("forward_seconds_per_step")->number();
  EXPECT_EQ(spill->Find("backward_seconds_per_step")->number(), 3 * fwd);
  EXPECT_DOUBLE_EQ(spill->Find("spill_write_seconds_per_step")->number(),
                   224.0 * (1ull << 30) / 1000e9);
  EXPECT_TRUE(spill->Find("disk_keeps_up")->bool_value());
  r = RunPlan(slow);  // 1 GB/s: 240 s of writes per step cannot hide behind forward
  ASSERT_EQ(r.code, 3) << r.err;  // the plan does not fit, as with --host-ram alone
  EXPECT_NE(r.err.find("the disk does not keep up"), std::string::npos) << r.err;
  v = ParseJson(r.out);
  ASSERT_TRUE(v.ok());
  EXPECT_FALSE(v->Find("spill")->Find("disk_keeps_up")->bool_value());
  std::vector<std::string> text(base.begin(), base.end() - 1);
  text.insert(text.end(), {"--nvme-gbps", "1"});
  r = RunPlan(text);
  EXPECT_NE(r.out.find("the disk does NOT keep up"), std::string::npos) << r.out;
  // The config lines: the pool is the host RAM, the spill tier the rest.
  EXPECT_NE(r.out.find("pool_bytes: " + std::to_string(64ull << 30)), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("spill_capacity_bytes: " + std::to_string(224ull << 30)),
            std::string::npos)
      << r.out;
  // Fits the host RAM: no spill tier needed, the plain pool line.
  r = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--host-ram", "2TiB",
               "--nvme-gbps", "7"});
  EXPECT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("not needed"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("offloadd.conf                pool_bytes: "), std::string::npos) << r.out;
  r = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--nvme-gbps", "7"});
  EXPECT_EQ(r.code, 2);
  EXPECT_NE(r.err.find("--nvme-gbps needs --host-ram"), std::string::npos) << r.err;
}

TEST(PlanCommand, ErrorsSayWhatToFix) {
  const std::pair<std::vector<std::string>, std::string> cases[] = {
      {{"--seq", "4096"}, "no model"},
      {{"--layers", "2", "--hidden", "8", "--seq", "4"}, "--params-per-layer"},
      {{"--hf-config", Fixture("qwen3-8b.json")}, "--seq is required"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "-4"}, "--seq must be a positive"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--link", "usb"}, "unknown link"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--dtype", "int4"},
       "unknown checkpoint dtype"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--tflops", "x"}, "--tflops"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--tflops", "1e308"},
       "--tflops '1e308' is out of range (0.001 to 1000000 TFLOP/s)"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--tflops", "1e-300"},
       "is out of range (0.001 to 1000000 TFLOP/s)"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--link", "1e-300"},
       "is out of range (0.01 to 10000 GB/s)"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--host-ram", "1KiB",
        "--nvme-gbps", "1e-300"},
       "--host-ram '1KiB' is below the daemon's smallest pool (1 MiB, 1048576 bytes)"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--host-ram", "1KiB"},
       "below the daemon's smallest pool"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--gpus-per-link", "16"},
       "cannot exceed"},
      {{"--bogus"}, "unknown flag --bogus"},
      {{"--json=1"}, "takes no value"},
      {{"--seq"}, "needs a value"},
      {{"plan"}, "unexpected argument"},
  };
  for (const auto& [args, needle] : cases) {
    Result r = RunPlan(args);
    EXPECT_EQ(r.code, 2) << needle;
    EXPECT_NE(r.err.find(needle), std::string::npos) << r.err;
    EXPECT_TRUE(r.out.empty());
  }
  Result missing = RunPlan({"--hf-config", "/nonexistent/config.json", "--seq", "4K"});
  EXPECT_EQ(missing.code, 1);
  EXPECT_NE(missing.err.find("cannot read --hf-config file"), std::string::npos) << missing.err;
}

// /dev/zero, /dev/urandom and a FIFO with no writer are refused before a byte is read (they
// grew until the OOM killer, or blocked for good); a file over the bound is refused too.
TEST(PlanCommand, HfConfigThatIsNotASmallRegularFileIsRefused) {
  for (const char* device : {"/dev/zero", "/dev/urandom"}) {
    Result r = RunPlan({"--hf-config", device, "--seq", "4K"});
    EXPECT_EQ(r.code, 1) << device;
    EXPECT_NE(r.err.find("a character device; give a regular file"), std::string::npos) << r.err;
  }
  const char* tmp = std::getenv("TEST_TMPDIR");
  const std::string dir = tmp != nullptr ? tmp : "/tmp";
  const std::string fifo = dir + "/plan_hf_config.fifo";
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  Result r = RunPlan({"--hf-config", fifo, "--seq", "4K"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("a FIFO; give a regular file"), std::string::npos) << r.err;
  unlink(fifo.c_str());
  const std::string big = dir + "/plan_hf_config_big.json";
  {
    std::ofstream f(big, std::ios::binary);
    f << "{\"pad\": \"" << std::string(kMaxHfConfigBytes, ' ') << "\"}";
  }
  r = RunPlan({"--hf-config", big, "--seq", "4K"});
  EXPECT_EQ(r.code, 1);
  EXPECT_NE(r.err.find("is larger than 16777216 bytes"), std::string::npos) << r.err;
}

// llama-3-70b at 128K tokens on 8 GPUs pins 8 x 160 GiB = 1,280 GiB per node.
TEST(PlanCommand, WarnsWhenHostRamIsShort) {
  const std::vector<std::string> base = {"--hf-config", Fixture("llama-3-70b.json"), "--seq",
                                         "128K", "--gpus-per-node", "8"};
  std::vector<std::string> small = base, large = base;
  small.insert(small.end(), {"--host-ram", "1TiB"});
  large.insert(large.end(), {"--host-ram=2TiB"});
  Result short_ram = RunPlan(small);
  EXPECT_EQ(short_ram.code, 3) << short_ram.err;  // the plan does not fit the node
  // No pool_bytes above the host RAM is printed: a sentence says what to change instead.
  EXPECT_EQ(short_ram.out.find("pool_bytes: 1"), std::string::npos) << short_ram.out;
  EXPECT_NE(short_ram.out.find("pool_bytes: none (no pool fits: the checkpoints need 1264.00 GiB "
                               "pinned per node, the node has 1024.00 GiB (--host-ram); lower "
                               "--seq or --batch"),
            std::string::npos)
      << short_ram.out;
  EXPECT_NE(short_ram.out.find("decision                     host RAM short"),
            std::string::npos)
      << short_ram.out;
  // keep_last_n=1 (the default) keeps one of the 80 layers: 8 x 79 x 2 GiB = 1,264 GiB.
  EXPECT_NE(short_ram.err.find("1264.00 GiB (8 GPUs x 158.00 GiB)"), std::string::npos)
      << short_ram.err;
  EXPECT_NE(short_ram.err.find("exceeds the node's 1024.00 GiB (--host-ram)"), std::string::npos)
      << short_ram.err;
  Result enough = RunPlan(large);
  EXPECT_EQ(enough.code, 0);
  EXPECT_EQ(enough.err, "");
  // The config line: 8 x 79 x 2 GiB x 1.3 (several ranks' allocator headroom) = 1643.2 GiB,
  // rounded up to a MiB.
  EXPECT_NE(enough.out.find("pool_bytes: 1764372774912"), std::string::npos) << enough.out;
  // 1.3 TiB pins the live 1264 GiB but not the headroom: a note, not a failure.
  Result tight = RunPlan({"--hf-config", Fixture("llama-3-70b.json"), "--seq", "128K",
                          "--host-ram", "1300GiB"});
  EXPECT_EQ(tight.code, 0) << tight.err;
  EXPECT_NE(tight.err.find("pool_bytes with the allocator headroom"), std::string::npos)
      << tight.err;
  // The pool line is the host RAM, not the 1643.2 GiB the headroom wants.
  EXPECT_NE(tight.out.find("pool_bytes: " + std::to_string(1300ull << 30) +
                           " (capped at the node's host RAM"),
            std::string::npos)
      << tight.out;
  Result sweep = RunPlan({"--hf-config", Fixture("llama-3-70b.json"), "--sweep", "--sweep-seqs",
                          "4K,128K", "--host-ram", "1TiB"});
  EXPECT_EQ(sweep.code, 0);
  EXPECT_NE(sweep.err.find("at seq 131,072"), std::string::npos) << sweep.err;
  EXPECT_EQ(sweep.err.find("at seq 4,096"), std::string::npos) << sweep.err;
  Result bad = RunPlan({"--hf-config", Fixture("llama-3-70b.json"), "--seq", "4K", "--host-ram",
                        "lots"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--host-ram must be a positive size"), std::string::npos) << bad.err;
}

// The GPU names, keep_last_n, the GPU memory decision and the settings to paste.
TEST(PlanCommand, DecidesAndPrintsTheSettings) {
  Result r = RunPlan({"--hf-config", Fixture("qwen3-1.7b.json"), "--seq", "32K", "--link", "h100",
                      "--keep-last-n", "0", "--gpu-memory", "12GB", "--gpu-peak", "11.13GB"});
  ASSERT_EQ(r.code, 0) << r.err;
  EXPECT_NE(r.out.find("link h100 (pcie5) 63.00 GB/s"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("decision                     offload not needed"), std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("pool_bytes"), std::string::npos) << r.out;
  // Underscores as the daemon's flags take them: the same run, the same output.
  Result underscored =
      RunPlan({"--hf_config", Fixture("qwen3-1.7b.json"), "--seq", "32K", "--link", "h100",
               "--keep_last_n", "0", "--gpu_memory=12GB", "--gpu_peak", "11.13GB"});
  ASSERT_EQ(underscored.code, 0) << underscored.err;
  EXPECT_EQ(underscored.out, r.out);
  r = RunPlan({"--hf-config", Fixture("qwen3-1.7b.json"), "--seq", "4K", "--link", "a100",
               "--gpus-per-link", "8", "--keep-last-n", "2"});
  ASSERT_EQ(r.code, 0) << r.err;
  // Without --gpu-memory/--gpu-peak it cannot tell whether offload is needed, and says so.
  EXPECT_NE(r.out.find("decision                     cannot decide  (whether offload is needed: "
                       "without the run's peak the planner cannot tell; pass --gpu-memory SIZE "
                       "and --gpu-peak SIZE"),
            std::string::npos)
      << r.out;
  EXPECT_EQ(r.out.find("decision                     offload"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("a reload takes 4.33 ms against 2.89 ms"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("offloadd.transformers.enable(keep_last_n=2, prefetch=1)"),
            std::string::npos)
      << r.out;
  // 8 GPUs x 26 layers x 16 MiB = 3328 MiB, x 1.3 = 4326.4 -> 4327 MiB.
  EXPECT_NE(r.out.find("pool_bytes: " + std::to_string(4327ull << 20)), std::string::npos)
      << r.out;
  Result json = RunPlan({"--hf-config", Fixture("qwen3-1.7b.json"), "--seq", "32K", "--link",
                         "gh200", "--gpu-memory", "7GB", "--gpu-peak", "11.13GB",
                         "--keep-last-n", "0", "--json"});
  ASSERT_EQ(json.code, 3) << json.err;  // the run does not fit, as with --host-ram
  EXPECT_NE(json.err.find("offload alone does not make the run fit: at best the peak falls to "
                          "6.87 GiB, above the 6.52 GiB of --gpu-memory"),
            std::string::npos)
      << json.err;
  absl::StatusOr<JsonValue> v = ParseJson(json.out);
  ASSERT_TRUE(v.ok()) << v.status() << "\n" << json.out;
  EXPECT_EQ(v->Find("decision")->string_value(), "does_not_fit");
  EXPECT_EQ(v->Find("inputs")->Find("host_link")->string_value(), "nvlink-c2c");
  EXPECT_EQ(v->Find("gpu_peak_with_offload_min_bytes")->number(), 11130000000.0 - 3758096384.0);
  const std::pair<std::vector<std::string>, std::string> bad[] = {
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--keep-last-n", "-1"},
       "--keep-last-n must be 0 or a positive integer"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--gpu-peak", "70GB"},
       "--gpu-peak needs --gpu-memory"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--sweep", "--gpu-memory", "80GB",
        "--gpu-peak", "70GB"},
       "drop --sweep or --gpu-peak"},
      {{"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--gpu-memory", "lots"},
       "--gpu-memory must be a positive size"},
  };
  for (const auto& [args, needle] : bad) {
    Result e = RunPlan(args);
    EXPECT_EQ(e.code, 2) << needle;
    EXPECT_NE(e.err.find(needle), std::string::npos) << e.err;
  }
}

// --tp divides each GPU's checkpoint share (sequence parallelism) and must divide --seq.
TEST(PlanCommand, TensorParallelDegree) {
  Result r = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "128K", "--tp", "8",
                      "--json"});
  ASSERT_EQ(r.code, 0) << r.err;
  absl::StatusOr<JsonValue> v = ParseJson(r.out);
  ASSERT_TRUE(v.ok()) << v.status() << "\n" << r.out;
  EXPECT_EQ(v->Find("checkpoint_bytes_per_layer")->number(), 134217728.0);
  EXPECT_EQ(v->Find("inputs")->Find("tensor_parallel_size")->number(), 8);
  EXPECT_EQ(v->Find("decision")->string_value(), "undecided");
  Result bad = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "1000", "--tp", "3"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--seq (1000) must be a multiple of --tp (3)"), std::string::npos)
      << bad.err;
  bad = RunPlan({"--layers", "2", "--hidden", "4100", "--params-per-layer", "1000", "--seq",
                 "4K", "--tp", "8"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("hidden size (4100) must be a multiple of --tp (8)"), std::string::npos)
      << bad.err;
  EXPECT_TRUE(bad.out.empty());
  Result across = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--tp", "16",
                           "--gpus-per-node", "8"});
  EXPECT_EQ(across.code, 0) << across.err;
  EXPECT_NE(across.err.find("warning: --tp 16 exceeds --gpus-per-node 8"), std::string::npos)
      << across.err;
  Result within = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--tp", "8",
                           "--gpus-per-node", "8"});
  EXPECT_EQ(within.code, 0) << within.err;
  EXPECT_EQ(within.err.find("--gpus-per-node"), std::string::npos) << within.err;
  bad = RunPlan({"--hf-config", Fixture("qwen3-8b.json"), "--seq", "4K", "--tp", "0"});
  EXPECT_EQ(bad.code, 2);
  EXPECT_NE(bad.err.find("--tp must be a positive integer"), std::string::npos) << bad.err;
}

TEST(PlanCommand, Help) {
  Result r = RunPlan({"--help"});
  EXPECT_EQ(r.code, 0);
  EXPECT_NE(r.out.find("usage: offloadctl plan"), std::string::npos);
  // Every SIZE spelling the help names parses to the bytes it says.
  EXPECT_NE(r.out.find("binary (KiB MiB GiB TiB, or K M G T) or decimal (KB MB GB"),
            std::string::npos) << r.out;
  EXPECT_EQ(*ParseSize("gpu-memory", "80GiB"), 80ull << 30);
  EXPECT_EQ(*ParseSize("gpu-memory", "80G"), 80ull << 30);
  EXPECT_EQ(*ParseSize("gpu-memory", "141GB"), 141000000000ull);
  EXPECT_EQ(*ParseSize("gpu-memory", "4096"), 4096ull);
}

}  // namespace
}  // namespace offloadd::plan
