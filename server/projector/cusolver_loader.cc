#include "server/projector/cusolver_loader.h"

#include <dlfcn.h>

#include <initializer_list>
#include <string>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace offloadd::projector {
namespace {

#define OFFLOADD_STRINGIFY(x) #x
#define OFFLOADD_SYMBOL_NAME(x) OFFLOADD_STRINGIFY(x)

constexpr char kWhatToDo[] =
    "install the CUDA math libraries (cuSOLVER and cuBLAS) or put their directory on "
    "LD_LIBRARY_PATH, or configure projector { backend: \"lapack\" }";

// The first of `names` that dlopen finds, or FAILED_PRECONDITION listing them.
absl::StatusOr<void*> OpenFirst(std::initializer_list<const char*> names) {
  std::string tried;
  for (const char* name : names) {
    if (void* h = dlopen(name, RTLD_NOW | RTLD_LOCAL)) return h;
    absl::StrAppend(&tried, tried.empty() ? "" : ", ", name);
  }
  return absl::FailedPreconditionError(
      absl::StrCat("the cusolver projector backend found none of ", tried, ": ", kWhatToDo));
}

absl::StatusOr<CusolverLib> Load() {
  absl::StatusOr<void*> solver =
      OpenFirst({"libcusolver.so.12", "libcusolver.so.11", "libcusolver.so"});
  if (!solver.ok()) return solver.status();
  absl::StatusOr<void*> blas = OpenFirst({"libcublas.so.13", "libcublas.so.12", "libcublas.so"});
  if (!blas.ok()) return blas.status();
  CusolverLib lib;
  std::string missing;
  auto resolve = [&](auto& fn, const char* symbol) {
    void* p = dlsym(*solver, symbol);
    if (p == nullptr) p = dlsym(*blas, symbol);
    if (p == nullptr) absl::StrAppend(&missing, missing.empty() ? "" : ", ", symbol);
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
  };
#define OFFLOADD_CUSOLVER_RESOLVE(fn) resolve(lib.fn, OFFLOADD_SYMBOL_NAME(fn));
  OFFLOADD_CUSOLVER_FUNCTIONS(OFFLOADD_CUSOLVER_RESOLVE)
#undef OFFLOADD_CUSOLVER_RESOLVE
  if (!missing.empty()) {
    return absl::FailedPreconditionError(absl::StrCat("the cuSOLVER/cuBLAS libraries found lack ",
                                                      missing, " (too old?): ", kWhatToDo));
  }
  return lib;
}

}  // namespace

absl::StatusOr<const CusolverLib*> LoadCusolver() {
  static const absl::StatusOr<CusolverLib>* const loaded = new absl::StatusOr<CusolverLib>(Load());
  if (!loaded->ok()) return loaded->status();
  return &**loaded;
}

}  // namespace offloadd::projector
