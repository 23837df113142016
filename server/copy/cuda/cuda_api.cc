#include "server/copy/cuda/cuda_api.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"

namespace offloadd::copy {

namespace {
absl::Status Unimplemented(const char* call) {
  return absl::UnimplementedError(
      absl::StrFormat("%s is not available from this CUDA backend", call));
}
}  // namespace

absl::StatusOr<void*> CudaApi::DeviceMalloc(uint64_t) { return Unimplemented("cudaMalloc"); }
absl::Status CudaApi::DeviceFree(void*) { return Unimplemented("cudaFree"); }
absl::StatusOr<void*> CudaApi::CreateTimingEvent() { return Unimplemented("cudaEventCreate"); }
absl::StatusOr<double> CudaApi::EventElapsedSeconds(void*, void*) {
  return Unimplemented("cudaEventElapsedTime");
}

std::string NormalizeGpuUuid(absl::string_view id) {
  std::string s = absl::AsciiStrToLower(absl::StripAsciiWhitespace(id));
  if (s.size() == 36 && s.rfind("gpu-", 0) != 0) s = "gpu-" + s;
  if (s.rfind("gpu-", 0) == 0) s.replace(0, 4, "GPU-");
  return s;
}

std::string FormatGpuUuid(const unsigned char b[16]) {
  return absl::StrFormat(
      "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1], b[2],
      b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
}

}  // namespace offloadd::copy
