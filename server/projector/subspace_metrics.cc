#include "server/projector/subspace_metrics.h"

#include "server/projector/blas.h"


#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

namespace offloadd::projector {
namespace {

double SumSquares(const float* x, size_t count) {
  double sum = 0.0;
  for (size_t i = 0; i < count; ++i) sum += static_cast<double>(x[i]) * x[i];
  return sum;
}

std::vector<double> ToDouble(const float* x, size_t count) {
  return std::vector<double>(x, x + count);
}

// Projected coefficients W: P^T G (r x n) for kLeft, G P (m x r) for kRight.
std::vector<float> Coefficients(DenseMatrix g, const float* p, int64_t r, VectorSide side) {
  const int64_t m = g.rows, n = g.cols;
  std::vector<float> w(side == VectorSide::kLeft ? r * n : m * r);
  if (side == VectorSide::kLeft) {
    cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, n, m, 1.0f, p, r, g.data, n, 0.0f,
                w.data(), n);
  } else {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m, r, n, 1.0f, g.data, n, p, r, 0.0f,
                w.data(), r);
  }
  return w;
}

}  // namespace

double FrobeniusSquared(DenseMatrix g) { return SumSquares(g.data, g.rows * g.cols); }

double ProjectedEnergy(DenseMatrix g, const float* p, int64_t r, VectorSide side) {
  const std::vector<float> w = Coefficients(g, p, r, side);
  return SumSquares(w.data(), w.size());
}

double ResidualFro(DenseMatrix g, const float* p, int64_t r, VectorSide side) {
  const int64_t m = g.rows, n = g.cols;
  const std::vector<float> w = Coefficients(g, p, r, side);
  // Row blocks of about 4 Mi floats keep the scratch small for large gradients.
  const int64_t block = std::max<int64_t>(1, std::min<int64_t>(m, (int64_t{1} << 22) / n));
  std::vector<float> rest(block * n);
  double sum = 0.0;
  for (int64_t i0 = 0; i0 < m; i0 += block) {
    const int64_t b = std::min(block, m - i0);
    std::memcpy(rest.data(), g.data + i0 * n, b * n * sizeof(float));
    if (side == VectorSide::kLeft) {  // G_blk - P_blk (P^T G)
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, b, n, r, -1.0f, p + i0 * r, r,
                  w.data(), n, 1.0f, rest.data(), n);
    } else {  // G_blk - (G P)_blk P^T
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, b, n, r, -1.0f, w.data() + i0 * r, r, p,
                  r, 1.0f, rest.data(), n);
    }
    sum += SumSquares(rest.data(), b * n);
  }
  return std::sqrt(sum);
}

double ResidualRatioFromNorms(double residual_fro, double tail_energy, double gradient_fro) {
  const double floor = kZeroTailRelative * gradient_fro;
  const double tail = std::sqrt(std::max(0.0, tail_energy));
  if (tail > floor) return residual_fro / tail;
  if (residual_fro <= floor || floor == 0.0) return 1.0;
  return residual_fro / floor;
}

double ResidualRatio(DenseMatrix g, const float* p, int64_t r, VectorSide side,
                     double true_tail_energy) {
  return ResidualRatioFromNorms(ResidualFro(g, p, r, side), true_tail_energy,
                                std::sqrt(FrobeniusSquared(g)));
}

double OrthogonalityError(const float* p, int64_t rows, int64_t r) {
  const std::vector<double> pd = ToDouble(p, rows * r);
  std::vector<double> gram(r * r);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, r, rows, 1.0, pd.data(), r, pd.data(), r,
              0.0, gram.data(), r);
  double worst = 0.0;
  for (int64_t i = 0; i < r; ++i) {
    for (int64_t j = 0; j < r; ++j) {
      worst = std::max(worst, std::fabs(gram[i * r + j] - (i == j ? 1.0 : 0.0)));
    }
  }
  return worst;
}

double Similarity(const float* p_new, int64_t r_new, const float* p_old, int64_t r_old,
                  int64_t rows) {
  const std::vector<double> a = ToDouble(p_new, rows * r_new);
  const std::vector<double> b = ToDouble(p_old, rows * r_old);
  std::vector<double> cross(r_new * r_old);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r_new, r_old, rows, 1.0, a.data(), r_new,
              b.data(), r_old, 0.0, cross.data(), r_old);
  double sum = 0.0;
  for (double c : cross) sum += c * c;
  return sum / static_cast<double>(std::min(r_new, r_old));
}

double MaxPrincipalAngleSine(const float* p1, const float* p2, int64_t rows, int64_t r) {
  const std::vector<double> a = ToDouble(p1, rows * r);
  std::vector<double> d = ToDouble(p2, rows * r);
  std::vector<double> cross(r * r);  // P1^T P2
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, r, r, rows, 1.0, a.data(), r, d.data(), r,
              0.0, cross.data(), r);
  // D = P2 - P1 (P1^T P2)
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, r, r, -1.0, a.data(), r,
              cross.data(), r, 1.0, d.data(), r);
  // Row-major rows x r is column-major r x rows: same singular values.
  std::vector<double> s(std::min(rows, r));
  const lapack_int info =
      LAPACKE_dgesdd(LAPACK_COL_MAJOR, 'N', r, rows, d.data(), r, s.data(), nullptr, 1, nullptr, 1);
  if (info != 0) return std::nan("");
  return std::min(1.0, s[0]);
}

}  // namespace offloadd::projector
