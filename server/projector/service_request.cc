#include "server/projector/service_request.h"

#include <algorithm>
#include <limits>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"

namespace offloadd::projector {
namespace {

absl::Status CheckRegion(const copy::RegionSpec& spec, const char* what) {
  const bool shm = !spec.shm_name.empty(), cuda = !spec.cuda_ipc_handle.empty();
  if (!shm && !cuda) {
    return absl::InvalidArgumentError(absl::StrCat(
        what, " has no handle: set shm_name (a POSIX shared-memory object) or cuda_ipc_handle"));
  }
  if (shm && cuda) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " names both a shm object and a CUDA IPC handle: set one"));
  }
  if (spec.size_bytes == 0) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, " has size_bytes 0: give the object's / allocation's size"));
  }
  if (shm) {
    if (absl::Status named = copy::CheckShmRegionName(spec.shm_name); !named.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(what, ": ", named.message()));
    }
  }
  return absl::OkStatus();
}

absl::Status CheckFits(const copy::RegionSpec& spec, uint64_t offset, uint64_t bytes,
                       const char* what) {
  if (offset > spec.size_bytes || bytes > spec.size_bytes - offset) {
    return absl::OutOfRangeError(absl::StrCat(what, " needs ", bytes, " bytes at offset ", offset,
                                              " but its region is ", spec.size_bytes,
                                              " bytes: enlarge the region or lower the offset"));
  }
  return absl::OkStatus();
}

// See RefreshLayout::working_bytes. In double: shapes near the 64-bit limit must not wrap.
uint64_t EstimateWorkingBytes(const ServiceRequest& request, const RefreshLayout& layout) {
  const double m = static_cast<double>(layout.rows), n = static_cast<double>(layout.cols);
  const double k = static_cast<double>(std::min(layout.rows, layout.cols));
  const double r = static_cast<double>(layout.effective_rank);
  double floats = 2 * m * n;  // fp32 G (converted or read in place) + the SVD's copy of it
  if (request.method == SvdMethod::kRandomized) {
    const double l =
        std::min(k, r + static_cast<double>(std::max<int64_t>(0, request.randomized.oversampling)));
    floats += 2 * l * (m + n) + 2 * l * l;  // range and co-range bases, small SVD
  } else {
    floats += k * (m + n) + 5 * k * k;  // U, Vt and sgesdd's workspace
  }
  floats += 2 * r * static_cast<double>(layout.projector_rows);  // P, and the previous P
  const double bytes = static_cast<double>(layout.gradient_bytes) + 4 * floats;
  return bytes >= 1.8e19 ? std::numeric_limits<uint64_t>::max() : static_cast<uint64_t>(bytes);
}

// job_id, parameter_id and step.
absl::Status CheckNameAndStep(const ServiceRequest& request) {
  if (request.parameter_id.empty()) {
    return absl::InvalidArgumentError(
        "parameter_id is empty: name the weight (e.g. its module path) so refreshes of one "
        "parameter can be ordered and de-duplicated");
  }
  if (request.parameter_id.size() > kMaxParameterIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("parameter_id is ", request.parameter_id.size(),
                                                   " bytes; use at most ", kMaxParameterIdBytes));
  }
  if (request.job_id.size() > kMaxJobIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("job_id is ", request.job_id.size(),
                                                   " bytes; use at most ", kMaxJobIdBytes));
  }
  if (request.batch_id.size() > kMaxBatchIdBytes) {
    return absl::InvalidArgumentError(absl::StrCat("batch_id is ", request.batch_id.size(),
                                                   " bytes; use at most ", kMaxBatchIdBytes));
  }
  if (request.step < 0) {
    return absl::InvalidArgumentError(absl::StrCat("step is ", request.step, "; steps are >= 0"));
  }
  // A device id names a link and labels its metrics series: bounded like a session's.
  for (const MatrixLocation* m : {&request.gradient, &request.projector}) {
    if (m->region.device_id.size() > kMaxDeviceIdBytes) {
      return absl::InvalidArgumentError(absl::StrCat(
          "device_id is ", m->region.device_id.size(), " bytes; use at most ", kMaxDeviceIdBytes,
          " (the GPU's UUID, e.g. GPU-8f2c5d1e-..., or a short name)"));
    }
  }
  return absl::OkStatus();
}

