#include "client/sim_client_cuda_api.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstring>
#include <utility>

#include "absl/strings/str_format.h"

namespace offloadd::client {
namespace {

using common::kSimNever;
using common::kSimPending;
using common::SimNowNanoseconds;

constexpr uint64_t kGranuleBytes = 2ull << 20;  // cudaMalloc's granularity for large sizes
constexpr double kLaunchWaitSeconds = 60;

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

}  // namespace

const char* SimCudaErrorName(int error) {
  switch (error) {
    case kSimCudaSuccess: return "cudaSuccess";
    case kSimCudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case kSimCudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case kSimCudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case kSimCudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case kSimCudaErrorNotReady: return "cudaErrorNotReady";
    case kSimCudaErrorLaunchTimeout: return "cudaErrorLaunchTimeout";
    default: return "cudaErrorUnknown";
  }
}

std::string SimDeviceUuid(int ordinal) {
  return absl::StrFormat("GPU-51300000-0000-0000-0000-%012d", ordinal);
}

absl::StatusOr<std::shared_ptr<SimClientGpu>> SimClientGpu::Create(
    const SimClientGpuOptions& options) {
  if (options.devices == 0 || options.device_bytes == 0 || options.event_slots == 0 ||
      options.segment_slots == 0) {
    return absl::InvalidArgumentError(
        "a simulated GPU needs at least one device, device byte, event slot and segment slot");
  }
  const uint32_t pid = options.pid != 0 ? options.pid : static_cast<uint32_t>(getpid());
  const uint64_t device_bytes = AlignUp(options.device_bytes, kGranuleBytes);
  auto table = common::SimGpuTable::Create(pid, options.devices, device_bytes,
                                         options.event_slots, options.segment_slots);
  if (!table.ok()) return table.status();
  std::shared_ptr<SimClientGpu> gpu(new SimClientGpu());
  gpu->table_ = *std::move(table);
  gpu->pid_ = pid;
  gpu->devices_ = options.devices;
  gpu->device_bytes_ = device_bytes;
  base::MutexLock lock(gpu->mu_);
  gpu->free_ranges_.resize(options.devices);
  for (auto& ranges : gpu->free_ranges_) ranges[0] = device_bytes;
  for (uint32_t i = options.segment_slots; i > 0; --i) gpu->free_segment_slots_.push_back(i - 1);
  gpu->generations_.assign(options.segment_slots, 0);
  for (uint32_t d = 0; d < options.devices; ++d) {
    auto s = std::make_unique<Stream>();
    s->device = static_cast<int>(d);
    gpu->streams_.push_back(std::move(s));
  }
  return gpu;
}

SimClientGpu::~SimClientGpu() {
  {
    base::MutexLock lock(mu_);
    closing_ = true;
  }
  cv_.NotifyAll();
  if (resolver_.joinable()) resolver_.join();
}

// ---- errors and devices ----

int SimClientGpu::FailLocked(int error) {
  last_error_[std::this_thread::get_id()] = error;
  return error;
}

int SimClientGpu::InjectedLocked(const char* function) {
  auto it = injected_.find(function);
  if (it == injected_.end()) return kSimCudaSuccess;
  const int error = it->second;
  injected_.erase(it);
  return FailLocked(error);
}

void SimClientGpu::InjectFailure(const std::string& function, int error) {
  base::MutexLock lock(mu_);
  injected_[function] = error;
}

int SimClientGpu::GetLastError() {
  base::MutexLock lock(mu_);
  auto it = last_error_.find(std::this_thread::get_id());
  if (it == last_error_.end()) return kSimCudaSuccess;
  const int error = it->second;
  last_error_.erase(it);
  return error;
}

int SimClientGpu::PeekAtLastError() {
  base::MutexLock lock(mu_);
  auto it = last_error_.find(std::this_thread::get_id());
  return it == last_error_.end() ? kSimCudaSuccess : it->second;
}

int SimClientGpu::CurrentLocked() const {
  auto it = current_.find(std::this_thread::get_id());
  return it == current_.end() ? 0 : it->second;
}

int SimClientGpu::SetDevice(int device) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaSetDevice")) return e;
  if (device < 0 || device >= static_cast<int>(devices_)) {
    return FailLocked(kSimCudaErrorInvalidDevice);
  }
  current_[std::this_thread::get_id()] = device;
  return kSimCudaSuccess;
}

