// NUMA placement in the daemon, on the sysfs fixtures: the config's
// numa_placement picks the pool's slices from the GPUs' nodes, the store puts each session's
// blocks in its GPU's node's slice and falls back with the reason counted, and a scrape shows
// the fallback counts and each slice's bytes.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "prometheus/text_serializer.h"
#include "server/config.h"
#include "server/pool/arena.h"
#include "server/session/core_metrics.h"
#include "server/store/block_store.h"

namespace offloadd {
namespace {

constexpr uint64_t kMiB = 1ull << 20;

std::string Fixture(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return "/nonexistent";
  return std::string(srcdir) + "/" + workspace + "/tests/fixtures/sysfs/" + name;
}

// hgx8: g0..g3 on NUMA node 0, g4..g7 on node 1.
std::string Hgx8Config(const std::string& extra) {
  std::string text = "sysfs_root: \"" + Fixture("hgx8") + "\"\n" + extra;
  const char* gpus[][2] = {{"g0", "0000:03:00.0"}, {"g1", "0000:04:00.0"},
                           {"g2", "0000:23:00.0"}, {"g3", "0000:24:00.0"},
                           {"g4", "0000:83:00.0"}, {"g5", "0000:84:00.0"},
                           {"g6", "0000:a3:00.0"}, {"g7", "0000:a4:00.0"}};
  for (const auto& g : gpus) {
    text += std::string("gpus { id: \"") + g[0] + "\" pci_bus_id: \"" + g[1] + "\" }\n";
  }
  return text;
}

struct Resolved {
  std::vector<int> pool_nodes;
  session::CoreOptions core;
};

Resolved Resolve(const std::string& text) {
  auto c = ParseConfig(text);
  EXPECT_TRUE(c.ok()) << c.status();
  EXPECT_TRUE(ValidateConfig(*c).ok()) << ValidateConfig(*c);
  auto topo = ResolveTopology(*c, ConfiguredGpuAddresses(*c));
  EXPECT_TRUE(topo.ok()) << topo.status();
  return {PoolNumaNodes(*c, *topo, [](int) { return true; }), ToCoreOptions(*c, *topo)};
}

// A host with one NUMA node, node 0 (sysfs holding only devices/system/node/online), and a
// configured link: the link and its GPU are on node 0, as the pool's pages are, not unknown.
TEST(NumaPlacementConfigTest, OnASingleNodeHostLinksAndGpusAreOnIt) {
  char tmpl[] = "/tmp/ofd-numa-single-XXXXXX";
  ASSERT_NE(mkdtemp(tmpl), nullptr);
  const std::filesystem::path node_dir = std::filesystem::path(tmpl) / "devices/system/node";
  std::filesystem::create_directories(node_dir);
  std::ofstream(node_dir / "online") << "0\n";
  const std::string text = std::string("sysfs_root: \"") + tmpl + "\"\n" +
                           "links { name: \"sw0\" gpus: \"a\" d2h_bytes_per_second: 1e9 }\n"
                           "numa_node_bytes_per_second: 4e9\n";
  const Resolved one = Resolve(text);
  ASSERT_EQ(one.core.links.size(), 1u);
  EXPECT_EQ(one.core.links[0].numa_node, 0);
  EXPECT_EQ(one.core.gpu_numa_nodes.at("a"), 0);
  ASSERT_EQ(one.core.host_links.size(), 1u);  // the node's memory bounds the link
  EXPECT_EQ(one.core.host_links[0].name, "numa0");
  EXPECT_TRUE(one.pool_nodes.empty());  // one node: nothing to slice
  // Two nodes online: a link without a node stays unknown.
  std::ofstream(node_dir / "online") << "0-1\n";
  const Resolved two = Resolve(text);
  ASSERT_EQ(two.core.links.size(), 1u);
  EXPECT_EQ(two.core.links[0].numa_node, -1);
  EXPECT_TRUE(two.core.host_links.empty());
  std::filesystem::remove_all(tmpl);
}

absl::StatusOr<store::BlockRef> ReserveNow(store::BlockStore& s, uint64_t session,
                                           uint64_t bytes) {
  absl::StatusOr<store::BlockRef> out = absl::UnknownError("not called");
  s.Reserve(session, bytes, [&](absl::StatusOr<store::BlockRef> r) { out = std::move(r); });
  return out;
}

std::string Scrape(const store::StoreStats& s) {
  session::CoreStats stats;
  stats.store = s;
  return prometheus::TextSerializer().Serialize(
      session::StateFamilies(stats, session::PoolFacts{}));
}

TEST(NumaPlacementConfigTest, AutoSlicesPerGpuNodeOnlyWithTwoOrMoreNodes) {
  const Resolved two = Resolve(Hgx8Config(""));  // default: auto
  EXPECT_EQ(two.pool_nodes, (std::vector<int>{0, 1}));
  EXPECT_EQ(two.core.gpu_numa_nodes.at("g0"), 0);
  EXPECT_EQ(two.core.gpu_numa_nodes.at("g5"), 1);
  EXPECT_EQ(two.core.gpu_numa_nodes.size(), 8u);
  EXPECT_TRUE(Resolve(Hgx8Config("numa_placement: \"off\"\n")).pool_nodes.empty());
  // One GPU, one node: nothing to place between.
  EXPECT_TRUE(Resolve("sysfs_root: \"" + Fixture("single") +
                      "\"\ngpus { id: \"GPU-0\" pci_bus_id: \"0000:01:00.0\" }\n")
                  .pool_nodes.empty());
  // Only one of the GPUs' nodes may hold this process's memory (cpuset, memoryless node): one
  // slice would place nothing, so the pool stays unsliced; the other node is reported.
  auto c = ParseConfig(Hgx8Config(""));
  ASSERT_TRUE(c.ok()) << c.status();
  auto topo = ResolveTopology(*c, ConfiguredGpuAddresses(*c));
  ASSERT_TRUE(topo.ok()) << topo.status();
  std::vector<int> unusable;
  EXPECT_TRUE(PoolNumaNodes(*c, *topo, [](int node) { return node == 0; }, &unusable).empty());
  EXPECT_EQ(unusable, (std::vector<int>{1}));
  // No gpus listed (shm backend): no nodes known.
  EXPECT_TRUE(Resolve("").pool_nodes.empty());
}

TEST(NumaPlacementConfigTest, UnknownValueIsRefusedWithTheChoices) {
  auto c = ParseConfig("numa_placement: \"on\"\n");
  ASSERT_TRUE(c.ok()) << c.status();
  const absl::Status st = ValidateConfig(*c);
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("numa_placement must be \"auto\" or \"off\""), std::string::npos)
      << st;
  EXPECT_NE(st.message().find("(got \"on\")"), std::string::npos) << st;
  v1::DaemonConfig flagged = *ParseConfig("");
  ASSERT_TRUE(ApplyFlag("numa-placement", "off", &flagged).ok());
  EXPECT_EQ(flagged.numa_placement(), "off");
  EXPECT_TRUE(ValidateConfig(flagged).ok());
}

TEST(NumaPlacementStoreTest, AGpusBlocksLandInItsNodesSliceAndFallBackCounted) {
  const Resolved r = Resolve(Hgx8Config(""));
  const std::vector<pool::ArenaSlice> slices = pool::ArenaSlices(16 * kMiB, r.pool_nodes);
  ASSERT_EQ(slices.size(), 2u);
  ASSERT_EQ(slices[1].offset_bytes, 8 * kMiB);
  store::BlockStoreOptions options;
  options.admission_deadline_seconds = 0;
  store::BlockStore s(slices, options);
  s.SetSessionNumaNode(1, r.core.gpu_numa_nodes.at("g5"));  // node 1
  s.SetSessionNumaNode(2, r.core.gpu_numa_nodes.at("g0"));  // node 0

  auto on1 = ReserveNow(s, 1, kMiB);
  ASSERT_TRUE(on1.ok()) << on1.status();
  EXPECT_GE(on1->extent.offset, 8 * kMiB);
  auto on0 = ReserveNow(s, 2, kMiB);
  ASSERT_TRUE(on0.ok()) << on0.status();
  EXPECT_LT(on0->extent.offset, 8 * kMiB);
  // g5 fills node 1's slice; its next block goes to node 0, counted as slice_full.
  ASSERT_TRUE(ReserveNow(s, 1, 7 * kMiB).ok());
  auto spilled_over = ReserveNow(s, 1, kMiB);
  ASSERT_TRUE(spilled_over.ok()) << spilled_over.status();
  EXPECT_LT(spilled_over->extent.offset, 8 * kMiB);
  // A session whose GPU's node is unknown.
  ASSERT_TRUE(ReserveNow(s, 3, kMiB).ok());
  // Larger than a slice (though not than the pool): can never fit.
  EXPECT_EQ(ReserveNow(s, 2, 9 * kMiB).status().code(), absl::StatusCode::kOutOfRange);

  const store::StoreStats st = s.stats();
  EXPECT_EQ(st.placement.local, 3u);
  EXPECT_EQ(st.placement.slice_full, 1u);
  EXPECT_EQ(st.placement.unknown_node, 1u);
  EXPECT_EQ(st.placement.no_slice, 0u);
  ASSERT_EQ(st.numa_slices.size(), 2u);
  EXPECT_EQ(st.numa_slices[0].numa_node, 0);
  EXPECT_EQ(st.numa_slices[0].used_bytes, 3 * kMiB);
  EXPECT_EQ(st.numa_slices[1].used_bytes, 8 * kMiB);

  const std::string scrape = Scrape(st);
  EXPECT_NE(scrape.find("offloadd_pool_numa_fallback_total{reason=\"slice_full\"} 1\n"),
            std::string::npos)
      << scrape;
  EXPECT_NE(scrape.find("offloadd_pool_numa_fallback_total{reason=\"unknown_node\"} 1\n"),
            std::string::npos);
  EXPECT_NE(scrape.find("offloadd_pool_numa_fallback_total{reason=\"no_slice\"} 0\n"),
            std::string::npos);
  EXPECT_NE(scrape.find("offloadd_pool_numa_slice_used_bytes{numa_node=\"1\"} 8388608\n"),
            std::string::npos);
  EXPECT_NE(scrape.find("offloadd_pool_numa_slice_capacity_bytes{numa_node=\"0\"} 8388608\n"),
            std::string::npos);

  // Freed space in node 1's slice takes g5's blocks again.
  s.OffloadFinished(on1->block_id, absl::OkStatus());
  ASSERT_TRUE(s.Release(1, on1->block_id).ok());
  auto back = ReserveNow(s, 1, kMiB);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_GE(back->extent.offset, 8 * kMiB);
  EXPECT_EQ(s.stats().placement.local, 4u);
}

}  // namespace
}  // namespace offloadd
