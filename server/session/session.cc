#include "server/session/session.h"

#include <errno.h>
#include <sys/random.h>

#include <chrono>
#include <cstring>
#include <functional>
#include <map>
#include <thread>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/metrics/metrics.h"

namespace offloadd::session {
namespace {

// offset + bytes within size, without overflow.
bool InBounds(uint64_t offset, uint64_t bytes, uint64_t size) {
  return offset <= size && bytes <= size - offset;
}

void RecordTransfer(const char* direction, const std::string& gpu, uint64_t bytes,
                    double seconds, bool ok) {
  auto& m = metrics::Get();
  const char* status = ok ? "ok" : "error";
  m.transfers_total->Add({{"direction", direction}, {"gpu", gpu}, {"status", status}})
      .Increment();
  if (!ok) return;
  m.transfer_bytes_total->Add({{"direction", direction}, {"gpu", gpu}, {"status", status}})
      .Increment(static_cast<double>(bytes));
  m.transfer_duration_seconds->Add({{"direction", direction}}, metrics::DurationBuckets())
      .Observe(seconds);
  m.transfer_size_bytes
      ->Add({{"direction", direction}},
            prometheus::Histogram::BucketBoundaries{4096, 65536, 1 << 20, 8 << 20, 64 << 20,
                                                    256 << 20, 1 << 30})
      .Observe(static_cast<double>(bytes));
}

// One chunk copy between client memory and the pool, run only while the session is open
// (copy_gate.h): after the session ended, queued chunks fail without touching client memory.
std::function<absl::Status(uint64_t, uint64_t)> GatedCopy(std::shared_ptr<CopyGate> gate,
                                                          Core* core,
                                                          std::shared_ptr<copy::Region> region,
                                                          copy::Direction direction,
                                                          uint64_t region_offset, uint8_t* host) {
  return [gate, core, region, direction, region_offset, host](uint64_t o, uint64_t len) {
    if (!gate->Enter()) {
      return absl::CancelledError("the session ended before this copy started");
    }
    absl::Status st =
        core->engine().CopyChunk(direction, *region, region_offset + o, host + o, len);
    gate->Exit();
    return st;
  };
}

// The asynchronous form of GatedCopy (issue 16): a chunk is posted only while the session is
// open, and it holds the gate until the engine reports it done, so the session's end waits for
// the chunks already posted (their copies touch client memory) and no chunk is posted after it.
std::function<void(uint64_t, uint64_t, std::function<void(absl::Status)>)> GatedPost(
    std::shared_ptr<CopyGate> gate, Core* core, std::shared_ptr<copy::Region> region,
    copy::Direction direction, uint64_t region_offset, uint8_t* host, sched::TrafficClass cls) {
  const copy::ChunkUrgency urgency = cls == sched::TrafficClass::kUrgent
                                         ? copy::ChunkUrgency::kUrgent
                                         : copy::ChunkUrgency::kNormal;
  return [gate, core, region, direction, region_offset, host, urgency](
             uint64_t o, uint64_t len, std::function<void(absl::Status)> done) {
    if (!gate->Enter()) {
      done(absl::CancelledError("the session ended before this copy started"));
      return;
    }
    core->engine().PostChunk(direction, *region, region_offset + o, host + o, len, urgency,
                             [gate, done = std::move(done)](absl::Status st) {
                               gate->Exit();
                               done(std::move(st));
                             });
  };
}

}  // namespace

const char* EndCauseName(EndCause cause) {
  switch (cause) {
    case EndCause::kClosed: return "closed";
    case EndCause::kCrashed: return "crashed";
    case EndCause::kShutdown: return "shutdown";
    case EndCause::kPidExited: return "pid_exited";
    case EndCause::kAdmin: return "admin";
    case EndCause::kBadMessage: return "bad_message";
    case EndCause::kHelloTimeout: return "hello_timeout";
  }
  return "unknown";
}

std::shared_ptr<Session> Session::Create(Core* core, Emit emit, PeerCredentials peer,
                                         EndStream end_stream) {
  std::shared_ptr<Session> s(
      new Session(core, std::move(emit), std::move(peer), std::move(end_stream)));
  core->AddSession(s->id_, s);
  return s;
}

absl::StatusOr<std::shared_ptr<Session>> Session::Open(Core* core, Emit emit,
                                                       PeerCredentials peer,
                                                       EndStream end_stream) {
  std::shared_ptr<Session> s = Create(core, std::move(emit), std::move(peer),
                                      std::move(end_stream));
  if (absl::Status st = core->AdmitPendingHello(s->id_, s->peer_); !st.ok()) return st;
  return s;
}

Session::Session(Core* core, Emit emit, PeerCredentials peer, EndStream end_stream)
    : core_(core),
      id_(core->NewSessionId()),
      peer_(std::move(peer)),
      emit_(std::move(emit)),
      end_stream_(std::move(end_stream)) {}

Session::~Session() { core_->RemoveSession(id_); }

bool Session::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return closed_;
}

