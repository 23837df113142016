#include "server/copy/cuda/cuda_api_sim.h"

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "server/copy/cuda/cuda_api_forwarding.h"

namespace offloadd::copy {

using common::kSimPending;
using common::ParseSimEventHandle;
using common::ParseSimMemHandle;
using common::SimEventRef;
using common::SimEventSlot;
using common::SimGpuTable;
using common::SimMemRef;
using common::SimNowNanoseconds;
using common::SimSegmentGeometry;
using common::SimSegmentSlot;
using common::SimSegmentState;
using common::SimViolation;

namespace {

// Simulated device pointers start here (user space on x86-64 ends at 2^47; nothing maps this
// high in practice, and nothing dereferences them anyway).
constexpr uintptr_t kFirstDeviceBase = uintptr_t{0x5100} << 32;
constexpr uintptr_t kBaseAlign = uintptr_t{2} << 20;
constexpr char kSimMemPrefix[] = "cuda-sim-mem";
constexpr char kSimMallocPrefix[] = "cuda-sim-malloc";

class RealSimClock : public SimClock {
 public:
  double NowSeconds() override { return base::SteadyNowSeconds(); }
  void SpendHostSeconds(double seconds) override {
    if (seconds <= 0) return;
    const double until = NowSeconds() + seconds;
    while (NowSeconds() < until) {
    }
  }
};

// Size from a SimMemHandle, 0 if `handle` is not one.
uint64_t SimHandleSize(absl::string_view handle) {
  std::string text(handle.substr(0, handle.find('\0')));
  std::vector<std::string> parts = absl::StrSplit(text, ':');
  uint64_t size = 0;
  if (parts.size() != 3 || parts[0] != kSimMemPrefix || !absl::SimpleAtoi(parts[1], &size)) {
    return 0;
  }
  return size;
}

}  // namespace

SimClock* SimClock::Real() {
  static RealSimClock* clock = new RealSimClock();
  return clock;
}

double ManualSimClock::NowSeconds() {
  base::MutexLock lock(mu_);
  return now_;
}

void ManualSimClock::Advance(double seconds) {
  base::MutexLock lock(mu_);
  if (seconds > 0) now_ += seconds;
}

std::string SimMemHandle(uint64_t size_bytes, uint64_t id) {
  return PadIpcHandle(absl::StrFormat("%s:%d:%d", kSimMemPrefix, size_bytes, id));
}

SimCudaApi::SimCudaApi(SimCudaOptions options, SimClock* clock)
    : options_(options),
      clock_(clock != nullptr ? clock : SimClock::Real()),
      next_base_(kFirstDeviceBase) {
  const int gpus = std::max(1, options_.model.gpus);
  gpus_per_shard_ = options_.model.switch_bytes_per_second > 0
                        ? std::max(1, options_.model.gpus_per_switch)
                        : 1;
  for (int first = 0; first < gpus; first += gpus_per_shard_) {
    CopyModelOptions o = options_.model;
    o.gpus = std::min(gpus_per_shard_, gpus - first);
    o.first_gpu = first;
    shards_.push_back(std::make_unique<Shard>(o));
  }
  for (int i = 0; i < gpus; ++i) {
    CudaDeviceInfo d;
    d.ordinal = i;
    d.uuid = DeviceUuid(i);
    d.pci_bus_id = absl::StrFormat("0000:%02x:00.0", 0x10 + i);
    d.name = absl::StrFormat(
        "cuda-sim %.1f GB/s per direction (SIMULATED: bytes move only for a simulated client GPU)",
                             shards_[0]->model.options().engine_bytes_per_second / 1e9);
    d.total_bytes = options_.device_total_bytes;
    devices_.push_back(d);
  }
}

SimCudaApi::~SimCudaApi() = default;

std::unique_ptr<CudaApi> SimCudaApi::Borrow() {
  return std::make_unique<ForwardingCudaApi>(this);
}

std::string SimCudaApi::DeviceUuid(int ordinal) {
  return absl::StrFormat("GPU-51300000-0000-0000-0000-%012d", ordinal);
}

void* SimCudaApi::Handle(size_t shard, uint64_t id) {
  return reinterpret_cast<void*>((uintptr_t{shard + 1} << kShardShift) | id);
}

SimCudaApi::Shard* SimCudaApi::ShardOfHandle(void* handle, uint64_t* id) const {
  const uintptr_t v = reinterpret_cast<uintptr_t>(handle);
  const uintptr_t s = v >> kShardShift;
  if (s == 0 || s > shards_.size()) return nullptr;
  *id = v & ((uintptr_t{1} << kShardShift) - 1);
  return shards_[s - 1].get();
}

std::string SimCudaApi::AddAllocation(int ordinal, uint64_t size_bytes) {
  base::MutexLock lock(mu_);
  std::string h = PadIpcHandle(absl::StrFormat("cuda-sim-alloc:%d", next_id_++));
  Allocation& a = allocations_[h];
  a.ordinal = ordinal;
  a.size_bytes = size_bytes;
  return h;
}

ModelEngineStats SimCudaApi::engine_stats(int ordinal, Direction direction) {
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) return {};
  Shard& sh = ShardOfGpu(ordinal);
  base::MutexLock lock(sh.mu);
  AdvanceLocked(sh);
  return sh.model.engine_stats(ordinal - sh.first_gpu, direction);
}

