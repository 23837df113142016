#include "server/rpc/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "common/ring_format.h"
#include "glog/logging.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "grpcpp/server_posix.h"
#include "proto/offload.grpc.pb.h"
#include "server/base/log_limiter.h"
#include "server/base/worker_threads.h"
#include "server/metrics/metrics.h"
#include "server/rpc/peer_listener.h"
#include "server/rpc/projector_service.h"
#include "server/rpc/ring_frontend.h"
#include "server/rpc/stream_flow.h"
#include "server/rpc/translate.h"
#include "server/session/audit.h"

namespace offloadd::rpc {
namespace {

// libprotobuf logs an ERROR line for every message it fails to parse (e.g. "String field ...
// contains invalid UTF-8 data when parsing"), which a client could use to flood the daemon's
// log; SessionReactor logs such sessions itself (rate-limited). Protobuf's errors and warnings
// go to glog at most once per 10 s, with the count of those dropped; fatal ones always.
void RateLimitedProtobufLog(google::protobuf::LogLevel level, const char* file, int line,
                            const std::string& message) {
  static base::LogLimiter limiter(10.0);
  uint64_t dropped = 0;
  if (level != google::protobuf::LOGLEVEL_FATAL && !limiter.Allow(&dropped)) return;
  LOG(WARNING) << "libprotobuf " << file << ":" << line << ": " << message << " (" << dropped
               << " more protobuf messages dropped since the last one)";
}

// One client stream. Reads batches of requests and hands each to the Session: on the gRPC
// reaction that read it when none of the message's requests may block (an offload or reload
// into a registered region), else on a request worker (opening a region or waiting for a ready
// event must not block a reaction);
// completions from any thread are coalesced into one ServerMessage per write (at most one write
// in flight). Deleted after OnDone once no task of its own is queued or running.
// Messages travel as raw bytes and are parsed here, so a message that does not parse (bytes
// that are not a ClientMessage, a string field that is not UTF-8) ends the session with
// INVALID_ARGUMENT saying so, rather than looking like the client's half-close.
class SessionReactor : public grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  SessionReactor(session::Core* core, grpc::CallbackServerContext* ctx,
                 const std::atomic<bool>* shutting_down, session::PeerCredentials peer,
                 base::WorkerThreads* workers)
      : ctx_(ctx),
        shutting_down_(shutting_down),
        workers_(workers),
        ring_poll_seconds_(core->options().ring_poll_seconds) {
    auto opened = session::Session::Open(
        core, [this](session::Completion c) { Enqueue(std::move(c)); }, std::move(peer),
        [this](const absl::Status& status) { EndStream(status); });
    if (!opened.ok()) {  // too many streams await their Hello: no session, end at once
      {
        base::MutexLock lock(mu_);
        flow_.FinishAtOnce();
      }
      Finish(ToGrpcStatus(opened.status()));
      return;
    }
    session_ = *std::move(opened);
    {
      base::MutexLock lock(mu_);
      flow_.Start();
    }
    StartRead(&in_bytes_);
  }

  // A message read is parsed here and handled on this reaction when none of its requests may
  // block (Session::MayBlock; StreamFlow::RouteMessage), else on a request worker: opening a
  // region or waiting for a ready event may block, and so may closing the session after a
  // failed read or a message that did not parse. The cause of a failed read is read here: the
  // call's context is gone once OnDone ran.
  void OnReadDone(bool ok) override {
    if (!ok) {
      // The client half-closed, the stream broke, or the daemon is stopping.
      const session::EndCause cause = shutting_down_->load() ? session::EndCause::kShutdown
                                      : ctx_->IsCancelled()  ? session::EndCause::kCrashed
                                                             : session::EndCause::kClosed;
      PostTask([this, cause] { ReadClosed(cause); });
      return;
    }
    const size_t bytes = in_bytes_.Length();
    if (!ParseRead()) {
      PostTask([this, bytes] { EndBadMessage(bytes); });
      return;
    }
    next_request_ = 0;
    const bool none_may_block = NoneMayBlock();
    StreamFlow::Route route;
    {
      base::MutexLock lock(mu_);
      flow_.ReadDone(true);
      // No worker task can be posted between here and the end of HandleRequests below: the
      // read side is kHandling (not kReading, not kPaused) until then.
      route = flow_.RouteMessage(in_.requests_size(), none_may_block);
    }
    if (route == StreamFlow::Route::kInline) {
      HandleRequests();
    } else {
      PostTask([this] { HandleRequests(); });
    }
  }

