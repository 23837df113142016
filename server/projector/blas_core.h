// Which OpenBLAS kernels ("core") the projector's LAPACK refreshes run on, chosen at start-up.
//
// OpenBLAS built with DYNAMIC_ARCH (Debian's libopenblas0) picks its kernels once, when the
// library is loaded, from the CPU's family and model; an `OPENBLAS_CORETYPE` environment variable
// read at that moment overrides it. A CPU model it does not know (cloud VMs often mask the model)
// gets its oldest x86-64 kernels, Prescott (SSE3), even on a CPU with AVX-512: refreshes then run
// at about half speed. The daemon loads OpenBLAS lazily (blas.h), so main() can, before any thread
// starts:
//   1. read the ISA the CPU and OS support (cpuid, xgetbv): ReadCpuIsa, IsaLevelOf;
//   2. ask OpenBLAS which core it would pick, in a forked child so this process does not load it
//      yet: ProbeOpenBlas;
//   3. where that core needs less than the CPU runs, set OPENBLAS_CORETYPE to the best core the
//      CPU supports (BestCoreFor) — never one needing an ISA the CPU lacks — unless the operator
//      already set OPENBLAS_CORETYPE, which is respected: ChooseBlasCore, SelectBlasCoreAtStart.
// After the projector is created, CheckBlasCoreAtStart loads OpenBLAS, confirms the core it runs,
// logs the choice, exports it (metric offloadd_projector_blas_info, GetStats `projector_blas`,
// `offloadctl stats`) and times a small SGEMM against the rate the CPU's ISA should reach,
// warning when the host runs far below it. `offloadd --check-config` prints BlasCoreNotes.
//
// Thread safety: SelectBlasCoreAtStart calls setenv and fork, so it must run before any thread
// starts; the other functions may run from any thread (BlasCoreInUse after CheckBlasCoreAtStart).
#ifndef OFFLOADD_SERVER_PROJECTOR_BLAS_CORE_H_
#define OFFLOADD_SERVER_PROJECTOR_BLAS_CORE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"