SimCallCounts SimCudaApi::call_counts() {
  SimCallCounts total;
  for (auto& sh : shards_) {
    base::MutexLock lock(sh->mu);
    total.memcpys += sh->counts.memcpys;
    total.memcpy_bytes += sh->counts.memcpy_bytes;
    total.event_records += sh->counts.event_records;
    total.event_queries += sh->counts.event_queries;
    total.host_seconds += sh->counts.host_seconds;
  }
  return total;
}

double SimCudaApi::EventCompletionSeconds(void* event) {
  uint64_t id = 0;
  Shard* sh = ShardOfHandle(event, &id);
  if (sh == nullptr) return -1;
  base::MutexLock lock(sh->mu);
  auto it = sh->events.find(id);
  if (it == sh->events.end()) return -1;
  AdvanceLocked(*sh);
  double latest = -1;
  for (CopyTimingModel::OpId op : it->second.ops) {
    if (!sh->model.Done(op)) return -1;
    latest = std::max(latest, sh->model.CompletionSeconds(op));
  }
  return latest;
}

int SimCudaApi::CurrentLocked() const {
  auto it = current_.find(std::this_thread::get_id());
  return it == current_.end() ? -1 : it->second;
}

int SimCudaApi::Current() {
  base::MutexLock lock(mu_);
  return CurrentLocked();
}

absl::StatusOr<std::vector<CudaDeviceInfo>> SimCudaApi::ListDevices() { return devices_; }

absl::Status SimCudaApi::SetDevice(int ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) {
    return absl::FailedPreconditionError("cudaSetDevice: cudaErrorInvalidDevice (101)");
  }
  base::MutexLock lock(mu_);
  current_[std::this_thread::get_id()] = ordinal;
  return absl::OkStatus();
}

absl::StatusOr<CudaMemInfo> SimCudaApi::MemGetInfo() {
  if (Current() < 0) return absl::FailedPreconditionError("cudaMemGetInfo: no device set");
  return CudaMemInfo{options_.device_total_bytes, options_.device_total_bytes};
}

absl::StatusOr<void*> SimCudaApi::CreateStream() {
  const int cur = Current();
  if (cur < 0) return absl::FailedPreconditionError("cudaStreamCreate: no device set");
  Shard& sh = ShardOfGpu(cur);
  base::MutexLock lock(sh.mu);
  const uint64_t id = sh.next_handle_id++;
  sh.streams[id].ordinal = cur;
  return Handle(ShardIndex(cur), id);
}

void SimCudaApi::DestroyStream(void* stream) {
  uint64_t id = 0;
  Shard* sh = ShardOfHandle(stream, &id);
  if (sh == nullptr) return;
  base::MutexLock lock(sh->mu);
  sh->streams.erase(id);
}

