// The real CUDA backend of copy_sim_bench (copy_bench_backend.h): calibration of the timing
// model on a GPU machine (tests/gpu/run.sh). Device memory is cudaMalloc'ed here and handed to
// the engine through IPC-handle-shaped names this backend's CudaApi resolves itself (CUDA does
// not open a process's own IPC handles); host buffers are pinned (cudaHostAlloc, portable).
// Everything else (streams, events, copies) goes to the real driver unchanged.
#include "bench/copy_bench_backend.h"

#ifdef OFFLOADD_HAVE_CUDA

#include <cuda_runtime_api.h>

#include <atomic>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/copy/cuda/cuda_api_forwarding.h"

namespace offloadd::bench {
namespace {

constexpr int kMaxGpus = 64;
constexpr char kHandlePrefix[] = "copy-bench-mem:";

class RealBackend;

// The real CudaApi, with this process's own allocations opened by name and copies counted.
class CountingApi : public copy::ForwardingCudaApi {
 public:
  CountingApi(copy::CudaApi* real, RealBackend* backend)
      : ForwardingCudaApi(real), backend_(backend) {}
  absl::StatusOr<void*> IpcOpenMemHandle(absl::string_view handle) override;
  absl::Status IpcCloseMemHandle(void* device_ptr) override;
  absl::StatusOr<uint64_t> AllocationSize(void* device_ptr) override;
  absl::Status MemcpyAsync(void* dst, const void* src, uint64_t bytes, copy::Direction direction,
                           void* stream) override;

 private:
  RealBackend* backend_;
};

class RealBackend : public CopyBenchBackend {
 public:
  RealBackend(std::unique_ptr<copy::CudaApi> real, std::vector<copy::CudaDeviceInfo> devices)
      : real_(std::move(real)), devices_(std::move(devices)) {
    for (auto& g : bytes_) g[0] = g[1] = 0;
  }
  ~RealBackend() override {
    for (auto& [handle, a] : allocations_) {
      cudaSetDevice(a.gpu);
      cudaFree(a.ptr);
    }
    for (auto& [key, p] : host_) cudaFreeHost(p);
  }

  std::unique_ptr<copy::CudaApi> Borrow() override {
    return std::make_unique<CountingApi>(real_.get(), this);
  }
  std::string AddAllocation(int gpu, uint64_t size_bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    const std::string handle =
        copy::PadIpcHandle(absl::StrCat(kHandlePrefix, gpu, ":", size_bytes));
    if (allocations_.count(handle) != 0) return handle;  // reused by every window
    void* p = nullptr;
    cudaSetDevice(gpu);
    if (cudaMalloc(&p, size_bytes) != cudaSuccess) {
      cudaGetLastError();
      return handle;  // not registered: OpenRegion reports it
    }
    allocations_[handle] = {gpu, p, size_bytes};
    return handle;
  }
  std::string DeviceUuid(int gpu) override { return devices_[gpu].uuid; }
  uint8_t* HostBuffer(int gpu, int slot, int, uint64_t bytes) override {
    std::lock_guard<std::mutex> lock(mu_);
    void*& p = host_[{gpu, slot}];
    if (p == nullptr && cudaHostAlloc(&p, bytes, cudaHostAllocPortable) != cudaSuccess) {
      cudaGetLastError();
      p = nullptr;
    }
    return static_cast<uint8_t*>(p);
  }
  uint64_t BytesDone(int gpu, copy::Direction d) override {
    return bytes_[gpu][static_cast<int>(d)].load();
  }
  double DriverHostSeconds() override { return 0; }

  // For CountingApi.
  void* Find(absl::string_view handle, uint64_t* size) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = allocations_.find(std::string(handle));
    if (it == allocations_.end()) return nullptr;
    *size = it->second.size_bytes;
    return it->second.ptr;
  }
  // The GPU whose allocation holds `ptr`, and its size; -1 when none.
  int Owner(const void* ptr, uint64_t* size) {
    std::lock_guard<std::mutex> lock(mu_);
    const auto p = reinterpret_cast<uintptr_t>(ptr);
    for (const auto& [handle, a] : allocations_) {
      const auto base = reinterpret_cast<uintptr_t>(a.ptr);
      if (p >= base && p < base + a.size_bytes) {
        if (size != nullptr) *size = a.size_bytes;
        return a.gpu;
      }
    }
    return -1;
  }
  void Count(int gpu, copy::Direction d, uint64_t bytes) {
    if (gpu >= 0 && gpu < kMaxGpus) bytes_[gpu][static_cast<int>(d)] += bytes;
  }

 private:
  struct Allocation {
    int gpu;
    void* ptr;
    uint64_t size_bytes;
  };
  std::unique_ptr<copy::CudaApi> real_;
  std::vector<copy::CudaDeviceInfo> devices_;
  std::mutex mu_;
  std::map<std::string, Allocation> allocations_;
  std::map<std::pair<int, int>, void*> host_;
  std::atomic<uint64_t> bytes_[kMaxGpus][2];
};

absl::StatusOr<void*> CountingApi::IpcOpenMemHandle(absl::string_view handle) {
  uint64_t size = 0;
  if (void* p = backend_->Find(handle, &size)) return p;
  return ForwardingCudaApi::IpcOpenMemHandle(handle);
}

absl::Status CountingApi::IpcCloseMemHandle(void* device_ptr) {
  if (backend_->Owner(device_ptr, nullptr) >= 0) return absl::OkStatus();  // freed at the end
  return ForwardingCudaApi::IpcCloseMemHandle(device_ptr);
}

absl::StatusOr<uint64_t> CountingApi::AllocationSize(void* device_ptr) {
  uint64_t size = 0;
  if (backend_->Owner(device_ptr, &size) >= 0) return size;
  return ForwardingCudaApi::AllocationSize(device_ptr);
}

absl::Status CountingApi::MemcpyAsync(void* dst, const void* src, uint64_t bytes,
                                      copy::Direction direction, void* stream) {
  absl::Status st = ForwardingCudaApi::MemcpyAsync(dst, src, bytes, direction, stream);
  if (st.ok()) {
    const void* dev = direction == copy::Direction::kDeviceToHost ? src : dst;
    backend_->Count(backend_->Owner(dev, nullptr), direction, bytes);
  }
  return st;
}

}  // namespace

absl::StatusOr<std::unique_ptr<CopyBenchBackend>> NewRealCudaBenchBackend(int gpus) {
  std::unique_ptr<copy::CudaApi> real = copy::NewRealCudaApi();
  auto devices = real->ListDevices();
  if (!devices.ok()) {
    return absl::UnavailableError(
        absl::StrCat("no usable CUDA driver or GPU here (", devices.status().message(), ")"));
  }
  if (static_cast<int>(devices->size()) < gpus || gpus > kMaxGpus) {
    return absl::UnavailableError(absl::StrCat("asked for ", gpus, " GPUs, this machine has ",
                                               devices->size(), ": pass --gpus=N"));
  }
  return std::unique_ptr<CopyBenchBackend>(new RealBackend(std::move(real), *std::move(devices)));
}

}  // namespace offloadd::bench

#else  // !OFFLOADD_HAVE_CUDA

namespace offloadd::bench {

absl::StatusOr<std::unique_ptr<CopyBenchBackend>> NewRealCudaBenchBackend(int) {
  return absl::UnimplementedError(
      "this copy_sim_bench was built without the CUDA toolkit; --backend=cuda needs the build "
      "in the GPU bundle (make gpu-bundle: bin/copy_sim_bench)");
}

}  // namespace offloadd::bench

#endif  // OFFLOADD_HAVE_CUDA