void Session::Send(Completion c, bool counted) {
  std::lock_guard<std::mutex> lock(mu_);
  if (counted) {
    auto it = unanswered_.find(c.request_id);
    if (it == unanswered_.end()) return;  // already answered when the session closed
    unanswered_.erase(it);
    requests_in_flight_ = unanswered_.size();
  }
  if (emit_) emit_(std::move(c));
}

void Session::Fail(uint64_t request_id, absl::Status status, bool counted) {
  core_->CountError();
  metrics::Get()
      .request_errors_total->Add({{"code", absl::StatusCodeToString(status.code())}})
      .Increment();
  Completion c;
  c.request_id = request_id;
  c.kind = CompletionKind::kError;
  c.status = std::move(status);
  {
    // A copy cancelled because the session ended says why it ended (e.g. shutting down).
    std::lock_guard<std::mutex> lock(mu_);
    if (absl::IsCancelled(c.status) && !close_status_.ok()) c.status = close_status_;
  }
  Send(std::move(c), counted);
}

void Session::Handle(const Request& r) {
  const uint32_t limit = core_->options().max_requests_in_flight;
  uint64_t in_flight;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    in_flight = requests_in_flight_;
    if (limit == 0 || in_flight < limit) {
      unanswered_.insert(r.request_id);
      requests_in_flight_ = unanswered_.size();
    }
  }
  if (limit > 0 && in_flight >= limit) {
    return Fail(r.request_id,
                absl::ResourceExhaustedError(absl::StrFormat(
                    "%d requests of this session are already in flight (max_requests_in_flight): "
                    "wait for completions before sending more",
                    in_flight)),
                /*counted=*/false);
  }
  Dispatch(r);
}

void Session::Dispatch(const Request& r) {
  bool hello_done;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    hello_done = hello_done_;
  }
  if (r.kind == RequestKind::kHello) return OnHello(r);
  if (!hello_done) {
    return Fail(r.request_id, absl::FailedPreconditionError(
                                  "the session has not said hello: send Hello (client name, "
                                  "device id, pid) as the first request"));
  }
  switch (r.kind) {
    case RequestKind::kRegisterRegion: return OnRegister(r);
    case RequestKind::kUnregisterRegion: return OnUnregister(r);
    case RequestKind::kOffload: return OnOffload(r);
    case RequestKind::kReload:
    case RequestKind::kRelease: {
      Request resolved = r;
      if (!ResolveTag(resolved)) return;
      return r.kind == RequestKind::kReload ? OnReload(resolved) : OnRelease(resolved);
    }
    default:
      return Fail(r.request_id,
                  absl::InvalidArgumentError(
                      "unknown request kind: this daemon speaks offloadd.v1; upgrade it or send "
                      "one of hello, register_region, unregister_region, offload, reload, "
                      "release"));
  }
}

absl::StatusOr<std::string> NewResumeToken() {
  std::string token(kResumeTokenBytes, '\0');
  size_t got = 0;
  while (got < token.size()) {
    const ssize_t n = getrandom(&token[got], token.size() - got, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      return absl::UnavailableError(absl::StrCat(
          "cannot draw a resume token: getrandom failed (", std::strerror(errno),
          "); retry the hello"));
    }
    got += static_cast<size_t>(n);
  }
  return token;
}