absl::StatusOr<void*> SimCudaApi::CreateEvent() {
  const int cur = std::max(0, Current());  // (an IPC event opened with no device set: GPU 0's)
  Shard& sh = ShardOfGpu(cur);
  base::MutexLock lock(sh.mu);
  const uint64_t id = sh.next_handle_id++;
  sh.events[id];
  return Handle(ShardIndex(cur), id);
}

void SimCudaApi::DestroyEvent(void* event) {
  uint64_t id = 0;
  Shard* sh = ShardOfHandle(event, &id);
  if (sh == nullptr) return;
  base::MutexLock lock(sh->mu);
  // Completions due by now are written first, so that a client's done event recorded here is
  // not left pending, nor its table held, for want of a later call on this shard.
  AdvanceLocked(*sh);
  sh->events.erase(id);
}

absl::StatusOr<std::shared_ptr<SimGpuTable>> SimCudaApi::TableLocked(uint32_t pid,
                                                                   uint64_t instance) {
  for (auto e = tables_.begin(); e != tables_.end();) {  // forget tables no one holds
    e = e->second.expired() ? tables_.erase(e) : std::next(e);
  }
  auto it = tables_.find(pid);
  if (it != tables_.end()) {
    std::shared_ptr<SimGpuTable> t = it->second.lock();
    if (t != nullptr && t->instance() == instance) return t;
  }
  auto t = OpenSimGpuTable(pid, instance);
  if (!t.ok()) return t.status();
  tables_[pid] = *t;
  return *t;
}

absl::StatusOr<void*> SimCudaApi::OpenSimSegmentLocked(absl::string_view handle, int cur) {
  SimMemRef ref;
  ParseSimMemHandle(handle, &ref);
  auto table = TableLocked(ref.pid, ref.instance);
  if (!table.ok()) {
    return absl::FailedPreconditionError(absl::StrCat(
        "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle (400): ", table.status().message()));
  }
  SimSegmentSlot* seg = (*table)->segment(ref.slot);
  SimSegmentGeometry g;  // read once: the client may rewrite the slot from here on
  if (seg == nullptr || seg->state.load() != static_cast<uint32_t>(SimSegmentState::kLive) ||
      seg->generation.load() != ref.generation || !(*table)->Geometry(*seg, &g)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle (400): the allocation behind "
        "this handle (slot %d of %s) is not live: freed, or never allocated",
        ref.slot, (*table)->name()));
  }
  if (static_cast<int>(g.device) != cur) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cudaIpcOpenMemHandle: cudaErrorInvalidDevice (101): allocation is on device %d, %d is "
        "current",
        g.device, cur));
  }
  Allocation& a = allocations_[std::string(handle)];
  if (a.base != 0) {
    ++a.opens;
    return reinterpret_cast<void*>(a.base);
  }
  a = Allocation{cur, g.size_bytes, next_base_, 1, *table, seg, ref.generation, g.memory};
  next_base_ += (a.size_bytes + 2 * kBaseAlign - 1) / kBaseAlign * kBaseAlign;
  mapped_[a.base] = std::string(handle);
  seg->daemon_maps.fetch_add(1);
  Shard& sh = ShardOfGpu(cur);  // (lock order: mu_, then a shard's)
  base::MutexLock shard_lock(sh.mu);
  sh.mapped[a.base] = Mapped{cur, a.size_bytes, a.table, seg, ref.generation, g.memory};
  return reinterpret_cast<void*>(a.base);
}

