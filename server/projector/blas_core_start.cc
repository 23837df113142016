// Start-up side of blas_core.h: the forked probe, OPENBLAS_CORETYPE, the SGEMM self-check.
#include <dlfcn.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/strip.h"
#include "glog/logging.h"
#include "server/metrics/metrics.h"
#include "server/projector/blas.h"
#include "server/projector/blas_core.h"

namespace offloadd::projector {
namespace {

// In the forked child: load OpenBLAS as the daemon would without a pin, write
// "<core>\n<config>" to `fd`, exit. Never returns.
[[noreturn]] void ProbeChild(int fd) {
  unsetenv("OPENBLAS_CORETYPE");
  setenv("OPENBLAS_NUM_THREADS", "1", 1);  // no thread pool in the child
  void* h = dlopen("libopenblas.so.0", RTLD_NOW | RTLD_LOCAL);
  if (h == nullptr) _exit(3);
  using Fn = char* (*)();
  auto corename = reinterpret_cast<Fn>(dlsym(h, "openblas_get_corename"));
  auto config = reinterpret_cast<Fn>(dlsym(h, "openblas_get_config"));
  if (corename == nullptr || config == nullptr) _exit(4);
  const std::string out = absl::StrCat(corename(), "\n", config());
  ssize_t n = write(fd, out.data(), out.size());
  _exit(n == static_cast<ssize_t>(out.size()) ? 0 : 5);
}

// Reads `fd` until EOF or the deadline; false on timeout.
bool ReadAll(int fd, double timeout_seconds, std::string* out) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_seconds);
  char buf[512];
  while (true) {
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return false;
    pollfd p{fd, POLLIN, 0};
    if (poll(&p, 1, static_cast<int>(left.count())) <= 0) continue;
    ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) return true;
    out->append(buf, n);
  }
}

std::optional<std::string> PinnedCore() {
  const char* pinned = std::getenv("OPENBLAS_CORETYPE");
  if (pinned == nullptr) return std::nullopt;
  return std::string(pinned);
}

BlasCoreReport*& Report() {
  static BlasCoreReport* report = nullptr;
  return report;
}

}  // namespace

OpenBlasProbe ProbeOpenBlas(double timeout_seconds) {
  OpenBlasProbe probe;
  int fds[2];
  if (pipe(fds) != 0) {
    probe.error = absl::StrCat("pipe: ", strerror(errno));
    return probe;
  }
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    ProbeChild(fds[1]);
  }
  close(fds[1]);
  std::string out;
  const bool done = pid > 0 && ReadAll(fds[0], timeout_seconds, &out);
  close(fds[0]);
  if (pid < 0) {
    probe.error = absl::StrCat("fork: ", strerror(errno));
    return probe;
  }
  if (!done) kill(pid, SIGKILL);
  int status = 0;
  waitpid(pid, &status, 0);
  if (!done || !WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    probe.error = !done ? absl::StrCat("no answer within ", timeout_seconds, " s")
                        : absl::StrCat("loading libopenblas.so.0 failed (status ", status, ")");
    return probe;
  }
  const size_t nl = out.find('\n');
  probe.core = out.substr(0, nl);
  probe.dynamic_arch = nl != std::string::npos && absl::StrContains(out.substr(nl), "DYNAMIC_ARCH");
  return probe;
}

BlasCoreChoice SelectBlasCoreAtStart(bool apply) {
  const IsaLevel isa = IsaLevelOf(ReadCpuIsa());
  BlasCoreChoice choice = ChooseBlasCore(isa, ProbeOpenBlas(), PinnedCore());
  if (apply && choice.source == "selected") {
    setenv("OPENBLAS_CORETYPE", choice.core.c_str(), 1);
  }
  return choice;
}

namespace {

// The first "cpu MHz" of /proc/cpuinfo (the nominal clock on most VMs); 2000 when unreadable.
double CpuMhz() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line)) {
    if (!absl::StartsWith(line, "cpu MHz")) continue;
    double mhz = 0;
    const size_t colon = line.find(':');
    if (colon != std::string::npos &&
        absl::SimpleAtod(absl::StripAsciiWhitespace(line.substr(colon + 1)), &mhz) && mhz > 0) {
      return mhz;
    }
  }
  return 2000;
}

