#include "server/copy/cuda_engine.h"

#include <atomic>
#include <fstream>
#include <list>
#include <map>
#include <thread>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "glog/logging.h"
#include "server/base/clock.h"
#include "server/base/mutex.h"
#include "server/copy/cuda_device_worker.h"

namespace offloadd::copy {

namespace {

// One opened IPC memory handle (an exporter's allocation) on one device.
struct Mapping {
  std::string key;  // uuid + '\0' + handle bytes
  std::shared_ptr<DeviceWorker> worker;
  void* base = nullptr;
  uint64_t allocation_bytes = 0;
  int refs = 0;         // registrations (under Shared::mu)
  std::atomic<bool> closed{false};  // set under Shared::mu; read by chunk checks without it
  // Opened IPC events by handle bytes, LRU order; device thread only.
  std::map<std::string, void*> events;
  std::list<std::string> event_lru;
};

}  // namespace

struct CudaCopyEngine::Shared {
  std::unique_ptr<CudaApi> api;
  CudaEngineOptions options;

  mutable base::Mutex mu;  // guards everything below except the pinner's own fields
  bool listed GUARDED_BY(mu) = false;
  std::vector<CudaDeviceInfo> devices GUARDED_BY(mu);
  std::map<std::string, std::shared_ptr<DeviceWorker>> workers GUARDED_BY(mu);  // by uuid
  std::map<std::string, std::shared_ptr<Mapping>> mappings GUARDED_BY(mu);      // by key
  bool shut_down GUARDED_BY(mu) = false;
  CudaEngineStats stats GUARDED_BY(mu);  // chunk counts: the atomics below
  // Counted per chunk from every device thread, so not under `mu`.
  std::atomic<uint64_t> chunks_total{0}, chunk_bytes_total{0};

  // Host pool registration.
  std::thread pinner;
  std::atomic<bool> stop_pinning{false};
  std::vector<uint8_t*> registered;  // chunk bases (pinner thread, then destructor)
  base::CondVar pinned_cv;
  absl::Status pin_status GUARDED_BY(mu);

  // Serialises OpenRegion and closing so one handle is never opened twice.
  base::Mutex open_mu;

  absl::StatusOr<CudaDeviceInfo> FindDevice(const std::string& device_id) EXCLUDES(mu);
  absl::StatusOr<std::shared_ptr<DeviceWorker>> WorkerFor(const CudaDeviceInfo& device)
      EXCLUDES(mu);
  // Opens the IPC handle on the device's worker thread; the mapping is not yet in `mappings`.
  absl::StatusOr<std::shared_ptr<Mapping>> MapHandle(const CudaDeviceInfo& device,
                                                     const std::string& handle,
                                                     const std::string& key) EXCLUDES(mu);
  void Unref(const std::shared_ptr<Mapping>& m) EXCLUDES(open_mu, mu);
  void Close(const std::shared_ptr<Mapping>& m) REQUIRES(open_mu);  // open_mu held
  // Device thread: the opened event for `handle`, opening and caching it on first use.
  absl::StatusOr<void*> EventFor(Mapping& m, const std::string& handle) EXCLUDES(mu);
};

namespace {

class CudaRegion : public Region {
 public:
  CudaRegion(std::shared_ptr<CudaCopyEngine::Shared> shared, std::shared_ptr<Mapping> mapping,
             uint64_t size_bytes)
      : shared_(std::move(shared)), mapping_(std::move(mapping)), size_bytes_(size_bytes) {}
  ~CudaRegion() override { shared_->Unref(mapping_); }
  uint64_t size_bytes() const override { return size_bytes_; }
  Mapping& mapping() const { return *mapping_; }

