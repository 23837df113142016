#include "client/cuda_export.h"

#include <atomic>

#include "absl/strings/str_format.h"

#ifdef OFFLOADD_CLIENT_HAVE_CUDA
#include <cuda.h>
#include <cuda_runtime_api.h>

#include <cstring>

#include "common/base/mutex.h"
#endif

namespace offloadd::client {

CudaExporter::CudaExporter(std::unique_ptr<ClientCudaApi> api) : api_(std::move(api)) {}

CudaExporter::~CudaExporter() {
  for (auto& [device, events] : pool_) {
    for (IpcEvent& e : events) api_->DestroyEvent(e.event);
  }
}

absl::StatusOr<ExportedPointer> CudaExporter::Export(uint64_t ptr, uint64_t bytes) {
  if (bytes == 0) return absl::InvalidArgumentError("export of 0 bytes: pass the tensor's size");
  auto info = api_->Describe(ptr);
  if (!info.ok()) return info.status();
  if (!info->legacy_ipc_capable) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "device memory at 0x%x comes from a VMM allocator (cuMemCreate), which has no CUDA IPC "
        "handle offloadd can open: for PyTorch set PYTORCH_CUDA_ALLOC_CONF="
        "expandable_segments:False before the first CUDA allocation (or allocate offloaded "
        "tensors with cudaMalloc)",
        ptr));
  }
  if (ptr < info->base || bytes > info->size_bytes - (ptr - info->base)) {
    return absl::OutOfRangeError(absl::StrFormat(
        "[0x%x, +%d) does not fit in its allocation [0x%x, +%d): export each allocation's "
        "tensors separately",
        ptr, bytes, info->base, info->size_bytes));
  }
  base::MutexLock lock(mu_);
  ExportedPointer out;
  out.base = info->base;
  out.allocation_bytes = info->size_bytes;
  out.offset = ptr - info->base;
  out.buffer_id = info->buffer_id;
  auto h = handles_.find(info->buffer_id);
  if (h == handles_.end()) {
    auto handle = api_->IpcGetMemHandle(info->base);
    if (!handle.ok()) return handle.status();
    h = handles_.emplace(info->buffer_id, *handle).first;
    ++stats_.handles_created_total;
  }
  out.ipc_handle = h->second;
  auto u = uuids_.find(info->device);
  if (u == uuids_.end()) {
    auto uuid = api_->DeviceUuid(info->device);
    if (!uuid.ok()) return uuid.status();
    u = uuids_.emplace(info->device, *uuid).first;
  }
  out.device_uuid = u->second;
  ++stats_.exports_total;
  return out;
}

size_t CudaExporter::ForgetAll() {
  base::MutexLock lock(mu_);
  size_t n = handles_.size();
  handles_.clear();
  return n;
}

absl::StatusOr<IpcEvent> CudaExporter::AcquireEvent() {
  auto device = api_->CurrentDevice();
  if (!device.ok()) return device.status();
  {
    base::MutexLock lock(mu_);
    auto& pool = pool_[*device];
    if (!pool.empty()) {
      IpcEvent e = pool.back();
      pool.pop_back();
      --stats_.events_pooled;
      ++stats_.events_in_use;
      return e;
    }
  }
  auto event = api_->CreateIpcEvent();
  if (!event.ok()) return event.status();
  auto handle = api_->IpcGetEventHandle(*event);
  if (!handle.ok()) {
    api_->DestroyEvent(*event);
    return handle.status();
  }
  base::MutexLock lock(mu_);
  ++stats_.events_created_total;
  ++stats_.events_in_use;
  return IpcEvent{*event, *device, *handle};
}

absl::StatusOr<IpcEvent> CudaExporter::RecordReady(void* stream) {
  auto e = AcquireEvent();
  if (!e.ok()) return e;
  absl::Status st = api_->EventRecord(e->event, stream);
  if (!st.ok()) {
    ReleaseEvent(*e);
    return st;
  }
  return e;
}

void CudaExporter::ReleaseEvent(const IpcEvent& event) {
  base::MutexLock lock(mu_);
  pool_[event.device].push_back(event);
  ++stats_.events_pooled;
  --stats_.events_in_use;
}

ExportStats CudaExporter::stats() const {
  base::MutexLock lock(mu_);
  return stats_;
}

