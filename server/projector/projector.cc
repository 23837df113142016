#include "server/projector/projector.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "server/projector/subspace_metrics.h"

namespace offloadd::projector {
namespace {

using Clock = std::chrono::steady_clock;

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

struct Shape {
  int64_t rows = 0;
  int64_t cols = 0;
};

absl::StatusOr<Shape> CheckMatrix(const HostMatrix& matrix, const char* what) {
  if (matrix.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has shape [", absl::StrJoin(matrix.shape, ", "),
        "]; a projector refresh needs a 2-D matrix (rows, cols) — skip 1-D parameters such as "
        "biases and norms, and reshape higher-rank tensors to 2-D"));
  }
  const Shape shape{matrix.shape[0], matrix.shape[1]};
  if (shape.rows < 1 || shape.cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat(what, " has shape [", shape.rows, ", ",
                                                   shape.cols, "]; both dims must be >= 1"));
  }
  const int64_t kMaxElements = std::numeric_limits<int64_t>::max() / 8;
  if (shape.rows > kMaxElements / shape.cols) {
    return absl::InvalidArgumentError(absl::StrCat(what, " shape overflows"));
  }
  const size_t expected =
      static_cast<size_t>(shape.rows * shape.cols) * ElementSizeBytes(matrix.dtype);
  if (matrix.data == nullptr || matrix.size_bytes != expected) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " carries ", matrix.data == nullptr ? 0 : matrix.size_bytes, " bytes; shape [",
        shape.rows, ", ", shape.cols, "] in ", DTypeName(matrix.dtype), " needs ", expected));
  }
  return shape;
}

// Converts to fp32 row by row, stopping at the first NaN/Inf; returns max|x| in *max_abs.
absl::Status ConvertFinite(const HostMatrix& matrix, Shape shape, const char* what,
                           std::vector<float>* out, float* max_abs) {
  out->resize(shape.rows * shape.cols);
  const size_t row_bytes = shape.cols * ElementSizeBytes(matrix.dtype);
  const auto* src = static_cast<const unsigned char*>(matrix.data);
  float peak = 0.0f;
  for (int64_t i = 0; i < shape.rows; ++i) {
    float* row = out->data() + i * shape.cols;
    ConvertToFloat32(src + i * row_bytes, matrix.dtype, shape.cols, row);
    for (int64_t j = 0; j < shape.cols; ++j) {
      if (!std::isfinite(row[j])) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " has a non-finite value (", std::isnan(row[j]) ? "NaN" : "Inf", ") at row ", i,
            ", column ", j, " (first bad row: ", i,
            "); skip this refresh and keep the previous projector, or fix the gradient "
            "(loss scaling / overflow upstream)"));
      }
      peak = std::max(peak, std::fabs(row[j]));
    }
  }
  *max_abs = peak;
  return absl::OkStatus();
}

}  // namespace

VectorSide ResolveSide(ProjectionSide side, int64_t rows, int64_t cols) {
  switch (side) {
    case ProjectionSide::kStd:
      return rows >= cols ? VectorSide::kRight : VectorSide::kLeft;
    case ProjectionSide::kReverseStd:
      return rows >= cols ? VectorSide::kLeft : VectorSide::kRight;
    case ProjectionSide::kLeft:
      return VectorSide::kLeft;
    case ProjectionSide::kRight:
      return VectorSide::kRight;
  }
  return VectorSide::kLeft;
}