  // Whether no request of in_ may block (Session::MayBlock); stops at the first that may.
  bool NoneMayBlock() const {
    if (in_.requests_size() > StreamFlow::kMaxInlineRequests) return false;
    for (const v1::Request& request : in_.requests()) {
      if (session_->MayBlock(FromProto(request))) return false;
    }
    return true;
  }

  // The read side ended (`cause`): the session closes (waits for its copies).
  void ReadClosed(session::EndCause cause) {
    session_->Close(cause);
    base::MutexLock lock(mu_);
    flow_.ReadDone(false);
    MaybeFinishLocked();
  }

  // Hands the message's requests to the session, kMaxRequestsPerMessage at a time; between
  // slices it stops (read side kPaused, resumed by OnWriteDone) while kMaxQueuedResponses
  // answers wait for a client that does not read, so a huge batch is answered request by
  // request without queueing unbounded answers. Reads the next message when all are handled.
  void HandleRequests() {
    for (;;) {
      const int end = std::min(in_.requests_size(), next_request_ + Server::kMaxRequestsPerMessage);
      for (; next_request_ < end; ++next_request_) {
        HandleOne(in_.requests(next_request_));
      }
      base::MutexLock lock(mu_);
      switch (flow_.SliceDone(next_request_ < in_.requests_size(),
                              out_pending_.responses_size() >= Server::kMaxQueuedResponses)) {
        case StreamFlow::AfterSlice::kStop:
        case StreamFlow::AfterSlice::kPause:
          return;
        case StreamFlow::AfterSlice::kNextSlice:
          continue;
        case StreamFlow::AfterSlice::kStartRead:
          in_.Clear();
          StartRead(&in_bytes_);
          return;
      }
    }
  }

  // One request of the stream to the session. The ring a Hello offers is remembered (attached
  // when that Hello is accepted, Enqueue); every Hello replaces the offer, so a Hello without a
  // ring never attaches one an earlier, refused Hello offered. A ring request id on the stream
  // of a session with a ring is refused, since its answer would go to the ring.
  void HandleOne(const v1::Request& request) {
    if (request.has_hello()) {
      base::MutexLock lock(mu_);
      ring_offer_ = request.hello().has_ring()
                        ? RingOffer{true, request.request_id(), request.hello().ring().fd()}
                        : RingOffer{};
    }
    if ((request.request_id() & common::kRingRequestIdBit) != 0 && ring_.load() != nullptr) {
      session::Completion refused;
      refused.request_id = request.request_id();
      refused.status = absl::InvalidArgumentError(
          "request ids with bit 63 set belong to the session's request ring: send this request "
          "on the ring, or clear bit 63 to send it on the stream");
      session_->CountRefused(refused.status);
      EnqueueOnStream(refused, nullptr);
      return;
    }
    (void)session_->Handle(FromProto(request));  // an ended session's stream is ending too
  }

  // Runs `task` on a request worker. At most one is queued or running per stream: one after a
  // read completes, one when a paused read side resumes (the read side is kHandling until it
  // returns, and no read is outstanding meanwhile).
  void PostTask(std::function<void()> task) {
    {
      base::MutexLock lock(mu_);
      flow_.WorkerTaskPosted();
    }
    workers_->Post([this, task = std::move(task)] {
      task();
      bool last;
      {
        base::MutexLock lock(mu_);
        last = flow_.WorkerTaskDone() == 0 && done_;
      }
      if (last) delete this;
    });
  }

  // One warning per bad message, at most one per 10 s for the whole daemon (a client can send
  // them as fast as it likes); the count of those not logged goes with the next one.
  void LogBadMessage(size_t bytes) {
    static base::Mutex mu;
    static double last_seconds = -1e9;
    static uint64_t suppressed = 0;
    const double now = base::SteadyNowSeconds();
    base::MutexLock lock(mu);
    if (now - last_seconds < 10) {
      ++suppressed;
      return;
    }
    last_seconds = now;
    const session::PeerCredentials& peer = session_->peer();
    LOG(WARNING) << "session " << session_->id() << " (pid " << peer.pid << ", uid " << peer.uid
                 << "): a ClientMessage of " << bytes
                 << " bytes did not parse; the session was ended (" << suppressed
                 << " more such sessions since the last warning)";
    suppressed = 0;
  }