int SimClientGpu::GetDevice(int* device) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaGetDevice")) return e;
  *device = CurrentLocked();
  return kSimCudaSuccess;
}

int SimClientGpu::DeviceUuid(int device, std::string* uuid) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaGetDeviceProperties")) return e;
  if (device < 0 || device >= static_cast<int>(devices_)) {
    return FailLocked(kSimCudaErrorInvalidDevice);
  }
  *uuid = SimDeviceUuid(device);
  return kSimCudaSuccess;
}

// ---- memory ----

uint8_t* SimClientGpu::DeviceBase(uint32_t device) const {
  common::SimSegmentSlot first{};  // offset 0, size 0 of `device`: where its memory starts
  first.device = device;
  return table_->SegmentMemory(first);
}

const SimClientGpu::Segment* SimClientGpu::FindLocked(uint64_t ptr) const {
  auto it = segments_.upper_bound(ptr);
  if (it == segments_.begin()) return nullptr;
  --it;
  return ptr - it->first < it->second.size ? &it->second : nullptr;
}

int SimClientGpu::Malloc(uint64_t* ptr, uint64_t bytes, bool vmm) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked(vmm ? "cuMemCreate" : "cudaMalloc")) return e;
  if (bytes == 0) return FailLocked(kSimCudaErrorInvalidValue);
  const uint32_t device = static_cast<uint32_t>(CurrentLocked());
  const uint64_t size = AlignUp(bytes, kGranuleBytes);
  auto& ranges = free_ranges_[device];
  auto range = std::find_if(ranges.begin(), ranges.end(),
                            [&](const auto& r) { return r.second >= size; });
  if (range == ranges.end() || free_segment_slots_.empty()) {
    return FailLocked(kSimCudaErrorMemoryAllocation);
  }
  const uint64_t offset = range->first, left = range->second - size;
  ranges.erase(range);
  if (left > 0) ranges[offset + size] = left;
  Segment seg;
  seg.slot = free_segment_slots_.back();
  free_segment_slots_.pop_back();
  seg.device = device;
  seg.offset = offset;
  seg.size = size;
  seg.buffer_id = next_buffer_id_++;
  seg.generation = ++generations_[seg.slot];
  seg.vmm = vmm;
  common::SimSegmentSlot& slot = *table_->segment(seg.slot);
  slot.device = device;
  slot.offset = offset;
  slot.size = size;
  slot.flags = vmm ? common::kSimSegmentVmm : 0;
  slot.buffer_id = seg.buffer_id;
  slot.generation.store(seg.generation);
  slot.state.store(static_cast<uint32_t>(common::SimSegmentState::kLive));  // last: it is usable
  *ptr = reinterpret_cast<uint64_t>(DeviceBase(device) + offset);
  segments_[*ptr] = seg;
  return kSimCudaSuccess;
}

int SimClientGpu::Free(uint64_t ptr) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaFree")) return e;
  auto it = segments_.find(ptr);
  if (it == segments_.end()) return FailLocked(kSimCudaErrorInvalidValue);
  const Segment seg = it->second;
  segments_.erase(it);
  common::SimSegmentSlot& slot = *table_->segment(seg.slot);
  if (slot.daemon_maps.load() > 0) table_->CountViolation(common::SimViolation::kFreedWhileMapped);
  slot.state.store(static_cast<uint32_t>(common::SimSegmentState::kFreed));
  free_segment_slots_.push_front(seg.slot);  // reused last: a stale handle stays detectable
  auto& ranges = free_ranges_[seg.device];
  auto next = ranges.emplace(seg.offset, seg.size).first;  // merged with free neighbours
  auto after = std::next(next);
  if (after != ranges.end() && next->first + next->second == after->first) {
    next->second += after->second;
    ranges.erase(after);
  }
  if (next != ranges.begin()) {
    auto before = std::prev(next);
    if (before->first + before->second == next->first) {
      before->second += next->second;
      ranges.erase(next);
    }
  }
  return kSimCudaSuccess;
}

