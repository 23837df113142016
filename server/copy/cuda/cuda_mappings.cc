// When the cuda engine maps client memory, its event cache and its ordered transfers
// (cuda_engine_shared.h has the lifetime rules).
#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "glog/logging.h"
#include "server/copy/cuda/cuda_engine_shared.h"

namespace offloadd::copy {

OpenedEvent::~OpenedEvent() {
  if (event == nullptr || mapper == nullptr) return;
  CudaApi* a = api;
  void* e = event;
  // The stream operations already issued on it keep their captured state.
  if (!mapper->Post([a, e] { a->DestroyEvent(e); })) a->DestroyEvent(e);
}

std::shared_ptr<Mapping> CudaCopyEngine::Shared::MappingFor(const CudaDeviceInfo& device,
                                                            const GpuThreads& gpu,
                                                            const std::string& handle) {
  const std::string key = device.uuid + std::string(1, '\0') + handle;
  base::MutexLock lock(mu);
  std::shared_ptr<Mapping>& m = mappings[key];
  if (m == nullptr) {
    m = std::make_shared<Mapping>();
    m->key = key;
    m->handle = handle;
    m->uuid = device.uuid;
    m->gpu = gpu;
  }
  return m;
}

void CudaCopyEngine::Shared::Acquire(const std::shared_ptr<Mapping>& m) {
  base::MutexLock lock(mu);
  ++m->uses;
  if (m->state != Mapping::State::kClosed && m->state != Mapping::State::kClosing) return;
  m->state = Mapping::State::kOpening;  // behind a queued close, if any
  if (!m->gpu.mapper->Post([this, m] { OpenTask(m); })) {
    m->state = Mapping::State::kFailed;
    m->open_error = absl::FailedPreconditionError("the cuda engine is shutting down");
  }
}

void CudaCopyEngine::Shared::OpenTask(const std::shared_ptr<Mapping>& m) {
  absl::StatusOr<void*> base = api->IpcOpenMemHandle(m->handle);
  absl::StatusOr<uint64_t> size =
      base.ok() ? api->AllocationSize(*base) : absl::StatusOr<uint64_t>(base.status());
  if (base.ok() && !size.ok()) (void)api->IpcCloseMemHandle(*base);
  base::MutexLock lock(mu);
  if (size.ok() && shut_down) {  // CloseAll has run: close what opened behind it
    (void)api->IpcCloseMemHandle(*base);
    size = absl::FailedPreconditionError("the cuda engine is shutting down");
  }
  if (size.ok()) {
    m->state = Mapping::State::kOpen;
    m->base = *base;
    m->allocation_bytes = *size;
    ++stats.mem_handle_opens_total;
    ++stats.mem_handles_open;
    HandleCounts& by_gpu = stats.handles_by_gpu[m->uuid];
    ++by_gpu.opens_total;
    ++by_gpu.open;
    VLOG(1) << "cuda: opened IPC memory handle on " << m->uuid << " (" << *size << " bytes)";
  } else {
    m->state = Mapping::State::kFailed;
    m->open_error = size.status();
  }
  mapping_cv.notify_all();
  if (m->uses == 0) {  // every user left while it opened
    if (m->state == Mapping::State::kOpen) {
      PostClose(m);
    } else {
      m->state = Mapping::State::kClosed;
      EraseIfUnusedLocked(m);
    }
  }
}

void CudaCopyEngine::Shared::PostClose(const std::shared_ptr<Mapping>& m) {
  m->state = Mapping::State::kClosing;
  void* base = m->base;
  if (!m->gpu.mapper->Post([this, m, base] { CloseTask(m, base); })) {
    // Only at shutdown: CloseAll closes what is still open on the caller's thread.
    m->state = Mapping::State::kOpen;
  }
}

void CudaCopyEngine::Shared::CloseTask(const std::shared_ptr<Mapping>& m, void* base) {
  absl::Status st = api->IpcCloseMemHandle(base);
  if (!st.ok()) LOG(WARNING) << "cuda: closing an IPC memory handle: " << st.message();
  base::MutexLock lock(mu);
  ++stats.mem_handle_closes_total;
  --stats.mem_handles_open;
  --stats.handles_by_gpu[m->uuid].open;
  if (m->state == Mapping::State::kClosing) {  // else an Acquire queued an open behind us
    m->state = Mapping::State::kClosed;
    m->base = nullptr;
    EraseIfUnusedLocked(m);
  }
}

void CudaCopyEngine::Shared::Release(const std::shared_ptr<Mapping>& m) {
  base::MutexLock lock(mu);
  if (--m->uses > 0) return;
  if (m->state == Mapping::State::kOpen) {
    PostClose(m);
  } else if (m->state == Mapping::State::kFailed) {
    m->state = Mapping::State::kClosed;
    m->open_error = absl::OkStatus();
    EraseIfUnusedLocked(m);
  }
}

void CudaCopyEngine::Shared::Unregister(const std::shared_ptr<Mapping>& m) {
  base::MutexLock lock(mu);
  if (--m->registrations == 0) m->owner_uid = -1;
  EraseIfUnusedLocked(m);
}

void CudaCopyEngine::Shared::EraseIfUnusedLocked(const std::shared_ptr<Mapping>& m) {
  if (m->registrations > 0 || m->uses > 0 || m->state != Mapping::State::kClosed) return;
  auto it = mappings.find(m->key);
  if (it != mappings.end() && it->second == m) mappings.erase(it);
}

absl::StatusOr<uint64_t> CudaCopyEngine::Shared::WaitOpen(const std::shared_ptr<Mapping>& m) {
  base::MutexLock lock(mu);
  while (m->state == Mapping::State::kOpening) mapping_cv.Wait(mu);
  if (m->state == Mapping::State::kFailed) return m->open_error;
  return m->allocation_bytes;
}

absl::Status CudaCopyEngine::Shared::RegisterLocked(Mapping& m, int64_t uid) {
  if (m.registrations > 0 && m.owner_uid >= 0 && uid >= 0 && m.owner_uid != uid) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "this CUDA IPC memory handle is registered by a session of uid %d, not this session's "
        "uid %d: register memory your own process allocated and exported",
        m.owner_uid, uid));
  }
  if (m.registrations == 0 || m.owner_uid < 0) m.owner_uid = uid;
  ++m.registrations;
  return absl::OkStatus();
}

