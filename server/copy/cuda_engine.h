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
// IPC memory handle cache: keyed by (GPU UUID, the 64 handle bytes) — not by address, since a
// freed and reallocated address gets a new handle. The first registration opens the handle
// (cudaIpcOpenMemHandle, which fails if the same handle is opened twice in one process) and
// checks the registered size against the real allocation (cuMemGetAddressRange); each
// registration holds one reference and copies in flight hold the Region, so 1,000 copies on a
// region cost one open, and the handle is closed when the last registration is gone and its last
// copy has finished (unregister, session end or client crash).
//
// Ordering (both ways through CUDA IPC events, opened once per mapping and cached):
//  - offload: WaitReady makes every D2H stream of the device wait (cudaStreamWaitEvent) on the
//    client's event, recorded after the kernels that produced the data; chunks are issued after.
//  - reload: SignalDone records the client's event on the H2D stream after the last chunk; the
//    client's compute stream waits on it once the daemon has said (on the session stream) that it
//    was recorded.
//
// Host pool: PrepareHostPool registers the arena with cudaHostRegister(Portable) in chunks of at
// most `host_register_chunk_bytes` (<= 64 GiB: larger single registrations fail on recent
// drivers) on a background pinner thread with the first device current (pinning runs at
// ~1-2 GB/s, docs/ARCHITECTURE.md); copies work meanwhile, from pageable memory and slower. The
// destructor unregisters everything before returning, so the engine must die before the arena.
#ifndef OFFLOADD_SERVER_COPY_CUDA_ENGINE_H_
#define OFFLOADD_SERVER_COPY_CUDA_ENGINE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "server/copy/copy_engine.h"
#include "server/copy/cuda_api.h"

namespace offloadd::copy {

struct CudaEngineOptions {
  uint32_t streams_per_direction = 1;  // >= 1
  uint64_t host_register_chunk_bytes = 64ull << 30;
  uint32_t max_events_per_mapping = 64;  // opened IPC events cached per mapping (LRU)
  // PostChunk returns once the copy is queued on the device thread and calls back when its
  // event completes (asynchronous() = true), instead of blocking a caller per chunk (issue 16).
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
  // Errors: INVALID_ARGUMENT for a region of another engine; OUT_OF_RANGE outside the region;
  // FAILED_PRECONDITION for CUDA errors or a region whose engine is gone.
  absl::Status CopyChunk(Direction direction, Region& region, uint64_t region_offset,
                         uint8_t* host, uint64_t bytes) override;
  // Same checks and errors as CopyChunk (reported through `done`, inline when found before the
  // copy is queued). `done` runs on the GPU's device thread when the copy's event completes; it
  // may post more chunks (they join the queue without a thread hand-off) and must otherwise
  // only hand the completion on (no other CUDA calls through this engine, no blocking). With
  // options.asynchronous = false this is CopyChunk followed by `done`.
  void PostChunk(Direction direction, Region& region, uint64_t region_offset, uint8_t* host,
                 uint64_t bytes, ChunkUrgency urgency,
                 std::function<void(absl::Status)> done) override;
  bool asynchronous() const override;
  // `ready_event`: cudaIpcEventHandle_t bytes (64) or empty (no wait).
  absl::Status WaitReady(Region& region, const std::string& ready_event) override;
  absl::Status SignalDone(Region& region, const std::string& done_event) override;
  // Starts the background registration; returns at once. INVALID_ARGUMENT for a null or empty
  // range; FAILED_PRECONDITION when called twice or when no device is visible.
  absl::Status PrepareHostPool(uint8_t* base, uint64_t size_bytes) override;
  // Blocks until the background registration has finished; its result.
  absl::Status WaitHostPoolReady();

  CudaEngineStats stats() const;
  std::map<std::string, HandleCounts> handle_counts() const override;
  uint64_t pinned_bytes() const override;

  struct Shared;  // internal state, shared with the Regions

 private:
  std::shared_ptr<Shared> shared_;
};

// The engine over the real CUDA runtime (built only with the toolkit). Lists devices now so a
// node without a driver fails at start-up: FAILED_PRECONDITION "no usable CUDA driver ...".
absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(CudaEngineOptions options = {});

// NUMA node of a PCI device from sysfs (/sys/bus/pci/devices/<bdf>/numa_node), -1 if unknown.
// `sysfs_root` is for tests.
int PciNumaNode(const std::string& pci_bus_id, const std::string& sysfs_root = "/sys");

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_ENGINE_H_