namespace offloadd::projector {

// x86-64 ISA levels, in the order OpenBLAS's kernel families need them. Each level implies the
// ones below it. kNone: not x86-64, or an ISA this table does not rank.
enum class IsaLevel {
  kNone = 0,
  kSse3 = 1,    // Prescott, Opteron_SSE3, Barcelona, Bobcat
  kSsse3 = 2,   // Core2, Penryn, Dunnington, Atom
  kSse42 = 3,   // Nehalem
  kAvx = 4,     // Sandybridge, Bulldozer, Piledriver, Steamroller, Excavator
  kAvx2 = 5,    // Haswell, Zen (AVX2 + FMA)
  kAvx512 = 6,  // SkylakeX, Cooperlake, SapphireRapids (AVX-512 F, CD, BW, DQ, VL)
};

// CPU features that matter to the kernel choice, each true only when the OS also saves the
// registers it needs (XCR0: YMM for AVX, opmask/ZMM for AVX-512).
struct CpuIsa {
  bool sse3 = false, ssse3 = false, sse4_2 = false;
  bool avx = false, avx2 = false, fma = false;
  bool avx512f = false, avx512cd = false, avx512bw = false, avx512dq = false, avx512vl = false;
};

// The features in cpuid leaf 1's ECX, leaf 7 (subleaf 0)'s EBX and XCR0 (xgetbv 0; 0 when
// leaf 1 has no OSXSAVE). Pure: tests pass a fake CPU's registers.
CpuIsa DecodeCpuid(uint32_t leaf1_ecx, uint32_t leaf7_ebx, uint64_t xcr0);

// This CPU's features (DecodeCpuid of its own registers). All false off x86-64.
CpuIsa ReadCpuIsa();

// The highest level all of whose features `isa` has.
IsaLevel IsaLevelOf(const CpuIsa& isa);

// "sse3", "ssse3", "sse4.2", "avx", "avx2", "avx512"; "none" for kNone.
absl::string_view IsaLevelName(IsaLevel level);

// The ISA level an OpenBLAS core name (as openblas_get_corename() spells it, case-insensitive)
// needs; nullopt for a name this table does not know (its kernels are then left alone).
std::optional<IsaLevel> CoreIsaLevel(absl::string_view core);

// The OpenBLAS core whose kernels use the most of `level` ("SkylakeX", "Haswell", "Sandybridge",
// "Nehalem", "Core2", "Prescott"); "" for kNone.
absl::string_view BestCoreFor(IsaLevel level);

// What a forked child that loaded OpenBLAS without OPENBLAS_CORETYPE reported.
struct OpenBlasProbe {
  std::string core;           // openblas_get_corename(), e.g. "Prescott"; "" when not loaded
  bool dynamic_arch = false;  // openblas_get_config() names DYNAMIC_ARCH (OPENBLAS_CORETYPE works)
  std::string error;          // why `core` is empty
};

// Loads libopenblas.so.0 in a forked child (OPENBLAS_CORETYPE unset, one thread) and reads its
// core; this process does not load it. Waits at most `timeout_seconds`. Call before threads start.
OpenBlasProbe ProbeOpenBlas(double timeout_seconds = 5.0);

// The kernel choice, for logs, metrics, GetStats and --check-config.
struct BlasCoreChoice {
  IsaLevel isa = IsaLevel::kNone;
  std::string openblas_core;  // what OpenBLAS picks by itself ("" when the probe failed)
  std::string core;           // what the projector should run ("" when unknown)
  // "auto": OpenBLAS's own pick is kept; "selected": the daemon set OPENBLAS_CORETYPE = core;
  // "operator": OPENBLAS_CORETYPE was set before start and is respected.
  std::string source;
  std::vector<std::string> notes;  // mismatches worth an operator's attention, one per line
};

// Pure: the choice for a CPU at `isa` whose OpenBLAS picks `probe`, with OPENBLAS_CORETYPE set to
// `pinned` by the operator (nullopt: not set). Selects BestCoreFor(isa) only when the probe's
// core is known, needs a lower level than `isa`, and the library is DYNAMIC_ARCH.
BlasCoreChoice ChooseBlasCore(IsaLevel isa, const OpenBlasProbe& probe,
                              const std::optional<std::string>& pinned);

// main(), before any thread starts and before OpenBLAS is loaded: probes, chooses, and for
// source "selected" sets OPENBLAS_CORETYPE in this process's environment. With `apply` false
// (--check-config) nothing is set. Returns the choice (pass it to CheckBlasCoreAtStart).
BlasCoreChoice SelectBlasCoreAtStart(bool apply);

// --check-config: prints each of `choice.notes` as "offloadd: note: projector BLAS: ..." on stdout.
void PrintBlasCoreNotes(const BlasCoreChoice& choice);

// The start-up self-check's result.
struct BlasSelfCheck {
  double gflops = 0;           // best measured single-thread SGEMM rate
  double expected_gflops = 0;  // the ISA's per-cycle peak x the clock (cpuinfo MHz, else 2 GHz)
  double seconds = 0;          // the check's wall time (bounded well under a second)
  bool slow = false;           // gflops < kSlowFraction x expected_gflops
};
// Measured on an AVX-512 VM (2.6 GHz nominal, 166 GFLOP/s expected): SkylakeX kernels 192 GFLOP/s,
// Prescott kernels 45 (27%): the case this check exists for.
inline constexpr double kSlowFraction = 0.4;

// What the daemon runs, once CheckBlasCoreAtStart ran.
struct BlasCoreReport {
  BlasCoreChoice choice;
  std::string loaded_core;  // openblas_get_corename() in this process
  BlasSelfCheck self_check;
};

// After the projector is created, before serving: loads OpenBLAS (blas.h), reads the core it
// runs, times a square SGEMM single-threaded (openblas threads restored after), logs the choice
// (a warning when the loaded core differs from the choice or the check is slow), sets the info
// gauge and keeps the report for BlasCoreInUse.
const BlasCoreReport& CheckBlasCoreAtStart(const BlasCoreChoice& choice);

// The report of CheckBlasCoreAtStart; nullptr before it ran (no projector).
const BlasCoreReport* BlasCoreInUse();

// Exact refreshes of one gradient computed on two OpenBLAS cores the CPU supports agree within
// these (blas_core_test checks every core up to the CPU's): the sine of the largest principal
// angle between the two top-k subspaces, and each singular value's difference relative to the
// largest. Different cores sum in different orders, so results are not bitwise equal in general
// (measured on an AVX-512 CPU, Prescott..Haswell vs SkylakeX: sine <= 7.2e-5 at k = 32 of a
// 384x256 gradient, singular values <= 3e-7).
inline constexpr double kCoreSubspaceSineTolerance = 1e-3;
inline constexpr double kCoreSingularValueTolerance = 1e-5;

// Peak single-precision flops per cycle and core of one core at `level` (8 SSE, 16 AVX, 32 AVX2
// with FMA, 64 AVX-512 with two FMA units).
double PeakFlopsPerCycle(IsaLevel level);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_BLAS_CORE_H_