void Session::OnHello(const Request& r) {
  if (r.device_id.empty()) {
    return Fail(r.request_id, absl::InvalidArgumentError(
                                  "hello without device_id: name the GPU this process uses "
                                  "(its UUID on CUDA, any stable name on shm)"));
  }
  if (r.device_id.size() > kMaxNameBytes || r.client_name.size() > kMaxNameBytes) {
    return Fail(r.request_id, absl::InvalidArgumentError(absl::StrFormat(
                                  "hello's device_id and client_name are limited to %d bytes",
                                  kMaxNameBytes)));
  }
  if (absl::Status st = CheckPeerAllowed(core_->options().access, peer_); !st.ok()) {
    return Fail(r.request_id, st);
  }
  if (absl::Status st = CheckHelloPid(peer_, r.pid); !st.ok()) return Fail(r.request_id, st);
  if (r.resume_token.size() > kMaxNameBytes) {
    return Fail(r.request_id, absl::InvalidArgumentError(absl::StrFormat(
                                  "hello's resume_token is limited to %d bytes: send the token "
                                  "a HelloReply returned, unchanged",
                                  kMaxNameBytes)));
  }
  std::string token = r.resume_token;
  if (token.empty()) {
    auto fresh = NewResumeToken();
    if (!fresh.ok()) return Fail(r.request_id, fresh.status());
    token = *std::move(fresh);
  }
  const pool::ResumeKey key = pool::ResumeKeyOf(token);
  std::unique_lock<std::mutex> lock(mu_);
  if (hello_done_) {
    lock.unlock();
    return Fail(r.request_id,
                absl::FailedPreconditionError("hello was already sent on this session: open a "
                                              "new stream for another device"));
  }
  if (closed_) return;
  if (absl::Status slot = core_->TryOpenSessionSlot(peer_); !slot.ok()) {
    lock.unlock();
    return Fail(r.request_id, slot);
  }
  if (absl::Status link = core_->AcquireLink(r.device_id); !link.ok()) {
    core_->ReleaseSessionSlot(peer_);
    lock.unlock();
    return Fail(r.request_id, link);
  }
  uint64_t blocks_resumed = 0;
  std::vector<uint64_t> resumed_ids;
  if (!r.resume_token.empty()) {
    auto resumed = core_->store().ResumeSession(
        id_, key, peer_.known ? peer_.uid : pool::kUnknownUid, &resumed_ids);
    if (!resumed.ok()) {
      core_->ReleaseLink(r.device_id, r.transient_device);
      core_->ReleaseSessionSlot(peer_);
      lock.unlock();
      return Fail(r.request_id, resumed.status());
    }
    blocks_resumed = *resumed;
  }
  core_->store().SetSessionResumeKey(id_, key);
  hello_done_ = true;
  core_->EndPendingHello(id_);
  client_name_ = r.client_name;
  device_id_ = r.device_id;
  transient_device_ = r.transient_device;
  pid_ = peer_.known && peer_.pid > 0 ? static_cast<uint32_t>(peer_.pid) : r.pid;
  if (peer_.known) {
    core_->store().SetSessionOwner(id_, peer_.uid);
    core_->WatchPid(id_, peer_.pid);
  }
  lock.unlock();
  metrics::Get().sessions_open->Increment();
  Completion c;
  c.request_id = r.request_id;
  c.kind = CompletionKind::kHello;
  c.id = id_;
  c.backend = core_->engine().name();
  c.link = core_->LinkNameFor(r.device_id);
  c.pool_capacity_bytes = core_->store().capacity_bytes();
  c.session_quota_bytes = core_->options().store.session_quota_bytes;
  c.chunk_bytes = core_->options().chunk_bytes;
  c.resume_token = token;
  c.blocks_resumed = blocks_resumed;
  c.resume_grace_seconds =
      core_->store().survives_restart() ? core_->options().resume_grace_seconds : 0;
  c.resumed_block_ids = std::move(resumed_ids);
  Send(std::move(c));
}

absl::StatusOr<std::shared_ptr<copy::Region>> Session::FindRegion(uint64_t region_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = regions_.find(region_id);
  if (it == regions_.end()) {
    return absl::NotFoundError(absl::StrFormat(
        "region %d is not registered in this session: register the region first and use the "
        "id the daemon returned",
        region_id));
  }
  return it->second;
}

