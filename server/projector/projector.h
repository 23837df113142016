// GaLore projector refresh: given a gradient G (m x n), compute the projector P of its top-r
// singular vectors, write it back in G's dtype, and measure how good it is.
//
// Source: Zhao et al. 2024, "GaLore: Memory-Efficient LLM Training by Gradient Low-Rank
// Projection" (shared/reference/galore-paper.txt, Eq. 9 and Alg. 1: P = U[:, :r] of an fp32 SVD,
// refreshed every T = 200 steps). Side semantics follow the reference GaLoreProjector
// (github.com/jiaweizzhao/GaLore, galore_torch/galore_projector.py) proj_type values:
//   kStd:        m >= n -> right vectors; m < n -> left vectors (projects the smaller side)
//   kReverseStd: m >= n -> left vectors;  m < n -> right vectors (projects the larger side)
//   kLeft / kRight: fixed.
// Layout: P is ALWAYS row-major side_dim x r with column i the i-th singular vector:
//   left:  P is m x r (= the reference's U[:, :r]);   low-rank gradient P^T G (r x n).
//   right: P is n x r (= the TRANSPOSE of the reference's Vh[:r, :], which is r x n);
//          low-rank gradient G P (m x r), which equals the reference's G @ ortho_matrix.t().
//   A torch client on the right side gets the reference's matrix as `P.t()`.
//
// Numerics: G is converted to fp32 (exact for bf16/fp16; aligned fp32 is used in place) and
// checked for NaN/Inf. When max|G| is outside [2^-49, 2^50] it is multiplied by a power of two
// 2^-e so that max|G| lies in [0.5, 1) (exact, so entries of 1e30 whose squares overflow fp32, or
// subnormals, are handled); singular values and norms are scaled back in double. P is computed
// in fp32 and rounded to G's dtype (round to nearest even); every reported metric describes the
// projector AS WRITTEN (after that rounding).
//
// Thread safety: RefreshProjector keeps no state; concurrent calls are safe when the backend is
// (LapackSvdBackend is).
#ifndef OFFLOADD_SERVER_PROJECTOR_PROJECTOR_H_
#define OFFLOADD_SERVER_PROJECTOR_PROJECTOR_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"
#include "server/projector/dtype.h"
#include "server/projector/svd_backend.h"

