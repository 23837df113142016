// projector_bench: cost and quality of GaLore projector refreshes on the CPU (LAPACK) backend.
//
// Part 1 (--part=shapes): for each shape (default 4096x4096 and 4096x11008) and rank (default 128
// and 512), the exact (sgesdd) and randomized (HMT range finder) refresh times and the residual
// ratio rho = ||G - P P^T G||_F / sqrt(sum_{i>r} sigma_i^2) against the exact spectrum, in the
// same run. The exact SVD does not depend on r: it runs once per shape at the largest rank and
// its time is reported for every rank; the rank-r exact projector is the first r columns.
//
// Part 2 (--part=batch): the refresh step of a LLaMA-7B: per layer four 4096x4096 (q, k, v, o),
// two 11008x4096 (gate, up) and one 4096x11008 (down) gradients; 32 layers = 224 matrices. Total
// time and time until the first result. Default: 1 layer, randomized, r = 128 (the full batch
// is --batch_layers=32; --batch_method=exact takes roughly an hour on 2 cores).
//
// Inputs are synthetic: G = U diag(s) V^T + noise with a geometric spectrum from 1 down to 0.02
// over min(768, min(m, n)/2) values and a noise bulk edge of ~0.01 (fixed seeds). The batch
// reuses one generated matrix per shape (refreshes do not cache anything between calls).
//
// Flags (all --name=value): --part=all|shapes|batch, --ranks=128,512, --shapes=4096x4096,...,
// --dim_divisor=N (divide every dim, for smoke runs), --exact=1|0, --oversampling=10,
// --power_iterations=2, --batch_layers=1, --batch_rank=128, --batch_method=randomized|exact,
// --batch_workers=1, --blas_threads=0 (0: hardware threads / workers), --measure_residual=1|0
// (batch only: skip the residual products a refresh reports by default), --dtype=fp32|bf16|fp16
// (input gradients; the projector comes back in the same dtype, rho is measured on it).
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_split.h"
#include "server/projector/lapack_backend.h"
#include "server/projector/projector.h"
#include "server/projector/subspace_metrics.h"
#include "server/projector/synthetic.h"

namespace offloadd::projector {
namespace {

using Clock = std::chrono::steady_clock;

struct Flags {
  std::string part = "all";
  std::vector<int64_t> ranks = {128, 512};
  std::vector<std::pair<int64_t, int64_t>> shapes = {{4096, 4096}, {4096, 11008}};
  int64_t dim_divisor = 1;
  bool exact = true;
  RandomizedOptions randomized;
  int batch_layers = 1;
  int64_t batch_rank = 128;
  std::string batch_method = "randomized";
  int batch_workers = 1;
  int blas_threads = 0;
  bool measure_residual = true;
  DType dtype = DType::kFloat32;
};

[[noreturn]] void Usage(const std::string& bad) {
  std::fprintf(stderr,
               "projector_bench: bad flag %s (see the header of bench/projector_bench.cc)\n",
               bad.c_str());
  std::exit(2);
}

int64_t ParseInt(const std::string& flag, absl::string_view value) {
  int64_t out;
  if (!absl::SimpleAtoi(value, &out)) Usage(flag);
  return out;
}

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    const size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) Usage(arg);
    const std::string name = arg.substr(2, eq - 2);
    const std::string value = arg.substr(eq + 1);
    if (name == "part") {
      f.part = value;
    } else if (name == "ranks") {
      f.ranks.clear();
      for (absl::string_view r : absl::StrSplit(value, ',')) f.ranks.push_back(ParseInt(arg, r));
    } else if (name == "shapes") {
      f.shapes.clear();
      for (absl::string_view s : absl::StrSplit(value, ',')) {
        std::vector<absl::string_view> mn = absl::StrSplit(s, 'x');
        if (mn.size() != 2) Usage(arg);
        f.shapes.push_back({ParseInt(arg, mn[0]), ParseInt(arg, mn[1])});
      }
    } else if (name == "dim_divisor") {
      f.dim_divisor = std::max<int64_t>(1, ParseInt(arg, value));
    } else if (name == "exact") {
      f.exact = ParseInt(arg, value) != 0;
    } else if (name == "oversampling") {
      f.randomized.oversampling = ParseInt(arg, value);
    } else if (name == "power_iterations") {
      f.randomized.power_iterations = static_cast<int>(ParseInt(arg, value));
    } else if (name == "batch_layers") {
      f.batch_layers = static_cast<int>(ParseInt(arg, value));
    } else if (name == "batch_rank") {
      f.batch_rank = ParseInt(arg, value);
    } else if (name == "batch_method") {
      if (value != "randomized" && value != "exact") Usage(arg);
      f.batch_method = value;
    } else if (name == "batch_workers") {
      f.batch_workers = std::max(1, static_cast<int>(ParseInt(arg, value)));
    } else if (name == "dtype") {
      if (value == "fp32") {
        f.dtype = DType::kFloat32;
      } else if (value == "bf16") {
        f.dtype = DType::kBFloat16;
      } else if (value == "fp16") {
        f.dtype = DType::kFloat16;
      } else {
        Usage(arg);
      }
    } else if (name == "measure_residual") {
      f.measure_residual = ParseInt(arg, value) != 0;
    } else if (name == "blas_threads") {
      f.blas_threads = static_cast<int>(ParseInt(arg, value));
    } else {
      Usage(arg);
    }
  }
  if (f.part != "all" && f.part != "shapes" && f.part != "batch") Usage("--part=" + f.part);
  return f;
}

