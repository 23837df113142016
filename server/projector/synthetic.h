// Synthetic gradients with a known spectrum, for tests and benchmarks (fixed seeds, so runs are
// reproducible). Not used by the daemon itself.
#ifndef OFFLOADD_SERVER_PROJECTOR_SYNTHETIC_H_
#define OFFLOADD_SERVER_PROJECTOR_SYNTHETIC_H_

#include <cstdint>
#include <vector>

namespace offloadd::projector {

// rows x cols (rows >= cols) row-major matrix with orthonormal columns: the Q factor of the
// Householder QR of a Gaussian matrix (Haar-distributed up to column signs).
std::vector<float> RandomOrthonormal(int64_t rows, int64_t cols, uint64_t seed);

// G = U diag(s) V^T + noise_std * N(0, 1) entries, m x n row-major, with U (m x k) and V (n x k)
// from RandomOrthonormal and k = s.size() <= min(m, n). The noise adds a bulk of singular values
// of about noise_std * (sqrt(m) + sqrt(n)) at most (Marchenko-Pastur edge).
std::vector<float> LowRankPlusNoise(int64_t m, int64_t n, const std::vector<double>& s,
                                    double noise_std, uint64_t seed);

// s_i = first * ratio^i for i in [0, count): a geometrically decaying spectrum.
std::vector<double> GeometricSpectrum(int64_t count, double first, double ratio);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_SYNTHETIC_H_
