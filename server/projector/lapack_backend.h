// LapackSvdBackend: SvdBackend on the host CPU through LAPACKE + CBLAS (Debian's OpenBLAS).
//
//   Exact:      LAPACKE_sgesdd (divide and conquer), thin SVD in fp32; for the short side of a
//               rectangular matrix, sgeqrf first and sgesdd of the square triangular factor.
//   Randomized: Halko, Martinsson, Tropp (2011) Alg. 4.4 — Y = A·Omega with a Gaussian Omega
//               (n x l), then q power iterations Y = A·orth(A^T·orth(Y)), re-orthonormalising
//               with Householder QR (sgeqrf + sorgqr) after every product; then Alg. 5.1: the SVD
//               of the small B = Q^T A (l x n) by sgesdd gives U = Q·U_B. Right singular vectors
//               run the same algorithm on A^T (through CBLAS transposes; A is never copied).
//               Warm start: the sketch's first columns are the previous projector (side_dim x w),
//               the rest Gaussian; the start is Y = A·A^T·orth(sketch), i.e. subspace iteration
//               continued from the previous subspace.
//
// Cost (m x n, l = k + p, q power iterations): exact O(m n min(m, n)); randomized about
// (2q + 2) · 2 m n l flops for the products plus O((m + n) l^2) for the QRs and the small SVD.
// Memory: exact holds a copy of A plus U and V^T (about 3 m n floats); randomized holds
// O((m + n) l) floats besides A.
//
// LAPACK here uses 32-bit indices: matrices with more than 2^31 - 1 elements are rejected
// (INVALID_ARGUMENT).
//
// Thread safety: no state; safe for concurrent calls. OpenBLAS runs each call on its own thread
// pool whose size is process-wide; see SetBlasThreads.
#ifndef OFFLOADD_SERVER_PROJECTOR_LAPACK_BACKEND_H_
#define OFFLOADD_SERVER_PROJECTOR_LAPACK_BACKEND_H_

#include "server/projector/svd_backend.h"

namespace offloadd::projector {

class LapackSvdBackend final : public SvdBackend {
 public:
  absl::string_view name() const override { return "lapack"; }
  absl::StatusOr<TopSingular> Exact(DenseMatrix a, VectorSide side, int64_t k) const override;
  absl::StatusOr<TopSingular> Randomized(DenseMatrix a, VectorSide side, int64_t k,
                                         const RandomizedOptions& options,
                                         DenseMatrix warm_start) const override;
};

// Threads OpenBLAS gives each BLAS/LAPACK call: `hardware threads / concurrent_refreshes`, at
// least 1, so that concurrent refreshes do not oversubscribe the cores (each refresh would
// otherwise spawn a thread per core).
int BlasThreadsFor(int concurrent_refreshes);

// Sets OpenBLAS's process-wide thread count (openblas_set_num_threads). Call once at start-up,
// before refreshes run (e.g. SetBlasThreads(BlasThreadsFor(workers))); it is process-global, so
// the library itself never calls it. Returns the count now in effect.
int SetBlasThreads(int threads);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_LAPACK_BACKEND_H_