absl::StatusOr<void*> SimCudaApi::IpcOpenMemHandle(absl::string_view handle) {
  base::MutexLock lock(mu_);
  const int cur = CurrentLocked();
  if (cur < 0) return absl::FailedPreconditionError("cudaIpcOpenMemHandle: no device set");
  SimMemRef ref;
  if (ParseSimMemHandle(handle, &ref)) return OpenSimSegmentLocked(handle, cur);
  std::string key(handle);
  auto it = allocations_.find(key);
  if (it == allocations_.end()) {
    const uint64_t size = SimHandleSize(handle);
    if (size == 0) {
      return absl::FailedPreconditionError(
          "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle (400): not a cuda-sim handle "
          "(clients of a cuda-sim daemon register SimMemHandle(size, id) or a simulated GPU "
          "table's handles)");
    }
    it = allocations_.emplace(key, Allocation{cur, size, 0}).first;
  }
  Allocation& a = it->second;
  if (a.base != 0) {  // CUDA counts references: the same address again
    ++a.opens;
    return reinterpret_cast<void*>(a.base);
  }
  if (a.ordinal != cur) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cudaIpcOpenMemHandle: cudaErrorInvalidDevice (101): allocation is on device %d, %d is "
        "current",
        a.ordinal, cur));
  }
  a.base = next_base_;
  a.opens = 1;
  next_base_ += (a.size_bytes + 2 * kBaseAlign - 1) / kBaseAlign * kBaseAlign;
  mapped_[a.base] = key;
  Shard& sh = ShardOfGpu(cur);  // (lock order: mu_, then a shard's)
  base::MutexLock shard_lock(sh.mu);
  sh.mapped[a.base] = Mapped{cur, a.size_bytes};
  return reinterpret_cast<void*>(a.base);
}

void* SimCudaApi::MapLocked(const std::string& key, Allocation& a) {
  a.base = next_base_;
  next_base_ += (a.size_bytes + 2 * kBaseAlign - 1) / kBaseAlign * kBaseAlign;
  mapped_[a.base] = key;
  Shard& sh = ShardOfGpu(a.ordinal);  // (lock order: mu_, then a shard's)
  base::MutexLock shard_lock(sh.mu);
  sh.mapped[a.base] = {a.ordinal, a.size_bytes};
  return reinterpret_cast<void*>(a.base);
}

absl::StatusOr<void*> SimCudaApi::DeviceMalloc(uint64_t bytes) {
  base::MutexLock lock(mu_);
  const int cur = CurrentLocked();
  if (cur < 0) return absl::FailedPreconditionError("cudaMalloc: no device set");
  if (bytes == 0 || bytes > options_.device_total_bytes) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cudaMalloc: cudaErrorMemoryAllocation (2): %d bytes on a device of %d", bytes,
        options_.device_total_bytes));
  }
  const std::string key = PadIpcHandle(absl::StrFormat("%s:%d", kSimMallocPrefix, next_id_++));
  Allocation& a = allocations_[key];
  a.ordinal = cur;
  a.size_bytes = bytes;
  return MapLocked(key, a);
}

