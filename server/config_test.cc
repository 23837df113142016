#include "server/config.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "gtest/gtest.h"

namespace offloadd {
namespace {

TEST(ConfigTest, DefaultsParseAndValidate) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool_bytes(), 1ull << 30);
  EXPECT_EQ(c->socket_mode(), 0660u);  // octal in the text
  EXPECT_EQ(c->backend(), "shm");
  EXPECT_EQ(c->chunk_bytes(), 8ull << 20);
  EXPECT_EQ(c->metrics_address(), "127.0.0.1:9464");
  EXPECT_TRUE(ValidateConfig(*c).ok());
}

TEST(ConfigTest, FileOverridesIncludingZeroValues) {
  auto c = ParseConfig(
      "pool_bytes: 4194304\nmetrics_address: \"\"\n"
      "links { name: \"sw0\" gpus: \"a\" gpus: \"b\" d2h_bytes_per_second: 1e9 }\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool_bytes(), 4194304u);
  EXPECT_EQ(c->metrics_address(), "");
  EXPECT_EQ(c->backend(), "shm");  // untouched default
  auto o = ToCoreOptions(*c);
  ASSERT_EQ(o.links.size(), 1u);
  EXPECT_EQ(o.links[0].gpus.size(), 2u);
  EXPECT_DOUBLE_EQ(o.links[0].d2h_bytes_per_second, 1e9);
}

TEST(ConfigTest, SyntaxErrorNamesLine) {
  auto c = ParseConfig("pool_bytes: 1\nno_such_field: 3\n");
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(c.status().message()).find("line 2"), std::string::npos)
      << c.status();
}

TEST(ConfigTest, ValidationListsProblems) {
  auto c = ParseConfig("backend: \"tpu\"\nchunk_bytes: 10\npool_bytes: 5\n");
  ASSERT_TRUE(c.ok());
  absl::Status st = ValidateConfig(*c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  std::string msg(st.message());
  EXPECT_NE(msg.find("tpu"), std::string::npos);
  EXPECT_NE(msg.find("chunk_bytes"), std::string::npos);
  EXPECT_NE(msg.find("pool_bytes"), std::string::npos);
}

TEST(ConfigTest, PoolDataChecksumsNeedASharedPoolAndReachCoreOptions) {
  auto off = ParseConfig("");
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->pool_data_checksums());
  EXPECT_FALSE(ToCoreOptions(*off).pool_data_checksums);
  auto anonymous = ParseConfig("pool_data_checksums: true\n");
  ASSERT_TRUE(anonymous.ok());
  absl::Status st = ValidateConfig(*anonymous);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(st.message()).find("pool_data_checksums needs pool_shm_name"),
            std::string::npos)
      << st;
  auto shared = ParseConfig("pool_data_checksums: true\npool_shm_name: \"p\"\n");
  ASSERT_TRUE(shared.ok());
  EXPECT_TRUE(ValidateConfig(*shared).ok()) << ValidateConfig(*shared);
  EXPECT_TRUE(ToCoreOptions(*shared).pool_data_checksums);
}

// Request rings poll for half a millisecond by default; 0 turns polling off; past 0.1 s a
// submission could wait too long to be taken.
TEST(ConfigTest, RingPollSecondsDefaultsBoundsAndCoreOptions) {
  auto defaults = ParseConfig("");
  ASSERT_TRUE(defaults.ok());
  EXPECT_DOUBLE_EQ(ToCoreOptions(*defaults).ring_poll_seconds, 0.0005);
  auto off = ParseConfig("ring_poll_seconds: 0\n");
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(ValidateConfig(*off).ok());
  EXPECT_DOUBLE_EQ(ToCoreOptions(*off).ring_poll_seconds, 0.0);
  EXPECT_TRUE(ValidateConfig(*ParseConfig("ring_poll_seconds: 0.00005\n")).ok());
  for (const char* bad : {"ring_poll_seconds: 0.5\n", "ring_poll_seconds: -0.001\n",
                          "ring_poll_seconds: 0.000001\n", "ring_poll_seconds: nan\n"}) {
    const absl::Status st = ValidateConfig(*ParseConfig(bad));
    EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument) << bad;
    EXPECT_NE(std::string(st.message()).find("ring_poll_seconds must be 0 or between 0.00005 "
                                             "and 0.1 (0: clients always wake the daemon;"),
              std::string::npos)
        << st;
  }
  const absl::Status st = ValidateConfig(*ParseConfig("ring_poll_seconds: 0.5\n"));
  EXPECT_NE(std::string(st.message()).find("(got 0.5)"), std::string::npos) << st;
}