absl::StatusOr<RefreshResult> RefreshProjector(const RefreshRequest& request,
                                               const SvdBackend& backend) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<Shape> g_shape = CheckMatrix(request.gradient, "gradient");
  if (!g_shape.ok()) return g_shape.status();
  const int64_t m = g_shape->rows, n = g_shape->cols;
  if (request.rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank is ", request.rank, "; ask for a rank >= 1"));
  }
  const bool randomized = request.method == SvdMethod::kRandomized;
  if (randomized &&
      (request.randomized.oversampling < 0 || request.randomized.power_iterations < 0)) {
    return absl::InvalidArgumentError("randomized oversampling and power_iterations must be >= 0");
  }
  const bool has_previous = request.previous_projector.data != nullptr;
  if (request.warm_start && (!randomized || !has_previous)) {
    return absl::InvalidArgumentError(
        "warm_start needs method RANDOMIZED and a previous_projector; drop warm_start or "
        "supply both");
  }

  RefreshResult result;
  result.vector_side = ResolveSide(request.side, m, n);
  result.effective_rank = std::min(request.rank, std::min(m, n));
  result.projector_rows = result.vector_side == VectorSide::kLeft ? m : n;
  result.projector_dtype = request.gradient.dtype;
  const int64_t r = result.effective_rank, side_dim = result.projector_rows;

  std::vector<float> previous;
  int64_t r_old = 0;
  if (has_previous) {
    absl::StatusOr<Shape> p_shape = CheckMatrix(request.previous_projector, "previous_projector");
    if (!p_shape.ok()) return p_shape.status();
    if (p_shape->rows != side_dim) {
      return absl::InvalidArgumentError(absl::StrCat(
          "previous_projector has ", p_shape->rows, " rows; this gradient (", m, " x ", n,
          ") projects on the ", result.vector_side == VectorSide::kLeft ? "left" : "right",
          " side and needs ", side_dim, " rows — was the side or the shape changed?"));
    }
    float unused;
    absl::Status s = ConvertFinite(request.previous_projector, *p_shape, "previous_projector",
                                   &previous, &unused);
    if (!s.ok()) return s;
    r_old = p_shape->cols;
  }

  std::vector<float> g;
  float max_abs = 0.0f;
  if (absl::Status s = ConvertFinite(request.gradient, *g_shape, "gradient", &g, &max_abs);
      !s.ok()) {
    return s;
  }
  if (max_abs == 0.0f) {
    result.degenerate = true;
    result.elapsed_seconds = SecondsSince(start);
    return result;
  }
  // Scale by an exact power of two so max|G| is in [0.5, 1): sums of squares cannot overflow or
  // underflow. The factor is applied in double: for subnormal inputs it exceeds fp32's range.
  int exponent = 0;
  std::frexp(max_abs, &exponent);
  const double scale = std::ldexp(1.0, -exponent);
  for (float& x : g) x = static_cast<float>(x * scale);
  const double unscale = std::ldexp(1.0, exponent);
  const DenseMatrix gs{g.data(), m, n};

  const Clock::time_point svd_start = Clock::now();
  absl::StatusOr<TopSingular> svd =
      randomized ? backend.Randomized(gs, result.vector_side, r, request.randomized,
                                      request.warm_start
                                          ? DenseMatrix{previous.data(), side_dim, r_old}
                                          : DenseMatrix{})
                 : backend.Exact(gs, result.vector_side, r);
  result.svd_seconds = SecondsSince(svd_start);
  if (!svd.ok()) return svd.status();

  // Round to the output dtype, then read back what was written: all metrics describe it.
  result.projector_bytes.resize(side_dim * r * ElementSizeBytes(result.projector_dtype));
  ConvertFromFloat32(svd->vectors.data(), side_dim * r, result.projector_dtype,
                     result.projector_bytes.data());
  std::vector<float> written(side_dim * r);
  ConvertToFloat32(result.projector_bytes.data(), result.projector_dtype, side_dim * r,
                   written.data());

  const double total_scaled = FrobeniusSquared(gs);
  double head_scaled = 0.0, beyond_head_scaled = 0.0;
  const std::vector<float>& sv = svd->singular_values;
  for (size_t i = 0; i < sv.size(); ++i) {
    const double s2 = static_cast<double>(sv[i]) * sv[i];
    if (static_cast<int64_t>(i) < r) {
      head_scaled += s2;
      result.singular_values.push_back(sv[i] * unscale);
    } else {
      beyond_head_scaled += s2;
    }
  }
  const double residual_scaled = request.measure_residual
                                     ? ResidualFro(gs, written.data(), r, result.vector_side)
                                     : std::nan("");
  // Exact: the tail is summed from the spectrum (no cancellation). Randomized: the sketch's
  // values beyond r bound the true tail from below, ||G||^2 - head bounds it from above.
  const double lower_scaled = beyond_head_scaled;
  const double upper_scaled =
      svd->full_spectrum ? beyond_head_scaled : std::max(0.0, total_scaled - head_scaled);
  const double gradient_fro_scaled = std::sqrt(total_scaled);

  result.gradient_fro = gradient_fro_scaled * unscale;
  result.captured_energy = std::min(1.0, head_scaled / total_scaled);
  result.residual_fro = residual_scaled * unscale;
  result.tail_energy_lower = lower_scaled * unscale * unscale;
  result.tail_energy_upper = upper_scaled * unscale * unscale;
  // The zero-ish-tail rule is monotone in the tail, so a lower tail gives an upper rho.
  result.residual_ratio_upper_bound =
      ResidualRatioFromNorms(residual_scaled, lower_scaled, gradient_fro_scaled);
  result.residual_ratio =
      svd->full_spectrum ? result.residual_ratio_upper_bound : std::nan("");
  result.orthogonality_error = OrthogonalityError(written.data(), side_dim, r);
  if (has_previous) {
    result.has_similarity = true;
    result.similarity = Similarity(written.data(), r, previous.data(), r_old, side_dim);
  }
  result.elapsed_seconds = SecondsSince(start);
  return result;
}

}  // namespace offloadd::projector
