// CudaCopyEngine: the cuda copy backend (docs/ARCHITECTURE.md, "Copy backends"), written
// against CudaApi (cuda_api.h) so everything below is unit-tested on CPU with FakeCudaApi.
//
// Devices are named by UUID ("GPU-..."; the session's Hello device_id), never by ordinal:
// ordinals differ between processes under CUDA_VISIBLE_DEVICES.
//
// One worker thread per GPU, started on the first region opened on that GPU (so the daemon's
// CUDA context, a few hundred MiB of device memory, exists only on GPUs it serves), owns the
// device: it makes the device current once and every CUDA call for that device runs on it. It
// owns `streams_per_direction` D2H and H2D streams (non-blocking), so offloads and reloads
// overlap on the link's two directions. A chunk copy is cudaMemcpyAsync on the direction's next
// stream followed by a completion event. Chunks wait in a per-direction queue on the worker
// (urgent first) and are issued just in time, `issue_ahead_seconds` of copy work ahead of the
// copy engine, so the engine never idles while an urgent chunk overtakes the rest; the worker
// learns completions by querying the events when they are predicted (cuda_device_worker.h).
//
// Client memory: a registration names an allocation (GPU UUID + the 64 handle bytes, not an
// address: a freed and reallocated address gets a new handle); the first one checks the handle
// and the registered size against the real allocation (cuMemGetAddressRange). The daemon holds
// an allocation open (cudaIpcOpenMemHandle) only while a transfer uses it: from BeginTransfer
// until the transfer's last chunk completed (cuda_engine_shared.h, docs/ARCHITECTURE.md
// "Mappings that follow the allocator"), so a training process's allocator never frees memory
// the daemon has mapped. Overlapping transfers of one allocation share one open. Opens and
// closes (and IPC event opens) run on the GPU's mapper thread (cuda_mapper.h), never on its
// device thread.
//
// Ordering (docs/ARCHITECTURE.md, "The event protocol"; BeginTransfer in copy_engine.h):
//  - a transfer's chunks are not issued before its client ready event has completed (queried
//    by the device thread; nothing is put on a stream to wait, so other transfers go on);
//  - a reload's done event is recorded on its chunks' stream right after its last chunk is
//    issued, and the owner is told at once (TransferSpec::on_done_recorded): the client's
//    compute stream waits on that event, the host waits for nothing.
//
// Host pool: PrepareHostPool registers the arena with cudaHostRegister(Portable) in chunks of
// `host_register_chunk_bytes` (1 GiB: each call holds driver locks other processes wait on) on
// a background pinner thread, from the context of the first GPU a session uses (no context on
// a GPU nobody uses); copies work meanwhile, from pageable memory and slower. The destructor
// unregisters everything before returning, so the engine must die before the arena.
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_ENGINE_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/copy/copy_engine.h"
#include "server/copy/cuda/cuda_api.h"
#include "server/copy/cuda/cuda_device_worker.h"

namespace offloadd::copy {

struct CudaEngineOptions {
  uint32_t streams_per_direction = 1;  // >= 1
  // cudaHostRegister per call: each call holds driver locks that block other processes' CUDA
  // calls while it pins (tens of seconds for 64 GiB: TensorRT-LLM#17773); vLLM pins ~1 GiB at
  // a time (vllm#42632).
  uint64_t host_register_chunk_bytes = 1ull << 30;
  uint32_t max_cached_events = 1024;  // opened client IPC events kept open (LRU, all GPUs)
  // A transfer whose ready event has not completed after this long fails (DEADLINE_EXCEEDED):
  // a bound, not a tuning knob (a producer kernel takes milliseconds).
  double max_ready_wait_seconds = 600;
  // PostChunk returns once the copy is queued on the device thread and calls back when its
  // event completes (asynchronous() = true), instead of blocking a caller per chunk.
  bool asynchronous = false;
  // Copy work issued to the hardware ahead of the running copy, per GPU and direction (seconds
  // at the rate the worker learns); see DeviceWorkerOptions.
  double issue_ahead_seconds = 50e-6;
  double max_issue_ahead_seconds = 1e-3;
  // The rate a lane plans with until it has learned its own (DeviceWorkerOptions); 0 = none.
  double assumed_bytes_per_second = 25e9;
};

struct CudaDeviceStats {
  std::string uuid, pci_bus_id;
  int ordinal = -1;
  int numa_node = -1;  // /sys/bus/pci/devices/<bdf>/numa_node; -1 unknown
  // cudaMemGetInfo right after the daemon made the device current (its context exists).
  uint64_t free_bytes_after_context = 0, total_bytes = 0;
  // Per direction (index: Direction), as of the device thread's last pass: times the copy
  // engine was left idle while chunks waited (the device thread woke too late to issue the next
  // one), the issue-ahead margin (seconds), the copy rate the worker learned (bytes/s; 0 = none
  // yet), chunks queued on the worker and chunks issued to CUDA. See cuda_device_worker.h.
  uint64_t dry_runs[2] = {0, 0};
  uint64_t queued_chunks[2] = {0, 0}, issued_chunks[2] = {0, 0};
  double issue_ahead_seconds[2] = {0, 0};
  double learned_bytes_per_second[2] = {0, 0};
};

struct CudaEngineStats {
  uint64_t mem_handle_opens_total = 0, mem_handle_closes_total = 0, mem_handles_open = 0;
  uint64_t event_handle_opens_total = 0;
  uint64_t chunks_total = 0, chunk_bytes_total = 0;
  uint64_t host_pool_bytes = 0, host_registered_bytes = 0;
  bool host_pool_ready = false;    // background registration finished (successfully or not)
  std::string host_pool_error;     // empty when fine
  double host_register_seconds = 0;
  std::vector<CudaDeviceStats> devices;  // those the daemon has a context on
  std::map<std::string, HandleCounts> handles_by_gpu;  // by device UUID
};

class CudaCopyEngine : public CopyEngine {
 public:
  explicit CudaCopyEngine(std::unique_ptr<CudaApi> api, CudaEngineOptions options = {});
  // Closes every handle still open, unregisters the host pool, stops the workers. Regions that
  // outlive the engine become inert (copies on them fail).
  ~CudaCopyEngine() override;