// A 2-D shape of dims >= 1 whose byte counts fit in 64 bits.
absl::Status CheckMatrixShape(const ServiceRequest& request) {
  if (request.shape.empty()) {
    return absl::InvalidArgumentError(
        "gradient has no shape (a shapeless buffer): send shape [rows, cols] of a 2-D matrix");
  }
  if (request.shape.size() != 2) {
    return absl::InvalidArgumentError(absl::StrCat(
        "gradient has shape [", absl::StrJoin(request.shape, ", "), "] (", request.shape.size(),
        "-D); a projector refresh needs a 2-D matrix [rows, cols] — skip 1-D parameters such as "
        "biases and norms, and reshape higher-rank tensors to 2-D"));
  }
  const int64_t rows = request.shape[0], cols = request.shape[1];
  if (rows < 1 || cols < 1) {
    return absl::InvalidArgumentError(absl::StrCat("gradient has shape [", rows, ", ",
                                                   cols, "]; both dims must be >= 1"));
  }
  const int64_t kMaxElements = std::numeric_limits<int64_t>::max() / 8;
  if (rows > kMaxElements / cols) {
    return absl::InvalidArgumentError("gradient shape overflows 64-bit byte counts");
  }
  return absl::OkStatus();
}

// rank, the randomized options, warm_start and the lazy policy.
absl::Status CheckMethod(const ServiceRequest& request) {
  if (request.rank < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("rank is ", request.rank, "; ask for a rank >= 1"));
  }
  const bool randomized = request.method == SvdMethod::kRandomized;
  if (randomized) {
    const RandomizedOptions& o = request.randomized;
    if (o.oversampling < 0 || o.power_iterations < 0 || o.power_iterations > kMaxPowerIterations) {
      return absl::InvalidArgumentError(absl::StrCat(
          "randomized options: oversampling ", o.oversampling, " and power_iterations ",
          o.power_iterations, " must be >= 0 (power_iterations <= ", kMaxPowerIterations,
          "; 1-3 is usual)"));
    }
  }
  if (request.warm_start && !randomized) {
    return absl::InvalidArgumentError(
        "warm_start needs method RANDOMIZED (an exact SVD has no starting subspace): drop "
        "warm_start or switch the method");
  }
  if (request.lazy && !(request.lazy_policy.similarity_threshold >= 0.0 &&
                        request.lazy_policy.similarity_threshold <= 1.0)) {
    return absl::InvalidArgumentError(
        absl::StrCat("lazy similarity threshold is ", request.lazy_policy.similarity_threshold,
                     "; it must be in [0, 1] (similarity is a mean squared cosine)"));
  }
  return absl::OkStatus();
}

// Both regions are valid and hold the gradient and the projector at their offsets.
absl::Status CheckRegionsFit(const ServiceRequest& request, const RefreshLayout& layout) {
  if (absl::Status s = CheckRegion(request.gradient.region, "gradient_region"); !s.ok()) return s;
  if (request.has_projector_region) {
    if (absl::Status s = CheckRegion(request.projector.region, "projector_region"); !s.ok()) {
      return s;
    }
  }
  if (absl::Status s = CheckFits(
          request.gradient.region, request.gradient.offset_bytes, layout.gradient_bytes,
          absl::StrCat("gradient [", layout.rows, ", ", layout.cols, "] ", DTypeName(request.dtype))
              .c_str());
      !s.ok()) {
    return s;
  }
  if (absl::Status s = CheckFits(*layout.projector_region, request.projector.offset_bytes,
                                 layout.projector_bytes,
                                 absl::StrCat("projector [", layout.projector_rows, ", ",
                                              layout.effective_rank, "] ", DTypeName(request.dtype))
                                     .c_str());
      !s.ok()) {
    return s;
  }
  return absl::OkStatus();
}

}  // namespace

const char* VectorSideName(VectorSide side) { return side == VectorSide::kLeft ? "left" : "right"; }

absl::StatusOr<RefreshLayout> ValidateServiceRequest(const ServiceRequest& request) {
  if (absl::Status s = CheckNameAndStep(request); !s.ok()) return s;
  if (absl::Status s = CheckMatrixShape(request); !s.ok()) return s;
  if (absl::Status s = CheckMethod(request); !s.ok()) return s;
  RefreshLayout layout;
  layout.rows = request.shape[0];
  layout.cols = request.shape[1];
  layout.vector_side = ResolveSide(request.side, layout.rows, layout.cols);
  layout.effective_rank = std::min(request.rank, std::min(layout.rows, layout.cols));
  layout.projector_rows = layout.vector_side == VectorSide::kLeft ? layout.rows : layout.cols;
  const uint64_t element = ElementSizeBytes(request.dtype);
  layout.gradient_bytes = static_cast<uint64_t>(layout.rows * layout.cols) * element;
  layout.projector_bytes =
      static_cast<uint64_t>(layout.projector_rows * layout.effective_rank) * element;
  layout.projector_region =
      request.has_projector_region ? &request.projector.region : &request.gradient.region;
  layout.working_bytes = EstimateWorkingBytes(request, layout);

  if (absl::Status s = CheckRegionsFit(request, layout); !s.ok()) return s;
  return layout;
}

}  // namespace offloadd::projector
