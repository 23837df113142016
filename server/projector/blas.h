// BLAS / LAPACK entry points the projector uses, loaded with dlopen on first use.
//
// Why not link -lopenblas: OpenBLAS carries ~60 KiB of static thread-local storage. Every library
// linked into the daemon adds its static TLS to each thread's stack, and civetweb (under the
// Prometheus exposer) creates its threads with a fixed small stack, so with OpenBLAS linked the
// exposer's pthread_create failed with EINVAL and the daemon could not serve metrics. Libraries
// loaded with dlopen get dynamic TLS instead. The functions below have the exact signatures of
// <cblas.h> / <lapacke.h> (OpenBLAS and LAPACKE from Debian), so code in namespace
// offloadd::projector calls them unqualified as before.
//
// Errors: if liblapacke.so.3 or libopenblas.so.0 cannot be loaded the process exits with a
// message naming the Debian packages (liblapacke, libopenblas0), which deploy/install-deps.sh
// installs.
//
// OpenBLAS picks its kernels when it is loaded (the first call here), reading OPENBLAS_CORETYPE
// then: blas_core.h sets it in main() before that where the CPU can run better kernels.
#ifndef OFFLOADD_SERVER_PROJECTOR_BLAS_H_
#define OFFLOADD_SERVER_PROJECTOR_BLAS_H_

#include <cblas.h>
#include <lapacke.h>

namespace offloadd::projector {
namespace blas_internal {

struct Table {
  decltype(&::cblas_sgemm) cblas_sgemm;
  decltype(&::cblas_dgemm) cblas_dgemm;
  decltype(&::cblas_sgemv) cblas_sgemv;
  decltype(&::openblas_set_num_threads) openblas_set_num_threads;
  decltype(&::openblas_get_num_threads) openblas_get_num_threads;
  decltype(&::openblas_get_corename) openblas_get_corename;
  decltype(&::LAPACKE_sgesdd) LAPACKE_sgesdd;
  decltype(&::LAPACKE_dgesdd) LAPACKE_dgesdd;
  decltype(&::LAPACKE_sgeqrf) LAPACKE_sgeqrf;
  decltype(&::LAPACKE_sorgqr) LAPACKE_sorgqr;
};

// Loads the libraries once (thread-safe).
const Table& Get();

}  // namespace blas_internal

#define OFFLOADD_BLAS_FORWARD(name)                          \
  template <typename... Args>                                \
  inline auto name(Args... args) {                           \
    return blas_internal::Get().name(args...);               \
  }
OFFLOADD_BLAS_FORWARD(cblas_sgemm)
OFFLOADD_BLAS_FORWARD(cblas_dgemm)
OFFLOADD_BLAS_FORWARD(cblas_sgemv)
OFFLOADD_BLAS_FORWARD(openblas_set_num_threads)
OFFLOADD_BLAS_FORWARD(openblas_get_num_threads)
OFFLOADD_BLAS_FORWARD(openblas_get_corename)
OFFLOADD_BLAS_FORWARD(LAPACKE_sgesdd)
OFFLOADD_BLAS_FORWARD(LAPACKE_dgesdd)
OFFLOADD_BLAS_FORWARD(LAPACKE_sgeqrf)
OFFLOADD_BLAS_FORWARD(LAPACKE_sorgqr)
#undef OFFLOADD_BLAS_FORWARD

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_BLAS_H_