  // Parses in_bytes_ into in_; false when the bytes are not a valid ClientMessage.
  bool ParseRead() {
    in_.Clear();
    grpc::Status parsed =
        grpc::SerializationTraits<v1::ClientMessage>::Deserialize(&in_bytes_, &in_);
    in_bytes_.Clear();
    return parsed.ok();
  }

  // A message of `bytes` did not parse: the session ends with a status saying why.
  void EndBadMessage(size_t bytes) {
    {
      base::MutexLock lock(mu_);
      flow_.ReadFailed();
    }
    LogBadMessage(bytes);
    session_->End(session::EndCause::kBadMessage,
                  absl::InvalidArgumentError(absl::StrFormat(
                      "offloadd could not parse a ClientMessage of %d bytes (malformed protobuf, "
                      "or a string field such as device_id or shm_name that is not valid "
                      "UTF-8): send UTF-8 strings in messages built from proto/offload.proto; "
                      "the session has ended and its blocks and regions were released",
                      bytes)));
  }

  void OnWriteDone(bool ok) override {
    bool resume = false;
    {
      base::MutexLock lock(mu_);
      if (flow_.WriteDone(ok)) out_pending_.Clear();  // the stream broke: nobody reads them
      if (out_pending_.responses_size() > 0) {
        StartBatchLocked();
      } else {
        MaybeFinishLocked();
      }
      resume = flow_.ResumeAfterWrite(out_pending_.responses_size() <
                                      Server::kMaxQueuedResponses);
    }
    if (resume) PostTask([this] { HandleRequests(); });  // the rest, then the next read
  }

  void OnDone() override {
    if (session_) session_->Close(session::EndCause::kCrashed);  // no-op if already closed
    bool last;
    {
      base::MutexLock lock(mu_);
      done_ = true;
      last = flow_.worker_tasks() == 0;
    }
    if (last) delete this;  // else the task still running deletes it
  }

 private:
  struct RingOffer {
    bool offered = false;
    uint64_t request_id = 0;  // the Hello's
    uint32_t fd = 0;
  };
  struct RingAnswer {
    bool offered = false;
    std::string error;  // empty: attached
  };

  // Called by the session (with its lock held) for every completion: those of ring requests go
  // to the ring once one is attached, the rest to the stream. Hello's answer attaches the ring
  // it offered first, so the ring serves before the client learns it may use it.
  void Enqueue(session::Completion c) {
    if ((c.request_id & common::kRingRequestIdBit) != 0) {
      if (RingFrontEnd* ring = ring_.load(); ring != nullptr) {
        ring->Complete(c);
        return;
      }
    }
    RingAnswer answer;
    if (c.kind == session::CompletionKind::kHello) {
      answer = MaybeAttachRing(c.request_id);
    } else if (c.kind == session::CompletionKind::kError) {
      ForgetRingOffer(c.request_id);  // a refused Hello attaches nothing, now or later
    }
    EnqueueOnStream(c, answer.offered ? &answer : nullptr);
  }

  void EnqueueOnStream(const session::Completion& c, const RingAnswer* ring) {
    base::MutexLock lock(mu_);
    if (!flow_.AcceptsAnswers()) return;
    v1::Response* response = out_pending_.add_responses();
    ToProto(c, response);
    if (ring != nullptr) {
      response->mutable_hello()->set_ring_attached(ring->error.empty());
      response->mutable_hello()->set_ring_error(ring->error);
    }
    if (flow_.AnswerQueued()) StartBatchLocked();
  }

  void ForgetRingOffer(uint64_t request_id) {
    base::MutexLock lock(mu_);
    if (ring_offer_.offered && ring_offer_.request_id == request_id) ring_offer_ = RingOffer{};
  }