 private:
  std::shared_ptr<CudaCopyEngine::Shared> shared_;
  std::shared_ptr<Mapping> mapping_;
  uint64_t size_bytes_;
};

absl::Status Annotate(const std::string& uuid, const absl::Status& st, const std::string& hint) {
  return absl::Status(st.code(), absl::StrFormat("%s: %s%s%s", uuid, st.message(),
                                                 hint.empty() ? "" : ": ", hint));
}

}  // namespace

absl::StatusOr<CudaDeviceInfo> CudaCopyEngine::Shared::FindDevice(const std::string& device_id) {
  base::MutexLock lock(mu);
  if (!listed) {
    auto list = api->ListDevices();
    if (!list.ok()) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "no usable CUDA driver or device (%s): run offloadd on a node with the NVIDIA driver "
          "and GPUs visible to it, or use backend: \"shm\"",
          list.status().message()));
    }
    devices = *list;
    listed = true;
  }
  const std::string want = NormalizeGpuUuid(device_id);
  std::vector<std::string> seen;
  for (const CudaDeviceInfo& d : devices) {
    if (NormalizeGpuUuid(d.uuid) == want) return d;
    seen.push_back(d.uuid);
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "GPU '%s' (the session's device_id) is not visible to the daemon, which sees [%s]: send the "
      "GPU's UUID (nvidia-smi -L, or torch.cuda.get_device_properties(i).uuid) and run offloadd "
      "without CUDA_VISIBLE_DEVICES restricting it",
      device_id, absl::StrJoin(seen, ", ")));
}

absl::StatusOr<std::shared_ptr<DeviceWorker>> CudaCopyEngine::Shared::WorkerFor(
    const CudaDeviceInfo& device) {
  {
    base::MutexLock lock(mu);
    auto it = workers.find(device.uuid);
    if (it != workers.end()) return it->second;
  }
  // Only OpenRegion (under open_mu) creates workers, so there is no race to start two.
  DeviceWorkerOptions wo;
  wo.streams_per_direction = options.streams_per_direction;
  wo.issue_ahead_seconds = options.issue_ahead_seconds;
  wo.max_issue_ahead_seconds = options.max_issue_ahead_seconds;
  wo.assumed_bytes_per_second = options.assumed_bytes_per_second;
  auto w = std::make_shared<DeviceWorker>(api.get(), device, wo);
  absl::Status st = w->Start();
  if (!st.ok()) return st;
  CudaDeviceStats ds;
  ds.uuid = device.uuid;
  ds.pci_bus_id = device.pci_bus_id;
  ds.ordinal = device.ordinal;
  ds.numa_node = PciNumaNode(device.pci_bus_id);
  ds.free_bytes_after_context = w->mem_after_context().free_bytes;
  ds.total_bytes = w->mem_after_context().total_bytes;
  LOG(INFO) << "cuda: context on " << device.uuid << " (" << device.name << ", "
            << device.pci_bus_id << ", NUMA node " << ds.numa_node << "): device memory free "
            << ds.free_bytes_after_context << " of " << ds.total_bytes << " bytes";
  base::MutexLock lock(mu);
  stats.devices.push_back(ds);
  workers[device.uuid] = w;
  return w;
}

absl::StatusOr<void*> CudaCopyEngine::Shared::EventFor(Mapping& m, const std::string& handle) {
  auto it = m.events.find(handle);
  if (it != m.events.end()) {
    m.event_lru.remove(handle);
    m.event_lru.push_back(handle);
    return it->second;
  }
  auto e = api->IpcOpenEventHandle(handle);
  if (!e.ok()) return e.status();
  {
    base::MutexLock lock(mu);
    ++stats.event_handle_opens_total;
  }
  m.events[handle] = *e;
  m.event_lru.push_back(handle);
  if (m.event_lru.size() > std::max<uint32_t>(1, options.max_events_per_mapping)) {
    // The stream operations already issued on the evicted event keep their captured state.
    const std::string old = m.event_lru.front();
    m.event_lru.pop_front();
    api->DestroyEvent(m.events[old]);
    m.events.erase(old);
  }
  return *e;
}

void CudaCopyEngine::Shared::Close(const std::shared_ptr<Mapping>& m) {
  absl::Status st = m->worker->Run([&] {
    for (auto& [h, e] : m->events) api->DestroyEvent(e);
    m->events.clear();
    m->event_lru.clear();
    return api->IpcCloseMemHandle(m->base);
  });
  if (!st.ok()) LOG(WARNING) << "cuda: closing an IPC memory handle: " << st.message();
  base::MutexLock lock(mu);
  ++stats.mem_handle_closes_total;
  --stats.mem_handles_open;
  --stats.handles_by_gpu[m->worker->device().uuid].open;
  LOG(INFO) << "cuda: closed IPC memory handle on " << m->worker->device().uuid
            << "; closes_total=" << stats.mem_handle_closes_total
            << " open_now=" << stats.mem_handles_open;
}

void CudaCopyEngine::Shared::Unref(const std::shared_ptr<Mapping>& m) {
  base::MutexLock open_lock(open_mu);
  {
    base::MutexLock lock(mu);
    if (m->closed || --m->refs > 0) return;
    m->closed = true;
    mappings.erase(m->key);
  }
  Close(m);
}