bool SimClientGpu::PointerGetInfo(uint64_t ptr, PointerInfo* info) {
  base::MutexLock lock(mu_);
  const Segment* seg = FindLocked(ptr);
  if (seg == nullptr) return false;
  info->base = reinterpret_cast<uint64_t>(DeviceBase(seg->device) + seg->offset);
  info->size_bytes = seg->size;
  info->buffer_id = seg->buffer_id;
  info->device = static_cast<int>(seg->device);
  info->legacy_ipc_capable = !seg->vmm;
  return true;
}

int SimClientGpu::IpcGetMemHandle(uint64_t base, std::string* handle) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaIpcGetMemHandle")) return e;
  const Segment* seg = FindLocked(base);
  if (seg == nullptr || seg->vmm) return FailLocked(kSimCudaErrorInvalidValue);
  *handle = common::MakeSimMemHandle({pid_, seg->slot, seg->generation, table_->instance()});
  return kSimCudaSuccess;
}

uint32_t SimClientGpu::DaemonMaps(uint64_t base) {
  base::MutexLock lock(mu_);
  const Segment* seg = FindLocked(base);
  return seg == nullptr ? 0 : table_->segment(seg->slot)->daemon_maps.load();
}

// ---- streams and events ----

SimClientGpu::Stream* SimClientGpu::StreamLocked(void* stream) {
  if (stream == nullptr) return streams_[CurrentLocked()].get();
  for (auto& s : streams_) {
    if (s.get() == stream) return s.get();
  }
  return nullptr;
}

SimClientGpu::Event* SimClientGpu::EventLocked(void* event) {
  for (auto& e : events_) {
    if (e.get() == event) return e.get();
  }
  return nullptr;
}

int SimClientGpu::StreamCreate(void** stream) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaStreamCreate")) return e;
  auto s = std::make_unique<Stream>();
  s->device = CurrentLocked();
  *stream = s.get();
  streams_.push_back(std::move(s));
  return kSimCudaSuccess;
}

int SimClientGpu::EventCreateIpc(void** event) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaEventCreateWithFlags")) return e;
  uint32_t slot;
  if (!free_event_slots_.empty()) {
    slot = free_event_slots_.back();
    free_event_slots_.pop_back();
  } else if (next_event_slot_ < table_->header().event_slots) {
    slot = next_event_slot_++;
  } else {
    return FailLocked(kSimCudaErrorMemoryAllocation);
  }
  common::SimEventSlot& s = *table_->event(slot);
  s.device = static_cast<uint32_t>(CurrentLocked());
  s.in_use = 1;
  s.complete_at_ns.store(kSimNever);  // a new event: never recorded (seq keeps counting)
  auto e = std::make_unique<Event>();
  e->slot = slot;
  e->device = CurrentLocked();
  *event = e.get();
  events_.push_back(std::move(e));
  return kSimCudaSuccess;
}

int SimClientGpu::EventDestroy(void* event) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaEventDestroy")) return e;
  auto it = std::find_if(events_.begin(), events_.end(),
                         [&](const auto& e) { return e.get() == event; });
  if (it == events_.end()) return FailLocked(kSimCudaErrorInvalidResourceHandle);
  table_->event((*it)->slot)->in_use = 0;
  free_event_slots_.push_back((*it)->slot);
  events_.erase(it);
  return kSimCudaSuccess;
}

