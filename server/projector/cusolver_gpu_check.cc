// GPU check of CusolverSvdBackend against LapackSvdBackend (run by tests/gpu/run.sh; a cc_test
// here, where it prints "SKIPPED: no CUDA driver" and exits 0).
//
// For synthetic gradients with a decaying spectrum (synthetic.h), on both sides, in fp32 and
// bf16, through RefreshProjector:
//   - exact and randomized on cuSOLVER: rho <= 1.05 (randomized: against the exact tail from
//     LAPACK) and max|P^T P - I| <= 1e-5 in fp32;
//   - cuSOLVER exact vs LAPACK exact: the same subspace (largest principal-angle sine <= 1e-3;
//     the spectra have gaps well above fp32 rounding there) and singular values within 1e-4
//     relative;
//   - a warm-started randomized refresh matches too.
// Then one timing per method on a LLaMA-7B MLP shape (4096 x 11008, r = 128) as FIGURE lines.
// Output lines: "PASS <what>", "FAIL <what>: <why>", "FIGURE <name> <value>"; exit 1 on a FAIL.
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "server/projector/lapack_backend.h"
#include "server/projector/projector.h"
#include "server/projector/subspace_metrics.h"
#include "server/projector/synthetic.h"

#ifdef OFFLOADD_HAVE_CUDA
#include "server/projector/cusolver_backend.h"
#endif

