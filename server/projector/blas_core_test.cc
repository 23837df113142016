// The OpenBLAS kernel choice on fake CPUs and cores (the pure ChooseBlasCore / IsaLevelOf), the
// real mechanism (OPENBLAS_CORETYPE set after start, before the lazy load, is obeyed; the probe
// does not load OpenBLAS here), and refresh results across every core this CPU supports.
//
// Children: tests that need a fresh process (OpenBLAS reads OPENBLAS_CORETYPE once, when it is
// loaded) run this binary again with --gtest_filter=BlasCoreChild.* and the variables they need
// in the child's environment only; the test process's own OPENBLAS_* variables are left as they
// are (an operator-style pin in the caller's environment is overridden per child, not globally).
#include "server/projector/blas_core.h"

#include <dlfcn.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "server/projector/blas.h"
#include "server/projector/lapack_backend.h"
#include "server/projector/subspace_metrics.h"

extern char** environ;

namespace offloadd::projector {
namespace {

OpenBlasProbe Dynamic(const std::string& core) { return {core, true, ""}; }

CpuIsa AllOf(IsaLevel level) {
  CpuIsa i;
  i.sse3 = level >= IsaLevel::kSse3;
  i.ssse3 = level >= IsaLevel::kSsse3;
  i.sse4_2 = level >= IsaLevel::kSse42;
  i.avx = level >= IsaLevel::kAvx;
  i.avx2 = i.fma = level >= IsaLevel::kAvx2;
  i.avx512f = i.avx512cd = i.avx512bw = i.avx512dq = i.avx512vl = level >= IsaLevel::kAvx512;
  return i;
}

TEST(BlasCoreTest, PrescottOnAnAvx512CpuSelectsSkylakeX) {
  // The masked "Intel(R) Xeon(R) Processor" VM: AVX-512 CPU, OpenBLAS 0.3.21 picks Prescott.
  BlasCoreChoice c =
      ChooseBlasCore(IsaLevelOf(AllOf(IsaLevel::kAvx512)), Dynamic("Prescott"), std::nullopt);
  EXPECT_EQ(c.core, "SkylakeX");
  EXPECT_EQ(c.source, "selected");
  EXPECT_EQ(c.openblas_core, "Prescott");
  ASSERT_EQ(c.notes.size(), 1u);
  EXPECT_NE(c.notes[0].find("OpenBLAS picks Prescott"), std::string::npos) << c.notes[0];
}

// The registers of a masked AVX-512 VM ("Intel(R) Xeon(R) Processor"): leaf 1 ECX, leaf 7 EBX,
// XCR0.
constexpr uint32_t kVmLeaf1Ecx = 0xfffa3203;
constexpr uint32_t kVmLeaf7Ebx = 0xf1bf2ffb;
constexpr uint64_t kVmXcr0 = 0x600e7;

TEST(BlasCoreTest, FakeCpuidOfTheMaskedVmWithPrescottSelectsSkylakeX) {
  const CpuIsa isa = DecodeCpuid(kVmLeaf1Ecx, kVmLeaf7Ebx, kVmXcr0);
  ASSERT_EQ(IsaLevelOf(isa), IsaLevel::kAvx512);
  BlasCoreChoice c = ChooseBlasCore(IsaLevelOf(isa), Dynamic("Prescott"), std::nullopt);
  EXPECT_EQ(c.core, "SkylakeX");
  EXPECT_EQ(c.source, "selected");
}

TEST(BlasCoreTest, FakeCpuidWithoutOsSupportForZmmIsAvx2) {
  // The CPU has AVX-512 but the OS does not save ZMM/opmask state (XCR0 bits 5-7 clear).
  const CpuIsa isa = DecodeCpuid(kVmLeaf1Ecx, kVmLeaf7Ebx, kVmXcr0 & ~uint64_t{0xe0});
  EXPECT_FALSE(isa.avx512f);
  EXPECT_EQ(IsaLevelOf(isa), IsaLevel::kAvx2);
  EXPECT_EQ(ChooseBlasCore(IsaLevelOf(isa), Dynamic("Prescott"), std::nullopt).core, "Haswell");
  // No OSXSAVE: no AVX at all, whatever XCR0 says.
  EXPECT_EQ(IsaLevelOf(DecodeCpuid(kVmLeaf1Ecx & ~(1u << 27), kVmLeaf7Ebx, kVmXcr0)),
            IsaLevel::kSse42);
}

TEST(BlasCoreTest, PrescottOnAnAvx2CpuSelectsHaswellNeverSkylakeX) {
  CpuIsa isa = AllOf(IsaLevel::kAvx512);
  isa.avx512bw = false;  // AVX-512F without BW: SkylakeX kernels would fault
  ASSERT_EQ(IsaLevelOf(isa), IsaLevel::kAvx2);
  BlasCoreChoice c = ChooseBlasCore(IsaLevelOf(isa), Dynamic("Prescott"), std::nullopt);
  EXPECT_EQ(c.core, "Haswell");
  EXPECT_EQ(c.source, "selected");
}

TEST(BlasCoreTest, IsaLevelNeedsEveryFeatureOfTheLevel) {
  EXPECT_EQ(IsaLevelOf(CpuIsa{}), IsaLevel::kNone);
  for (IsaLevel l : {IsaLevel::kSse3, IsaLevel::kSsse3, IsaLevel::kSse42, IsaLevel::kAvx,
                     IsaLevel::kAvx2, IsaLevel::kAvx512}) {
    EXPECT_EQ(IsaLevelOf(AllOf(l)), l) << IsaLevelName(l);
  }
  CpuIsa no_fma = AllOf(IsaLevel::kAvx2);
  no_fma.fma = false;
  EXPECT_EQ(IsaLevelOf(no_fma), IsaLevel::kAvx);
}

TEST(BlasCoreTest, NeverSelectsACoreTheCpuLacksAndNeverDowngrades) {
  const char* cores[] = {"Prescott", "Core2",    "Nehalem",    "Sandybridge",   "Haswell",
                         "Zen",      "SkylakeX", "Cooperlake", "SapphireRapids"};
  for (int l = 1; l <= 6; ++l) {
    const IsaLevel isa = static_cast<IsaLevel>(l);
    for (const char* core : cores) {
      BlasCoreChoice c = ChooseBlasCore(isa, Dynamic(core), std::nullopt);
      const IsaLevel picked = *CoreIsaLevel(core);
      SCOPED_TRACE(std::string(core) + " on " + std::string(IsaLevelName(isa)));
      ASSERT_TRUE(CoreIsaLevel(c.core).has_value());
      if (picked < isa) {
        EXPECT_EQ(c.source, "selected");
        EXPECT_EQ(*CoreIsaLevel(c.core), isa);
      } else {  // OpenBLAS's own pick is kept, even one above what we read (it knows more)
        EXPECT_EQ(c.source, "auto");
        EXPECT_EQ(c.core, core);
      }
    }
  }
}

TEST(BlasCoreTest, AnOperatorPinIsRespectedAndNotedWhenItDiffers) {
  const IsaLevel avx512 = IsaLevel::kAvx512;
  BlasCoreChoice lower = ChooseBlasCore(avx512, Dynamic("Prescott"), std::string("Haswell"));
  EXPECT_EQ(lower.core, "Haswell");
  EXPECT_EQ(lower.source, "operator");
  ASSERT_EQ(lower.notes.size(), 1u);
  EXPECT_NE(lower.notes[0].find("slower"), std::string::npos) << lower.notes[0];

  BlasCoreChoice higher =
      ChooseBlasCore(IsaLevel::kAvx2, Dynamic("Haswell"), std::string("SkylakeX"));
  EXPECT_EQ(higher.core, "SkylakeX");
  EXPECT_EQ(higher.source, "operator");
  ASSERT_EQ(higher.notes.size(), 1u);
  EXPECT_NE(higher.notes[0].find("lacks"), std::string::npos) << higher.notes[0];

  BlasCoreChoice same = ChooseBlasCore(avx512, Dynamic("Prescott"), std::string("skylakex"));
  EXPECT_EQ(same.source, "operator");
  EXPECT_TRUE(same.notes.empty());
}

TEST(BlasCoreTest, ASingleCoreBuildOrAFailedProbeIsLeftAlone) {
  BlasCoreChoice fixed = ChooseBlasCore(IsaLevel::kAvx512, {"Prescott", false, ""}, std::nullopt);
  EXPECT_EQ(fixed.core, "Prescott");
  EXPECT_EQ(fixed.source, "auto");
  EXPECT_EQ(fixed.notes.size(), 1u);
  BlasCoreChoice failed =
      ChooseBlasCore(IsaLevel::kAvx512, {"", false, "loading failed"}, std::nullopt);
  EXPECT_EQ(failed.core, "");
  EXPECT_EQ(failed.source, "auto");
  EXPECT_EQ(failed.notes.size(), 1u);
  BlasCoreChoice unknown = ChooseBlasCore(IsaLevel::kAvx512, Dynamic("Zen9"), std::nullopt);
  EXPECT_EQ(unknown.core, "Zen9");
  EXPECT_EQ(unknown.source, "auto");
}

// Runs this binary's BlasCoreChild.`test` with `env` added to (or replacing in) the child's
// environment; returns its exit status (0 = the child's assertions passed).
int RunChild(const std::string& test, const std::vector<std::string>& env) {
  // Bazel's files belong to this process: a child must not write or delete them.
  const std::vector<std::string> parents_only = {"TEST_PREMATURE_EXIT_FILE", "XML_OUTPUT_FILE",
                                                 "GTEST_OUTPUT", "TEST_SHARD_STATUS_FILE"};
  std::vector<std::string> vars = env;
  auto name = [](const std::string& kv) { return kv.substr(0, kv.find('=')); };
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    bool skip = std::find(parents_only.begin(), parents_only.end(), name(kv)) != parents_only.end();
    for (const std::string& v : env) skip |= name(kv) == name(v);
    if (!skip) vars.push_back(kv);
  }
  vars.push_back("OFFLOADD_BLAS_CORE_CHILD=1");
  std::vector<char*> envp;
  for (std::string& v : vars) envp.push_back(v.data());
  envp.push_back(nullptr);
  std::string filter = "--gtest_filter=BlasCoreChild." + test;
  char exe[] = "/proc/self/exe";
  char* argv[] = {exe, filter.data(), nullptr};
  pid_t pid = 0;
  if (posix_spawn(&pid, exe, nullptr, nullptr, argv, envp.data()) != 0) return -1;
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

bool InChild() { return std::getenv("OFFLOADD_BLAS_CORE_CHILD") != nullptr; }

// The daemon's mechanism: OPENBLAS_CORETYPE set by this process after it started but before the
// first BLAS call (blas.h loads OpenBLAS lazily) decides the kernels.
TEST(BlasCoreChild, CoreTypeSetBeforeTheLazyLoadIsObeyed) {
  if (!InChild()) GTEST_SKIP() << "run by BlasCoreTest.SetenvBeforeTheLazyLoadIsObeyed";
  const char* want = std::getenv("OFFLOADD_TEST_SET_CORETYPE");
  ASSERT_NE(want, nullptr);
  setenv("OPENBLAS_CORETYPE", want, 1);
  EXPECT_STREQ(openblas_get_corename(), want);
}

TEST(BlasCoreTest, SetenvBeforeTheLazyLoadIsObeyed) {
  const IsaLevel isa = IsaLevelOf(ReadCpuIsa());
  if (isa < IsaLevel::kSse3) GTEST_SKIP() << "not an x86-64 CPU";
  for (int l = 1; l <= static_cast<int>(isa); ++l) {
    const std::string core(BestCoreFor(static_cast<IsaLevel>(l)));
    EXPECT_EQ(RunChild("CoreTypeSetBeforeTheLazyLoadIsObeyed",
                       {"OFFLOADD_TEST_SET_CORETYPE=" + core, "OPENBLAS_CORETYPE=Bogus"}),
              0)
        << core;
  }
}

TEST(BlasCoreChild, ProbeLeavesOpenBlasUnloaded) {
  if (!InChild()) GTEST_SKIP() << "run by BlasCoreTest.ProbeReportsTheAutoCoreWithoutLoading";
  OpenBlasProbe probe = ProbeOpenBlas();
  EXPECT_EQ(probe.error, "");
  // Debian's OpenBLAS (DYNAMIC_ARCH) picks a core from the table, never the pin (Prescott here).
  ASSERT_TRUE(CoreIsaLevel(probe.core).has_value()) << probe.core;
  EXPECT_TRUE(probe.dynamic_arch);
  // The probe reports OpenBLAS's own pick, not the pin (an AVX machine would pick it anyway).
  if (IsaLevelOf(ReadCpuIsa()) != IsaLevel::kAvx) {
    EXPECT_NE(probe.core, "Sandybridge");
  }
  EXPECT_EQ(dlopen("libopenblas.so.0", RTLD_NOW | RTLD_NOLOAD), nullptr);
  EXPECT_STREQ(std::getenv("OPENBLAS_CORETYPE"), "Sandybridge");  // the pin is untouched here
}

TEST(BlasCoreTest, ProbeReportsTheAutoCoreWithoutLoading) {
  EXPECT_EQ(RunChild("ProbeLeavesOpenBlasUnloaded", {"OPENBLAS_CORETYPE=Sandybridge"}), 0);
}

// A gradient with a known decaying spectrum, built without BLAS: rows of a fixed pseudo-random
// pattern times column weights 1/(1 + j/8), plus a rank-8 spike. Deterministic.
std::vector<float> Gradient(int64_t m, int64_t n) {
  std::vector<float> g(m * n);
  uint64_t x = 0x9e3779b97f4a7c15ULL;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < n; ++j) {
      x = x * 6364136223846793005ULL + 1442695040888963407ULL;
      const float noise = static_cast<float>((x >> 40) & 0xffff) / 65536.0f - 0.5f;
      const float spike = (i % 8 == j % 8) ? 4.0f / (1 + i % 8) : 0.0f;
      g[i * n + j] = noise / (1.0f + j / 8.0f) + spike;
    }
  }
  return g;
}