absl::Status SimCudaApi::DeviceFree(void* device_ptr) {
  base::MutexLock lock(mu_);
  auto it = mapped_.find(reinterpret_cast<uintptr_t>(device_ptr));
  if (it == mapped_.end() || it->second.rfind(kSimMallocPrefix, 0) != 0) {
    return absl::FailedPreconditionError(
        "cudaFree: cudaErrorInvalidDevicePointer (17): not a cudaMalloc pointer");
  }
  auto a = allocations_.find(it->second);
  {
    Shard& sh = ShardOfGpu(a->second.ordinal);
    base::MutexLock shard_lock(sh.mu);
    sh.mapped.erase(a->second.base);
  }
  allocations_.erase(a);
  mapped_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<double> SimCudaApi::EventElapsedSeconds(void* start, void* end) {
  const double a = EventCompletionSeconds(start), b = EventCompletionSeconds(end);
  if (a < 0 || b < 0) {
    return absl::FailedPreconditionError(
        "cudaEventElapsedTime: cudaErrorNotReady (600): an event has not completed (or its "
        "completion is no longer remembered)");
  }
  return b - a;
}

absl::Status SimCudaApi::IpcCloseMemHandle(void* device_ptr) {
  base::MutexLock lock(mu_);
  auto it = mapped_.find(reinterpret_cast<uintptr_t>(device_ptr));
  if (it == mapped_.end()) {
    return absl::FailedPreconditionError("cudaIpcCloseMemHandle: cudaErrorInvalidValue (1)");
  }
  Allocation& a = allocations_[it->second];
  if (--a.opens > 0) return absl::OkStatus();
  {
    Shard& sh = ShardOfGpu(a.ordinal);
    base::MutexLock shard_lock(sh.mu);
    sh.mapped.erase(a.base);
  }
  a.base = 0;
  if (a.segment != nullptr) {  // a client segment: validated again at the next open
    a.segment->daemon_maps.fetch_sub(1);
    allocations_.erase(it->second);
  }
  mapped_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SimCudaApi::AllocationSize(void* device_ptr) {
  base::MutexLock lock(mu_);
  auto it = mapped_.find(reinterpret_cast<uintptr_t>(device_ptr));
  if (it == mapped_.end()) {
    return absl::FailedPreconditionError("cuMemGetAddressRange: CUDA_ERROR_NOT_FOUND (500)");
  }
  return allocations_[it->second].size_bytes;
}

absl::StatusOr<void*> SimCudaApi::IpcOpenEventHandle(absl::string_view handle) {
  if (handle.size() != kIpcHandleBytes) {
    return absl::FailedPreconditionError(
        "cudaIpcOpenEventHandle: cudaErrorInvalidResourceHandle (400)");
  }
  SimEventRef ref;
  if (!ParseSimEventHandle(handle, &ref)) {
    return CreateEvent();  // a client that is not modelled: its event is complete
  }
  std::shared_ptr<SimGpuTable> table;
  {
    base::MutexLock lock(mu_);
    auto t = TableLocked(ref.pid, ref.instance);
    if (!t.ok()) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cudaIpcOpenEventHandle: cudaErrorInvalidResourceHandle (400): ",
          t.status().message()));
    }
    table = *t;
  }
  SimEventSlot* slot = table->event(ref.slot);
  if (slot == nullptr) {
    return absl::FailedPreconditionError(
        "cudaIpcOpenEventHandle: cudaErrorInvalidResourceHandle (400): no such event slot");
  }
  auto e = CreateEvent();
  if (!e.ok()) return e;
  uint64_t id = 0;
  Shard* sh = ShardOfHandle(*e, &id);
  base::MutexLock lock(sh->mu);
  Event& ev = sh->events[id];
  ev.table = std::move(table);
  ev.slot = slot;
  return e;
}

absl::Status SimCudaApi::StreamWaitEvent(void* stream, void* event) {
  uint64_t sid = 0, eid = 0;
  Shard* ss = ShardOfHandle(stream, &sid);
  Shard* es = ShardOfHandle(event, &eid);
  if (ss == nullptr || es == nullptr) {
    return absl::FailedPreconditionError("cudaStreamWaitEvent: cudaErrorInvalidResourceHandle");
  }
  std::vector<CopyTimingModel::OpId> ops;
  {
    base::MutexLock lock(es->mu);
    auto e = es->events.find(eid);
    if (e == es->events.end()) {
      return absl::FailedPreconditionError("cudaStreamWaitEvent: cudaErrorInvalidResourceHandle");
    }
    ops = e->second.ops;
    if (e->second.slot != nullptr && ops.empty() &&
        SimNowNanoseconds() < e->second.slot->complete_at_ns.load()) {
      return absl::FailedPreconditionError(
          "cudaStreamWaitEvent: cuda-sim does not model a stream waiting on a simulated "
          "client's pending event (the cuda engine queries client events instead)");
    }
    if (es != ss) {  // another shard's model: only an event already complete can be waited on
      AdvanceLocked(*es);
      for (CopyTimingModel::OpId op : ops) {
        if (!es->model.Done(op)) {
          return absl::FailedPreconditionError(
              "cudaStreamWaitEvent: cuda-sim does not model a wait on a pending event of a GPU "
              "in another shard (behind another switch, or another GPU without a switch limit)");
        }
      }
      ops.clear();
    }
  }
  base::MutexLock lock(ss->mu);
  auto s = ss->streams.find(sid);
  if (s == ss->streams.end()) {
    return absl::FailedPreconditionError("cudaStreamWaitEvent: cudaErrorInvalidResourceHandle");
  }
  for (CopyTimingModel::OpId op : ops) s->second.waits.push_back(op);
  return absl::OkStatus();
}

