#include "server/copy/cuda/cuda_api_forwarding.h"

#include <algorithm>
#include <cstring>

namespace offloadd::copy {

absl::StatusOr<std::vector<CudaDeviceInfo>> ForwardingCudaApi::ListDevices() {
  return target_->ListDevices();
}
absl::Status ForwardingCudaApi::SetDevice(int ordinal) { return target_->SetDevice(ordinal); }
absl::StatusOr<CudaMemInfo> ForwardingCudaApi::MemGetInfo() { return target_->MemGetInfo(); }
absl::StatusOr<void*> ForwardingCudaApi::CreateStream() { return target_->CreateStream(); }
void ForwardingCudaApi::DestroyStream(void* stream) { target_->DestroyStream(stream); }
absl::StatusOr<void*> ForwardingCudaApi::CreateEvent() { return target_->CreateEvent(); }
void ForwardingCudaApi::DestroyEvent(void* event) { target_->DestroyEvent(event); }
absl::StatusOr<void*> ForwardingCudaApi::IpcOpenMemHandle(absl::string_view handle) {
  return target_->IpcOpenMemHandle(handle);
}
absl::Status ForwardingCudaApi::IpcCloseMemHandle(void* device_ptr) {
  return target_->IpcCloseMemHandle(device_ptr);
}
absl::StatusOr<uint64_t> ForwardingCudaApi::AllocationSize(void* device_ptr) {
  return target_->AllocationSize(device_ptr);
}
absl::StatusOr<void*> ForwardingCudaApi::IpcOpenEventHandle(absl::string_view handle) {
  return target_->IpcOpenEventHandle(handle);
}
absl::Status ForwardingCudaApi::StreamWaitEvent(void* stream, void* event) {
  return target_->StreamWaitEvent(stream, event);
}
absl::Status ForwardingCudaApi::MemcpyAsync(void* dst, const void* src, uint64_t bytes,
                                            Direction direction, void* stream) {
  return target_->MemcpyAsync(dst, src, bytes, direction, stream);
}
absl::Status ForwardingCudaApi::EventRecord(void* event, void* stream) {
  return target_->EventRecord(event, stream);
}
absl::StatusOr<bool> ForwardingCudaApi::EventQuery(void* event) {
  return target_->EventQuery(event);
}
absl::Status ForwardingCudaApi::HostRegister(void* host, uint64_t bytes) {
  return target_->HostRegister(host, bytes);
}
absl::Status ForwardingCudaApi::HostUnregister(void* host) {
  return target_->HostUnregister(host);
}

absl::StatusOr<void*> ForwardingCudaApi::DeviceMalloc(uint64_t bytes) {
  return target_->DeviceMalloc(bytes);
}
absl::Status ForwardingCudaApi::DeviceFree(void* device_ptr) {
  return target_->DeviceFree(device_ptr);
}
absl::StatusOr<void*> ForwardingCudaApi::CreateTimingEvent() {
  return target_->CreateTimingEvent();
}
absl::StatusOr<double> ForwardingCudaApi::EventElapsedSeconds(void* start, void* end) {
  return target_->EventElapsedSeconds(start, end);
}

std::string PadIpcHandle(absl::string_view text) {
  std::string handle(kIpcHandleBytes, '\0');
  std::memcpy(&handle[0], text.data(), std::min(text.size(), handle.size()));
  return handle;
}

}  // namespace offloadd::copy
