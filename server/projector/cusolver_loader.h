// cuSOLVER and cuBLAS entry points for CusolverSvdBackend, loaded at first use with dlopen.
//
// The daemon does not link cuSOLVER or cuBLAS: together with cuBLASLt they are several hundred
// MiB, needed only when `projector { backend: "cusolver" }` is configured and a refresh runs on a
// GPU. The first call of LoadCusolver() dlopens the first library found of
//   libcusolver.so.12, libcusolver.so.11, libcusolver.so   and
//   libcublas.so.13, libcublas.so.12, libcublas.so
// (the dynamic loader's search: the binary's RUNPATH, LD_LIBRARY_PATH, ldconfig's cache) and
// resolves the functions below with dlsym; the result, success or error, is kept for the life of
// the process. The signatures are the toolkit headers' (cusolverDn.h, cublas_v2.h), which the
// supported releases (cuSOLVER 11-12, cuBLAS 12-13) share for these routines.
//
// Errors: FAILED_PRECONDITION naming the library or symbol that was missing and what to do
// (install the CUDA math libraries or put their directory on LD_LIBRARY_PATH, or configure
// `projector { backend: "lapack" }`).
#ifndef OFFLOADD_SERVER_PROJECTOR_CUSOLVER_LOADER_H_
#define OFFLOADD_SERVER_PROJECTOR_CUSOLVER_LOADER_H_

#include <cublas_v2.h>
#include <cusolverDn.h>

#include "absl/status/statusor.h"

namespace offloadd::projector {

// X(name): every cuSOLVER/cuBLAS routine the backend calls. Names that cublas_v2.h defines as
// macros (cublasCreate -> cublasCreate_v2) expand the same way in the member names and in the
// symbol names looked up.
#define OFFLOADD_CUSOLVER_FUNCTIONS(X)                                                           \
  X(cusolverDnCreate)                                                                            \
  X(cusolverDnDestroy) X(cusolverDnSetStream) X(cusolverDnSgeqrf) X(cusolverDnSgeqrf_bufferSize) \
      X(cusolverDnSgesvd) X(cusolverDnSgesvd_bufferSize) X(cusolverDnSorgqr)                     \
          X(cusolverDnSorgqr_bufferSize) X(cublasCreate) X(cublasDestroy) X(cublasSetStream)     \
              X(cublasSgeam) X(cublasSgemm) X(cublasGetStatusString)

// One pointer per routine, named as the routine.
struct CusolverLib {
#define OFFLOADD_CUSOLVER_MEMBER(fn) decltype(&::fn) fn = nullptr;
  OFFLOADD_CUSOLVER_FUNCTIONS(OFFLOADD_CUSOLVER_MEMBER)
#undef OFFLOADD_CUSOLVER_MEMBER
};

// The loaded routines (thread-safe; loads once per process), or FAILED_PRECONDITION as above.
absl::StatusOr<const CusolverLib*> LoadCusolver();

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_CUSOLVER_LOADER_H_