CudaCopyEngine::CudaCopyEngine(std::unique_ptr<CudaApi> api, CudaEngineOptions options)
    : shared_(std::make_shared<Shared>()) {
  shared_->api = std::move(api);
  shared_->options = options;
}

CudaCopyEngine::~CudaCopyEngine() {
  Shared& s = *shared_;
  s.stop_pinning = true;
  if (s.pinner.joinable()) s.pinner.join();
  {
    base::MutexLock open_lock(s.open_mu);
    std::vector<std::shared_ptr<Mapping>> left;
    {
      base::MutexLock lock(s.mu);
      s.shut_down = true;
      for (auto& [k, m] : s.mappings) {
        m->closed = true;
        left.push_back(m);
      }
      s.mappings.clear();
    }
    if (!left.empty()) {
      LOG(WARNING) << "cuda: engine stopping with " << left.size()
                   << " IPC handle(s) still registered; closing them";
    }
    for (auto& m : left) s.Close(m);
  }
  if (!s.registered.empty()) {
    // Any thread with a device current may unregister; use the pinner's device again.
    std::thread t([&s] {
      auto devs = s.api->ListDevices();
      if (devs.ok() && !devs->empty() && s.api->SetDevice(devs->front().ordinal).ok()) {
        for (uint8_t* p : s.registered) {
          absl::Status st = s.api->HostUnregister(p);
          if (!st.ok()) LOG(WARNING) << "cuda: " << st.message();
        }
      }
    });
    t.join();
    s.registered.clear();
  }
  std::map<std::string, std::shared_ptr<DeviceWorker>> workers;
  {
    base::MutexLock lock(s.mu);
    workers.swap(s.workers);
  }
  for (auto& [u, w] : workers) w->Stop();
}

absl::StatusOr<std::shared_ptr<Mapping>> CudaCopyEngine::Shared::MapHandle(
    const CudaDeviceInfo& device, const std::string& handle, const std::string& key) {
  auto worker = WorkerFor(device);
  if (!worker.ok()) return worker.status();
  auto fresh = std::make_shared<Mapping>();
  fresh->key = key;
  fresh->worker = *worker;
  absl::Status st = fresh->worker->Run([&]() -> absl::Status {
    auto base = api->IpcOpenMemHandle(handle);
    if (!base.ok()) return base.status();
    fresh->base = *base;
    auto size = api->AllocationSize(*base);
    if (!size.ok()) {
      (void)api->IpcCloseMemHandle(*base);
      return size.status();
    }
    fresh->allocation_bytes = *size;
    return absl::OkStatus();
  });
  if (!st.ok()) {
    return Annotate(device.uuid, st,
                    "the handle must be cudaIpcGetMemHandle of the base of a live cudaMalloc "
                    "allocation on this GPU, from a process on this node (memory from VMM "
                    "allocators, e.g. PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True, has "
                    "no such handle)");
  }
  return fresh;
}

namespace {
// A cuda region names a device allocation by its IPC handle, with a size.
absl::Status CheckIpcRegionSpec(const RegionSpec& spec) {
  if (!spec.shm_name.empty() || spec.cuda_ipc_handle.empty()) {
    return absl::InvalidArgumentError(
        "this daemon runs the cuda backend: register device memory with cuda_ipc_handle (the "
        "cudaIpcMemHandle_t of the allocation base), not a shared-memory name");
  }
  if (spec.cuda_ipc_handle.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "cuda_ipc_handle has %d bytes; a cudaIpcMemHandle_t has %d: send the raw handle bytes",
        spec.cuda_ipc_handle.size(), kIpcHandleBytes));
  }
  if (spec.size_bytes == 0) {
    return absl::InvalidArgumentError("region size_bytes is 0: register the allocation's size");
  }
  return absl::OkStatus();
}
}  // namespace

