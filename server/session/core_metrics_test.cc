// Scrape-time metrics of a Core (core_metrics.h): what a scrape shows right after a transfer,
// through the real HTTP exposer, and the mapping from stats to series.
#include "server/session/core_metrics.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>

#include "gtest/gtest.h"
#include "server/copy/shm/shm_engine.h"
#include "server/metrics/metrics.h"
#include "server/session/completion_collector.h"
#include "server/session/core.h"
#include "server/session/session_test_util.h"

namespace offloadd::session {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::unique_ptr<Core> MakeCore(uint64_t pool_bytes) {
  pool::ArenaOptions a;
  a.size_bytes = pool_bytes;
  CoreOptions options;
  options.chunk_bytes = kMiB;
  return std::make_unique<Core>(options, *pool::Arena::Create(a),
                                std::make_unique<copy::ShmCopyEngine>());
}

// GET /metrics from 127.0.0.1:`port` (HTTP/1.0: the server closes after the answer).
std::string HttpGetMetrics(int port) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  const std::string request = "GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  EXPECT_EQ(write(fd, request.data(), request.size()), static_cast<ssize_t>(request.size()));
  std::string answer;
  char buf[65536];
  for (ssize_t n; (n = read(fd, buf, sizeof(buf))) > 0;) answer.append(buf, n);
  close(fd);
  return answer;
}

// The daemon used to copy its link counters into the registry once a second, so a scrape right
// after an offload did not show it yet. Now the link's scheduler is read at the scrape.
TEST(CoreMetricsTest, AScrapeRightAfterAnOffloadShowsItsBytes) {
  auto core = MakeCore(16 * kMiB);
  auto exposer = metrics::Exposer::Start("127.0.0.1:0");
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  (*exposer)->Register(core->collectable());
  CompletionCollector out;
  auto s = Session::Create(core.get(), out.emit());
  TestShm shm(kMiB);
  s->Handle(HelloRequest(1, "scrape"));
  ASSERT_EQ(out.Wait(1).kind, CompletionKind::kHello);
  s->Handle(RegisterRequest(2, shm));
  const uint64_t region = out.Wait(2).id;
  Request offload;
  offload.request_id = 3;
  offload.kind = RequestKind::kOffload;
  offload.region_id = region;
  offload.bytes = kMiB;
  s->Handle(offload);
  ASSERT_EQ(out.Wait(3).kind, CompletionKind::kOffloadDone);

  const std::string scrape = HttpGetMetrics((*exposer)->port());
  EXPECT_NE(scrape.find("offloadd_link_bytes_total{direction=\"d2h\",link=\"gpu0\"} 1048576\n"),
            std::string::npos)
      << scrape;
  EXPECT_NE(scrape.find("offloadd_link_gpu_bytes_total{direction=\"d2h\",gpu=\"gpu0\","
                        "link=\"gpu0\"} 1048576\n"),
            std::string::npos);
  EXPECT_NE(scrape.find("offloadd_pool_used_bytes{numa_node="), std::string::npos);
  EXPECT_NE(scrape.find("offloadd_pool_blocks 1\n"), std::string::npos);
  EXPECT_NE(scrape.find("offloadd_ipc_handles_open{gpu=\"gpu0\"} 1\n"), std::string::npos);
  // Registry families are still there, each once.
  EXPECT_NE(scrape.find("# TYPE offloadd_sessions_open gauge"), std::string::npos);
  EXPECT_EQ(scrape.find("# TYPE offloadd_link_bytes_total"),
            scrape.rfind("# TYPE offloadd_link_bytes_total"));
  s->Close(EndCause::kClosed);
}