// A square single-thread SGEMM (n = 320, 65.5 MFLOP) repeated until 0.1 s passed or 30 runs,
// after one warm-up; the best run's rate. At 1 GFLOP/s it still ends within about 0.3 s.
BlasSelfCheck TimeSgemm(IsaLevel isa) {
  constexpr int n = 320;
  std::vector<float> a(n * n), b(n * n), c(n * n);
  for (int64_t i = 0; i < n * n; ++i) {  // 64-bit: i * 104729 passes 2^31
    a[i] = static_cast<float>((i * 7919) % 1000) / 1000.0f - 0.5f;
    b[i] = static_cast<float>((i * 104729) % 1000) / 1000.0f - 0.5f;
  }
  const int threads = openblas_get_num_threads();
  openblas_set_num_threads(1);
  const auto start = std::chrono::steady_clock::now();
  double best = 1e30;
  for (int rep = 0; rep <= 30; ++rep) {
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    const auto t1 = std::chrono::steady_clock::now();
    if (rep > 0) best = std::min(best, std::chrono::duration<double>(t1 - t0).count());
    if (rep > 0 && t1 - start > std::chrono::milliseconds(100)) break;
  }
  openblas_set_num_threads(threads);
  BlasSelfCheck check;
  check.gflops = 2.0 * n * n * n / best / 1e9;
  check.expected_gflops = PeakFlopsPerCycle(isa) * CpuMhz() / 1e3;
  check.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  check.slow = check.expected_gflops > 0 && check.gflops < kSlowFraction * check.expected_gflops;
  return check;
}

void LogReport(const BlasCoreReport& r) {
  const BlasCoreChoice& c = r.choice;
  LOG(INFO) << "projector BLAS: OpenBLAS core " << r.loaded_core << " (" << c.source
            << "; OpenBLAS alone picks " << (c.openblas_core.empty() ? "?" : c.openblas_core)
            << ", CPU ISA " << IsaLevelName(c.isa) << "); self-check SGEMM "
            << absl::StrFormat("%.1f GFLOP/s single-thread, expected about %.0f, in %.2f s",
                               r.self_check.gflops, r.self_check.expected_gflops,
                               r.self_check.seconds);
  for (const std::string& note : c.notes) LOG(INFO) << "projector BLAS: " << note;
  if (!c.core.empty() && !absl::EqualsIgnoreCase(c.core, r.loaded_core)) {
    LOG(WARNING) << "projector BLAS: expected OpenBLAS core " << c.core << " but it runs "
                 << r.loaded_core << " (OPENBLAS_CORETYPE has no effect on this OpenBLAS build)";
  }
  if (r.self_check.slow) {
    LOG(WARNING) << absl::StrFormat(
        "projector BLAS: the refresh path runs far below this CPU's rate (SGEMM %.1f GFLOP/s, "
        "under %.0f%% of the %.0f GFLOP/s a %s core should reach): GaLore refreshes will be "
        "slow. A busy or throttled host, or kernels older than the CPU (core %s; see "
        "offloadctl stats), are the usual causes",
        r.self_check.gflops, 100 * kSlowFraction, r.self_check.expected_gflops, IsaLevelName(c.isa),
        r.loaded_core);
  }
}

}  // namespace

const BlasCoreReport& CheckBlasCoreAtStart(const BlasCoreChoice& choice) {
  auto* report = new BlasCoreReport;
  report->choice = choice;
  const char* loaded = openblas_get_corename();  // loads OpenBLAS (blas.h)
  report->loaded_core = loaded != nullptr ? loaded : "";
  report->self_check = TimeSgemm(choice.isa);
  LogReport(*report);
  metrics::Get()
      .projector_blas_info
      ->Add({{"isa", std::string(IsaLevelName(choice.isa))},
             {"core", report->loaded_core},
             {"openblas_core", choice.openblas_core},
             {"source", choice.source}})
      .Set(1);
  Report() = report;
  return *report;
}

const BlasCoreReport* BlasCoreInUse() { return Report(); }

void PrintBlasCoreNotes(const BlasCoreChoice& choice) {
  for (const std::string& note : choice.notes) {
    std::printf("offloadd: note: projector BLAS: %s\n", note.c_str());
  }
  std::fflush(stdout);
}

}  // namespace offloadd::projector