absl::StatusOr<std::shared_ptr<Region>> CudaCopyEngine::OpenRegion(const RegionSpec& spec) {
  if (absl::Status st = CheckIpcRegionSpec(spec); !st.ok()) return st;
  Shared& s = *shared_;
  auto device = s.FindDevice(spec.device_id);
  if (!device.ok()) return device.status();
  const std::string key = device->uuid + std::string(1, '\0') + spec.cuda_ipc_handle;

  base::MutexLock open_lock(s.open_mu);
  std::shared_ptr<Mapping> m;
  {
    base::MutexLock lock(s.mu);
    if (s.shut_down) return absl::FailedPreconditionError("the cuda engine is shutting down");
    auto it = s.mappings.find(key);
    if (it != s.mappings.end()) m = it->second;
  }
  if (m == nullptr) {
    auto fresh = s.MapHandle(*device, spec.cuda_ipc_handle, key);
    if (!fresh.ok()) return fresh.status();
    m = *std::move(fresh);
    base::MutexLock lock(s.mu);
    s.mappings[key] = m;
    ++s.stats.mem_handle_opens_total;
    ++s.stats.mem_handles_open;
    HandleCounts& by_gpu = s.stats.handles_by_gpu[device->uuid];
    ++by_gpu.opens_total;
    ++by_gpu.open;
    // One line per open (rare: once per allocation): tests/gpu/run.sh counts them.
    LOG(INFO) << "cuda: opened IPC memory handle on " << device->uuid << " ("
              << m->allocation_bytes << " bytes); opens_total=" << s.stats.mem_handle_opens_total
              << " open_now=" << s.stats.mem_handles_open;
  }
  bool too_big, close_fresh = false;
  uint64_t allocation_bytes;
  {
    base::MutexLock lock(s.mu);
    allocation_bytes = m->allocation_bytes;
    too_big = spec.size_bytes > allocation_bytes;
    if (too_big && m->refs == 0) {  // opened for this registration only: undo
      s.mappings.erase(key);
      m->closed = true;
      close_fresh = true;
    }
    if (!too_big) ++m->refs;
  }
  if (close_fresh) s.Close(m);
  if (too_big) {
    return absl::OutOfRangeError(absl::StrFormat(
        "region registered as %d bytes but the allocation behind the handle has %d: register "
        "the allocation's real size (cuMemGetAddressRange of its base)",
        spec.size_bytes, allocation_bytes));
  }
  return std::shared_ptr<Region>(new CudaRegion(shared_, m, spec.size_bytes));
}

namespace {

absl::StatusOr<CudaRegion*> AsCuda(Region& region) {
  auto* r = dynamic_cast<CudaRegion*>(&region);
  if (r == nullptr) {
    return absl::InvalidArgumentError("region was not opened by the cuda engine");
  }
  return r;
}

}  // namespace

namespace {

absl::Status ChunkError(const std::string& uuid, const absl::Status& st, Direction direction,
                        uint64_t bytes, uint64_t region_offset) {
  return Annotate(uuid, st,
                  absl::StrFormat("%s copy of %d bytes at offset %d failed",
                                  DirectionName(direction), bytes, region_offset));
}

// The checks CopyChunk and PostChunk share; the region's mapping when the chunk may go.
absl::StatusOr<Mapping*> CheckChunk(CudaCopyEngine::Shared& s, Region& region,
                                    uint64_t region_offset, uint64_t bytes) {
  auto r = AsCuda(region);
  if (!r.ok()) return r.status();
  if (region_offset > region.size_bytes() || bytes > region.size_bytes() - region_offset) {
    return absl::OutOfRangeError(absl::StrFormat(
        "chunk [%d, +%d) is outside the region of %d bytes", region_offset, bytes,
        region.size_bytes()));
  }
  (void)s;
  Mapping& m = (*r)->mapping();
  if (m.closed.load()) {
    return absl::FailedPreconditionError(
        "the region's IPC handle was closed (the cuda engine is shutting down)");
  }
  return &m;
}

}  // namespace

absl::Status CudaCopyEngine::CopyChunk(Direction direction, Region& region, uint64_t region_offset,
                                       uint8_t* host, uint64_t bytes) {
  Shared& s = *shared_;
  auto checked = CheckChunk(s, region, region_offset, bytes);
  if (!checked.ok()) return checked.status();
  Mapping& m = **checked;
  uint8_t* dev = static_cast<uint8_t*>(m.base) + region_offset;
  absl::Status st = m.worker->IssueAndWait(direction, bytes, [&](void* stream) {
    return direction == Direction::kDeviceToHost
               ? s.api->MemcpyAsync(host, dev, bytes, direction, stream)
               : s.api->MemcpyAsync(dev, host, bytes, direction, stream);
  });
  if (!st.ok()) {
    return ChunkError(m.worker->device().uuid, st, direction, bytes, region_offset);
  }
  ++s.chunks_total;
  s.chunk_bytes_total += bytes;
  return absl::OkStatus();
}