// A pool sliced per NUMA node (here one slice, bound to node 0, the node this machine has):
// each session's offloads go to its GPU's node's slice, found from its Hello's device id; the
// fallbacks appear in a scrape with their reason.
TEST(CoreMetricsTest, ASessionsBlocksGoToItsGpusNodeAndFallbacksAreScraped) {
  pool::ArenaOptions a;
  a.size_bytes = 8 * kMiB;
  a.numa_nodes = {0};
  auto arena = pool::Arena::Create(a);
  ASSERT_TRUE(arena.ok()) << arena.status();
  CoreOptions options;
  options.chunk_bytes = kMiB;
  options.gpu_numa_nodes = {{"gpu0", 0}, {"gpu1", 1}};  // gpu2: node unknown
  Core core(options, *std::move(arena), std::make_unique<copy::ShmCopyEngine>());
  auto exposer = metrics::Exposer::Start("127.0.0.1:0");
  ASSERT_TRUE(exposer.ok()) << exposer.status();
  (*exposer)->Register(core.collectable());
  TestShm shm(kMiB);
  std::vector<std::shared_ptr<Session>> sessions;
  std::vector<std::unique_ptr<CompletionCollector>> outs;
  for (const char* gpu : {"gpu0", "gpu1", "gpu2"}) {
    outs.push_back(std::make_unique<CompletionCollector>());
    CompletionCollector& out = *outs.back();
    sessions.push_back(Session::Create(&core, out.emit()));
    Session& s = *sessions.back();
    Request hello = HelloRequest(1, gpu);
    hello.device_id = gpu;
    s.Handle(hello);
    ASSERT_EQ(out.Wait(1).kind, CompletionKind::kHello) << gpu;
    s.Handle(RegisterRequest(2, shm));
    Request offload;
    offload.request_id = 3;
    offload.kind = RequestKind::kOffload;
    offload.region_id = out.Wait(2).id;
    offload.bytes = kMiB;
    s.Handle(offload);
    ASSERT_EQ(out.Wait(3).kind, CompletionKind::kOffloadDone) << gpu;
  }
  const pool::PlacementCounts counts = core.store().stats().placement;
  EXPECT_EQ(counts.local, 1u);         // gpu0
  EXPECT_EQ(counts.no_slice, 1u);      // gpu1: node 1 has no slice
  EXPECT_EQ(counts.unknown_node, 1u);  // gpu2

  const std::string scrape = HttpGetMetrics((*exposer)->port());
  EXPECT_NE(scrape.find("offloadd_pool_numa_fallback_total{reason=\"no_slice\"} 1\n"),
            std::string::npos)
      << scrape;
  EXPECT_NE(scrape.find("offloadd_pool_numa_fallback_total{reason=\"unknown_node\"} 1\n"),
            std::string::npos);
  EXPECT_NE(scrape.find("offloadd_pool_numa_fallback_total{reason=\"slice_full\"} 0\n"),
            std::string::npos);
  EXPECT_NE(scrape.find("offloadd_pool_numa_slice_used_bytes{numa_node=\"0\"} 3145728\n"),
            std::string::npos);
  EXPECT_NE(scrape.find("offloadd_spill_stages_waiting 0\n"), std::string::npos);
  for (auto& s : sessions) s->Close(EndCause::kClosed);
}

TEST(CoreMetricsTest, ACoreDestroyedLeavesNothingInTheScrape) {
  auto core = MakeCore(4 * kMiB);
  std::shared_ptr<prometheus::Collectable> collectable = core->collectable();
  EXPECT_EQ(ScrapedValue(*collectable, "offloadd_pool_capacity_bytes",
                         {{"numa_node", metrics::NumaNodeLabel(core->arena().numa_node())}}),
            std::optional<double>(4 * kMiB));
  core.reset();
  EXPECT_TRUE(collectable->Collect().empty());
}

// The value of `name`{labels} in `families`; nullopt when absent.
std::optional<double> Find(const std::vector<prometheus::MetricFamily>& families,
                           const std::string& name, const prometheus::Labels& labels) {
  struct Fixed : prometheus::Collectable {
    explicit Fixed(std::vector<prometheus::MetricFamily> f) : families(std::move(f)) {}
    std::vector<prometheus::MetricFamily> Collect() const override { return families; }
    std::vector<prometheus::MetricFamily> families;
  };
  return ScrapedValue(Fixed(families), name, labels);
}