absl::Status SimCudaApi::MemcpyAsync(void* dst, const void* src, uint64_t bytes,
                                     Direction direction, void* stream) {
  clock_->SpendHostSeconds(options_.memcpy_host_seconds);
  uint64_t sid = 0;
  Shard* sh = ShardOfHandle(stream, &sid);
  if (sh == nullptr) {
    return absl::FailedPreconditionError("cudaMemcpyAsync: cudaErrorInvalidResourceHandle");
  }
  base::MutexLock lock(sh->mu);
  sh->counts.host_seconds += options_.memcpy_host_seconds;
  auto s = sh->streams.find(sid);
  if (s == sh->streams.end()) {
    return absl::FailedPreconditionError("cudaMemcpyAsync: cudaErrorInvalidResourceHandle");
  }
  Stream& st = s->second;
  const void* host = direction == Direction::kDeviceToHost ? dst : src;
  const uintptr_t dev =
      reinterpret_cast<uintptr_t>(direction == Direction::kDeviceToHost ? src : dst);
  auto m = sh->mapped.upper_bound(dev);
  bool inside = host != nullptr && m != sh->mapped.begin();
  if (inside) {
    --m;
    const uint64_t size = m->second.size_bytes;
    inside = m->second.ordinal == st.ordinal && dev - m->first <= size &&
             bytes <= size - (dev - m->first);
  }
  if (!inside) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cudaMemcpyAsync: cudaErrorInvalidValue (1): %s copy of %d bytes at device address "
        "%#x is outside every allocation mapped on the stream's device (or host is null)",
        DirectionName(direction), bytes, dev));
  }
  std::vector<CopyTimingModel::OpId> after = st.waits;
  after.push_back(st.last);
  const int host_node = options_.host_numa_node ? options_.host_numa_node(host) : -1;
  st.last = sh->model.Enqueue(Now(), st.ordinal - sh->first_gpu, direction, bytes, after,
                              host_node);
  st.waits.clear();
  if (m->second.table != nullptr) {  // a simulated client's memory: its bytes move later
    // (the address the open computed and checked; dev - base <= size - bytes was checked above)
    uint8_t* device_bytes = m->second.memory + (dev - m->first);
    ByteCopy c{nullptr, nullptr, bytes, m->second.table, m->second.segment,
               m->second.generation};
    c.dst = direction == Direction::kDeviceToHost ? static_cast<uint8_t*>(dst) : device_bytes;
    c.src = direction == Direction::kDeviceToHost ? device_bytes : static_cast<const uint8_t*>(src);
    sh->byte_copies[st.last] = std::move(c);
  }
  ++sh->counts.memcpys;
  sh->counts.memcpy_bytes += bytes;
  return absl::OkStatus();
}

absl::Status SimCudaApi::EventRecord(void* event, void* stream) {
  clock_->SpendHostSeconds(options_.event_record_host_seconds);
  uint64_t sid = 0, eid = 0;
  Shard* ss = ShardOfHandle(stream, &sid);
  Shard* es = ShardOfHandle(event, &eid);
  if (ss == nullptr || es == nullptr) {
    return absl::FailedPreconditionError("cudaEventRecord: cudaErrorInvalidResourceHandle");
  }
  base::MutexLock lock(ss->mu);
  ss->counts.host_seconds += options_.event_record_host_seconds;
  if (es != ss) {
    return absl::FailedPreconditionError(
        "cudaEventRecord: cudaErrorInvalidResourceHandle (400): the event was created on a "
        "device of another shard than the stream's");
  }
  auto s = ss->streams.find(sid);
  auto e = ss->events.find(eid);
  if (s == ss->streams.end() || e == ss->events.end()) {
    return absl::FailedPreconditionError("cudaEventRecord: cudaErrorInvalidResourceHandle");
  }
  e->second.ops = s->second.waits;
  e->second.ops.push_back(s->second.last);
  ++ss->counts.event_records;
  if (e->second.slot != nullptr) {  // a simulated client's event: pending until its copies end
    e->second.slot->complete_at_ns.store(kSimPending);
    e->second.slot->seq.fetch_add(1);
    ss->pending_records[eid] = {e->second.table, e->second.slot};
  }
  return absl::OkStatus();
}