// A value out of its range is given with where it came from: the flag as the command line
// gave it (the last of several: it is the one in force), or the field in the config file.
TEST(ConfigTest, RangeErrorsSayWhetherTheCommandLineOrTheFileGaveTheValue) {
  const std::string path = testing::TempDir() + "/range_sources.conf";
  std::ofstream(path) << "ring_poll_seconds: 0.5\ncopy_threads: 0\n";
  const std::string poll_rule =
      "ring_poll_seconds must be 0 or between 0.00005 and 0.1 (0: clients always wake the "
      "daemon; below 0.00005 the kernel's timer slack sets the poll rate; above 0.1 a "
      "submission may wait too long to be taken)";
  const absl::StatusOr<v1::DaemonConfig> file = LoadDaemonConfig({path, {}});
  EXPECT_EQ(file.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(file.status().message(),
            "invalid config: copy_threads must be between 1 and 64 (got 0 from copy_threads in " +
                path + "); " + poll_rule + " (got 0.5 from ring_poll_seconds in " + path + ")");
  // A flag over the file: the flag is named; the file's other bad value is still the file's.
  const absl::StatusOr<v1::DaemonConfig> flag =
      LoadDaemonConfig({path, {{"ring_poll_seconds", "0.001"}, {"ring_poll_seconds", "1e-6"}}});
  EXPECT_EQ(flag.status().message(),
            "invalid config: copy_threads must be between 1 and 64 (got 0 from copy_threads in " +
                path + "); " + poll_rule +
                " (got 1e-06 from --ring_poll_seconds=1e-6 on the command line)");
  // Flags alone (the embedded defaults under them).
  const absl::StatusOr<v1::DaemonConfig> flags_only =
      LoadDaemonConfig({"", {{"copy_threads", "65"}, {"offload_min_share", "1.5"}}});
  EXPECT_EQ(flags_only.status().message(),
            "invalid config: copy_threads must be between 1 and 64 (got 65 from --copy_threads=65 "
            "on the command line); offload_min_share must be between 0 and 1 (got 1.5 from "
            "--offload_min_share=1.5 on the command line)");
  // Flags that mend both of the file's values: valid, and in force.
  const absl::StatusOr<v1::DaemonConfig> mended =
      LoadDaemonConfig({path, {{"ring_poll_seconds", "0"}, {"copy_threads", "3"}}});
  ASSERT_TRUE(mended.ok()) << mended.status();
  EXPECT_EQ(mended->copy_threads(), 3u);
  EXPECT_EQ(mended->ring_poll_seconds(), 0.0);
  // Without sources (a text given to ParseConfig): the value alone, as before.
  EXPECT_EQ(ValidateConfig(*ParseConfig("copy_threads: 0\n")).message(),
            "invalid config: copy_threads must be between 1 and 64 (got 0)");
  std::remove(path.c_str());
}

// Values were printed with %g: 1000001 read "1e+06", the bound it exceeds.
TEST(ConfigTest, RangeErrorsPrintIntegersExactlyAndRealsApartFromTheirBound) {
  EXPECT_EQ(ValidateConfig(*ParseConfig("max_streams_per_connection: 1000001\n")).message(),
            "invalid config: max_streams_per_connection must be between 0 and 1000000 (0 = "
            "gRPC's default) (got 1000001)");
  EXPECT_EQ(ValidateConfig(*ParseConfig("copy_threads: 4294967295\n")).message(),
            "invalid config: copy_threads must be between 1 and 64 (got 4294967295)");
  EXPECT_EQ(ValidateConfig(*ParseConfig("chunk_bytes: 1073741825\n")).message(),
            "invalid config: chunk_bytes must be between 4096 and 1073741824 (1 GiB) (got "
            "1073741825)");
  EXPECT_EQ(ValidateConfig(*ParseConfig("ring_poll_seconds: 0.1000001\n")).message(),
            "invalid config: ring_poll_seconds must be 0 or between 0.00005 and 0.1 (0: clients "
            "always wake the daemon; below 0.00005 the kernel's timer slack sets the poll rate; "
            "above 0.1 a submission may wait too long to be taken) (got 0.1000001)");
  EXPECT_EQ(ValidateConfig(*ParseConfig("resume_grace_seconds: 86400.5\n")).message(),
            "invalid config: resume_grace_seconds must be between 0 and 86400 (got 86400.5)");
}

// Some range checks gave neither the value nor where it came from ("pool_bytes must be at
// least 1 MiB"); every field's now says "(got X from ...)" like the others.
TEST(ConfigTest, EveryRangeErrorGivesTheValueAndItsSource) {
  const std::string path = testing::TempDir() + "/every_range.conf";
  struct Case {
    std::string file;
    std::vector<std::pair<std::string, std::string>> flags;
    std::string want;  // after "invalid config: "
  };
  const std::vector<Case> cases = {
      {"", {{"pool_bytes", "1KiB"}},
       "pool_bytes must be at least 1048576 (1 MiB) (got 1024 from --pool_bytes=1KiB on the "
       "command line)"},
      {"", {{"spill_high_water_fraction", "1.5"}},
       "spill_high_water_fraction must be in (0, 1] (got 1.5 from "
       "--spill_high_water_fraction=1.5 on the command line)"},
      {"spill_high_water_fraction: 0\n", {},
       "spill_high_water_fraction must be in (0, 1] (got 0 from spill_high_water_fraction in " +
           path + ")"},
      {"", {{"link_calibration_budget_seconds", "0"}},
       "link_calibration_budget_seconds must be in (0, 600] (5 by default) (got 0 from "
       "--link_calibration_budget_seconds=0 on the command line)"},
      {"default_link_bytes_per_second: -1\n", {},
       "default_link_bytes_per_second must be 0 or a finite number >= 1 (0 = unpaced) (got -1 from "
       "default_link_bytes_per_second in " + path + ")"},
      {"numa_node_bytes_per_second: -2.5e9\n", {},
       "numa_node_bytes_per_second must be 0 or a finite number >= 1 (0 = no NUMA level) (got "
       "-2500000000 from numa_node_bytes_per_second in " + path + ")"},
      {"cuda_sim { engine_bytes_per_second: 0 }\n", {},
       "cuda_sim.engine_bytes_per_second must be a finite number >= 1 (e.g. 55GB) (got 0 from "
       "cuda_sim.engine_bytes_per_second in " + path + ")"},
      {"cuda_sim { switch_bytes_per_second: -0.5 }\n", {},
       "cuda_sim.switch_bytes_per_second must be 0 or a finite number >= 1 (0 = no switch limit) "
       "(got -0.5 from "
       "cuda_sim.switch_bytes_per_second in " + path + ")"},
      {"max_sessions: 100\n", {{"max_sessions_per_uid", "200"}},
       "max_sessions_per_uid must not exceed max_sessions (got 200 from "
       "--max_sessions_per_uid=200 on the command line; max_sessions is 100 from max_sessions "
       "in " + path + ")"},
      {"max_shm_mappings_total: 10\nmax_shm_mappings_per_uid: 20\n", {},
       "max_shm_mappings_per_uid must not exceed max_shm_mappings_total (got 20 from "
       "max_shm_mappings_per_uid in " + path + "; max_shm_mappings_total is 10 from "
       "max_shm_mappings_total in " + path + ")"},
      {"spill_bytes_per_second: nan\n", {},
       "spill_bytes_per_second must be 0 or below, or a finite number >= 1 (0 = measured at "
       "start-up, negative = unpaced) (got nan from spill_bytes_per_second in " + path + ")"},
      {"numa_node_bytes_per_second: inf\n", {},
       "numa_node_bytes_per_second must be 0 or a finite number >= 1 (0 = no NUMA level) (got inf "
       "from numa_node_bytes_per_second in " + path + ")"},
      // A value the file does not name is its default, said so (not "from ... in FILE").
      {"max_connections_total: 100\n", {},
       "max_connections_per_uid must not exceed max_connections_total (got 512, the default; "
       "max_connections_total is 100 from max_connections_total in " + path + ")"},
      {"", {{"max_sessions", "5"}},
       "max_sessions_per_uid must not exceed max_sessions (got 256, the default; max_sessions "
       "is 5 from --max_sessions=5 on the command line)"},
  };
  for (const Case& c : cases) {
    std::ofstream(path) << c.file;
    const absl::StatusOr<v1::DaemonConfig> config = LoadDaemonConfig({path, c.flags});
    EXPECT_EQ(config.status().code(), absl::StatusCode::kInvalidArgument) << c.want;
    EXPECT_EQ(config.status().message(), "invalid config: " + c.want);
  }
  std::remove(path.c_str());
}

// backend "tpu" was refused without saying whether the flag or the file gave it; the fields
// with a fixed set of values, and true/false flags, now say so as range errors do, with the set.
TEST(ConfigTest, FixedSetValuesNameTheirSourceAndListTheChoices) {
  const std::string path = testing::TempDir() + "/choices.conf";
  const std::string backend_rule =
      "invalid config: backend must be one of \"shm\", \"cuda\" or \"cuda-sim\" (cuda-sim: a "
      "timing model of GPU copy engines for simulated clients and benchmarks)";
  std::ofstream(path) << "backend: \"tpu\"\n";
  EXPECT_EQ(LoadDaemonConfig({path, {}}).status().message(),
            backend_rule + " (got \"tpu\" from backend in " + path + ")");
  EXPECT_EQ(LoadDaemonConfig({path, {{"backend", "gpu"}}}).status().message(),
            backend_rule + " (got \"gpu\" from --backend=gpu on the command line)");
  EXPECT_TRUE(LoadDaemonConfig({path, {{"backend", "cuda-sim"}}}).ok());
  const std::string numa_rule =
      "invalid config: numa_placement must be \"auto\" or \"off\" (auto: slice the pool per NUMA "
      "node with GPUs when there are two or more)";
  EXPECT_EQ(LoadDaemonConfig({"", {{"numa_placement", "on"}}}).status().message(),
            numa_rule + " (got \"on\" from --numa_placement=on on the command line)");
  std::ofstream(path) << "numa_placement: \"on\"\n";
  EXPECT_EQ(LoadDaemonConfig({path, {}}).status().message(),
            numa_rule + " (got \"on\" from numa_placement in " + path + ")");
  std::ofstream(path) << "projector { backend: \"magma\" }\n";
  EXPECT_NE(LoadDaemonConfig({path, {}}).status().message().find(
                "(got \"magma\" from projector.backend in " + path + ")"),
            std::string::npos);
  v1::DaemonConfig c = *ParseConfig("");
  EXPECT_EQ(ApplyFlag("pool-mlock", "yes", &c).message(),
            "pool_mlock must be \"true\" or \"false\" (or 1 or 0; --pool_mlock alone is true) "
            "(got \"yes\" from --pool_mlock=yes on the command line)");
  std::remove(path.c_str());
}

// The field at `path` ("cuda_sim.gpus") of `c`, and the message that holds it.
std::pair<google::protobuf::Message*, const google::protobuf::FieldDescriptor*> FieldAt(
    v1::DaemonConfig* c, const std::string& path) {
  google::protobuf::Message* m = c;
  const google::protobuf::FieldDescriptor* f = nullptr;
  for (absl::string_view part : absl::StrSplit(path, '.')) {
    if (f != nullptr) m = m->GetReflection()->MutableMessage(m, f);
    f = m->GetDescriptor()->FindFieldByName(std::string(part));
  }
  return {m, f};
}

// Sets the numeric field at `path` to `v`; false when its type cannot hold `v`.
bool SetNumber(v1::DaemonConfig* c, const std::string& path, double v) {
  using F = google::protobuf::FieldDescriptor;
  auto [m, f] = FieldAt(c, path);
  const bool whole = v >= 0 && v == std::floor(v);
  switch (f->cpp_type()) {
    case F::CPPTYPE_UINT32:
      if (!whole || v > 4294967295.0) return false;
      m->GetReflection()->SetUInt32(m, f, static_cast<uint32_t>(v));
      return true;
    case F::CPPTYPE_UINT64:
      if (!whole || v >= 18446744073709551616.0) return false;
      m->GetReflection()->SetUInt64(m, f, static_cast<uint64_t>(v));
      return true;
    default:
      m->GetReflection()->SetDouble(m, f, v);
      return true;
  }
}

// Each numeric field's range is written once (ConfigFieldRanges): ValidateConfig accepts its
// bounds, refuses the next value past each with the rule, and a count flag beyond its type
// names the same range (a second table of ranges for flags could drift from ValidateConfig's).
TEST(ConfigFieldRangesTest, OneTableGivesValidationAndFlagsTheirBounds) {
  std::set<std::string> flags;
  for (const FlagInfo& f : ConfigFlags()) flags.insert(f.name);
  int count_flags = 0;
  for (const ConfigFieldRange& r : ConfigFieldRanges()) {
    SCOPED_TRACE(r.field);
    v1::DaemonConfig defaults = *ParseConfig("");
    const google::protobuf::FieldDescriptor* field = FieldAt(&defaults, r.field).second;
    ASSERT_NE(field, nullptr);
    const bool whole =
        field->cpp_type() != google::protobuf::FieldDescriptor::CPPTYPE_DOUBLE;
    const double inf = std::numeric_limits<double>::infinity();
    const double lowest = r.min_excluded ? std::nextafter(r.min, inf) : r.min;
    for (double v : {lowest, r.max, r.zero_allowed ? 0.0 : lowest}) {
      v1::DaemonConfig c = defaults;
      if (!SetNumber(&c, r.field, v)) continue;
      EXPECT_TRUE(ValidateConfig(c).ok()) << v << ": " << ValidateConfig(c);
    }
    const double below = r.min_excluded ? r.min : whole ? r.min - 1 : std::nextafter(r.min, -inf);
    const double above = whole ? r.max + 1 : std::nextafter(r.max, inf);
    for (double v : {below, above}) {
      v1::DaemonConfig c = defaults;
      if (!SetNumber(&c, r.field, v)) continue;
      const std::string message(ValidateConfig(c).message());
      EXPECT_EQ(message.rfind("invalid config: " + r.field + " " + r.rule + " (got ", 0), 0u)
          << v << ": " << message;
    }
    if (whole && flags.count(r.field) && !absl::EndsWith(r.field, "_bytes")) {
      v1::DaemonConfig c = defaults;
      EXPECT_NE(std::string(ApplyFlag(r.field, "99999999999999999999", &c).message())
                    .find(absl::StrFormat("must be a whole number from %.0f to %.0f,", r.min,
                                          r.max)),
                std::string::npos);
      ++count_flags;
    }
  }
  EXPECT_EQ(count_flags, 3);  // copy_threads, spill_io_threads, max_streams_per_connection
}

// --check-config FILE --ring_poll_seconds=0.001 passed a FILE whose ring_poll_seconds: 0.5 a
// daemon started with the file alone refuses, without a word; the file is checked alone too.
TEST(ConfigTest, CheckingAFileWithFlagsChecksTheFileAloneToo) {
  const std::string path = testing::TempDir() + "/check_alone.conf";
  std::ofstream(path) << "ring_poll_seconds: 0.5\n";
  const absl::StatusOr<CheckedConfig> mended =
      LoadConfigToCheck({path, {{"ring_poll_seconds", "0.001"}}});
  ASSERT_TRUE(mended.ok()) << mended.status();
  EXPECT_EQ(mended->config.ring_poll_seconds(), 0.001);
  EXPECT_EQ(mended->what, path + " with --ring_poll_seconds=0.001 from the command line");
  EXPECT_EQ(mended->note,
            path + " alone is not valid (invalid config: ring_poll_seconds must be 0 or "
            "between 0.00005 and 0.1 (0: clients always wake the daemon; below 0.00005 the "
            "kernel's timer slack sets the poll rate; above 0.1 a submission may wait too long "
            "to be taken) (got 0.5 from ring_poll_seconds in " +
            path + ")); it is valid only with the command-line flags given "
            "(--ring_poll_seconds=0.001): a daemon started from the file without those flags "
            "refuses it, so fix the file or always start the daemon with the same flags");
  // Invalid with the flags too: the flags' error, as before.
  const absl::StatusOr<CheckedConfig> both = LoadConfigToCheck({path, {{"copy_threads", "0"}}});
  EXPECT_NE(both.status().message().find("(got 0 from --copy_threads=0 on the command line)"),
            std::string::npos)
      << both.status();
  // Valid alone and with the flags: the verdict names the flags.
  std::ofstream(path) << "ring_poll_seconds: 0.01\n";
  const absl::StatusOr<CheckedConfig> valid =
      LoadConfigToCheck({path, {{"ring_poll_seconds", "0.001"}, {"copy_threads", "3"}}});
  ASSERT_TRUE(valid.ok()) << valid.status();
  EXPECT_EQ(valid->note, "");
  EXPECT_EQ(valid->what,
            path + " with --ring_poll_seconds=0.001 --copy_threads=3 from the command line");
  EXPECT_EQ(valid->config.ring_poll_seconds(), 0.001);
  EXPECT_EQ(valid->config.copy_threads(), 3u);
  // Without flags: the file, as before.
  const absl::StatusOr<CheckedConfig> alone = LoadConfigToCheck({path, {}});
  ASSERT_TRUE(alone.ok()) << alone.status();
  EXPECT_EQ(alone->what, path);
  std::remove(path.c_str());
}

TEST(ConfigTest, CudaSimIsABackendButNotTheDefault) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->backend(), "shm");
  ASSERT_TRUE(ApplyFlag("backend", "cuda-sim", &*c).ok());
  EXPECT_TRUE(ValidateConfig(*c).ok());
  // The asynchronous engine is the default; the blocking one stays selectable.
  EXPECT_TRUE(c->async_copies());
  EXPECT_EQ(c->max_chunks_in_flight_per_gpu(), 8u);
  ASSERT_TRUE(ApplyFlag("async-copies", "false", &*c).ok());
  ASSERT_TRUE(ApplyFlag("max_chunks_in_flight_per_gpu", "4", &*c).ok());
  EXPECT_FALSE(c->async_copies());
  EXPECT_EQ(c->max_chunks_in_flight_per_gpu(), 4u);
}