void Session::OnRegister(const Request& r) {
  copy::RegionSpec spec = r.region;
  spec.device_id = device_id_;
  if (spec.shm_name.empty() && spec.cuda_ipc_handle.empty()) {
    return Fail(r.request_id, absl::InvalidArgumentError(
                                  "register_region without a handle: set shm_name (shm backend) "
                                  "or cuda_ipc_handle (cuda backend)"));
  }
  if (absl::Status st = CheckShmOwner(peer_, spec.shm_name); !st.ok()) {
    return Fail(r.request_id, st);
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    if (regions_.size() >= kMaxRegionsPerSession) {
      lock.unlock();
      return Fail(r.request_id, absl::ResourceExhaustedError(absl::StrFormat(
                                    "this session already has %d regions registered: register "
                                    "one large region and use offsets, or unregister unused ones",
                                    kMaxRegionsPerSession)));
    }
  }
  auto region = core_->engine().OpenRegion(spec);
  if (!region.ok()) return Fail(r.request_id, region.status());
  uint64_t region_id;
  {
    std::lock_guard<std::mutex> lock(mu_);
    region_id = next_region_id_++;
    regions_[region_id] = *std::move(region);
  }
  Completion c;
  c.request_id = r.request_id;
  c.kind = CompletionKind::kRegionRegistered;
  c.id = region_id;
  Send(std::move(c));
}

void Session::OnUnregister(const Request& r) {
  // Copies in flight keep their own reference; the region closes after them. The session's
  // reference dies after the lock is released: closing a region may block (a CUDA IPC handle
  // is closed on the device thread).
  std::shared_ptr<copy::Region> erased;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = regions_.find(r.region_id);
    if (it != regions_.end()) {
      erased = std::move(it->second);
      regions_.erase(it);
    }
  }
  const bool found = erased != nullptr;
  erased.reset();
  if (!found) {
    return Fail(r.request_id, absl::NotFoundError(absl::StrFormat(
                                  "region %d is not registered in this session (never "
                                  "registered, or already unregistered)",
                                  r.region_id)));
  }
  Completion c;
  c.request_id = r.request_id;
  c.kind = CompletionKind::kRegionUnregistered;
  c.id = r.region_id;
  Send(std::move(c));
}

