// A projector refresh as the refresh service receives it (plain structs; rpc/ translates
// proto/projector.proto into them), and the checks made before it is queued.
//
// G and P live in client memory named by a copy::RegionSpec (a POSIX shm object or a CUDA IPC
// handle of an allocation base) plus a byte offset, exactly as offloads name client memory.
// G is rows x cols elements of `dtype`, row-major and contiguous; P is written as
// projector_rows x effective_rank elements of the same dtype, row-major (projector.h: left side
// m x r = U[:, :r]; right side n x r = the transpose of the reference's Vh[:r, :]).
#ifndef OFFLOADD_SERVER_PROJECTOR_SERVICE_REQUEST_H_
#define OFFLOADD_SERVER_PROJECTOR_SERVICE_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/copy/copy_engine.h"
#include "server/projector/dtype.h"
#include "server/projector/lazy_policy.h"
#include "server/projector/projector.h"
#include "server/projector/svd_backend.h"

namespace offloadd::projector {

// Bytes at `offset_bytes` of a client region.
struct MatrixLocation {
  copy::RegionSpec region;
  uint64_t offset_bytes = 0;
};

struct ServiceRequest {
  // The key (job_id, parameter_id, step), per caller uid. A second Submit of a key shares the
  // first one's result only when its gradient is bitwise the same (RefreshService).
  // The training job, shared by all ranks of one run (e.g. drawn by rank 0 and broadcast); empty
  // is a job of its own name. At most kMaxJobIdBytes.
  std::string job_id;
  std::string parameter_id;  // non-empty, at most kMaxParameterIdBytes
  int64_t step = 0;          // >= 0; one parameter's refreshes run in increasing step order

  MatrixLocation gradient;
  std::vector<int64_t> shape;  // must be exactly {rows, cols}, both >= 1
  DType dtype = DType::kFloat32;

  int64_t rank = 128;  // >= 1; clamped to min(rows, cols)
  ProjectionSide side = ProjectionSide::kStd;
  SvdMethod method = SvdMethod::kExact;
  RandomizedOptions randomized;  // kRandomized only
  // kRandomized only: seed the range finder with the parameter's previous projector when the
  // service still holds one (else a cold start; the record says which).
  bool warm_start = false;
  bool measure_residual = true;

  // Where P goes. has_projector_region == false: in gradient.region at projector.offset_bytes.
  bool has_projector_region = false;
  MatrixLocation projector;

  // Lazy mode (lazy_policy.h): the refresh may be skipped while the parameter's subspace stays
  // stable; P is then left as it was.
  bool lazy = false;
  LazyRefreshPolicy lazy_policy;

  std::string batch_id;        // optional group for WatchBatch; at most kMaxBatchIdBytes
  bool reset_history = false;  // forget the parameter's previous P, last step and lazy state

  // The caller's uid when the connection's credentials are known (SO_PEERCRED), else -1. A
  // caller other than root may only name shm objects it owns: a daemon running as root would
  // otherwise read and write any user's shared memory on request (PERMISSION_DENIED).
  int64_t caller_uid = -1;
};

inline constexpr size_t kMaxParameterIdBytes = 1024;
inline constexpr size_t kMaxJobIdBytes = 256;
inline constexpr size_t kMaxBatchIdBytes = 256;
// The longest device_id a region may carry (as a session's Hello; INVALID_ARGUMENT beyond).
inline constexpr size_t kMaxDeviceIdBytes = 256;
inline constexpr int kMaxPowerIterations = 64;

// What a valid request implies.
struct RefreshLayout {
  int64_t rows = 0, cols = 0;
  VectorSide vector_side = VectorSide::kLeft;
  int64_t effective_rank = 0;  // min(rank, rows, cols)
  int64_t projector_rows = 0;  // rows (left) or cols (right)
  uint64_t gradient_bytes = 0;
  uint64_t projector_bytes = 0;
  // Host memory one refresh of this shape needs at its peak, estimated from above: G as read,
  // its fp32 copy, the SVD's copies and workspace, and P. What RefreshService bounds
  // (max_refresh_bytes) before anything is allocated.
  uint64_t working_bytes = 0;
  // The region P is written to (the gradient's when has_projector_region is false).
  const copy::RegionSpec* projector_region = nullptr;
};

// Checks everything that can be checked without opening client memory. The declared
// RegionSpec::size_bytes bounds the ranges here; the real object size is checked again when the
// region is opened.
// Errors:
//   INVALID_ARGUMENT: empty or oversized parameter_id; oversized job_id; negative step; shape not exactly 2-D
//     (a 1-D buffer such as a bias, a shapeless buffer, 3-D) or a dim < 1; rank < 1; negative or
//     oversized randomized options; warm_start with kExact; lazy threshold outside [0, 1]; a
//     region with no handle, both handles, or size_bytes 0.
//   OUT_OF_RANGE: G (or P) does not fit its region at its offset.
// Each message says what to change.
absl::StatusOr<RefreshLayout> ValidateServiceRequest(const ServiceRequest& request);

// "left" / "right".
const char* VectorSideName(VectorSide side);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_SERVICE_REQUEST_H_