namespace offloadd::projector {

enum class ProjectionSide { kStd = 0, kReverseStd = 1, kLeft = 2, kRight = 3 };
enum class SvdMethod { kExact = 0, kRandomized = 1 };

// Borrowed host bytes of a row-major matrix. `shape` must be exactly {rows, cols}, both >= 1, and
// size_bytes == rows * cols * ElementSizeBytes(dtype). data == nullptr means "absent" where the
// field is optional.
struct HostMatrix {
  const void* data = nullptr;
  size_t size_bytes = 0;
  std::vector<int64_t> shape;
  DType dtype = DType::kFloat32;
};

struct RefreshRequest {
  HostMatrix gradient;  // G, m x n
  int64_t rank = 128;   // r >= 1; clamped to min(m, n)
  ProjectionSide side = ProjectionSide::kStd;
  SvdMethod method = SvdMethod::kExact;
  RandomizedOptions randomized;  // used by kRandomized only
  // Randomized only: seed the range finder with previous_projector (which must be present).
  bool warm_start = false;
  // Compute residual_fro and the residual ratios: two extra products with G (about 4 m n r
  // flops, a third of a q = 2 randomized refresh). When false they are NaN.
  bool measure_residual = true;
  // Optional: the projector being replaced, side_dim x r_old in any dtype. Used for `similarity`
  // and for warm starts. Its height must match the resolved side.
  HostMatrix previous_projector;
};

struct RefreshResult {
  // G is all zeros: nothing was computed and `projector_bytes` is empty; the caller keeps its
  // previous projector. Only shape fields, effective_rank and elapsed_seconds are filled.
  bool degenerate = false;
  VectorSide vector_side = VectorSide::kLeft;  // which singular vectors P holds
  int64_t effective_rank = 0;                  // min(rank, m, n)
  int64_t projector_rows = 0;                  // side_dim: m (left) or n (right)
  DType projector_dtype = DType::kFloat32;     // == gradient dtype
  std::vector<uint8_t> projector_bytes;        // projector_rows x effective_rank, row-major
  // Top effective_rank singular values of G, descending, in G's units (randomized: estimates,
  // each a lower bound of the true value).
  std::vector<double> singular_values;
  double gradient_fro = 0.0;     // ||G||_F
  double captured_energy = 0.0;  // sum_{i<=r} sigma_i^2 / ||G||_F^2, in [0, 1]
  double residual_fro = 0.0;     // ||G - P P^T G||_F (left) or ||G - G P P^T||_F (right)
  // Bounds on the true tail energy sum_{i>r} sigma_i^2. Exact: both equal the tail of the
  // computed spectrum. Randomized (l = r + p sketch values s~): lower = sum_{r<i<=l} s~_i^2,
  // upper = ||G||_F^2 - sum_{i<=r} s~_i^2 (interlacing: s~_i <= sigma_i). Both hold up to fp32
  // rounding of the singular values, about 1e-6 ||G||_F^2.
  double tail_energy_lower = 0.0;
  double tail_energy_upper = 0.0;
  // rho = residual_fro / sqrt(true tail), with the zero-ish-tail rule of ResidualRatio
  // (subspace_metrics.h). Known for kExact; NaN for kRandomized, whose true tail is unknown —
  // use ResidualRatio with an exact spectrum to evaluate it offline.
  double residual_ratio = 0.0;
  // residual_fro / sqrt(tail_energy_lower) (same zero-ish rule): an upper bound of rho, equal to
  // rho for kExact; for kRandomized it is loose unless p covers most of the tail (p = 0 gives
  // residual / (1e-5 ||G||_F)).
  double residual_ratio_upper_bound = 0.0;
  double orthogonality_error = 0.0;  // max|P^T P - I| of the projector as written
  bool has_similarity = false;       // previous_projector was given
  double similarity = 0.0;           // ||P^T P_old||_F^2 / min(r, r_old), in [0, 1]
  double svd_seconds = 0.0;          // time inside the backend
  double elapsed_seconds = 0.0;      // whole refresh: validation to metrics
};

// Reusable memory for successive refreshes on ONE thread (not thread-safe; keep one per worker).
// A refresh of a bf16/fp16 (or unaligned, or out-of-range) gradient needs an fp32 copy of G;
// buffers that large come straight from mmap and go back on free, so without reuse every
// refresh faults in fresh pages — ~0.3 s per 64 MiB on the 2-vCPU build VMs, comparable to a
// randomized SVD. The buffer only grows; capacity_bytes() says how much is held.
class RefreshScratch {
 public:
  // At least `count` floats; contents unspecified.
  float* GradientBuffer(size_t count);
  size_t capacity_bytes() const { return capacity_ * sizeof(float); }

 private:
  std::unique_ptr<float[]> gradient_;
  size_t capacity_ = 0;
};

// Which singular vectors `side` selects for an m x n gradient (see the table above).
VectorSide ResolveSide(ProjectionSide side, int64_t rows, int64_t cols);

// Runs one refresh on `backend`.
// Errors (all INVALID_ARGUMENT unless noted; the message says what to change):
//   - gradient shape not exactly 2-D with both dims >= 1 (1-D, 0-D, 3-D, empty), null data, or
//     size_bytes != rows * cols * element size;
//   - rank < 1; bad randomized options; warm_start without previous_projector or with kExact;
//   - NaN or Inf in G, naming the first bad row and column (the scan stops there);
//   - previous_projector of the wrong shape or with NaN/Inf;
//   - backend errors pass through (e.g. INTERNAL when the SVD does not converge).
// An all-zero G is not an error: the result has degenerate = true.
// `scratch` (optional, see RefreshScratch) only changes where the fp32 copy of G lives.
absl::StatusOr<RefreshResult> RefreshProjector(const RefreshRequest& request,
                                               const SvdBackend& backend,
                                               RefreshScratch* scratch = nullptr);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_PROJECTOR_H_
