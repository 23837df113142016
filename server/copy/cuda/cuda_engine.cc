#include "server/copy/cuda/cuda_engine.h"

#include <algorithm>
#include <fstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "glog/logging.h"
#include "server/copy/cuda/cuda_engine_shared.h"

namespace offloadd::copy {

namespace {

class CudaRegion : public Region {
 public:
  CudaRegion(std::shared_ptr<CudaCopyEngine::Shared> shared, std::shared_ptr<Mapping> mapping,
             uint64_t size_bytes)
      : shared_(std::move(shared)), mapping_(std::move(mapping)), size_bytes_(size_bytes) {}
  ~CudaRegion() override { shared_->Unregister(mapping_); }
  uint64_t size_bytes() const override { return size_bytes_; }
  const std::shared_ptr<Mapping>& mapping() const { return mapping_; }

 private:
  std::shared_ptr<CudaCopyEngine::Shared> shared_;
  std::shared_ptr<Mapping> mapping_;
  uint64_t size_bytes_;
};

absl::Status Annotate(const std::string& uuid, const absl::Status& st, const std::string& hint) {
  return absl::Status(st.code(), absl::StrFormat("%s: %s%s%s", uuid, st.message(),
                                                 hint.empty() ? "" : ": ", hint));
}

constexpr char kOpenHint[] =
    "the handle must be cudaIpcGetMemHandle of the base of a live cudaMalloc allocation on this "
    "GPU, from a process on this node (memory from VMM allocators, e.g. "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True or cudaMallocAsync, has no such handle)";

}  // namespace

absl::Status CudaCopyEngine::Shared::ListLocked() {
  if (listed) return absl::OkStatus();
  auto list = api->ListDevices();
  if (!list.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "no usable CUDA driver or device (%s): run offloadd on a node with the NVIDIA driver "
        "and GPUs visible to it, or use backend: \"shm\"",
        list.status().message()));
  }
  devices = *list;
  listed = true;
  return absl::OkStatus();
}

absl::StatusOr<CudaDeviceInfo> CudaCopyEngine::Shared::FindDevice(const std::string& device_id) {
  base::MutexLock lock(mu);
  if (absl::Status st = ListLocked(); !st.ok()) return st;
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

absl::StatusOr<GpuThreads> CudaCopyEngine::Shared::ThreadsFor(const CudaDeviceInfo& device) {
  base::MutexLock start_lock(gpu_mu);
  {
    base::MutexLock lock(mu);
    auto it = gpus.find(device.uuid);
    if (it != gpus.end()) return it->second;
    if (shut_down) return absl::FailedPreconditionError("the cuda engine is shutting down");
  }
  DeviceWorkerOptions wo;
  wo.streams_per_direction = options.streams_per_direction;
  wo.issue_ahead_seconds = options.issue_ahead_seconds;
  wo.max_issue_ahead_seconds = options.max_issue_ahead_seconds;
  wo.assumed_bytes_per_second = options.assumed_bytes_per_second;
  GpuThreads g;
  g.worker = std::make_shared<DeviceWorker>(api.get(), device, wo);
  if (absl::Status st = g.worker->Start(); !st.ok()) return st;
  g.mapper = std::make_shared<MapperThread>(api.get(), device.ordinal);
  if (absl::Status st = g.mapper->Start(); !st.ok()) {
    g.worker->Stop();
    return Annotate(device.uuid, st, "starting the daemon's mapper thread failed");
  }
  CudaDeviceStats ds;
  ds.uuid = device.uuid;
  ds.pci_bus_id = device.pci_bus_id;
  ds.ordinal = device.ordinal;
  ds.numa_node = PciNumaNode(device.pci_bus_id);
  ds.free_bytes_after_context = g.worker->mem_after_context().free_bytes;
  ds.total_bytes = g.worker->mem_after_context().total_bytes;
  LOG(INFO) << "cuda: context on " << device.uuid << " (" << device.name << ", "
            << device.pci_bus_id << ", NUMA node " << ds.numa_node << "): device memory free "
            << ds.free_bytes_after_context << " of " << ds.total_bytes << " bytes";
  {
    base::MutexLock lock(mu);
    stats.devices.push_back(ds);
    gpus[device.uuid] = g;
  }
  StartPinning(device.ordinal);
  return g;
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
  s.CloseAll();
  std::map<std::string, GpuThreads> gpus;
  {
    base::MutexLock lock(s.mu);
    gpus = s.gpus;
  }
  if (!s.registered.empty() && !gpus.empty()) {
    // Any thread with a device current may unregister: a mapper thread has one.
    absl::Status st = gpus.begin()->second.mapper->Run([&s] {
      for (uint8_t* p : s.registered) {
        absl::Status u = s.api->HostUnregister(p);
        if (!u.ok()) LOG(WARNING) << "cuda: " << u.message();
      }
      return absl::OkStatus();
    });
    if (!st.ok()) LOG(WARNING) << "cuda: unregistering the host pool: " << st.message();
    s.registered.clear();
  }
  for (auto& [u, g] : gpus) g.worker->Stop();
  for (auto& [u, g] : gpus) g.mapper->Stop();
  base::MutexLock lock(s.mu);
  s.gpus.clear();
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

absl::StatusOr<CudaRegion*> AsCuda(Region& region) {
  auto* r = dynamic_cast<CudaRegion*>(&region);
  if (r == nullptr) {
    return absl::InvalidArgumentError("region was not opened by the cuda engine");
  }
  return r;
}

absl::Status CheckEventHandle(const std::string& handle, const char* name) {
  if (handle.empty() || handle.size() == kIpcHandleBytes) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s has %d bytes; a cudaIpcEventHandle_t has %d: send the raw handle bytes of an event "
      "created with cudaEventInterprocess | cudaEventDisableTiming",
      name, handle.size(), kIpcHandleBytes));
}

