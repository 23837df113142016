#include "server/projector/projector.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
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

absl::Status NonFiniteError(const char* what, float value, int64_t row, int64_t col) {
  return absl::InvalidArgumentError(absl::StrCat(
      what, " has a non-finite value (", std::isnan(value) ? "NaN" : "Inf", ") at row ", row,
      ", column ", col, " (first bad row: ", row,
      "); skip this refresh and keep the previous projector, or fix the gradient (loss scaling "
      "/ overflow upstream)"));
}

// Checks one fp32 row for NaN/Inf (a branch-free pass, then a search only on failure) and
// raises *peak to its max|x|.
absl::Status ScanRow(const float* row, int64_t cols, int64_t row_index, const char* what,
                     float* peak) {
  constexpr float kMax = std::numeric_limits<float>::max();
  bool bad = false;
  float top = *peak;
  for (int64_t j = 0; j < cols; ++j) {
    const float a = std::fabs(row[j]);
    bad |= !(a <= kMax);  // NaN compares false
    top = a > top ? a : top;
  }
  if (bad) {
    for (int64_t j = 0; j < cols; ++j) {
      if (!std::isfinite(row[j])) return NonFiniteError(what, row[j], row_index, j);
    }
  }
  *peak = top;
  return absl::OkStatus();
}

// Converts `matrix` to fp32 in `out` (shape.rows * shape.cols floats) row by row, stopping at the
// first NaN/Inf; *max_abs gets max|x|.
absl::Status ConvertFinite(const HostMatrix& matrix, Shape shape, const char* what, float* out,
                           float* max_abs) {
  const size_t row_bytes = shape.cols * ElementSizeBytes(matrix.dtype);
  const auto* src = static_cast<const unsigned char*>(matrix.data);
  float peak = 0.0f;
  for (int64_t i = 0; i < shape.rows; ++i) {
    float* row = out + i * shape.cols;
    ConvertToFloat32(src + i * row_bytes, matrix.dtype, shape.cols, row);
    if (absl::Status s = ScanRow(row, shape.cols, i, what, &peak); !s.ok()) return s;
  }
  *max_abs = peak;
  return absl::OkStatus();
}

// Inside [2^-kSafeExponent, 2^kSafeExponent) max|G| needs no rescaling: squares and the products
// of the SVD stay well inside fp32's normal range.
constexpr int kSafeExponent = 50;

}  // namespace

float* RefreshScratch::GradientBuffer(size_t count) {
  if (count > capacity_) {
    gradient_.reset();  // release before allocating: never hold both
    capacity_ = 0;      // stays right if the allocation throws
    gradient_.reset(new float[count]);
    capacity_ = count;
  }
  return gradient_.get();
}

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

