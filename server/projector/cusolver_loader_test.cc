// LoadCusolver on a machine with the CUDA toolkit (no driver needed): every routine resolves,
// and the same table comes back on a second call; the daemon binary itself links neither library.
#include "server/projector/cusolver_loader.h"

#include "gtest/gtest.h"

namespace offloadd::projector {
namespace {

TEST(CusolverLoader, ResolvesEveryRoutineOnce) {
  absl::StatusOr<const CusolverLib*> lib = LoadCusolver();
  ASSERT_TRUE(lib.ok()) << lib.status();
#define OFFLOADD_EXPECT_RESOLVED(fn) EXPECT_NE((*lib)->fn, nullptr) << #fn;
  OFFLOADD_CUSOLVER_FUNCTIONS(OFFLOADD_EXPECT_RESOLVED)
#undef OFFLOADD_EXPECT_RESOLVED
  absl::StatusOr<const CusolverLib*> again = LoadCusolver();
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, *lib);
  // A pure host routine: proves the pointer is the real cuBLAS entry point.
  EXPECT_STREQ((*lib)->cublasGetStatusString(CUBLAS_STATUS_SUCCESS), "success");
}

}  // namespace
}  // namespace offloadd::projector