std::shared_ptr<OpenedEvent> CudaCopyEngine::Shared::EventFor(const std::string& uuid,
                                                              const GpuThreads& gpu,
                                                              const std::string& handle,
                                                              uint64_t owner,
                                                              int64_t owner_uid) {
  const std::string key = uuid + std::string(1, '\0') + handle;
  base::MutexLock lock(mu);
  auto it = events.find(key);
  if (it != events.end() && it->second->owner_uid >= 0 && owner_uid >= 0 &&
      it->second->owner_uid != owner_uid) {
    auto refused = std::make_shared<OpenedEvent>();
    refused->state = OpenedEvent::State::kFailed;
    refused->error = absl::PermissionDeniedError(absl::StrFormat(
        "this CUDA IPC event handle is in use by a session of uid %d, not this session's uid "
        "%d: name events your own process created and exported",
        it->second->owner_uid, owner_uid));
    return refused;
  }
  if (owner != 0) event_owners[key].insert(owner);
  if (it != events.end() && it->second->state != OpenedEvent::State::kFailed) {
    event_lru.remove(key);
    event_lru.push_back(key);
    return it->second;
  }
  auto e = std::make_shared<OpenedEvent>();
  e->owner_uid = owner_uid;
  e->api = api.get();
  e->mapper = gpu.mapper;
  std::weak_ptr<OpenedEvent> weak = e;
  const bool posted = gpu.mapper->Post([this, weak, handle] {
    std::shared_ptr<OpenedEvent> ev = weak.lock();
    if (ev == nullptr) return;  // nobody wants it any more
    absl::StatusOr<void*> opened = api->IpcOpenEventHandle(handle);
    base::MutexLock lock(mu);
    if (opened.ok()) {
      ev->event = *opened;
      ev->state = OpenedEvent::State::kOpen;
      ++stats.event_handle_opens_total;
    } else {
      ev->state = OpenedEvent::State::kFailed;
      ev->error = opened.status();
    }
  });
  if (!posted) {
    e->state = OpenedEvent::State::kFailed;
    e->error = absl::FailedPreconditionError("the cuda engine is shutting down");
    return e;
  }
  if (it != events.end()) event_lru.remove(key);
  events[key] = e;
  event_lru.push_back(key);
  while (event_lru.size() > std::max<uint32_t>(1, options.max_cached_events)) {
    events.erase(event_lru.front());  // transfers using it keep their reference
    event_owners.erase(event_lru.front());
    event_lru.pop_front();
  }
  return e;
}