  // Hello `request_id` was accepted: attaches the ring it offered, if any (RingFrontEnd::Attach
  // checks the object; its refusal is the answer's ring_error and the session goes on without).
  RingAnswer MaybeAttachRing(uint64_t request_id) {
    RingOffer offer;
    {
      base::MutexLock lock(mu_);
      if (!ring_offer_.offered || ring_offer_.request_id != request_id) return {};
      offer = ring_offer_;
      ring_offer_ = RingOffer{};
    }
    RingAnswer answer = AttachRing(offer);
    auto& m = metrics::Get();
    (answer.error.empty() ? m.ring_offers_attached_total : m.ring_offers_refused_total)
        ->Increment();
    return answer;
  }

  RingAnswer AttachRing(const RingOffer& offer) {
    const session::PeerCredentials& peer = session_->peer();
    if (!peer.known) {
      return {true, "the daemon does not know this connection's process (no peer credentials), "
                    "so it cannot open its ring: requests go on the stream"};
    }
    std::shared_ptr<session::Session> s = session_;
    auto ring = RingFrontEnd::Attach(
        peer.pid, offer.fd, peer.uid,
        [s](const session::Request& r) {
          return s->Handle(r) ? absl::OkStatus() : s->end_status();
        },
        [s](const absl::Status& why) { s->End(session::EndCause::kBadMessage, why); },
        RingFrontEnd::Waiting{.poll_seconds = ring_poll_seconds_},
        [s](const absl::Status& refused) { s->CountRefused(refused); });
    if (!ring.ok()) return {true, std::string(ring.status().message())};
    ring_owner_ = *std::move(ring);
    ring_.store(ring_owner_.get());
    ring_owner_->Start();  // after ring_ is set: every ring answer finds the ring
    return {true, ""};
  }
  // Writes what is queued, at most kMaxResponsesPerMessage responses per message so no reply
  // exceeds a client's receive limit (gRPC's default is 4 MiB).
  void StartBatchLocked() REQUIRES(mu_) {
    out_.Clear();
    auto* pending = out_pending_.mutable_responses();
    if (pending->size() <= Server::kMaxResponsesPerMessage) {
      out_.Swap(&out_pending_);
    } else {
      std::vector<v1::Response*> moved(Server::kMaxResponsesPerMessage);
      pending->ExtractSubrange(0, Server::kMaxResponsesPerMessage, moved.data());
      for (v1::Response* r : moved) out_.mutable_responses()->AddAllocated(r);
    }
    flow_.WriteStarted();
    bool own_buffer = false;
    out_bytes_.Clear();
    (void)grpc::SerializationTraits<v1::ServerMessage>::Serialize(out_, &out_bytes_, &own_buffer);
    StartWrite(&out_bytes_);
  }
  void MaybeFinishLocked() REQUIRES(mu_) {
    if (flow_.TakeFinish(out_pending_.responses_size() == 0)) Finish(finish_status_);
  }
  // The daemon ended the session (admin call, process exited): the session is already closed,
  // so nothing more is queued; finish once the write in flight is done. Called with the
  // session's lock held (reactions never run inline, so Finish cannot re-enter it).
  void EndStream(const absl::Status& status) {
    base::MutexLock lock(mu_);
    finish_status_ = ToGrpcStatus(status);
    flow_.RequestFinish();
    out_pending_.Clear();
    MaybeFinishLocked();
  }

