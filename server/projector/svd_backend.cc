#include "server/projector/svd_backend.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace offloadd::projector {

absl::Status CheckSvdInput(DenseMatrix a, int64_t k, absl::string_view library) {
  if (a.data == nullptr || a.rows < 1 || a.cols < 1) {
    return absl::InvalidArgumentError("SVD input must be a non-empty 2-D matrix");
  }
  const int64_t kMaxInt = std::numeric_limits<int32_t>::max();
  if (a.rows > kMaxInt || a.cols > kMaxInt || a.rows * a.cols > kMaxInt) {
    return absl::InvalidArgumentError(absl::StrCat(
        "matrix ", a.rows, " x ", a.cols, " has more than 2^31 - 1 elements, beyond ", library,
        "'s 32-bit indices; refresh it in blocks or on a 64-bit-index backend"));
  }
  if (k < 1 || k > std::min(a.rows, a.cols)) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank ", k, " outside [1, min(", a.rows, ", ", a.cols, ")]"));
  }
  return absl::OkStatus();
}

}  // namespace offloadd::projector
