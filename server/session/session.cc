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
#include "common/base/clock.h"
#include "glog/logging.h"
#include "server/base/log_text.h"
#include "server/copy/cuda/sim_gpu_table.h"
#include "server/metrics/metrics.h"
#include "server/session/audit.h"

namespace offloadd::session {

const char* EndCauseName(EndCause cause) {
  switch (cause) {
    case EndCause::kClosed: return "closed";
    case EndCause::kCrashed: return "crashed";
    case EndCause::kShutdown: return "shutdown";
    case EndCause::kPidExited: return "pid_exited";
    case EndCause::kAdmin: return "admin";
    case EndCause::kBadMessage: return "bad_message";
    case EndCause::kHelloTimeout: return "hello_timeout";
    case EndCause::kCopyFailed: return "copy_failed";
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
  base::MutexLock lock(mu_);
  return closed_;
}

void Session::Send(Completion c, bool counted) {
  base::MutexLock lock(mu_);
  if (counted) {
    auto it = unanswered_.find(c.request_id);
    if (it == unanswered_.end()) return;  // already answered when the session closed
    unanswered_.erase(it);
    requests_in_flight_ = unanswered_.size();
  }
  if (emit_) emit_(std::move(c));
}

void Session::CountRefused(const absl::Status& status) {
  core_->CountError();
  metrics::Get()
      .request_errors_total->Add({{"code", absl::StatusCodeToString(status.code())}})
      .Increment();
}

absl::Status Session::end_status() const {
  base::MutexLock lock(mu_);
  return closed_ ? close_status_ : absl::OkStatus();
}

void Session::Fail(uint64_t request_id, absl::Status status, bool counted) {
  CountRefused(status);
  Completion c;
  c.request_id = request_id;
  c.kind = CompletionKind::kError;
  c.status = std::move(status);
  {
    // A copy cancelled because the session ended says why it ended (e.g. shutting down).
    base::MutexLock lock(mu_);
    if (absl::IsCancelled(c.status) && !close_status_.ok()) c.status = close_status_;
  }
  Send(std::move(c), counted);
}

bool Session::Handle(const Request& r) {
  const uint32_t limit = core_->options().max_requests_in_flight;
  uint64_t in_flight;
  {
    base::MutexLock lock(mu_);
    if (closed_) return false;
    in_flight = requests_in_flight_;
    if (limit == 0 || in_flight < limit) {
      unanswered_.insert(r.request_id);
      requests_in_flight_ = unanswered_.size();
    }
  }
  if (limit > 0 && in_flight >= limit) {
    Fail(r.request_id,
         absl::ResourceExhaustedError(absl::StrFormat(
             "%d requests of this session are already in flight (max_requests_in_flight): "
             "wait for completions before sending more",
             in_flight)),
         /*counted=*/false);
    return true;
  }
  // Closed from here on, the request is among the unanswered ones the close answers.
  Dispatch(r);
  return true;
}

bool Session::MayBlock(const Request& r) const {
  // Offloads and reloads never block the caller (a ready event is waited for by the engine's
  // device thread, mappings are opened on its mapper thread).
  if (r.kind == RequestKind::kClientReport) return false;  // a lock and a sum
  if (r.kind != RequestKind::kOffload && r.kind != RequestKind::kReload) return true;
  base::MutexLock lock(mu_);
  return closed_ || !hello_done_ || regions_.count(r.region_id) == 0;
}

void Session::Dispatch(const Request& r) {
  bool hello_done;
  {
    base::MutexLock lock(mu_);
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
    case RequestKind::kClientReport: return OnClientReport(r);
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
                      "release, client_report"));
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

absl::Status Session::CheckHello(const Request& r) const {
  if (r.device_id.empty()) {
    return absl::InvalidArgumentError(
        "hello without device_id: name the GPU this process uses (its UUID on CUDA, any stable "
        "name on shm)");
  }
  if (r.device_id.size() > kMaxNameBytes || r.client_name.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "hello's device_id and client_name are limited to %d bytes", kMaxNameBytes));
  }
  if (absl::Status st = CheckPeerAllowed(core_->options().access, peer_); !st.ok()) return st;
  if (absl::Status st = CheckHelloPid(peer_, r.pid); !st.ok()) return st;
  if (r.resume_token.size() > kMaxNameBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "hello's resume_token is limited to %d bytes: send the token a HelloReply returned, "
        "unchanged",
        kMaxNameBytes));
  }
  return absl::OkStatus();
}