int SimClientGpu::IpcGetEventHandle(void* event, std::string* handle) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaIpcGetEventHandle")) return e;
  Event* ev = EventLocked(event);
  if (ev == nullptr) return FailLocked(kSimCudaErrorInvalidResourceHandle);
  *handle = common::MakeSimEventHandle({pid_, ev->slot, table_->instance()});
  return kSimCudaSuccess;
}

int64_t SimClientGpu::WaitResolvedLocked(const Wait& w) const {
  const common::SimEventSlot& slot = *table_->event(w.slot);
  // Recorded again since the wait: the record it captured is over (its time is unknown here).
  if (slot.seq.load() != w.seq) return 0;
  return slot.complete_at_ns.load();
}

bool SimClientGpu::ResolveLocked(Stream& s) {
  if (s.waits.empty()) return true;
  int64_t latest = 0;
  for (const Wait& w : s.waits) {
    const int64_t at = WaitResolvedLocked(w);
    if (at == kSimPending) return false;
    latest = std::max(latest, at);
  }
  s.tail_ns = std::max(s.tail_ns, latest) + s.after_waits_ns;
  s.waits.clear();
  s.after_waits_ns = 0;
  return true;
}

void SimClientGpu::RecordEventLocked(uint32_t slot, int64_t complete_at_ns) {
  common::SimEventSlot& e = *table_->event(slot);
  e.complete_at_ns.store(complete_at_ns);  // the time first, then the sequence number
  e.seq.fetch_add(1);
}

int SimClientGpu::LaunchKernel(void* stream, double seconds) {
  base::MutexLock lock(mu_);
  Stream* s = StreamLocked(stream);
  if (s == nullptr) return FailLocked(kSimCudaErrorInvalidResourceHandle);
  if (seconds < 0) return FailLocked(kSimCudaErrorInvalidValue);
  const int64_t ns = static_cast<int64_t>(seconds * 1e9);
  if (ResolveLocked(*s)) {
    s->tail_ns = std::max(s->tail_ns, SimNowNanoseconds()) + ns;
  } else {
    s->after_waits_ns += ns;
  }
  return kSimCudaSuccess;
}

int SimClientGpu::LaunchWrite(void* stream, double seconds, uint64_t ptr, std::string bytes) {
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration<double>(kLaunchWaitSeconds);
  base::MutexLock lock(mu_);
  Stream* s = StreamLocked(stream);
  if (s == nullptr) return FailLocked(kSimCudaErrorInvalidResourceHandle);
  const Segment* seg = FindLocked(ptr);
  if (seconds < 0 || seg == nullptr || bytes.empty() ||
      bytes.size() > seg->size - (ptr - reinterpret_cast<uint64_t>(DeviceBase(seg->device) +
                                                                   seg->offset))) {
    return FailLocked(kSimCudaErrorInvalidValue);
  }
  const uint64_t buffer_id = seg->buffer_id;
  while (!ResolveLocked(*s)) {  // the modelled GPU does not queue behind a pending event
    if (std::chrono::steady_clock::now() > deadline) {
      return FailLocked(kSimCudaErrorLaunchTimeout);
    }
    cv_.WaitForSeconds(mu_, 50e-6);
  }
  const int64_t end =
      std::max(s->tail_ns, SimNowNanoseconds()) + static_cast<int64_t>(seconds * 1e9);
  const uint64_t id = next_write_++;
  writes_[id] = PendingWrite{ptr, std::move(bytes), end, buffer_id};
  s->tail_ns = end;
  s->last_write = id;
  StartResolverLocked();
  cv_.NotifyAll();
  return kSimCudaSuccess;
}