TEST(ConfigTest, ProjectorBackendIsLapackUnlessAsked) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->projector().backend(), "");  // lapack
  for (const char* name : {"lapack", "cusolver", "auto"}) {
    auto d = ParseConfig(std::string("projector { backend: \"") + name + "\" }");
    ASSERT_TRUE(d.ok()) << d.status();
    EXPECT_TRUE(ValidateConfig(*d).ok()) << name;
  }
  auto bad = ParseConfig("projector { backend: \"magma\" }");
  ASSERT_TRUE(bad.ok());
  absl::Status st = ValidateConfig(*bad);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "invalid config: projector.backend must be one of \"lapack\", \"cusolver\", "
            "\"auto\" or \"\" (lapack: the host CPU, the default, as is \"\"; cusolver: "
            "gradients on a GPU, solved there) (got \"magma\")");
}

TEST(ConfigTest, LinkCalibrationIsOnForGpuBackendsWithAFiveSecondBudget) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_TRUE(c->link_calibration());
  EXPECT_EQ(c->link_calibration_budget_seconds(), 5);
  EXPECT_FALSE(ToCoreOptions(*c).link_calibration.at_start);  // shm: nothing to measure
  ASSERT_TRUE(ApplyFlag("backend", "cuda-sim", &*c).ok());
  session::CoreOptions o = ToCoreOptions(*c);
  EXPECT_TRUE(o.link_calibration.at_start);
  EXPECT_EQ(o.link_calibration.budget_seconds, 5);
  ASSERT_TRUE(ApplyFlag("link-calibration", "false", &*c).ok());
  ASSERT_TRUE(ApplyFlag("link_calibration_budget_seconds", "1.5", &*c).ok());
  o = ToCoreOptions(*c);
  EXPECT_FALSE(o.link_calibration.at_start);
  EXPECT_EQ(o.link_calibration.budget_seconds, 1.5);
  ASSERT_TRUE(ApplyFlag("link_calibration_budget_seconds", "0", &*c).ok());
  absl::Status st = ValidateConfig(*c);
  EXPECT_NE(st.message().find("link_calibration_budget_seconds must be in (0, 600]"),
            std::string::npos)
      << st;
}

TEST(ConfigTest, CudaSimModelFromTheConfigAndItsSwitchesAsLinks) {
  auto c = ParseConfig(
      "backend: \"cuda-sim\"\n"
      "cuda_sim { gpus: 5 gpus_per_switch: 2 engine_bytes_per_second: 20GB "
      "switch_bytes_per_second: 30GB }\n"
      "links { name: \"sim-switch1\" d2h_bytes_per_second: 25GB }\n");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);  // a capacity-only override
  copy::SimCudaOptions sim = ToSimCudaOptions(*c);
  EXPECT_EQ(sim.model.gpus, 5);
  EXPECT_EQ(sim.model.gpus_per_switch, 2);
  EXPECT_EQ(sim.model.engine_bytes_per_second, 20e9);
  EXPECT_EQ(sim.model.switch_bytes_per_second, 30e9);
  auto t = ResolveTopology(*c, ConfiguredGpuAddresses(*c));
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->links.size(), 3u);  // GPUs 0-1, 2-3 and 4 (an odd count: a switch of one)
  EXPECT_EQ(t->links[0].name, "sim-switch0");
  EXPECT_EQ(t->links[0].gpus, (std::vector<std::string>{copy::SimCudaApi::DeviceUuid(0),
                                                          copy::SimCudaApi::DeviceUuid(1)}));
  EXPECT_EQ(t->links[2].gpus, (std::vector<std::string>{copy::SimCudaApi::DeviceUuid(4)}));
  session::CoreOptions o = ToCoreOptions(*c, *t);
  ASSERT_EQ(o.links.size(), 3u);
  EXPECT_EQ(o.links[0].d2h_bytes_per_second, 0);  // to be measured
  EXPECT_EQ(o.links[1].d2h_bytes_per_second, 25e9);  // configured: wins
  EXPECT_EQ(o.links[1].h2d_bytes_per_second, 0);
  EXPECT_EQ(o.gpu_bus_ids[copy::SimCudaApi::DeviceUuid(4)], "0000:14:00.0");

  // Without a switch limit the simulated GPUs share nothing: no links (each its own).
  auto d = ParseConfig("backend: \"cuda-sim\"");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(ToSimCudaOptions(*d).model.gpus, 8);
  EXPECT_EQ(ToSimCudaOptions(*d).model.engine_bytes_per_second, 55e9);
  EXPECT_TRUE(SimulatedTopology(*d).links.empty());

  auto bad = ParseConfig(
      "cuda_sim { gpus: 0 gpus_per_switch: 0 engine_bytes_per_second: 0 "
      "switch_bytes_per_second: -1 }");
  ASSERT_TRUE(bad.ok());
  const std::string msg(ValidateConfig(*bad).message());
  for (const char* field : {"cuda_sim.gpus ", "cuda_sim.gpus_per_switch",
                            "cuda_sim.engine_bytes_per_second", "cuda_sim.switch_bytes"}) {
    EXPECT_NE(msg.find(field), std::string::npos) << field << " in " << msg;
  }
}

// README: every config field can be overridden with a flag of the same name. Fields that are
// messages (links, gpus, projector, ...) are set in the file only.
TEST(ConfigTest, EveryScalarFieldHasAFlagOfTheSameName) {
  std::set<std::string> flags;
  for (const FlagInfo& f : ConfigFlags()) flags.insert(f.name);
  const google::protobuf::Descriptor* d = v1::DaemonConfig::descriptor();
  std::vector<std::string> missing;
  for (int i = 0; i < d->field_count(); ++i) {
    const google::protobuf::FieldDescriptor* f = d->field(i);
    if (f->cpp_type() == google::protobuf::FieldDescriptor::CPPTYPE_MESSAGE) continue;
    if (flags.count(std::string(f->name())) == 0) missing.push_back(std::string(f->name()));
  }
  EXPECT_TRUE(missing.empty()) << "config fields without a flag: " << absl::StrJoin(missing, ", ");
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(ApplyFlag("max_connections_total", "100", &*c).ok());
  ASSERT_TRUE(ApplyFlag("max-shm-mapped-bytes-per-uid", "1GiB", &*c).ok());
  ASSERT_TRUE(ApplyFlag("unused_connection_timeout_seconds", "2.5", &*c).ok());
  EXPECT_EQ(c->max_connections_total(), 100u);
  EXPECT_EQ(c->max_shm_mapped_bytes_per_uid(), 1ull << 30);
  EXPECT_DOUBLE_EQ(c->unused_connection_timeout_seconds(), 2.5);
}

TEST(ConfigTest, FlagsOverrideWithSizesAndDashes) {
  auto c = ParseConfig("");
  ASSERT_TRUE(ApplyFlag("pool-bytes", "64MiB", &*c).ok());
  EXPECT_EQ(c->pool_bytes(), 64ull << 20);
  ASSERT_TRUE(ApplyFlag("default_link_bytes_per_second", "2GB", &*c).ok());
  EXPECT_DOUBLE_EQ(c->default_link_bytes_per_second(), 2e9);
  ASSERT_TRUE(ApplyFlag("socket_mode", "0600", &*c).ok());
  EXPECT_EQ(c->socket_mode(), 0600u);
  EXPECT_EQ(ApplyFlag("pool_bytes", "lots", &*c).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ApplyFlag("bogus", "1", &*c).code(), absl::StatusCode::kNotFound);
  // An unknown flag near known ones names them: a misspelling, or the same first word.
  EXPECT_EQ(ApplyFlag("pool-byte", "1", &*c).message(),
            "unknown flag --pool-byte (did you mean --pool_bytes?) (offloadd --help lists them)");
  const std::string pool(ApplyFlag("pool-size", "8GiB", &*c).message());
  EXPECT_NE(pool.find("(did you mean --pool_bytes, "), std::string::npos) << pool;
  EXPECT_NE(pool.find("--pool_shm_name"), std::string::npos) << pool;
  EXPECT_EQ(ApplyFlag("bogus", "1", &*c).message(),
            "unknown flag --bogus (offloadd --help lists them)");
  EXPECT_EQ(*ParseBytes("1.5GiB"), 1610612736u);
  EXPECT_EQ(*ParseBytes("4096"), 4096u);
}

TEST(ConfigTest, MissingFileIsNotFound) {
  absl::Status missing = LoadConfigFile("/nonexistent/offloadd.conf").status();
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_NE(missing.message().find("/nonexistent/offloadd.conf: No such file or directory"),
            std::string::npos)
      << missing;
  absl::Status dir = LoadConfigFile("/tmp").status();
  EXPECT_EQ(dir.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(dir.message().find("it is a directory"), std::string::npos) << dir;
}

TEST(ConfigTest, SizeSuffixesInTheFile) {
  auto c = ParseConfig(
      "pool_bytes: 256GiB\nchunk_bytes: 8MiB\nsession_quota_bytes: 1.5GB  # a comment\n"
      "links { name: \"l0\" gpus: \"g0\" d2h_bytes_per_second: 25GB "
      "h2d_bytes_per_second: 4096 }\nsocket_path: \"/tmp/pool_bytes: 1GiB.sock\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool_bytes(), 256ull << 30);
  EXPECT_EQ(c->chunk_bytes(), 8ull << 20);
  EXPECT_EQ(c->session_quota_bytes(), 1500000000u);
  EXPECT_DOUBLE_EQ(c->links(0).d2h_bytes_per_second(), 25e9);
  EXPECT_DOUBLE_EQ(c->links(0).h2d_bytes_per_second(), 4096);
  EXPECT_EQ(c->socket_path(), "/tmp/pool_bytes: 1GiB.sock");  // strings are left alone
  // A suffix the parser does not know: the error names the line and the accepted suffixes.
  auto bad = ParseConfig("copy_threads: 2\npool_bytes: 256G\n");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("line 2"), std::string::npos) << bad.status();
  EXPECT_NE(bad.status().message().find("KiB MiB GiB TiB KB MB GB TB"), std::string::npos)
      << bad.status();
  // A space before the suffix: read as the size ("5 GiB" became a field named GiB, an error on
  // the next line without the suffixes).
  auto spaced = ParseConfig("pool_bytes: 5 GiB\nchunk_bytes:\t8\tMiB\n");
  ASSERT_TRUE(spaced.ok()) << spaced.status();
  EXPECT_EQ(spaced->pool_bytes(), 5ull << 30);
  EXPECT_EQ(spaced->chunk_bytes(), 8ull << 20);
  // The shm mapping bounds are sizes too, as their flags are.
  auto mapped = ParseConfig(
      "max_shm_mapped_bytes_total: 256GiB\nmax_shm_mapped_bytes_per_uid: 64 GiB\n");
  ASSERT_TRUE(mapped.ok()) << mapped.status();
  EXPECT_EQ(mapped->max_shm_mapped_bytes_total(), 256ull << 30);
  EXPECT_EQ(mapped->max_shm_mapped_bytes_per_uid(), 64ull << 30);
  auto mapped_bad = ParseConfig("max_shm_mapped_bytes_per_uid: 0x10\n");
  ASSERT_FALSE(mapped_bad.ok());
  EXPECT_NE(mapped_bad.status().message().find("size suffix"), std::string::npos)
      << mapped_bad.status();
  auto unknown = ParseConfig("copy_threads: 2\npool_bytes: 5 XiB\ncopy_threads: 3\n");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.status().message().find("KiB MiB GiB TiB KB MB GB TB"), std::string::npos)
      << unknown.status();
}