  grpc::CallbackServerContext* ctx_;
  const std::atomic<bool>* shutting_down_;
  base::WorkerThreads* workers_;
  const double ring_poll_seconds_;  // CoreOptions::ring_poll_seconds, for the ring it attaches
  std::shared_ptr<session::Session> session_;
  // The session's request ring (ring_frontend.h), once attached: set once, by the Hello's
  // answer; destroyed (its thread stopped) with the reactor, after the session closed.
  std::unique_ptr<RingFrontEnd> ring_owner_;
  std::atomic<RingFrontEnd*> ring_{nullptr};
  grpc::ByteBuffer in_bytes_;  // being read
  v1::ClientMessage in_;       // parsed from in_bytes_
  int next_request_ = 0;       // in_'s next request to hand to the session
  base::Mutex mu_;
  v1::ServerMessage out_ GUARDED_BY(mu_);          // being written
  grpc::ByteBuffer out_bytes_ GUARDED_BY(mu_);     // out_, serialized
  v1::ServerMessage out_pending_ GUARDED_BY(mu_);  // responses queued since the last write started
  // Reading / writing / finishing states and the worker task count (stream_flow.h).
  StreamFlow flow_ GUARDED_BY(mu_);
  RingOffer ring_offer_ GUARDED_BY(mu_);  // the Hello being handled offered a ring
  bool done_ GUARDED_BY(mu_) = false;  // OnDone came: the last task deletes the reactor
  grpc::Status finish_status_ GUARDED_BY(mu_) = grpc::Status::OK;
};

// Session is a raw method (bytes parsed by SessionReactor); the unary calls are typed.
// FAILED_PRECONDITION when open session `id` holds blocks or has requests in flight (ending it
// fails its training step), else OK (an unknown id is EndSession's NOT_FOUND).
absl::Status RefuseBusySession(session::Core& core, uint64_t id) {
  for (const session::SessionInfo& s : core.Stats().sessions) {
    if (s.session_id != id || (s.blocks == 0 && s.requests_in_flight == 0)) continue;
    return absl::FailedPreconditionError(absl::StrFormat(
        "session %d (%s, device %s, pid %d) holds %d blocks (%d bytes) and has %d requests in "
        "flight: ending it fails its training step (its next reload gets DATA_LOSS); set force "
        "(offloadctl end-session --force) to end it anyway",
        id, s.client_name, s.device_id, s.pid, s.blocks, s.used_bytes, s.requests_in_flight));
  }
  return absl::OkStatus();
}

class OffloadService
    : public v1::Offload::WithRawCallbackMethod_Session<v1::Offload::WithCallbackMethod_GetStats<
          v1::Offload::WithCallbackMethod_EndSession<
              v1::Offload::WithCallbackMethod_CalibrateLinks<v1::Offload::Service>>>> {
 public:
  OffloadService(session::Core* core, const PeerListener* listener,
                 base::WorkerThreads* workers)
      : core_(core), listener_(listener), workers_(workers) {}
  // After the gRPC server (Server::Impl): the calibration thread has finished its call.
  ~OffloadService() override {
    if (calibration_thread_.joinable()) calibration_thread_.join();
  }

  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Session(
      grpc::CallbackServerContext* ctx) override {
    return new SessionReactor(core_, ctx, &shutting_down_, listener_->Lookup(ctx->peer()),
                              workers_);
  }

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx, const v1::GetStatsRequest*,
                                     v1::Stats* out) override {
    session::CoreStats stats = core_->Stats();
    const session::PeerCredentials caller = listener_->Lookup(ctx->peer());
    if (!session::IsAdmin(core_->options().access, caller)) {
      // Isolation: a user sees its own sessions and usage only.
      auto foreign = [&](const session::SessionInfo& i) {
        return !caller.known || !i.peer_known || i.uid != caller.uid;
      };
      stats.sessions.erase(std::remove_if(stats.sessions.begin(), stats.sessions.end(), foreign),
                           stats.sessions.end());
      for (auto it = stats.uid_used_bytes.begin(); it != stats.uid_used_bytes.end();) {
        it = caller.known && it->first == caller.uid ? std::next(it)
                                                     : stats.uid_used_bytes.erase(it);
      }
      out->set_sessions_filtered(true);
    }
    ToProto(stats, out);
    if (const projector::BlasCoreReport* blas = projector::BlasCoreInUse()) {
      ToProto(*blas, out->mutable_projector_blas());
    }
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  grpc::ServerUnaryReactor* EndSession(grpc::CallbackServerContext* ctx,
                                       const v1::EndSessionRequest* request,
                                       v1::EndSessionReply* reply) override {
    auto* reactor = ctx->DefaultReactor();
    const session::PeerCredentials caller = listener_->Lookup(ctx->peer());
    if (!session::IsAdmin(core_->options().access, caller)) {
      const std::string why = absl::StrFormat(
          "ending a session needs an admin (root, the daemon's uid, or a uid in admin_uids); "
          "this caller is uid %d",
          caller.uid);
      session::AuditEndSession(caller, request->session_id(), request->reason(),
                               absl::PermissionDeniedError(why), session::SessionInfo{});
      reactor->Finish(grpc::Status(grpc::StatusCode::PERMISSION_DENIED, why));
      return reactor;
    }
    const std::string reason = request->reason().empty() ? "no reason given" : request->reason();
    if (absl::Status busy = request->force() ? absl::OkStatus()
                                             : RefuseBusySession(*core_, request->session_id());
        !busy.ok()) {
      session::AuditEndSession(caller, request->session_id(), reason, busy, {});
      reactor->Finish(ToGrpcStatus(busy));
      return reactor;
    }
    auto ended = core_->EndSession(
        request->session_id(), session::EndCause::kAdmin,
        absl::AbortedError(absl::StrFormat(
            "an administrator (uid %d) ended this offloadd session: %s; its blocks and regions "
            "are released, reconnect to continue",
            caller.uid, reason)));
    session::AuditEndSession(caller, request->session_id(), reason, ended.status(),
                             ended.ok() ? *ended : session::SessionInfo{});
    if (!ended.ok()) {
      reactor->Finish(ToGrpcStatus(ended.status()));
      return reactor;
    }
    ToProto(*ended, reply->mutable_session());
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  // Measures on a thread of its own (it takes seconds; a reaction must not block), one at a
  // time; answers when done.
  grpc::ServerUnaryReactor* CalibrateLinks(grpc::CallbackServerContext* ctx,
                                           const v1::CalibrateLinksRequest* request,
                                           v1::LinkCalibration* reply) override {
    auto* reactor = ctx->DefaultReactor();
    const session::PeerCredentials caller = listener_->Lookup(ctx->peer());
    if (!session::IsAdmin(core_->options().access, caller)) {
      reactor->Finish(grpc::Status(
          grpc::StatusCode::PERMISSION_DENIED,
          absl::StrFormat("calibrating links needs an admin (root, the daemon's uid, or a uid in "
                          "admin_uids): it holds the GPUs' copies while it measures; this caller "
                          "is uid %d",
                          caller.uid)));
      return reactor;
    }
    const double budget = request->budget_seconds();
    base::MutexLock lock(calibration_mu_);
    if (calibrating_) {
      reactor->Finish(grpc::Status(grpc::StatusCode::ABORTED,
                                   "a link calibration is already running: wait for it (it ends "
                                   "within its budget)"));
      return reactor;
    }
    if (calibration_thread_.joinable()) calibration_thread_.join();  // past its last lock
    calibrating_ = true;
    LOG(INFO) << "link calibration asked for by uid " << caller.uid;
    calibration_thread_ = std::thread([this, reactor, reply, budget] {
      absl::StatusOr<session::LinkCalibrationReport> report = core_->CalibrateLinks(budget);
      if (report.ok()) ToProto(*report, reply);
      {
        base::MutexLock done(calibration_mu_);
        calibrating_ = false;
      }
      reactor->Finish(report.ok() ? grpc::Status::OK : ToGrpcStatus(report.status()));
    });
    return reactor;
  }

  std::atomic<bool> shutting_down_{false};

 private:
  session::Core* core_;
  const PeerListener* listener_;
  base::WorkerThreads* workers_;
  base::Mutex calibration_mu_;
  bool calibrating_ GUARDED_BY(calibration_mu_) = false;
  std::thread calibration_thread_ GUARDED_BY(calibration_mu_);
};

}  // namespace

absl::Status ClearStaleSocket(const std::string& path) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s exists and is not a socket: remove it or choose another socket_path", path));
  }
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  int err = errno;
  close(fd);
  if (rc == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "another offloadd is already listening on %s: stop it first, or start this one with "
        "--socket_path set to another path",
        path));
  }
  if (err != ECONNREFUSED && err != ENOENT) {
    return absl::FailedPreconditionError(
        absl::StrFormat("cannot probe existing socket %s: %s", path, strerror(err)));
  }
  if (unlink(path.c_str()) != 0 && errno != ENOENT) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "stale socket %s cannot be removed (%s): remove it by hand", path, strerror(errno)));
  }
  return absl::OkStatus();
}