void Session::OnOffload(const Request& r) {
  auto region = FindRegion(r.region_id);
  if (!region.ok()) return Fail(r.request_id, region.status());
  if (r.bytes == 0) {
    return Fail(r.request_id, absl::InvalidArgumentError(
                                  "offload of 0 bytes: send the checkpoint's size in bytes"));
  }
  if (!InBounds(r.offset, r.bytes, (*region)->size_bytes())) {
    return Fail(r.request_id,
                absl::OutOfRangeError(absl::StrFormat(
                    "offload of [%d, +%d) is outside region %d of %d bytes: check the offset "
                    "and size against the registered allocation",
                    r.offset, r.bytes, r.region_id, (*region)->size_bytes())));
  }
  if (!core_->BeginTransfer()) {
    return Fail(r.request_id, absl::UnavailableError(
                                  "offloadd is shutting down: keep the tensor in process memory "
                                  "and reconnect when the daemon is back"));
  }
  if (r.tag != 0) {
    bool fresh;
    {
      std::lock_guard<std::mutex> lock(mu_);
      fresh = tags_.emplace(r.tag, TaggedBlock{}).second;
    }
    if (!fresh) {
      core_->EndTransfer();
      return Fail(r.request_id, absl::InvalidArgumentError(absl::StrFormat(
                                    "tag %d already names a live block of this session: use a "
                                    "fresh tag, or release that block first",
                                    r.tag)));
    }
  }
  auto self = shared_from_this();
  std::shared_ptr<copy::Region> reg = *region;
  const double start = core_->clock().NowSeconds();
  core_->store().Reserve(id_, r.bytes, [self, reg, r, start](absl::StatusOr<store::BlockRef> ref) {
    Core* core = self->core_;
    if (!ref.ok()) {
      if (r.tag != 0) self->TagResolved(r.tag, 0, ref.status());
      self->Fail(r.request_id, ref.status());
      core->EndTransfer();
      return;
    }
    bool closed;
    {
      std::lock_guard<std::mutex> lock(self->mu_);
      closed = self->closed_;
    }
    if (closed) {  // admitted as the session ended: give the space back
      core->store().OffloadFinished(ref->block_id, absl::CancelledError("session ended"));
      core->EndTransfer();
      return;
    }
    absl::Status ready = core->engine().WaitReady(*reg, r.ready_event);
    if (!ready.ok()) {
      core->store().OffloadFinished(ref->block_id, ready);
      if (r.tag != 0) self->TagResolved(r.tag, 0, ready);
      self->Fail(r.request_id, ready);
      core->EndTransfer();
      return;
    }
    auto t = std::make_shared<sched::Transfer>();
    t->gpu = self->device_id_;
    t->cls = sched::TrafficClass::kOffload;
    t->bytes = r.bytes;
    uint8_t* host = core->pool_base() + ref->extent.offset;
    t->owner_id = self->id_;
    t->copy_chunk =
        GatedCopy(self->gate_, core, reg, copy::Direction::kDeviceToHost, r.offset, host);
    if (core->engine().asynchronous()) {  // issue 16: posted, completion from the engine
      t->post_chunk =
          GatedPost(self->gate_, core, reg, copy::Direction::kDeviceToHost, r.offset, host,
                    t->cls);
    }
    const store::BlockRef block = *ref;
    const double admitted = core->clock().NowSeconds();
    t->done = [self, block, r, start, admitted](absl::Status st) {
      Core* core = self->core_;
      core->store().OffloadFinished(block.block_id, st);
      double now = core->clock().NowSeconds();
      core->CountTransfer(/*offload=*/true, r.bytes, st.ok());
      RecordTransfer("d2h", self->device_id_, r.bytes, now - start, st.ok());
      if (st.ok()) {
        Completion c;
        c.request_id = r.request_id;
        c.kind = CompletionKind::kOffloadDone;
        c.id = block.block_id;
        c.bytes = r.bytes;
        c.queued_seconds = block.queued_seconds;
        c.copy_seconds = now - admitted;
        self->Send(std::move(c));
      } else {
        self->ForgetBlock(block.block_id);
        self->Fail(r.request_id, st);
      }
      core->EndTransfer();
    };
    // Reloads and releases that named the block by tag before it existed run now; the store
    // orders reloads after the copy.
    if (r.tag != 0) self->TagResolved(r.tag, block.block_id, absl::OkStatus());
    core->LinkFor(self->device_id_)->d2h->Submit(std::move(t));
  }, r.order);
}