bool CudaCopyEngine::asynchronous() const { return shared_->options.asynchronous; }

void CudaCopyEngine::PostChunk(Direction direction, Region& region, uint64_t region_offset,
                               uint8_t* host, uint64_t bytes, ChunkUrgency urgency,
                               std::function<void(absl::Status)> done) {
  if (!shared_->options.asynchronous) {
    return done(CopyChunk(direction, region, region_offset, host, bytes));
  }
  Shared& s = *shared_;
  auto checked = CheckChunk(s, region, region_offset, bytes);
  if (!checked.ok()) return done(checked.status());
  Mapping& m = **checked;
  uint8_t* dev = static_cast<uint8_t*>(m.base) + region_offset;
  CudaApi* api = s.api.get();
  // The completion holds the engine's state (not the region: the caller keeps that alive).
  std::shared_ptr<Shared> shared = shared_;
  std::shared_ptr<DeviceWorker> worker = m.worker;
  auto issue = [api, direction, dev, host, bytes](void* stream) {
    return direction == Direction::kDeviceToHost
               ? api->MemcpyAsync(host, dev, bytes, direction, stream)
               : api->MemcpyAsync(dev, host, bytes, direction, stream);
  };
  auto on_done = [shared, uuid = worker->device().uuid, direction, bytes, region_offset,
                  done](absl::Status st) {
    if (st.ok()) {
      ++shared->chunks_total;
      shared->chunk_bytes_total += bytes;
    } else {
      st = ChunkError(uuid, st, direction, bytes, region_offset);
    }
    done(std::move(st));
  };
  if (!worker->IssueAsync(direction, bytes, urgency == ChunkUrgency::kUrgent, std::move(issue),
                          std::move(on_done))) {
    done(absl::FailedPreconditionError(
        absl::StrFormat("the daemon's worker for %s has stopped", worker->device().uuid)));
  }
}

absl::Status CudaCopyEngine::WaitReady(Region& region, const std::string& ready_event) {
  if (ready_event.empty()) return absl::OkStatus();
  auto r = AsCuda(region);
  if (!r.ok()) return r.status();
  if (ready_event.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ready_event has %d bytes; a cudaIpcEventHandle_t has %d", ready_event.size(),
        kIpcHandleBytes));
  }
  Shared& s = *shared_;
  Mapping& m = (*r)->mapping();
  absl::Status st = m.worker->Run([&]() -> absl::Status {
    auto e = s.EventFor(m, ready_event);
    if (!e.ok()) return e.status();
    for (void* stream : m.worker->streams(Direction::kDeviceToHost)) {
      absl::Status w = s.api->StreamWaitEvent(stream, *e);
      if (!w.ok()) return w;
    }
    return absl::OkStatus();
  });
  if (!st.ok()) {
    return Annotate(m.worker->device().uuid, st,
                    "ready_event must be cudaIpcGetEventHandle of an event created with "
                    "cudaEventInterprocess | cudaEventDisableTiming on this GPU, kept alive "
                    "until the offload completes");
  }
  return absl::OkStatus();
}

absl::Status CudaCopyEngine::SignalDone(Region& region, const std::string& done_event) {
  if (done_event.empty()) return absl::OkStatus();
  auto r = AsCuda(region);
  if (!r.ok()) return r.status();
  if (done_event.size() != kIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "done_event has %d bytes; a cudaIpcEventHandle_t has %d", done_event.size(),
        kIpcHandleBytes));
  }
  Shared& s = *shared_;
  Mapping& m = (*r)->mapping();
  absl::Status st = m.worker->Run([&]() -> absl::Status {
    auto e = s.EventFor(m, done_event);
    if (!e.ok()) return e.status();
    return s.api->EventRecord(*e, m.worker->streams(Direction::kHostToDevice).front());
  });
  if (!st.ok()) {
    return Annotate(m.worker->device().uuid, st,
                    "done_event must be cudaIpcGetEventHandle of an interprocess event on this "
                    "GPU");
  }
  return absl::OkStatus();
}

