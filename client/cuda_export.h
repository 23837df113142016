// Client-side export of device memory to offloadd's cuda backend (docs/ARCHITECTURE.md, "One
// offload, from the hook to the pool").
//
// For a device pointer the exporter finds the allocation it lies in (base and size), gets the
// allocation's CUDA IPC memory handle once and caches it, and returns (handle, base, size,
// offset of the pointer, GPU UUID): the client registers the *base* once per allocation and sends
// offsets per request. The cache is keyed by the allocation's buffer id
// (CU_POINTER_ATTRIBUTE_BUFFER_ID, unique per allocation in the process), so a freed and
// re-allocated address gets a fresh handle, never a stale one.
//
// Memory from VMM allocators (cuMemCreate/cuMemMap, e.g. PyTorch with
// PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True) or memory pools (cudaMallocAsync) has no
// legacy IPC handle: Export returns FAILED_PRECONDITION naming that setting. Every failed
// runtime call here is followed by cudaGetLastError(), so the caller's next kernel launch check
// does not report offloadd's error as its own.
//
// It also keeps a pool of interprocess events (cudaEventInterprocess | cudaEventDisableTiming)
// with their IPC handles: an offload's ready event is recorded on the producing stream and its
// handle sent with the request; a reload's done event is one the daemon records. An event goes
// back to the pool only when the request that uses it has completed (the daemon may still wait
// on it before that): never destroy or re-record an exported event earlier.
//
// The CUDA calls sit behind ClientCudaApi so the logic is tested with a fake; NewRealClientCudaApi
// (cudart, plus cuPointerGetAttribute through cudaGetDriverEntryPointByVersion, so nothing links
// libcuda) exists only in builds with the CUDA toolkit; NewSimClientCudaApi
// (sim_client_cuda_api.h) runs the exporter on a simulated GPU against a cuda-sim daemon, in
// every build. Not thread-safe internally beyond a
// mutex per exporter: every method may be called from any thread that has the pointer's device
// current.
#ifndef OFFLOADD_CLIENT_CUDA_EXPORT_H_
#define OFFLOADD_CLIENT_CUDA_EXPORT_H_

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"

namespace offloadd::client {

inline constexpr size_t kExportHandleBytes = 64;

struct PointerInfo {
  uint64_t base = 0, size_bytes = 0;  // the allocation containing the pointer
  uint64_t buffer_id = 0;             // unique per allocation within the process
  int device = -1;                    // this process's ordinal
  bool legacy_ipc_capable = false;    // false for VMM (cuMemCreate) memory
};

class ClientCudaApi {
 public:
  virtual ~ClientCudaApi() = default;
  // Errors: INVALID_ARGUMENT when `ptr` is not device memory known to CUDA; FAILED_PRECONDITION
  // for driver errors.
  virtual absl::StatusOr<PointerInfo> Describe(uint64_t ptr) = 0;
  // "GPU-xxxxxxxx-..." of a device ordinal of this process.
  virtual absl::StatusOr<std::string> DeviceUuid(int device) = 0;
  virtual absl::StatusOr<std::string> IpcGetMemHandle(uint64_t base) = 0;  // 64 bytes
  virtual absl::StatusOr<int> CurrentDevice() = 0;
  // An interprocess event on the current device, and its IPC handle (64 bytes).
  virtual absl::StatusOr<void*> CreateIpcEvent() = 0;
  virtual absl::StatusOr<std::string> IpcGetEventHandle(void* event) = 0;
  virtual absl::Status EventRecord(void* event, void* stream) = 0;
  virtual absl::Status StreamWaitEvent(void* stream, void* event) = 0;
  virtual void DestroyEvent(void* event) = 0;
};

// The real implementation (cudart), or nullptr in builds without the CUDA toolkit.
std::unique_ptr<ClientCudaApi> NewRealClientCudaApi();

struct ExportedPointer {
  std::string ipc_handle;  // cudaIpcMemHandle_t of the allocation base (64 bytes)
  uint64_t base = 0;
  uint64_t allocation_bytes = 0;  // register the region with this size
  uint64_t offset = 0;            // of the pointer within the allocation
  uint64_t buffer_id = 0;
  std::string device_uuid;  // the Hello device_id of a session for this GPU
};

struct IpcEvent {
  void* event = nullptr;
  int device = -1;
  std::string handle;  // 64 bytes
};

struct ExportStats {
  uint64_t handles_created_total = 0, exports_total = 0;
  uint64_t events_created_total = 0, events_pooled = 0, events_in_use = 0;
};

class CudaExporter {
 public:
  explicit CudaExporter(std::unique_ptr<ClientCudaApi> api);
  ~CudaExporter();  // destroys pooled events (events in use are the caller's to return first)

  // Errors: INVALID_ARGUMENT for bytes == 0 or a non-device pointer; OUT_OF_RANGE when
  // [ptr, ptr + bytes) does not fit in one allocation; FAILED_PRECONDITION for VMM memory
  // (message names PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False) or CUDA errors.
  absl::StatusOr<ExportedPointer> Export(uint64_t ptr, uint64_t bytes);
  // Drops every cached handle; returns how many. Never needed for correctness: handles are
  // cached by buffer id, which a new allocation never reuses, and the daemon maps an allocation
  // only while a transfer of it is in flight, so memory can be freed at any time once its
  // transfers completed (docs/ARCHITECTURE.md, "Mappings that follow the allocator").
  size_t ForgetAll();

  // An event of the current device from the pool (created when the pool has none).
  absl::StatusOr<IpcEvent> AcquireEvent();
  // AcquireEvent + EventRecord on `stream`: the ready event of an offload.
  absl::StatusOr<IpcEvent> RecordReady(void* stream);
  // Returns an event to the pool once the request that used it has completed.
  void ReleaseEvent(const IpcEvent& event);

  ExportStats stats() const;

 private:
  std::unique_ptr<ClientCudaApi> api_;
  mutable base::Mutex mu_;
  std::map<uint64_t, std::string> handles_ GUARDED_BY(mu_);    // buffer id -> IPC handle
  std::map<int, std::string> uuids_ GUARDED_BY(mu_);           // device ordinal -> UUID
  std::map<int, std::vector<IpcEvent>> pool_ GUARDED_BY(mu_);  // by device
  ExportStats stats_ GUARDED_BY(mu_);
};

}  // namespace offloadd::client

#endif  // OFFLOADD_CLIENT_CUDA_EXPORT_H_