#ifdef OFFLOADD_CLIENT_HAVE_CUDA
namespace {

absl::Status Err(const char* function, cudaError_t e) {
  if (e == cudaSuccess) return absl::OkStatus();
  // Clear the thread's last error: the caller's next launch check must not report ours.
  (void)cudaGetLastError();
  return absl::FailedPreconditionError(absl::StrFormat(
      "%s: %s (%d): %s", function, cudaGetErrorName(e), static_cast<int>(e), cudaGetErrorString(e)));
}

using PointerGetAttributeFn = CUresult (*)(void*, CUpointer_attribute, CUdeviceptr);

class RealClientCudaApi : public ClientCudaApi {
 public:
  absl::StatusOr<PointerInfo> Describe(uint64_t ptr) override {
    if (get_attr_ == nullptr) {
      void* fn = nullptr;
      cudaDriverEntryPointQueryResult q = cudaDriverEntryPointSymbolNotFound;
      absl::Status st = Err("cudaGetDriverEntryPointByVersion(cuPointerGetAttribute)",
                            cudaGetDriverEntryPointByVersion("cuPointerGetAttribute", &fn, 12000,
                                                             cudaEnableDefault, &q));
      if (!st.ok()) return st;
      if (q != cudaDriverEntryPointSuccess || fn == nullptr) {
        return absl::FailedPreconditionError("cuPointerGetAttribute is not in this driver");
      }
      get_attr_ = reinterpret_cast<PointerGetAttributeFn>(fn);
    }
    PointerInfo info;
    CUdeviceptr p = static_cast<CUdeviceptr>(ptr);
    CUdeviceptr start = 0;
    size_t size = 0;
    unsigned long long buffer_id = 0;  // NOLINT(runtime/int): the driver's type
    int ordinal = -1;
    int legacy = 0;
    const PointerGetAttributeFn get_attr = get_attr_.load();
    if (get_attr(&start, CU_POINTER_ATTRIBUTE_RANGE_START_ADDR, p) != CUDA_SUCCESS ||
        get_attr(&size, CU_POINTER_ATTRIBUTE_RANGE_SIZE, p) != CUDA_SUCCESS ||
        get_attr(&ordinal, CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL, p) != CUDA_SUCCESS) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "0x%x is not device memory known to CUDA in this process: export tensors on a GPU",
          ptr));
    }
    if (get_attr(&buffer_id, CU_POINTER_ATTRIBUTE_BUFFER_ID, p) != CUDA_SUCCESS) buffer_id = 0;
    if (get_attr(&legacy, CU_POINTER_ATTRIBUTE_IS_LEGACY_CUDA_IPC_CAPABLE, p) != CUDA_SUCCESS) {
      legacy = 0;
    }
    info.base = start;
    info.size_bytes = size;
    info.buffer_id = buffer_id != 0 ? buffer_id : start;
    info.device = ordinal;
    info.legacy_ipc_capable = legacy != 0;
    return info;
  }

  absl::StatusOr<std::string> DeviceUuid(int device) override {
    cudaDeviceProp p;
    absl::Status st = Err("cudaGetDeviceProperties", cudaGetDeviceProperties(&p, device));
    if (!st.ok()) return st;
    const auto* b = reinterpret_cast<const unsigned char*>(p.uuid.bytes);
    return absl::StrFormat(
        "GPU-%02x%02x%02x%02x-%02x%02x-%02x%02x-%02x%02x-%02x%02x%02x%02x%02x%02x", b[0], b[1],
        b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]);
  }

  absl::StatusOr<std::string> IpcGetMemHandle(uint64_t base) override {
    cudaIpcMemHandle_t h;
    absl::Status st =
        Err("cudaIpcGetMemHandle", cudaIpcGetMemHandle(&h, reinterpret_cast<void*>(base)));
    if (!st.ok()) return st;
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
  }

  absl::StatusOr<int> CurrentDevice() override {
    int d = -1;
    absl::Status st = Err("cudaGetDevice", cudaGetDevice(&d));
    if (!st.ok()) return st;
    return d;
  }

  absl::StatusOr<void*> CreateIpcEvent() override {
    cudaEvent_t e = nullptr;
    absl::Status st = Err("cudaEventCreateWithFlags",
                          cudaEventCreateWithFlags(
                              &e, cudaEventInterprocess | cudaEventDisableTiming));
    if (!st.ok()) return st;
    return static_cast<void*>(e);
  }

  absl::StatusOr<std::string> IpcGetEventHandle(void* event) override {
    cudaIpcEventHandle_t h;
    absl::Status st = Err("cudaIpcGetEventHandle",
                          cudaIpcGetEventHandle(&h, static_cast<cudaEvent_t>(event)));
    if (!st.ok()) return st;
    return std::string(reinterpret_cast<const char*>(&h), sizeof(h));
  }

  absl::Status EventRecord(void* event, void* stream) override {
    return Err("cudaEventRecord", cudaEventRecord(static_cast<cudaEvent_t>(event),
                                                  static_cast<cudaStream_t>(stream)));
  }

  absl::Status StreamWaitEvent(void* stream, void* event) override {
    return Err("cudaStreamWaitEvent", cudaStreamWaitEvent(static_cast<cudaStream_t>(stream),
                                                          static_cast<cudaEvent_t>(event), 0));
  }

  void DestroyEvent(void* event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }

 private:
  std::atomic<PointerGetAttributeFn> get_attr_{nullptr};
};

}  // namespace

std::unique_ptr<ClientCudaApi> NewRealClientCudaApi() {
  return std::make_unique<RealClientCudaApi>();
}
#else
std::unique_ptr<ClientCudaApi> NewRealClientCudaApi() { return nullptr; }
#endif

}  // namespace offloadd::client
