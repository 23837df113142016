#include "server/projector/projector.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/projector/lapack_backend.h"
#include "server/projector/subspace_metrics.h"
#include "server/projector/synthetic.h"

namespace offloadd::projector {
namespace {

// A gradient held in host bytes of some dtype, as the service will receive it.
struct Gradient {
  std::vector<uint8_t> bytes;
  int64_t rows = 0, cols = 0;
  DType dtype = DType::kFloat32;
  HostMatrix View() const { return {bytes.data(), bytes.size(), {rows, cols}, dtype}; }
};

Gradient Encode(const std::vector<float>& values, int64_t rows, int64_t cols,
                DType dtype = DType::kFloat32) {
  Gradient g{std::vector<uint8_t>(values.size() * ElementSizeBytes(dtype)), rows, cols, dtype};
  ConvertFromFloat32(values.data(), values.size(), dtype, g.bytes.data());
  return g;
}

std::vector<float> Decode(const RefreshResult& result) {
  std::vector<float> p(result.projector_rows * result.effective_rank);
  ConvertToFloat32(result.projector_bytes.data(), result.projector_dtype, p.size(), p.data());
  return p;
}

std::vector<float> Decaying(int64_t m, int64_t n, uint64_t seed) {
  return LowRankPlusNoise(m, n, GeometricSpectrum(std::min(m, n) / 2, 10.0, 0.93), 0.002, seed);
}

RefreshRequest Request(const Gradient& g, int64_t rank, ProjectionSide side,
                       SvdMethod method = SvdMethod::kExact) {
  RefreshRequest request;
  request.gradient = g.View();
  request.rank = rank;
  request.side = side;
  request.method = method;
  return request;
}

class ProjectorTest : public ::testing::Test {
 protected:
  absl::StatusOr<RefreshResult> Refresh(const RefreshRequest& request) {
    return RefreshProjector(request, backend_);
  }
  LapackSvdBackend backend_;
};

TEST_F(ProjectorTest, SideSemanticsFollowTheReferenceProjectionTypes) {
  struct Expect {
    int64_t m, n;
    ProjectionSide side;
    VectorSide vectors;
  };
  const Expect table[] = {
      {64, 32, ProjectionSide::kStd, VectorSide::kRight},  // tall: right, n x r
      {32, 64, ProjectionSide::kStd, VectorSide::kLeft},   // wide: left, m x r
      {48, 48, ProjectionSide::kStd, VectorSide::kRight},  // square counts as m >= n
      {64, 32, ProjectionSide::kReverseStd, VectorSide::kLeft},
      {32, 64, ProjectionSide::kReverseStd, VectorSide::kRight},
      {48, 48, ProjectionSide::kReverseStd, VectorSide::kLeft},
      {64, 32, ProjectionSide::kLeft, VectorSide::kLeft},
      {32, 64, ProjectionSide::kRight, VectorSide::kRight},
  };
  for (const Expect& e : table) {
    SCOPED_TRACE(testing::Message() << e.m << "x" << e.n << " side " << static_cast<int>(e.side));
    EXPECT_EQ(ResolveSide(e.side, e.m, e.n), e.vectors);
    const std::vector<float> values = Decaying(e.m, e.n, 4);
    const Gradient g = Encode(values, e.m, e.n);
    absl::StatusOr<RefreshResult> result = Refresh(Request(g, 8, e.side));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->vector_side, e.vectors);
    EXPECT_EQ(result->projector_rows, e.vectors == VectorSide::kLeft ? e.m : e.n);
    EXPECT_EQ(result->effective_rank, 8);
    ASSERT_EQ(result->projector_bytes.size(), static_cast<size_t>(result->projector_rows * 8 * 4));
    // The low-rank gradient (P^T G or G P) keeps exactly the top-8 energy of the spectrum.
    const std::vector<float> p = Decode(*result);
    double head = 0.0;
    for (double s : result->singular_values) head += s * s;
    EXPECT_NEAR(ProjectedEnergy({values.data(), e.m, e.n}, p.data(), 8, e.vectors), head,
                1e-4 * head);
    EXPECT_LE(result->orthogonality_error, 1e-5);
    EXPECT_NEAR(result->residual_ratio, 1.0, 1e-3);
  }
}

TEST_F(ProjectorTest, RankAboveMinDimIsClampedAndReported) {
  const std::vector<float> values = Decaying(40, 30, 6);
  const Gradient g = Encode(values, 40, 30);
  for (SvdMethod method : {SvdMethod::kExact, SvdMethod::kRandomized}) {
    absl::StatusOr<RefreshResult> result = Refresh(Request(g, 100, ProjectionSide::kStd, method));
    ASSERT_TRUE(result.ok()) << result.status();
    EXPECT_EQ(result->effective_rank, 30);
    EXPECT_EQ(result->projector_rows, 30);  // std, tall: right vectors, n x r
    EXPECT_EQ(result->singular_values.size(), 30u);
    EXPECT_NEAR(result->captured_energy, 1.0, 1e-5);
    // Full rank: the tail is zero, the zero-ish rule gives rho = 1 and the residual is tiny.
    EXPECT_EQ(result->residual_ratio_upper_bound, 1.0);
    EXPECT_LE(result->residual_fro, 1e-5 * result->gradient_fro);
    EXPECT_LE(result->orthogonality_error, 1e-5);
  }
  absl::StatusOr<RefreshResult> left = Refresh(Request(g, 31, ProjectionSide::kLeft));
  ASSERT_TRUE(left.ok());
  EXPECT_EQ(left->effective_rank, 30);
  EXPECT_EQ(left->projector_rows, 40);
}

TEST_F(ProjectorTest, EveryMethodMeetsRhoAndOrthogonalityTargets) {
  const int64_t m = 512, n = 1024, r = 64;
  const std::vector<float> values = Decaying(m, n, 8);
  const Gradient g = Encode(values, m, n);
  const DenseMatrix gv{values.data(), m, n};
  absl::StatusOr<RefreshResult> exact = Refresh(Request(g, r, ProjectionSide::kStd));
  ASSERT_TRUE(exact.ok());
  const double true_tail = exact->tail_energy_lower;
  EXPECT_EQ(exact->tail_energy_lower, exact->tail_energy_upper);
  EXPECT_LE(exact->residual_ratio, 1.05);
  EXPECT_NEAR(exact->residual_ratio, 1.0, 1e-4);
  // Captured energy + tail = everything.
  EXPECT_NEAR(exact->captured_energy + true_tail / (exact->gradient_fro * exact->gradient_fro), 1.0,
              1e-5);

  RefreshRequest cold = Request(g, r, ProjectionSide::kStd, SvdMethod::kRandomized);
  RefreshRequest warm = cold;
  const Gradient previous = Encode(Decode(*exact), m, r);
  warm.previous_projector = previous.View();
  warm.warm_start = true;
  warm.randomized.power_iterations = 0;
  for (const RefreshRequest& request : {cold, warm}) {
    absl::StatusOr<RefreshResult> result = Refresh(request);
    ASSERT_TRUE(result.ok()) << result.status();
    const std::vector<float> p = Decode(*result);
    const double rho = ResidualRatio(gv, p.data(), r, result->vector_side, true_tail);
    EXPECT_LE(rho, 1.05);
    EXPECT_TRUE(std::isnan(result->residual_ratio));  // true tail unknown to a randomized run
    EXPECT_GE(result->residual_ratio_upper_bound, rho - 1e-6);
    // The bounds hold up to fp32 rounding of the singular values (~1e-6 ||G||_F^2).
    const double slack = 1e-6 * result->gradient_fro * result->gradient_fro;
    EXPECT_LE(result->tail_energy_lower, true_tail + slack);
    EXPECT_GE(result->tail_energy_upper, true_tail - slack);
    EXPECT_LT(result->tail_energy_lower, 0.9 * true_tail);  // p = 10 sees only part of the tail
    EXPECT_NEAR(result->residual_fro, ResidualFro(gv, p.data(), r, result->vector_side),
                1e-6 * result->gradient_fro);
    EXPECT_LE(result->orthogonality_error, 1e-5);
  }
}

TEST_F(ProjectorTest, ResidualMeasurementCanBeSkipped) {
  const Gradient g = Encode(Decaying(60, 90, 3), 60, 90);
  RefreshRequest request = Request(g, 8, ProjectionSide::kStd);
  absl::StatusOr<RefreshResult> measured = Refresh(request);
  request.measure_residual = false;
  absl::StatusOr<RefreshResult> skipped = Refresh(request);
  ASSERT_TRUE(measured.ok() && skipped.ok());
  EXPECT_TRUE(std::isnan(skipped->residual_fro));
  EXPECT_TRUE(std::isnan(skipped->residual_ratio));
  EXPECT_TRUE(std::isnan(skipped->residual_ratio_upper_bound));
  EXPECT_GT(measured->residual_fro, 0.0);
  EXPECT_EQ(skipped->projector_bytes, measured->projector_bytes);
  EXPECT_EQ(skipped->tail_energy_lower, measured->tail_energy_lower);
}

TEST_F(ProjectorTest, HalfPrecisionInputsComputeInFp32AndReportErrorAfterTheCast) {
  const int64_t m = 96, n = 160, r = 16;
  const std::vector<float> values = Decaying(m, n, 12);
  for (DType dtype : {DType::kBFloat16, DType::kFloat16}) {
    SCOPED_TRACE(DTypeName(dtype));
    const Gradient half = Encode(values, m, n, dtype);
    // The same values in fp32: what the refresh must compute on.
    std::vector<float> widened(values.size());
    ConvertToFloat32(half.bytes.data(), dtype, widened.size(), widened.data());
    const Gradient wide = Encode(widened, m, n);
    absl::StatusOr<RefreshResult> from_half = Refresh(Request(half, r, ProjectionSide::kStd));
    absl::StatusOr<RefreshResult> from_wide = Refresh(Request(wide, r, ProjectionSide::kStd));
    ASSERT_TRUE(from_half.ok() && from_wide.ok());
    EXPECT_EQ(from_half->projector_dtype, dtype);
    ASSERT_EQ(from_half->projector_bytes.size(), static_cast<size_t>(m * r * 2));  // left, m x r
    // Bytes: the fp32 projector rounded to nearest even, nothing else.
    std::vector<uint8_t> expected(m * r * 2);
    std::vector<float> p32 = Decode(*from_wide);
    ConvertFromFloat32(p32.data(), p32.size(), dtype, expected.data());
    EXPECT_EQ(from_half->projector_bytes, expected);
    EXPECT_EQ(from_half->singular_values, from_wide->singular_values);
    // Orthogonality is measured on the rounded projector: larger than fp32's, within the bound
    // 2 * unit roundoff (bf16 2^-8, fp16 2^-11) plus fp32-level error.
    const std::vector<float> p = Decode(*from_half);
    EXPECT_DOUBLE_EQ(from_half->orthogonality_error, OrthogonalityError(p.data(), m, r));
    const double bound = dtype == DType::kBFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -11);
    EXPECT_LE(from_half->orthogonality_error, bound + 1e-5);
    EXPECT_GT(from_half->orthogonality_error, 10 * from_wide->orthogonality_error);
  }
}