void Session::OnReload(const Request& r) {
  if (r.priority != kPriorityUrgent && r.priority != kPriorityPrefetch) {
    return Fail(r.request_id, absl::InvalidArgumentError(absl::StrFormat(
                                  "reload priority %d is not known: use URGENT (1) when the "
                                  "caller is blocked on the data or PREFETCH (2) when it is "
                                  "needed soon",
                                  r.priority)));
  }
  auto region = FindRegion(r.region_id);
  if (!region.ok()) return Fail(r.request_id, region.status());
  if (!core_->BeginTransfer()) {
    return Fail(r.request_id,
                absl::UnavailableError("offloadd is shutting down: the block cannot be reloaded; "
                                       "recompute it or fail the step"));
  }
  auto self = shared_from_this();
  std::shared_ptr<copy::Region> reg = *region;
  const double start = core_->clock().NowSeconds();
  absl::Status begun = core_->store().BeginReload(
      id_, r.block_id, [self, reg, r, start](absl::StatusOr<store::BlockRef> ref) {
        Core* core = self->core_;
        if (!ref.ok()) {
          core->store().EndReload(r.block_id, false);
          self->Fail(r.request_id, ref.status());
          core->EndTransfer();
          return;
        }
        if (!InBounds(r.offset, ref->bytes, reg->size_bytes())) {
          core->store().EndReload(r.block_id, false);
          self->Fail(r.request_id,
                     absl::OutOfRangeError(absl::StrFormat(
                         "reload of block %d (%d bytes) at offset %d does not fit region %d of "
                         "%d bytes: reload into a region with room for the whole block",
                         r.block_id, ref->bytes, r.offset, r.region_id, reg->size_bytes())));
          core->EndTransfer();
          return;
        }
        auto t = std::make_shared<sched::Transfer>();
        t->gpu = self->device_id_;
        t->cls = r.priority == kPriorityUrgent ? sched::TrafficClass::kUrgent
                                               : sched::TrafficClass::kPrefetch;
        t->deadline_at_seconds = r.timeout_seconds > 0 ? start + r.timeout_seconds : 0;
        t->bytes = ref->bytes;
        uint8_t* host = core->pool_base() + ref->extent.offset;
        t->owner_id = self->id_;
        t->copy_chunk =
            GatedCopy(self->gate_, core, reg, copy::Direction::kHostToDevice, r.offset, host);
        if (core->engine().asynchronous()) {  // issue 16: posted, completion from the engine
          t->post_chunk =
              GatedPost(self->gate_, core, reg, copy::Direction::kHostToDevice, r.offset, host,
                        t->cls);
        }
        const uint64_t bytes = ref->bytes;
        const double ready = core->clock().NowSeconds();
        t->done = [self, reg, r, bytes, start, ready](absl::Status st) {
          Core* core = self->core_;
          if (st.ok()) st = core->engine().SignalDone(*reg, r.done_event);
          // A failed reload keeps the block so the client can retry: nothing accepted is lost.
          const bool release = r.release_after && st.ok();
          core->store().EndReload(r.block_id, release);
          if (release) self->ForgetBlock(r.block_id);
          double now = core->clock().NowSeconds();
          core->CountTransfer(/*offload=*/false, bytes, st.ok());
          RecordTransfer("h2d", self->device_id_, bytes, now - start, st.ok());
          if (st.ok()) {
            Completion c;
            c.request_id = r.request_id;
            c.kind = CompletionKind::kReloadDone;
            c.id = r.block_id;
            c.bytes = bytes;
            c.released = release;
            c.copy_seconds = now - ready;
            self->Send(std::move(c));
          } else {
            self->Fail(r.request_id, st);
          }
          core->EndTransfer();
        };
        core->LinkFor(self->device_id_)->h2d->Submit(std::move(t));
      });
  if (!begun.ok()) {
    Fail(r.request_id, begun);
    core_->EndTransfer();
  }
}

bool Session::ResolveTag(Request& r) {
  if (r.block_id != 0 || r.tag == 0) return true;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tags_.find(r.tag);
    if (it != tags_.end()) {
      if (it->second.block_id == 0) {
        it->second.waiting.push_back(r);
        return false;
      }
      r.block_id = it->second.block_id;
      return true;
    }
  }
  Fail(r.request_id, absl::NotFoundError(absl::StrFormat(
                         "no live block of this session has tag %d (never offloaded with it, or "
                         "already released)",
                         r.tag)));
  return false;
}

void Session::TagResolved(uint64_t tag, uint64_t block_id, const absl::Status& status) {
  std::vector<Request> waiting;
  {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = tags_.find(tag);
    if (it == tags_.end()) return;
    waiting.swap(it->second.waiting);
    if (block_id != 0) {
      it->second.block_id = block_id;
      block_tags_[block_id] = tag;
    } else {
      tags_.erase(it);
    }
  }
  for (Request& w : waiting) {
    if (block_id == 0) {
      Fail(w.request_id, absl::Status(status.code(),
                                      absl::StrFormat("the offload tagged %d failed: %s", tag,
                                                      status.message())));
      continue;
    }
    w.block_id = block_id;
    Dispatch(w);
  }
}

void Session::ForgetBlock(uint64_t block_id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = block_tags_.find(block_id);
  if (it == block_tags_.end()) return;
  tags_.erase(it->second);
  block_tags_.erase(it);
}