struct Server::Impl {
  // First, so destroyed last: after the gRPC server, it runs the tasks still queued (each may
  // delete its reactor) and joins.
  std::unique_ptr<base::WorkerThreads> workers;
  std::unique_ptr<PeerListener> listener;
  std::unique_ptr<OffloadService> service;
  std::unique_ptr<ProjectorService> projector_service;
  projector::RefreshService* projector = nullptr;
  std::unique_ptr<grpc::Server> server;
  session::Core* core = nullptr;
  bool activated = false;  // the socket belongs to the service manager
  bool stopped = false;
  // Socket directories this daemon created (outermost first): removed at the stop when empty,
  // so a foreground run leaves no /run/offloadd behind (clients' default path follows it).
  std::vector<std::string> created_dirs;
};

namespace {
// mkdir -p of socket_path's directory; it must be writable by this user. Appends the
// directories it created to `created`.
absl::Status PrepareSocketDirectory(const std::string& socket_path,
                                    std::vector<std::string>& created) {
  const size_t slash = socket_path.rfind('/');
  // No directory part ("rel.sock"): the current directory, nothing to create (substr(0, npos)
  // would have been the socket path itself, made a directory).
  if (slash == std::string::npos || slash == 0) return absl::OkStatus();
  const std::string dir = socket_path.substr(0, slash);
  for (size_t i = 1; i <= dir.size(); ++i) {
    if (i == dir.size() || dir[i] == '/') {
      std::string part = dir.substr(0, i);
      if (mkdir(part.c_str(), 0755) == 0) {
        created.push_back(part);
      } else if (errno != EEXIST) {
        return absl::PermissionDeniedError(absl::StrFormat(
            "cannot create socket directory %s: %s; create it or choose another socket_path",
            part, strerror(errno)));
      }
    }
  }
  if (access(dir.c_str(), W_OK) != 0) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "socket directory %s is not writable by this user: run as its owner or choose another "
        "socket_path",
        dir));
  }
  return absl::OkStatus();
}