TEST(StateFamiliesTest, ClientReportsBySummedGpuAndZeroForOpenSessionsNotYetReporting) {
  CoreStats stats;
  ClientCounters c;
  c.fallbacks_total = 5;
  c.host_waits_total = 3;
  c.host_wait_seconds_total = 1.25;
  c.idle_steps_total = 2;
  stats.client_reports_by_gpu = {{"gpu0", c}};
  stats.client_reports_by_series = {{{"gpu0", "1000"}, c}};
  SessionInfo quiet;  // two sessions on gpu1, neither reported yet: one series at 0
  quiet.device_id = "gpu1";
  quiet.peer_known = true;
  quiet.uid = 1000;
  SessionInfo reported;
  reported.device_id = "gpu0";
  reported.peer_known = true;
  reported.uid = 1000;
  stats.sessions = {quiet, quiet, reported};
  const auto f = StateFamilies(stats, PoolFacts{});
  EXPECT_EQ(Find(f, "offloadd_client_fallbacks_total", {{"gpu", "gpu0"}, {"uid", "1000"}}),
            std::optional<double>(5));
  EXPECT_EQ(Find(f, "offloadd_client_host_waits_total", {{"gpu", "gpu0"}, {"uid", "1000"}}),
            std::optional<double>(3));
  EXPECT_EQ(Find(f, "offloadd_client_host_wait_seconds_total", {{"gpu", "gpu0"}, {"uid", "1000"}}),
            std::optional<double>(1.25));
  EXPECT_EQ(Find(f, "offloadd_client_idle_steps_total", {{"gpu", "gpu0"}, {"uid", "1000"}}),
            std::optional<double>(2));
  EXPECT_EQ(Find(f, "offloadd_client_fallbacks_total", {{"gpu", "gpu1"}, {"uid", "1000"}}),
            std::optional<double>(0));
  size_t gpu1_series = 0;
  for (const auto& family : f) {
    if (family.name != "offloadd_client_fallbacks_total") continue;
    for (const auto& m : family.metric) {
      for (const auto& l : m.label) gpu1_series += l.name == "gpu" && l.value == "gpu1";
    }
  }
  EXPECT_EQ(gpu1_series, 1u);
}

