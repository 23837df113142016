// Pieces the two CudaApi stand-ins (FakeCudaApi in cuda_api_fake.h, SimCudaApi in
// cuda_api_sim.h) share.
//
// ForwardingCudaApi: a CudaApi that forwards every call, unchanged, to another CudaApi it does
// not own. An engine owns its CudaApi; handing it a ForwardingCudaApi lets a test or benchmark
// keep reading the stand-in after the engine is gone. The target must outlive the forwarder.
//
// PadIpcHandle: `text` as an IPC handle: its first kIpcHandleBytes bytes, zero-padded to exactly
// kIpcHandleBytes (64) bytes.
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_API_FORWARDING_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_API_FORWARDING_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "server/copy/cuda/cuda_api.h"

namespace offloadd::copy {

class ForwardingCudaApi : public CudaApi {
 public:
  explicit ForwardingCudaApi(CudaApi* target) : target_(target) {}

  absl::StatusOr<std::vector<CudaDeviceInfo>> ListDevices() override;
  absl::Status SetDevice(int ordinal) override;
  absl::StatusOr<CudaMemInfo> MemGetInfo() override;
  absl::StatusOr<void*> CreateStream() override;
  void DestroyStream(void* stream) override;
  absl::StatusOr<void*> CreateEvent() override;
  void DestroyEvent(void* event) override;
  absl::StatusOr<void*> IpcOpenMemHandle(absl::string_view handle) override;
  absl::Status IpcCloseMemHandle(void* device_ptr) override;
  absl::StatusOr<uint64_t> AllocationSize(void* device_ptr) override;
  absl::StatusOr<void*> IpcOpenEventHandle(absl::string_view handle) override;
  absl::Status StreamWaitEvent(void* stream, void* event) override;
  absl::Status MemcpyAsync(void* dst, const void* src, uint64_t bytes, Direction direction,
                           void* stream) override;
  absl::Status EventRecord(void* event, void* stream) override;
  absl::StatusOr<bool> EventQuery(void* event) override;
  absl::Status HostRegister(void* host, uint64_t bytes) override;
  absl::Status HostUnregister(void* host) override;
  absl::StatusOr<void*> DeviceMalloc(uint64_t bytes) override;
  absl::Status DeviceFree(void* device_ptr) override;
  absl::StatusOr<void*> CreateTimingEvent() override;
  absl::StatusOr<double> EventElapsedSeconds(void* start, void* end) override;

 private:
  CudaApi* const target_;
};

std::string PadIpcHandle(absl::string_view text);

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_API_FORWARDING_H_