TEST_F(ProjectorTest, NonFiniteValuesAreRejectedNamingTheFirstBadRow) {
  std::vector<float> values = Decaying(20, 12, 2);
  values[7 * 12 + 3] = std::numeric_limits<float>::quiet_NaN();
  values[9 * 12 + 0] = std::numeric_limits<float>::infinity();
  for (DType dtype : {DType::kFloat32, DType::kBFloat16, DType::kFloat16}) {
    const Gradient g = Encode(values, 20, 12, dtype);
    absl::StatusOr<RefreshResult> result = Refresh(Request(g, 4, ProjectionSide::kStd));
    ASSERT_EQ(result.status().code(), absl::StatusCode::kInvalidArgument) << DTypeName(dtype);
    EXPECT_NE(result.status().message().find("NaN) at row 7, column 3"), absl::string_view::npos)
        << result.status();
  }
  values[7 * 12 + 3] = 1.0f;
  const Gradient g = Encode(values, 20, 12);
  absl::StatusOr<RefreshResult> inf = Refresh(Request(g, 4, ProjectionSide::kStd));
  ASSERT_EQ(inf.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(inf.status().message().find("Inf) at row 9, column 0"), absl::string_view::npos)
      << inf.status();
}

TEST_F(ProjectorTest, AllZeroGradientIsDegenerateNotAnError) {
  const Gradient g = Encode(std::vector<float>(30 * 20, 0.0f), 30, 20, DType::kBFloat16);
  RefreshRequest request = Request(g, 4, ProjectionSide::kStd);
  const Gradient previous = Encode(RandomOrthonormal(20, 4, 1), 20, 4);
  request.previous_projector = previous.View();
  absl::StatusOr<RefreshResult> result = Refresh(request);
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_TRUE(result->degenerate);
  EXPECT_TRUE(result->projector_bytes.empty());  // nothing to replace the previous P with
  EXPECT_TRUE(result->singular_values.empty());
  EXPECT_EQ(result->effective_rank, 4);
  EXPECT_EQ(result->projector_rows, 20);
}

TEST_F(ProjectorTest, ShapelessAndMalformedRequestsAreRejected) {
  const std::vector<float> values(24, 1.0f);
  auto code = [&](std::vector<int64_t> shape, size_t bytes, int64_t rank = 2) {
    RefreshRequest request;
    request.gradient = {values.data(), bytes, std::move(shape), DType::kFloat32};
    request.rank = rank;
    return Refresh(request).status().code();
  };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(code({24}, 96), kInvalid);       // 1-D
  EXPECT_EQ(code({}, 96), kInvalid);         // shapeless
  EXPECT_EQ(code({2, 3, 4}, 96), kInvalid);  // 3-D
  EXPECT_EQ(code({0, 24}, 0), kInvalid);     // zero rows
  EXPECT_EQ(code({24, 0}, 0), kInvalid);     // zero cols
  EXPECT_EQ(code({-4, -6}, 96), kInvalid);   // negative dims
  EXPECT_EQ(code({4, 6}, 95), kInvalid);     // byte count mismatch
  EXPECT_EQ(code({4, 6}, 96, 0), kInvalid);  // rank 0
  EXPECT_EQ(code({4, 6}, 96), absl::StatusCode::kOk);

  const Gradient g = Encode(Decaying(8, 6, 1), 8, 6);
  RefreshRequest warm_exact = Request(g, 2, ProjectionSide::kStd);
  warm_exact.warm_start = true;  // exact method and no previous projector
  EXPECT_EQ(Refresh(warm_exact).status().code(), kInvalid);
  RefreshRequest wrong_previous = Request(g, 2, ProjectionSide::kStd);
  const Gradient left_shaped = Encode(RandomOrthonormal(8, 2, 3), 8, 2);  // std here is right: 6
  wrong_previous.previous_projector = left_shaped.View();
  absl::StatusOr<RefreshResult> r = Refresh(wrong_previous);
  EXPECT_EQ(r.status().code(), kInvalid);
  EXPECT_NE(r.status().message().find("needs 6 rows"), absl::string_view::npos) << r.status();
}

TEST_F(ProjectorTest, HugeAndTinyMagnitudesAreRescaledNotOverflowed) {
  const int64_t m = 64, n = 48, r = 6;
  const std::vector<float> base = Decaying(m, n, 14);
  absl::StatusOr<RefreshResult> reference =
      Refresh(Request(Encode(base, m, n), r, ProjectionSide::kStd));
  ASSERT_TRUE(reference.ok());
  float peak = 0.0f;
  for (float x : base) peak = std::max(peak, std::fabs(x));
  // 1e30: squares overflow fp32; 1e38 / peak: even G·P overflows fp32 without rescaling;
  // 1e-30: squares underflow; 1e-39 / peak: the largest entry is an fp32 subnormal.
  for (double factor : {1e30, 1e38 / peak, 1e-30, 1e-39 / peak}) {
    SCOPED_TRACE(factor);
    std::vector<float> scaled(base.size());
    for (size_t i = 0; i < base.size(); ++i) scaled[i] = static_cast<float>(base[i] * factor);
    absl::StatusOr<RefreshResult> result =
        Refresh(Request(Encode(scaled, m, n), r, ProjectionSide::kStd));
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_FALSE(result->degenerate);
    for (int64_t i = 0; i < r; ++i) {
      EXPECT_NEAR(result->singular_values[i] / factor, reference->singular_values[i],
                  1e-4 * reference->singular_values[i]);
    }
    EXPECT_NEAR(result->gradient_fro / factor, reference->gradient_fro,
                1e-5 * reference->gradient_fro);
    EXPECT_TRUE(std::isfinite(result->captured_energy));
    EXPECT_NEAR(result->captured_energy, reference->captured_energy, 1e-5);
    EXPECT_NEAR(result->residual_ratio, 1.0, 1e-3);
    const std::vector<float> p = Decode(*result), q = Decode(*reference);
    EXPECT_LE(MaxPrincipalAngleSine(p.data(), q.data(), n, r), 1e-4);
  }
}

TEST_F(ProjectorTest, SimilarityIsSignAndRotationInvariant) {
  const int64_t m = 80, n = 50, r = 8;
  const std::vector<float> values = Decaying(m, n, 31);
  const Gradient g = Encode(values, m, n);
  absl::StatusOr<RefreshResult> first = Refresh(Request(g, r, ProjectionSide::kLeft));
  ASSERT_TRUE(first.ok());
  const std::vector<float> p = Decode(*first);
  // Same subspace, different basis: flip signs and mix the first two columns by a rotation.
  std::vector<float> rotated = p;
  const float c = std::cos(0.7f), s = std::sin(0.7f);
  for (int64_t i = 0; i < m; ++i) {
    const float a = p[i * r], b = p[i * r + 1];
    rotated[i * r] = c * a - s * b;
    rotated[i * r + 1] = s * a + c * b;
    for (int64_t j = 2; j < r; ++j) rotated[i * r + j] = -p[i * r + j];
  }
  // Half the subspace: the first 4 vectors plus 4 directions orthogonal to all of P.
  std::vector<float> half(m * r, 0.0f);
  const std::vector<float> q = RandomOrthonormal(m, r + 4, 77);
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < 4; ++j) half[i * r + j] = p[i * r + j];
  }
  // Make q's first 4 columns orthogonal to P (one Gram-Schmidt pass against P, renormalised).
  std::vector<float> extra(m * 4);
  for (int64_t j = 0; j < 4; ++j) {
    std::vector<double> v(m);
    for (int64_t i = 0; i < m; ++i) v[i] = q[i * (r + 4) + j];
    for (int pass = 0; pass < 2; ++pass) {
      for (int64_t k = 0; k < r + j; ++k) {
        double dot = 0.0;
        for (int64_t i = 0; i < m; ++i) dot += v[i] * (k < r ? p[i * r + k] : extra[i * 4 + k - r]);
        for (int64_t i = 0; i < m; ++i) v[i] -= dot * (k < r ? p[i * r + k] : extra[i * 4 + k - r]);
      }
    }
    double norm = 0.0;
    for (double x : v) norm += x * x;
    for (int64_t i = 0; i < m; ++i) extra[i * 4 + j] = static_cast<float>(v[i] / std::sqrt(norm));
  }
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < 4; ++j) half[i * r + 4 + j] = extra[i * 4 + j];
  }
  struct Previous {
    std::vector<float> matrix;
    int64_t cols;
    double expected;
  };
  const Previous cases[] = {{p, r, 1.0}, {rotated, r, 1.0}, {half, r, 0.5}, {extra, 4, 0.0}};
  for (const Previous& prev : cases) {
    const Gradient old = Encode(prev.matrix, m, prev.cols);
    RefreshRequest request = Request(g, r, ProjectionSide::kLeft);
    request.previous_projector = old.View();
    absl::StatusOr<RefreshResult> result = Refresh(request);
    ASSERT_TRUE(result.ok()) << result.status();
    ASSERT_TRUE(result->has_similarity);
    EXPECT_NEAR(result->similarity, prev.expected, 1e-5);
  }
}

