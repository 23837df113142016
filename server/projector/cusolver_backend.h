// CusolverSvdBackend: SvdBackend on one CUDA GPU through cuSOLVER (dense) and cuBLAS.
// Compiled only where the CUDA toolkit exists (HAS_CUDA, @local_cuda//:cusolver); the daemon
// uses it for gradients that live in a CUDA IPC region when RefreshServiceOptions::
// gpu_backend_for is set to MakeCusolverBackendSelector().
//
//   Exact:      cusolverDnSgesvd (QR-based bidiagonalisation) of the fp32 matrix. gesvd needs
//               rows >= cols, so a wide matrix is solved as its transpose: the row-major m x n
//               input is already the column-major n x m matrix A^T, and a tall one is transposed
//               once on the device with cublasSgeam. Only the singular vectors of the requested
//               side are formed (jobu or jobvt 'N' for the other).
//   Randomized: the algorithm of LapackSvdBackend (Halko, Martinsson, Tropp 2011, Alg. 4.4 +
//               5.1; the same Gaussian test matrix from std::mt19937_64 with the same seed, drawn
//               on the host and copied, so both backends sketch identically): cublasSgemm for
//               the products with op(A), cusolverDnSgeqrf + cusolverDnSorgqr to re-orthonormalise
//               after each, cusolverDnSgesvd of the small l x cols matrix B^T.
//
// Inputs and outputs are host memory (the SvdBackend contract): each call copies A to the device
// (pageable host memory: ~PCIe speed), computes, and copies the k vectors and the singular values
// back. Device memory per call: exact about 2 m n floats (A, its transpose or the factor
// vectors) plus cuSOLVER's workspace; randomized m n + O((m + n) l) floats.
//
// Thread safety: the backend object has no mutable state. Each calling thread (a refresh worker)
// gets one stream and one cuSOLVER/cuBLAS handle pair per GPU at its first call there, kept in
// thread-local storage until the thread exits, and each call sets the device current
// (cudaSetDevice); concurrent calls from several workers are safe (they share the device, each on
// its own stream). Workspaces are allocated per call.
//
// Errors: FAILED_PRECONDITION when no CUDA device/driver is usable; INVALID_ARGUMENT for bad
// shapes or k, or more than 2^31 - 1 elements (32-bit cuSOLVER indices); RESOURCE_EXHAUSTED when
// device memory runs out; INTERNAL for solver failures (gesvd not converging: info > 0).
#ifndef OFFLOADD_SERVER_PROJECTOR_CUSOLVER_BACKEND_H_
#define OFFLOADD_SERVER_PROJECTOR_CUSOLVER_BACKEND_H_

#include <functional>
#include <string>

#include "absl/status/statusor.h"
#include "server/copy/copy_engine.h"
#include "server/projector/svd_backend.h"

namespace offloadd::projector {

class CusolverSvdBackend final : public SvdBackend {
 public:
  // `device_ordinal`: the CUDA runtime ordinal in this process.
  explicit CusolverSvdBackend(int device_ordinal) : device_(device_ordinal) {}
  absl::string_view name() const override { return "cusolver"; }
  absl::StatusOr<TopSingular> Exact(DenseMatrix a, VectorSide side, int64_t k) const override;
  absl::StatusOr<TopSingular> Randomized(DenseMatrix a, VectorSide side, int64_t k,
                                         const RandomizedOptions& options,
                                         DenseMatrix warm_start) const override;
  int device_ordinal() const { return device_; }

 private:
  int device_;
};

// Number of CUDA devices. FAILED_PRECONDITION (with the runtime's message) when there is no
// driver or no device — callers print "SKIPPED: no CUDA driver" and carry on.
absl::StatusOr<int> CudaDeviceCount();

// The runtime ordinal of the GPU with this UUID ("GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", as
// clients send device ids; compared after NormalizeGpuUuid, so case, dashes and a missing "GPU-"
// prefix do not matter). NOT_FOUND when no visible GPU has it.
absl::StatusOr<int> CudaOrdinalForUuid(const std::string& uuid);

// For RefreshServiceOptions::gpu_backend_for: a CusolverSvdBackend on the GPU named by the
// region's device_id, for CUDA IPC regions; nullptr (LAPACK) for shm regions or an unknown GPU.
// Backends are created on first use and live as long as the returned function.
std::function<const SvdBackend*(const copy::RegionSpec&)> MakeCusolverBackendSelector();

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_CUSOLVER_BACKEND_H_