struct RefreshCase {
  int64_t m, n, k;
  VectorSide side;
};
constexpr RefreshCase kRefreshCases[] = {{384, 256, 32, VectorSide::kLeft},
                                         {256, 512, 16, VectorSide::kRight}};

// Writes, per case, the exact refresh's singular vectors then its singular values (raw floats).
TEST(BlasCoreChild, WriteExactRefreshes) {
  if (!InChild()) GTEST_SKIP() << "run by BlasCoreTest.RefreshesAgreeAcrossTheCpusCores";
  const char* out_path = std::getenv("OFFLOADD_TEST_REFRESH_OUT");
  ASSERT_NE(out_path, nullptr);
  ASSERT_STREQ(openblas_get_corename(), std::getenv("OPENBLAS_CORETYPE"));
  std::ofstream out(out_path, std::ios::binary);
  LapackSvdBackend lapack;
  for (const RefreshCase& c : kRefreshCases) {
    std::vector<float> g = Gradient(c.m, c.n);
    absl::StatusOr<TopSingular> t = lapack.Exact({g.data(), c.m, c.n}, c.side, c.k);
    ASSERT_TRUE(t.ok()) << t.status();
    out.write(reinterpret_cast<const char*>(t->vectors.data()), t->vectors.size() * 4);
    out.write(reinterpret_cast<const char*>(t->singular_values.data()),
              t->singular_values.size() * 4);
  }
}