void Session::OnHello(const Request& r) {
  if (absl::Status st = CheckHello(r); !st.ok()) return Fail(r.request_id, st);
  std::string token = r.resume_token;
  if (token.empty()) {
    auto fresh = NewResumeToken();
    if (!fresh.ok()) return Fail(r.request_id, fresh.status());
    token = *std::move(fresh);
  }
  const pool::ResumeKey key = pool::ResumeKeyOf(token);
  std::vector<uint64_t> resumed_ids;
  absl::StatusOr<uint64_t> admitted;
  {
    base::MutexLock lock(mu_);
    if (!hello_done_ && closed_) return;
    admitted = hello_done_ ? absl::FailedPreconditionError(
                                 "hello was already sent on this session: open a new stream "
                                 "for another device")
                           : AdmitHelloLocked(r, key, &resumed_ids);
  }
  if (!admitted.ok()) return Fail(r.request_id, admitted.status());
  metrics::Get().sessions_open->Increment();
  AuditSessionOpen(info(), *admitted);
  Send(HelloReply(r, token, *admitted, std::move(resumed_ids)));
}

absl::StatusOr<uint64_t> Session::AdmitHelloLocked(const Request& r, const pool::ResumeKey& key,
                                                   std::vector<uint64_t>* resumed_ids) {
  if (absl::Status slot = core_->TryOpenSessionSlot(peer_); !slot.ok()) return slot;
  if (absl::Status link = core_->AcquireLink(r.device_id); !link.ok()) {
    core_->ReleaseSessionSlot(peer_);
    return link;
  }
  uint64_t blocks_resumed = 0;
  if (!r.resume_token.empty()) {
    auto resumed = core_->store().ResumeSession(
        id_, key, peer_.known ? peer_.uid : pool::kUnknownUid, resumed_ids);
    if (!resumed.ok()) {
      core_->ReleaseLink(r.device_id, r.transient_device);
      core_->ReleaseSessionSlot(peer_);
      return resumed.status();
    }
    blocks_resumed = *resumed;
  }
  core_->store().SetSessionResumeKey(id_, key);
  core_->store().SetSessionNumaNode(id_, core_->GpuNumaNode(r.device_id));
  hello_done_ = true;
  core_->EndPendingHello(id_);
  client_name_ = r.client_name;
  device_id_ = r.device_id;
  transient_device_ = r.transient_device;
  pid_ = peer_.known && peer_.pid > 0 ? static_cast<uint32_t>(peer_.pid) : r.pid;
  hello_seconds_ = core_->clock().NowSeconds();  // bounds the session's reports
  hello_pid_ = r.pid;
  if (peer_.known) {
    core_->store().SetSessionOwner(id_, peer_.uid);
    core_->WatchPid(id_, peer_.pid);
  }
  return blocks_resumed;
}

Completion Session::HelloReply(const Request& r, const std::string& token,
                               uint64_t blocks_resumed, std::vector<uint64_t> resumed_ids) {
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
  return c;
}