// The size-suffix expansion was a std::regex whose matcher recursed once per character: a file
// of one word of ~22 KB (or a long whitespace run) overflowed the stack (SIGSEGV) well below
// the 1 MiB file limit. Each text here is over 1 MB.
TEST(ConfigTest, LongTokensAndWhitespaceRunsGiveErrorsNotCrashes) {
  const size_t n = 1000001;
  ASSERT_LT(n + 100, kMaxConfigFileBytes);
  const absl::StatusOr<v1::DaemonConfig> word = ParseConfig(
      "pool_bytes: 64MiB\nsocket_group: " + std::string(n, 'x') + "\n");
  EXPECT_EQ(word.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(word.status().message(), "config: line 2 column 15: "))
      << word.status().message().substr(0, 200);
  EXPECT_LT(word.status().message().size(), 1000u);  // the token is quoted cut short
  const absl::StatusOr<v1::DaemonConfig> letters = ParseConfig(std::string(n, 'a'));
  EXPECT_EQ(letters.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(letters.status().message(), "config: line 1 column "))
      << letters.status().message().substr(0, 200);
  const absl::StatusOr<v1::DaemonConfig> lines =
      ParseConfig("pool_bytes:" + std::string(n, '\n') + "64MiB\n");
  ASSERT_TRUE(lines.ok()) << lines.status();
  EXPECT_EQ(lines->pool_bytes(), 64ull << 20);
  const absl::StatusOr<v1::DaemonConfig> spaces = ParseConfig(
      std::string(n, ' ') + "chunk_bytes" + std::string(n, ' ') + ":" + std::string(n / 4, '\t') +
      "16 MiB\n");
  ASSERT_TRUE(spaces.ok()) << spaces.status();
  EXPECT_EQ(spaces->chunk_bytes(), 16ull << 20);
  const absl::StatusOr<v1::DaemonConfig> digits =
      ParseConfig("pool_bytes: " + std::string(n, '1') + "GiB\n");
  EXPECT_EQ(digits.status().code(), absl::StatusCode::kInvalidArgument);
  // Through the file reader, as offloadd --check-config reads it.
  const std::string path = testing::TempDir() + "/long.conf";
  std::ofstream(path) << "pool_bytes: 64MiB\nsocket_group: " << std::string(n, 'x') << "\n";
  const absl::Status file = LoadDaemonConfig({path, {}}).status();
  EXPECT_EQ(file.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(absl::StartsWith(file.message(), path + ": config: line 2 column 15: "))
      << file.message().substr(0, 200);
  std::remove(path.c_str());
}

// The expansion keeps its reach: the four name endings, spaces and tabs before the suffix,
// a fraction, strings and comments untouched, a suffix glued to a word left alone.
TEST(ConfigTest, SizeSuffixExpansionReadsWhatItDid) {
  EXPECT_EQ(ExpandSizeSuffixes("pool_bytes: 64MiB\nx_bytes_total :\n 1.5 KiB\n"),
            "pool_bytes: 67108864\nx_bytes_total :\n 1536\n");
  EXPECT_EQ(ExpandSizeSuffixes("a_bytes_per_uid:2B a_bytes_per_second: 2GB"),
            "a_bytes_per_uid:2 a_bytes_per_second: 2000000000");
  EXPECT_EQ(ExpandSizeSuffixes("pool_bytes: 64MiBx _bytes: 1KiB pool_bytesx: 1KiB"),
            "pool_bytes: 64MiBx _bytes: 1KiB pool_bytesx: 1KiB");
  EXPECT_EQ(ExpandSizeSuffixes("s: \"pool_bytes: 1KiB\" # pool_bytes: 1KiB\npool_bytes: 1KB"),
            "s: \"pool_bytes: 1KiB\" # pool_bytes: 1KiB\npool_bytes: 1000");
  EXPECT_EQ(ExpandSizeSuffixes("pool_bytes: 1.KiB pool_bytes: 5 XiB"),
            "pool_bytes: 1.KiB pool_bytes: 5 XiB");
}

// Each config text of `cases` is refused with INVALID_ARGUMENT and "config: " + its message.
void ExpectRefusedParses(const std::vector<std::pair<std::string, std::string>>& cases) {
  for (const auto& [text, want] : cases) {
    const absl::StatusOr<v1::DaemonConfig> c = ParseConfig(text);
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(c.status().message(), "config: " + want) << text;
  }
}

// A singular field named twice was kept silently (the last value won); and when the config was
// invalid for another reason, the re-read for sources refused the repeat, logged a stray
// libprotobuf error and called every value "the default".
TEST(ConfigTest, ASingularFieldGivenTwiceIsRefusedWithItsLines) {
  const std::string keep = "a field that is not a list is given once; keep one of them";
  const std::vector<std::pair<std::string, std::string>> twice = {
      {"max_sessions: 300\nmax_sessions: 2000\n",
       "line 2 column 1: max_sessions is given a second time (first on line 1): " + keep},
      {"backend: \"shm\"; pool_mlock: false\n\nbackend: \"bogus\"\n",
       "line 3 column 1: backend is given a second time (first on line 1): " + keep},
      {"projector { }\ncopy_threads: 2\nprojector { backend: \"lapack\" }\n",
       "line 3 column 1: projector is given a second time (first on line 1): " + keep},
      {"cuda_sim {\n  gpus: 2\n  gpus: 0\n}\n",
       "line 3 column 3: cuda_sim.gpus is given a second time (first on line 2): " + keep},
  };
  ExpectRefusedParses(twice);
  // Lists and messages of a list may be given many times; each message of a list apart.
  const absl::StatusOr<v1::DaemonConfig> lists = ParseConfig(
      "allowed_uids: 1\nallowed_uids: [2, 3]\nlinks { name: \"a\" gpus: \"g\" }\n"
      "links { name: \"b\" gpus: \"h\" }\n");
  ASSERT_TRUE(lists.ok()) << lists.status();
  EXPECT_EQ(lists->allowed_uids_size(), 3);
  EXPECT_EQ(lists->links_size(), 2);
  // Through a file: refused with the path, nothing logged; an invalid file's values are
  // attributed to it, not to the defaults.
  const std::string path = testing::TempDir() + "/twice.conf";
  std::ofstream(path) << "backend: \"shm\"\nbackend: \"bogus\"\n";
  testing::internal::CaptureStderr();
  const absl::Status st = LoadDaemonConfig({path, {}}).status();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_EQ(st.message(), path + ": config: line 2 column 1: backend is given a second time "
                                 "(first on line 1): " + keep);
  std::ofstream(path) << "backend: \"bogus\"\nmax_sessions: 2000\n";
  testing::internal::CaptureStderr();
  const absl::Status invalid = LoadDaemonConfig({path, {}}).status();
  EXPECT_EQ(testing::internal::GetCapturedStderr(), "");
  EXPECT_NE(invalid.message().find("(got \"bogus\" from backend in " + path + ")"),
            std::string::npos)
      << invalid;
  std::remove(path.c_str());
}

// tests/fixtures/sysfs/<name> in the runfiles.
std::string Fixture(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return "/nonexistent";
  return std::string(srcdir) + "/" + workspace + "/tests/fixtures/sysfs/" + name;
}

TEST(ConfigTest, ShmLinksHostLinksAndHalfDuplexReachCoreOptions) {
  auto c = ParseConfig(
      "links { name: \"sw0\" gpus: \"a\" gpus: \"b\" d2h_bytes_per_second: 1e9 "
      "h2d_bytes_per_second: 2e9 }\n"
      "links { name: \"shared\" gpus: \"c\" d2h_bytes_per_second: 5e8 half_duplex: true }\n"
      "host_links { name: \"mem0\" links: \"sw0\" links: \"d\" d2h_bytes_per_second: 1.5e9 }\n"
      "offload_min_share: 0.25\n");
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  EXPECT_EQ(c->sysfs_root(), "/sys");  // default
  auto topo = ResolveTopology(*c, ConfiguredGpuAddresses(*c));
  ASSERT_TRUE(topo.ok()) << topo.status();
  const session::CoreOptions o = ToCoreOptions(*c, *topo);
  ASSERT_EQ(o.links.size(), 2u);
  EXPECT_EQ(o.links[0].name, "sw0");
  EXPECT_EQ(o.links[0].gpus, (std::vector<std::string>{"a", "b"}));
  EXPECT_DOUBLE_EQ(o.links[0].h2d_bytes_per_second, 2e9);
  EXPECT_FALSE(o.links[0].half_duplex);
  EXPECT_TRUE(o.links[1].half_duplex);
  EXPECT_DOUBLE_EQ(o.offload_min_share, 0.25);
  ASSERT_EQ(o.host_links.size(), 1u);
  EXPECT_EQ(o.host_links[0].links, (std::vector<std::string>{"sw0", "d"}));
  EXPECT_DOUBLE_EQ(o.host_links[0].d2h_bytes_per_second, 1.5e9);
  EXPECT_DOUBLE_EQ(o.host_links[0].h2d_bytes_per_second, 0);
  // The config-only conversion agrees.
  const session::CoreOptions plain = ToCoreOptions(*c);
  ASSERT_EQ(plain.links.size(), 2u);
  EXPECT_TRUE(plain.links[1].half_duplex);
  EXPECT_EQ(plain.host_links.size(), 1u);
}

TEST(ConfigTest, DiscoveryFromSysfsWithCapacitiesAndNumaHostLinks) {
  std::string text = "sysfs_root: \"" + Fixture("hgx8") + "\"\n";
  const char* gpus[][2] = {{"g0", "0000:03:00.0"}, {"g1", "0000:04:00.0"},
                           {"g2", "0000:23:00.0"}, {"g3", "0000:24:00.0"},
                           {"g4", "0000:83:00.0"}, {"g5", "0000:84:00.0"},
                           {"g6", "0000:a3:00.0"}, {"g7", "0000:a4:00.0"}};
  for (const auto& g : gpus) {
    text += std::string("gpus { id: \"") + g[0] + "\" pci_bus_id: \"" + g[1] + "\" }\n";
  }
  // A capacity-only override of a discovered link, and a regrouped link.
  text += "links { name: \"switch-0000:01:00.0\" d2h_bytes_per_second: 25e9 "
          "h2d_bytes_per_second: 24e9 }\n"
          "links { name: \"pair67\" gpus: \"g6\" gpus: \"g7\" d2h_bytes_per_second: 20e9 }\n"
          "numa_node_bytes_per_second: 40e9\n";
  auto c = ParseConfig(text);
  ASSERT_TRUE(c.ok()) << c.status();
  ASSERT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  auto topo = ResolveTopology(*c, ConfiguredGpuAddresses(*c));
  ASSERT_TRUE(topo.ok()) << topo.status();
  const session::CoreOptions o = ToCoreOptions(*c, *topo);
  ASSERT_EQ(o.links.size(), 4u);
  EXPECT_EQ(o.links[0].name, "switch-0000:01:00.0");
  EXPECT_EQ(o.links[0].gpus, (std::vector<std::string>{"g0", "g1"}));
  EXPECT_DOUBLE_EQ(o.links[0].d2h_bytes_per_second, 25e9);
  EXPECT_DOUBLE_EQ(o.links[0].h2d_bytes_per_second, 24e9);
  EXPECT_EQ(o.links[0].root_port, "0000:00:01.0");
  EXPECT_EQ(o.links[0].numa_node, 0);
  EXPECT_NEAR(o.links[0].pcie_bytes_per_second, 31.5e9, 0.05e9);
  EXPECT_DOUBLE_EQ(o.links[1].d2h_bytes_per_second, 0);  // discovered, not configured
  EXPECT_EQ(o.links[3].name, "pair67");
  EXPECT_EQ(o.links[3].numa_node, 1);
  EXPECT_EQ(o.gpu_bus_ids.at("g6"), "0000:a3:00.0");
  ASSERT_EQ(o.host_links.size(), 2u);
  EXPECT_EQ(o.host_links[0].name, "numa0");
  EXPECT_EQ(o.host_links[0].links,
            (std::vector<std::string>{"switch-0000:01:00.0", "switch-0000:21:00.0"}));
  EXPECT_EQ(o.host_links[1].name, "numa1");
  EXPECT_EQ(o.host_links[1].links, (std::vector<std::string>{"switch-0000:81:00.0", "pair67"}));
  EXPECT_DOUBLE_EQ(o.host_links[1].h2d_bytes_per_second, 40e9);
  EXPECT_EQ(o.host_links[1].numa_node, 1);
}

TEST(ConfigTest, TopologyErrorsNameTheProblem) {
  auto c = ParseConfig("sysfs_root: \"" + Fixture("hgx8") +
                       "\"\ngpus { id: \"g0\" pci_bus_id: \"0000:99:00.0\" }\n");
  ASSERT_TRUE(c.ok());
  auto topo = ResolveTopology(*c, ConfiguredGpuAddresses(*c));
  EXPECT_EQ(topo.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(topo.status().message()).find("topology: "), std::string::npos);
  auto unknown = ParseConfig("gpus { id: \"g0\" pci_bus_id: \"0000:03:00.0\" }\n"
                             "links { name: \"nope\" d2h_bytes_per_second: 1 }\n"
                             "sysfs_root: \"" + Fixture("hgx8") + "\"\n");
  ASSERT_TRUE(unknown.ok());
  EXPECT_EQ(ResolveTopology(*unknown, ConfiguredGpuAddresses(*unknown)).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(ConfigTest, ValidationOfTopologyFields) {
  auto c = ParseConfig(
      "gpus { id: \"g0\" pci_bus_id: \"zz\" }\n"
      "gpus { id: \"g0\" pci_bus_id: \"0000:03:00.0\" }\n"
      "links { name: \"h\" gpus: \"x\" half_duplex: true h2d_bytes_per_second: 1 }\n"
      "host_links { name: \"m\" links: \"a\" d2h_bytes_per_second: -1 }\n"
      "host_links { name: \"m\" links: \"a\" }\n"
      "host_links { name: \"empty\" }\n"
      "offload_min_share: 1.5\nnuma_node_bytes_per_second: -2\n");
  ASSERT_TRUE(c.ok()) << c.status();
  std::string msg(ValidateConfig(*c).message());
  for (const char* want :
       {"pci_bus_id \"zz\"", "gpu g0 is listed twice", "half_duplex", "host link m: capacities",
        "host link m is configured twice", "link a is under more than one host link",
        "host link empty lists no links", "offload_min_share", "numa_node_bytes_per_second"}) {
    EXPECT_NE(msg.find(want), std::string::npos) << want << " in: " << msg;
  }
  // Without gpus to discover, a link must list its GPUs.
  auto bare = ParseConfig("links { name: \"x\" d2h_bytes_per_second: 1 }\n");
  ASSERT_TRUE(bare.ok());
  EXPECT_NE(std::string(ValidateConfig(*bare).message()).find("lists no gpus"),
            std::string::npos);
  ASSERT_TRUE(ApplyFlag("offload-min-share", "0.3", &*bare).ok());
  EXPECT_DOUBLE_EQ(bare->offload_min_share(), 0.3);
  ASSERT_TRUE(ApplyFlag("numa_node_bytes_per_second", "40GB", &*bare).ok());
  EXPECT_DOUBLE_EQ(bare->numa_node_bytes_per_second(), 40e9);
  ASSERT_TRUE(ApplyFlag("sysfs_root", "/tmp/sys", &*bare).ok());
  EXPECT_EQ(bare->sysfs_root(), "/tmp/sys");
}

TEST(ConfigTest, IsolationFieldsDefaultsFlagsAndCoreOptions) {
  auto c = ParseConfig("");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->max_requests_in_flight(), 4096u);
  EXPECT_EQ(c->max_sessions(), 1024u);
  EXPECT_TRUE(c->watch_client_pids());
  EXPECT_DOUBLE_EQ(c->pid_exit_grace_seconds(), 2.0);
  EXPECT_EQ(*ResolveSocketGroup(*c), -1);
  ASSERT_TRUE(ApplyFlag("allowed-uids", "1000, 1001", &*c).ok());
  ASSERT_TRUE(ApplyFlag("allowed_gids", "27", &*c).ok());
  ASSERT_TRUE(ApplyFlag("admin_uids", "500", &*c).ok());
  ASSERT_TRUE(ApplyFlag("uid_quota_bytes", "2GiB", &*c).ok());
  ASSERT_TRUE(ApplyFlag("max_requests_in_flight", "64", &*c).ok());
  ASSERT_TRUE(ApplyFlag("max_sessions", "0", &*c).ok());
  EXPECT_EQ(c->max_links(), 64u);
  ASSERT_TRUE(ApplyFlag("max_links", "8", &*c).ok());
  ASSERT_TRUE(ApplyFlag("watch_client_pids", "false", &*c).ok());
  ASSERT_TRUE(ApplyFlag("pid_exit_grace_seconds", "0.5", &*c).ok());
  ASSERT_TRUE(ApplyFlag("socket_group", "0", &*c).ok());
  EXPECT_EQ(ApplyFlag("allowed_uids", "bob", &*c).code(), absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE(ValidateConfig(*c).ok());
  EXPECT_EQ(*ResolveSocketGroup(*c), 0);
  session::CoreOptions o = ToCoreOptions(*c);
  EXPECT_EQ(o.access.allowed_uids, (std::vector<uint32_t>{1000, 1001}));
  EXPECT_EQ(o.access.allowed_gids, (std::vector<uint32_t>{27}));
  EXPECT_EQ(o.access.admin_uids, (std::vector<uint32_t>{500}));
  EXPECT_EQ(o.store.uid_quota_bytes, 2ull << 30);
  EXPECT_EQ(o.max_requests_in_flight, 64u);
  EXPECT_EQ(o.max_sessions, 0u);
  EXPECT_EQ(o.max_links, 8u);
  EXPECT_FALSE(o.watch_pids);
  EXPECT_DOUBLE_EQ(o.pid_exit_grace_seconds, 0.5);
  // A group name that does not exist and a negative grace are reported with the fix.
  c->set_socket_group("no-such-group-offloadd");
  c->set_pid_exit_grace_seconds(-1);
  absl::Status st = ValidateConfig(*c);
  EXPECT_NE(std::string(st.message()).find("groupadd no-such-group-offloadd"), std::string::npos)
      << st;
  EXPECT_NE(std::string(st.message()).find("pid_exit_grace_seconds"), std::string::npos);
  c->set_socket_group("root");
  c->set_pid_exit_grace_seconds(1);
  ASSERT_TRUE(ValidateConfig(*c).ok());
  EXPECT_EQ(*ResolveSocketGroup(*c), 0);
}

namespace offloadd {
namespace {

TEST(ConfigBoundsTest, PerUidBoundsMayNotExceedTheirTotals) {
  auto config = ParseConfig("max_shm_mappings_total: 10\nmax_shm_mappings_per_uid: 20\n");
  ASSERT_TRUE(config.ok()) << config.status();
  absl::Status st = ValidateConfig(*config);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(st.message(),
            "invalid config: max_shm_mappings_per_uid must not exceed max_shm_mappings_total "
            "(got 20; max_shm_mappings_total is 10)");
  auto defaults = ParseConfig("");
  ASSERT_TRUE(defaults.ok());
  EXPECT_EQ(defaults->max_shm_mappings_total(), 16384u);
  EXPECT_EQ(defaults->max_shm_mapped_bytes_per_uid(), 64ull << 30);
}

}  // namespace
}  // namespace offloadd

namespace offloadd {
namespace {

// What ApplyFlag says about `value` for `flag`, on the defaults ("OK" when it is accepted).
std::string FlagOutcome(const std::string& flag, const std::string& value,
                        v1::DaemonConfig* c = nullptr) {
  v1::DaemonConfig defaults = *ParseConfig("");
  absl::Status st = ApplyFlag(flag, value, c != nullptr ? c : &defaults);
  return st.ok() ? "OK" : std::string(st.message());
}

// "<field> <rule> (got "<value>" from --<field>=<value> on the command line)".
std::string FlagError(const std::string& field, const std::string& rule,
                      const std::string& value) {
  return absl::StrCat(field, " ", rule, " (got \"", value, "\" from --", field, "=", value,
                      " on the command line)");
}

std::string CountRule(const std::string& range) {
  return "must be a whole number " + range +
         ", in decimal digits only (no sign, leading 0, 0x, exponent or fraction)";
}

const char kSizeRule[] =
    "must be a whole number of bytes in decimal digits, optionally with a size suffix (KiB MiB "
    "GiB TiB KB MB GB TB), like 1073741824, 64MiB or 1.5GiB (no sign, 0x or exponent)";

// Counts narrowed to uint32 wrapped: 4294967297 became 1, 4294967296 became 0 (no bound).
TEST(ConfigFlagRanges, CountsBeyondTheirFieldAreRefusedNotWrapped) {
  for (const char* flag : {"max_connections_total", "max_sessions", "max_requests_in_flight",
                           "max_links", "admin_reserved_connections"}) {
    for (const char* value : {"4294967296", "4294967297", "4294967301", "1e30", "-1"}) {
      EXPECT_EQ(FlagOutcome(flag, value),
                FlagError(flag, CountRule("from 0 to 4294967295"), value));
    }
  }
  v1::DaemonConfig c = *ParseConfig("");
  ASSERT_EQ(FlagOutcome("max_connections_total", "4294967295", &c), "OK");
  EXPECT_EQ(c.max_connections_total(), 4294967295u);
  ASSERT_EQ(FlagOutcome("max_sessions", "2000", &c), "OK");
  EXPECT_EQ(c.max_sessions(), 2000u);
  EXPECT_NE(FlagOutcome("max_sessions", "2.5"), "OK");  // a count is whole
}

// A field validated to a narrower range than its type names that range: --copy_threads=-1 said
// "from 0 to 4294967295" though 1 to 64 are allowed.
TEST(ConfigFlagRanges, NumbersIntoUnsignedFieldsAreRangeChecked) {
  EXPECT_EQ(FlagOutcome("spill_io_threads", "-1"),
            FlagError("spill_io_threads", CountRule("from 1 to 64"), "-1"));
  EXPECT_EQ(FlagOutcome("copy_threads", "-1"),
            FlagError("copy_threads", CountRule("from 1 to 64"), "-1"));
  EXPECT_EQ(FlagOutcome("copy_threads", "5e9"),
            FlagError("copy_threads", CountRule("from 1 to 64"), "5e9"));
  EXPECT_EQ(FlagOutcome("max_streams_per_connection", "4294967296"),
            FlagError("max_streams_per_connection", CountRule("from 0 to 1000000"),
                      "4294967296"));
  EXPECT_EQ(FlagOutcome("admission_queue_limit", "-1"),
            FlagError("admission_queue_limit", CountRule("from 0 to 4294967295"), "-1"));
  // A fraction into an integer field was dropped without a word (1.9 threads became 1).
  EXPECT_EQ(FlagOutcome("copy_threads", "1.9"),
            FlagError("copy_threads", CountRule("from 1 to 64"), "1.9"));
  EXPECT_EQ(FlagOutcome("admission_queue_limit", "0.9"),
            FlagError("admission_queue_limit", CountRule("from 0 to 4294967295"), "0.9"));
  v1::DaemonConfig c = *ParseConfig("");
  ASSERT_EQ(FlagOutcome("max_shm_mappings_total", "18446744073709551615", &c), "OK");
  EXPECT_EQ(c.max_shm_mappings_total(), 18446744073709551615ull);  // exact, not via a double
  EXPECT_EQ(FlagOutcome("max_shm_mappings_total", "18446744073709551616"),
            FlagError("max_shm_mappings_total", CountRule("from 0 to 18446744073709551615"),
                      "18446744073709551616"));
}

// Counts took 0x10 as 16, 1e3 as 1000 and 2e3 as 2000; a count is decimal digits, as in the
// config file (which reads 010 as octal 8, so a leading 0 is refused on both).
TEST(ConfigFlagRanges, CountsTakeDecimalDigitsOnly) {
  for (const char* flag : {"max_sessions", "admission_queue_limit", "spill_stage_ahead_blocks",
                           "max_chunks_in_flight_per_gpu", "max_shm_mappings_total"}) {
    const std::string range = std::string(flag) == "max_shm_mappings_total"
                                  ? "from 0 to 18446744073709551615"
                                  : "from 0 to 4294967295";
    for (const char* value : {"0x10", "0X10", "1e3", "2e3", "1.5", "10.0", "010", "+5", "",
                              "ten", "1_000"}) {
      EXPECT_EQ(FlagOutcome(flag, value), FlagError(flag, CountRule(range), value));
    }
    v1::DaemonConfig c = *ParseConfig("");
    ASSERT_EQ(FlagOutcome(flag, "0", &c), "OK");
    ASSERT_EQ(FlagOutcome(flag, "16", &c), "OK");
  }
  EXPECT_EQ(FlagOutcome("allowed_uids", "1000,0x10"),
            FlagError("allowed_uids",
                      "must be numeric ids from 0 to 4294967295 in decimal digits, "
                      "comma-separated, like 1000,1001",
                      "1000,0x10"));
  v1::DaemonConfig c = *ParseConfig("");
  ASSERT_EQ(FlagOutcome("allowed_uids", "1000, 0", &c), "OK");
  EXPECT_EQ(c.allowed_uids_size(), 2);
}

// --pool_bytes=0x10 was 16 bytes, 1e9 was 10^9 and 1.5 was rounded to 2: a size is whole bytes
// in decimal digits, optionally with a suffix (a fraction only where the suffix makes it whole).
TEST(ConfigFlagRanges, SizesTakeDecimalBytesWithOptionalSuffixes) {
  for (const char* flag : {"pool_bytes", "chunk_bytes", "uid_quota_bytes",
                           "max_shm_mapped_bytes_total"}) {
    for (const char* value : {"0x10", "1e9", "1E9", "1.5", "1.5B", "0.1B", "010",
                              "-1", "+64MiB", "64XiB", "1.5e3MiB", ".5GiB", "5.GiB", ""}) {
      EXPECT_EQ(FlagOutcome(flag, value), FlagError(flag, kSizeRule, value));
    }
  }
  v1::DaemonConfig c = *ParseConfig("");
  const std::vector<std::pair<std::string, uint64_t>> good = {
      {"4096", 4096},          {"64MiB", 64ull << 20},     {"1.5GiB", 1610612736},
      {"0.5KiB", 512},         {"1.25KB", 1250},           {"2TiB", 2ull << 40},
      {"1.000GiB", 1ull << 30}, {"0", 0},                  {"7B", 7}};
  for (const auto& [value, bytes] : good) {
    ASSERT_EQ(FlagOutcome("uid_quota_bytes", value, &c), "OK") << value;
    EXPECT_EQ(c.uid_quota_bytes(), bytes) << value;
    EXPECT_EQ(*ParseBytes(value), bytes) << value;
  }
  EXPECT_EQ(ParseBytes("0x10").status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(ParseBytes("99999999999999999999").status().code(), absl::StatusCode::kOutOfRange);
  // Rates are real numbers: exponents and fractions stay allowed.
  ASSERT_EQ(FlagOutcome("default_link_bytes_per_second", "2.5e10", &c), "OK");
  EXPECT_DOUBLE_EQ(c.default_link_bytes_per_second(), 2.5e10);
  ASSERT_EQ(FlagOutcome("numa_node_bytes_per_second", "40GB", &c), "OK");
  EXPECT_DOUBLE_EQ(c.numa_node_bytes_per_second(), 40e9);
  EXPECT_NE(FlagOutcome("default_link_bytes_per_second", "0x10"), "OK");
}

// In the config file the text format read 0x10 as 16 and 010 as octal 8 without a word, and
// refused 1e3 without saying what to write; a size written 1.5B was rounded to 2 bytes.
TEST(ConfigFlagRanges, TheFilesWholeNumbersTakeDecimalDigitsOnly) {
  const std::string count = CountRule("from 0 to 4294967295");
  const std::vector<std::pair<std::string, std::string>> bad = {
      {"max_sessions: 0x10\n", "line 1 column 15: max_sessions " + count + " (got 0x10)"},
      {"copy_threads: 2\nmax_sessions: 010\n",
       "line 2 column 15: max_sessions " + count + " (got 010)"},
      {"max_sessions: 1e3\n", "line 1 column 15: max_sessions " + count + " (got 1e3)"},
      {"admission_queue_limit: 1.5\n",
       "line 1 column 24: admission_queue_limit " + count + " (got 1.5)"},
      {"copy_threads: 0x4\n",
       "line 1 column 15: copy_threads " + CountRule("from 1 to 64") + " (got 0x4)"},
      {"pool_bytes: 0x10000000\n",
       "line 1 column 13: pool_bytes " + std::string(kSizeRule) + " (got 0x10000000)"},
      {"pool_bytes: 1.5B\n", "line 1 column 13: pool_bytes " + std::string(kSizeRule) +
                                 " (got 1.5B)"},
      {"cuda_sim { gpus: 0x8 }\n",
       "line 1 column 18: cuda_sim.gpus " + CountRule("from 1 to 64") + " (got 0x8)"},
      {"allowed_uids: [1000, 0x10]\n",
       "line 1 column 22: allowed_uids " + count + " (got 0x10)"},
      {"gpu_weights: [{ gpu: \"a\" weight: 2 }, { gpu: \"b\" weight: 0x2 }]\n",
       "line 1 column 58: gpu_weights.weight " + count + " (got 0x2)"},
  };
  ExpectRefusedParses(bad);
  // Decimal digits, sizes with suffixes, and socket_mode's octal are read as before.
  const absl::StatusOr<v1::DaemonConfig> good = ParseConfig(
      "max_sessions: 10\nsocket_mode: 0600\npool_bytes: 1.5GiB\nallowed_uids: [0, 1000]\n"
      "cuda_sim { gpus: 8 }\nspill_bytes_per_second: 2.5e9\nmax_links: 0\n");
  ASSERT_TRUE(good.ok()) << good.status();
  EXPECT_EQ(good->max_sessions(), 10u);
  EXPECT_EQ(good->socket_mode(), 0600u);
  EXPECT_EQ(good->pool_bytes(), 1610612736u);
  EXPECT_EQ(good->cuda_sim().gpus(), 8u);
  EXPECT_EQ(good->spill_bytes_per_second(), 2.5e9);
  // Through LoadConfigFile the path comes first.
  const std::string path = testing::TempDir() + "/forms.conf";
  std::ofstream(path) << "max_sessions: 0x10\n";
  EXPECT_EQ(LoadDaemonConfig({path, {}}).status().message(),
            path + ": config: line 1 column 15: max_sessions " + count + " (got 0x10)");
  std::remove(path.c_str());
}

// --pool_bytes=2^64 was reported as 9223372036854775808 bytes (llround overflowed).
TEST(ConfigFlagRanges, SizesBeyond64BitsAreRefused) {
  for (const char* value : {"18446744073709551616", "16777216TiB", "99999999999999999999"}) {
    EXPECT_EQ(FlagOutcome("pool_bytes", value),
              FlagError("pool_bytes",
                        "must be at most 18446744073709551615 bytes (16 EiB, the most a 64-bit "
                        "count holds)",
                        value));
  }
  EXPECT_EQ(*ParseBytes("18446744073709551615"), 18446744073709551615ull);
  EXPECT_EQ(*ParseBytes("9223372036854775808"), 9223372036854775808ull);
  EXPECT_EQ(*ParseBytes("9223372036854775809"), 9223372036854775809ull);
  EXPECT_EQ(*ParseBytes("8TiB"), 8ull << 40);
  EXPECT_EQ(*ParseBytes("16777215TiB"), 16777215ull << 40);
  EXPECT_FALSE(ParseConfig("pool_bytes: 16777216TiB").ok());  // left as written; parser refuses
}

// socket_mode=0999 was read by strtoul as 0 and created the socket with mode 0.
TEST(ConfigFlagRanges, SocketModeMustBeAnOctalModeUpTo0777) {
  for (const char* value : {"0999", "0789", "8", "01777", "0x1ff", "rw", "", "-0660", "000660"}) {
    EXPECT_EQ(FlagOutcome("socket_mode", value),
              FlagError("socket_mode", "must be an octal file mode from 0000 to 0777, like 0660",
                        value));
  }
  v1::DaemonConfig c = *ParseConfig("");
  ASSERT_EQ(FlagOutcome("socket_mode", "0777", &c), "OK");
  EXPECT_EQ(c.socket_mode(), 0777u);
  ASSERT_EQ(FlagOutcome("socket_mode", "600", &c), "OK");
  EXPECT_EQ(c.socket_mode(), 0600u);
  // In the file, protobuf's text format refuses a non-octal number with a leading zero and
  // integers beyond the field; ValidateConfig refuses modes above 0777.
  EXPECT_FALSE(ParseConfig("socket_mode: 0999").ok());
  EXPECT_FALSE(ParseConfig("max_connections_total: 4294967297").ok());
  EXPECT_FALSE(ValidateConfig(*ParseConfig("socket_mode: 01777")).ok());
}

// In the file, `socket_mode: 777` is decimal 777 (01411); the error said "(got 777)", which
// reads as a valid mode, and 01000 showed as "got 512".
TEST(ConfigFlagRanges, SocketModeErrorsShowTheModeInOctalAndHowToWriteIt) {
  const std::string rule =
      "invalid config: socket_mode must be a file mode from 0 to 0777; in the config file write "
      "it with a leading 0, which the text format reads as octal (socket_mode: 0660), and on the "
      "command line as octal digits (--socket_mode=660)";
  EXPECT_EQ(ValidateConfig(*ParseConfig("socket_mode: 777\n")).message(),
            rule + " (got 01411 (decimal 777))");
  EXPECT_EQ(ValidateConfig(*ParseConfig("socket_mode: 01000\n")).message(),
            rule + " (got 01000 (decimal 512))");
  EXPECT_TRUE(ValidateConfig(*ParseConfig("socket_mode: 0777\n")).ok());
}

// Fields narrowed or rounded later are bounded where the config is validated.
TEST(ConfigFlagRanges, FieldsNarrowedLaterAreBounded) {
  v1::DaemonConfig c = *ParseConfig("");
  ASSERT_EQ(FlagOutcome("chunk_bytes", "18446744073709551615", &c), "OK");
  absl::Status st = ValidateConfig(c);
  EXPECT_NE(st.message().find("chunk_bytes must be between 4096 and 1073741824"),
            std::string::npos)
      << st;
  c = *ParseConfig("cuda_sim { gpus_per_switch: 4294967295 }");
  st = ValidateConfig(c);
  EXPECT_NE(st.message().find("cuda_sim.gpus_per_switch must be between 1 and 64"),
            std::string::npos)
      << st;
  EXPECT_TRUE(ValidateConfig(*ParseConfig("chunk_bytes: 1GiB")).ok());
}

// --socket_path rel.sock made a directory rel.sock (mkdir -p of the path without a slash).
TEST(ConfigSocketPath, ARelativePathResolvesAgainstTheCurrentDirectory) {
  char cwd[4096];
  ASSERT_NE(getcwd(cwd, sizeof(cwd)), nullptr);
  v1::DaemonConfig c = *ParseConfig("socket_path: \"rel.sock\"");
  EXPECT_EQ(ResolveSocketPath(c), std::string(cwd) + "/rel.sock");
  c = *ParseConfig("socket_path: \"run/x.sock\"");
  EXPECT_EQ(ResolveSocketPath(c), std::string(cwd) + "/run/x.sock");
  c = *ParseConfig("socket_path: \"/tmp/a.sock\"");
  EXPECT_EQ(ResolveSocketPath(c), "/tmp/a.sock");
}

std::string TestTmp(const std::string& name) {
  const char* dir = std::getenv("TEST_TMPDIR");
  return std::string(dir != nullptr ? dir : "/tmp") + "/config_test_" + name;
}

// /dev/zero grew until the OOM killer; a FIFO without a writer blocked start-up for good.
TEST(ConfigFileInput, DevicesFifosAndHugeFilesAreRefusedBeforeReading) {
  for (const char* device : {"/dev/zero", "/dev/urandom"}) {
    absl::Status st = LoadConfigFile(device).status();
    EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
    EXPECT_NE(st.message().find("it is a character device; give a regular file"),
              std::string::npos)
        << st;
  }
  const std::string fifo = TestTmp("fifo.conf");
  unlink(fifo.c_str());
  ASSERT_EQ(mkfifo(fifo.c_str(), 0600), 0);
  absl::Status st = LoadConfigFile(fifo).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kFailedPrecondition) << st;
  EXPECT_NE(st.message().find("it is a FIFO"), std::string::npos) << st;
  unlink(fifo.c_str());
  const std::string big = TestTmp("big.conf");
  {
    std::ofstream f(big);
    f << "# " << std::string(kMaxConfigFileBytes, 'x') << "\npool_bytes: 64MiB\n";
  }
  st = LoadConfigFile(big).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kOutOfRange) << st;
  EXPECT_NE(st.message().find("larger than 1048576 bytes"), std::string::npos) << st;
  const std::string small = TestTmp("small.conf");
  std::ofstream(small) << "pool_bytes: 64MiB\n";
  auto c = LoadConfigFile(small);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->pool_bytes(), 64ull << 20);
}

// Rate flags were rounded to whole bytes per second, so a small positive rate became 0, which
// means unpaced (or no NUMA level, or measure at start-up); and flag and file read rates
// differently (1e3GB only as a flag, 1.8e19 only in the file).
TEST(ConfigTest, RatesAreRealNumbersKeptAsGivenInFlagsAndFileAlike) {
  const std::vector<std::pair<std::string, double>> rates = {
      {"0.4", 0.4},        {"1e-300", 1e-300}, {"0.3", 0.3},          {"0.4B", 0.4},
      {"1e3GB", 1e12},     {"2.5e10", 2.5e10}, {"1.8446744073709552e19", 1.8446744073709552e19},
      {"1e300", 1e300},    {"25GB", 25e9},     {"1.5KiB", 1536},      {"7", 7},
      {"2E3MB", 2e9},      {"0", 0}};
  for (const char* flag : {"default_link_bytes_per_second", "numa_node_bytes_per_second",
                           "spill_bytes_per_second"}) {
    for (const auto& [value, want] : rates) {
      v1::DaemonConfig c = *ParseConfig("");
      ASSERT_EQ(FlagOutcome(flag, value, &c), "OK") << flag << "=" << value;
      const auto* f = v1::DaemonConfig::descriptor()->FindFieldByName(flag);
      EXPECT_EQ(c.GetReflection()->GetDouble(c, f), want) << flag << "=" << value;
      const absl::StatusOr<v1::DaemonConfig> file =
          ParseConfig(absl::StrCat(flag, ": ", value, "\n"));
      ASSERT_TRUE(file.ok()) << flag << ": " << value << ": " << file.status();
      EXPECT_EQ(file->GetReflection()->GetDouble(*file, f), want) << flag << ": " << value;
      // A positive rate below a byte per second is read as given, and refused by the range.
      EXPECT_EQ(ValidateConfig(c).ok(), want == 0 || want >= 1) << flag << "=" << value;
    }
  }
  const absl::StatusOr<v1::DaemonConfig> sim = ParseConfig(
      "cuda_sim { engine_bytes_per_second: 0.4B switch_bytes_per_second: 1e3 GB }\n"
      "spill_bytes_per_second: -1GB\n");
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ(sim->cuda_sim().engine_bytes_per_second(), 0.4);
  EXPECT_EQ(sim->cuda_sim().switch_bytes_per_second(), 1e12);
  EXPECT_EQ(sim->spill_bytes_per_second(), -1e9);
  EXPECT_NE(ValidateConfig(*sim).message().find(
                "cuda_sim.engine_bytes_per_second must be a finite number >= 1 (e.g. 55GB) "
                "(got 0.4"),
            std::string::npos)
      << ValidateConfig(*sim);
  for (const char* tiny : {"1e-300", "0.4", "0.999"}) {  // a typo, not a link or a disk
    for (const char* flag : {"default_link_bytes_per_second", "numa_node_bytes_per_second",
                             "spill_bytes_per_second"}) {
      v1::DaemonConfig t = *ParseConfig("");
      ASSERT_EQ(FlagOutcome(flag, tiny, &t), "OK");
      EXPECT_FALSE(ValidateConfig(t).ok()) << flag << "=" << tiny;
    }
  }
  v1::DaemonConfig c = *ParseConfig("");
  ASSERT_EQ(FlagOutcome("spill_bytes_per_second", "-1GB", &c), "OK");
  EXPECT_EQ(c.spill_bytes_per_second(), -1e9);
  // A negative rate where none is allowed is the range's to refuse, naming the flag.
  ASSERT_EQ(FlagOutcome("default_link_bytes_per_second", "-5", &c), "OK");
  EXPECT_NE(ValidateConfig(c, {"", {{"default_link_bytes_per_second", "-5"}}})
                .message()
                .find("default_link_bytes_per_second must be 0 or a finite number >= 1 (0 = unpaced) "
                      "(got -5 from --default_link_bytes_per_second=-5 on the command line)"),
            std::string::npos)
      << ValidateConfig(c);
  const std::string rule =
      "must be a rate in bytes per second: a real number, optionally with a size suffix (KiB MiB "
      "GiB TiB KB MB GB TB B), like 25GB, 2.5e10 or 1e3GB";
  for (const char* value : {"0x10", "inf", "nan", "1e308TB", "", "GB", ".5GB", "5.GB", "+5",
                            "1e", "5 G B", "25XB", "--1"}) {
    EXPECT_EQ(FlagOutcome("default_link_bytes_per_second", value),
              FlagError("default_link_bytes_per_second", rule, value));
  }
}

// --allowed_uids=, was an empty list (anyone) replacing the file's; socket_mode: 0x1b0 was
// taken though the mode is octal; --pool_bytes=" 5" was stripped but --max_sessions=" 3"
// refused; --pool_bytes=1.3KiB got the generic size rule.
TEST(ConfigFlagRanges, EmptyIdsHexModesSpacesAndPartBytesAreRefusedSayingWhy) {
  for (const char* value : {",", "1000,,1001", ",1000", "1000,", " ", "1000, ,1001"}) {
    EXPECT_EQ(FlagOutcome("allowed_uids", value),
              FlagError("allowed_uids",
                        "has an empty entry: give ids separated by single commas, like 1000,1001 "
                        "(an empty value, --allowed_uids=, empties the list)",
                        value));
  }
  v1::DaemonConfig c = *ParseConfig("allowed_uids: [5, 6]\n");
  ASSERT_EQ(FlagOutcome("admin_uids", "7", &c), "OK");
  ASSERT_EQ(FlagOutcome("allowed_uids", ",", &c).substr(0, 5), "allow");
  EXPECT_EQ(c.allowed_uids_size(), 2);  // the file's list stays
  ASSERT_EQ(FlagOutcome("allowed_uids", "", &c), "OK");
  EXPECT_EQ(c.allowed_uids_size(), 0);
  ASSERT_EQ(FlagOutcome("allowed_uids", "1000, 1001", &c), "OK");
  EXPECT_EQ(c.allowed_uids_size(), 2);
  for (const char* text : {"socket_mode: 0x1b0\n", "socket_mode: 0X1B0\n"}) {
    const std::string got = std::string(text).substr(13, 5);
    EXPECT_EQ(ParseConfig(text).status().message(),
              "config: line 1 column 14: socket_mode must be an octal file mode written with a "
              "leading 0, like 0660 (got " + got + ")");
  }
  EXPECT_EQ(ParseConfig("socket_mode: 0600\n")->socket_mode(), 0600u);
  const std::string spaced = "must be written without spaces before or after the value";
  for (const char* flag : {"pool_bytes", "max_sessions", "resume_grace_seconds", "socket_mode",
                           "default_link_bytes_per_second", "pool_mlock"}) {
    for (const char* value : {" 5", "5 ", "\t5"}) {
      EXPECT_EQ(FlagOutcome(flag, value), FlagError(flag, spaced, value));
    }
  }
  // A space between the number and its suffix reads as in the file ("64 GiB").
  ASSERT_EQ(FlagOutcome("pool_bytes", "64 GiB", &c), "OK");
  EXPECT_EQ(c.pool_bytes(), 64ull << 30);
  ASSERT_EQ(FlagOutcome("default_link_bytes_per_second", "2.5\tGB", &c), "OK");
  EXPECT_EQ(c.default_link_bytes_per_second(), 2.5e9);
  EXPECT_EQ(FlagOutcome("pool_bytes", "1.3 KiB"),
            FlagError("pool_bytes",
                      "must be a whole number of bytes: 1.3 KiB is between 1331 and 1332 bytes; "
                      "write one of those, or a fraction that comes to whole bytes with its "
                      "suffix (1.5KiB is 1536)",
                      "1.3 KiB"));
  EXPECT_EQ(FlagOutcome("pool_bytes", "1.3KiB"),
            FlagError("pool_bytes",
                      "must be a whole number of bytes: 1.3KiB is between 1331 and 1332 bytes; "
                      "write one of those, or a fraction that comes to whole bytes with its "
                      "suffix (1.5KiB is 1536)",
                      "1.3KiB"));
}

// pool_bytes: 1.3KiB in the file got the generic size rule "(got 1.3)", where the flag said
// it comes to a fraction of a byte.
TEST(ConfigFlagRanges, AFileSizeThatComesToAPartByteSaysSo) {
  const std::string rule =
      "must be a whole number of bytes: 1.3KiB is between 1331 and 1332 bytes; write one of "
      "those, or a fraction that comes to whole bytes with its suffix (1.5KiB is 1536)";
  for (const char* text : {"pool_bytes: 1.3KiB\n", "pool_bytes: 1.3 KiB\n"}) {
    EXPECT_EQ(ParseConfig(text).status().message(), "config: line 1 column 13: pool_bytes " + rule)
        << text;
  }
  EXPECT_EQ(ParseConfig("chunk_bytes: 1024\npool_bytes: 1.5\nchunk_bytes: 5\n").status().message(),
            "config: line 2 column 13: pool_bytes must be a whole number of bytes in decimal "
            "digits, optionally with a size suffix (KiB MiB GiB TiB KB MB GB TB), like "
            "1073741824, 64MiB or 1.5GiB (no sign, 0x or exponent) (got 1.5)");
  EXPECT_EQ(ParseConfig("pool_bytes: 2.5").status().message(),
            "config: line 1 column 13: pool_bytes must be a whole number of bytes in decimal "
            "digits, optionally with a size suffix (KiB MiB GiB TiB KB MB GB TB), like "
            "1073741824, 64MiB or 1.5GiB (no sign, 0x or exponent) (got 2.5)");
  EXPECT_EQ(ParseConfig("pool_bytes: 1.5KiB\n")->pool_bytes(), 1536u);
}

// A metrics_address the HTTP server cannot serve passed --check-config and failed at start-up
// ("null context when constructing CivetServer"); port 0 served on a port nobody scrapes.
TEST(ConfigTest, MetricsAddressIsHostAndPortOrEmpty) {
  v1::DaemonConfig c = *ParseConfig("");
  for (const char* bad : {":", "127.0.0.1:", ":19558", "127.0.0.1:99999", "127.0.0.1:65536",
                          "127.0.0.1:+80", "0.0.0.0:0", "garbage", "127.0.0.1:-1"}) {
    c.set_metrics_address(bad);
    EXPECT_TRUE(absl::StrContains(
        ValidateConfig(c).message(),
        "metrics_address must be HOST:PORT with a port from 1 to 65535, like 127.0.0.1:9464, "
        "0.0.0.0:9464 or [::1]:9464, or \"\" to serve no metrics (got \"" + std::string(bad) +
            "\""))
        << bad << ": " << ValidateConfig(c);
  }
  for (const char* good : {"", "127.0.0.1:9464", "0.0.0.0:1", "[::1]:65535", "node-1:9464"}) {
    c.set_metrics_address(good);
    EXPECT_TRUE(ValidateConfig(c).ok()) << good << ": " << ValidateConfig(c);
  }
}

// A relative spill_directory was taken: it followed the daemon's working directory.
TEST(ConfigTest, SpillDirectoryMustBeAbsolute) {
  v1::DaemonConfig c = *ParseConfig("spill_directory: \"spill\"\n");
  EXPECT_TRUE(absl::StartsWith(
      ValidateConfig(c).message(),
      "invalid config: spill_directory must be an absolute path (a relative one would follow "
      "the daemon's working directory, / under the systemd unit): give the whole path, like "
      "/var/lib/offloadd/spill (got \"spill\""))
      << ValidateConfig(c);
  c.set_spill_directory("/var/lib/offloadd/spill");
  EXPECT_TRUE(ValidateConfig(c).ok()) << ValidateConfig(c);
}

// A sized value the expansion could not read reached the text format's parser, which read its
// suffix as the next field's name: "pool_bytes: 16777216 TiB" was `no field named "TiB"` (on
// the line after, for "5 XiB"), "16777216TiB" "Need space between number and identifier";
// the flag named the rule.
TEST(ConfigFlagRanges, AFileSizeOrRateThatIsNoneNamesTheRuleAsTheFlagDoes) {
  const std::string too_many =
      "pool_bytes must be at most 18446744073709551615 bytes (16 EiB, the most a 64-bit count "
      "holds) (got 16777216TiB)";
  for (const char* text : {"pool_bytes: 16777216 TiB\n", "pool_bytes: 16777216TiB\n"}) {
    EXPECT_EQ(ParseConfig(text).status().message(), "config: line 1 column 13: " + too_many)
        << text;
  }
  EXPECT_EQ(ParseConfig("copy_threads: 2\npool_bytes: 5 XiB\ncopy_threads: 3\n")
                .status()
                .message(),
            "config: line 2 column 13: pool_bytes must be a whole number of bytes in decimal "
            "digits, optionally with a size suffix (KiB MiB GiB TiB KB MB GB TB), like "
            "1073741824, 64MiB or 1.5GiB (no sign, 0x or exponent) (got 5XiB)");
  EXPECT_EQ(ParseConfig("default_link_bytes_per_second: 1e308 TB\n").status().message(),
            "config: line 1 column 32: default_link_bytes_per_second must be a rate in bytes "
            "per second: a real number, optionally with a size suffix (KiB MiB GiB TiB KB MB GB "
            "TB B), like 25GB, 2.5e10 or 1e3GB (got 1e308TB)");
  // A number followed by the next field on the same line is read as before.
  const absl::StatusOr<v1::DaemonConfig> two = ParseConfig("pool_bytes: 5 chunk_bytes: 7\n");
  ASSERT_TRUE(two.ok()) << two.status();
  EXPECT_EQ(two->pool_bytes(), 5u);
  EXPECT_EQ(two->chunk_bytes(), 7u);
  EXPECT_EQ(ParseConfig("pool_bytes: 0x10 chunk_bytes: 7\n").status().message(),
            "config: line 1 column 13: pool_bytes must be a whole number of bytes in decimal "
            "digits, optionally with a size suffix (KiB MiB GiB TiB KB MB GB TB), like "
            "1073741824, 64MiB or 1.5GiB (no sign, 0x or exponent) (got 0x10)");
}

}  // namespace
}  // namespace offloadd

// A link's capacity of NaN or inf passed (NaN paced nothing, inf left the link unpaced).
TEST(ConfigTest, LinkCapacitiesMustBeFiniteAndSaySo) {
  auto c = ParseConfig("links { name: \"l\" d2h_bytes_per_second: nan }\n"
                       "host_links { name: \"h\" links: \"l\" h2d_bytes_per_second: inf }\n");
  ASSERT_TRUE(c.ok()) << c.status();
  const std::string message(ValidateConfig(*c).message());
  EXPECT_NE(message.find("link l: capacities must be 0 or finite numbers >= 1 (bytes per "
                         "second; a positive rate below 1 paces nothing a link does) (got "
                         "d2h_bytes_per_second nan, h2d_bytes_per_second 0)"),
            std::string::npos)
      << message;
  EXPECT_NE(message.find("host link h: capacities must be 0 or finite numbers >= 1 (bytes "
                         "per second; a positive rate below 1 paces nothing a link does) (got "
                         "d2h_bytes_per_second 0, h2d_bytes_per_second inf)"),
            std::string::npos)
      << message;
}

}  // namespace
}  // namespace offloadd
