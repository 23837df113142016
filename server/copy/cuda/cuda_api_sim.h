// SimCudaApi: a CudaApi whose GPUs are a timing model (timing/copy_timing_model.h), for measuring
// the cuda copy engine's scheduling on a machine without a GPU (`--backend=cuda-sim`).
// Separate from FakeCudaApi (cuda_api_fake.h), which checks call order and moves real bytes for
// unit tests: for memory without a simulated client GPU behind it (SimMemHandle, AddAllocation)
// this one MOVES NO BYTES — it checks each copy's pointers and bounds against the mapped
// allocations and the host range, then only accounts for the time the copy would take; for a
// simulated client GPU's memory (below) it moves them. Every device it lists is named
// "... (SIMULATED: bytes move only for a simulated client GPU)" so logs say what they show.
//
// Host costs: each MemcpyAsync, EventRecord and EventQuery spends a configurable number of host
// seconds on the calling thread (SimClock::SpendHostSeconds: the real clock busy-waits, so the
// CPU time is real and shows in getrusage; a ManualSimClock just moves its time on), modelling
// the driver's CPU cost per call. A copy is queued on the model after its MemcpyAsync cost.
//
// Streams and events: a stream belongs to the device current on the creating thread; its copies
// go to that device's engine of the copy's direction, each queued after the stream's previous
// operation and after events the stream was told to wait on. EventRecord captures the stream's
// outstanding operations; EventQuery answers true once the model says they completed. Events
// opened from arbitrary IPC handles are complete from the start. Device memory: IpcOpenMemHandle
// accepts handles made by AddAllocation (tests, in-process benchmarks) or SimMemHandle (clients
// of a cuda-sim daemon that model no memory); pointers it returns lie in an address range no
// one maps and are never dereferenced.
//
// Simulated client GPUs (sim_gpu_table.h). Handles of a client's shared table name real memory
// (the client's simulated device memory) and real events: opening such a memory handle checks
// that the client's segment is live (and counts the daemon's mapping in the table); a copy on it
// MOVES THE BYTES when the model says it completed (the first call that advances the model past
// that time does it, before anything can see the completion); a copy whose segment was freed
// meanwhile moves nothing, fails its completion event and counts kCopyOnFreed. A client event
// is complete when the table says so (the client writes the completion time of its modelled
// stream); a done event this api records is written to the table as pending, then with its
// completion time once the copies before it completed and their bytes were moved.
//
// Threading: every method is thread-safe; host costs are spent outside any lock. The GPUs are
// split into shards, each with its own model, streams, events and mutex: one shard per switch
// when a switch limit couples its GPUs (switch_bytes_per_second > 0), else one per GPU. Copies
// on different shards never wait for one lock, as calls on different GPUs' contexts do not in
// the driver: with one lock for all GPUs, eight device threads on a small host spent more time
// waking each other on it than driving their engines, which measured the simulator rather than
// the daemon (copy_sim_bench, BENCHMARKS.md). A stream or event belongs to the shard of the
// device current when it was created (its handle says which). A stream may wait only on events
// of its own shard, or on events already complete (a client's IPC event): other waits fail
// with FAILED_PRECONDITION ("not modelled"). Affinity is not checked (FakeCudaApi does that).
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_API_SIM_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_API_SIM_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/mutex.h"
#include "server/copy/timing/copy_timing_model.h"
#include "server/copy/cuda/cuda_api.h"
#include "server/copy/cuda/cuda_engine.h"
#include "server/copy/cuda/sim_gpu_table.h"

namespace offloadd::copy {

// The simulator's time. NowSeconds is monotonic; SpendHostSeconds(s) accounts for s seconds of
// host CPU on the calling thread.
class SimClock {
 public:
  virtual ~SimClock() = default;
  virtual double NowSeconds() = 0;
  virtual void SpendHostSeconds(double seconds) = 0;
  // steady_clock; SpendHostSeconds busy-waits (the CPU time is real).
  static SimClock* Real();
};

// A clock that only moves when told: SpendHostSeconds and Advance add to it. Thread-safe.
class ManualSimClock : public SimClock {
 public:
  explicit ManualSimClock(double start_seconds = 0) : now_(start_seconds) {}
  double NowSeconds() override;
  void SpendHostSeconds(double seconds) override { Advance(seconds); }
  void Advance(double seconds);

