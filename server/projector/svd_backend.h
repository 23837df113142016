// SvdBackend: the numerical kernel behind a projector refresh — top-k singular vectors of a dense
// fp32 matrix, exactly or by a randomized range finder. The refresh logic (validation, dtype
// conversion, scaling, metrics) lives in projector.h and is backend independent; a backend only
// turns a finite fp32 matrix into singular vectors and values.
//
// Implementations: LapackSvdBackend (lapack_backend.h, host CPU). A cuSOLVER backend can be added
// by implementing this interface; it receives host pointers and must copy to and from the device.
//
// Thread safety: every method is const and implementations must keep no mutable state, so one
// backend object may serve concurrent refreshes from many threads.
#ifndef OFFLOADD_SERVER_PROJECTOR_SVD_BACKEND_H_
#define OFFLOADD_SERVER_PROJECTOR_SVD_BACKEND_H_

#include <cstdint>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offloadd::projector {

// Non-owning view of a dense row-major fp32 matrix: element (i, j) is data[i * cols + j].
struct DenseMatrix {
  const float* data = nullptr;
  int64_t rows = 0;
  int64_t cols = 0;
};

// The shape and rank checks every backend makes before an SVD of `a` at rank `k`:
// INVALID_ARGUMENT for a null or empty matrix, one of more than 2^31 - 1 elements (the 32-bit
// indices of `library`, "LAPACK" or "cuSOLVER"), or k outside [1, min(rows, cols)].
absl::Status CheckSvdInput(DenseMatrix a, int64_t k, absl::string_view library);

// Which singular vectors a projector holds. For G (m x n) = U S V^T:
//   kLeft:  columns of U, the projector is m x k and the low-rank gradient is P^T G (k x n).
//   kRight: columns of V, the projector is n x k and the low-rank gradient is G P (m x k).
enum class VectorSide { kLeft = 0, kRight = 1 };

// Parameters of the randomized range finder (Halko, Martinsson, Tropp 2011, "Finding Structure
// with Randomness", SIAM Review 53(2), Alg. 4.4 randomized subspace iteration, and Alg. 5.1 for
// the SVD of B = Q^T A). The sketch has l = min(k + oversampling, min(m, n)) columns.
struct RandomizedOptions {
  int64_t oversampling = 10;      // p; HMT §4.2 suggest 5-10
  int power_iterations = 2;       // q; each costs two passes over A plus two QRs
  uint64_t seed = 0x6a4c0f1dULL;  // seeds the Gaussian test matrix (std::mt19937_64)
};

// Output of a backend call.
struct TopSingular {
  int64_t k = 0;         // number of vectors returned
  int64_t side_dim = 0;  // length of each vector: rows (kLeft) or cols (kRight) of the input
  // side_dim x k, row-major; column i is the i-th singular vector (unit norm), in order of
  // decreasing singular value. Signs are arbitrary.
  std::vector<float> vectors;
  // Descending. Exact: all min(m, n) singular values. Randomized: the l singular values of
  // B = Q^T A, each a lower bound of the matching true singular value (interlacing).
  std::vector<float> singular_values;
  bool full_spectrum = false;  // true when singular_values holds all min(m, n) values
};

class SvdBackend {
 public:
  virtual ~SvdBackend() = default;

  // Short name for logs and metrics, e.g. "lapack".
  virtual absl::string_view name() const = 0;

  // Exact thin SVD of `a` (finite, rows, cols >= 1); returns the top-k vectors on `side`
  // (1 <= k <= min(rows, cols)) and all singular values.
  // Errors: INVALID_ARGUMENT for bad shapes or k, INTERNAL when the solver fails to converge.
  virtual absl::StatusOr<TopSingular> Exact(DenseMatrix a, VectorSide side, int64_t k) const = 0;

  // Randomized top-k SVD. `warm_start`, when its data is not null, is a side_dim x w row-major
  // matrix (the previous projector) whose columns seed the range finder instead of a purely
  // random sketch; only its first min(w, l) columns are used and they need not be orthonormal.
  // Errors: as Exact; INVALID_ARGUMENT for a warm start of the wrong height.
  virtual absl::StatusOr<TopSingular> Randomized(DenseMatrix a, VectorSide side, int64_t k,
                                                 const RandomizedOptions& options,
                                                 DenseMatrix warm_start) const = 0;
};

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_SVD_BACKEND_H_
