#include "server/projector/lapack_backend.h"

#include "server/projector/blas.h"


#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace offloadd::projector {
namespace {

absl::Status LapackStatus(const char* routine, lapack_int info) {
  if (info == 0) return absl::OkStatus();
  if (info < 0) {
    return absl::InternalError(absl::StrCat(routine, ": argument ", -info, " is invalid (bug)"));
  }
  return absl::InternalError(
      absl::StrCat(routine, " did not converge (info ", info, "); retry with the other method"));
}

// Products with op(A), where op(A) = A for left vectors and A^T for right vectors. A is row-major
// m x n, which CBLAS sees as the column-major n x m matrix A^T with leading dimension n. All the
// tall-skinny matrices below are column-major.
struct Operator {
  DenseMatrix a;
  bool transpose;  // op(A) = A^T
  int64_t rows() const { return transpose ? a.cols : a.rows; }
  int64_t cols() const { return transpose ? a.rows : a.cols; }

  // y (rows() x c) = op(A) · x (cols() x c).
  void Apply(const float* x, int64_t c, float* y) const {
    cblas_sgemm(CblasColMajor, transpose ? CblasNoTrans : CblasTrans, CblasNoTrans, rows(), c,
                cols(), 1.0f, a.data, a.cols, x, cols(), 0.0f, y, rows());
  }
  // z (cols() x c) = op(A)^T · y (rows() x c).
  void ApplyTransposed(const float* y, int64_t c, float* z) const {
    cblas_sgemm(CblasColMajor, transpose ? CblasTrans : CblasNoTrans, CblasNoTrans, cols(), c,
                rows(), 1.0f, a.data, a.cols, y, rows(), 0.0f, z, cols());
  }
};

// Replaces the column-major rows x c matrix (rows >= c) by the Q factor of its Householder QR:
// orthonormal columns spanning the same space (any basis if it is rank deficient).
absl::Status Orthonormalize(float* y, int64_t rows, int64_t c) {
  std::vector<float> tau(c);
  absl::Status status =
      LapackStatus("sgeqrf", LAPACKE_sgeqrf(LAPACK_COL_MAJOR, rows, c, y, rows, tau.data()));
  if (!status.ok()) return status;
  return LapackStatus("sorgqr", LAPACKE_sorgqr(LAPACK_COL_MAJOR, rows, c, c, y, rows, tau.data()));
}

void FillGaussian(std::mt19937_64& rng, float* out, size_t count) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < count; ++i) out[i] = normal(rng);
}

// The factor that brings the largest |entry| of `t` into [smlnum, 1 / smlnum], with smlnum =
// sqrt(FLT_MIN) / FLT_EPSILON, LAPACK's own bounds in sgesdd (slamch 'S' and 'P'); 1 when it is
// there already or `t` is all zeros.
double SafeRangeScale(const std::vector<float>& t) {
  double amax = 0;
  for (float x : t) amax = std::max(amax, static_cast<double>(std::fabs(x)));
  const double smlnum = std::sqrt(static_cast<double>(FLT_MIN)) / FLT_EPSILON;
  if (amax > 0 && amax < smlnum) return smlnum / amax;
  if (amax > 1 / smlnum) return (1 / smlnum) / amax;
  return 1.0;
}