int SimClientGpu::EventRecord(void* event, void* stream) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaEventRecord")) return e;
  Stream* s = StreamLocked(stream);
  Event* ev = EventLocked(event);
  if (s == nullptr || ev == nullptr) return FailLocked(kSimCudaErrorInvalidResourceHandle);
  bool records_pending = false;
  ProgressLocked(&records_pending);
  const bool resolved = ResolveLocked(*s);
  const bool write_pending = writes_.count(s->last_write) != 0;
  if (resolved && !write_pending) {
    RecordEventLocked(ev->slot, std::max(s->tail_ns, SimNowNanoseconds()));
    return kSimCudaSuccess;
  }
  RecordEventLocked(ev->slot, kSimPending);  // completed by the resolver thread
  DeferredRecord d;
  d.slot = ev->slot;
  d.seq = table_->event(ev->slot)->seq.load();
  d.waits = s->waits;
  d.write = write_pending ? s->last_write : 0;
  d.tail_ns = s->tail_ns;
  d.after_waits_ns = s->after_waits_ns;
  deferred_.push_back(std::move(d));
  StartResolverLocked();
  cv_.NotifyAll();
  return kSimCudaSuccess;
}

int SimClientGpu::EventQuery(void* event) {
  base::MutexLock lock(mu_);
  Event* ev = EventLocked(event);
  if (ev == nullptr) return FailLocked(kSimCudaErrorInvalidResourceHandle);
  bool records_pending = false;
  ProgressLocked(&records_pending);
  const int64_t at = table_->event(ev->slot)->complete_at_ns.load();
  if (at == kSimNever) return kSimCudaSuccess;  // never recorded: nothing to wait for
  return at != kSimPending && SimNowNanoseconds() >= at ? kSimCudaSuccess
                                                        : kSimCudaErrorNotReady;
}

int SimClientGpu::StreamWaitEvent(void* stream, void* event) {
  base::MutexLock lock(mu_);
  if (int e = InjectedLocked("cudaStreamWaitEvent")) return e;
  Stream* s = StreamLocked(stream);
  Event* ev = EventLocked(event);
  if (s == nullptr || ev == nullptr) return FailLocked(kSimCudaErrorInvalidResourceHandle);
  const common::SimEventSlot& slot = *table_->event(ev->slot);
  const uint64_t seq = slot.seq.load();
  for (const ReloadNote& n : notes_) {
    if (n.slot == ev->slot && seq <= n.seq_at_send) {
      // The daemon has not recorded it yet: CUDA would capture the older record (or none).
      table_->CountViolation(common::SimViolation::kWaitUnrecorded);
      return kSimCudaSuccess;
    }
  }
  if (slot.complete_at_ns.load() == kSimNever) return kSimCudaSuccess;  // orders nothing
  s->waits.push_back(Wait{ev->slot, seq});
  ResolveLocked(*s);
  return kSimCudaSuccess;
}

absl::Status SimClientGpu::StreamSynchronize(void* stream, double timeout_seconds) {
  const int64_t deadline =
      SimNowNanoseconds() + static_cast<int64_t>(timeout_seconds * 1e9);
  while (true) {
    bool done = false;
    int64_t tail = 0;
    {
      base::MutexLock lock(mu_);
      Stream* s = StreamLocked(stream);
      if (s == nullptr) {
        return absl::InvalidArgumentError("StreamSynchronize: not a stream of this simulated GPU");
      }
      bool records_pending = false;
      ProgressLocked(&records_pending);
      done = ResolveLocked(*s) && writes_.count(s->last_write) == 0;
      tail = s->tail_ns;
    }
    const int64_t now = SimNowNanoseconds();
    if (done && now >= tail) return absl::OkStatus();
    if (now > deadline) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "simulated stream did not finish within %.0f s: an event it waits on was never "
          "completed (the daemon never wrote its completion time)",
          timeout_seconds));
    }
    const int64_t sleep_ns = done ? std::clamp<int64_t>(tail - now, 20'000, 1'000'000) : 50'000;
    std::this_thread::sleep_for(std::chrono::nanoseconds(sleep_ns));
  }
}