std::vector<float> ReadFloats(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::vector<float> v(bytes.size() / 4);
  std::memcpy(v.data(), bytes.data(), v.size() * 4);
  return v;
}

// Every core this CPU supports (BestCoreFor each level up to its own) against the highest: the
// tolerance documented in blas_core.h (subspace sine, singular values relative).
TEST(BlasCoreTest, RefreshesAgreeAcrossTheCpusCores) {
  const IsaLevel isa = IsaLevelOf(ReadCpuIsa());
  if (isa < IsaLevel::kSse3) GTEST_SKIP() << "not an x86-64 CPU";
  const std::string dir = ::testing::TempDir();
  std::vector<std::vector<float>> results;
  std::vector<std::string> cores;
  for (int l = static_cast<int>(isa); l >= 1; --l) {
    cores.emplace_back(BestCoreFor(static_cast<IsaLevel>(l)));
    const std::string path = dir + "/refresh_" + cores.back();
    ASSERT_EQ(RunChild("WriteExactRefreshes",
                       {"OPENBLAS_CORETYPE=" + cores.back(), "OFFLOADD_TEST_REFRESH_OUT=" + path}),
              0)
        << cores.back();
    results.push_back(ReadFloats(path));
  }
  for (size_t r = 1; r < results.size(); ++r) {
    SCOPED_TRACE(cores[r] + " vs " + cores[0]);
    ASSERT_EQ(results[r].size(), results[0].size());
    const float* a = results[0].data();
    const float* b = results[r].data();
    for (const RefreshCase& c : kRefreshCases) {
      const int64_t dim = c.side == VectorSide::kLeft ? c.m : c.n;
      const double sine = MaxPrincipalAngleSine(a, b, dim, c.k);
      EXPECT_LE(sine, kCoreSubspaceSineTolerance);
      a += dim * c.k;
      b += dim * c.k;
      double worst = 0;
      for (int64_t i = 0; i < std::min(c.m, c.n); ++i) {
        worst = std::max(worst, std::fabs(static_cast<double>(a[i]) - b[i]) / a[0]);
        EXPECT_LE(std::fabs(a[i] - b[i]), kCoreSingularValueTolerance * a[0]) << i;
      }
      std::printf("%s vs %s, %lldx%lld k=%lld: subspace sine %.2e, singular values %.2e\n",
                  cores[r].c_str(), cores[0].c_str(), static_cast<long long>(c.m),
                  static_cast<long long>(c.n), static_cast<long long>(c.k), sine, worst);
      a += std::min(c.m, c.n);
      b += std::min(c.m, c.n);
    }
    std::printf("%s vs %s: %s\n", cores[r].c_str(), cores[0].c_str(),
                std::memcmp(results[r].data(), results[0].data(), results[0].size() * 4) == 0
                    ? "bitwise equal"
                    : "within tolerance, not bitwise equal");
  }
}

}  // namespace
}  // namespace offloadd::projector
