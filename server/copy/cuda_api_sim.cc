#include "server/copy/cuda_api_sim.h"

#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "server/base/clock.h"
#include "server/copy/cuda_api_forwarding.h"

namespace offloadd::copy {
namespace {

// Simulated device pointers start here (user space on x86-64 ends at 2^47; nothing maps this
// high in practice, and nothing dereferences them anyway).
constexpr uintptr_t kFirstDeviceBase = uintptr_t{0x5100} << 32;
constexpr uintptr_t kBaseAlign = uintptr_t{2} << 20;
constexpr char kSimMemPrefix[] = "cuda-sim-mem";

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
  std::lock_guard<std::mutex> lock(mu_);
  return now_;
}

void ManualSimClock::Advance(double seconds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (seconds > 0) now_ += seconds;
}

std::string SimMemHandle(uint64_t size_bytes, uint64_t id) {
  return PadIpcHandle(absl::StrFormat("%s:%d:%d", kSimMemPrefix, size_bytes, id));
}

SimCudaApi::SimCudaApi(SimCudaOptions options, SimClock* clock)
    : options_(options),
      clock_(clock != nullptr ? clock : SimClock::Real()),
      model_(options.model),
      next_base_(kFirstDeviceBase) {
  for (int i = 0; i < model_.options().gpus; ++i) {
    CudaDeviceInfo d;
    d.ordinal = i;
    d.uuid = DeviceUuid(i);
    d.pci_bus_id = absl::StrFormat("0000:%02x:00.0", 0x10 + i);
    d.name = absl::StrFormat("cuda-sim %.1f GB/s per direction (SIMULATED: no bytes moved)",
                             model_.options().engine_bytes_per_second / 1e9);
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

std::string SimCudaApi::AddAllocation(int ordinal, uint64_t size_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  std::string h = PadIpcHandle(absl::StrFormat("cuda-sim-alloc:%d", next_id_++));
  Allocation& a = allocations_[h];
  a.ordinal = ordinal;
  a.size_bytes = size_bytes;
  return h;
}

ModelEngineStats SimCudaApi::engine_stats(int ordinal, Direction direction) {
  std::lock_guard<std::mutex> lock(mu_);
  model_.AdvanceTo(Now());
  return model_.engine_stats(ordinal, direction);
}

SimCallCounts SimCudaApi::call_counts() {
  std::lock_guard<std::mutex> lock(mu_);
  return counts_;
}

double SimCudaApi::EventCompletionSeconds(void* event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = events_.find(event);
  if (it == events_.end()) return -1;
  model_.AdvanceTo(Now());
  double latest = -1;
  for (CopyTimingModel::OpId op : it->second->ops) {
    if (!model_.Done(op)) return -1;
    latest = std::max(latest, model_.CompletionSeconds(op));
  }
  return latest;
}

int SimCudaApi::CurrentLocked() const {
  auto it = current_.find(std::this_thread::get_id());
  return it == current_.end() ? -1 : it->second;
}

absl::StatusOr<std::vector<CudaDeviceInfo>> SimCudaApi::ListDevices() { return devices_; }

absl::Status SimCudaApi::SetDevice(int ordinal) {
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) {
    return absl::FailedPreconditionError("cudaSetDevice: cudaErrorInvalidDevice (101)");
  }
  std::lock_guard<std::mutex> lock(mu_);
  current_[std::this_thread::get_id()] = ordinal;
  return absl::OkStatus();
}

absl::StatusOr<CudaMemInfo> SimCudaApi::MemGetInfo() {
  std::lock_guard<std::mutex> lock(mu_);
  if (CurrentLocked() < 0) return absl::FailedPreconditionError("cudaMemGetInfo: no device set");
  return CudaMemInfo{options_.device_total_bytes, options_.device_total_bytes};
}

absl::StatusOr<void*> SimCudaApi::CreateStream() {
  std::lock_guard<std::mutex> lock(mu_);
  const int cur = CurrentLocked();
  if (cur < 0) return absl::FailedPreconditionError("cudaStreamCreate: no device set");
  auto s = std::make_unique<Stream>();
  s->ordinal = cur;
  void* p = s.get();
  streams_[p] = std::move(s);
  return p;
}

void SimCudaApi::DestroyStream(void* stream) {
  std::lock_guard<std::mutex> lock(mu_);
  streams_.erase(stream);
}

absl::StatusOr<void*> SimCudaApi::CreateEvent() {
  std::lock_guard<std::mutex> lock(mu_);
  auto e = std::make_unique<Event>();
  void* p = e.get();
  events_[p] = std::move(e);
  return p;
}

void SimCudaApi::DestroyEvent(void* event) {
  std::lock_guard<std::mutex> lock(mu_);
  events_.erase(event);
}

absl::StatusOr<void*> SimCudaApi::IpcOpenMemHandle(absl::string_view handle) {
  std::lock_guard<std::mutex> lock(mu_);
  const int cur = CurrentLocked();
  if (cur < 0) return absl::FailedPreconditionError("cudaIpcOpenMemHandle: no device set");
  std::string key(handle);
  auto it = allocations_.find(key);
  if (it == allocations_.end()) {
    const uint64_t size = SimHandleSize(handle);
    if (size == 0) {
      return absl::FailedPreconditionError(
          "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle (400): not a cuda-sim handle "
          "(clients of a cuda-sim daemon register SimMemHandle(size, id))");
    }
    it = allocations_.emplace(key, Allocation{cur, size, 0}).first;
  }
  Allocation& a = it->second;
  if (a.base != 0) {
    return absl::FailedPreconditionError(
        "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle (400): already open in this "
        "process");
  }
  if (a.ordinal != cur) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cudaIpcOpenMemHandle: cudaErrorInvalidDevice (101): allocation is on device %d, %d is "
        "current",
        a.ordinal, cur));
  }
  a.base = next_base_;
  next_base_ += (a.size_bytes + 2 * kBaseAlign - 1) / kBaseAlign * kBaseAlign;
  mapped_[a.base] = key;
  return reinterpret_cast<void*>(a.base);
}