 private:
  base::Mutex mu_;
  double now_ GUARDED_BY(mu_);
};

struct SimCudaOptions {
  CopyModelOptions model;             // gpus, rates, contention
  double memcpy_host_seconds = 5e-6;  // per MemcpyAsync
  double event_record_host_seconds = 1e-6;
  double event_query_host_seconds = 0.5e-6;
  uint64_t device_total_bytes = 141ull * 1000 * 1000 * 1000;  // H200: 141 GB
  // The NUMA node of a copy's host buffer, for the model's cross-node factor
  // (CopyModelOptions::cross_node_rate_factor); -1 = unknown. Null: every copy unknown. Called
  // with a shard's mutex held: must not call back into the api.
  std::function<int(const void* host)> host_numa_node;
};

// What the simulated driver was asked to do.
struct SimCallCounts {
  uint64_t memcpys = 0, memcpy_bytes = 0, event_records = 0, event_queries = 0;
  double host_seconds = 0;  // charged through SpendHostSeconds
};

// A 64-byte memory handle a client of a cuda-sim daemon registers: "cuda-sim-mem" + size + id.
// The allocation is created on the device current when the daemon opens it. `id` tells two
// allocations of one client apart.
std::string SimMemHandle(uint64_t size_bytes, uint64_t id);

class SimCudaApi : public CudaApi {
 public:
  // `clock` is not owned and must outlive the api; null = SimClock::Real().
  explicit SimCudaApi(SimCudaOptions options = {}, SimClock* clock = nullptr);
  ~SimCudaApi() override;

  // A non-owning CudaApi forwarding to this one (an engine owns its CudaApi; tests and the
  // benchmark keep reading the model after the engine is gone).
  std::unique_ptr<CudaApi> Borrow();

  // A device allocation of `size_bytes` on `ordinal`; returns its IPC handle (64 bytes).
  std::string AddAllocation(int ordinal, uint64_t size_bytes);
  // The UUID of simulated device `ordinal`: "GPU-51300000-0000-0000-0000-<ordinal, 12 digits>".
  static std::string DeviceUuid(int ordinal);

  ModelEngineStats engine_stats(int ordinal, Direction direction);
  SimCallCounts call_counts();
  // Completion time (model seconds) of the copy an event last captured; -1 when unknown or not
  // complete yet.
  double EventCompletionSeconds(void* event);
  const SimCudaOptions& options() const { return options_; }
  SimClock* clock() const { return clock_; }

  // CudaApi. Errors are FAILED_PRECONDITION naming the function, as the real one.
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
  // Device memory on the current device, in the same never-mapped address range as opened
  // handles; copies are checked against it like against those.
  absl::StatusOr<void*> DeviceMalloc(uint64_t bytes) override;
  absl::Status DeviceFree(void* device_ptr) override;
  // Every simulated event keeps its completion time: a timing event is an event.
  absl::StatusOr<void*> CreateTimingEvent() override { return CreateEvent(); }
  // The model-time difference between the two events' completions (EventCompletionSeconds).
  absl::StatusOr<double> EventElapsedSeconds(void* start, void* end) override;