namespace {
// rank, the randomized options and warm_start.
absl::Status CheckRefreshOptions(const RefreshRequest& request) {
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
  return absl::OkStatus();
}

// The previous projector in fp32 into `previous`; returns its column count (its old rank).
// Its rows must match `result`'s side (m x n is G's shape).
absl::StatusOr<int64_t> ReadPreviousProjector(const RefreshRequest& request,
                                              const RefreshResult& result, int64_t m, int64_t n,
                                              std::vector<float>* previous) {
  const int64_t side_dim = result.projector_rows;
  absl::StatusOr<Shape> p_shape = CheckMatrix(request.previous_projector, "previous_projector");
  if (!p_shape.ok()) return p_shape.status();
  if (p_shape->rows != side_dim) {
    return absl::InvalidArgumentError(absl::StrCat(
        "previous_projector has ", p_shape->rows, " rows; this gradient (", m, " x ", n,
        ") projects on the ", result.vector_side == VectorSide::kLeft ? "left" : "right",
        " side and needs ", side_dim, " rows — was the side or the shape changed?"));
  }
  previous->resize(p_shape->rows * p_shape->cols);
  float unused;
  absl::Status s = ConvertFinite(request.previous_projector, *p_shape, "previous_projector",
                                 previous->data(), &unused);
  if (!s.ok()) return s;
  return p_shape->cols;
}

// G in fp32 into *g, checked finite, with max|G| in *max_abs: aligned fp32 input is scanned in
// place and used as is (no copy, no fresh pages); other inputs are converted into `buffers`.
absl::Status GradientAsFloat32(const RefreshRequest& request, Shape shape,
                               RefreshScratch& buffers, const float** g, float* max_abs) {
  const int64_t m = shape.rows, n = shape.cols;
  const size_t count = static_cast<size_t>(m * n);
  const bool in_place = request.gradient.dtype == DType::kFloat32 &&
                        reinterpret_cast<uintptr_t>(request.gradient.data) % alignof(float) == 0;
  if (in_place) {
    *g = static_cast<const float*>(request.gradient.data);
    for (int64_t i = 0; i < m; ++i) {
      if (absl::Status s = ScanRow(*g + i * n, n, i, "gradient", max_abs); !s.ok()) return s;
    }
  } else {
    float* converted = buffers.GradientBuffer(count);
    if (absl::Status s = ConvertFinite(request.gradient, shape, "gradient", converted, max_abs);
        !s.ok()) {
      return s;
    }
    *g = converted;
  }
  return absl::OkStatus();
}

// Out of the safe range (e.g. entries of 1e30, whose squares overflow fp32, or subnormals),
// scales G (count entries at *g) by an exact power of two so max|G| is in [0.5, 1), pointing *g
// at the scaled copy in `buffers`; the factor is applied in double since for subnormal inputs it
// exceeds fp32's range. Returns the exponent to scale results back by (0: G unchanged).
int ScaleToSafeRange(float max_abs, size_t count, RefreshScratch& buffers, const float** g) {
  int exponent = 0;
  std::frexp(max_abs, &exponent);
  if (exponent > -kSafeExponent && exponent <= kSafeExponent) {
    exponent = 0;
  } else {
    float* scaled = buffers.GradientBuffer(count);  // same buffer when G was converted into it
    const double scale = std::ldexp(1.0, -exponent);
    for (size_t i = 0; i < count; ++i) scaled[i] = static_cast<float>((*g)[i] * scale);
    *g = scaled;
  }
  return exponent;
}

// Fills `result`'s singular values and quality metrics from the SVD of the scaled G `gs` and the
// projector as written (`written`, fp32); `unscale` undoes ScaleToSafeRange.
void Measure(const RefreshRequest& request, const DenseMatrix& gs, const TopSingular& svd,
             const std::vector<float>& written, double unscale, RefreshResult* out) {
  RefreshResult& result = *out;
  const int64_t r = result.effective_rank, side_dim = result.projector_rows;
  const double total_scaled = FrobeniusSquared(gs);
  double head_scaled = 0.0, beyond_head_scaled = 0.0;
  const std::vector<float>& sv = svd.singular_values;
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
      svd.full_spectrum ? beyond_head_scaled : std::max(0.0, total_scaled - head_scaled);
  const double gradient_fro_scaled = std::sqrt(total_scaled);

  result.gradient_fro = gradient_fro_scaled * unscale;
  result.captured_energy = std::min(1.0, head_scaled / total_scaled);
  result.residual_fro = residual_scaled * unscale;
  result.tail_energy_lower = lower_scaled * unscale * unscale;
  result.tail_energy_upper = upper_scaled * unscale * unscale;
  // The zero-ish-tail rule is monotone in the tail, so a lower tail gives an upper rho.
  result.residual_ratio_upper_bound =
      ResidualRatioFromNorms(residual_scaled, lower_scaled, gradient_fro_scaled);
  result.residual_ratio = svd.full_spectrum ? result.residual_ratio_upper_bound : std::nan("");
  result.orthogonality_error = OrthogonalityError(written.data(), side_dim, r);
}

}  // namespace

absl::StatusOr<RefreshResult> RefreshProjector(const RefreshRequest& request,
                                               const SvdBackend& backend, RefreshScratch* scratch) {
  const Clock::time_point start = Clock::now();
  absl::StatusOr<Shape> g_shape = CheckMatrix(request.gradient, "gradient");
  if (!g_shape.ok()) return g_shape.status();
  const int64_t m = g_shape->rows, n = g_shape->cols;
  if (absl::Status s = CheckRefreshOptions(request); !s.ok()) return s;
  const bool randomized = request.method == SvdMethod::kRandomized;
  const bool has_previous = request.previous_projector.data != nullptr;

  RefreshResult result;
  result.vector_side = ResolveSide(request.side, m, n);
  result.effective_rank = std::min(request.rank, std::min(m, n));
  result.projector_rows = result.vector_side == VectorSide::kLeft ? m : n;
  result.projector_dtype = request.gradient.dtype;
  const int64_t r = result.effective_rank, side_dim = result.projector_rows;

  std::vector<float> previous;
  int64_t r_old = 0;
  if (has_previous) {
    absl::StatusOr<int64_t> cols = ReadPreviousProjector(request, result, m, n, &previous);
    if (!cols.ok()) return cols.status();
    r_old = *cols;
  }

  RefreshScratch local_scratch;
  RefreshScratch& buffers = scratch != nullptr ? *scratch : local_scratch;
  const float* g = nullptr;
  float max_abs = 0.0f;
  if (absl::Status s = GradientAsFloat32(request, *g_shape, buffers, &g, &max_abs); !s.ok()) {
    return s;
  }
  if (max_abs == 0.0f) {
    result.degenerate = true;
    result.elapsed_seconds = SecondsSince(start);
    return result;
  }
  const int exponent = ScaleToSafeRange(max_abs, static_cast<size_t>(m * n), buffers, &g);
  const double unscale = std::ldexp(1.0, exponent);
  const DenseMatrix gs{g, m, n};

  const Clock::time_point svd_start = Clock::now();
  absl::StatusOr<TopSingular> svd =
      randomized
          ? backend.Randomized(
                gs, result.vector_side, r, request.randomized,
                request.warm_start ? DenseMatrix{previous.data(), side_dim, r_old} : DenseMatrix{})
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
  Measure(request, gs, *svd, written, unscale, &result);
  if (has_previous) {
    result.has_similarity = true;
    result.similarity = Similarity(written.data(), r, previous.data(), r_old, side_dim);
  }
  result.elapsed_seconds = SecondsSince(start);
  return result;
}

}  // namespace offloadd::projector
