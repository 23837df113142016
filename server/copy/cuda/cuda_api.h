// CudaApi: the few CUDA runtime/driver calls the cuda copy backend makes, behind one interface so
// the handle cache, ref-counts, thread affinity and ordering logic in cuda_engine.cc are
// unit-tested on CPU against FakeCudaApi (cuda_api_fake.h). The real implementation
// (cuda_api_real.cc, built only with the CUDA toolkit) forwards to libcudart; the one driver call
// (cuMemGetAddressRange) is reached through cudaGetDriverEntryPointByVersion, so nothing links
// libcuda: the driver's libcuda.so.1 is loaded by cudart at run time.
//
// Threading contract (docs/ARCHITECTURE.md, "Pitfalls"): ListDevices() may run on any thread and
// creates no context. Every other call acts on "the current device" and must run on the thread that
// owns that device, after SetDevice(ordinal) on that thread (which creates the device's primary
// context, ~0.3-0.5 GiB of device memory on recent GPUs: the engine creates it lazily).
// HostRegister/HostUnregister are host-memory operations (portable registrations, valid for
// every context); they still need some device current on the calling thread.
//
// Opaque handles: streams and events are `void*` (cudaStream_t / cudaEvent_t), device memory is
// `void*`. IPC handles are std::string of exactly kIpcHandleBytes bytes (cudaIpcMemHandle_t /
// cudaIpcEventHandle_t, 64 bytes each in CUDA 11-13).
//
// Errors: every call returns FAILED_PRECONDITION (or the fake's injected status) carrying the
// CUDA function name, error name and number, e.g.
// "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle (400): invalid resource handle".
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_API_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_API_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/copy/copy_engine.h"

namespace offloadd::copy {

inline constexpr size_t kIpcHandleBytes = 64;

struct CudaDeviceInfo {
  int ordinal = -1;         // this process's ordinal (differs between processes: never sent)
  std::string uuid;         // "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx", lower-case hex
  std::string pci_bus_id;   // "0000:1b:00.0", lower-case, as in /sys/bus/pci/devices
  std::string name;         // e.g. "NVIDIA H200"
  uint64_t total_bytes = 0; // device memory
};

struct CudaMemInfo {
  uint64_t free_bytes = 0, total_bytes = 0;
};

class CudaApi {
 public:
  virtual ~CudaApi() = default;

  // Any thread, no context. Error: FAILED_PRECONDITION when there is no driver (error 35,
  // cudaErrorInsufficientDriver) or no device (100).
  virtual absl::StatusOr<std::vector<CudaDeviceInfo>> ListDevices() = 0;

  // Makes `ordinal` current on the calling thread (cudaSetDevice; creates its primary context).
  virtual absl::Status SetDevice(int ordinal) = 0;
  virtual absl::StatusOr<CudaMemInfo> MemGetInfo() = 0;

  // A non-blocking stream (cudaStreamNonBlocking: no implicit sync with the legacy stream).
  virtual absl::StatusOr<void*> CreateStream() = 0;
  virtual void DestroyStream(void* stream) = 0;
  // A local event with timing disabled (the engine's copy-completion events).
  virtual absl::StatusOr<void*> CreateEvent() = 0;
  virtual void DestroyEvent(void* event) = 0;

  // cudaIpcOpenMemHandle(..., cudaIpcMemLazyEnablePeerAccess): the base of the exporter's
  // allocation. CUDA counts repeated opens of one handle in a process (the same address comes
  // back; each needs its close); the engine opens an allocation once per set of overlapping
  // transfers. Slow (120-270 µs measured elsewhere): the engine calls it on a mapper thread.
  virtual absl::StatusOr<void*> IpcOpenMemHandle(absl::string_view handle) = 0;
  virtual absl::Status IpcCloseMemHandle(void* device_ptr) = 0;
  // Size in bytes of the allocation mapped at `device_ptr` (cuMemGetAddressRange).
  virtual absl::StatusOr<uint64_t> AllocationSize(void* device_ptr) = 0;
  // cudaIpcOpenEventHandle; the result is released with DestroyEvent.
  virtual absl::StatusOr<void*> IpcOpenEventHandle(absl::string_view handle) = 0;

  virtual absl::Status StreamWaitEvent(void* stream, void* event) = 0;
  // kDeviceToHost: dst is host, src is device; kHostToDevice: the reverse.
  virtual absl::Status MemcpyAsync(void* dst, const void* src, uint64_t bytes, Direction direction,
                                   void* stream) = 0;
  virtual absl::Status EventRecord(void* event, void* stream) = 0;
  // true when every operation captured by the event's last record has completed
  // (cudaEventQuery == cudaSuccess), false while cudaErrorNotReady; an error otherwise.
  virtual absl::StatusOr<bool> EventQuery(void* event) = 0;

  // cudaHostRegister(host, bytes, cudaHostRegisterPortable) / cudaHostUnregister.
  virtual absl::Status HostRegister(void* host, uint64_t bytes) = 0;
  virtual absl::Status HostUnregister(void* host) = 0;

  // For measuring copy rates (cuda_rate_meter.h). The defaults answer UNIMPLEMENTED naming
  // the call, so an implementation without them cannot calibrate and says so.
  // `bytes` of device memory on the current device (cudaMalloc); released with DeviceFree
  // (cudaFree). Errors: FAILED_PRECONDITION, e.g. cudaErrorMemoryAllocation (2).
  virtual absl::StatusOr<void*> DeviceMalloc(uint64_t bytes);
  virtual absl::Status DeviceFree(void* device_ptr);
  // An event with timing enabled (cudaEventCreate's default flags), released with
  // DestroyEvent; EventRecord and EventQuery work on it as on CreateEvent's.
  virtual absl::StatusOr<void*> CreateTimingEvent();
  // Seconds between the device-side completions of two timing events' last records, both
  // complete (cudaEventElapsedTime, milliseconds with ~0.5 µs resolution, / 1000). Negative
  // when `end` completed first. FAILED_PRECONDITION when either is not complete
  // (cudaErrorNotReady) or was not created with timing.
  virtual absl::StatusOr<double> EventElapsedSeconds(void* start, void* end);
};

// The real implementation over libcudart, or nullptr in a build without the CUDA toolkit.
std::unique_ptr<CudaApi> NewRealCudaApi();

// "GPU-2f0c..." and "2F0C..." name the same device: lower-case, "GPU-" prefix added when the
// rest is 36 characters of UUID text. Used to compare client device ids with CudaDeviceInfo.uuid.
std::string NormalizeGpuUuid(absl::string_view id);

// Formats 16 raw UUID bytes as "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's form).
std::string FormatGpuUuid(const unsigned char bytes[16]);

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_API_H_