absl::Status CudaCopyEngine::PrepareHostPool(uint8_t* base, uint64_t size_bytes) {
  if (base == nullptr || size_bytes == 0) {
    return absl::InvalidArgumentError("PrepareHostPool: empty host range");
  }
  Shared& s = *shared_;
  {
    base::MutexLock lock(s.mu);
    if (s.pinner.joinable() || s.stats.host_pool_bytes != 0) {
      return absl::FailedPreconditionError("PrepareHostPool called twice");
    }
    s.stats.host_pool_bytes = size_bytes;
  }
  auto devices = s.api->ListDevices();
  if (!devices.ok() || devices->empty()) {
    base::MutexLock lock(s.mu);
    s.stats.host_pool_ready = true;
    s.stats.host_pool_error = "no CUDA device";
    s.pin_status = absl::FailedPreconditionError(absl::StrFormat(
        "cannot pin the host pool: no usable CUDA driver or device (%s)",
        devices.ok() ? "none visible" : std::string(devices.status().message())));
    return s.pin_status;
  }
  const int ordinal = devices->front().ordinal;
  const uint64_t chunk = std::max<uint64_t>(
      4096, std::min<uint64_t>(s.options.host_register_chunk_bytes, 64ull << 30));
  s.pinner = std::thread([&s, base, size_bytes, ordinal, chunk] {
    const double start = offloadd::base::SteadyNowSeconds();
    absl::Status st = s.api->SetDevice(ordinal);
    for (uint64_t off = 0; st.ok() && off < size_bytes && !s.stop_pinning; off += chunk) {
      const uint64_t len = std::min(chunk, size_bytes - off);
      st = s.api->HostRegister(base + off, len);
      if (!st.ok()) break;
      base::MutexLock lock(s.mu);
      s.registered.push_back(base + off);
      s.stats.host_registered_bytes += len;
    }
    base::MutexLock lock(s.mu);
    s.stats.host_register_seconds = offloadd::base::SteadyNowSeconds() - start;
    s.stats.host_pool_ready = true;
    if (!st.ok()) {
      s.pin_status = absl::FailedPreconditionError(absl::StrFormat(
          "pinning the host pool failed after %d of %d bytes: %s (copies still work, from "
          "pageable memory, slower; check RLIMIT_MEMLOCK and free memory)",
          s.stats.host_registered_bytes, size_bytes, st.message()));
      s.stats.host_pool_error = std::string(s.pin_status.message());
      LOG(ERROR) << "cuda: " << s.pin_status.message();
    } else {
      LOG(INFO) << "cuda: host pool pinned: " << s.stats.host_registered_bytes << " bytes in "
                << s.stats.host_register_seconds << " s";
    }
    s.pinned_cv.notify_all();
  });
  return absl::OkStatus();
}

absl::Status CudaCopyEngine::WaitHostPoolReady() {
  Shared& s = *shared_;
  base::MutexLock lock(s.mu);
  if (s.stats.host_pool_bytes == 0) {
    return absl::FailedPreconditionError("PrepareHostPool was not called");
  }
  while (!s.stats.host_pool_ready) s.pinned_cv.Wait(s.mu);
  return s.pin_status;
}

CudaEngineStats CudaCopyEngine::stats() const {
  base::MutexLock lock(shared_->mu);
  CudaEngineStats st = shared_->stats;
  st.chunks_total = shared_->chunks_total.load();
  st.chunk_bytes_total = shared_->chunk_bytes_total.load();
  for (CudaDeviceStats& d : st.devices) {
    auto w = shared_->workers.find(d.uuid);
    if (w == shared_->workers.end()) continue;
    for (int i = 0; i < 2; ++i) {
      const DeviceWorker::LaneStats ls = w->second->lane_stats(static_cast<Direction>(i));
      d.dry_runs[i] = ls.dry_runs;
      d.issue_ahead_seconds[i] = ls.ahead_seconds;
      d.learned_bytes_per_second[i] = ls.bytes_per_second;
      d.queued_chunks[i] = ls.queued;
      d.issued_chunks[i] = ls.issued;
    }
  }
  return st;
}

std::map<std::string, HandleCounts> CudaCopyEngine::handle_counts() const {
  base::MutexLock lock(shared_->mu);
  return shared_->stats.handles_by_gpu;
}

uint64_t CudaCopyEngine::pinned_bytes() const {
  base::MutexLock lock(shared_->mu);
  return shared_->stats.host_registered_bytes;
}

int PciNumaNode(const std::string& pci_bus_id, const std::string& sysfs_root) {
  std::ifstream f(sysfs_root + "/bus/pci/devices/" + pci_bus_id + "/numa_node");
  int node = -1;
  if (!(f >> node)) return -1;
  return node;
}

}  // namespace offloadd::copy
