// The arena's NUMA slices: their layout, the node list's checks, and the binding as the kernel
// reports it in /proc/self/numa_maps. This machine has one node (0), so the binding is checked
// for that node; the layout and the checks cover several.
#include <sys/mman.h>
#include <unistd.h>

#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "gtest/gtest.h"
#include "server/pool/arena.h"

namespace offloadd::pool {
namespace {

constexpr uint64_t kMiB = 1 << 20;

// The numa_maps line of the mapping starting at `addr` ("" when none does).
std::string NumaMapsLine(const void* addr) {
  std::ifstream in("/proc/self/numa_maps");
  const std::string start = absl::StrFormat("%x ", reinterpret_cast<uintptr_t>(addr));
  std::string line;
  while (std::getline(in, line)) {
    if (absl::StartsWith(line, start)) return line;
  }
  return "";
}

TEST(ArenaSlicesTest, EqualTwoMiBPartsAndTheLastTakesTheRest) {
  const std::vector<ArenaSlice> s = ArenaSlices(9 * kMiB, {1, 0});
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].numa_node, 1);
  EXPECT_EQ(s[0].offset_bytes, 0u);
  EXPECT_EQ(s[0].size_bytes, 4 * kMiB);
  EXPECT_EQ(s[1].numa_node, 0);
  EXPECT_EQ(s[1].offset_bytes, 4 * kMiB);
  EXPECT_EQ(s[1].size_bytes, 5 * kMiB);
  const std::vector<ArenaSlice> three = ArenaSlices(3 * kMiB, {0, 1, 2});  // 1 MiB parts: 4 KiB
  ASSERT_EQ(three.size(), 3u);
  EXPECT_EQ(three[1].offset_bytes, kMiB);
  EXPECT_EQ(three[2].size_bytes, kMiB);
  const std::vector<ArenaSlice> none = ArenaSlices(5 * kMiB, {});
  ASSERT_EQ(none.size(), 1u);
  EXPECT_EQ(none[0].numa_node, -1);
  EXPECT_EQ(none[0].size_bytes, 5 * kMiB);
}

TEST(CheckNumaNodesTest, AnAbsentNodeOrANodeTwiceIsInvalid) {
  EXPECT_TRUE(CheckNumaNodes({}).ok());
  EXPECT_TRUE(CheckNumaNodes({0}).ok());
  absl::Status absent = CheckNumaNodes({0, 63});
  EXPECT_EQ(absent.code(), absl::StatusCode::kInvalidArgument) << absent;
  EXPECT_TRUE(absl::StrContains(absent.message(), "NUMA node 63 is not a node")) << absent;
  EXPECT_TRUE(absl::StrContains(absent.message(), "nodes it may: 0")) << absent;
  absl::Status twice = CheckNumaNodes({0, 0});
  EXPECT_EQ(twice.code(), absl::StatusCode::kInvalidArgument) << twice;
  EXPECT_TRUE(absl::StrContains(twice.message(), "listed twice")) << twice;
  ArenaOptions o;
  o.size_bytes = 4 * kMiB;
  o.numa_nodes = {7};
  EXPECT_EQ(Arena::Create(o).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST(ArenaNumaTest, ASliceIsBoundToItsNodeAndItsPagesLieThere) {
  ArenaOptions o;
  o.size_bytes = 8 * kMiB;
  o.numa_nodes = {0};
  auto a = Arena::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ((*a)->slices().size(), 1u);
  EXPECT_EQ((*a)->slices()[0].numa_node, 0);
  EXPECT_EQ((*a)->slices()[0].size_bytes, 8 * kMiB);
  const std::string line = NumaMapsLine((*a)->base());
  const uint64_t pages = 8 * kMiB / static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  EXPECT_TRUE(absl::StrContains(line, " bind:0 ")) << line;
  EXPECT_TRUE(absl::StrContains(line, absl::StrCat(" N0=", pages, " "))) << line;
  EXPECT_EQ((*a)->numa_node(), 0);
}

TEST(ArenaNumaTest, WithoutNodesTheArenaKeepsTheDefaultPolicy) {
  ArenaOptions o;
  o.size_bytes = 4 * kMiB;
  auto a = Arena::Create(o);
  ASSERT_TRUE(a.ok()) << a.status();
  ASSERT_EQ((*a)->slices().size(), 1u);
  EXPECT_EQ((*a)->slices()[0].numa_node, -1);
  const std::string line = NumaMapsLine((*a)->base());
  EXPECT_TRUE(absl::StrContains(line, " default ")) << line;
}

TEST(ArenaNumaTest, ASharedPoolIsBoundAndAdoptedAgainWithItsBytes) {
  const std::string name = absl::StrCat("offloadd-arena-numa-test-", getpid());
  ArenaOptions o;
  o.size_bytes = 4 * kMiB;
  o.shm_name = name;
  o.numa_nodes = {0};
  {
    auto a = Arena::Create(o);
    ASSERT_TRUE(a.ok()) << a.status();
    const std::string line = NumaMapsLine((*a)->base());
    EXPECT_TRUE(absl::StrContains(line, " bind:0 ")) << line;
    EXPECT_TRUE(absl::StrContains(line, " N0=")) << line;
    (*a)->base()[3 * kMiB] = 0x5a;
  }
  auto b = Arena::Create(o);
  ASSERT_TRUE(b.ok()) << b.status();
  EXPECT_TRUE((*b)->adopted());
  EXPECT_EQ((*b)->base()[3 * kMiB], 0x5a);
  EXPECT_TRUE(absl::StrContains(NumaMapsLine((*b)->base()), " bind:0 "));
  b->reset();
  shm_unlink(("/" + name).c_str());
}

}  // namespace
}  // namespace offloadd::pool
