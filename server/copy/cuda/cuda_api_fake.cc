#include "server/copy/cuda/cuda_api_fake.h"

#include <cstring>

#include "absl/strings/str_format.h"
#include "common/base/mutex.h"
#include "server/copy/cuda/cuda_api_forwarding.h"

namespace offloadd::copy {
namespace {

std::string MakeHandle(const char* kind, uint64_t id) {
  return PadIpcHandle(absl::StrFormat("%s-%d", kind, id));
}

std::string Printable(absl::string_view handle) {
  std::string s(handle.substr(0, 16));
  s.erase(s.find_last_not_of('\0') + 1);
  return s;
}

}  // namespace

std::unique_ptr<CudaApi> FakeCudaApi::Borrow() {
  return std::make_unique<ForwardingCudaApi>(this);
}

std::string FakeCudaApi::Name(void* object) const {
  auto it = objects_.find(object);
  if (it == objects_.end()) return "?";
  return absl::StrFormat("%s%d", it->second->is_event ? "e" : "s", it->second->id);
}

FakeCudaApi::FakeCudaApi(std::vector<CudaDeviceInfo> devices) : devices_(std::move(devices)) {
  for (size_t i = 0; i < devices_.size(); ++i) devices_[i].ordinal = static_cast<int>(i);
}

FakeCudaApi::~FakeCudaApi() = default;

std::string FakeCudaApi::AddAllocation(int ordinal, uint64_t size_bytes) {
  base::MutexLock lock(mu_);
  std::string h = MakeHandle("mem", next_id_++);
  Allocation& a = allocations_[h];
  a.ordinal = ordinal;
  a.data.assign(size_bytes, 0);
  return h;
}

uint8_t* FakeCudaApi::allocation_data(const std::string& handle) {
  base::MutexLock lock(mu_);
  auto it = allocations_.find(handle);
  return it == allocations_.end() ? nullptr : it->second.data.data();
}

std::string FakeCudaApi::AddIpcEvent(int ordinal) {
  base::MutexLock lock(mu_);
  std::string h = MakeHandle("event", next_id_++);
  h[kIpcHandleBytes - 1] = static_cast<char>(ordinal);
  ipc_events_.insert(h);
  return h;
}

void FakeCudaApi::FailNext(const std::string& function, absl::Status status, int after) {
  base::MutexLock lock(mu_);
  fail_next_[function] = Failure{std::move(status), after};
}

absl::Status FakeCudaApi::TakeFailure(const std::string& name) {
  auto it = fail_next_.find(name);
  if (it == fail_next_.end()) return absl::OkStatus();
  if (it->second.after > 0) {
    --it->second.after;
    return absl::OkStatus();
  }
  absl::Status st = std::move(it->second.status);
  fail_next_.erase(it);
  return st;
}

void FakeCudaApi::HoldCompletions(bool hold) {
  base::MutexLock lock(mu_);
  hold_ = hold;
  if (!hold) {
    for (auto& [p, o] : objects_) o->held = false;
  }
}

void FakeCudaApi::WaitForMemcpys(int n) {
  base::MutexLock lock(mu_);
  while (memcpys_ < n) cv_.Wait(mu_);
}

std::vector<FakeCudaApi::Call> FakeCudaApi::calls() const {
  base::MutexLock lock(mu_);
  return calls_;
}

std::vector<std::string> FakeCudaApi::call_names() const {
  base::MutexLock lock(mu_);
  std::vector<std::string> names;
  for (const Call& c : calls_) names.push_back(c.name);
  return names;
}

int FakeCudaApi::count(const std::string& function) const {
  base::MutexLock lock(mu_);
  int n = 0;
  for (const Call& c : calls_) n += c.name == function;
  return n;
}

int FakeCudaApi::wrong_device_calls() const {
  base::MutexLock lock(mu_);
  return wrong_device_calls_;
}

int FakeCudaApi::open_mappings() const {
  base::MutexLock lock(mu_);
  return static_cast<int>(mapped_.size());
}

int FakeCudaApi::live_streams() const {
  base::MutexLock lock(mu_);
  int n = 0;
  for (const auto& [p, o] : objects_) n += !o->is_event;
  return n;
}

int FakeCudaApi::live_events() const {
  base::MutexLock lock(mu_);
  int n = 0;
  for (const auto& [p, o] : objects_) n += o->is_event;
  return n;
}

int FakeCudaApi::contexts_created() const {
  base::MutexLock lock(mu_);
  return static_cast<int>(contexts_.size());
}

std::set<std::thread::id> FakeCudaApi::threads_for_device(int ordinal) const {
  base::MutexLock lock(mu_);
  std::set<std::thread::id> ids;
  for (const Call& c : calls_) {
    if (c.current_device == ordinal && c.name != "ListDevices") ids.insert(c.thread);
  }
  return ids;
}

int FakeCudaApi::split_registration_copies() const {
  base::MutexLock lock(mu_);
  return split_registration_copies_;
}

uint64_t FakeCudaApi::registered_host_bytes() const {
  base::MutexLock lock(mu_);
  uint64_t n = 0;
  for (const auto& [p, b] : host_registered_) n += b;
  return n;
}

int FakeCudaApi::Current() const {
  auto it = current_.find(std::this_thread::get_id());
  return it == current_.end() ? -1 : it->second;
}

absl::Status FakeCudaApi::Enter(const std::string& name, int object_ordinal,
                                const std::string& detail) {
  int cur = Current();
  calls_.push_back(Call{name, std::this_thread::get_id(), cur, detail});
  if (name != "ListDevices" && name != "SetDevice") {
    if (cur < 0 || (object_ordinal >= 0 && object_ordinal != cur)) ++wrong_device_calls_;
  }
  return TakeFailure(name);
}

absl::StatusOr<std::vector<CudaDeviceInfo>> FakeCudaApi::ListDevices() {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("ListDevices", -1, "");
  if (!st.ok()) return st;
  return devices_;
}

absl::Status FakeCudaApi::SetDevice(int ordinal) {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("SetDevice", -1, absl::StrFormat("%d", ordinal));
  if (!st.ok()) return st;
  if (ordinal < 0 || ordinal >= static_cast<int>(devices_.size())) {
    return absl::FailedPreconditionError("cudaSetDevice: cudaErrorInvalidDevice (101)");
  }
  current_[std::this_thread::get_id()] = ordinal;
  contexts_.insert(ordinal);
  return absl::OkStatus();
}

absl::StatusOr<CudaMemInfo> FakeCudaApi::MemGetInfo() {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("MemGetInfo", -1, "");
  if (!st.ok()) return st;
  int cur = Current();
  if (cur < 0) return absl::FailedPreconditionError("cudaMemGetInfo: no current device");
  return CudaMemInfo{devices_[cur].total_bytes / 2, devices_[cur].total_bytes};
}

absl::StatusOr<void*> FakeCudaApi::CreateStream() {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("CreateStream", -1, "");
  if (!st.ok()) return st;
  auto o = std::make_unique<Object>(Object{Current(), false, false, next_id_++});
  void* p = o.get();
  objects_[p] = std::move(o);
  return p;
}

void FakeCudaApi::DestroyStream(void* stream) {
  base::MutexLock lock(mu_);
  auto it = objects_.find(stream);
  (void)Enter("DestroyStream", it == objects_.end() ? -1 : it->second->ordinal, "");
  if (it != objects_.end()) objects_.erase(it);
}

absl::StatusOr<void*> FakeCudaApi::NewEvent(const char* call, bool timing) {
  absl::Status st = Enter(call, -1, "");
  if (!st.ok()) return st;
  auto o = std::make_unique<Object>(Object{Current(), true, false, next_id_++});
  o->timing = timing;
  void* p = o.get();
  objects_[p] = std::move(o);
  return p;
}

absl::StatusOr<void*> FakeCudaApi::CreateEvent() {
  base::MutexLock lock(mu_);
  return NewEvent("CreateEvent", false);
}

absl::StatusOr<void*> FakeCudaApi::CreateTimingEvent() {
  base::MutexLock lock(mu_);
  return NewEvent("CreateTimingEvent", true);
}

absl::StatusOr<double> FakeCudaApi::EventElapsedSeconds(void* start, void* end) {
  base::MutexLock lock(mu_);
  auto a = objects_.find(start);
  auto b = objects_.find(end);
  absl::Status st =
      Enter("EventElapsedSeconds", a == objects_.end() ? -1 : a->second->ordinal, "");
  if (!st.ok()) return st;
  if (a == objects_.end() || b == objects_.end() || !a->second->timing || !b->second->timing) {
    return absl::FailedPreconditionError(
        "cudaEventElapsedTime: cudaErrorInvalidResourceHandle (400): not timing events");
  }
  if (a->second->held || b->second->held) {
    return absl::FailedPreconditionError("cudaEventElapsedTime: cudaErrorNotReady (600)");
  }
  return b->second->seconds - a->second->seconds;
}

void FakeCudaApi::SetCopyBytesPerSecond(double bytes_per_second) {
  base::MutexLock lock(mu_);
  if (bytes_per_second > 0) copy_bytes_per_second_ = bytes_per_second;
}

int FakeCudaApi::live_device_allocations() const {
  base::MutexLock lock(mu_);
  return static_cast<int>(device_malloced_.size());
}

absl::StatusOr<void*> FakeCudaApi::DeviceMalloc(uint64_t bytes) {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("DeviceMalloc", -1, absl::StrFormat("%d", bytes));
  if (!st.ok()) return st;
  const int cur = Current();
  if (cur < 0 || bytes == 0) {
    return absl::FailedPreconditionError("cudaMalloc: cudaErrorInvalidValue (1)");
  }
  const std::string h = MakeHandle("malloc", next_id_++);
  Allocation& a = allocations_[h];
  a.ordinal = cur;
  a.data.assign(bytes, 0);
  void* p = a.data.data();
  mapped_[p] = h;
  device_malloced_.insert(p);
  return p;
}

absl::Status FakeCudaApi::DeviceFree(void* device_ptr) {
  base::MutexLock lock(mu_);
  auto it = mapped_.find(device_ptr);
  absl::Status st =
      Enter("DeviceFree", it == mapped_.end() ? -1 : allocations_[it->second].ordinal, "");
  if (!st.ok()) return st;
  if (it == mapped_.end() || device_malloced_.erase(device_ptr) == 0) {
    return absl::FailedPreconditionError("cudaFree: cudaErrorInvalidDevicePointer (17)");
  }
  allocations_.erase(it->second);
  mapped_.erase(it);
  return absl::OkStatus();
}

void FakeCudaApi::DestroyEvent(void* event) {
  base::MutexLock lock(mu_);
  auto it = objects_.find(event);
  (void)Enter("DestroyEvent", it == objects_.end() ? -1 : it->second->ordinal, "");
  if (it != objects_.end()) objects_.erase(it);
}

absl::StatusOr<void*> FakeCudaApi::IpcOpenMemHandle(absl::string_view handle) {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("IpcOpenMemHandle", -1, Printable(handle));
  if (!st.ok()) return st;
  auto it = allocations_.find(std::string(handle));
  if (handle.size() != kIpcHandleBytes || it == allocations_.end()) {
    return absl::FailedPreconditionError(
        "cudaIpcOpenMemHandle: cudaErrorInvalidResourceHandle (400): invalid resource handle");
  }
  // Memory of another device is mapped through peer access; the fake allows it.
  void* p = it->second.data.data();
  if (it->second.opens++ == 0) mapped_[p] = it->first;
  return p;
}

absl::Status FakeCudaApi::IpcCloseMemHandle(void* device_ptr) {
  base::MutexLock lock(mu_);
  auto it = mapped_.find(device_ptr);
  absl::Status st = Enter("IpcCloseMemHandle",
                          it == mapped_.end() ? -1 : allocations_[it->second].ordinal, "");
  if (!st.ok()) return st;
  if (it == mapped_.end()) {
    return absl::FailedPreconditionError("cudaIpcCloseMemHandle: cudaErrorInvalidValue (1)");
  }
  if (--allocations_[it->second].opens == 0) mapped_.erase(it);
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> FakeCudaApi::AllocationSize(void* device_ptr) {
  base::MutexLock lock(mu_);
  auto it = mapped_.find(device_ptr);
  absl::Status st = Enter("AllocationSize",
                          it == mapped_.end() ? -1 : allocations_[it->second].ordinal, "");
  if (!st.ok()) return st;
  if (it == mapped_.end()) {
    return absl::FailedPreconditionError("cuMemGetAddressRange: CUDA_ERROR_NOT_FOUND (500)");
  }
  return allocations_[it->second].data.size();
}

absl::StatusOr<void*> FakeCudaApi::IpcOpenEventHandle(absl::string_view handle) {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("IpcOpenEventHandle", -1, Printable(handle));
  if (!st.ok()) return st;
  if (ipc_events_.count(std::string(handle)) == 0) {
    return absl::FailedPreconditionError(
        "cudaIpcOpenEventHandle: cudaErrorInvalidResourceHandle (400): invalid resource handle");
  }
  auto o = std::make_unique<Object>(Object{Current(), true, false, next_id_++, std::string(handle)});
  void* p = o.get();
  objects_[p] = std::move(o);
  return p;
}

void FakeCudaApi::SetIpcEventPending(const std::string& handle, bool pending) {
  base::MutexLock lock(mu_);
  if (pending) {
    pending_ipc_events_.insert(handle);
  } else {
    pending_ipc_events_.erase(handle);
  }
}

absl::Status FakeCudaApi::StreamWaitEvent(void* stream, void* event) {
  base::MutexLock lock(mu_);
  auto s = objects_.find(stream);
  absl::Status st = Enter("StreamWaitEvent", s == objects_.end() ? -1 : s->second->ordinal,
                          Name(stream) + " " + Name(event));
  if (!st.ok()) return st;
  if (s == objects_.end() || objects_.count(event) == 0) {
    return absl::FailedPreconditionError("cudaStreamWaitEvent: cudaErrorInvalidResourceHandle");
  }
  return absl::OkStatus();
}

absl::Status FakeCudaApi::MemcpyAsync(void* dst, const void* src, uint64_t bytes,
                                      Direction direction, void* stream) {
  base::MutexLock lock(mu_);
  auto s = objects_.find(stream);
  absl::Status st = Enter("MemcpyAsync", s == objects_.end() ? -1 : s->second->ordinal,
                          absl::StrFormat("%s %s %d", Name(stream), DirectionName(direction), bytes));
  if (!st.ok()) return st;
  if (s == objects_.end() || s->second->is_event) {
    return absl::FailedPreconditionError("cudaMemcpyAsync: cudaErrorInvalidResourceHandle");
  }
  // The device side must lie inside one mapped allocation.
  const uint8_t* dev = static_cast<const uint8_t*>(direction == Direction::kDeviceToHost ? src : dst);
  bool inside = false;
  for (const auto& [p, h] : mapped_) {
    const uint8_t* base = static_cast<const uint8_t*>(p);
    uint64_t size = allocations_[h].data.size();
    if (dev >= base && dev <= base + size && bytes <= size - (dev - base)) inside = true;
  }
  if (!inside) {
    return absl::FailedPreconditionError(
        "cudaMemcpyAsync: cudaErrorInvalidValue (1): device range outside every mapping");
  }
  // As the driver does (seen on an H200): a host range that overlaps cudaHostRegister'ed
  // memory must lie inside one registration, else cudaErrorInvalidValue.
  const uint8_t* host = static_cast<const uint8_t*>(direction == Direction::kDeviceToHost ? dst : src);
  for (const auto& [p, size] : host_registered_) {
    const uint8_t* base = static_cast<const uint8_t*>(p);
    const bool overlaps = host < base + size && base < host + bytes;
    if (overlaps && (host < base || host + bytes > base + size)) {
      ++split_registration_copies_;
      return absl::FailedPreconditionError(
          "cudaMemcpyAsync: cudaErrorInvalidValue (1): host range spans two host registrations");
    }
  }
  std::memcpy(dst, src, bytes);
  s->second->seconds += static_cast<double>(bytes) / copy_bytes_per_second_;
  ++memcpys_;
  cv_.notify_all();
  return absl::OkStatus();
}

absl::Status FakeCudaApi::EventRecord(void* event, void* stream) {
  base::MutexLock lock(mu_);
  auto s = objects_.find(stream);
  absl::Status st = Enter("EventRecord", s == objects_.end() ? -1 : s->second->ordinal,
                          Name(stream) + " " + Name(event));
  if (!st.ok()) return st;
  auto e = objects_.find(event);
  if (s == objects_.end() || e == objects_.end() || !e->second->is_event) {
    return absl::FailedPreconditionError("cudaEventRecord: cudaErrorInvalidResourceHandle");
  }
  e->second->held = hold_;
  e->second->seconds = s->second->seconds;
  return absl::OkStatus();
}

absl::StatusOr<bool> FakeCudaApi::EventQuery(void* event) {
  base::MutexLock lock(mu_);
  auto e = objects_.find(event);
  // Not recorded as a call: the engine polls, and the count would depend on timing.
  if (e == objects_.end()) {
    return absl::FailedPreconditionError("cudaEventQuery: cudaErrorInvalidResourceHandle");
  }
  int cur = Current();
  if (cur < 0 || cur != e->second->ordinal) ++wrong_device_calls_;
  if (absl::Status st = TakeFailure("EventQuery"); !st.ok()) return st;
  if (!e->second->ipc_handle.empty() && pending_ipc_events_.count(e->second->ipc_handle) != 0) {
    return false;
  }
  return !e->second->held;
}

absl::Status FakeCudaApi::HostRegister(void* host, uint64_t bytes) {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("HostRegister", -1, absl::StrFormat("%d", bytes));
  if (!st.ok()) return st;
  if (host_registered_.count(host)) {
    return absl::FailedPreconditionError(
        "cudaHostRegister: cudaErrorHostMemoryAlreadyRegistered (712)");
  }
  host_registered_[host] = bytes;
  return absl::OkStatus();
}

absl::Status FakeCudaApi::HostUnregister(void* host) {
  base::MutexLock lock(mu_);
  absl::Status st = Enter("HostUnregister", -1, "");
  if (!st.ok()) return st;
  if (host_registered_.erase(host) == 0) {
    return absl::FailedPreconditionError(
        "cudaHostUnregister: cudaErrorHostMemoryNotRegistered (713)");
  }
  return absl::OkStatus();
}

}  // namespace offloadd::copy