absl::StatusOr<std::shared_ptr<copy::Region>> Session::FindRegion(uint64_t region_id) {
  base::MutexLock lock(mu_);
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
  spec.transient_device = transient_device_;
  spec.owner_uid = peer_.known ? static_cast<int64_t>(peer_.uid) : -1;
  if (spec.shm_name.empty() && spec.cuda_ipc_handle.empty()) {
    return Fail(r.request_id, absl::InvalidArgumentError(
                                  "register_region without a handle: set shm_name (shm backend) "
                                  "or cuda_ipc_handle (cuda backend)"));
  }
  if (absl::Status st = CheckShmOwner(peer_, spec.shm_name); !st.ok()) {
    return Fail(r.request_id, st);
  }
  if (absl::Status st = CheckHandleOwners(r); !st.ok()) return Fail(r.request_id, st);
  {
    base::MutexLock lock(mu_);
    if (regions_.size() >= kMaxRegionsPerSession) {
      lock.Unlock();
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
    base::MutexLock lock(mu_);
    region_id = next_region_id_++;
    regions_[region_id] = *std::move(region);
  }
  Completion c;
  c.request_id = r.request_id;
  c.kind = CompletionKind::kRegionRegistered;
  c.id = region_id;
  Send(std::move(c));
}

absl::Status Session::CheckHandleOwners(const Request& r) const {
  if (!peer_.known) return absl::OkStatus();
  std::vector<uint32_t> pids;
  {
    base::MutexLock lock(mu_);
    pids = {pid_, hello_pid_};
  }
  if (peer_.pid > 0) pids.push_back(static_cast<uint32_t>(peer_.pid));
  for (const std::string* handle : {&r.region.cuda_ipc_handle, &r.ready_event, &r.done_event}) {
    absl::Status st = copy::CheckSimHandleOwner(*handle, pids, peer_.uid);
    if (!st.ok()) return st;
  }
  return absl::OkStatus();
}

void Session::OnUnregister(const Request& r) {
  // Copies in flight keep their own reference; the region closes after them. The session's
  // reference dies after the lock is released: closing a region may block (a CUDA IPC handle
  // is closed on the device thread).
  std::shared_ptr<copy::Region> erased;
  {
    base::MutexLock lock(mu_);
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

OpContext Session::OpContextFor() {
  OpContext ctx;
  ctx.core = core_;
  ctx.owner = shared_from_this();
  ctx.session_id = id_;
  ctx.uid = peer_.known ? static_cast<int64_t>(peer_.uid) : -1;
  ctx.gate = gate_;
  base::MutexLock lock(mu_);
  ctx.device_id = device_id_;
  return ctx;
}

void Session::OnOffload(const Request& r) {
  if (absl::Status st = CheckHandleOwners(r); !st.ok()) return Fail(r.request_id, st);
  auto region = FindRegion(r.region_id);
  if (!region.ok()) return Fail(r.request_id, region.status());
  if (r.bytes == 0) {
    return Fail(r.request_id, absl::InvalidArgumentError(
                                  "offload of 0 bytes: send the checkpoint's size in bytes"));
  }
  if (!RangeInside(r.offset, r.bytes, (*region)->size_bytes())) {
    return Fail(r.request_id,
                absl::OutOfRangeError(absl::StrFormat(
                    "offload of [%d, +%d) is outside region %d of %d bytes: check the offset "
                    "and size against the registered allocation",
                    r.offset, r.bytes, r.region_id, (*region)->size_bytes())));
  }
  OffloadOp::Create(OpContextFor(), r, *std::move(region))->Start();
}

void Session::OnReload(const Request& r) {
  if (r.priority != kPriorityUrgent && r.priority != kPriorityPrefetch) {
    return Fail(r.request_id, absl::InvalidArgumentError(absl::StrFormat(
                                  "reload priority %d is not known: use URGENT (1) when the "
                                  "caller is blocked on the data or PREFETCH (2) when it is "
                                  "needed soon",
                                  r.priority)));
  }
  if (absl::Status st = CheckHandleOwners(r); !st.ok()) return Fail(r.request_id, st);
  auto region = FindRegion(r.region_id);
  if (!region.ok()) return Fail(r.request_id, region.status());
  ReloadOp::Create(OpContextFor(), r, *std::move(region))->Start();
}

void Session::Answer(Completion c) { Send(std::move(c)); }

void Session::AnswerError(uint64_t request_id, absl::Status status) {
  Fail(request_id, std::move(status));
}

bool Session::SessionClosed() const { return closed(); }

bool Session::ClaimTag(uint64_t tag) {
  base::MutexLock lock(mu_);
  return tags_.emplace(tag, TaggedBlock{}).second;
}

bool Session::ResolveTag(Request& r) {
  if (r.block_id != 0 || r.tag == 0) return true;
  {
    base::MutexLock lock(mu_);
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
  if (core_->draining()) {
    // A tagged offload that arrived during the drain was refused (UNAVAILABLE, which a resuming
    // client sends again) before it claimed its tag: NOT_FOUND here would fail this request for
    // good while its offload goes through after the resume.
    Fail(r.request_id, absl::UnavailableError(absl::StrFormat(
                           "offloadd is shutting down: the request naming tag %d was not carried "
                           "out; send it again when the daemon is back",
                           r.tag)));
    return false;
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
    base::MutexLock lock(mu_);
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
  base::MutexLock lock(mu_);
  auto it = block_tags_.find(block_id);
  if (it == block_tags_.end()) return;
  tags_.erase(it->second);
  block_tags_.erase(it);
}

void Session::FailAfterAnswer(uint64_t request_id, absl::Status status) {
  const absl::Status end = absl::DataLossError(absl::StrCat(
      "reload request ", request_id, " failed after the daemon recorded its done event (the ",
      "destination may hold bytes that never landed): ", status.message(),
      "; offloadd ended this session: fail the step and reconnect"));
  LOG(ERROR) << "session " << id_ << ": " << base::LogText(end.message(), 2048);
  // Ending waits for the session's copies: not on this (link or device) thread. The transfer
  // count keeps a shutdown from finishing under it.
  if (!core_->BeginTransfer()) return;  // shutting down: every session is being closed anyway
  std::thread([self = shared_from_this(), end] {
    self->End(EndCause::kCopyFailed, end);
    self->core_->EndTransfer();
  }).detach();
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

void Session::OnClientReport(const Request& r) {
  absl::StatusOr<ClientCounters> increase;
  {
    base::MutexLock lock(mu_);
    increase = ReportIncrease(client_report_, r.report,
                              core_->clock().NowSeconds() - hello_seconds_);
    if (increase.ok()) client_report_ = r.report;
  }
  if (!increase.ok()) return Fail(r.request_id, increase.status());
  // A probe's (transient_device) report stays with its session: per-GPU sums are training's.
  if (!transient_device_) {
    core_->AddClientReport(device_id_, peer_.known ? std::to_string(peer_.uid) : kUnknownUid,
                           *increase);
  }
  Completion c;
  c.request_id = r.request_id;
  c.kind = CompletionKind::kClientReportAck;
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
    base::MutexLock lock(mu_);
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
    base::MutexLock lock(mu_);
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
  if (counted) AuditSessionClose(info(), EndCauseName(cause));
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
  core_->engine().ReleaseOwner(id_);  // (cached client events; a simulated client's table)
  {
    // Every request still unanswered gets its answer now, then nothing more is sent.
    base::MutexLock lock(mu_);
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
    base::MutexLock lock(mu_);
    i.session_id = id_;
    i.client_name = client_name_;
    i.device_id = device_id_;
    i.pid = pid_;
    i.peer_known = peer_.known;
    i.uid = peer_.uid;
    i.gid = peer_.gid;
    i.requests_in_flight = requests_in_flight_;
    i.client_report = client_report_;
  }
  i.blocks = core_->store().SessionBlocks(id_);
  i.used_bytes = core_->store().SessionUsedBytes(id_);
  return i;
}

}  // namespace offloadd::session
