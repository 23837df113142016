#include "server/projector/cusolver_backend.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/mutex.h"
#include "server/copy/cuda/cuda_api.h"
#include "server/projector/cusolver_loader.h"
#include "server/projector/gpu_uuid.h"

namespace offloadd::projector {
namespace {

// The cuSOLVER/cuBLAS routines; valid once ThreadContext has succeeded (it loads them first).
const CusolverLib& Lib() { return **LoadCusolver(); }

absl::Status CudaStatus(const char* what, cudaError_t e) {
  if (e == cudaSuccess) return absl::OkStatus();
  cudaGetLastError();  // clear a non-sticky error so later calls report their own
  const std::string msg =
      absl::StrCat(what, ": ", cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
  if (e == cudaErrorMemoryAllocation) return absl::ResourceExhaustedError(msg);
  if (e == cudaErrorNoDevice || e == cudaErrorInsufficientDriver || e == cudaErrorInvalidDevice) {
    return absl::FailedPreconditionError(msg);
  }
  return absl::InternalError(msg);
}

absl::Status SolverStatus(const char* what, cusolverStatus_t s) {
  if (s == CUSOLVER_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": cusolver status ", static_cast<int>(s));
  if (s == CUSOLVER_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

absl::Status BlasStatus(const char* what, cublasStatus_t s) {
  if (s == CUBLAS_STATUS_SUCCESS) return absl::OkStatus();
  const std::string msg = absl::StrCat(what, ": ", Lib().cublasGetStatusString(s));
  if (s == CUBLAS_STATUS_ALLOC_FAILED) return absl::ResourceExhaustedError(msg);
  return absl::InternalError(msg);
}

#define OFD_RETURN_IF_ERROR(expr) \
  do {                            \
    absl::Status _st = (expr);    \
    if (!_st.ok()) return _st;    \
  } while (0)

// Device memory of `count` elements of T, freed on destruction.
template <typename T>
class DeviceBuffer {
 public:
  DeviceBuffer() = default;
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  ~DeviceBuffer() { Reset(); }
  void Reset() {
    if (ptr_ != nullptr) cudaFree(ptr_);
    ptr_ = nullptr;
  }
  absl::Status Allocate(size_t count) {
    return CudaStatus("cudaMalloc", cudaMalloc(reinterpret_cast<void**>(&ptr_),
                                               std::max<size_t>(1, count) * sizeof(T)));
  }
  T* get() const { return ptr_; }

 private:
  T* ptr_ = nullptr;
};

// A device context: the device made current, a stream, and solver/BLAS handles on it.
class Context {
 public:
  ~Context() {
    if (blas_ != nullptr) Lib().cublasDestroy(blas_);
    if (solver_ != nullptr) Lib().cusolverDnDestroy(solver_);
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  absl::Status Init(int device) {
    OFD_RETURN_IF_ERROR(CudaStatus("cudaSetDevice", cudaSetDevice(device)));
    OFD_RETURN_IF_ERROR(
        CudaStatus("cudaStreamCreate", cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking)));
    OFD_RETURN_IF_ERROR(SolverStatus("cusolverDnCreate", Lib().cusolverDnCreate(&solver_)));
    OFD_RETURN_IF_ERROR(
        SolverStatus("cusolverDnSetStream", Lib().cusolverDnSetStream(solver_, stream_)));
    OFD_RETURN_IF_ERROR(BlasStatus("cublasCreate", Lib().cublasCreate(&blas_)));
    return BlasStatus("cublasSetStream", Lib().cublasSetStream(blas_, stream_));
  }
  template <typename T>
  absl::Status ToDevice(T* dst, const T* src, size_t count) {
    return CudaStatus("cudaMemcpyAsync(H2D)", cudaMemcpyAsync(dst, src, count * sizeof(T),
                                                              cudaMemcpyHostToDevice, stream_));
  }
  template <typename T>
  absl::Status ToHost(T* dst, const T* src, size_t count) {
    return CudaStatus("cudaMemcpyAsync(D2H)", cudaMemcpyAsync(dst, src, count * sizeof(T),
                                                              cudaMemcpyDeviceToHost, stream_));
  }
  absl::Status Sync() {
    return CudaStatus("cudaStreamSynchronize", cudaStreamSynchronize(stream_));
  }
  // Reads a cuSOLVER devInfo after a Sync.
  absl::Status CheckInfo(const char* routine, const int* d_info) {
    int info = 0;
    OFD_RETURN_IF_ERROR(ToHost(&info, d_info, 1));
    OFD_RETURN_IF_ERROR(Sync());
    if (info < 0) {
      return absl::InternalError(absl::StrCat(routine, ": argument ", -info, " is invalid (bug)"));
    }
    if (info > 0) {
      return absl::InternalError(absl::StrCat(routine, " did not converge (info ", info,
                                              "); retry with the other method or backend"));
    }
    return absl::OkStatus();
  }
  cusolverDnHandle_t solver() const { return solver_; }
  cublasHandle_t blas() const { return blas_; }

 private:
  cudaStream_t stream_ = nullptr;
  cusolverDnHandle_t solver_ = nullptr;
  cublasHandle_t blas_ = nullptr;
};

// The calling thread's context on `device`: one stream and one cuSOLVER/cuBLAS handle pair per
// (refresh worker thread, GPU), created at the thread's first refresh on that GPU and kept until
// the thread exits (creating handles costs milliseconds and allocates device memory; per call it
// showed in every refresh). The device is made current on every call.
absl::StatusOr<Context*> ThreadContext(int device) {
  thread_local std::map<int, std::unique_ptr<Context>> contexts;
  absl::StatusOr<const CusolverLib*> lib = LoadCusolver();
  if (!lib.ok()) return lib.status();
  OFD_RETURN_IF_ERROR(CudaStatus("cudaSetDevice", cudaSetDevice(device)));
  auto it = contexts.find(device);
  if (it != contexts.end()) return it->second.get();
  auto ctx = std::make_unique<Context>();
  OFD_RETURN_IF_ERROR(ctx->Init(device));
  return contexts.emplace(device, std::move(ctx)).first->second.get();
}

// Replaces the column-major rows x c device matrix by the Q factor of its QR.
absl::Status Orthonormalize(Context& ctx, float* d_y, int rows, int c, float* d_tau,
                            DeviceBuffer<float>& work, int* lwork_capacity, int* d_info) {
  int lw_qr = 0, lw_q = 0;
  OFD_RETURN_IF_ERROR(
      SolverStatus("cusolverDnSgeqrf_bufferSize",
                   Lib().cusolverDnSgeqrf_bufferSize(ctx.solver(), rows, c, d_y, rows, &lw_qr)));
  OFD_RETURN_IF_ERROR(SolverStatus(
      "cusolverDnSorgqr_bufferSize",
      Lib().cusolverDnSorgqr_bufferSize(ctx.solver(), rows, c, c, d_y, rows, d_tau, &lw_q)));
  const int lwork = std::max(lw_qr, lw_q);
  if (lwork > *lwork_capacity) {
    work.Reset();
    OFD_RETURN_IF_ERROR(work.Allocate(lwork));
    *lwork_capacity = lwork;
  }
  OFD_RETURN_IF_ERROR(SolverStatus(
      "cusolverDnSgeqrf",
      Lib().cusolverDnSgeqrf(ctx.solver(), rows, c, d_y, rows, d_tau, work.get(), lwork, d_info)));
  return SolverStatus("cusolverDnSorgqr",
                      Lib().cusolverDnSorgqr(ctx.solver(), rows, c, c, d_y, rows, d_tau, work.get(),
                                             lwork, d_info));
}

// The first k columns of U (device, column-major rows x k or wider, leading dimension rows) into
// `vectors` (host, rows x k row-major: vector i is column i).
absl::Status CopyLeadingColumns(Context& ctx, const float* d_u, int rows, int64_t k,
                                std::vector<float>* vectors) {
  std::vector<float> u(static_cast<size_t>(rows) * k);
  OFD_RETURN_IF_ERROR(ctx.ToHost(u.data(), d_u, u.size()));
  OFD_RETURN_IF_ERROR(ctx.Sync());
  for (int64_t i = 0; i < k; ++i) {
    for (int64_t j = 0; j < rows; ++j) (*vectors)[j * k + i] = u[j + i * rows];
  }
  return absl::OkStatus();
}

// The first k rows of V^T (device, column-major n x n: entry j of vector i at vt[i + j * n])
// into `vectors` (host, n x k row-major).
absl::Status CopyLeadingRows(Context& ctx, const float* d_vt, int n, int64_t k,
                             std::vector<float>* vectors) {
  std::vector<float> vt(static_cast<size_t>(n) * n);
  OFD_RETURN_IF_ERROR(ctx.ToHost(vt.data(), d_vt, vt.size()));
  OFD_RETURN_IF_ERROR(ctx.Sync());
  for (int64_t j = 0; j < n; ++j) {
    std::memcpy(&(*vectors)[j * k], &vt[j * n], k * sizeof(float));
  }
  return absl::OkStatus();
}

// The top-k projector from the range basis Q (device, rows x l) and B^T = op(A)^T Q (device,
// cols x l, cols >= l, overwritten): the SVD B^T = U_t S V_t^T gives B's left vectors as the rows
// of V_t^T (l x l), and P = Q V_t[:, :k]. Singular values: all l of B's.
absl::StatusOr<TopSingular> ProjectorFromSketch(Context& ctx, const float* d_q, float* d_bt,
                                                int rows, int cols, int l, int64_t k, int* d_info) {
  const float one = 1.0f, zero = 0.0f;
  DeviceBuffer<float> d_s, d_vt, d_svd_work, d_rwork, d_p;
  OFD_RETURN_IF_ERROR(d_s.Allocate(l));
  OFD_RETURN_IF_ERROR(d_vt.Allocate(static_cast<size_t>(l) * l));
  OFD_RETURN_IF_ERROR(d_rwork.Allocate(l));
  int lwork = 0;
  OFD_RETURN_IF_ERROR(
      SolverStatus("cusolverDnSgesvd_bufferSize",
                   Lib().cusolverDnSgesvd_bufferSize(ctx.solver(), cols, l, &lwork)));
  OFD_RETURN_IF_ERROR(d_svd_work.Allocate(lwork));
  OFD_RETURN_IF_ERROR(SolverStatus(
      "cusolverDnSgesvd",
      Lib().cusolverDnSgesvd(ctx.solver(), 'N', 'S', cols, l, d_bt, cols, d_s.get(), nullptr, cols,
                             d_vt.get(), l, d_svd_work.get(), lwork, d_rwork.get(), d_info)));
  OFD_RETURN_IF_ERROR(ctx.CheckInfo("cusolverDnSgesvd", d_info));

  // P^T (k x rows, column-major) = V_t^T[:k, :] Q^T: its memory is P row-major rows x k.
  OFD_RETURN_IF_ERROR(d_p.Allocate(static_cast<size_t>(rows) * k));
  OFD_RETURN_IF_ERROR(BlasStatus(
      "cublasSgemm",
      Lib().cublasSgemm(ctx.blas(), CUBLAS_OP_N, CUBLAS_OP_T, static_cast<int>(k), rows, l, &one,
                        d_vt.get(), l, d_q, rows, &zero, d_p.get(), static_cast<int>(k))));
  TopSingular out;
  out.k = k;
  out.side_dim = rows;
  out.full_spectrum = false;
  out.singular_values.resize(l);
  out.vectors.resize(static_cast<size_t>(rows) * k);
  OFD_RETURN_IF_ERROR(ctx.ToHost(out.singular_values.data(), d_s.get(), l));
  OFD_RETURN_IF_ERROR(ctx.ToHost(out.vectors.data(), d_p.get(), out.vectors.size()));
  OFD_RETURN_IF_ERROR(ctx.Sync());
  return out;
}

// The warm start's first min(w, l) columns (host, rows x w row-major) as Q's columns (column-
// major rows x l), the rest filled from `normal`.
std::vector<float> WarmStartBasis(const DenseMatrix& warm_start, int rows, int l,
                                  std::mt19937_64& rng, std::normal_distribution<float>& normal) {
  const int64_t w = std::min<int64_t>(warm_start.cols, l);
  std::vector<float> q(static_cast<size_t>(rows) * l);
  for (int64_t i = 0; i < w; ++i) {
    for (int64_t j = 0; j < rows; ++j) q[j + i * rows] = warm_start.data[j * warm_start.cols + i];
  }
  for (size_t i = w * rows; i < q.size(); ++i) q[i] = normal(rng);
  return q;
}

std::vector<float> GaussianMatrix(size_t count, std::mt19937_64& rng,
                                  std::normal_distribution<float>& normal) {
  std::vector<float> x(count);
  for (float& v : x) v = normal(rng);
  return x;
}

// Device buffers of a randomized SVD: A, the range basis Q (rows x l), Z (cols x l), the QR
// factors' tau, the QR workspace and the info word.
struct SketchBuffers {
  DeviceBuffer<float> a, q, z, tau, work;
  DeviceBuffer<int> info;
};

// Allocates `b` (work is sized later) and copies A to the device.
absl::Status AllocateSketch(Context& ctx, const DenseMatrix& a, int rows, int cols, int l,
                            SketchBuffers* b) {
  OFD_RETURN_IF_ERROR(b->a.Allocate(static_cast<size_t>(a.rows) * a.cols));
  OFD_RETURN_IF_ERROR(b->q.Allocate(static_cast<size_t>(rows) * l));
  OFD_RETURN_IF_ERROR(b->z.Allocate(static_cast<size_t>(cols) * l));
  OFD_RETURN_IF_ERROR(b->tau.Allocate(l));
  OFD_RETURN_IF_ERROR(b->info.Allocate(1));
  return ctx.ToDevice(b->a.get(), a.data, static_cast<size_t>(a.rows) * a.cols);
}

}  // namespace

absl::StatusOr<TopSingular> CusolverSvdBackend::Exact(DenseMatrix a, VectorSide side,
                                                      int64_t k) const {
  OFD_RETURN_IF_ERROR(CheckSvdInput(a, k, "cuSOLVER"));
  const int m = static_cast<int>(a.rows), n = static_cast<int>(a.cols);
  const int kk = std::min(m, n);
  absl::StatusOr<Context*> context = ThreadContext(device_);
  if (!context.ok()) return context.status();
  Context& ctx = **context;
  // X: column-major xr x xc with xr >= xc. Wide (n >= m): X = A^T, which is the input's memory.
  // Tall: X = A, the transpose of that memory.
  const bool x_is_at = n >= m;
  const int xr = x_is_at ? n : m, xc = x_is_at ? m : n;
  DeviceBuffer<float> d_in, d_x;
  OFD_RETURN_IF_ERROR(d_in.Allocate(static_cast<size_t>(m) * n));
  OFD_RETURN_IF_ERROR(ctx.ToDevice(d_in.get(), a.data, static_cast<size_t>(m) * n));
  float* x = d_in.get();
  if (!x_is_at) {
    OFD_RETURN_IF_ERROR(d_x.Allocate(static_cast<size_t>(m) * n));
    const float one = 1.0f, zero = 0.0f;
    // X (m x n) = (A^T)^T, A^T being n x m with leading dimension n.
    OFD_RETURN_IF_ERROR(BlasStatus(
        "cublasSgeam", Lib().cublasSgeam(ctx.blas(), CUBLAS_OP_T, CUBLAS_OP_N, m, n, &one,
                                         d_in.get(), n, &zero, d_x.get(), m, d_x.get(), m)));
    x = d_x.get();
  }
  // A's left vectors are X's left vectors (columns of U) when X = A, and X's right vectors
  // (rows of V^T) when X = A^T; likewise for A's right vectors.
  const bool need_x_left = (side == VectorSide::kLeft) != x_is_at;
  DeviceBuffer<float> d_s, d_u, d_vt, d_work, d_rwork;
  DeviceBuffer<int> d_info;
  OFD_RETURN_IF_ERROR(d_s.Allocate(kk));
  OFD_RETURN_IF_ERROR(d_info.Allocate(1));
  OFD_RETURN_IF_ERROR(d_rwork.Allocate(kk));
  if (need_x_left) {
    OFD_RETURN_IF_ERROR(d_u.Allocate(static_cast<size_t>(xr) * xc));
  } else {
    OFD_RETURN_IF_ERROR(d_vt.Allocate(static_cast<size_t>(xc) * xc));
  }
  int lwork = 0;
  OFD_RETURN_IF_ERROR(
      SolverStatus("cusolverDnSgesvd_bufferSize",
                   Lib().cusolverDnSgesvd_bufferSize(ctx.solver(), xr, xc, &lwork)));
  OFD_RETURN_IF_ERROR(d_work.Allocate(lwork));
  OFD_RETURN_IF_ERROR(SolverStatus(
      "cusolverDnSgesvd",
      Lib().cusolverDnSgesvd(ctx.solver(), need_x_left ? 'S' : 'N', need_x_left ? 'N' : 'S', xr, xc,
                             x, xr, d_s.get(), d_u.get(), xr, d_vt.get(), xc, d_work.get(), lwork,
                             d_rwork.get(), d_info.get())));
  OFD_RETURN_IF_ERROR(ctx.CheckInfo("cusolverDnSgesvd", d_info.get()));

  TopSingular out;
  out.k = k;
  out.full_spectrum = true;
  out.singular_values.resize(kk);
  OFD_RETURN_IF_ERROR(ctx.ToHost(out.singular_values.data(), d_s.get(), kk));
  out.side_dim = side == VectorSide::kLeft ? m : n;
  out.vectors.resize(static_cast<size_t>(out.side_dim) * k);
  if (need_x_left) {
    OFD_RETURN_IF_ERROR(CopyLeadingColumns(ctx, d_u.get(), xr, k, &out.vectors));
  } else {
    OFD_RETURN_IF_ERROR(CopyLeadingRows(ctx, d_vt.get(), xc, k, &out.vectors));
  }
  return out;
}

namespace {
// A warm start must be the previous projector: rows x w, w >= 1.
absl::Status CheckWarmStart(const DenseMatrix& warm_start, int rows) {
  if (warm_start.rows == rows && warm_start.cols >= 1) return absl::OkStatus();
  return absl::InvalidArgumentError(
      absl::StrCat("warm start is ", warm_start.rows, " x ", warm_start.cols,
                   "; it must be the previous projector, ", rows, " x w"));
}
}  // namespace

absl::StatusOr<TopSingular> CusolverSvdBackend::Randomized(DenseMatrix a, VectorSide side,
                                                           int64_t k,
                                                           const RandomizedOptions& options,
                                                           DenseMatrix warm_start) const {
  OFD_RETURN_IF_ERROR(CheckSvdInput(a, k, "cuSOLVER"));
  if (options.oversampling < 0 || options.power_iterations < 0) {
    return absl::InvalidArgumentError("oversampling and power_iterations must be >= 0");
  }
  const bool transpose = side == VectorSide::kRight;  // op(A) = A^T
  const int rows = static_cast<int>(transpose ? a.cols : a.rows);
  const int cols = static_cast<int>(transpose ? a.rows : a.cols);
  const int ld_a = static_cast<int>(a.cols);
  const int l = static_cast<int>(std::min<int64_t>(k + options.oversampling, std::min(rows, cols)));
  std::mt19937_64 rng(options.seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);

  absl::StatusOr<Context*> context = ThreadContext(device_);
  if (!context.ok()) return context.status();
  Context& ctx = **context;
  SketchBuffers b;
  OFD_RETURN_IF_ERROR(AllocateSketch(ctx, a, rows, cols, l, &b));
  DeviceBuffer<float>&d_a = b.a, &d_q = b.q, &d_z = b.z, &d_tau = b.tau, &d_work = b.work;
  DeviceBuffer<int>& d_info = b.info;
  int lwork_capacity = 0;
  const float one = 1.0f, zero = 0.0f;
  // y (rows x c) = op(A) x (cols x c); z (cols x c) = op(A)^T y. Same calls as the CBLAS code.
  auto apply = [&](const float* x, float* y) {
    return BlasStatus(
        "cublasSgemm",
        Lib().cublasSgemm(ctx.blas(), transpose ? CUBLAS_OP_N : CUBLAS_OP_T, CUBLAS_OP_N, rows, l,
                          cols, &one, d_a.get(), ld_a, x, cols, &zero, y, rows));
  };
  auto apply_t = [&](const float* y, float* z) {
    return BlasStatus(
        "cublasSgemm",
        Lib().cublasSgemm(ctx.blas(), transpose ? CUBLAS_OP_T : CUBLAS_OP_N, CUBLAS_OP_N, cols, l,
                          rows, &one, d_a.get(), ld_a, y, rows, &zero, z, cols));
  };
  auto orth = [&](float* y, int r) {
    return Orthonormalize(ctx, y, r, l, d_tau.get(), d_work, &lwork_capacity, d_info.get());
  };

  if (warm_start.data != nullptr) {
    OFD_RETURN_IF_ERROR(CheckWarmStart(warm_start, rows));
    const std::vector<float> q = WarmStartBasis(warm_start, rows, l, rng, normal);
    OFD_RETURN_IF_ERROR(ctx.ToDevice(d_q.get(), q.data(), q.size()));
    OFD_RETURN_IF_ERROR(ctx.Sync());  // q is freed at the end of this scope
    OFD_RETURN_IF_ERROR(orth(d_q.get(), rows));
    OFD_RETURN_IF_ERROR(apply_t(d_q.get(), d_z.get()));
    OFD_RETURN_IF_ERROR(orth(d_z.get(), cols));
  } else {
    const std::vector<float> omega = GaussianMatrix(static_cast<size_t>(cols) * l, rng, normal);
    OFD_RETURN_IF_ERROR(ctx.ToDevice(d_z.get(), omega.data(), omega.size()));
    OFD_RETURN_IF_ERROR(ctx.Sync());
  }
  OFD_RETURN_IF_ERROR(apply(d_z.get(), d_q.get()));
  OFD_RETURN_IF_ERROR(orth(d_q.get(), rows));
  for (int it = 0; it < options.power_iterations; ++it) {
    OFD_RETURN_IF_ERROR(apply_t(d_q.get(), d_z.get()));
    OFD_RETURN_IF_ERROR(orth(d_z.get(), cols));
    OFD_RETURN_IF_ERROR(apply(d_z.get(), d_q.get()));
    OFD_RETURN_IF_ERROR(orth(d_q.get(), rows));
  }
  OFD_RETURN_IF_ERROR(ctx.CheckInfo("cusolverDnSorgqr", d_info.get()));

  // B^T = op(A)^T Q (cols x l, cols >= l).
  OFD_RETURN_IF_ERROR(apply_t(d_q.get(), d_z.get()));
  return ProjectorFromSketch(ctx, d_q.get(), d_z.get(), rows, cols, l, k, d_info.get());
}

absl::StatusOr<int> CudaDeviceCount() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return absl::FailedPreconditionError(
        absl::StrCat("no usable CUDA driver or device: cudaGetDeviceCount: ", cudaGetErrorName(e),
                     " (", cudaGetErrorString(e), ")"));
  }
  if (n == 0) return absl::FailedPreconditionError("no CUDA device is visible");
  return n;
}

absl::StatusOr<int> CudaOrdinalForUuid(const std::string& uuid) {
  absl::StatusOr<int> n = CudaDeviceCount();
  if (!n.ok()) return n.status();
  for (int i = 0; i < *n; ++i) {
    cudaDeviceProp p;
    OFD_RETURN_IF_ERROR(CudaStatus("cudaGetDeviceProperties", cudaGetDeviceProperties(&p, i)));
    if (NormalizeGpuUuid(copy::FormatGpuUuid(
            reinterpret_cast<const unsigned char*>(p.uuid.bytes))) == NormalizeGpuUuid(uuid)) {
      return i;
    }
  }
  return absl::NotFoundError(absl::StrCat("no visible CUDA device has UUID ", uuid));
}

std::function<const SvdBackend*(const copy::RegionSpec&)> MakeCusolverBackendSelector() {
  struct Backends {
    base::Mutex mu;
    // null: not a GPU here
    std::map<std::string, std::unique_ptr<CusolverSvdBackend>> by_uuid GUARDED_BY(mu);
  };
  auto backends = std::make_shared<Backends>();
  return [backends](const copy::RegionSpec& spec) -> const SvdBackend* {
    if (spec.cuda_ipc_handle.empty()) return nullptr;
    base::MutexLock lock(backends->mu);
    const std::string uuid = NormalizeGpuUuid(spec.device_id);
    auto it = backends->by_uuid.find(uuid);
    if (it == backends->by_uuid.end()) {
      absl::StatusOr<int> ordinal = CudaOrdinalForUuid(uuid);
      it = backends->by_uuid
               .emplace(uuid,
                        ordinal.ok() ? std::make_unique<CusolverSvdBackend>(*ordinal) : nullptr)
               .first;
    }
    return it->second.get();
  };
}

}  // namespace offloadd::projector