// Exact top-k vectors of the short side of a rectangular A (row-major m x n, m != n; the
// side whose vectors have length d = min(m, n): right when m > n, left when m < n; GaLore's
// std projection always asks for these). The tall orientation T (rows x d, column-major: A
// itself when m > n, A^T when m < n) is QR-factored first and only its d x d triangular factor
// R goes to sgesdd: R has A's singular values, and R's right vectors are the requested ones
// (T = Q R = Q U_R S V_R^T). sgesdd on the whole matrix also forms the long side's vectors: for
// 1376 x 512 on one thread of Debian 12's OpenBLAS, 68 ms against 35-40 ms this way
// (BENCHMARKS.md, GaLore).
absl::StatusOr<TopSingular> ShortSideExact(DenseMatrix a, int64_t k) {
  const int64_t m = a.rows, n = a.cols, d = std::min(m, n), rows = std::max(m, n);
  std::vector<float> t(a.data, a.data + m * n);  // m < n: the buffer is A^T, column-major
  if (m > n) {  // column-major A from the row-major buffer
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) t[r + c * m] = a.data[r * n + c];
    }
  }
  // sgesdd scales a matrix whose largest entry is near underflow or overflow into a safe range
  // first (LAPACK's slange / slascl); sgeqrf does not, so do it here: the vectors do not change,
  // the singular values are scaled back below.
  const double scale = SafeRangeScale(t);
  if (scale != 1.0) {
    for (float& x : t) x = static_cast<float>(x * scale);
  }
  std::vector<float> tau(d);
  absl::Status status =
      LapackStatus("sgeqrf", LAPACKE_sgeqrf(LAPACK_COL_MAJOR, rows, d, t.data(), rows, tau.data()));
  if (!status.ok()) return status;
  std::vector<float> r(d * d, 0.0f);
  for (int64_t c = 0; c < d; ++c) {
    for (int64_t i = 0; i <= c; ++i) r[i + c * d] = t[i + c * rows];
  }
  t = std::vector<float>();
  TopSingular out;
  out.k = k;
  out.full_spectrum = true;
  out.side_dim = d;
  out.singular_values.resize(d);
  std::vector<float> u_r(d * d), vt_r(d * d);
  status = LapackStatus("sgesdd", LAPACKE_sgesdd(LAPACK_COL_MAJOR, 'S', d, d, r.data(), d,
                                                  out.singular_values.data(), u_r.data(), d,
                                                  vt_r.data(), d));
  if (!status.ok()) return status;
  if (scale != 1.0) {
    for (float& sv : out.singular_values) sv = static_cast<float>(sv / scale);
  }
  // V_R^T is column-major d x d: entry j of vector i is vt_r[i + j * d].
  out.vectors.resize(d * k);
  for (int64_t j = 0; j < d; ++j) std::memcpy(&out.vectors[j * k], &vt_r[j * d], k * sizeof(float));
  return out;
}

}  // namespace

absl::StatusOr<TopSingular> LapackSvdBackend::Exact(DenseMatrix a, VectorSide side,
                                                    int64_t k) const {
  if (absl::Status s = CheckSvdInput(a, k, "LAPACK"); !s.ok()) return s;
  const int64_t m = a.rows, n = a.cols, kk = std::min(m, n);
  if ((m > n && side == VectorSide::kRight) || (m < n && side == VectorSide::kLeft)) {
    return ShortSideExact(a, k);
  }
  // Column-major, the buffer is At = A^T (n x m). At = U' S V'^T means A = V' S U'^T: the left
  // vectors of A are the rows of V'^T and the right vectors of A are the columns of U'.
  std::vector<float> at(a.data, a.data + m * n);  // sgesdd destroys its input
  std::vector<float> s(kk), u_prime(n * kk), vt_prime(kk * m);
  absl::Status status =
      LapackStatus("sgesdd", LAPACKE_sgesdd(LAPACK_COL_MAJOR, 'S', n, m, at.data(), n, s.data(),
                                            u_prime.data(), n, vt_prime.data(), kk));
  if (!status.ok()) return status;
  at = std::vector<float>();

  TopSingular out;
  out.k = k;
  out.full_spectrum = true;
  out.singular_values = std::move(s);
  if (side == VectorSide::kLeft) {
    // V'^T is column-major kk x m: entry j of left vector i is vt_prime[i + j * kk].
    out.side_dim = m;
    out.vectors.resize(m * k);
    for (int64_t j = 0; j < m; ++j) {
      std::memcpy(&out.vectors[j * k], &vt_prime[j * kk], k * sizeof(float));
    }
  } else {
    // U' is column-major n x kk: entry j of right vector i is u_prime[j + i * n].
    out.side_dim = n;
    out.vectors.resize(n * k);
    for (int64_t i = 0; i < k; ++i) {
      for (int64_t j = 0; j < n; ++j) out.vectors[j * k + i] = u_prime[j + i * n];
    }
  }
  return out;
}

