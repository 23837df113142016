// Spin kernel (kernels.h): one thread busy-waits on the GPU's global nanosecond timer, so a
// stream is held for a set time by a kernel rather than by the host (tests/gpu probes use it as
// a long producer whose ready event completes late).
#include "kernels/kernels.h"

namespace offloadd::kernels {
namespace {

__device__ uint64_t GlobalTimerNanoseconds() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinKernel(uint64_t nanoseconds) {
  const uint64_t start = GlobalTimerNanoseconds();
  while (GlobalTimerNanoseconds() - start < nanoseconds) {
  }
}

}  // namespace

cudaError_t LaunchSpin(uint64_t nanoseconds, cudaStream_t stream) {
  SpinKernel<<<1, 1, 0, stream>>>(nanoseconds);
  return cudaGetLastError();
}

}  // namespace offloadd::kernels