void Session::OnRelease(const Request& r) {
  absl::Status st = core_->store().Release(id_, r.block_id);
  if (!st.ok()) return Fail(r.request_id, st);
  ForgetBlock(r.block_id);
  Completion c;
  c.request_id = r.request_id;
  c.kind = CompletionKind::kReleased;
  c.id = r.block_id;
  Send(std::move(c));
}

void Session::Close(EndCause cause) { CloseWith(cause, nullptr); }

void Session::End(EndCause cause, const absl::Status& status) { CloseWith(cause, &status); }

namespace {
// What a request that could not finish is answered with when its session ends for `cause`.
absl::Status CloseStatus(EndCause cause) {
  if (cause == EndCause::kShutdown) {
    return absl::UnavailableError(
        "offloadd is shutting down: this request was not carried out (an offload stored "
        "nothing, a reload did not write your memory); keep the data in process memory and "
        "reconnect when the daemon is back");
  }
  if (cause == EndCause::kClosed) {
    return absl::CancelledError(
        "the client half-closed its session stream before this request was answered: offloadd "
        "cancelled it (an offload stored nothing, a reload did not write your memory); keep the "
        "stream open until every answer has arrived");
  }
  return absl::CancelledError(absl::StrCat(
      "the session ended (", EndCauseName(cause),
      ") before this request was answered: it was not carried out; open a new session"));
}
}  // namespace

void Session::StopCopies(EndCause cause) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (close_status_.ok()) close_status_ = CloseStatus(cause);
  }
  gate_->Close();
}

void Session::CloseWith(EndCause cause, const absl::Status* end_status) {
  bool counted;
  EndStream end_stream;
  std::string device_id;
  bool transient_device;
  const absl::Status close_status = CloseStatus(cause);
  // Dropped after the lock is released (closing a region may block on the device thread).
  std::map<uint64_t, std::shared_ptr<copy::Region>> regions;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) return;
    closed_ = true;
    close_status_ = close_status;
    end_stream.swap(end_stream_);
    counted = hello_done_;
    device_id = device_id_;
    transient_device = transient_device_;
    regions.swap(regions_);
    tags_.clear();
    block_tags_.clear();
  }
  if (!counted) core_->EndPendingHello(id_);
  // No copy into the client's memory starts from here on; wait for those running, and drop the
  // queued ones (they must not hold up the link or a shutdown), before the stream ends. Their
  // requests are answered meanwhile (emit_ is still set).
  regions.clear();
  gate_->CloseAndWait();
  if (counted) {
    core_->CancelTransfers(id_, device_id, close_status);
    core_->UnwatchPid(id_);
    core_->ReleaseSessionSlot(peer_);
    core_->ReleaseLink(device_id, transient_device);
  }
  core_->store().ReleaseSession(id_);
  {
    // Every request still unanswered gets its answer now, then nothing more is sent.
    std::lock_guard<std::mutex> lock(mu_);
    if (emit_) {
      for (uint64_t request_id : unanswered_) {
        Completion c;
        c.request_id = request_id;
        c.kind = CompletionKind::kError;
        c.status = close_status;
        emit_(std::move(c));
      }
    }
    unanswered_.clear();
    requests_in_flight_ = 0;
    emit_ = nullptr;
  }
  if (end_status != nullptr && end_stream) end_stream(*end_status);
  auto& m = metrics::Get();
  if (counted) m.sessions_open->Decrement();
  m.sessions_ended_total->Add({{"cause", EndCauseName(cause)}}).Increment();
}

bool Session::MutexHeldForTesting() const {
  bool held = false;
  std::thread([&] {
    if (mu_.try_lock()) {
      mu_.unlock();
    } else {
      held = true;
    }
  }).join();
  return held;
}

SessionInfo Session::info() const {
  SessionInfo i;
  {
    std::lock_guard<std::mutex> lock(mu_);
    i.session_id = id_;
    i.client_name = client_name_;
    i.device_id = device_id_;
    i.pid = pid_;
    i.peer_known = peer_.known;
    i.uid = peer_.uid;
    i.gid = peer_.gid;
    i.requests_in_flight = requests_in_flight_;
  }
  i.blocks = core_->store().SessionBlocks(id_);
  i.used_bytes = core_->store().SessionUsedBytes(id_);
  return i;
}

}  // namespace offloadd::session