TEST_F(ProjectorTest, ConcurrentRefreshesMatchSequentialOnes) {
  const int kThreads = 4;
  std::vector<Gradient> grads;
  for (int t = 0; t < kThreads; ++t)
    grads.push_back(Encode(Decaying(200, 150 + 10 * t, t), 200, 150 + 10 * t));
  std::vector<std::vector<uint8_t>> sequential(kThreads), concurrent(kThreads);
  auto run = [&](int t, std::vector<uint8_t>* out) {
    const SvdMethod method = t % 2 ? SvdMethod::kRandomized : SvdMethod::kExact;
    absl::StatusOr<RefreshResult> result =
        Refresh(Request(grads[t], 12, ProjectionSide::kStd, method));
    ASSERT_TRUE(result.ok()) << result.status();
    *out = result->projector_bytes;
  };
  for (int t = 0; t < kThreads; ++t) run(t, &sequential[t]);
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) threads.emplace_back(run, t, &concurrent[t]);
  for (std::thread& th : threads) th.join();
  for (int t = 0; t < kThreads; ++t) {
    ASSERT_EQ(concurrent[t].size(), sequential[t].size());
    std::vector<float> a(concurrent[t].size() / 4), b(a.size());
    ConvertToFloat32(concurrent[t].data(), DType::kFloat32, a.size(), a.data());
    ConvertToFloat32(sequential[t].data(), DType::kFloat32, b.size(), b.data());
    for (size_t i = 0; i < a.size(); ++i) ASSERT_NEAR(a[i], b[i], 1e-5) << t << " " << i;
  }
}

}  // namespace
}  // namespace offloadd::projector