namespace offloadd::projector {
namespace {

int failures = 0;

void Check(bool ok, const std::string& what, const std::string& why) {
  if (ok) {
    std::printf("PASS %s\n", what.c_str());
  } else {
    std::printf("FAIL %s: %s\n", what.c_str(), why.c_str());
    ++failures;
  }
}

std::vector<float> Decode(const RefreshResult& r) {
  std::vector<float> p(r.projector_rows * r.effective_rank);
  ConvertToFloat32(r.projector_bytes.data(), r.projector_dtype, p.size(), p.data());
  return p;
}

// float32 only: cuSOLVER's exact projector spans LAPACK's subspace, with the same singular values.
void CheckMatchesLapack(const RefreshResult& ref, const RefreshResult& exact,
                        const std::vector<float>& p_ref, const std::vector<float>& p_exact,
                        int64_t r, const std::string& tag) {
  const double sine = MaxPrincipalAngleSine(p_ref.data(), p_exact.data(), exact.projector_rows, r);
  double sv = 0;
  for (int64_t i = 0; i < r; ++i) {
    sv = std::max(sv, std::fabs(ref.singular_values[i] - exact.singular_values[i]) /
                          ref.singular_values[0]);
  }
  char buf[256];
  std::snprintf(buf, sizeof(buf), "max principal angle sine %.3g, sigma rel diff %.3g", sine, sv);
  Check(sine <= 1e-3 && sv <= 1e-4, "cusolver exact == lapack exact " + tag, buf);
}

// Warm start from LAPACK's projector: the randomized refresh keeps its quality and subspace.
void CheckWarmStart(const SvdBackend& gpu, RefreshRequest req, const RefreshResult& ref,
                    const DenseMatrix& gm, VectorSide vs, double tail, const std::string& tag) {
  const int64_t r = req.rank;
  req.warm_start = true;
  req.previous_projector = {ref.projector_bytes.data(), ref.projector_bytes.size(),
                            {ref.projector_rows, r}, req.gradient.dtype};
  auto warm = RefreshProjector(req, gpu);
  const double rho_warm = warm.ok() ? ResidualRatio(gm, Decode(*warm).data(), r, vs, tail) : 1e9;
  char buf[256];
  std::snprintf(buf, sizeof(buf), "rho %.4f similarity %.4f", rho_warm,
                warm.ok() ? warm->similarity : -1.0);
  Check(warm.ok() && rho_warm <= 1.05 && warm->similarity > 0.99,
        "cusolver warm-started randomized " + tag, buf);
}

#ifdef OFFLOADD_HAVE_CUDA
void CheckShape(const SvdBackend& gpu, int64_t m, int64_t n, int64_t r, ProjectionSide side,
                DType dtype) {
  const std::vector<float> g32 =
      LowRankPlusNoise(m, n, GeometricSpectrum(std::min(m, n) / 2, 10.0, 0.95), 0.001, m + n);
  std::vector<uint8_t> bytes(g32.size() * ElementSizeBytes(dtype));
  ConvertFromFloat32(g32.data(), g32.size(), dtype, bytes.data());
  std::vector<float> g(g32.size());  // G as the refresh sees it (after the dtype round trip)
  ConvertToFloat32(bytes.data(), dtype, g.size(), g.data());
  const std::string tag = std::to_string(m) + "x" + std::to_string(n) + " r" + std::to_string(r) +
                          (side == ProjectionSide::kLeft ? " left " : " right ") +
                          std::string(DTypeName(dtype));
  RefreshRequest req;
  req.gradient = {bytes.data(), bytes.size(), {m, n}, dtype};
  req.rank = r;
  req.side = side;
  LapackSvdBackend lapack;
  auto ref = RefreshProjector(req, lapack);
  auto exact = RefreshProjector(req, gpu);
  req.method = SvdMethod::kRandomized;
  auto rnd = RefreshProjector(req, gpu);
  if (!ref.ok() || !exact.ok() || !rnd.ok()) {
    Check(false, tag,
          "refresh failed: lapack " + ref.status().ToString() + " / cusolver exact " +
              exact.status().ToString() + " / randomized " + rnd.status().ToString());
    return;
  }
  const double orth_limit = dtype == DType::kFloat32 ? 1e-5 : 3e-2;
  const VectorSide vs = exact->vector_side;
  const DenseMatrix gm{g.data(), m, n};
  double tail = 0;  // exact tail from LAPACK's full spectrum (tail_energy_lower == upper there)
  tail = ref->tail_energy_lower;
  std::vector<float> p_exact = Decode(*exact), p_rnd = Decode(*rnd);
  const double rho_exact = ResidualRatio(gm, p_exact.data(), r, vs, tail);
  const double rho_rnd = ResidualRatio(gm, p_rnd.data(), r, vs, tail);
  char buf[256];
  std::snprintf(buf, sizeof(buf), "rho %.4f", rho_exact);
  Check(rho_exact <= 1.05, "cusolver exact rho " + tag, buf);
  std::snprintf(buf, sizeof(buf), "rho %.4f", rho_rnd);
  Check(rho_rnd <= 1.05, "cusolver randomized rho " + tag, buf);
  std::snprintf(buf, sizeof(buf), "orth %.3g / %.3g", exact->orthogonality_error,
                rnd->orthogonality_error);
  Check(exact->orthogonality_error <= orth_limit && rnd->orthogonality_error <= orth_limit,
        "cusolver orthogonality " + tag, buf);
  if (dtype == DType::kFloat32) {
    std::vector<float> p_ref = Decode(*ref), p_exact = Decode(*exact);
    CheckMatchesLapack(*ref, *exact, p_ref, p_exact, r, tag);
    CheckWarmStart(gpu, req, *ref, gm, vs, tail, tag);
  }
}

double TimeRefresh(const SvdBackend& backend, const std::vector<float>& g, int64_t m, int64_t n,
                   int64_t r, SvdMethod method) {
  RefreshRequest req;
  req.gradient = {g.data(), g.size() * 4, {m, n}, DType::kFloat32};
  req.rank = r;
  req.method = method;
  req.measure_residual = false;
  auto start = std::chrono::steady_clock::now();
  auto res = RefreshProjector(req, backend);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  if (!res.ok()) {
    Check(false, "timing", res.status().ToString());
    return -1;
  }
  return s;
}
#endif

int Main() {
#ifndef OFFLOADD_HAVE_CUDA
  std::printf("SKIPPED: no CUDA driver (built without the CUDA toolkit)\n");
  return 0;
#else
  // The daemon's selector: shm regions stay on LAPACK; a CUDA region of a GPU not visible here
  // (no driver at all, in CI) falls back to LAPACK too.
  auto select = MakeCusolverBackendSelector();
  copy::RegionSpec shm;
  shm.shm_name = "/x";
  copy::RegionSpec unknown_gpu;
  unknown_gpu.cuda_ipc_handle = std::string(64, '\1');
  unknown_gpu.device_id = "GPU-00000000-0000-0000-0000-000000000000";
  Check(select(shm) == nullptr && select(unknown_gpu) == nullptr,
        "selector keeps shm regions and unknown GPUs on LAPACK", "it returned a GPU backend");
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok()) {
    std::printf("SKIPPED: no CUDA driver (%s)\n", std::string(devices.status().message()).c_str());
    return failures > 0 ? 1 : 0;
  }
  SetBlasThreads(BlasThreadsFor(1));
  CusolverSvdBackend gpu(0);
  for (ProjectionSide side : {ProjectionSide::kLeft, ProjectionSide::kRight}) {
    CheckShape(gpu, 512, 256, 32, side, DType::kFloat32);
    CheckShape(gpu, 300, 700, 20, side, DType::kFloat32);
    CheckShape(gpu, 256, 256, 64, side, DType::kBFloat16);
  }
  // Timing on one LLaMA-7B MLP shape: warm-up, then one timed refresh per method.
  const int64_t m = 4096, n = 11008, r = 128;
  const std::vector<float> g = LowRankPlusNoise(m, n, GeometricSpectrum(512, 10.0, 0.99), 0.001, 7);
  const std::vector<float> small(g.begin(), g.begin() + 512 * 512);
  TimeRefresh(gpu, small, 512, 512, 16, SvdMethod::kExact);  // context and library start-up
  std::printf("FIGURE projector_cusolver_exact_4096x11008_r128_seconds %.3f\n",
              TimeRefresh(gpu, g, m, n, r, SvdMethod::kExact));
  std::printf("FIGURE projector_cusolver_randomized_4096x11008_r128_seconds %.3f\n",
              TimeRefresh(gpu, g, m, n, r, SvdMethod::kRandomized));
  LapackSvdBackend lapack;
  std::printf("FIGURE projector_lapack_randomized_4096x11008_r128_seconds %.3f\n",
              TimeRefresh(lapack, g, m, n, r, SvdMethod::kRandomized));
  return failures > 0 ? 1 : 0;
#endif
}

}  // namespace
}  // namespace offloadd::projector

int main() { return offloadd::projector::Main(); }