  std::string name() const override { return "cuda"; }
  // Errors: INVALID_ARGUMENT for an shm name, a handle that is not 64 bytes, or size 0;
  // FAILED_PRECONDITION when the device UUID is not visible to the daemon, when there is no
  // driver, or when the handle cannot be opened (message says why and what to do); OUT_OF_RANGE
  // when size_bytes exceeds the allocation.
  absl::StatusOr<std::shared_ptr<Region>> OpenRegion(const RegionSpec& spec) override;
  // asynchronous: options.asynchronous; orders_transfers: always (BeginTransfer below).
  CopyCapabilities capabilities() const override;
  // See CopyEngine::BeginTransfer. INVALID_ARGUMENT for a region of another engine or an event
  // handle that is not 64 bytes; CUDA failures (opening the handle or an event) and a ready
  // event that never completes fail the transfer's chunks instead (FAILED_PRECONDITION,
  // DEADLINE_EXCEEDED after max_ready_wait_seconds; CANCELLED once spec.cancelled()).
  absl::StatusOr<std::shared_ptr<TransferOrder>> BeginTransfer(Region& region,
                                                              TransferSpec spec) override;
  // Errors: INVALID_ARGUMENT for a region of another engine; OUT_OF_RANGE outside the region;
  // FAILED_PRECONDITION for CUDA errors or a region whose engine is gone. A null order: the
  // chunk is a transfer of its own (its mapping held for it alone).
  absl::Status CopyOrderedChunk(TransferOrder* order, uint64_t transfer_offset,
                                Direction direction, Region& region, uint64_t region_offset,
                                uint8_t* host, uint64_t bytes) override;
  // Same checks and errors as CopyOrderedChunk (reported through `done`, inline when found
  // before the copy is queued). `done` runs on the GPU's device thread when the copy's event
  // completes; it may post more chunks (they join the queue without a thread hand-off) and must
  // otherwise only hand the completion on (no other CUDA calls through this engine, no
  // blocking). With options.asynchronous = false this is CopyOrderedChunk followed by `done`.
  void PostOrderedChunk(TransferOrder* order, uint64_t transfer_offset, Direction direction,
                        Region& region, uint64_t region_offset, uint8_t* host, uint64_t bytes,
                        ChunkUrgency urgency, std::function<void(absl::Status)> done) override;
  // Records the range; the background registration starts now if a GPU is in use, else with
  // the first region opened. Returns at once. INVALID_ARGUMENT for a null or empty range;
  // FAILED_PRECONDITION when called twice.
  absl::Status PrepareHostPool(uint8_t* base, uint64_t size_bytes) override;
  // Blocks until the background registration has finished; its result. FAILED_PRECONDITION
  // when it has not started (no region opened yet).
  absl::Status WaitHostPoolReady();

  // Runs `fn` on the device thread of GPU `device_id` (a UUID, as RegionSpec::device_id), which
  // this starts, with the daemon's context on that GPU, when no region has yet. `fn` gets the
  // engine's CudaApi with the device current and may make any call for that device. The GPU's
  // copies wait meanwhile: chunks posted then are issued after `fn` returns, those already
  // issued complete in the hardware. For measurements (cuda_rate_meter.h). Errors: as
  // OpenRegion's for the device, FAILED_PRECONDITION once the engine shuts down, else fn's.
  absl::Status RunOnDevice(const std::string& device_id,
                           const std::function<absl::Status(CudaApi&)>& fn);

  // The GPUs the driver lists (no context is created). FAILED_PRECONDITION without a driver.
  absl::StatusOr<std::vector<CudaDeviceInfo>> Devices();

  CudaEngineStats stats() const;
  std::map<std::string, HandleCounts> handle_counts() const override;
  uint64_t pinned_bytes() const override;
  // Drops the cached client events only `owner_id`'s transfers used (CopyEngine::ReleaseOwner).
  void ReleaseOwner(uint64_t owner_id) override;
  // No-op: handle counts are keyed by GPU UUID, not by a session's device id.
  void ForgetDevice(const std::string& device_id) override;
  // Client events in the cache now (tests).
  size_t cached_events() const;

  struct Shared;  // internal state, shared with the Regions (cuda_engine_shared.h)

 private:
  // The device worker's request for one chunk (checks, gate, after-issue step).
  absl::StatusOr<CopyRequest> ChunkRequest(TransferOrder* order, uint64_t transfer_offset,
                                           Direction direction, Region& region,
                                           uint64_t region_offset, uint8_t* host,
                                           uint64_t bytes, ChunkUrgency urgency);

  std::shared_ptr<Shared> shared_;
};

// The engine over the real CUDA runtime (built only with the toolkit). Lists devices now so a
// node without a driver fails at start-up: FAILED_PRECONDITION "no usable CUDA driver ...".
absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(CudaEngineOptions options = {});

// NUMA node of a PCI device from sysfs (/sys/bus/pci/devices/<bdf>/numa_node), -1 if unknown.
// `sysfs_root` is for tests.
int PciNumaNode(const std::string& pci_bus_id, const std::string& sysfs_root = "/sys");

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_ENGINE_H_