absl::Status SimCudaApi::IpcCloseMemHandle(void* device_ptr) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = mapped_.find(reinterpret_cast<uintptr_t>(device_ptr));
  if (it == mapped_.end()) {
    return absl::FailedPreconditionError("cudaIpcCloseMemHandle: cudaErrorInvalidValue (1)");
  }
  allocations_[it->second].base = 0;
  mapped_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> SimCudaApi::AllocationSize(void* device_ptr) {
  std::lock_guard<std::mutex> lock(mu_);
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
  return CreateEvent();  // a client's event: complete (clients are not modelled)
}

absl::Status SimCudaApi::StreamWaitEvent(void* stream, void* event) {
  std::lock_guard<std::mutex> lock(mu_);
  auto s = streams_.find(stream);
  auto e = events_.find(event);
  if (s == streams_.end() || e == events_.end()) {
    return absl::FailedPreconditionError("cudaStreamWaitEvent: cudaErrorInvalidResourceHandle");
  }
  for (CopyTimingModel::OpId op : e->second->ops) s->second->waits.push_back(op);
  return absl::OkStatus();
}

absl::Status SimCudaApi::MemcpyAsync(void* dst, const void* src, uint64_t bytes,
                                     Direction direction, void* stream) {
  clock_->SpendHostSeconds(options_.memcpy_host_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  counts_.host_seconds += options_.memcpy_host_seconds;
  auto s = streams_.find(stream);
  if (s == streams_.end()) {
    return absl::FailedPreconditionError("cudaMemcpyAsync: cudaErrorInvalidResourceHandle");
  }
  const void* host = direction == Direction::kDeviceToHost ? dst : src;
  const uintptr_t dev =
      reinterpret_cast<uintptr_t>(direction == Direction::kDeviceToHost ? src : dst);
  auto m = mapped_.upper_bound(dev);
  bool inside = host != nullptr && m != mapped_.begin();
  if (inside) {
    --m;
    const Allocation& a = allocations_[m->second];
    inside = a.ordinal == s->second->ordinal && dev - a.base <= a.size_bytes &&
             bytes <= a.size_bytes - (dev - a.base);
  }
  if (!inside) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "cudaMemcpyAsync: cudaErrorInvalidValue (1): %s copy of %d bytes at device address "
        "%#x is outside every allocation mapped on the stream's device (or host is null)",
        DirectionName(direction), bytes, dev));
  }
  Stream& st = *s->second;
  std::vector<CopyTimingModel::OpId> after = st.waits;
  after.push_back(st.last);
  const int host_node = options_.host_numa_node ? options_.host_numa_node(host) : -1;
  st.last = model_.Enqueue(Now(), st.ordinal, direction, bytes, after, host_node);
  st.waits.clear();
  ++counts_.memcpys;
  counts_.memcpy_bytes += bytes;
  return absl::OkStatus();
}

absl::Status SimCudaApi::EventRecord(void* event, void* stream) {
  clock_->SpendHostSeconds(options_.event_record_host_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  counts_.host_seconds += options_.event_record_host_seconds;
  auto s = streams_.find(stream);
  auto e = events_.find(event);
  if (s == streams_.end() || e == events_.end()) {
    return absl::FailedPreconditionError("cudaEventRecord: cudaErrorInvalidResourceHandle");
  }
  e->second->ops = s->second->waits;
  e->second->ops.push_back(s->second->last);
  ++counts_.event_records;
  return absl::OkStatus();
}

absl::StatusOr<bool> SimCudaApi::EventQuery(void* event) {
  clock_->SpendHostSeconds(options_.event_query_host_seconds);
  std::lock_guard<std::mutex> lock(mu_);
  counts_.host_seconds += options_.event_query_host_seconds;
  ++counts_.event_queries;
  auto e = events_.find(event);
  if (e == events_.end()) {
    return absl::FailedPreconditionError("cudaEventQuery: cudaErrorInvalidResourceHandle");
  }
  model_.AdvanceTo(Now());
  for (CopyTimingModel::OpId op : e->second->ops) {
    if (!model_.Done(op)) return false;
  }
  return true;
}

absl::Status SimCudaApi::HostRegister(void* host, uint64_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (host == nullptr || bytes == 0) {
    return absl::FailedPreconditionError("cudaHostRegister: cudaErrorInvalidValue (1)");
  }
  host_registered_[reinterpret_cast<uintptr_t>(host)] = bytes;
  return absl::OkStatus();
}

absl::Status SimCudaApi::HostUnregister(void* host) {
  std::lock_guard<std::mutex> lock(mu_);
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
