#include "server/projector/lapack_backend.h"

#include <cblas.h>

#include <cmath>
#include <tuple>
#include <numeric>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "server/projector/blas.h"
#include "server/projector/subspace_metrics.h"
#include "server/projector/synthetic.h"

namespace offloadd::projector {
namespace {

struct Case {
  int64_t m, n, r;
  VectorSide side;
};

double TailEnergy(const std::vector<float>& s, int64_t r) {
  double tail = 0.0;
  for (size_t i = r; i < s.size(); ++i) tail += static_cast<double>(s[i]) * s[i];
  return tail;
}

// ||G^T p|| (left) or ||G p|| (right) for column i of P: equals sigma_i for a singular vector.
double ColumnGain(const std::vector<float>& g, int64_t m, int64_t n, const TopSingular& t,
                  int64_t i, VectorSide side) {
  std::vector<float> p(t.side_dim), out(side == VectorSide::kLeft ? n : m);
  for (int64_t j = 0; j < t.side_dim; ++j) p[j] = t.vectors[j * t.k + i];
  cblas_sgemv(CblasRowMajor, side == VectorSide::kLeft ? CblasTrans : CblasNoTrans, m, n, 1.0f,
              g.data(), n, p.data(), 1, 0.0f, out.data(), 1);
  return std::sqrt(std::inner_product(out.begin(), out.end(), out.begin(), 0.0));
}

TEST(LapackBackendTest, ExactRecoversAKnownSpectrumOnBothSides) {
  const LapackSvdBackend backend;
  const std::vector<double> s = {9.0, 7.0, 5.0, 3.0, 2.0, 1.0};
  for (const Case& c : {Case{40, 70, 4, VectorSide::kLeft}, Case{40, 70, 4, VectorSide::kRight},
                        Case{90, 30, 4, VectorSide::kLeft}, Case{90, 30, 4, VectorSide::kRight}}) {
    const std::vector<float> g = LowRankPlusNoise(c.m, c.n, s, 0.0, 3);
    absl::StatusOr<TopSingular> t = backend.Exact({g.data(), c.m, c.n}, c.side, c.r);
    ASSERT_TRUE(t.ok()) << t.status();
    EXPECT_TRUE(t->full_spectrum);
    ASSERT_EQ(t->singular_values.size(), static_cast<size_t>(std::min(c.m, c.n)));
    EXPECT_EQ(t->side_dim, c.side == VectorSide::kLeft ? c.m : c.n);
    ASSERT_EQ(t->vectors.size(), static_cast<size_t>(t->side_dim * c.r));
    for (size_t i = 0; i < s.size(); ++i) EXPECT_NEAR(t->singular_values[i], s[i], 1e-4);
    EXPECT_NEAR(t->singular_values[s.size()], 0.0, 1e-4);
    // Column i of P is the i-th singular vector of the requested side.
    for (int64_t i = 0; i < c.r; ++i) {
      EXPECT_NEAR(ColumnGain(g, c.m, c.n, *t, i, c.side), s[i], 1e-4) << i;
    }
    EXPECT_LE(OrthogonalityError(t->vectors.data(), t->side_dim, c.r), 1e-5);
  }
}

// Decaying spectrum plus a noise floor, the shape of real gradients (GaLore paper §3.2).
std::vector<float> DecayingWithNoise(int64_t m, int64_t n, uint64_t seed) {
  return LowRankPlusNoise(m, n, GeometricSpectrum(std::min(m, n) / 2, 10.0, 0.93), 0.002, seed);
}

// The short side's vectors of a matrix whose entries are near float's underflow (subnormal)
// or overflow: the QR path scales into a safe range first, as sgesdd does, so the subspace is
// that of a float64 SVD of the same float data.
TEST(LapackBackendTest, ShortSideSurvivesEntriesNearUnderflowAndOverflow) {
  const LapackSvdBackend backend;
  for (const auto& [m, n, k, scale] : {std::tuple<int64_t, int64_t, int64_t, double>{60, 12, 3, 1e-42},
                                       {12, 60, 3, 1e-43}, {4096, 4, 2, 1e37}}) {
    std::mt19937_64 rng(11);
    std::normal_distribution<double> normal;
    std::vector<float> g(m * n);
    for (int64_t r = 0; r < m; ++r) {
      for (int64_t c = 0; c < n; ++c) {  // distinct singular values: scale the short side
        g[r * n + c] = static_cast<float>(normal(rng) * std::pow(0.5, m > n ? c : r) * scale);
      }
    }
    const VectorSide side = m > n ? VectorSide::kRight : VectorSide::kLeft;
    absl::StatusOr<TopSingular> t = backend.Exact({g.data(), m, n}, side, k);
    ASSERT_TRUE(t.ok()) << m << "x" << n << " scale " << scale << ": " << t.status();
    // float64 reference of the same float data (normalised so double has room to spare).
    const int64_t d = std::min(m, n);
    std::vector<double> at(g.begin(), g.end()), s(d), u(n * d), vt(d * m);
    for (double& x : at) x /= scale;
    ASSERT_EQ(LAPACKE_dgesdd(LAPACK_COL_MAJOR, 'S', n, m, at.data(), n, s.data(), u.data(), n,
                             vt.data(), d), 0);
    double worst = 0;  // max entry of P P^T - Q Q^T
    for (int64_t a = 0; a < d; ++a) {
      for (int64_t b = 0; b < d; ++b) {
        double x = 0, y = 0;
        for (int64_t i = 0; i < k; ++i) {
          x += static_cast<double>(t->vectors[a * k + i]) * t->vectors[b * k + i];
          const double qa = side == VectorSide::kLeft ? vt[i + a * d] : u[a + i * n];
          const double qb = side == VectorSide::kLeft ? vt[i + b * d] : u[b + i * n];
          y += qa * qb;
        }
        worst = std::max(worst, std::fabs(x - y));
      }
    }
    EXPECT_LT(worst, 1e-4) << m << "x" << n << " scale " << scale;
    if (scale < 1) {
      EXPECT_NEAR(t->singular_values[0] / scale, s[0], 1e-3 * s[0]) << m << "x" << n;
    }
  }
}

TEST(LapackBackendTest, EveryMethodReachesRhoWithinFivePercent) {
  const LapackSvdBackend backend;
  for (const Case& c :
       {Case{512, 1024, 64, VectorSide::kLeft}, Case{512, 1024, 64, VectorSide::kRight},
        Case{384, 200, 32, VectorSide::kRight}}) {
    const std::vector<float> g = DecayingWithNoise(c.m, c.n, 17);
    const DenseMatrix gv{g.data(), c.m, c.n};
    absl::StatusOr<TopSingular> exact = backend.Exact(gv, c.side, c.r);
    ASSERT_TRUE(exact.ok()) << exact.status();
    const double tail = TailEnergy(exact->singular_values, c.r);
    ASSERT_GT(tail, 1e-3 * FrobeniusSquared(gv));  // a real tail, not the zero-ish rule

    const double rho_exact = ResidualRatio(gv, exact->vectors.data(), c.r, c.side, tail);
    EXPECT_LE(rho_exact, 1.0 + 1e-4);
    EXPECT_GE(rho_exact, 1.0 - 1e-4);

    absl::StatusOr<TopSingular> cold = backend.Randomized(gv, c.side, c.r, {}, {});
    ASSERT_TRUE(cold.ok()) << cold.status();
    EXPECT_FALSE(cold->full_spectrum);
    EXPECT_EQ(cold->singular_values.size(), static_cast<size_t>(c.r + 10));
    EXPECT_LE(ResidualRatio(gv, cold->vectors.data(), c.r, c.side, tail), 1.05);
    EXPECT_LE(OrthogonalityError(cold->vectors.data(), cold->side_dim, c.r), 1e-5);
    // Sketch singular values are lower bounds of the true ones, and close at the top.
    for (int64_t i = 0; i < c.r; ++i) {
      EXPECT_LE(cold->singular_values[i], exact->singular_values[i] * (1 + 1e-5) + 1e-6);
    }
    EXPECT_NEAR(cold->singular_values[0], exact->singular_values[0], 1e-4);

    const DenseMatrix warm{exact->vectors.data(), exact->side_dim, c.r};
    RandomizedOptions one_pass;
    one_pass.power_iterations = 0;
    absl::StatusOr<TopSingular> warmed = backend.Randomized(gv, c.side, c.r, one_pass, warm);
    ASSERT_TRUE(warmed.ok()) << warmed.status();
    EXPECT_LE(ResidualRatio(gv, warmed->vectors.data(), c.r, c.side, tail), 1.05);
    EXPECT_LE(OrthogonalityError(warmed->vectors.data(), warmed->side_dim, c.r), 1e-5);
  }
}

TEST(LapackBackendTest, ExactAndRandomizedAgreeAcrossASpectralGapOfTwo) {
  const LapackSvdBackend backend;
  const int64_t r = 24;
  // sigma_1..sigma_r from 10 down to ~3, then a gap of exactly 2, then a decaying tail + noise.
  std::vector<double> s = GeometricSpectrum(r, 10.0, 0.95);
  const std::vector<double> tail = GeometricSpectrum(100, s.back() / 2.0, 0.9);
  s.insert(s.end(), tail.begin(), tail.end());
  for (const Case& c : {Case{300, 500, r, VectorSide::kLeft}, Case{300, 500, r, VectorSide::kRight},
                        Case{500, 300, r, VectorSide::kLeft}}) {
    const std::vector<float> g = LowRankPlusNoise(c.m, c.n, s, 1e-3, 5);
    const DenseMatrix gv{g.data(), c.m, c.n};
    absl::StatusOr<TopSingular> exact = backend.Exact(gv, c.side, c.r);
    ASSERT_TRUE(exact.ok());
    EXPECT_GE(exact->singular_values[r - 1] / exact->singular_values[r], 1.9);
    absl::StatusOr<TopSingular> approx = backend.Randomized(gv, c.side, c.r, {}, {});
    ASSERT_TRUE(approx.ok());
    const double sine =
        MaxPrincipalAngleSine(exact->vectors.data(), approx->vectors.data(), exact->side_dim, r);
    EXPECT_LE(sine, 1e-3);
    // The metric itself: ~0 (the basis's own orthogonality error) against itself, and large
    // against a basis from a different matrix.
    EXPECT_LE(
        MaxPrincipalAngleSine(exact->vectors.data(), exact->vectors.data(), exact->side_dim, r),
        1e-5);
    const std::vector<float> other = RandomOrthonormal(exact->side_dim, r, 99);
    EXPECT_GT(MaxPrincipalAngleSine(exact->vectors.data(), other.data(), exact->side_dim, r), 0.5);
  }
}

TEST(LapackBackendTest, WarmStartNeedsFewerPowerIterations) {
  const LapackSvdBackend backend;
  const int64_t m = 400, n = 600, r = 32;
  // Slow decay and a small gap: a cold sketch needs several power iterations here.
  const std::vector<double> s = GeometricSpectrum(200, 10.0, 0.985);
  const std::vector<float> g1 = LowRankPlusNoise(m, n, s, 0.01, 21);
  std::vector<float> g2 = g1;  // next refresh: the same gradient plus a small change
  const std::vector<float> change =
      LowRankPlusNoise(m, n, GeometricSpectrum(40, 0.3, 0.95), 0.0, 22);
  for (size_t i = 0; i < g2.size(); ++i) g2[i] += change[i];
  const DenseMatrix gv1{g1.data(), m, n}, gv2{g2.data(), m, n};

  absl::StatusOr<TopSingular> previous = backend.Exact(gv1, VectorSide::kLeft, r);
  absl::StatusOr<TopSingular> target = backend.Exact(gv2, VectorSide::kLeft, r);
  ASSERT_TRUE(previous.ok() && target.ok());
  const double tail = TailEnergy(target->singular_values, r);
  auto error = [&](int q, bool warm) {
    RandomizedOptions options;
    options.power_iterations = q;
    absl::StatusOr<TopSingular> t =
        backend.Randomized(gv2, VectorSide::kLeft, r, options,
                           warm ? DenseMatrix{previous->vectors.data(), m, r} : DenseMatrix{});
    EXPECT_TRUE(t.ok());
    return ResidualRatio(gv2, t->vectors.data(), r, VectorSide::kLeft, tail) - 1.0;
  };
  const double warm0 = error(0, true), warm1 = error(1, true);
  const double cold1 = error(1, false), cold2 = error(2, false), cold4 = error(4, false);
  // Warm with q iterations beats cold with q + 1 (one pass more than warm uses) and more.
  EXPECT_LT(warm0, cold1);
  EXPECT_LT(warm0, cold2);
  EXPECT_LT(warm1, cold4);
  EXPECT_LE(warm1, 0.01);
  EXPECT_GT(cold1, 0.01);  // the problem is hard enough for the comparison to mean something
}

TEST(LapackBackendTest, FullRankAndSeedDeterminism) {
  const LapackSvdBackend backend;
  const std::vector<float> g = DecayingWithNoise(50, 20, 9);
  const DenseMatrix gv{g.data(), 50, 20};
  absl::StatusOr<TopSingular> full = backend.Randomized(gv, VectorSide::kRight, 20, {}, {});
  ASSERT_TRUE(full.ok());
  EXPECT_EQ(full->singular_values.size(), 20u);  // l clamped to min(m, n)
  EXPECT_LE(OrthogonalityError(full->vectors.data(), 20, 20), 1e-5);
  absl::StatusOr<TopSingular> again = backend.Randomized(gv, VectorSide::kRight, 20, {}, {});
  EXPECT_EQ(full->vectors, again->vectors);
}

TEST(LapackBackendTest, RejectsBadRanksAndWarmStarts) {
  const LapackSvdBackend backend;
  const std::vector<float> g(6 * 4, 1.0f);
  const DenseMatrix gv{g.data(), 6, 4};
  EXPECT_EQ(backend.Exact(gv, VectorSide::kLeft, 0).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.Exact(gv, VectorSide::kLeft, 5).status().code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(backend.Exact({nullptr, 6, 4}, VectorSide::kLeft, 1).status().code(),
            absl::StatusCode::kInvalidArgument);
  const std::vector<float> wrong(4 * 2, 0.5f);  // right-side height used on the left side
  EXPECT_EQ(backend.Randomized(gv, VectorSide::kLeft, 2, {}, {wrong.data(), 4, 2}).status().code(),
            absl::StatusCode::kInvalidArgument);
  RandomizedOptions negative;
  negative.oversampling = -1;
  EXPECT_EQ(backend.Randomized(gv, VectorSide::kLeft, 2, negative, {}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(LapackBackendTest, BlasThreadsForSplitsTheCores) {
  EXPECT_GE(BlasThreadsFor(1), 1);
  EXPECT_EQ(BlasThreadsFor(1000), 1);
  EXPECT_GE(BlasThreadsFor(1), BlasThreadsFor(2));
}

}  // namespace
}  // namespace offloadd::projector
