// Quality measures of a projector P (side_dim x r, row-major fp32, columns meant orthonormal)
// for a gradient G (m x n, row-major fp32). Used by the refresh to fill its result, and by tests
// and benchmarks against exact spectra. All sums accumulate in double.
#ifndef OFFLOADD_SERVER_PROJECTOR_SUBSPACE_METRICS_H_
#define OFFLOADD_SERVER_PROJECTOR_SUBSPACE_METRICS_H_

#include <cstdint>

#include "server/projector/svd_backend.h"

namespace offloadd::projector {

// Below this fraction of ||G||_F the tail sqrt(sum_{i>r} sigma_i^2) is "zero-ish": it is at the
// level of fp32 rounding in G - P P^T G, so the residual ratio is not meaningful (see
// ResidualRatio).
inline constexpr double kZeroTailRelative = 1e-5;

// ||G||_F^2.
double FrobeniusSquared(DenseMatrix g);

// ||G - P P^T G||_F for kLeft (P is m x r) or ||G - G P P^T||_F for kRight (P is n x r),
// computed directly in row blocks (not as ||G||^2 - ||P^T G||^2, which cancels).
double ResidualFro(DenseMatrix g, const float* p, int64_t r, VectorSide side);

// Energy kept by the projector: ||P^T G||_F^2 (kLeft) or ||G P||_F^2 (kRight).
double ProjectedEnergy(DenseMatrix g, const float* p, int64_t r, VectorSide side);

// rho = ResidualFro(G, P) / sqrt(true_tail_energy), where true_tail_energy = sum_{i>r} sigma_i^2
// from the exact spectrum of G. rho >= 1 up to rounding; rho == 1 for the exact top-r subspace.
// Zero-ish tail (sqrt(tail) <= kZeroTailRelative * ||G||_F, e.g. r = rank(G)): the ratio is
// defined as 1 when the residual is also below that floor, else residual / floor (> 1: the
// projector misses energy that is really there).
double ResidualRatio(DenseMatrix g, const float* p, int64_t r, VectorSide side,
                     double true_tail_energy);

// The same rule from precomputed norms: residual_fro, tail energy and ||G||_F.
double ResidualRatioFromNorms(double residual_fro, double tail_energy, double gradient_fro);

// max_ij |(P^T P - I)_ij| for P rows x r.
double OrthogonalityError(const float* p, int64_t rows, int64_t r);

// ||P_new^T P_old||_F^2 / min(r_new, r_old): 1 when one subspace contains the other, 0 when they
// are orthogonal; invariant to signs and to rotations within either subspace.
double Similarity(const float* p_new, int64_t r_new, const float* p_old, int64_t r_old,
                  int64_t rows);

// Sine of the largest principal angle between span(P1) and span(P2) (both rows x r, orthonormal
// columns): the spectral norm of (I - P1 P1^T) P2, in double. Equals sqrt(1 - sigma_min^2) of
// P1^T P2 (Björck & Golub 1973, "Numerical methods for computing angles between linear
// subspaces"), but this form stays accurate for tiny angles, where 1 - sigma_min^2 cancels.
double MaxPrincipalAngleSine(const float* p1, const float* p2, int64_t rows, int64_t r);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_SUBSPACE_METRICS_H_
