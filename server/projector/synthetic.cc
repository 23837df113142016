#include "server/projector/synthetic.h"

#include <cblas.h>
#include <lapacke.h>

#include <cmath>
#include <random>

namespace offloadd::projector {

std::vector<float> RandomOrthonormal(int64_t rows, int64_t cols, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> q(rows * cols);
  for (float& x : q) x = normal(rng);
  std::vector<float> tau(cols);
  LAPACKE_sgeqrf(LAPACK_ROW_MAJOR, rows, cols, q.data(), cols, tau.data());
  LAPACKE_sorgqr(LAPACK_ROW_MAJOR, rows, cols, cols, q.data(), cols, tau.data());
  return q;
}

std::vector<float> LowRankPlusNoise(int64_t m, int64_t n, const std::vector<double>& s,
                                    double noise_std, uint64_t seed) {
  const int64_t k = static_cast<int64_t>(s.size());
  std::vector<float> g(m * n, 0.0f);
  if (noise_std > 0.0) {
    std::mt19937_64 rng(seed ^ 0x9e3779b97f4a7c15ULL);
    std::normal_distribution<float> normal(0.0f, static_cast<float>(noise_std));
    for (float& x : g) x = normal(rng);
  }
  if (k == 0) return g;
  std::vector<float> u = RandomOrthonormal(m, k, seed * 2 + 1);
  const std::vector<float> v = RandomOrthonormal(n, k, seed * 2 + 2);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < k; ++j) u[i * k + j] *= static_cast<float>(s[j]);
  }
  // G += (U diag(s)) V^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, u.data(), k, v.data(), k,
              1.0f, g.data(), n);
  return g;
}

std::vector<double> GeometricSpectrum(int64_t count, double first, double ratio) {
  std::vector<double> s(count);
  for (int64_t i = 0; i < count; ++i) s[i] = first * std::pow(ratio, static_cast<double>(i));
  return s;
}

}  // namespace offloadd::projector