absl::Status ChunkError(const std::string& uuid, const absl::Status& st, Direction direction,
                        uint64_t bytes, uint64_t region_offset) {
  return Annotate(uuid, st,
                  absl::StrFormat("%s copy of %d bytes at offset %d failed",
                                  DirectionName(direction), bytes, region_offset));
}

// The host pool as cudaHostRegister'ed pieces (StartPinning): one copy's host range must lie
// inside one registration (the driver answers cudaErrorInvalidValue otherwise, seen on an
// H200 when a chunk of a block straddled two 1 GiB pieces), so a chunk crossing a piece
// boundary is issued as one cudaMemcpyAsync per piece, on the same stream.
struct HostPieces {
  const uint8_t* base = nullptr;
  uint64_t bytes = 0;
  uint64_t piece_bytes = 0;  // 0: not split

  // Bytes from `host` to the end of its piece (all of `want` outside the pool).
  uint64_t Run(const uint8_t* host, uint64_t want) const {
    if (piece_bytes == 0 || host < base || host >= base + bytes) return want;
    const uint64_t to_end = piece_bytes - static_cast<uint64_t>(host - base) % piece_bytes;
    return std::min(want, to_end);
  }
};

absl::Status IssueCopy(CudaApi& api, const HostPieces& pieces, Direction direction,
                       uint8_t* dev, uint8_t* host, uint64_t bytes, void* stream) {
  while (bytes > 0) {
    const uint64_t n = pieces.Run(host, bytes);
    absl::Status st = direction == Direction::kDeviceToHost
                          ? api.MemcpyAsync(host, dev, n, direction, stream)
                          : api.MemcpyAsync(dev, host, n, direction, stream);
    if (!st.ok()) return st;
    dev += n;
    host += n;
    bytes -= n;
  }
  return absl::OkStatus();
}