absl::StatusOr<TopSingular> LapackSvdBackend::Randomized(DenseMatrix a, VectorSide side, int64_t k,
                                                         const RandomizedOptions& options,
                                                         DenseMatrix warm_start) const {
  if (absl::Status s = CheckSvdInput(a, k, "LAPACK"); !s.ok()) return s;
  if (options.oversampling < 0 || options.power_iterations < 0) {
    return absl::InvalidArgumentError("oversampling and power_iterations must be >= 0");
  }
  const Operator op{a, side == VectorSide::kRight};
  const int64_t rows = op.rows(), cols = op.cols();
  const int64_t l = std::min(k + options.oversampling, std::min(rows, cols));
  std::mt19937_64 rng(options.seed);

  std::vector<float> q(rows * l);  // current range basis, column-major rows x l
  std::vector<float> z(cols * l);  // co-range iterate, column-major cols x l
  if (warm_start.data != nullptr) {
    if (warm_start.rows != rows || warm_start.cols < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("warm start is ", warm_start.rows, " x ", warm_start.cols,
                       "; it must be the previous projector, ", rows, " x w"));
    }
    const int64_t w = std::min(warm_start.cols, l);
    for (int64_t i = 0; i < w; ++i) {
      for (int64_t j = 0; j < rows; ++j) q[j + i * rows] = warm_start.data[j * warm_start.cols + i];
    }
    FillGaussian(rng, q.data() + w * rows, (l - w) * rows);
    if (absl::Status s = Orthonormalize(q.data(), rows, l); !s.ok()) return s;
    op.ApplyTransposed(q.data(), l, z.data());
    if (absl::Status s = Orthonormalize(z.data(), cols, l); !s.ok()) return s;
  } else {
    FillGaussian(rng, z.data(), z.size());  // Omega
  }
  op.Apply(z.data(), l, q.data());
  if (absl::Status s = Orthonormalize(q.data(), rows, l); !s.ok()) return s;
  for (int it = 0; it < options.power_iterations; ++it) {
    op.ApplyTransposed(q.data(), l, z.data());
    if (absl::Status s = Orthonormalize(z.data(), cols, l); !s.ok()) return s;
    op.Apply(z.data(), l, q.data());
    if (absl::Status s = Orthonormalize(q.data(), rows, l); !s.ok()) return s;
  }

  // B = Q^T op(A) is l x cols; form B^T = op(A)^T Q (cols x l, column-major, cols >= l). Its SVD
  // B^T = U_t S V_t^T gives B = V_t S U_t^T, so the left vectors of B are the rows of V_t^T.
  op.ApplyTransposed(q.data(), l, z.data());
  std::vector<float> s(l), vt(l * l);
  absl::Status status =
      LapackStatus("sgesdd", LAPACKE_sgesdd(LAPACK_COL_MAJOR, 'O', cols, l, z.data(), cols,
                                            s.data(), nullptr, cols, vt.data(), l));
  if (!status.ok()) return status;

  // P = Q · U_B[:, :k]. Compute P^T (k x rows, column-major) = V_t^T[:k, :] · Q^T, whose memory
  // is exactly P in row-major rows x k.
  TopSingular out;
  out.k = k;
  out.side_dim = rows;
  out.full_spectrum = false;
  out.singular_values = std::move(s);
  out.vectors.resize(rows * k);
  cblas_sgemm(CblasColMajor, CblasNoTrans, CblasTrans, k, rows, l, 1.0f, vt.data(), l, q.data(),
              rows, 0.0f, out.vectors.data(), k);
  return out;
}

int BlasThreadsFor(int concurrent_refreshes) {
  const int hardware = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  return std::max(1, hardware / std::max(1, concurrent_refreshes));
}

int SetBlasThreads(int threads) {
  openblas_set_num_threads(std::max(1, threads));
  return openblas_get_num_threads();
}

}  // namespace offloadd::projector
