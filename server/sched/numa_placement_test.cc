// NUMA placement from sysfs fixtures: the GPUs' nodes found by topology
// discovery give the pool's slices (GpuNumaNodes, ArenaSlices), and each GPU's offloads land in
// its node's slice (SlicedExtentAllocator), falling back with a counted reason.
#include <cstdlib>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/pool/arena.h"
#include "server/pool/sliced_allocator.h"
#include "server/sched/topology.h"

namespace offloadd::sched {
namespace {

using pool::PlacementOutcome;
constexpr uint64_t kMiB = 1 << 20;

std::string Fixture(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  if (srcdir == nullptr || workspace == nullptr) return "/nonexistent";
  return std::string(srcdir) + "/" + workspace + "/tests/fixtures/sysfs/" + name;
}

// hgx8: g0..g3 behind root ports on node 0, g4..g7 on node 1.
const std::vector<GpuPci> kHgx8 = {
    {"g0", "0000:03:00.0"}, {"g1", "0000:04:00.0"}, {"g2", "0000:23:00.0"},
    {"g3", "0000:24:00.0"}, {"g4", "0000:83:00.0"}, {"g5", "0000:84:00.0"},
    {"g6", "0000:a3:00.0"}, {"g7", "0000:a4:00.0"},
};

TEST(NumaPlacementTest, EachGpusOffloadsLandInItsNodesSlice) {
  auto t = DiscoverTopology(Fixture("hgx8"), kHgx8);
  ASSERT_TRUE(t.ok()) << t.status();
  const std::vector<int> nodes = GpuNumaNodes(*t);
  ASSERT_EQ(nodes, (std::vector<int>{0, 1}));
  pool::SlicedExtentAllocator a(pool::ArenaSlices(16 * kMiB, nodes));
  for (const TopologyGpu& g : t->gpus) {
    auto p = a.Allocate(64 * 1024, g.numa_node);
    ASSERT_TRUE(p.ok()) << p.status();
    EXPECT_EQ(p->outcome, PlacementOutcome::kLocal) << g.gpu;
    EXPECT_EQ(p->numa_node, g.numa_node) << g.gpu;
    EXPECT_EQ(a.NodeOfOffset(p->extent.offset), g.numa_node) << g.gpu;
  }
  EXPECT_EQ(a.placement_counts().local, 8u);
  EXPECT_EQ(a.slice_stats(0).used_bytes, 4 * 64 * 1024u);
  EXPECT_EQ(a.slice_stats(1).used_bytes, 4 * 64 * 1024u);
}

TEST(NumaPlacementTest, WhenANodesSliceIsFullItsGpusFallBackAndReloadsReadWhereTheBlockIs) {
  auto t = DiscoverTopology(Fixture("hgx8"), kHgx8);
  ASSERT_TRUE(t.ok()) << t.status();
  pool::SlicedExtentAllocator a(pool::ArenaSlices(16 * kMiB, GpuNumaNodes(*t)));
  const int node_g5 = t->FindGpu("g5")->numa_node;
  ASSERT_EQ(node_g5, 1);
  // g4 fills node 1's 8 MiB slice.
  ASSERT_TRUE(a.Allocate(8 * kMiB, t->FindGpu("g4")->numa_node).ok());
  auto p = a.Allocate(kMiB, node_g5);
  ASSERT_TRUE(p.ok()) << p.status();
  EXPECT_EQ(p->outcome, PlacementOutcome::kSliceFull);
  EXPECT_EQ(p->numa_node, 0);
  EXPECT_EQ(a.NodeOfOffset(p->extent.offset), 0);  // a reload of it reads from node 0
  EXPECT_EQ(a.placement_counts().slice_full, 1u);
}

TEST(NumaPlacementTest, AGpuWhoseNodeSysfsDoesNotKnowIsUnknownNotNodeZero) {
  // single: the GPU and its root port say numa_node -1.
  auto single = DiscoverTopology(Fixture("single"), {{"GPU-0", "0000:01:00.0"}});
  ASSERT_TRUE(single.ok()) << single.status();
  EXPECT_EQ(single->gpus[0].numa_node, -1);
  EXPECT_TRUE(GpuNumaNodes(*single).empty());
  EXPECT_EQ(FormatTopology(*single).find("numa node 0"), std::string::npos);
  // Alone: an unbound pool. Beside sliced nodes: a counted fallback, never node 0's "local".
  pool::SlicedExtentAllocator unbound(pool::ArenaSlices(4 * kMiB, GpuNumaNodes(*single)));
  EXPECT_EQ(unbound.Allocate(4096, -1)->outcome, PlacementOutcome::kUnbound);
  pool::SlicedExtentAllocator sliced(pool::ArenaSlices(4 * kMiB, {0, 1}));
  auto p = sliced.Allocate(4096, single->gpus[0].numa_node);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->outcome, PlacementOutcome::kUnknownNode);
  EXPECT_EQ(sliced.placement_counts().unknown_node, 1u);
  EXPECT_EQ(sliced.placement_counts().local, 0u);
}

}  // namespace
}  // namespace offloadd::sched