absl::Status CheckBounds(const Region& region, uint64_t region_offset, uint64_t bytes) {
  if (region_offset > region.size_bytes() || bytes > region.size_bytes() - region_offset) {
    return absl::OutOfRangeError(absl::StrFormat(
        "chunk [%d, +%d) is outside the region of %d bytes", region_offset, bytes,
        region.size_bytes()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::shared_ptr<Region>> CudaCopyEngine::OpenRegion(const RegionSpec& spec) {
  if (absl::Status st = CheckIpcRegionSpec(spec); !st.ok()) return st;
  Shared& s = *shared_;
  auto device = s.FindDevice(spec.device_id);
  if (!device.ok()) return device.status();
  auto gpu = s.ThreadsFor(*device);
  if (!gpu.ok()) return gpu.status();
  std::shared_ptr<Mapping> m = s.MappingFor(*device, *gpu, spec.cuda_ipc_handle);
  {
    base::MutexLock lock(s.mu);
    if (absl::Status st = s.RegisterLocked(*m, spec.owner_uid); !st.ok()) return st;
  }
  // Open it once now to check the handle and the size; it closes again unless a transfer uses it.
  s.Acquire(m);
  absl::StatusOr<uint64_t> allocation_bytes = s.WaitOpen(m);
  s.Release(m);
  absl::Status bad = allocation_bytes.status();
  if (bad.ok() && spec.size_bytes > *allocation_bytes) {
    bad = absl::OutOfRangeError(absl::StrFormat(
        "region registered as %d bytes but the allocation behind the handle has %d: register "
        "the allocation's real size (cuMemGetAddressRange of its base)",
        spec.size_bytes, *allocation_bytes));
  } else if (!bad.ok()) {
    bad = Annotate(device->uuid, bad, kOpenHint);
  }
  if (!bad.ok()) {
    s.Unregister(m);
    return bad;
  }
  return std::shared_ptr<Region>(new CudaRegion(shared_, m, spec.size_bytes));
}

absl::StatusOr<std::shared_ptr<TransferOrder>> CudaCopyEngine::BeginTransfer(Region& region,
                                                                            TransferSpec spec) {
  auto r = AsCuda(region);
  if (!r.ok()) return r.status();
  if (absl::Status st = CheckEventHandle(spec.ready_event, "ready_event"); !st.ok()) return st;
  if (absl::Status st = CheckEventHandle(spec.done_event, "done_event"); !st.ok()) return st;
  return std::shared_ptr<TransferOrder>(
      std::make_shared<CudaTransfer>(shared_, (*r)->mapping(), std::move(spec)));
}

namespace {

// The ordered transfer a chunk belongs to: `order`, or one made for this chunk alone.
absl::StatusOr<std::shared_ptr<CudaTransfer>> TransferOf(CudaCopyEngine& engine,
                                                         TransferOrder* order, Region& region,
                                                         Direction direction, uint64_t bytes) {
  if (order != nullptr) {
    auto* t = dynamic_cast<CudaTransfer*>(order);
    if (t == nullptr) return absl::InvalidArgumentError("order was not made by the cuda engine");
    return t->shared_from_this();
  }
  TransferSpec spec;
  spec.direction = direction;
  spec.bytes = bytes;
  auto made = engine.BeginTransfer(region, std::move(spec));
  if (!made.ok()) return made.status();
  return std::static_pointer_cast<CudaTransfer>(*made);
}

}  // namespace

absl::StatusOr<CopyRequest> CudaCopyEngine::ChunkRequest(TransferOrder* order,
                                                         uint64_t transfer_offset,
                                                         Direction direction, Region& region,
                                                         uint64_t region_offset, uint8_t* host,
                                                         uint64_t bytes, ChunkUrgency urgency) {
  if (absl::Status st = AsCuda(region).status(); !st.ok()) return st;
  if (absl::Status st = CheckBounds(region, region_offset, bytes); !st.ok()) return st;
  auto t = TransferOf(*this, order, region, direction, bytes);
  if (!t.ok()) return t.status();
  if (order == nullptr) transfer_offset = 0;
  std::shared_ptr<CudaTransfer> transfer = *t;
  CudaApi* api = shared_->api.get();
  CopyRequest r;
  r.direction = direction;
  r.bytes = bytes;
  r.urgent = urgency == ChunkUrgency::kUrgent;
  HostPieces pieces;
  {
    base::MutexLock lock(shared_->mu);
    pieces = {shared_->pool_base, shared_->pool_bytes, shared_->PieceBytes()};
  }
  // The chunk keeps its transfer (so the mapping's use) until it completed.
  r.issue = [api, transfer, direction, region_offset, host, bytes, pieces](void* stream) {
    return IssueCopy(*api, pieces, direction, transfer->base() + region_offset, host, bytes,
                     stream);
  };
  r.gate = transfer;
  if (transfer->has_done_event() && transfer_offset + bytes == transfer->spec().bytes) {
    r.after_issue = [transfer](void* stream) { return transfer->RecordDone(stream); };
  }
  return r;
}

absl::Status CudaCopyEngine::CopyOrderedChunk(TransferOrder* order, uint64_t transfer_offset,
                                              Direction direction, Region& region,
                                              uint64_t region_offset, uint8_t* host,
                                              uint64_t bytes) {
  auto r = ChunkRequest(order, transfer_offset, direction, region, region_offset, host, bytes,
                        ChunkUrgency::kNormal);
  if (!r.ok()) return r.status();
  auto gpu = static_cast<CudaTransfer*>(r->gate.get())->mapping().gpu;
  absl::Status st = gpu.worker->SubmitAndWait(*std::move(r));
  if (!st.ok()) return ChunkError(gpu.worker->device().uuid, st, direction, bytes, region_offset);
  ++shared_->chunks_total;
  shared_->chunk_bytes_total += bytes;
  return absl::OkStatus();
}

void CudaCopyEngine::PostOrderedChunk(TransferOrder* order, uint64_t transfer_offset,
                                      Direction direction, Region& region,
                                      uint64_t region_offset, uint8_t* host, uint64_t bytes,
                                      ChunkUrgency urgency,
                                      std::function<void(absl::Status)> done) {
  if (!shared_->options.asynchronous) {
    return done(CopyOrderedChunk(order, transfer_offset, direction, region, region_offset, host,
                                 bytes));
  }
  auto r = ChunkRequest(order, transfer_offset, direction, region, region_offset, host, bytes,
                        urgency);
  if (!r.ok()) return done(r.status());
  std::shared_ptr<DeviceWorker> worker =
      static_cast<CudaTransfer*>(r->gate.get())->mapping().gpu.worker;
  // The completion holds the engine's state (not the region: the caller keeps that alive).
  r->done = [shared = shared_, uuid = worker->device().uuid, direction, bytes, region_offset,
             done](absl::Status st) {
    if (st.ok()) {
      ++shared->chunks_total;
      shared->chunk_bytes_total += bytes;
    } else {
      st = ChunkError(uuid, st, direction, bytes, region_offset);
    }
    done(std::move(st));
  };
  if (!worker->Submit(*std::move(r))) {
    done(absl::FailedPreconditionError(
        absl::StrFormat("the daemon's worker for %s has stopped", worker->device().uuid)));
  }
}

CopyCapabilities CudaCopyEngine::capabilities() const {
  CopyCapabilities c;
  c.asynchronous = shared_->options.asynchronous;
  c.orders_transfers = true;
  return c;
}

void CudaCopyEngine::ForgetDevice(const std::string& device_id) { (void)device_id; }

absl::StatusOr<std::vector<CudaDeviceInfo>> CudaCopyEngine::Devices() {
  Shared& s = *shared_;
  base::MutexLock lock(s.mu);
  if (absl::Status st = s.ListLocked(); !st.ok()) return st;
  return s.devices;
}

absl::Status CudaCopyEngine::PrepareHostPool(uint8_t* base, uint64_t size_bytes) {
  if (base == nullptr || size_bytes == 0) {
    return absl::InvalidArgumentError("PrepareHostPool: empty host range");
  }
  Shared& s = *shared_;
  int ordinal = -1;
  {
    base::MutexLock lock(s.mu);
    if (s.pool_bytes != 0) return absl::FailedPreconditionError("PrepareHostPool called twice");
    s.pool_base = base;
    s.pool_bytes = size_bytes;
    s.stats.host_pool_bytes = size_bytes;
    if (!s.gpus.empty()) ordinal = s.gpus.begin()->second.worker->device().ordinal;
  }
  // Pinning needs a context: it starts on the first GPU a session uses, not on GPU 0 for
  // nothing.
  if (ordinal >= 0) s.StartPinning(ordinal);
  return absl::OkStatus();
}

uint64_t CudaCopyEngine::Shared::PieceBytes() const {
  return std::max<uint64_t>(4096, std::min<uint64_t>(options.host_register_chunk_bytes,
                                                     64ull << 30));
}

void CudaCopyEngine::Shared::StartPinning(int ordinal) {
  uint8_t* base;
  uint64_t size_bytes;
  {
    base::MutexLock lock(mu);
    if (pinning_started || pool_bytes == 0) return;
    pinning_started = true;
    base = pool_base;
    size_bytes = pool_bytes;
  }
  const uint64_t chunk = PieceBytes();
  LOG(INFO) << "cuda: pinning the host pool (" << size_bytes << " bytes) in pieces of " << chunk
            << " bytes from the context of device ordinal " << ordinal;
  pinner = std::thread([this, base, size_bytes, ordinal, chunk] {
    const double start = offloadd::base::SteadyNowSeconds();
    absl::Status st = api->SetDevice(ordinal);
    for (uint64_t off = 0; st.ok() && off < size_bytes && !stop_pinning; off += chunk) {
      const uint64_t len = std::min(chunk, size_bytes - off);
      st = api->HostRegister(base + off, len);
      if (!st.ok()) break;
      base::MutexLock lock(mu);
      registered.push_back(base + off);
      stats.host_registered_bytes += len;
    }
    base::MutexLock lock(mu);
    stats.host_register_seconds = offloadd::base::SteadyNowSeconds() - start;
    stats.host_pool_ready = true;
    if (!st.ok()) {
      pin_status = absl::FailedPreconditionError(absl::StrFormat(
          "pinning the host pool failed after %d of %d bytes: %s (copies still work, from "
          "pageable memory, slower; check RLIMIT_MEMLOCK and free memory)",
          stats.host_registered_bytes, size_bytes, st.message()));
      stats.host_pool_error = std::string(pin_status.message());
      LOG(ERROR) << "cuda: " << pin_status.message();
    } else {
      LOG(INFO) << "cuda: host pool pinned: " << stats.host_registered_bytes << " bytes in "
                << stats.host_register_seconds << " s";
    }
    pinned_cv.notify_all();
  });
}

absl::Status CudaCopyEngine::WaitHostPoolReady() {
  Shared& s = *shared_;
  base::MutexLock lock(s.mu);
  if (s.pool_bytes == 0) return absl::FailedPreconditionError("PrepareHostPool was not called");
  if (!s.pinning_started) {
    return absl::FailedPreconditionError(
        "the host pool is pinned from the first GPU a session uses, and no session has opened "
        "a region yet");
  }
  while (!s.stats.host_pool_ready) s.pinned_cv.Wait(s.mu);
  return s.pin_status;
}

absl::Status CudaCopyEngine::RunOnDevice(const std::string& device_id,
                                         const std::function<absl::Status(CudaApi&)>& fn) {
  Shared& s = *shared_;
  auto device = s.FindDevice(device_id);
  if (!device.ok()) return device.status();
  absl::StatusOr<GpuThreads> gpu = s.ThreadsFor(*device);  // FAILED_PRECONDITION once shut down
  if (!gpu.ok()) return gpu.status();
  std::shared_ptr<DeviceWorker> worker = gpu->worker;
  return worker->Run([&] { return fn(*s.api); });
}

CudaEngineStats CudaCopyEngine::stats() const {
  base::MutexLock lock(shared_->mu);
  CudaEngineStats st = shared_->stats;
  st.chunks_total = shared_->chunks_total.load();
  st.chunk_bytes_total = shared_->chunk_bytes_total.load();
  for (CudaDeviceStats& d : st.devices) {
    auto g = shared_->gpus.find(d.uuid);
    if (g == shared_->gpus.end()) continue;
    for (int i = 0; i < 2; ++i) {
      const DeviceWorker::LaneStats ls = g->second.worker->lane_stats(static_cast<Direction>(i));
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

void CudaCopyEngine::ReleaseOwner(uint64_t owner_id) {
  if (owner_id == 0) return;
  std::vector<std::shared_ptr<OpenedEvent>> dropped;  // destroyed after the lock is released
  base::MutexLock lock(shared_->mu);
  for (auto it = shared_->event_owners.begin(); it != shared_->event_owners.end();) {
    if (it->second.erase(owner_id) == 0 || !it->second.empty()) {
      ++it;
      continue;
    }
    auto e = shared_->events.find(it->first);
    if (e != shared_->events.end()) {
      dropped.push_back(std::move(e->second));
      shared_->events.erase(e);
    }
    shared_->event_lru.remove(it->first);
    it = shared_->event_owners.erase(it);
  }
}

size_t CudaCopyEngine::cached_events() const {
  base::MutexLock lock(shared_->mu);
  return shared_->events.size();
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
