#include "server/projector/blas_core.h"

#include <cstdint>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace offloadd::projector {
namespace {

struct CoreLevel {
  const char* core;
  IsaLevel level;
};

// OpenBLAS's x86-64 DYNAMIC_ARCH core names (driver/others/dynamic.c) and the ISA they need.
constexpr CoreLevel kCores[] = {
    {"Prescott", IsaLevel::kSse3},     {"Opteron_SSE3", IsaLevel::kSse3},
    {"Opteron", IsaLevel::kSse3},      {"Barcelona", IsaLevel::kSse3},
    {"Bobcat", IsaLevel::kSse3},       {"Core2", IsaLevel::kSsse3},
    {"Penryn", IsaLevel::kSsse3},      {"Dunnington", IsaLevel::kSsse3},
    {"Atom", IsaLevel::kSsse3},        {"Nehalem", IsaLevel::kSse42},
    {"Sandybridge", IsaLevel::kAvx},   {"Bulldozer", IsaLevel::kAvx},
    {"Piledriver", IsaLevel::kAvx},    {"Steamroller", IsaLevel::kAvx},
    {"Excavator", IsaLevel::kAvx},     {"Haswell", IsaLevel::kAvx2},
    {"Zen", IsaLevel::kAvx2},          {"SkylakeX", IsaLevel::kAvx512},
    {"Cooperlake", IsaLevel::kAvx512}, {"SapphireRapids", IsaLevel::kAvx512},
};

#if defined(__x86_64__)
uint64_t Xcr0() {
  uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}
#endif

}  // namespace

CpuIsa DecodeCpuid(uint32_t leaf1_ecx, uint32_t leaf7_ebx, uint64_t xcr0) {
  CpuIsa isa;
  isa.sse3 = leaf1_ecx & (1u << 0);
  isa.ssse3 = leaf1_ecx & (1u << 9);
  isa.sse4_2 = leaf1_ecx & (1u << 20);
  const bool osxsave = leaf1_ecx & (1u << 27);
  const bool ymm = osxsave && (xcr0 & 0x6) == 0x6;    // SSE and AVX state
  const bool zmm = osxsave && (xcr0 & 0xe6) == 0xe6;  // plus opmask, ZMM0-15 upper, ZMM16-31
  isa.avx = ymm && (leaf1_ecx & (1u << 28));
  isa.fma = ymm && (leaf1_ecx & (1u << 12));
  isa.avx2 = ymm && (leaf7_ebx & (1u << 5));
  isa.avx512f = zmm && (leaf7_ebx & (1u << 16));
  isa.avx512dq = zmm && (leaf7_ebx & (1u << 17));
  isa.avx512cd = zmm && (leaf7_ebx & (1u << 28));
  isa.avx512bw = zmm && (leaf7_ebx & (1u << 30));
  isa.avx512vl = zmm && (leaf7_ebx & (1u << 31));
  return isa;
}

CpuIsa ReadCpuIsa() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return {};
  const uint32_t leaf1_ecx = c;
  const uint64_t xcr0 = (c & bit_OSXSAVE) ? Xcr0() : 0;
  b = 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d)) b = 0;
  return DecodeCpuid(leaf1_ecx, b, xcr0);
#else
  return {};
#endif
}

IsaLevel IsaLevelOf(const CpuIsa& i) {
  if (!i.sse3) return IsaLevel::kNone;
  if (!i.ssse3) return IsaLevel::kSse3;
  if (!i.sse4_2) return IsaLevel::kSsse3;
  if (!i.avx) return IsaLevel::kSse42;
  if (!i.avx2 || !i.fma) return IsaLevel::kAvx;
  if (!(i.avx512f && i.avx512cd && i.avx512bw && i.avx512dq && i.avx512vl)) return IsaLevel::kAvx2;
  return IsaLevel::kAvx512;
}

absl::string_view IsaLevelName(IsaLevel level) {
  switch (level) {
    case IsaLevel::kSse3:
      return "sse3";
    case IsaLevel::kSsse3:
      return "ssse3";
    case IsaLevel::kSse42:
      return "sse4.2";
    case IsaLevel::kAvx:
      return "avx";
    case IsaLevel::kAvx2:
      return "avx2";
    case IsaLevel::kAvx512:
      return "avx512";
    case IsaLevel::kNone:
      break;
  }
  return "none";
}

