#include "server/sched/topology.h"

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "gtest/gtest.h"

namespace offloadd::sched {
namespace {

using Strings = std::vector<std::string>;

// tests/fixtures/sysfs/<name> in the runfiles (see tests/fixtures/sysfs/BUILD).
std::string Fixture(const std::string& name) {
  const char* srcdir = std::getenv("TEST_SRCDIR");
  const char* workspace = std::getenv("TEST_WORKSPACE");
  EXPECT_NE(srcdir, nullptr) << "run under bazel test";
  EXPECT_NE(workspace, nullptr) << "run under bazel test";
  if (srcdir == nullptr || workspace == nullptr) return "/nonexistent";
  return std::string(srcdir) + "/" + workspace + "/tests/fixtures/sysfs/" + name;
}

Topology Discover(const std::string& fixture, const std::vector<GpuPci>& gpus) {
  absl::StatusOr<Topology> t = DiscoverTopology(Fixture(fixture), gpus);
  EXPECT_TRUE(t.ok()) << t.status();
  return t.ok() ? *t : Topology();
}

Strings LinkNames(const Topology& t) {
  Strings out;
  for (const TopologyLink& l : t.links) out.push_back(l.name);
  return out;
}

const std::vector<GpuPci> kHgx8 = {
    // Out of order and in nvidia-smi's spelling for some: discovery must not care.
    {"g4", "00000000:83:00.0"}, {"g0", "0000:03:00.0"}, {"g1", "0000:04:00.0"},
    {"g2", "0000:23:00.0"},     {"g3", "24:00.0"},      {"g5", "0000:84:00.0"},
    {"g6", "00000000:A3:00.0"}, {"g7", "0000:a4:00.0"},
};

TEST(NormalizeBdfTest, AcceptsCommonSpellings) {
  EXPECT_EQ(*NormalizeBdf("0000:18:00.0"), "0000:18:00.0");
  EXPECT_EQ(*NormalizeBdf("00000000:1A:00.0"), "0000:1a:00.0");
  EXPECT_EQ(*NormalizeBdf("1a:00.1"), "0000:1a:00.1");
  EXPECT_EQ(*NormalizeBdf("00010000:e1:00.0"), "10000:e1:00.0");  // VMD domain
  for (const char* bad : {"", "18:00", "0000:18:00.8", "zz:00.0", "0000:180:00.0", "a:b:c.d"}) {
    EXPECT_EQ(NormalizeBdf(bad).status().code(), absl::StatusCode::kInvalidArgument) << bad;
  }
}

TEST(DiscoverTopologyTest, SingleGpuOnRootPortWithoutNumaNode) {
  const Topology t = Discover("single", {{"GPU-0", "0000:01:00.0"}});
  ASSERT_EQ(t.links.size(), 1u);
  const TopologyLink& l = t.links[0];
  EXPECT_EQ(l.name, "rootport-0000:00:01.1");
  EXPECT_EQ(l.gpus, Strings{"GPU-0"});
  EXPECT_EQ(l.root_port, "0000:00:01.1");
  EXPECT_EQ(l.uplink_bdf, "0000:00:01.1");
  EXPECT_EQ(l.numa_node, -1);
  EXPECT_NEAR(l.pcie_bytes_per_second, 16e9 * 16 * 128 / 130 / 8, 1);
  EXPECT_EQ(l.d2h_bytes_per_second, 0);
  EXPECT_FALSE(l.from_config);
  ASSERT_EQ(t.gpus.size(), 1u);
  EXPECT_EQ(t.gpus[0].bridges, Strings{"0000:00:01.1"});
  EXPECT_EQ(t.gpus[0].link, "rootport-0000:00:01.1");
}

// A sysfs tree holding only devices/system/node/online with `online` (none when empty).
std::string NodeOnlineRoot(const std::string& online) {
  char tmpl[] = "/tmp/ofd-numa-online-XXXXXX";
  EXPECT_NE(mkdtemp(tmpl), nullptr);
  const std::filesystem::path dir = std::filesystem::path(tmpl) / "devices/system/node";
  std::filesystem::create_directories(dir);
  if (!online.empty()) std::ofstream(dir / "online") << online << "\n";
  return tmpl;
}

TEST(DiscoverTopologyTest, OnASingleNodeHostGpusWithoutANodeAreOnThatNode) {
  const std::string one = NodeOnlineRoot("0"), two = NodeOnlineRoot("0-1"),
                    none = NodeOnlineRoot("");
  EXPECT_EQ(SingleOnlineNumaNode(one), 0);
  EXPECT_EQ(SingleOnlineNumaNode(two), -1);
  EXPECT_EQ(SingleOnlineNumaNode(none), -1);
  EXPECT_EQ(SingleOnlineNumaNode("/nonexistent"), -1);
  // The single fixture's GPU has no node in sysfs (-1), as the kernel leaves it on such a host.
  Topology t = Discover("single", {{"GPU-0", "0000:01:00.0"}});
  ASSERT_EQ(t.links.size(), 1u);
  AssumeSingleNumaNode(SingleOnlineNumaNode(two), &t);
  EXPECT_EQ(t.links[0].numa_node, -1);
  AssumeSingleNumaNode(SingleOnlineNumaNode(one), &t);
  EXPECT_EQ(t.links[0].numa_node, 0);
  EXPECT_EQ(t.gpus[0].numa_node, 0);
  EXPECT_EQ(FormatTopology(t).rfind("numa node 0\n", 0), 0u) << FormatTopology(t);
  // Known nodes stay as they are.
  Topology hgx = Discover("hgx8", {{"g4", "0000:83:00.0"}});
  AssumeSingleNumaNode(0, &hgx);
  EXPECT_EQ(hgx.gpus[0].numa_node, 1);
  for (const std::string& d : {one, two, none}) std::filesystem::remove_all(d);
}

TEST(DiscoverTopologyTest, Hgx8GroupsTwoGpusPerSwitchAcrossTwoNumaNodes) {
  const Topology t = Discover("hgx8", kHgx8);
  EXPECT_EQ(LinkNames(t), (Strings{"switch-0000:01:00.0", "switch-0000:21:00.0",
                                   "switch-0000:81:00.0", "switch-0000:a1:00.0"}));
  const Strings want_gpus[] = {{"g0", "g1"}, {"g2", "g3"}, {"g4", "g5"}, {"g6", "g7"}};
  const char* want_root[] = {"0000:00:01.0", "0000:20:01.0", "0000:80:01.0", "0000:a0:01.0"};
  const int want_numa[] = {0, 0, 1, 1};
  ASSERT_EQ(t.links.size(), 4u);
  for (int i = 0; i < 4; ++i) {
    const TopologyLink& l = t.links[i];
    EXPECT_EQ(l.gpus, want_gpus[i]) << l.name;
    EXPECT_EQ(l.root_port, want_root[i]) << l.name;
    EXPECT_EQ(l.numa_node, want_numa[i]) << l.name;
    EXPECT_EQ(l.uplink_bdf, l.name.substr(7)) << l.name;
    EXPECT_NEAR(l.pcie_bytes_per_second, 31.5e9, 0.05e9) << l.name;
  }
  // GPUs keep the order given, with normalized addresses and their bridge chain.
  ASSERT_EQ(t.gpus.size(), 8u);
  EXPECT_EQ(t.gpus[0].gpu, "g4");
  EXPECT_EQ(t.gpus[0].bdf, "0000:83:00.0");
  EXPECT_EQ(t.gpus[0].bridges, (Strings{"0000:80:01.0", "0000:81:00.0", "0000:82:00.0"}));
  EXPECT_EQ(t.FindGpu("g6")->bdf, "0000:a3:00.0");
  EXPECT_EQ(t.FindGpu("g6")->numa_node, 1);
  EXPECT_EQ(t.LinkOfGpu("g3")->name, "switch-0000:21:00.0");
}

TEST(DiscoverTopologyTest, Hgx8SubsetOnlyMakesLinksForListedGpus) {
  const Topology t = Discover("hgx8", {{"a", "0000:04:00.0"}, {"b", "0000:84:00.0"}});
  EXPECT_EQ(LinkNames(t), (Strings{"switch-0000:01:00.0", "switch-0000:81:00.0"}));
  EXPECT_EQ(t.links[0].gpus, Strings{"a"});
}

TEST(DiscoverTopologyTest, GpusDirectlyOnRootPortsGetALinkEach) {
  const Topology t = Discover("rootport4", {{"r0", "0000:01:00.0"},
                                            {"r1", "0000:02:00.0"},
                                            {"r2", "0000:81:00.0"},
                                            {"r3", "0000:82:00.0"}});
  EXPECT_EQ(LinkNames(t), (Strings{"rootport-0000:00:01.0", "rootport-0000:00:03.0",
                                   "rootport-0000:80:01.0", "rootport-0000:80:03.0"}));
  const int want_numa[] = {0, 0, 1, 1};
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(t.links[i].gpus, Strings{"r" + std::to_string(i)});
    EXPECT_EQ(t.links[i].root_port, t.links[i].name.substr(9));
    EXPECT_EQ(t.links[i].numa_node, want_numa[i]);
    EXPECT_NEAR(t.links[i].pcie_bytes_per_second, 63.0e9, 0.05e9);
  }
}

TEST(DiscoverTopologyTest, NestedSwitchesGroupByTheDeepestAndWalkUpForNuma) {
  const Topology t = Discover(
      "nested",
      {{"a", "0000:05:00.0"}, {"b", "0000:06:00.0"}, {"c", "0000:0a:00.0"}, {"d", "0000:0b:00.0"}});
  EXPECT_EQ(LinkNames(t), (Strings{"switch-0000:03:00.0", "switch-0000:08:00.0"}));
  EXPECT_EQ(t.links[0].gpus, (Strings{"a", "b"}));
  EXPECT_EQ(t.links[1].gpus, (Strings{"c", "d"}));
  EXPECT_EQ(t.links[0].root_port, "0000:00:01.0");
  EXPECT_EQ(t.links[1].root_port, "0000:00:01.0");
  EXPECT_EQ(t.links[0].numa_node, 0);  // the GPUs have no numa_node file
  EXPECT_EQ(t.FindGpu("c")->bridges, (Strings{"0000:00:01.0", "0000:01:00.0", "0000:02:08.0",
                                              "0000:08:00.0", "0000:09:00.0"}));
  EXPECT_EQ(FormatTopology(t),
            "numa node 0\n"
            "  link switch-0000:03:00.0  root port 0000:00:01.0  d2h -  h2d -  pcie 63.0 GB/s\n"
            "    gpu a  0000:05:00.0\n"
            "    gpu b  0000:06:00.0\n"
            "  link switch-0000:08:00.0  root port 0000:00:01.0  d2h -  h2d -  pcie 63.0 GB/s\n"
            "    gpu c  0000:0a:00.0\n"
            "    gpu d  0000:0b:00.0\n");
}

TEST(DiscoverTopologyTest, MissingDeviceIsNotFoundWithAHelpfulMessage) {
  absl::StatusOr<Topology> t =
      DiscoverTopology(Fixture("hgx8"), {{"g0", "0000:03:00.0"}, {"GPU-lost", "0000:99:00.0"}});
  ASSERT_EQ(t.status().code(), absl::StatusCode::kNotFound) << t.status();
  const std::string msg(t.status().message());
  EXPECT_NE(msg.find("GPU-lost"), std::string::npos) << msg;
  EXPECT_NE(msg.find("0000:99:00.0"), std::string::npos) << msg;
  EXPECT_NE(msg.find("bus/pci/devices"), std::string::npos) << msg;
  EXPECT_NE(msg.find("nvidia-smi"), std::string::npos) << msg;
  EXPECT_EQ(DiscoverTopology(Fixture("no-such-tree"), {}).status().code(),
            absl::StatusCode::kNotFound);
}

TEST(DiscoverTopologyTest, RejectsBadAndDuplicateInput) {
  EXPECT_EQ(DiscoverTopology(Fixture("hgx8"), {{"g0", "bogus"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscoverTopology(Fixture("hgx8"), {{"", "0000:03:00.0"}}).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscoverTopology(Fixture("hgx8"), {{"g0", "0000:03:00.0"}, {"g0", "0000:04:00.0"}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(DiscoverTopology(Fixture("hgx8"), {{"g0", "0000:03:00.0"}, {"g1", "00000000:03:00.0"}})
                .status()
                .code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LinkOverrideTest, SetsCapacitiesOfADiscoveredLink) {
  absl::StatusOr<Topology> t =
      ApplyLinkOverrides(Discover("hgx8", kHgx8), {{"switch-0000:21:00.0", {}, 25e9, 20e9}});
  ASSERT_TRUE(t.ok()) << t.status();
  const TopologyLink* l = t->FindLink("switch-0000:21:00.0");
  ASSERT_NE(l, nullptr);
  EXPECT_EQ(l->d2h_bytes_per_second, 25e9);
  EXPECT_EQ(l->h2d_bytes_per_second, 20e9);
  EXPECT_TRUE(l->from_config);
  EXPECT_EQ(l->gpus, (Strings{"g2", "g3"}));
  EXPECT_EQ(t->links.size(), 4u);
  EXPECT_FALSE(t->FindLink("switch-0000:01:00.0")->from_config);
}

TEST(LinkOverrideTest, CapacityForUnknownLinkIsNotFoundAndListsKnownLinks) {
  absl::StatusOr<Topology> t = ApplyLinkOverrides(Discover("hgx8", kHgx8), {{"sw9", {}, 1e9, 0}});
  ASSERT_EQ(t.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(t.status().message().find("switch-0000:a1:00.0"), std::string::npos);
}

TEST(LinkOverrideTest, RegroupsGpusIntoANamedLink) {
  absl::StatusOr<Topology> t =
      ApplyLinkOverrides(Discover("hgx8", kHgx8), {{"socket0", {"g0", "g1", "g2", "g3"}, 50e9, 0}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(LinkNames(*t), (Strings{"switch-0000:81:00.0", "switch-0000:a1:00.0", "socket0"}));
  const TopologyLink* l = t->FindLink("socket0");
  EXPECT_EQ(l->gpus, (Strings{"g0", "g1", "g2", "g3"}));
  EXPECT_EQ(l->numa_node, 0);
  EXPECT_EQ(l->root_port, "");  // two root ports: no common one
  EXPECT_EQ(l->uplink_bdf, "");
  EXPECT_EQ(l->d2h_bytes_per_second, 50e9);
  EXPECT_EQ(l->h2d_bytes_per_second, 0);
  EXPECT_EQ(t->LinkOfGpu("g2")->name, "socket0");
  EXPECT_EQ(t->LinkOfGpu("g4")->name, "switch-0000:81:00.0");
}

TEST(LinkOverrideTest, RenameKeepsUplinkAndSplitLeavesTheRest) {
  absl::StatusOr<Topology> t = ApplyLinkOverrides(
      Discover("hgx8", kHgx8), {{"sw0", {"g0", "g1"}, 0, 0}, {"solo", {"g3"}, 10e9, 10e9}});
  ASSERT_TRUE(t.ok()) << t.status();
  EXPECT_EQ(LinkNames(*t), (Strings{"switch-0000:21:00.0", "switch-0000:81:00.0",
                                    "switch-0000:a1:00.0", "sw0", "solo"}));
  const TopologyLink* sw0 = t->FindLink("sw0");
  EXPECT_EQ(sw0->uplink_bdf, "0000:01:00.0");
  EXPECT_EQ(sw0->root_port, "0000:00:01.0");
  EXPECT_NEAR(sw0->pcie_bytes_per_second, 31.5e9, 0.05e9);
  EXPECT_EQ(t->FindLink("switch-0000:21:00.0")->gpus, Strings{"g2"});
  EXPECT_EQ(t->FindLink("solo")->gpus, Strings{"g3"});
  EXPECT_EQ(t->FindLink("solo")->numa_node, 0);
}

TEST(LinkOverrideTest, ConfigAloneDescribesLinksForTheShmBackend) {
  absl::StatusOr<Topology> t =
      ApplyLinkOverrides(Topology(), {{"shm0", {"gpu0", "gpu1"}, 12e9, 11e9}});
  ASSERT_TRUE(t.ok()) << t.status();
  ASSERT_EQ(t->links.size(), 1u);
  EXPECT_EQ(t->links[0].gpus, (Strings{"gpu0", "gpu1"}));
  EXPECT_EQ(t->links[0].numa_node, -1);
  ASSERT_EQ(t->gpus.size(), 2u);
  EXPECT_EQ(t->gpus[1].link, "shm0");
  EXPECT_EQ(t->gpus[1].bdf, "");
  EXPECT_EQ(FormatTopology(*t),
            "numa node ?\n"
            "  link shm0  root port ?  d2h 12.0 GB/s  h2d 11.0 GB/s  pcie -  (config)\n"
            "    gpu gpu0  ?\n"
            "    gpu gpu1  ?\n");
}

TEST(LinkOverrideTest, RejectsConflictingOverrides) {
  const Topology hgx = Discover("hgx8", kHgx8);
  auto code = [&](const std::vector<LinkOverride>& o) {
    return ApplyLinkOverrides(hgx, o).status().code();
  };
  EXPECT_EQ(code({{"", {"g0"}, 0, 0}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", {"g0"}, 0, 0}, {"a", {"g1"}, 0, 0}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", {"g0"}, 0, 0}, {"b", {"g0"}, 0, 0}}), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(code({{"a", {"g0"}, -1, 0}}), absl::StatusCode::kInvalidArgument);
  // Reusing a discovered link's name while leaving one of its GPUs out.
  EXPECT_EQ(code({{"switch-0000:01:00.0", {"g0"}, 0, 0}}), absl::StatusCode::kInvalidArgument);
  // Listing all of them is fine.
  EXPECT_EQ(code({{"switch-0000:01:00.0", {"g1", "g0"}, 0, 0}}), absl::StatusCode::kOk);
}

}  // namespace
}  // namespace offloadd::sched
