// Internal state of CudaCopyEngine (cuda_engine.h), shared by cuda_engine.cc (the engine's
// calls, host pool) and cuda_mappings.cc (when client memory is mapped, the event cache, the
// ordered transfer). Not a public header: only those two files and the engine's tests include
// it.
//
// Mapping lifetime (docs/ARCHITECTURE.md, "Mappings that follow the allocator"). A Mapping is
// one client allocation (GPU UUID + IPC handle bytes). Registrations (Regions) only name it; it
// is open in the daemon (cudaIpcOpenMemHandle) exactly while some transfer uses it:
//
//   kClosed --Acquire--> kOpening --opened--> kOpen --last Release--> kClosing --closed--> kClosed
//                            \--failed--> kFailed --last Release--> kClosed
//
// Opens and closes run on the GPU's MapperThread (cuda_mapper.h), never on its device thread.
// An Acquire while kClosing queues an open behind the close (the mapper runs tasks in order). A
// transfer holds its use from BeginTransfer until its order is dropped, after its last chunk
// completed: so the daemon never holds a mapping of memory that no transfer is copying, and a
// training process whose allocator frees a segment (empty_cache, the retry after a failed
// cudaMalloc, exit) frees memory the daemon has no mapping of — the client keeps a tensor alive
// while a transfer of it is in flight, so its segment cannot be freed then.
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_ENGINE_SHARED_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_ENGINE_SHARED_H_

#include <atomic>
#include <list>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/mutex.h"
#include "server/copy/cuda/cuda_device_worker.h"
#include "server/copy/cuda/cuda_engine.h"
#include "server/copy/cuda/cuda_mapper.h"

namespace offloadd::copy {

// A GPU the daemon serves: its device thread and its mapper thread.
struct GpuThreads {
  std::shared_ptr<DeviceWorker> worker;
  std::shared_ptr<MapperThread> mapper;
};

struct Mapping {
  enum class State { kClosed, kOpening, kOpen, kClosing, kFailed };
  std::string key;     // uuid + '\0' + handle bytes
  std::string handle;  // 64 bytes
  std::string uuid;
  GpuThreads gpu;
  // Under Shared::mu.
  State state = State::kClosed;
  absl::Status open_error;  // while kFailed
  void* base = nullptr;     // while kOpen (and kClosing, for the close)
  uint64_t allocation_bytes = 0;  // from the last open
  int registrations = 0;
  int uses = 0;
  int64_t owner_uid = -1;  // the uid of its registrations while it has any; -1: unknown
};

// A client IPC event opened in the daemon (cudaIpcOpenEventHandle on the mapper thread),
// cached per (GPU, handle bytes) and held by the transfers that use it; destroyed on the mapper
// thread when the cache and the last transfer let it go.
struct OpenedEvent {
  enum class State { kOpening, kOpen, kFailed };
  CudaApi* api = nullptr;
  std::shared_ptr<MapperThread> mapper;
  // Under Shared::mu.
  State state = State::kOpening;
  absl::Status error;
  void* event = nullptr;
  int64_t owner_uid = -1;  // of the transfers it was opened for; -1: unknown
  ~OpenedEvent();
};

struct CudaCopyEngine::Shared {
  std::unique_ptr<CudaApi> api;
  CudaEngineOptions options;

  mutable base::Mutex mu;  // guards everything below except the pinner's own fields
  base::CondVar mapping_cv;  // a mapping left kOpening
  bool listed GUARDED_BY(mu) = false;
  std::vector<CudaDeviceInfo> devices GUARDED_BY(mu);
  // Lists the driver's devices into `devices` once (FAILED_PRECONDITION without a driver).
  absl::Status ListLocked() REQUIRES(mu);
  std::map<std::string, GpuThreads> gpus GUARDED_BY(mu);  // by uuid
  std::map<std::string, std::shared_ptr<Mapping>> mappings GUARDED_BY(mu);  // by key
  std::map<std::string, std::shared_ptr<OpenedEvent>> events GUARDED_BY(mu);  // by uuid+handle
  std::list<std::string> event_lru GUARDED_BY(mu);
  // The owners (TransferSpec::owner_id) whose transfers used a cached event, by its key; an
  // event used only with owner 0 has no entry and leaves by the LRU alone.
  std::map<std::string, std::set<uint64_t>> event_owners GUARDED_BY(mu);
  bool shut_down GUARDED_BY(mu) = false;
  CudaEngineStats stats GUARDED_BY(mu);  // chunk counts: the atomics below
  // Counted per chunk from every device thread, so not under `mu`.
  std::atomic<uint64_t> chunks_total{0}, chunk_bytes_total{0};
  base::Mutex gpu_mu;  // serialises starting a GPU's threads