absl::StatusOr<bool> SimCudaApi::EventQuery(void* event) {
  clock_->SpendHostSeconds(options_.event_query_host_seconds);
  uint64_t eid = 0;
  Shard* sh = ShardOfHandle(event, &eid);
  if (sh == nullptr) {
    return absl::FailedPreconditionError("cudaEventQuery: cudaErrorInvalidResourceHandle");
  }
  base::MutexLock lock(sh->mu);
  sh->counts.host_seconds += options_.event_query_host_seconds;
  ++sh->counts.event_queries;
  auto e = sh->events.find(eid);
  if (e == sh->events.end()) {
    return absl::FailedPreconditionError("cudaEventQuery: cudaErrorInvalidResourceHandle");
  }
  AdvanceLocked(*sh);
  if (e->second.ops.empty() && e->second.slot != nullptr) {  // recorded by the client
    return SimNowNanoseconds() >= e->second.slot->complete_at_ns.load();
  }
  for (CopyTimingModel::OpId op : e->second.ops) {
    if (sh->failed_ops.count(op) != 0) {
      return absl::FailedPreconditionError(
          "cudaEventQuery: cudaErrorIllegalAddress (700): a copy before this event touched "
          "memory the client had freed meanwhile (simulated GPU: nothing was moved)");
    }
    if (!sh->model.Done(op)) return false;
  }
  return true;
}

void SimCudaApi::MoveBytesLocked(Shard& sh, CopyTimingModel::OpId op, ByteCopy& c) {
  if (c.segment->state.load() != static_cast<uint32_t>(SimSegmentState::kLive) ||
      c.segment->generation.load() != c.generation) {
    c.table->CountViolation(SimViolation::kCopyOnFreed);
    sh.failed_ops.insert(op);
    while (sh.failed_ops.size() > 4096) sh.failed_ops.erase(sh.failed_ops.begin());
    return;
  }
  std::memcpy(c.dst, c.src, c.bytes);
}

void SimCudaApi::AdvanceLocked(Shard& sh) {
  sh.model.AdvanceTo(Now());
  for (auto it = sh.byte_copies.begin(); it != sh.byte_copies.end();) {
    if (!sh.model.Done(it->first)) {
      ++it;
      continue;
    }
    MoveBytesLocked(sh, it->first, it->second);
    it = sh.byte_copies.erase(it);
  }
  for (auto it = sh.pending_records.begin(); it != sh.pending_records.end();) {
    auto e = sh.events.find(it->first);
    double latest = -1;
    bool done = true;
    if (e != sh.events.end()) {
      for (CopyTimingModel::OpId op : e->second.ops) {
        if (!sh.model.Done(op)) done = false;
        latest = std::max(latest, sh.model.CompletionSeconds(op));
      }
    }
    if (!done) {
      ++it;
      continue;
    }
    // (bytes moved above, before the client can see the completion)
    const int64_t at = latest >= 0 ? static_cast<int64_t>(latest * 1e9) : SimNowNanoseconds();
    it->second.second->complete_at_ns.store(at);
    it = sh.pending_records.erase(it);
  }
}

absl::Status SimCudaApi::HostRegister(void* host, uint64_t bytes) {
  base::MutexLock lock(mu_);
  if (host == nullptr || bytes == 0) {
    return absl::FailedPreconditionError("cudaHostRegister: cudaErrorInvalidValue (1)");
  }
  host_registered_[reinterpret_cast<uintptr_t>(host)] = bytes;
  return absl::OkStatus();
}

absl::Status SimCudaApi::HostUnregister(void* host) {
  base::MutexLock lock(mu_);
  if (host_registered_.erase(reinterpret_cast<uintptr_t>(host)) == 0) {
    return absl::FailedPreconditionError(
        "cudaHostUnregister: cudaErrorHostMemoryNotRegistered (713)");
  }
  return absl::OkStatus();
}

std::unique_ptr<CopyEngine> NewSimCudaCopyEngine(SimCudaOptions options,
                                                 CudaEngineOptions engine_options) {
  return std::make_unique<CudaCopyEngine>(std::make_unique<SimCudaApi>(options), engine_options);
}

}  // namespace offloadd::copy
