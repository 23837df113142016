// CudaApi over libcudart (built only where the CUDA toolkit is present; see cuda_api.h).
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>
#include <mutex>

#include "absl/strings/ascii.h"
#include "absl/strings/str_format.h"
#include "server/copy/cuda/cuda_api.h"

namespace offloadd::copy {
namespace {

absl::Status Err(const char* function, cudaError_t e) {
  if (e == cudaSuccess) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: %s (%d): %s", function, cudaGetErrorName(e), static_cast<int>(e), cudaGetErrorString(e)));
}

// CUresult cuMemGetAddressRange(CUdeviceptr* base, size_t* size, CUdeviceptr ptr), v2 ABI.
using GetAddressRangeFn = CUresult (*)(CUdeviceptr*, size_t*, CUdeviceptr);

class RealCudaApi : public CudaApi {
 public:
  absl::StatusOr<std::vector<CudaDeviceInfo>> ListDevices() override {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
      cudaGetLastError();  // clear the sticky-free error so later calls report their own
      return Err("cudaGetDeviceCount", e);
    }
    std::vector<CudaDeviceInfo> out;
    for (int i = 0; i < n; ++i) {
      cudaDeviceProp p;
      if (absl::Status st = Err("cudaGetDeviceProperties", cudaGetDeviceProperties(&p, i));
          !st.ok()) {
        return st;
      }
      CudaDeviceInfo d;
      d.ordinal = i;
      d.uuid = FormatGpuUuid(reinterpret_cast<const unsigned char*>(p.uuid.bytes));
      char bus[64] = {0};
      if (absl::Status st = Err("cudaDeviceGetPCIBusId", cudaDeviceGetPCIBusId(bus, 63, i));
          !st.ok()) {
        return st;
      }
      d.pci_bus_id = absl::AsciiStrToLower(bus);
      d.name = p.name;
      d.total_bytes = p.totalGlobalMem;
      out.push_back(std::move(d));
    }
    return out;
  }

  absl::Status SetDevice(int ordinal) override {
    absl::Status st = Err("cudaSetDevice", cudaSetDevice(ordinal));
    if (!st.ok()) return st;
    // cudaSetDevice initialises the primary context since CUDA 12; cudaFree(0) makes sure.
    return Err("cudaFree(0)", cudaFree(nullptr));
  }

  absl::StatusOr<CudaMemInfo> MemGetInfo() override {
    size_t free_bytes = 0, total_bytes = 0;
    absl::Status st = Err("cudaMemGetInfo", cudaMemGetInfo(&free_bytes, &total_bytes));
    if (!st.ok()) return st;
    return CudaMemInfo{free_bytes, total_bytes};
  }