  // Host pool registration (cuda_engine.cc).
  std::thread pinner;
  std::atomic<bool> stop_pinning{false};
  std::vector<uint8_t*> registered;  // chunk bases (pinner thread, then destructor)
  base::CondVar pinned_cv;
  absl::Status pin_status GUARDED_BY(mu);
  uint8_t* pool_base GUARDED_BY(mu) = nullptr;  // PrepareHostPool's range
  // The bytes of one cudaHostRegister piece of the pool (options, within [4 KiB, 64 GiB]).
  uint64_t PieceBytes() const;
  uint64_t pool_bytes GUARDED_BY(mu) = 0;
  bool pinning_started GUARDED_BY(mu) = false;

  absl::StatusOr<CudaDeviceInfo> FindDevice(const std::string& device_id) EXCLUDES(mu);
  // The GPU's threads, started on first use (the daemon's context exists only on GPUs it
  // serves); starts pinning the host pool on the first GPU started.
  absl::StatusOr<GpuThreads> ThreadsFor(const CudaDeviceInfo& device) EXCLUDES(mu, gpu_mu);
  void StartPinning(int ordinal) EXCLUDES(mu);

  // cuda_mappings.cc: the lifetime above.
  std::shared_ptr<Mapping> MappingFor(const CudaDeviceInfo& device, const GpuThreads& gpu,
                                      const std::string& handle) EXCLUDES(mu);
  void Acquire(const std::shared_ptr<Mapping>& m) EXCLUDES(mu);
  void Release(const std::shared_ptr<Mapping>& m) EXCLUDES(mu);
  void Unregister(const std::shared_ptr<Mapping>& m) EXCLUDES(mu);
  // Blocks until `m` (acquired) has left kOpening; its allocation size, or the open's error.
  absl::StatusOr<uint64_t> WaitOpen(const std::shared_ptr<Mapping>& m) EXCLUDES(mu);
  // The cached opened event for `handle` on the GPU (opened on its mapper when not cached),
  // noted as used by `owner` (0: none); a failed one (PERMISSION_DENIED) when it is cached for
  // another uid than `owner_uid` (-1: unknown).
  std::shared_ptr<OpenedEvent> EventFor(const std::string& uuid, const GpuThreads& gpu,
                                        const std::string& handle, uint64_t owner,
                                        int64_t owner_uid) EXCLUDES(mu);
  // PERMISSION_DENIED when `m` has registrations of another uid than `uid`; else binds it to
  // `uid` (when known) and counts the registration.
  absl::Status RegisterLocked(Mapping& m, int64_t uid) REQUIRES(mu);
  // Closes every open mapping now (engine shutdown); regions left behind become inert.
  void CloseAll() EXCLUDES(mu);

 private:
  void OpenTask(const std::shared_ptr<Mapping>& m) EXCLUDES(mu);
  void CloseTask(const std::shared_ptr<Mapping>& m, void* base) EXCLUDES(mu);
  void PostClose(const std::shared_ptr<Mapping>& m) REQUIRES(mu);
  void EraseIfUnusedLocked(const std::shared_ptr<Mapping>& m) REQUIRES(mu);
};

// One ordered transfer (CopyEngine::BeginTransfer): holds its mapping's use and its events, and
// is the IssueGate of its chunks on the device thread.
class CudaTransfer : public TransferOrder,
                     public IssueGate,
                     public std::enable_shared_from_this<CudaTransfer> {
 public:
  CudaTransfer(std::shared_ptr<CudaCopyEngine::Shared> shared, std::shared_ptr<Mapping> mapping,
               TransferSpec spec);
  ~CudaTransfer() override;  // releases the mapping's use

  // IssueGate: the mapping is open, the events are open and the ready event has completed.
  // CANCELLED once spec.cancelled() says so while waiting; DEADLINE_EXCEEDED after
  // options.max_ready_wait_seconds; FAILED_PRECONDITION for CUDA errors. Tells
  // spec.on_producer_wait when the ready event is first found running and when that ends.
  absl::StatusOr<bool> Ready() override;
  // Device thread, after Ready() said true: the device address of the mapping's base.
  uint8_t* base() const { return base_; }
  // Records the done event on `stream` (after the last chunk) and runs on_done_recorded.
  absl::Status RecordDone(void* stream);
  bool has_done_event() const { return done_ != nullptr; }
  const TransferSpec& spec() const { return spec_; }
  Mapping& mapping() const { return *mapping_; }

 private:
  absl::StatusOr<bool> OpenedLocked() REQUIRES(shared_->mu);
  // Ready() without the report; *producer_running: the ready event was found not completed.
  absl::StatusOr<bool> Query(bool* producer_running);

  const std::shared_ptr<CudaCopyEngine::Shared> shared_;
  const std::shared_ptr<Mapping> mapping_;
  const TransferSpec spec_;
  std::shared_ptr<OpenedEvent> ready_, done_;
  const double created_at_;
  uint8_t* base_ = nullptr;  // device thread
  bool reported_waiting_ = false;  // device thread: on_producer_wait(true) was called last
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_ENGINE_SHARED_H_