void CudaCopyEngine::Shared::CloseAll() {
  std::vector<std::pair<std::shared_ptr<Mapping>, void*>> open;
  {
    base::MutexLock lock(mu);
    shut_down = true;
    for (auto& [k, m] : mappings) {  // (a kClosing one's close is queued on its mapper)
      if (m->state == Mapping::State::kOpen) {
        open.emplace_back(m, m->base);
        m->state = Mapping::State::kFailed;
        m->open_error = absl::FailedPreconditionError(
            "the region's IPC handle was closed (the cuda engine is shutting down)");
      }
    }
    events.clear();
    event_lru.clear();
    event_owners.clear();
  }
  if (!open.empty()) {
    LOG(WARNING) << "cuda: engine stopping with " << open.size()
                 << " IPC handle(s) still open; closing them";
  }
  for (const auto& entry : open) {
    Mapping* m = entry.first.get();
    void* base = entry.second;
    absl::Status st = m->gpu.mapper->Run([&] { return api->IpcCloseMemHandle(base); });
    if (!st.ok()) LOG(WARNING) << "cuda: closing an IPC memory handle: " << st.message();
    base::MutexLock lock(mu);
    ++stats.mem_handle_closes_total;
    --stats.mem_handles_open;
    --stats.handles_by_gpu[m->uuid].open;
  }
}

// ---- CudaTransfer ----

CudaTransfer::CudaTransfer(std::shared_ptr<CudaCopyEngine::Shared> shared,
                           std::shared_ptr<Mapping> mapping, TransferSpec spec)
    : shared_(std::move(shared)),
      mapping_(std::move(mapping)),
      spec_(std::move(spec)),
      created_at_(base::SteadyNowSeconds()) {
  shared_->Acquire(mapping_);
  if (!spec_.ready_event.empty()) {
    ready_ = shared_->EventFor(mapping_->uuid, mapping_->gpu, spec_.ready_event, spec_.owner_id,
                               spec_.owner_uid);
  }
  if (!spec_.done_event.empty()) {
    done_ = shared_->EventFor(mapping_->uuid, mapping_->gpu, spec_.done_event, spec_.owner_id,
                              spec_.owner_uid);
  }
}

CudaTransfer::~CudaTransfer() { shared_->Release(mapping_); }

absl::StatusOr<bool> CudaTransfer::OpenedLocked() {
  if (shared_->shut_down) {
    return absl::FailedPreconditionError(
        "the region's IPC handle was closed (the cuda engine is shutting down)");
  }
  switch (mapping_->state) {
    case Mapping::State::kOpen: break;
    case Mapping::State::kFailed: return mapping_->open_error;
    default: return false;
  }
  for (const auto* e : {&ready_, &done_}) {
    if (*e == nullptr) continue;
    if ((*e)->state == OpenedEvent::State::kFailed) return (*e)->error;
    if ((*e)->state == OpenedEvent::State::kOpening) return false;
  }
  base_ = static_cast<uint8_t*>(mapping_->base);
  return true;
}

absl::StatusOr<bool> CudaTransfer::Ready() {
  bool producer_running = false;
  absl::StatusOr<bool> ready = Query(&producer_running);
  if (producer_running != reported_waiting_ && spec_.on_producer_wait) {
    reported_waiting_ = producer_running;
    spec_.on_producer_wait(producer_running);
  }
  return ready;
}

absl::StatusOr<bool> CudaTransfer::Query(bool* producer_running) {
  if (spec_.cancelled && spec_.cancelled()) {
    return absl::CancelledError(
        "the session ended while this transfer waited for its mapping or ready event");
  }
  {
    base::MutexLock lock(shared_->mu);
    absl::StatusOr<bool> opened = OpenedLocked();
    if (!opened.ok() || !*opened) return opened;
  }
  if (ready_ == nullptr) return true;
  absl::StatusOr<bool> done = shared_->api->EventQuery(ready_->event);
  if (!done.ok() || *done) return done;
  const double waited = base::SteadyNowSeconds() - created_at_;
  if (waited > shared_->options.max_ready_wait_seconds) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "the transfer's ready_event has not completed after %.0f s: record it after the "
        "kernels that produce the data, on a stream that makes progress",
        waited));
  }
  *producer_running = true;
  return false;
}

absl::Status CudaTransfer::RecordDone(void* stream) {
  absl::Status st = shared_->api->EventRecord(done_->event, stream);
  if (!st.ok()) return st;
  if (spec_.on_done_recorded) spec_.on_done_recorded();
  return absl::OkStatus();
}

}  // namespace offloadd::copy