  absl::StatusOr<void*> CreateStream() override {
    cudaStream_t s = nullptr;
    absl::Status st =
        Err("cudaStreamCreateWithFlags", cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    if (!st.ok()) return st;
    return static_cast<void*>(s);
  }
  void DestroyStream(void* stream) override {
    cudaStreamDestroy(static_cast<cudaStream_t>(stream));
  }

  absl::StatusOr<void*> CreateEvent() override {
    cudaEvent_t e = nullptr;
    absl::Status st =
        Err("cudaEventCreateWithFlags", cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    if (!st.ok()) return st;
    return static_cast<void*>(e);
  }
  void DestroyEvent(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

  absl::StatusOr<void*> IpcOpenMemHandle(absl::string_view handle) override {
    if (handle.size() != sizeof(cudaIpcMemHandle_t)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("CUDA IPC memory handle has %d bytes, expected %d", handle.size(),
                          sizeof(cudaIpcMemHandle_t)));
    }
    cudaIpcMemHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    void* p = nullptr;
    absl::Status st = Err("cudaIpcOpenMemHandle",
                          cudaIpcOpenMemHandle(&p, h, cudaIpcMemLazyEnablePeerAccess));
    if (!st.ok()) return st;
    return p;
  }
  absl::Status IpcCloseMemHandle(void* device_ptr) override {
    return Err("cudaIpcCloseMemHandle", cudaIpcCloseMemHandle(device_ptr));
  }

  absl::StatusOr<uint64_t> AllocationSize(void* device_ptr) override {
    std::call_once(get_range_once_, [this] {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
      get_range_status_ = Err("cudaGetDriverEntryPointByVersion(cuMemGetAddressRange)",
                              cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000,
                                                               cudaEnableDefault, &q));
      if (get_range_status_.ok() && (q != cudaDriverEntryPointSuccess || fn == nullptr)) {
        get_range_status_ = absl::FailedPreconditionError(
            "cuMemGetAddressRange is not available from this driver");
      }
      get_range_ = reinterpret_cast<GetAddressRangeFn>(fn);
    });
    if (!get_range_status_.ok()) return get_range_status_;
    CUdeviceptr base = 0;
    size_t size = 0;
    CUresult r = get_range_(&base, &size, reinterpret_cast<CUdeviceptr>(device_ptr));
    if (r != CUDA_SUCCESS) {
      return absl::FailedPreconditionError(
          absl::StrFormat("cuMemGetAddressRange: CUresult %d", static_cast<int>(r)));
    }
    return static_cast<uint64_t>(size);
  }

  absl::StatusOr<void*> IpcOpenEventHandle(absl::string_view handle) override {
    if (handle.size() != sizeof(cudaIpcEventHandle_t)) {
      return absl::InvalidArgumentError(
          absl::StrFormat("CUDA IPC event handle has %d bytes, expected %d", handle.size(),
                          sizeof(cudaIpcEventHandle_t)));
    }
    cudaIpcEventHandle_t h;
    std::memcpy(&h, handle.data(), sizeof(h));
    cudaEvent_t e = nullptr;
    absl::Status st = Err("cudaIpcOpenEventHandle", cudaIpcOpenEventHandle(&e, h));
    if (!st.ok()) return st;
    return static_cast<void*>(e);
  }

  absl::Status StreamWaitEvent(void* stream, void* event) override {
    return Err("cudaStreamWaitEvent", cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                                          static_cast<cudaEvent_t>(event), 0));
  }

  absl::Status MemcpyAsync(void* dst, const void* src, uint64_t bytes, Direction direction,
                           void* stream) override {
    return Err("cudaMemcpyAsync",
               cudaMemcpyAsync(dst, src, bytes,
                               direction == Direction::kDeviceToHost ? cudaMemcpyDeviceToHost
                                                                     : cudaMemcpyHostToDevice,
                               static_cast<cudaStream_t>(stream)));
  }

  absl::Status EventRecord(void* event, void* stream) override {
    return Err("cudaEventRecord", cudaEventRecord(static_cast<cudaEvent_t>(event),
                                                  static_cast<cudaStream_t>(stream)));
  }

  absl::StatusOr<bool> EventQuery(void* event) override {
    cudaError_t e = cudaEventQuery(static_cast<cudaEvent_t>(event));
    if (e == cudaSuccess) return true;
    if (e == cudaErrorNotReady) return false;
    return Err("cudaEventQuery", e);
  }

  absl::Status HostRegister(void* host, uint64_t bytes) override {
    return Err("cudaHostRegister", cudaHostRegister(host, bytes, cudaHostRegisterPortable));
  }
  absl::Status HostUnregister(void* host) override {
    return Err("cudaHostUnregister", cudaHostUnregister(host));
  }

  absl::StatusOr<void*> DeviceMalloc(uint64_t bytes) override {
    void* p = nullptr;
    absl::Status st = Err("cudaMalloc", cudaMalloc(&p, bytes));
    if (!st.ok()) return st;
    return p;
  }
  absl::Status DeviceFree(void* device_ptr) override {
    return Err("cudaFree", cudaFree(device_ptr));
  }
  absl::StatusOr<void*> CreateTimingEvent() override {
    cudaEvent_t e = nullptr;
    absl::Status st = Err("cudaEventCreate", cudaEventCreate(&e));
    if (!st.ok()) return st;
    return static_cast<void*>(e);
  }
  absl::StatusOr<double> EventElapsedSeconds(void* start, void* end) override {
    float ms = 0;
    absl::Status st =
        Err("cudaEventElapsedTime", cudaEventElapsedTime(&ms, static_cast<cudaEvent_t>(start),
                                                         static_cast<cudaEvent_t>(end)));
    if (!st.ok()) return st;
    return static_cast<double>(ms) / 1e3;
  }

 private:
  std::once_flag get_range_once_;
  absl::Status get_range_status_;
  GetAddressRangeFn get_range_ = nullptr;
};

}  // namespace

std::unique_ptr<CudaApi> NewRealCudaApi() { return std::make_unique<RealCudaApi>(); }

}  // namespace offloadd::copy