// A gradient as the service receives it (bytes in `dtype`) and the fp32 values it stands for.
struct Gradient {
  int64_t m = 0, n = 0;
  DType dtype = DType::kFloat32;
  std::vector<float> values;  // exactly the values of `bytes`, widened to fp32
  std::vector<uint8_t> bytes;
  HostMatrix View() const { return {bytes.data(), bytes.size(), {m, n}, dtype}; }
};

Gradient Synthetic(int64_t m, int64_t n, DType dtype, uint64_t seed) {
  const int64_t k = std::min<int64_t>(768, std::min(m, n) / 2);
  const double ratio = std::pow(0.02, 1.0 / std::max<int64_t>(1, k - 1));
  const double noise = 0.01 / (std::sqrt(double(m)) + std::sqrt(double(n)));
  Gradient g{
      m, n, dtype, LowRankPlusNoise(m, n, GeometricSpectrum(k, 1.0, ratio), noise, seed), {}};
  g.bytes.resize(g.values.size() * ElementSizeBytes(dtype));
  ConvertFromFloat32(g.values.data(), g.values.size(), dtype, g.bytes.data());
  ConvertToFloat32(g.bytes.data(), dtype, g.values.size(), g.values.data());
  return g;
}

double Seconds(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

RefreshResult MustRefresh(const RefreshRequest& request, const SvdBackend& backend,
                          RefreshScratch* scratch = nullptr) {
  absl::StatusOr<RefreshResult> result = RefreshProjector(request, backend, scratch);
  if (!result.ok()) {
    std::fprintf(stderr, "refresh failed: %s\n", std::string(result.status().message()).c_str());
    std::exit(1);
  }
  return *std::move(result);
}

void RunShapes(const Flags& f, const SvdBackend& backend) {
  std::printf("\n== Part 1: exact vs randomized, one refresh each (p=%lld, q=%d) ==\n",
              static_cast<long long>(f.randomized.oversampling), f.randomized.power_iterations);
  std::printf("%-12s %5s | %8s %8s %8s | %8s %8s %8s %8s | %7s\n", "shape", "r", "exact_s", "svd_s",
              "rho", "rand_s", "svd_s", "rho", "rho_ub", "speedup");
  for (auto [m0, n0] : f.shapes) {
    const int64_t m = m0 / f.dim_divisor, n = n0 / f.dim_divisor;
    const Gradient g = Synthetic(m, n, f.dtype, 1000 + m + n);
    const DenseMatrix gv{g.values.data(), m, n};
    const int64_t r_max =
        std::min(*std::max_element(f.ranks.begin(), f.ranks.end()), std::min(m, n));
    RefreshResult exact;
    std::vector<float> p_exact;
    if (f.exact) {
      RefreshRequest request;
      request.gradient = g.View();
      request.rank = r_max;
      exact = MustRefresh(request, backend);
      p_exact.resize(exact.projector_rows * r_max);
      ConvertToFloat32(exact.projector_bytes.data(), exact.projector_dtype, p_exact.size(),
                       p_exact.data());
    }
    for (int64_t r0 : f.ranks) {
      const int64_t r = std::min(r0, std::min(m, n));
      double tail = 0.0, rho_exact = NAN;
      if (f.exact) {
        // tail(r) = sigma_{r+1..r_max}^2 + tail(r_max); the rank-r exact projector is the first
        // r columns of the rank-r_max one.
        tail = exact.tail_energy_lower;
        for (int64_t i = r; i < r_max; ++i)
          tail += exact.singular_values[i] * exact.singular_values[i];
        std::vector<float> p_r(exact.projector_rows * r);
        for (int64_t j = 0; j < exact.projector_rows; ++j) {
          std::copy_n(&p_exact[j * r_max], r, &p_r[j * r]);
        }
        rho_exact = ResidualRatio(gv, p_r.data(), r, exact.vector_side, tail);
      }
      RefreshRequest request;
      request.gradient = g.View();
      request.rank = r;
      request.method = SvdMethod::kRandomized;
      request.randomized = f.randomized;
      const RefreshResult approx = MustRefresh(request, backend);
      double rho_approx = NAN;
      if (f.exact) {
        std::vector<float> p(approx.projector_rows * r);
        ConvertToFloat32(approx.projector_bytes.data(), approx.projector_dtype, p.size(), p.data());
        rho_approx = ResidualRatio(gv, p.data(), r, approx.vector_side, tail);
      }
      std::printf("%5lldx%-6lld %5lld | %8.2f %8.2f %8.4f | %8.2f %8.2f %8.4f %8.3g | %7.1f\n",
                  static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(r),
                  f.exact ? exact.elapsed_seconds : NAN, f.exact ? exact.svd_seconds : NAN,
                  rho_exact, approx.elapsed_seconds, approx.svd_seconds, rho_approx,
                  approx.residual_ratio_upper_bound,
                  f.exact ? exact.svd_seconds / approx.svd_seconds : NAN);
      std::fflush(stdout);
    }
  }
  std::printf(
      "*_s: whole refresh (conversion, SVD, metrics incl. residual); svd_s: backend only; "
      "the exact run is one sgesdd per shape at the largest rank, shared by its ranks.\n"
      "rho: vs the exact spectrum; rho_ub: the bound a randomized refresh reports about "
      "itself; speedup: exact svd_s / randomized svd_s.\n");
}

void RunBatch(const Flags& f, const SvdBackend& backend) {
  const int64_t d = f.dim_divisor;
  const Gradient square = Synthetic(4096 / d, 4096 / d, f.dtype, 1);
  const Gradient up = Synthetic(11008 / d, 4096 / d, f.dtype, 2);
  const Gradient down = Synthetic(4096 / d, 11008 / d, f.dtype, 3);
  std::vector<const Gradient*> jobs;
  for (int layer = 0; layer < f.batch_layers; ++layer) {
    for (const Gradient* g : {&square, &square, &square, &square, &up, &up, &down}) {
      jobs.push_back(g);
    }
  }
  const bool randomized = f.batch_method == "randomized";
  std::printf(
      "\n== Part 2: LLaMA-7B refresh batch: %d layer(s) = %zu matrices, %s, r=%lld, "
      "%d worker(s) ==\n",
      f.batch_layers, jobs.size(), f.batch_method.c_str(), static_cast<long long>(f.batch_rank),
      f.batch_workers);
  std::vector<double> done_at(jobs.size()), svd_s(jobs.size());
  std::atomic<size_t> next{0};
  const Clock::time_point start = Clock::now();
  auto worker = [&] {
    RefreshScratch scratch;  // one per worker thread: reused fp32 buffer for converted inputs
    for (size_t i = next++; i < jobs.size(); i = next++) {
      RefreshRequest request;
      request.gradient = jobs[i]->View();
      request.rank = f.batch_rank;
      request.method = randomized ? SvdMethod::kRandomized : SvdMethod::kExact;
      request.randomized = f.randomized;
      request.measure_residual = f.measure_residual;
      const RefreshResult result = MustRefresh(request, backend, &scratch);
      svd_s[i] = result.svd_seconds;
      done_at[i] = Seconds(start);
    }
  };
  std::vector<std::thread> threads;
  for (int w = 0; w < f.batch_workers; ++w) threads.emplace_back(worker);
  for (std::thread& t : threads) t.join();
  const double total = Seconds(start);
  const double first = *std::min_element(done_at.begin(), done_at.end());
  double per_shape[3] = {0, 0, 0};
  int count[3] = {0, 0, 0};
  for (size_t i = 0; i < jobs.size(); ++i) {
    const int kind = jobs[i] == &square ? 0 : (jobs[i] == &up ? 1 : 2);
    per_shape[kind] += svd_s[i];
    ++count[kind];
  }
  double svd_total = 0.0;
  for (double s : svd_s) svd_total += s;
  std::printf(
      "total %.2f s (of which SVD %.2f s), first result after %.2f s, %.2f matrices/s, "
      "residual %s\n",
      total, svd_total, first, jobs.size() / total, f.measure_residual ? "measured" : "skipped");
  const char* names[3] = {"4096x4096", "11008x4096", "4096x11008"};
  for (int k = 0; k < 3; ++k) {
    std::printf("  %-10s (/%lld) mean SVD %.2f s over %d\n", names[k], static_cast<long long>(d),
                per_shape[k] / std::max(1, count[k]), count[k]);
  }
  if (f.batch_layers != 32 && d == 1) {
    std::printf("  extrapolated to 224 matrices (32 layers): %.0f s\n",
                total * 32.0 / f.batch_layers);
  }
}

}  // namespace
}  // namespace offloadd::projector

int main(int argc, char** argv) {
  using namespace offloadd::projector;
  const Flags f = ParseFlags(argc, argv);
  std::printf(
      "projector_bench: backend lapack (OpenBLAS), %u hardware threads, dim_divisor "
      "%lld, input dtype %s\n",
      std::thread::hardware_concurrency(), static_cast<long long>(f.dim_divisor),
      std::string(DTypeName(f.dtype)).c_str());
  const LapackSvdBackend backend;
  if (f.part == "all" || f.part == "shapes") {
    const int threads = SetBlasThreads(f.blas_threads > 0 ? f.blas_threads : BlasThreadsFor(1));
    std::printf("part 1: %d BLAS threads\n", threads);
    RunShapes(f, backend);
  }
  if (f.part == "all" || f.part == "batch") {
    const int threads =
        SetBlasThreads(f.blas_threads > 0 ? f.blas_threads : BlasThreadsFor(f.batch_workers));
    std::printf("\npart 2: %d BLAS threads per worker\n", threads);
    RunBatch(f, backend);
  }
  return 0;
}
