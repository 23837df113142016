#include "server/projector/blas.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace offloadd::projector::blas_internal {
namespace {

void* Open(const char* soname) {
  void* h = dlopen(soname, RTLD_NOW | RTLD_GLOBAL);
  if (h == nullptr) {
    std::fprintf(stderr,
                 "offloadd: cannot load %s (%s): install Debian's liblapacke and libopenblas0 "
                 "(deploy/install-deps.sh does)\n",
                 soname, dlerror());
    std::abort();
  }
  return h;
}

template <typename Fn>
void Load(void* handle, const char* symbol, Fn* out) {
  *out = reinterpret_cast<Fn>(dlsym(handle, symbol));
  if (*out == nullptr) {
    std::fprintf(stderr, "offloadd: %s is missing from the BLAS/LAPACK libraries\n", symbol);
    std::abort();
  }
}

}  // namespace

const Table& Get() {
  static Table table;
  static std::once_flag once;
  std::call_once(once, [] {
    void* blas = Open("libopenblas.so.0");
    void* lapacke = Open("liblapacke.so.3");
    Load(blas, "cblas_sgemm", &table.cblas_sgemm);
    Load(blas, "cblas_dgemm", &table.cblas_dgemm);
    Load(blas, "cblas_sgemv", &table.cblas_sgemv);
    Load(blas, "openblas_set_num_threads", &table.openblas_set_num_threads);
    Load(blas, "openblas_get_num_threads", &table.openblas_get_num_threads);
    Load(blas, "openblas_get_corename", &table.openblas_get_corename);
    Load(lapacke, "LAPACKE_sgesdd", &table.LAPACKE_sgesdd);
    Load(lapacke, "LAPACKE_dgesdd", &table.LAPACKE_dgesdd);
    Load(lapacke, "LAPACKE_sgeqrf", &table.LAPACKE_sgeqrf);
    Load(lapacke, "LAPACKE_sorgqr", &table.LAPACKE_sorgqr);
  });
  return table;
}

}  // namespace offloadd::projector::blas_internal