TEST(StateFamiliesTest, LinkSeriesFollowTheSchedulersStats) {
  CoreStats stats;
  LinkInfo full;
  full.name = "sw0";
  full.d2h_bytes_per_second = 25e9;
  full.h2d_bytes_per_second = 24e9;
  full.d2h.bytes = 3 * kMiB;
  full.d2h.busy_seconds = 0.5;
  full.d2h.gpu_bytes = {{"gpu0", 2 * kMiB}, {"gpu1", kMiB}};
  full.h2d.gpu_bytes = {{"gpu0", kMiB}};
  full.h2d.gpu_deadline_misses = {{"gpu0", 2}};
  full.h2d.queued_transfers = 4;
  LinkInfo half;  // unused, half duplex
  half.name = "hd";
  half.half_duplex = true;
  stats.links = {full, half};
  HostLinkInfo host;
  host.name = "rp0";
  host.d2h_bytes_per_second = 50e9;  // no h2d capacity: no h2d series
  host.d2h.bytes = 3 * kMiB;
  stats.host_links = {host};
  const auto f = StateFamilies(stats, PoolFacts{});

  const prometheus::Labels d2h{{"link", "sw0"}, {"direction", "d2h"}};
  const prometheus::Labels h2d{{"link", "sw0"}, {"direction", "h2d"}};
  EXPECT_EQ(Find(f, "offloadd_link_bytes_total", d2h), std::optional<double>(3 * kMiB));
  EXPECT_EQ(Find(f, "offloadd_link_busy_seconds_total", d2h), std::optional<double>(0.5));
  EXPECT_EQ(Find(f, "offloadd_link_bytes_total", h2d), std::nullopt);  // nothing counted yet
  EXPECT_EQ(Find(f, "offloadd_link_capacity_bytes_per_second", h2d), std::optional<double>(24e9));
  EXPECT_EQ(Find(f, "offloadd_link_queued_transfers", h2d), std::optional<double>(4));
  EXPECT_EQ(Find(f, "offloadd_link_gpu_bytes_total",
                 {{"link", "sw0"}, {"direction", "d2h"}, {"gpu", "gpu1"}}),
            std::optional<double>(kMiB));
  // One series per GPU and link, whichever directions the GPU used.
  EXPECT_EQ(Find(f, "offloadd_reload_deadline_misses_total", {{"gpu", "gpu0"}, {"link", "sw0"}}),
            std::optional<double>(2));
  EXPECT_EQ(Find(f, "offloadd_reload_deadline_misses_total", {{"gpu", "gpu1"}, {"link", "sw0"}}),
            std::optional<double>(0));
  EXPECT_EQ(Find(f, "offloadd_link_capacity_bytes_per_second",
                 {{"link", "hd"}, {"direction", "both"}}),
            std::optional<double>(0));
  EXPECT_EQ(Find(f, "offloadd_link_queued_transfers", {{"link", "hd"}, {"direction", "d2h"}}),
            std::nullopt);
  EXPECT_EQ(Find(f, "offloadd_host_link_bytes_total", {{"link", "rp0"}, {"direction", "d2h"}}),
            std::optional<double>(3 * kMiB));
  EXPECT_EQ(Find(f, "offloadd_host_link_capacity_bytes_per_second",
                 {{"link", "rp0"}, {"direction", "h2d"}}),
            std::nullopt);
}

TEST(StateFamiliesTest, PoolAndSpillFamiliesArePresentWithoutASpillTier) {
  CoreStats stats;
  stats.store.pool.used_bytes = 5 * kMiB;
  stats.store.offloads_refused_total = 7;
  stats.store.stages_promoted_total = 2;
  stats.store.stages_expired_total = 3;
  stats.store.stages_waiting = 4;
  PoolFacts pool;
  pool.numa_node = -1;
  pool.capacity_bytes = 64 * kMiB;
  pool.handles["gpu3"] = {/*opens_total=*/4, /*open=*/1};
  const auto f = StateFamilies(stats, pool);
  EXPECT_EQ(Find(f, "offloadd_pool_capacity_bytes", {{"numa_node", "unknown"}}),
            std::optional<double>(64 * kMiB));
  EXPECT_EQ(Find(f, "offloadd_tier_bytes", {{"tier", "pool"}}), std::optional<double>(5 * kMiB));
  EXPECT_EQ(Find(f, "offloadd_tier_bytes", {{"tier", "disk"}}), std::optional<double>(0));
  EXPECT_EQ(Find(f, "offloadd_spill_bytes_total", {{"direction", "stage"}}),
            std::optional<double>(0));
  EXPECT_EQ(Find(f, "offloadd_spill_capacity_bytes", {}), std::optional<double>(0));
  EXPECT_EQ(Find(f, "offloadd_offloads_refused_total", {}), std::optional<double>(7));
  EXPECT_EQ(Find(f, "offloadd_spill_stages_promoted_total", {}), std::optional<double>(2));
  EXPECT_EQ(Find(f, "offloadd_spill_stages_expired_total", {}), std::optional<double>(3));
  EXPECT_EQ(Find(f, "offloadd_spill_stages_waiting", {}), std::optional<double>(4));
  EXPECT_EQ(Find(f, "offloadd_ipc_handle_opens_total", {{"gpu", "gpu3"}}),
            std::optional<double>(4));
  for (const prometheus::MetricFamily& family : f) {
    EXPECT_FALSE(family.metric.empty()) << family.name;
    EXPECT_FALSE(family.help.empty()) << family.name;
  }
}

}  // namespace
}  // namespace offloadd::session