// HTTP/2 keepalive (gRPC channel arguments, doc/keepalive.md of gRPC): the daemon pings every
// connection keepalive_time_seconds after its last ping, also while the session stream is idle,
// and closes one whose ping is unanswered after keepalive_timeout_seconds (its sessions end as
// when a client crashes). Clients ping too (10 s): any rate is accepted -- no ping strikes, so
// a client is never sent GOAWAY for pinging, however short its interval.
void AddKeepalive(const session::ConnectionLimits& limits, grpc::ServerBuilder& builder) {
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PING_STRIKES, 0);
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 0);
  if (limits.keepalive_time_seconds <= 0) return;
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS,
                             static_cast<int>(limits.keepalive_time_seconds * 1000));
  builder.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
                             static_cast<int>(limits.keepalive_timeout_seconds * 1000));
  builder.AddChannelArgument(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}
}  // namespace

absl::StatusOr<std::unique_ptr<Server>> Server::Start(session::Core* core,
                                                      const std::string& socket_path,
                                                      uint32_t socket_mode, int64_t socket_gid,
                                                      projector::RefreshService* projector,
                                                      int listen_fd) {
  if (socket_path.size() > 107) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path %s is %d bytes; Unix socket paths are limited to 107: choose a shorter "
        "socket_path",
        socket_path, socket_path.size()));
  }
  std::vector<std::string> created_dirs;
  if (listen_fd < 0) {
    if (absl::Status st = PrepareSocketDirectory(socket_path, created_dirs); !st.ok()) return st;
    if (absl::Status st = ClearStaleSocket(socket_path); !st.ok()) return st;
  }
  google::protobuf::SetLogHandler(&RateLimitedProtobufLog);  // process-wide; see above

  auto impl = std::make_unique<Impl>();
  impl->created_dirs = std::move(created_dirs);
  impl->core = core;
  impl->activated = listen_fd >= 0;
  if (impl->activated) {
    impl->listener = PeerListener::FromListeningFd(listen_fd);
  } else {
    auto listener = PeerListener::Listen(socket_path, socket_mode, socket_gid);
    if (!listener.ok()) return listener.status();
    impl->listener = *std::move(listener);
  }
  impl->workers = std::make_unique<base::WorkerThreads>(Server::kRequestWorkerThreads);
  impl->service =
      std::make_unique<OffloadService>(core, impl->listener.get(), impl->workers.get());
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // No listening port: connections come from impl->listener (peer credentials).
  builder.RegisterService(impl->service.get());
  // The projector service: callers pass the sessions' access policy; their uid (when known)
  // limits which shm objects a refresh may name.
  impl->projector = projector;
  const PeerListener* peers = impl->listener.get();
  impl->projector_service = std::make_unique<ProjectorService>(
      projector, [core, peers](grpc::CallbackServerContext* ctx) -> absl::StatusOr<int64_t> {
        const session::PeerCredentials caller = peers->Lookup(ctx->peer());
        absl::Status allowed = session::CheckPeerAllowed(core->options().access, caller);
        if (!allowed.ok()) return allowed;
        return caller.known ? static_cast<int64_t>(caller.uid) : int64_t{-1};
      });
  builder.RegisterService(impl->projector_service.get());
  builder.SetMaxReceiveMessageSize(8 << 20);  // 4096 requests fit many times over
  // No bandwidth-delay-product probing: it grows each stream's HTTP/2 receive window (gRPC
  // buffers up to that much unread input per stream) toward megabytes when a client writes
  // faster than its session is handled. Only control messages travel here (tensor bytes move
  // through shared memory or CUDA IPC), so the default 64 KiB window costs nothing, and with
  // probing a 32-client flood grew the daemon's RSS by ~210 MiB instead of ~80 (BENCHMARKS.md
  // "Reliability", flood).
  builder.AddChannelArgument(GRPC_ARG_HTTP2_BDP_PROBE, 0);
  // Streams per connection (HTTP/2 SETTINGS_MAX_CONCURRENT_STREAMS; applies to the connections
  // handed over by the listener too): one connection cannot open unbounded session streams.
  if (const uint32_t streams = core->options().connections.max_streams_per_connection;
      streams > 0) {
    builder.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, static_cast<int>(streams));
  }
  AddKeepalive(core->options().connections, builder);
  impl->server = builder.BuildAndStart();
  if (!impl->server) {
    if (!impl->activated) unlink(socket_path.c_str());
    return absl::UnavailableError(absl::StrFormat(
        "gRPC could not start the server for unix:%s (see the log above)", socket_path));
  }
  grpc::Server* server = impl->server.get();
  const session::AccessPolicy access = core->options().access;
  impl->listener->Start(
      [server](int fd) { grpc::AddInsecureChannelFromFd(server, fd); }, core->options().connections,
      [access](const session::PeerCredentials& peer) { return session::IsAdmin(access, peer); });
  return std::unique_ptr<Server>(new Server(std::move(impl), socket_path));
}