absl::Status SimClientGpu::ReadOnStream(void* stream, uint64_t ptr, uint64_t bytes,
                                        std::string* out) {
  absl::Status st = StreamSynchronize(stream);
  if (!st.ok()) return st;
  base::MutexLock lock(mu_);
  const Segment* seg = FindLocked(ptr);
  const uint64_t base =
      seg == nullptr ? 0 : reinterpret_cast<uint64_t>(DeviceBase(seg->device) + seg->offset);
  if (seg == nullptr || bytes > seg->size - (ptr - base)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "ReadOnStream: [%#x, +%d) is not inside one live segment of this simulated GPU", ptr,
        bytes));
  }
  const int64_t now = SimNowNanoseconds();
  std::vector<ReloadNote> left;
  for (const ReloadNote& n : notes_) {
    const common::SimEventSlot& slot = *table_->event(n.slot);
    const int64_t at = slot.complete_at_ns.load();
    const bool complete = slot.seq.load() > n.seq_at_send && at != kSimPending && now >= at;
    if (!complete && ptr < n.dst + n.bytes && n.dst < ptr + bytes) {
      table_->CountViolation(common::SimViolation::kConsumedEarly);
    }
    if (!complete) left.push_back(n);
  }
  notes_ = std::move(left);
  out->assign(reinterpret_cast<const char*>(ptr), bytes);
  return absl::OkStatus();
}

void SimClientGpu::NoteReloadSent(void* done_event, uint64_t dst, uint64_t bytes) {
  base::MutexLock lock(mu_);
  Event* ev = EventLocked(done_event);
  if (ev == nullptr) return;
  notes_.push_back(ReloadNote{ev->slot, table_->event(ev->slot)->seq.load(), dst, bytes});
}

int64_t SimClientGpu::StreamTailNanoseconds(void* stream) {
  base::MutexLock lock(mu_);
  Stream* s = StreamLocked(stream);
  if (s == nullptr) return 0;
  ResolveLocked(*s);
  return s->tail_ns;
}

int64_t SimClientGpu::EventCompleteAtNanoseconds(void* event) {
  base::MutexLock lock(mu_);
  Event* ev = EventLocked(event);
  return ev == nullptr ? kSimNever : table_->event(ev->slot)->complete_at_ns.load();
}

uint64_t SimClientGpu::EventSeq(void* event) {
  base::MutexLock lock(mu_);
  Event* ev = EventLocked(event);
  return ev == nullptr ? 0 : table_->event(ev->slot)->seq.load();
}

// ---- the resolver: writes landing, records behind pending work ----

int64_t SimClientGpu::ProgressLocked(bool* records_pending) {
  const int64_t now = SimNowNanoseconds();
  int64_t earliest = INT64_MAX;
  for (auto it = writes_.begin(); it != writes_.end();) {
    if (it->second.end_ns > now) {
      earliest = std::min(earliest, it->second.end_ns);
      ++it;
      continue;
    }
    const Segment* seg = FindLocked(it->second.ptr);
    if (seg != nullptr && seg->buffer_id == it->second.buffer_id) {  // else freed: lands nowhere
      std::memcpy(reinterpret_cast<void*>(it->second.ptr), it->second.bytes.data(),
                  it->second.bytes.size());
    }
    it = writes_.erase(it);
  }
  std::vector<DeferredRecord> left;
  for (DeferredRecord& d : deferred_) {
    common::SimEventSlot& slot = *table_->event(d.slot);
    if (slot.seq.load() != d.seq) continue;  // recorded again since: this record is over
    bool ready = d.write == 0 || writes_.count(d.write) == 0;
    int64_t latest = d.tail_ns;
    for (const Wait& w : d.waits) {
      const int64_t at = WaitResolvedLocked(w);
      ready = ready && at != kSimPending;
      latest = std::max(latest, at);
    }
    if (!ready) {
      left.push_back(std::move(d));
      continue;
    }
    slot.complete_at_ns.store(latest + d.after_waits_ns);  // (the record's seq is already out)
  }
  deferred_ = std::move(left);
  *records_pending = !deferred_.empty();
  return earliest;
}