std::optional<IsaLevel> CoreIsaLevel(absl::string_view core) {
  for (const CoreLevel& c : kCores) {
    if (absl::EqualsIgnoreCase(core, c.core)) return c.level;
  }
  return std::nullopt;
}

absl::string_view BestCoreFor(IsaLevel level) {
  switch (level) {
    case IsaLevel::kSse3:
      return "Prescott";
    case IsaLevel::kSsse3:
      return "Core2";
    case IsaLevel::kSse42:
      return "Nehalem";
    case IsaLevel::kAvx:
      return "Sandybridge";
    case IsaLevel::kAvx2:
      return "Haswell";
    case IsaLevel::kAvx512:
      return "SkylakeX";
    case IsaLevel::kNone:
      break;
  }
  return "";
}

double PeakFlopsPerCycle(IsaLevel level) {
  switch (level) {
    case IsaLevel::kAvx512:
      return 64;
    case IsaLevel::kAvx2:
      return 32;
    case IsaLevel::kAvx:
      return 16;
    case IsaLevel::kNone:
      return 0;
    default:
      return 8;
  }
}

namespace {

// Notes on an operator's pin: unknown to this table, needing an ISA the CPU lacks, or below it.
void NotePinned(IsaLevel isa, const std::string& pinned, BlasCoreChoice& out) {
  const std::optional<IsaLevel> level = CoreIsaLevel(pinned);
  const std::string best(BestCoreFor(isa));
  if (!level.has_value()) {
    out.notes.push_back(
        absl::StrCat("OPENBLAS_CORETYPE=", pinned,
                     " is set (respected) but is not a core offloadd knows; "
                     "OpenBLAS ignores names it does not know and picks its own kernels"));
  } else if (*level > isa) {
    out.notes.push_back(absl::StrCat("OPENBLAS_CORETYPE=", pinned, " is set (respected) but needs ",
                                     IsaLevelName(*level), ", which this CPU (", IsaLevelName(isa),
                                     ") lacks: refreshes may die of an illegal "
                                     "instruction; unset it or set OPENBLAS_CORETYPE=",
                                     best));
  } else if (*level < isa) {
    out.notes.push_back(absl::StrCat("OPENBLAS_CORETYPE=", pinned,
                                     " is set (respected) but this CPU runs ", IsaLevelName(isa),
                                     " (", best,
                                     " kernels): GaLore refreshes run slower than they could; "
                                     "unset OPENBLAS_CORETYPE to let offloadd choose"));
  }
}

}  // namespace

BlasCoreChoice ChooseBlasCore(IsaLevel isa, const OpenBlasProbe& probe,
                              const std::optional<std::string>& pinned) {
  BlasCoreChoice out;
  out.isa = isa;
  out.openblas_core = probe.core;
  if (pinned.has_value() && !pinned->empty()) {
    out.core = *pinned;
    out.source = "operator";
    NotePinned(isa, *pinned, out);
    return out;
  }
  out.core = probe.core;
  out.source = "auto";
  if (probe.core.empty()) {
    out.notes.push_back(absl::StrCat("could not ask OpenBLAS which kernels it picks (", probe.error,
                                     "); its own choice is kept"));
    return out;
  }
  const std::optional<IsaLevel> level = CoreIsaLevel(probe.core);
  if (!level.has_value() || *level >= isa) return out;
  if (!probe.dynamic_arch) {
    out.notes.push_back(absl::StrCat("OpenBLAS was built for ", probe.core,
                                     " only (not DYNAMIC_ARCH) while this CPU runs ",
                                     IsaLevelName(isa),
                                     ": GaLore refreshes run slower than they could; install a "
                                     "DYNAMIC_ARCH OpenBLAS (Debian's libopenblas0-pthread)"));
    return out;
  }
  out.core = std::string(BestCoreFor(isa));
  out.source = "selected";
  out.notes.push_back(absl::StrCat("OpenBLAS picks ", probe.core, " kernels (",
                                   IsaLevelName(*level), ") on this ", IsaLevelName(isa),
                                   " CPU; offloadd selects ", out.core,
                                   " (set OPENBLAS_CORETYPE to pin another)"));
  return out;
}

}  // namespace offloadd::projector