Server::Server(std::unique_ptr<Impl> impl, std::string socket_path)
    : impl_(std::move(impl)), socket_path_(std::move(socket_path)) {}

Server::~Server() { Shutdown(); }

void Server::Shutdown() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->service->shutting_down_ = true;
  impl_->listener->Stop();  // new connections are refused from here on
  if (impl_->projector != nullptr) impl_->projector->Shutdown();
  // Copies already queued may finish for shutdown_grace_seconds (their completions go out on
  // open streams); after it, every session is closed: queued chunks are cancelled, running
  // ones finish, and each request not yet answered is answered UNAVAILABLE.
  session::Core* core = impl_->core;
  core->StopAccepting();
  const double grace = core->options().shutdown_grace_seconds;
  if (grace > 0 && !core->WaitTransfers(grace)) {
    const size_t closed = core->CloseSessions(session::EndCause::kShutdown);
    LOG(WARNING) << "offloadd: copies were still queued " << grace
                 << " s after the shutdown began (shutdown_grace_seconds); closed " << closed
                 << " sessions, cancelling their queued copies";
  }
  core->Drain();  // waits for the copies still running
  impl_->server->GetHealthCheckService()->Shutdown();
  // Give streams a moment to flush their last completions, then cancel what remains.
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  impl_->server->Wait();
  if (impl_->activated) return;
  unlink(socket_path_.c_str());
  for (auto it = impl_->created_dirs.rbegin(); it != impl_->created_dirs.rend(); ++it) {
    if (rmdir(it->c_str()) != 0) break;  // not empty: someone else uses it now
  }
}

bool Server::socket_activated() const { return impl_->activated; }

}  // namespace offloadd::rpc