void SimClientGpu::StartResolverLocked() {
  if (!resolver_.joinable()) resolver_ = std::thread([this] { ResolverLoop(); });
}

void SimClientGpu::ResolverLoop() {
  base::MutexLock lock(mu_);
  while (!closing_) {
    bool records_pending = false;
    const int64_t earliest = ProgressLocked(&records_pending);
    double sleep_seconds = 1.0;  // nothing pending: until a launch or a record wakes it
    if (earliest != INT64_MAX) {
      sleep_seconds = std::max(0.0, (earliest - SimNowNanoseconds()) / 1e9);
    }
    if (records_pending) sleep_seconds = std::min(sleep_seconds, 50e-6);  // the daemon's events
    cv_.WaitForSeconds(mu_, sleep_seconds);
  }
}

// ---- the ClientCudaApi ----

namespace {

class SimClientCudaApi : public ClientCudaApi {
 public:
  explicit SimClientCudaApi(std::shared_ptr<SimClientGpu> gpu) : gpu_(std::move(gpu)) {}

  absl::StatusOr<PointerInfo> Describe(uint64_t ptr) override {
    PointerInfo info;
    if (!gpu_->PointerGetInfo(ptr, &info)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "0x%x is not device memory known to CUDA in this process: export tensors on a GPU",
          ptr));
    }
    return info;
  }
  absl::StatusOr<std::string> DeviceUuid(int device) override {
    std::string uuid;
    absl::Status st = Err("cudaGetDeviceProperties", gpu_->DeviceUuid(device, &uuid));
    if (!st.ok()) return st;
    return uuid;
  }
  absl::StatusOr<std::string> IpcGetMemHandle(uint64_t base) override {
    std::string h;
    absl::Status st = Err("cudaIpcGetMemHandle", gpu_->IpcGetMemHandle(base, &h));
    if (!st.ok()) return st;
    return h;
  }
  absl::StatusOr<int> CurrentDevice() override {
    int d = -1;
    absl::Status st = Err("cudaGetDevice", gpu_->GetDevice(&d));
    if (!st.ok()) return st;
    return d;
  }
  absl::StatusOr<void*> CreateIpcEvent() override {
    void* e = nullptr;
    absl::Status st = Err("cudaEventCreateWithFlags", gpu_->EventCreateIpc(&e));
    if (!st.ok()) return st;
    return e;
  }
  absl::StatusOr<std::string> IpcGetEventHandle(void* event) override {
    std::string h;
    absl::Status st = Err("cudaIpcGetEventHandle", gpu_->IpcGetEventHandle(event, &h));
    if (!st.ok()) return st;
    return h;
  }
  absl::Status EventRecord(void* event, void* stream) override {
    return Err("cudaEventRecord", gpu_->EventRecord(event, stream));
  }
  absl::Status StreamWaitEvent(void* stream, void* event) override {
    return Err("cudaStreamWaitEvent", gpu_->StreamWaitEvent(stream, event));
  }
  void DestroyEvent(void* event) override {
    if (gpu_->EventDestroy(event) != kSimCudaSuccess) (void)gpu_->GetLastError();
  }

 private:
  // As the real api's Err(): clears the thread's last error after a failure.
  absl::Status Err(const char* function, int error) {
    if (error == kSimCudaSuccess) return absl::OkStatus();
    (void)gpu_->GetLastError();
    return absl::FailedPreconditionError(
        absl::StrFormat("%s: %s (%d) (simulated GPU)", function, SimCudaErrorName(error), error));
  }

  std::shared_ptr<SimClientGpu> gpu_;
};

}  // namespace

std::unique_ptr<ClientCudaApi> NewSimClientCudaApi(std::shared_ptr<SimClientGpu> gpu) {
  return std::make_unique<SimClientCudaApi>(std::move(gpu));
}

}  // namespace offloadd::client