 private:
  struct Allocation {
    int ordinal = -1;
    uint64_t size_bytes = 0;
    uintptr_t base = 0;  // while mapped; 0 otherwise
    int opens = 0;       // IpcOpenMemHandle calls not yet closed (CUDA counts references)
    // A simulated client's segment (sim_gpu_table.h); null for modelled-only memory.
    std::shared_ptr<common::SimGpuTable> table;
    common::SimSegmentSlot* segment = nullptr;
    uint64_t generation = 0;
    uint8_t* memory = nullptr;  // the segment's first byte, as checked when opened
  };
  // A mapped allocation as copies see it (per shard).
  struct Mapped {
    int ordinal = -1;
    uint64_t size_bytes = 0;
    std::shared_ptr<common::SimGpuTable> table;  // null: no bytes behind it
    common::SimSegmentSlot* segment = nullptr;
    uint64_t generation = 0;
    // The segment's first byte, from the device, offset and size read once when it was opened
    // (size_bytes is that size): copies never read the client-writable slot for an address.
    uint8_t* memory = nullptr;
  };
  // A copy whose bytes move when its model operation completes.
  struct ByteCopy {
    uint8_t* dst = nullptr;
    const uint8_t* src = nullptr;
    uint64_t bytes = 0;
    std::shared_ptr<common::SimGpuTable> table;
    common::SimSegmentSlot* segment = nullptr;
    uint64_t generation = 0;
  };
  struct Stream {
    int ordinal;
    CopyTimingModel::OpId last = 0;
    std::vector<CopyTimingModel::OpId> waits;  // since the last copy
  };
  struct Event {
    std::vector<CopyTimingModel::OpId> ops;  // in its shard's model
    // Opened from a simulated client's event handle: its slot in the client's table.
    std::shared_ptr<common::SimGpuTable> table;
    common::SimEventSlot* slot = nullptr;
  };
  // GPUs [first_gpu, first_gpu + gpus) with their own model (see "Threading" above).
  struct Shard {
    explicit Shard(const CopyModelOptions& o) : first_gpu(o.first_gpu), model(o) {}
    const int first_gpu;
    base::Mutex mu;
    CopyTimingModel model GUARDED_BY(mu);
    std::map<uint64_t, Stream> streams GUARDED_BY(mu);  // by handle id
    std::map<uint64_t, Event> events GUARDED_BY(mu);
    // Its GPUs' mapped allocations by base.
    std::map<uintptr_t, Mapped> mapped GUARDED_BY(mu);
    uint64_t next_handle_id GUARDED_BY(mu) = 1;
    SimCallCounts counts GUARDED_BY(mu);
    std::map<CopyTimingModel::OpId, ByteCopy> byte_copies GUARDED_BY(mu);  // not moved yet
    std::set<CopyTimingModel::OpId> failed_ops GUARDED_BY(mu);  // their segment was freed
    // Client-table events recorded here whose completion is not written yet, by event id.
    std::map<uint64_t, std::pair<std::shared_ptr<common::SimGpuTable>, common::SimEventSlot*>> pending_records
        GUARDED_BY(mu);
  };
  // Advances the shard's model to now and applies what completed: moves bytes, writes the
  // completion times of pending client events.
  void AdvanceLocked(Shard& sh) REQUIRES(sh.mu);
  void MoveBytesLocked(Shard& sh, CopyTimingModel::OpId op, ByteCopy& c) REQUIRES(sh.mu);
  // The mapping of a client's table (opened once per client pid).
  absl::StatusOr<std::shared_ptr<common::SimGpuTable>> TableLocked(uint32_t pid, uint64_t instance)
      REQUIRES(mu_);
  absl::StatusOr<void*> OpenSimSegmentLocked(absl::string_view handle, int cur) REQUIRES(mu_);
  // Stream and event handles: (shard + 1) << kShardShift | id, never dereferenced.
  static constexpr int kShardShift = 40;
  static void* Handle(size_t shard, uint64_t id);
  // The shard a handle names and its id there; null for anything else.
  Shard* ShardOfHandle(void* handle, uint64_t* id) const;
  Shard& ShardOfGpu(int ordinal) const { return *shards_[ordinal / gpus_per_shard_]; }
  size_t ShardIndex(int ordinal) const { return ordinal / gpus_per_shard_; }
  int CurrentLocked() const REQUIRES(mu_);  // -1 when none
  int Current() EXCLUDES(mu_);
  double Now() { return clock_->NowSeconds(); }

  const SimCudaOptions options_;
  SimClock* const clock_;
  int gpus_per_shard_ = 1;
  std::vector<std::unique_ptr<Shard>> shards_;  // fixed after construction
  std::vector<CudaDeviceInfo> devices_;
  // Rare calls (contexts, IPC handles, registrations) share one lock; copies and events use
  // only their shard's.
  base::Mutex mu_;
  std::map<std::thread::id, int> current_ GUARDED_BY(mu_);
  std::map<std::string, Allocation> allocations_ GUARDED_BY(mu_);  // by handle
  std::map<uintptr_t, std::string> mapped_ GUARDED_BY(mu_);        // base -> handle
  // Maps `a` (in allocations_ under `key`) on its device at a fresh base.
  void* MapLocked(const std::string& key, Allocation& a) REQUIRES(mu_);
  std::map<uintptr_t, uint64_t> host_registered_ GUARDED_BY(mu_);
  std::map<uint32_t, std::weak_ptr<common::SimGpuTable>> tables_ GUARDED_BY(mu_);  // by client pid
  uintptr_t next_base_ GUARDED_BY(mu_);
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

// The cuda copy engine over a SimCudaApi with `options` on the real clock: `--backend=cuda-sim`.
// Its devices are SimCudaApi::DeviceUuid(0..gpus-1); clients register SimMemHandle handles.
std::unique_ptr<CopyEngine> NewSimCudaCopyEngine(SimCudaOptions options = {},
                                                 CudaEngineOptions engine_options = {});

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_API_SIM_H_
