#include "client/offloadd_client.h"

#include <glog/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/support/client_callback.h>
#include <pthread.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "client/socket_path.h"

namespace offloadd {
namespace client {
namespace {

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(
             std::chrono::duration<double>(seconds));
}

absl::Status StatusFromError(const v1::Error& error) {
  if (error.code() <= 0 || error.code() > static_cast<int>(absl::StatusCode::kUnauthenticated)) {
    return absl::UnknownError(absl::StrCat("offloadd returned an error with invalid code ",
                                           error.code(), ": ", error.message()));
  }
  return absl::Status(static_cast<absl::StatusCode>(error.code()), error.message());
}

// grpc.health.v1.HealthCheckRequest { string service = 1; } encoded by hand (no generated C++
// health proto on Debian): tag (1 << 3 | 2), varint length, bytes.
std::string EncodeHealthCheckRequest(absl::string_view service) {
  std::string out;
  if (service.empty()) return out;  // proto3: default value is not encoded
  out.push_back(0x0a);
  for (uint64_t n = service.size();; n >>= 7) {
    if (n < 0x80) {
      out.push_back(static_cast<char>(n));
      break;
    }
    out.push_back(static_cast<char>((n & 0x7f) | 0x80));
  }
  out.append(service.data(), service.size());
  return out;
}

bool ReadVarint(absl::string_view* in, uint64_t* value) {
  *value = 0;
  for (int shift = 0; shift < 64 && !in->empty(); shift += 7) {
    uint8_t byte = static_cast<uint8_t>((*in)[0]);
    in->remove_prefix(1);
    *value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if ((byte & 0x80) == 0) return true;
  }
  return false;
}

// grpc.health.v1.HealthCheckResponse { ServingStatus status = 1; }: returns the status enum
// (0 UNKNOWN, 1 SERVING, 2 NOT_SERVING, 3 SERVICE_UNKNOWN), skipping unknown fields.
absl::StatusOr<int> DecodeHealthCheckResponse(absl::string_view in) {
  int status = 0;
  while (!in.empty()) {
    uint64_t tag, value;
    if (!ReadVarint(&in, &tag)) return absl::InternalError("malformed health reply (tag)");
    switch (tag & 7) {
      case 0:
        if (!ReadVarint(&in, &value)) return absl::InternalError("malformed health reply");
        if ((tag >> 3) == 1) status = static_cast<int>(value);
        break;
      case 1:
      case 5: {
        size_t n = (tag & 7) == 1 ? 8 : 4;
        if (in.size() < n) return absl::InternalError("malformed health reply (fixed)");
        in.remove_prefix(n);
        break;
      }
      case 2:
        if (!ReadVarint(&in, &value) || in.size() < value) {
          return absl::InternalError("malformed health reply (length)");
        }
        in.remove_prefix(value);
        break;
      default:
        return absl::InternalError("malformed health reply (wire type)");
    }
  }
  return status;
}

// The ring entry of a per-tensor request as the daemon must see it (WireLocked applied).
common::SubmissionEntry RingEntry(const v1::Request& wire) {
  common::SubmissionEntry e;
  std::memset(&e, 0, sizeof(e));
  e.request_id = wire.request_id();
  auto event = [](const std::string& bytes, uint8_t* out, uint8_t* length) {
    if (bytes.size() != common::kRingEventBytes) return;
    std::memcpy(out, bytes.data(), bytes.size());
    *length = common::kRingEventBytes;
  };
  if (wire.has_offload()) {
    const v1::OffloadRequest& o = wire.offload();
    e.kind = static_cast<uint32_t>(common::SubmissionKind::kOffload);
    e.region_id = o.region_id();
    e.offset_bytes = o.offset();
    e.size_bytes = o.bytes();
    e.tag = o.tag();
    event(o.ready_event(), e.ready_event, &e.ready_event_bytes);
    if (o.has_ordering()) {
      e.flags = common::kSubmitOrdering;
      e.order_step = o.ordering().step();
      e.order_position = o.ordering().position();
    }
  } else if (wire.has_reload()) {
    const v1::ReloadRequest& r = wire.reload();
    e.kind = static_cast<uint32_t>(common::SubmissionKind::kReload);
    e.block_id = r.block_id();
    e.tag = r.tag();
    e.region_id = r.region_id();
    e.offset_bytes = r.offset();
    e.priority = static_cast<uint32_t>(r.priority());
    e.flags = r.release_after() ? common::kSubmitReleaseAfter : 0;
    e.deadline_seconds = r.deadline_seconds();
    event(r.ready_event(), e.ready_event, &e.ready_event_bytes);
    event(r.done_event(), e.done_event, &e.done_event_bytes);
  } else {
    e.kind = static_cast<uint32_t>(common::SubmissionKind::kRelease);
    e.block_id = wire.release().block_id();
    e.tag = wire.release().tag();
  }
  return e;
}

// The Response a ring answer stands for (the same bodies the stream carries).
v1::Response ResponseFromRing(const common::CompletionEntry& c) {
  v1::Response r;
  r.set_request_id(c.request_id);
  switch (static_cast<common::CompletionKind>(c.kind)) {
    case common::CompletionKind::kOffloadDone: {
      v1::OffloadDone* d = r.mutable_offload_done();
      d->set_block_id(c.block_id);
      d->set_bytes(c.bytes);
      d->set_queued_seconds(c.queued_seconds);
      d->set_copy_seconds(c.copy_seconds);
      break;
    }
    case common::CompletionKind::kReloadDone: {
      v1::ReloadDone* d = r.mutable_reload_done();
      d->set_block_id(c.block_id);
      d->set_bytes(c.bytes);
      d->set_released((c.flags & common::kCompleteReleased) != 0);
      d->set_copy_seconds(c.copy_seconds);
      d->set_done_event_recorded((c.flags & common::kCompleteDoneEventRecorded) != 0);
      break;
    }
    case common::CompletionKind::kReleased:
      r.mutable_released()->set_block_id(c.block_id);
      break;
    default:
      r.mutable_error()->set_code(c.kind == static_cast<uint32_t>(common::CompletionKind::kError)
                                      ? c.status_code
                                      : static_cast<int>(absl::StatusCode::kInternal));
      r.mutable_error()->set_message(
          std::string(c.message, std::min<size_t>(c.message_bytes, sizeof(c.message))));
  }
  return r;
}

absl::Status LostBlock(uint64_t block, absl::string_view target) {
  return absl::DataLossError(absl::StrCat(
      "block ", block, " was confirmed stored, but the restarted offloadd daemon at ", target,
      " did not have it (its record failed the check at adoption): it is lost"));
}

// The keepalive channel arguments of ClientOptions (gRPC doc/keepalive.md): pings also
// without data frames between them, and while no call is open.
void SetKeepalive(const ClientOptions& options, grpc::ChannelArguments& args) {
  if (options.keepalive_time_seconds <= 0) return;
  args.SetInt(GRPC_ARG_KEEPALIVE_TIME_MS, static_cast<int>(options.keepalive_time_seconds * 1000));
  args.SetInt(GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
              static_cast<int>(options.keepalive_timeout_seconds * 1000));
  // Newer gRPC times a keepalive ping out by this one instead (older ones ignore it).
  args.SetInt("grpc.http2.ping_timeout_ms",
              static_cast<int>(options.keepalive_timeout_seconds * 1000));
  args.SetInt(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  args.SetInt(GRPC_ARG_HTTP2_MAX_PINGS_WITHOUT_DATA, 0);
}

// A new request ring to offer in Hello when `options` ask for one; null otherwise, or when it
// cannot be made (*error then says why).
std::shared_ptr<RingCore> OfferRing(const ClientOptions& options, std::string* error) {
  if (!options.use_ring) return nullptr;
  return RingCore::Create(options.ring_entries, options.ring_entries, error);
}

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::string path = options.socket_path.empty() ? DefaultSocketPath() : options.socket_path;
  if (!SocketPathFits(path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", path, "\" is empty or longer than ", kMaxSocketPathBytes,
                     " bytes (the Unix socket limit); choose a shorter ClientOptions.socket_path"));
  }
  // A socket this user may not open is refused at once: waiting for it cannot help.
  if (const int probe = ProbeUnixSocket(path); probe == EACCES || probe == EPERM) {
    return absl::PermissionDeniedError(absl::StrCat("cannot connect to offloadd at unix:", path,
                                                    ": ", PermissionDeniedReason(path)));
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // own connection per Client
  args.SetMaxReceiveMessageSize(-1);                   // Stats grows with sessions and links
  SetKeepalive(options, args);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(DeadlineIn(options.connect_timeout_seconds))) {
    return absl::UnavailableError(absl::StrCat(
        "could not connect to offloadd at unix:", path, " within ", options.connect_timeout_seconds,
        " s: ", UnreachableSocketReason(path, ProbeUnixSocket(path)),
        "; start the daemon (e.g. systemctl start offloadd) or point the client at its socket "
        "(ClientOptions.socket_path; offloadctl --socket PATH or $OFFLOADD_SOCKET)"));
  }
  std::string ring_error;
  std::shared_ptr<RingCore> ring = OfferRing(options, &ring_error);
  // The ring is the client's before Start() runs the session thread, which stops it (StopRing)
  // as soon as the stream ends.
  std::unique_ptr<Client> client(
      new Client(options, std::move(path), std::move(channel), std::move(ring)));
  client->Start();
  if (absl::Status hello = client->SayHello(ring_error); !hello.ok()) return hello;
  return client;
}

absl::Status Client::SayHello(const std::string& ring_error) {
  v1::Request request;
  v1::Hello* hello = request.mutable_hello();
  hello->set_client_name(options_.client_name);
  hello->set_device_id(options_.device_id);
  hello->set_pid(options_.pid != 0 ? options_.pid : static_cast<uint32_t>(getpid()));
  if (!options_.resume_token.empty()) hello->set_resume_token(options_.resume_token);
  hello->set_transient_device(options_.transient_device);
  {
    base::MutexLock lock(mu_);
    if (ring_ != nullptr) hello->mutable_ring()->set_fd(ring_->fd());
  }
  Reply<absl::StatusOr<v1::HelloReply>> reply = Submit<absl::StatusOr<v1::HelloReply>>(
      std::move(request), v1::Response::kHello,
      [](const v1::Response& r) { return absl::StatusOr<v1::HelloReply>(r.hello()); },
      /*flush=*/true);
  if (reply.wait_for(std::chrono::duration<double>(options_.connect_timeout_seconds)) !=
      std::future_status::ready) {
    CancelStream();  // Close() then returns at once
    return absl::DeadlineExceededError(absl::StrCat(
        "offloadd at ", target_, " accepted the connection but sent no HelloReply within ",
        options_.connect_timeout_seconds, " s; check the daemon's log"));
  }
  absl::StatusOr<v1::HelloReply> result = reply.get();
  if (!result.ok()) return result.status();
  AdoptHello(*std::move(result), ring_error);
  return absl::OkStatus();
}

void Client::AdoptHello(v1::HelloReply reply, const std::string& ring_error) {
  base::MutexLock lock(mu_);
  hello_ = std::move(reply);
  token_ = hello_.resume_token();
  if (!ring_error.empty()) hello_.set_ring_error(ring_error);  // not even offered
  // The stream may have ended already and the session thread stopped the ring: StopRing sets
  // ring_stop_ and takes ring_thread_ in one critical section, so deciding and starting here,
  // under mu_ too, either starts a thread that StopRing will join or starts none.
  if (ring_ != nullptr && hello_.ring_attached() && !ring_stop_.load()) {
    StartRingLocked();
  } else if (!hello_.ring_attached()) {
    ring_.reset();  // refused (or never offered): closed, the session uses the stream
  }
}

namespace {

// Names the calling thread (at most 15 bytes), so that an operator or a test tells the client's
// own threads from gRPC's in /proc/<pid>/task/*/comm, top -H or gdb.
void NameThisThread(const char* name) { pthread_setname_np(pthread_self(), name); }

}  // namespace

void Client::StartRingLocked() {
  ring_active_ = true;
  ring_thread_ = std::thread([this, ring = ring_] {
    NameThisThread("offloadd-ring");
    RingLoop(ring);
  });
}

absl::StatusOr<std::unique_ptr<Client>> Client::Resume(ClientOptions options,
                                                       absl::string_view resume_token) {
  options.resume_token = std::string(resume_token);
  const auto start = std::chrono::steady_clock::now();
  auto elapsed = [&start] {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double backoff = std::max(options.reconnect_initial_backoff_seconds, 0.001);
  const double total = options.reconnect_total_seconds;
  const double connect_timeout = options.connect_timeout_seconds;
  for (;;) {
    options.connect_timeout_seconds =
        std::max(0.001, std::min(connect_timeout, total - elapsed()));
    absl::StatusOr<std::unique_ptr<Client>> client = Connect(options);
    const bool retry = !client.ok() && (absl::IsUnavailable(client.status()) ||
                                        absl::IsDeadlineExceeded(client.status()));
    if (!retry) return client;
    if (elapsed() + backoff >= total) {
      return absl::Status(client.status().code(),
                          absl::StrCat("offloadd did not come back within ", total,
                                       " s (reconnect_total_seconds): ",
                                       client.status().message()));
    }
    std::this_thread::sleep_for(std::chrono::duration<double>(backoff));
    backoff = std::min(backoff * 2, std::max(options.reconnect_max_backoff_seconds, backoff));
  }
}

uint64_t Client::session_id() const {
  base::MutexLock lock(mu_);
  return hello_.session_id();
}
bool Client::ring_attached() const {
  base::MutexLock lock(mu_);
  return hello_.ring_attached();
}
bool Client::ring_active() const {
  base::MutexLock lock(mu_);
  return ring_active_;
}
std::string Client::ring_error() const {
  base::MutexLock lock(mu_);
  return hello_.ring_error();
}
std::string Client::backend() const {
  base::MutexLock lock(mu_);
  return hello_.backend();
}
uint64_t Client::pool_capacity_bytes() const {
  base::MutexLock lock(mu_);
  return hello_.pool_capacity_bytes();
}
uint64_t Client::session_quota_bytes() const {
  base::MutexLock lock(mu_);
  return hello_.session_quota_bytes();
}
uint64_t Client::chunk_bytes() const {
  base::MutexLock lock(mu_);
  return hello_.chunk_bytes();
}
std::string Client::link() const {
  base::MutexLock lock(mu_);
  return hello_.link();
}
std::string Client::resume_token() const {
  base::MutexLock lock(mu_);
  return token_;  // the current session's: a resume that began a new session changed it
}
uint64_t Client::blocks_resumed() const {
  base::MutexLock lock(mu_);
  return hello_.blocks_resumed();
}
double Client::hello_resume_grace_seconds() const {
  base::MutexLock lock(mu_);
  return hello_.resume_grace_seconds();
}

// One Session stream on gRPC's callback API. It owns what its call needs (channel, stub,
// context) and forwards its reactions to the Client; it keeps one read posted until a read
// fails. The hold it adds before StartCall lets the Client start writes from outside the
// reactions; the Client releases it (NextStepLocked) once it will start no more, and only then
// can OnDone run. Deleted only after OnDone.
class Client::SessionStream final
    : public grpc::ClientBidiReactor<v1::ClientMessage, v1::ServerMessage> {
 public:
  SessionStream(Client* client, std::shared_ptr<grpc::Channel> channel)
      : client_(client), channel_(std::move(channel)), stub_(v1::Offload::NewStub(channel_)) {}

  const std::shared_ptr<grpc::Channel>& channel() const { return channel_; }
  // Binds the call, adds the hold, posts the first read and starts the call.
  void Begin() {
    stub_->async()->Session(&context_, this);
    AddHold();
    StartRead(&read_);
    StartCall();
  }
  // Starts writing `message`: at most one write in flight (the Client's writing_).
  void Write(v1::ClientMessage message) {
    write_ = std::move(message);
    StartWrite(&write_);
  }
  void Cancel() { context_.TryCancel(); }

  void OnReadDone(bool ok) override {
    client_->OnStreamRead(this, ok ? &read_ : nullptr);
    if (!ok) return;
    read_.Clear();
    StartRead(&read_);
  }
  void OnWriteDone(bool ok) override { client_->OnStreamWritten(this, ok); }
  void OnDone(const grpc::Status& status) override { client_->OnStreamDone(this, status); }

 private:
  Client* const client_;
  const std::shared_ptr<grpc::Channel> channel_;
  const std::unique_ptr<v1::Offload::Stub> stub_;
  grpc::ClientContext context_;
  v1::ServerMessage read_;   // the posted read's message
  v1::ClientMessage write_;  // the write in flight
};

Client::Client(const ClientOptions& options, std::string socket_path,
               std::shared_ptr<grpc::Channel> channel, std::shared_ptr<RingCore> ring)
    : options_(options),
      socket_path_(std::move(socket_path)),
      target_("unix:" + socket_path_),
      channel_(std::move(channel)),
      ring_(std::move(ring)) {}

void Client::Start() {
  SessionStream* stream;
  {
    base::MutexLock lock(mu_);
    stream_ = std::make_unique<SessionStream>(this, channel_);
    stream = stream_.get();
    holding_ = true;
  }
  stream->Begin();  // its reactions may run at once, and take mu_
  session_thread_ = std::thread([this] {
    NameThisThread("offloadd-stream");
    SessionLoop();
  });
}

Client::~Client() { Close(); }

void Client::Close() {
  base::MutexLock close_lock(close_mu_);
  StreamStep step;
  {
    base::MutexLock lock(mu_);
    closing_ = true;   // no new requests; a resume in progress gives up
    cv_.notify_all();
    // What is queued goes out, then WritesDone (now, or from the last write's OnWriteDone).
    step = NextStepLocked();
  }
  RunStep(std::move(step));
  bool finished;
  {
    base::MutexLock lock(mu_);
    const auto deadline = base::CondVar::DeadlineIn(options_.close_timeout_seconds);
    while (!finished_ && cv_.WaitUntil(mu_, deadline)) {
    }
    finished = finished_;
  }
  if (!finished) {
    LOG(WARNING) << "offloadd at " << target_ << " did not end the session within "
                 << options_.close_timeout_seconds << " s of Close(); cancelling it";
    CancelStream();
  }
  if (session_thread_.joinable()) session_thread_.join();
}

void Client::CancelStream() {
  SessionStream* stream = nullptr;
  {
    base::MutexLock lock(mu_);
    // While a resume is under way the old stream has ended already (and the resume gives up on
    // closing_); otherwise nothing replaces stream_ before the session thread sees it end.
    if (!reconnecting_ && !stream_done_) stream = stream_.get();
  }
  if (stream != nullptr) stream->Cancel();  // without mu_: reactions may run inline
}

void Client::TakeMessageLocked(v1::ClientMessage* message) {
  size_t message_bytes = 0;
  while (!outbox_.empty() && message->requests_size() < kMaxRequestsPerMessage) {
    size_t request_bytes = outbox_.front().ByteSizeLong() + 4;
    if (message->requests_size() > 0 && message_bytes + request_bytes > kMaxMessageBytes) break;
    message_bytes += request_bytes;
    *message->add_requests() = std::move(outbox_.front());
    outbox_.pop_front();
  }
  if (outbox_.empty()) flush_ = false;
  ++counters_.messages_sent;
  counters_.requests_sent += message->requests_size();
  writing_ = true;
}

Client::StreamStep Client::NextStepLocked() {
  StreamStep step;
  // After the hold is gone nothing may be started from outside a reaction; a write in flight
  // chooses the next step from its OnWriteDone.
  if (!holding_ || writing_) return step;
  step.stream = stream_.get();
  if (stream_ended_) {
    holding_ = false;
    step.kind = StreamStep::kReleaseHold;
  } else if (!outbox_.empty() && (batch_depth_ == 0 || flush_ || closing_)) {
    step.kind = StreamStep::kWrite;
    TakeMessageLocked(&step.message);
  } else if (closing_ && outbox_.empty()) {
    holding_ = false;
    step.kind = StreamStep::kWritesDone;
  }
  return step;
}

void Client::RunStep(StreamStep step) {
  switch (step.kind) {
    case StreamStep::kNone:
      return;
    case StreamStep::kWrite:
      step.stream->Write(std::move(step.message));
      return;
    case StreamStep::kWritesDone:
      step.stream->StartWritesDone();
      step.stream->RemoveHold();
      return;
    case StreamStep::kReleaseHold:
      step.stream->RemoveHold();
      return;
  }
}

void Client::OnStreamRead(SessionStream* stream, v1::ServerMessage* message) {
  std::vector<std::pair<Completer, v1::Response>> ready;
  StreamStep step;
  {
    base::MutexLock lock(mu_);
    if (stream != stream_.get()) {  // a resume's stream, before Install
      if (handshake_ != nullptr && handshake_->stream.get() == stream) {
        if (message == nullptr) {
          handshake_->read_ended = true;
        } else {
          TakeHandshakeAnswersLocked(*message);
        }
        cv_.notify_all();
      }
      return;
    }
    if (message == nullptr) {  // the stream ended: no write starts after this one
      stream_ended_ = true;
      step = NextStepLocked();
    } else {
      TakeAnswersLocked(message, &ready);
    }
  }
  for (auto& [done, response] : ready) done(&response, absl::OkStatus());
  RunStep(std::move(step));
}

void Client::OnStreamWritten(SessionStream* stream, bool ok) {
  StreamStep step;
  {
    base::MutexLock lock(mu_);
    if (stream != stream_.get()) {
      if (handshake_ != nullptr && handshake_->stream.get() == stream) {
        handshake_->written = true;
        handshake_->write_ok = ok;
        cv_.notify_all();
      }
      return;
    }
    writing_ = false;
    if (!ok) stream_ended_ = true;  // the stream is over: its read fails too
    step = NextStepLocked();
  }
  RunStep(std::move(step));
}

void Client::OnStreamDone(SessionStream* stream, const grpc::Status& status) {
  base::MutexLock lock(mu_);
  if (stream == stream_.get()) {
    stream_done_ = true;
    stream_final_ = status;
  } else if (handshake_ != nullptr && handshake_->stream.get() == stream) {
    handshake_->done = true;
  }
  cv_.notify_all();
}

void Client::TakeAnswersLocked(v1::ServerMessage* message,
                               std::vector<std::pair<Completer, v1::Response>>* ready) {
  ++counters_.messages_received;
  counters_.responses_received += message->responses_size();
  for (v1::Response& response : *message->mutable_responses()) {
    auto it = pending_.find(response.request_id());
    if (it == pending_.end()) {
      ++counters_.unknown_responses;
      LOG(WARNING) << "offloadd answered unknown request id " << response.request_id();
      continue;
    }
    // UNAVAILABLE for one request: the daemon is shutting down (an upgrade). With a session
    // to resume, the request counts as not answered and is sent again after the resume.
    if (response.has_error() &&
        response.error().code() == static_cast<int>(absl::StatusCode::kUnavailable) &&
        !it->second.internal && options_.auto_resume && hello_.resume_grace_seconds() > 0) {
      continue;
    }
    AccountLocked(it->second, &response);
    ready->emplace_back(std::move(it->second.done), std::move(response));
    pending_.erase(it);
  }
}

void Client::TakeHandshakeAnswersLocked(const v1::ServerMessage& message) {
  Handshake& h = *handshake_;
  for (const v1::Response& r : message.responses()) {
    if (r.body_case() == v1::Response::kError) {
      if (h.error.ok()) h.error = StatusFromError(r.error());
    } else if (r.request_id() == h.hello_id && r.has_hello()) {
      h.hello = r.hello();
      h.hello_answered = true;
    } else if (r.has_region_registered()) {
      auto it = h.region_of_request.find(r.request_id());
      if (it == h.region_of_request.end()) continue;
      h.daemon_region[it->second] = r.region_registered().region_id();
      h.region_of_request.erase(it);
    }
  }
}

void Client::SessionLoop() {
  for (;;) {
    grpc::Status final_status;
    {
      base::MutexLock lock(mu_);
      while (!stream_done_) cv_.Wait(mu_);
      final_status = stream_final_;
    }
    StopRing();  // the daemon answered on the ring before it ended the stream
    absl::Status failure;
    bool resume;
    {
      base::MutexLock lock(mu_);
      if (!ring_failure_.ok()) {  // the client ended the session (RingLoop): not resumed
        failure = ring_failure_;
        resume = false;
      } else if (closing_) {
        failure = ClosedLocked();
        resume = false;
      } else {
        failure = absl::UnavailableError(absl::StrCat(
            "the offloadd daemon at ", target_, " went away (session stream ended with ",
            absl::StatusCodeToString(static_cast<absl::StatusCode>(final_status.error_code())),
            final_status.error_message().empty() ? "" : ": ", final_status.error_message(),
            "); its blocks and regions are gone: reconnect with Client::Connect"));
        // Only a daemon that went away (UNAVAILABLE: killed, crashed, shutting down) is waited
        // for; a session it ended on purpose (ABORTED by an admin, a bad message) is not resumed.
        resume = options_.auto_resume && hello_.resume_grace_seconds() > 0 &&
                 final_status.error_code() == grpc::StatusCode::UNAVAILABLE;
        reconnecting_ = resume;
      }
    }
    if (resume && ResumeAfterBreak(&failure)) continue;
    {
      // A resume that gave up because Close() began ends the session as a Close() does.
      base::MutexLock lock(mu_);
      if (closing_) failure = ClosedLocked();
    }
    FailAll(failure);
    return;
  }
}

absl::Status Client::ClosedLocked() {
  if (stream_status_.ok()) {
    stream_status_ = absl::FailedPreconditionError("Client::Close() was called");
  }
  return absl::CancelledError(
      absl::StrCat("the client was closed before offloadd at ", target_, " answered this request"));
}

void Client::FailAll(const absl::Status& failure) {
  absl::flat_hash_map<uint64_t, Pending> orphans;
  {
    base::MutexLock lock(mu_);
    if (stream_status_.ok()) stream_status_ = failure;
    reconnecting_ = false;
    orphans.swap(pending_);
    outbox_.clear();
  }
  for (auto& [id, p] : orphans) p.done(nullptr, failure);
  base::MutexLock lock(mu_);
  finished_ = true;
  cv_.notify_all();
}

bool Client::ResumeAfterBreak(absl::Status* failure) {
  const double window = options_.resume_window_seconds > 0 ? options_.resume_window_seconds
                                                           : hello_resume_grace_seconds();
  const auto start = std::chrono::steady_clock::now();
  auto left = [&] {
    return window -
           std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  };
  double backoff = std::max(options_.reconnect_initial_backoff_seconds, 0.001);
  for (;;) {
    std::string token;
    absl::flat_hash_map<uint64_t, RegionHandle> regions;
    bool holds_blocks;
    {
      base::MutexLock lock(mu_);
      if (closing_) return false;
      token = token_;
      regions = regions_;
      holds_blocks = !confirmed_.empty();
    }
    if (left() <= 0) {
      *failure = absl::UnavailableError(absl::StrCat(
          "the offloadd daemon at ", target_, " went away and did not come back within ", window,
          " s (resume_window_seconds / the daemon's resume_grace_seconds): ",
          failure->message()));
      return false;
    }
    const absl::Status s =
        OpenResumed(token, regions, std::min(options_.connect_timeout_seconds, left()));
    if (s.ok()) {
      Install();
      return true;
    }
    if (absl::IsNotFound(s) && !token.empty()) {
      if (holds_blocks) {
        *failure = absl::DataLossError(absl::StrCat(
            "the offloadd daemon at ", target_, " no longer holds this session's blocks (",
            s.message(),
            "): it restarted without them, or it ended the session when the connection broke (a "
            "daemon frozen past the keepalive timeout); they are lost: Connect anew"));
        return false;
      }
      base::MutexLock lock(mu_);
      token_.clear();  // nothing confirmed, nothing lost: a new session will do
      continue;
    }
    if (!absl::IsUnavailable(s) && !absl::IsDeadlineExceeded(s) && !absl::IsCancelled(s)) {
      *failure = s;
      return false;
    }
    *failure = s;
    base::MutexLock lock(mu_);
    const auto retry_at = base::CondVar::DeadlineIn(std::min(backoff, std::max(left(), 0.0)));
    while (!closing_ && cv_.WaitUntil(mu_, retry_at)) {
    }
    backoff = std::min(backoff * 2, std::max(options_.reconnect_max_backoff_seconds, backoff));
  }
}

v1::ClientMessage Client::ResumeMessage(const std::string& token,
                                        const absl::flat_hash_map<uint64_t, RegionHandle>& regions,
                                        Handshake* h) {
  h->ring = OfferRing(options_, &h->ring_error);  // closed with *h unless Install adopts it
  v1::ClientMessage message;
  v1::Request* hello = message.add_requests();
  hello->set_request_id(next_request_id_.fetch_add(1, std::memory_order_relaxed));
  hello->mutable_hello()->set_client_name(options_.client_name);
  hello->mutable_hello()->set_device_id(options_.device_id);
  hello->mutable_hello()->set_pid(options_.pid != 0 ? options_.pid
                                                    : static_cast<uint32_t>(getpid()));
  if (!token.empty()) hello->mutable_hello()->set_resume_token(token);
  if (h->ring != nullptr) hello->mutable_hello()->mutable_ring()->set_fd(h->ring->fd());
  h->hello_id = hello->request_id();
  for (const auto& [region, handle] : regions) {
    v1::Request* r = message.add_requests();
    r->set_request_id(next_request_id_.fetch_add(1, std::memory_order_relaxed));
    v1::RegionHandle* rh = r->mutable_register_region()->mutable_handle();
    if (!handle.cuda_ipc_handle.empty()) rh->set_cuda_ipc_handle(handle.cuda_ipc_handle);
    if (!handle.shm_name.empty()) rh->set_shm_name(handle.shm_name);
    rh->set_size_bytes(handle.size_bytes);
    h->region_of_request[r->request_id()] = region;
  }
  return message;
}

bool Client::HandshakeOver(const Handshake& h) {
  const bool answered = h.hello_answered && h.region_of_request.empty();
  return h.done || h.read_ended || !h.error.ok() || (h.written && (!h.write_ok || answered));
}

absl::Status Client::HandshakeResult(const Handshake& h, double seconds) const {
  if (!h.error.ok()) return h.error;
  if (h.written && !h.write_ok) {
    return absl::UnavailableError(absl::StrCat("offloadd at ", target_,
                                               " closed the stream before the Hello"));
  }
  if (h.written && h.hello_answered && h.region_of_request.empty()) return absl::OkStatus();
  return absl::UnavailableError(absl::StrCat(
      "offloadd at ", target_, " did not answer the resume's Hello and registrations within ",
      seconds, " s"));
}

absl::Status Client::OpenResumed(const std::string& token,
                                 const absl::flat_hash_map<uint64_t, RegionHandle>& regions,
                                 double seconds) {
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  args.SetMaxReceiveMessageSize(-1);
  SetKeepalive(options_, args);
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel(target_, grpc::InsecureChannelCredentials(), args);
  // WaitForConnected cannot be interrupted: wait in short slices so that a Close() during an
  // outage ends the attempt at once instead of after `seconds` (connect_timeout_seconds).
  const auto give_up = std::chrono::steady_clock::now() +
                       std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                           std::chrono::duration<double>(seconds));
  for (;;) {
    const double left =
        std::chrono::duration<double>(give_up - std::chrono::steady_clock::now()).count();
    if (channel->WaitForConnected(DeadlineIn(std::clamp(left, 0.0, 0.05)))) break;
    {
      base::MutexLock lock(mu_);
      if (closing_) return absl::CancelledError("Client::Close() was called");
    }
    if (left <= 0.05) {
      return absl::UnavailableError(absl::StrCat("nothing accepted a connection at ", target_,
                                                 " within ", seconds, " s"));
    }
  }
  auto owned = std::make_unique<Handshake>();
  owned->stream = std::make_unique<SessionStream>(this, std::move(channel));
  Handshake* const h = owned.get();
  SessionStream* const stream = h->stream.get();
  v1::ClientMessage message = ResumeMessage(token, regions, h);
  {
    base::MutexLock lock(mu_);
    if (closing_) return absl::CancelledError("Client::Close() was called");
    handshake_ = std::move(owned);  // the stream's reactions find it here
  }
  stream->Begin();
  stream->Write(std::move(message));  // the stream's only write until Install
  absl::Status result;
  bool hello_answered;
  {
    base::MutexLock lock(mu_);
    const auto deadline = base::CondVar::DeadlineIn(seconds);
    while (!HandshakeOver(*h) && !closing_ && cv_.WaitUntil(mu_, deadline)) {
    }
    result = !HandshakeOver(*h) && closing_ ? absl::CancelledError("Client::Close() was called")
                                             : HandshakeResult(*h, seconds);
    if (result.ok()) return result;  // Install takes handshake_
    hello_answered = h->hello_answered;
  }
  // Give the stream up: cancel it, release its hold, and drop it once its OnDone ran.
  stream->Cancel();
  stream->RemoveHold();
  {
    base::MutexLock lock(mu_);
    while (!h->done) cv_.Wait(mu_);
    owned = std::move(handshake_);
  }
  owned.reset();
  if (!hello_answered || absl::IsUnavailable(result) || absl::IsCancelled(result)) {
    return result;  // the Hello's own error (token unknown, other uid), or the daemon went
  }
  return absl::FailedPreconditionError(absl::StrCat(
      "a region could not be registered again after offloadd at ", target_, " restarted (",
      absl::StatusCodeToString(result.code()), ": ", result.message(), ")"));
}

void Client::Install() {
  std::vector<std::pair<Pending, v1::Response>> answered;
  std::vector<std::pair<Pending, absl::Status>> failed;
  std::vector<uint64_t> missing;  // confirmed blocks the restarted daemon did not hand back
  std::unique_ptr<SessionStream> old;  // its OnDone ran; dropped without mu_
  std::unique_ptr<Handshake> h;        // dropped without mu_ (a ring not adopted closes)
  std::shared_ptr<RingCore> old_ring;  // stopped and shut down; dropped without mu_
  StreamStep step;
  {
    base::MutexLock lock(mu_);
    h = std::move(handshake_);
    absl::flat_hash_set<uint64_t> resumed(h->hello.resumed_block_ids().begin(),
                                          h->hello.resumed_block_ids().end());
    std::vector<uint64_t> orphans;
    for (uint64_t id : resumed) {
      if (!confirmed_.contains(id)) orphans.push_back(id);
    }
    for (auto it = confirmed_.begin(); it != confirmed_.end();) {
      auto cur = it++;
      if (!resumed.contains(*cur)) {
        missing.push_back(*cur);
        lost_.insert(*cur);
        confirmed_.erase(cur);
      }
    }
    old = std::move(stream_);
    stream_ = std::move(h->stream);  // its hold is still in place
    channel_ = stream_->channel();
    holding_ = true;
    writing_ = false;  // the handshake's write is done
    stream_ended_ = h->read_ended;
    stream_done_ = false;
    daemon_region_ = std::move(h->daemon_region);
    token_ = h->hello.resume_token();
    ResendLocked(resumed, &answered, &failed);
    ReleaseOrphansLocked(orphans);
    AdoptResumedRingLocked(h.get(), &old_ring);
    ++counters_.resumes;
    reconnecting_ = false;
    flush_ = true;
    step = NextStepLocked();
    cv_.notify_all();
  }
  RunStep(std::move(step));
  old.reset();
  // A release that was pending settles such a block as released; any other is lost (a reload
  // of it is answered DATA_LOSS): said once here, with the ids, for whoever reads the logs.
  if (!missing.empty()) {
    LOG(WARNING) << "resumed session at " << target_ << ": " << missing.size()
                 << " confirmed blocks were not handed back by the restarted daemon (released "
                 << "if a release of them was pending, else lost), e.g. block "
                 << absl::StrJoin(missing.begin(),
                                  missing.begin() + std::min<size_t>(missing.size(), 8), ", ");
  }
  for (auto& [p, response] : answered) p.done(&response, absl::OkStatus());
  for (auto& [p, failure] : failed) p.done(nullptr, failure);
}

void Client::ResendLocked(const absl::flat_hash_set<uint64_t>& resumed,
                          std::vector<std::pair<Pending, v1::Response>>* answered,
                          std::vector<std::pair<Pending, absl::Status>>* failed) {
  // Ring and stream ids come from one counter: without the ring bit they are unique and in
  // the order the requests were issued.
  auto number = [](uint64_t id) { return id & ~common::kRingRequestIdBit; };
  std::vector<uint64_t> ids;
  for (const auto& [id, p] : pending_) ids.push_back(id);
  std::sort(ids.begin(), ids.end(),
            [&number](uint64_t a, uint64_t b) { return number(a) < number(b); });
  outbox_.clear();
  for (uint64_t id : ids) {
    auto it = pending_.find(id);
    Pending p = std::move(it->second);
    pending_.erase(it);
    if (p.internal) continue;  // an orphan release of an earlier resume: settled below
    v1::Response answer;
    absl::Status failure;
    if (SettleLocked(p.request, resumed, &answer, &failure)) {
      if (failure.ok()) {
        answer.set_request_id(id);
        AccountLocked(p, &answer);
        answered->emplace_back(std::move(p), std::move(answer));
      } else {
        failed->emplace_back(std::move(p), failure);
      }
      continue;
    }
    p.request.set_request_id(number(id));  // a request of the old ring goes on the stream
    outbox_.push_back(WireLocked(p.request));
    ++counters_.resent;
    pending_.emplace(number(id), std::move(p));
  }
}

void Client::ReleaseOrphansLocked(const std::vector<uint64_t>& orphans) {
  for (uint64_t block : orphans) {
    v1::Request release;
    release.set_request_id(next_request_id_.fetch_add(1, std::memory_order_relaxed));
    release.mutable_release()->set_block_id(block);
    Pending p;
    p.done = [](const v1::Response*, const absl::Status&) {};
    p.request = release;
    p.internal = true;
    pending_.emplace(release.request_id(), std::move(p));
    outbox_.push_back(std::move(release));
  }
  counters_.orphans_released += orphans.size();
}

void Client::AdoptResumedRingLocked(Handshake* h, std::shared_ptr<RingCore>* old) {
  *old = std::move(ring_);  // StopRing joined its thread and shut it down
  if (h->ring != nullptr && h->hello.ring_attached()) {
    ring_ = std::move(h->ring);
    ring_stop_ = false;  // the old ring's thread is joined: this starts the new one
    StartRingLocked();
    return;
  }
  if (options_.use_ring) {
    LOG(WARNING) << "resumed session at " << target_ << " runs on the stream only: "
                 << (h->ring == nullptr ? "no request ring could be made: " + h->ring_error
                                        : "the daemon did not attach the request ring offered" +
                                              (h->hello.ring_error().empty()
                                                   ? std::string()
                                                   : ": " + h->hello.ring_error()));
  }
}

bool Client::SettleLocked(const v1::Request& request,
                          const absl::flat_hash_set<uint64_t>& resumed, v1::Response* answer,
                          absl::Status* failure) {
  auto block_of = [this](uint64_t id, uint64_t tag) REQUIRES(mu_) -> uint64_t {
    if (id != 0 || tag == 0) return id;
    auto it = tag_block_.find(tag);
    return it == tag_block_.end() ? 0 : it->second;
  };
  if (request.has_release()) {
    const uint64_t block = block_of(request.release().block_id(), request.release().tag());
    if (block != 0 && !resumed.contains(block)) {  // released before the crash, or lost anyway
      lost_.erase(block);
      answer->mutable_released()->set_block_id(block);
      return true;
    }
  } else if (request.has_reload()) {
    const uint64_t block = block_of(request.reload().block_id(), request.reload().tag());
    // First: a confirmed block missing after the restart is in lost_ by now, but this reload
    // was releasing it, and the dead daemon may have done so (copy and release) just before the
    // crash. Either way the block is no longer the client's: it leaves lost_.
    if (block != 0 && request.reload().release_after() && !resumed.contains(block)) {
      lost_.erase(block);
      *failure = absl::DataLossError(absl::StrCat(
          "offloadd at ", target_, " restarted while this reload with release_after of block ",
          block, " was in flight, and the block is gone: the copy may have completed before "
          "the crash, but nothing can confirm it"));
      return true;
    }
    if (block != 0 && lost_.contains(block)) {
      *failure = LostBlock(block, target_);
      return true;
    }
  }
  return false;
}

v1::Request Client::WireLocked(const v1::Request& request) const {
  v1::Request wire = request;
  auto map_region = [this](uint64_t region) REQUIRES(mu_) {
    auto it = daemon_region_.find(region);
    return it == daemon_region_.end() ? region : it->second;
  };
  auto map_tag = [this](auto* body) REQUIRES(mu_) {
    if (body->block_id() != 0 || body->tag() == 0) return;
    auto it = tag_block_.find(body->tag());
    if (it == tag_block_.end()) return;
    body->set_block_id(it->second);
    body->set_tag(0);
  };
  if (wire.has_offload()) {
    wire.mutable_offload()->set_region_id(map_region(wire.offload().region_id()));
  } else if (wire.has_reload()) {
    wire.mutable_reload()->set_region_id(map_region(wire.reload().region_id()));
    map_tag(wire.mutable_reload());
  } else if (wire.has_release()) {
    map_tag(wire.mutable_release());
  } else if (wire.has_unregister_region()) {
    wire.mutable_unregister_region()->set_region_id(
        map_region(wire.unregister_region().region_id()));
  }
  return wire;
}

void Client::AccountLocked(const Pending& p, v1::Response* response) {
  if (p.internal) return;
  const v1::Request& request = p.request;
  auto forget_block = [this](uint64_t block) REQUIRES(mu_) {
    confirmed_.erase(block);
    for (auto it = tag_block_.begin(); it != tag_block_.end();) {
      auto cur = it++;
      if (cur->second == block) tag_block_.erase(cur);
    }
  };
  switch (response->body_case()) {
    case v1::Response::kOffloadDone:
      confirmed_.insert(response->offload_done().block_id());
      if (request.has_offload() && request.offload().tag() != 0) {
        tag_block_[request.offload().tag()] = response->offload_done().block_id();
      }
      break;
    case v1::Response::kReloadDone:
      if (response->reload_done().released()) forget_block(response->reload_done().block_id());
      break;
    case v1::Response::kReleased:
      forget_block(response->released().block_id());
      break;
    case v1::Response::kRegionRegistered:
      if (p.region != 0 && request.has_register_region()) {
        const v1::RegionHandle& h = request.register_region().handle();
        regions_[p.region] = RegionHandle{h.cuda_ipc_handle(), h.shm_name(), h.size_bytes()};
        daemon_region_[p.region] = response->region_registered().region_id();
        response->mutable_region_registered()->set_region_id(p.region);
      }
      break;
    case v1::Response::kRegionUnregistered:
      if (request.has_unregister_region()) {
        const uint64_t region = request.unregister_region().region_id();
        regions_.erase(region);
        daemon_region_.erase(region);
        response->mutable_region_unregistered()->set_region_id(region);
      }
      break;
    default:
      break;
  }
}

absl::Status Client::Enqueue(v1::Request request, Completer done, bool flush,
                             uint64_t region, std::weak_ptr<RingCore>* ring_used) {
  base::MutexLock lock(mu_);
  if (!stream_status_.ok()) return stream_status_;
  if (closing_) return absl::FailedPreconditionError("Client::Close() was called");
  if (request.has_reload() && lost_.contains(request.reload().block_id())) {
    return LostBlock(request.reload().block_id(), target_);
  }
  // After the stream ended but before the session thread collected pending_, the request still
  // goes into pending_ (it fails with the others, or is sent once a resume installed a new
  // stream); it is not written.
  const bool write = !stream_ended_ && !reconnecting_;
  if (write && OnRingLocked(request)) {
    request.set_request_id(request.request_id() | common::kRingRequestIdBit);
    const common::SubmissionEntry entry = RingEntry(WireLocked(request));
    pending_.emplace(entry.request_id, Pending{std::move(done), std::move(request), false, region});
    ++counters_.ring_requests_sent;
    const std::shared_ptr<RingCore> ring = ring_;
    *ring_used = ring;
    lock.Unlock();
    // A full ring waits for the daemon to take entries; a ring that closes or a stream that
    // ends (StopRing shuts the ring down) leaves the request pending, settled or re-sent with
    // the others when the session thread sees the end.
    while (!ring->SubmitEntry(entry, 0.05) && !ring->closed()) {
    }
    lock.Lock();
    return absl::OkStatus();
  }
  v1::Request wire = write ? WireLocked(request) : v1::Request();
  const uint64_t id = request.request_id();
  pending_.emplace(id, Pending{std::move(done), std::move(request), false, region});
  if (!write) return absl::OkStatus();
  outbox_.push_back(std::move(wire));
  if (flush) flush_ = true;
  // No write in flight (and no ScopedBatch holding the queue): this thread starts it. Otherwise
  // the write in flight's OnWriteDone takes this request along with whatever else queued.
  StreamStep step = NextStepLocked();
  if (step.kind == StreamStep::kWrite) ++counters_.messages_sent_by_caller;
  lock.Unlock();
  RunStep(std::move(step));
  return absl::OkStatus();
}

bool Client::OnRingLocked(const v1::Request& request) const {
  if (!ring_active_) return false;
  auto event_fits = [](const std::string& event) {
    return event.empty() || event.size() == common::kRingEventBytes;
  };
  if (request.has_offload()) return event_fits(request.offload().ready_event());
  if (request.has_reload()) {
    const v1::ReloadRequest& r = request.reload();
    return event_fits(r.ready_event()) && event_fits(r.done_event()) &&
           std::isfinite(r.deadline_seconds()) && r.deadline_seconds() >= 0 &&
           r.deadline_seconds() <= 1e9;
  }
  return request.has_release();
}

void Client::RingLoop(const std::shared_ptr<RingCore>& ring) {
  for (;;) {
    const bool stopping = ring_stop_.load();
    common::CompletionEntry c;
    // Asleep until an answer, the ring's close, or StopRing's wake-up.
    const RingCore::WaitResult r = ring->WaitAny(stopping ? 0 : -1, &c, &ring_stop_);
    if (r == RingCore::WaitResult::kDone) {
      CompleteFromRing(ResponseFromRing(c));
      continue;
    }
    if (r == RingCore::WaitResult::kClosed && !stopping && ring->corrupt()) {
      // The daemon closes the ring only as the session ends (and the stream ends with it);
      // a ring this side found corrupt leaves a live stream, with requests on the ring whose
      // answers can never be read: end the session, as the daemon does for a corrupt ring.
      LOG(ERROR) << "the request ring of the session at " << target_
                 << " is corrupt (its shared memory was overwritten): ending the session";
      {
        base::MutexLock lock(mu_);
        ring_active_ = false;
        ring_failure_ = absl::InternalError(absl::StrCat(
            "the request ring of the session with offloadd at ", target_,
            " was found corrupt (its shared memory was overwritten; a bug or a stray write in "
            "this process or the daemon); the session was ended: Connect anew"));
      }
      CancelStream();
      return;
    }
    if (r == RingCore::WaitResult::kClosed || stopping) return;
  }
}

void Client::CompleteFromRing(v1::Response response) {
  Completer done;
  {
    base::MutexLock lock(mu_);
    ++counters_.ring_responses_received;
    auto it = pending_.find(response.request_id());
    if (it == pending_.end()) {
      ++counters_.unknown_responses;
      return;
    }
    // As on the stream: UNAVAILABLE from a daemon shutting down, with a session to resume,
    // leaves the request to be sent again after the resume.
    if (response.has_error() &&
        response.error().code() == static_cast<int>(absl::StatusCode::kUnavailable) &&
        !it->second.internal && options_.auto_resume && hello_.resume_grace_seconds() > 0) {
      return;
    }
    AccountLocked(it->second, &response);
    done = std::move(it->second.done);
    pending_.erase(it);
  }
  done(&response, absl::OkStatus());
}

void Client::StopRing() {
  std::thread ring_thread;
  std::shared_ptr<RingCore> ring;
  {
    base::MutexLock lock(mu_);
    ring_active_ = false;
    ring_stop_ = true;  // under mu_: AdoptHello starts no ring thread after this
    ring_thread = std::move(ring_thread_);  // one StopRing joins it
    ring = ring_;
  }
  if (ring == nullptr) return;
  ring->WakeWaiters();
  if (ring_thread.joinable()) ring_thread.join();  // it took every answer already there
  // An Enqueue still waiting for a slot gives up (its request waits in pending_), and nothing
  // is submitted to this ring again: a resume offers a new one.
  ring->Shutdown();
}

template <typename R, typename Convert>
Reply<R> Client::Submit(v1::Request request, v1::Response::BodyCase expected, Convert convert,
                              bool flush, uint64_t region) {
  auto promise = std::make_shared<std::promise<R>>();
  std::future<R> future = promise->get_future();
  const uint64_t id = next_request_id_.fetch_add(1, std::memory_order_relaxed);
  request.set_request_id(id);
  Completer done = [promise, expected, convert = std::move(convert), id](
                       const v1::Response* response, const absl::Status& failure) {
    if (response == nullptr) {
      promise->set_value(R(failure));
    } else if (response->body_case() == v1::Response::kError) {
      promise->set_value(R(StatusFromError(response->error())));
    } else if (response->body_case() != expected) {
      promise->set_value(R(absl::InternalError(absl::StrCat(
          "offloadd answered request ", id, " with response kind ", response->body_case(),
          ", expected ", expected, "; client and daemon protocol versions differ"))));
    } else {
      promise->set_value(convert(*response));
    }
  };
  std::weak_ptr<RingCore> ring;
  absl::Status refused = Enqueue(std::move(request), std::move(done), flush, region, &ring);
  if (!refused.ok()) {
    promise->set_value(R(refused));
  }
  return Reply<R>(std::move(future), std::move(ring));
}

absl::StatusOr<uint64_t> Client::RegisterRegion(const RegionHandle& handle) {
  const bool cuda = !handle.cuda_ipc_handle.empty(), shm = !handle.shm_name.empty();
  if (cuda == shm) {
    return absl::InvalidArgumentError(
        "RegionHandle needs exactly one of cuda_ipc_handle and shm_name");
  }
  if (cuda && handle.cuda_ipc_handle.size() != kCudaIpcHandleBytes) {
    return absl::InvalidArgumentError(absl::StrCat("cuda_ipc_handle has ",
                                                   handle.cuda_ipc_handle.size(),
                                                   " bytes; a cudaIpcMemHandle_t has 64"));
  }
  v1::Request request;
  v1::RegionHandle* h = request.mutable_register_region()->mutable_handle();
  if (cuda) h->set_cuda_ipc_handle(handle.cuda_ipc_handle);
  if (shm) h->set_shm_name(handle.shm_name);
  h->set_size_bytes(handle.size_bytes);
  uint64_t region;
  {
    base::MutexLock lock(mu_);
    region = next_region_id_++;
  }
  return Submit<absl::StatusOr<uint64_t>>(
             std::move(request), v1::Response::kRegionRegistered,
             [](const v1::Response& r) {
               return absl::StatusOr<uint64_t>(r.region_registered().region_id());
             },
             /*flush=*/true, region)
      .get();
}

absl::StatusOr<uint64_t> Client::RegisterShmRegion(const ShmRegion& region) {
  RegionHandle handle;
  handle.shm_name = region.name();
  handle.size_bytes = region.size_bytes();
  return RegisterRegion(handle);
}

absl::Status Client::UnregisterRegion(uint64_t region_id) {
  v1::Request request;
  request.mutable_unregister_region()->set_region_id(region_id);
  return Submit<absl::Status>(
             std::move(request), v1::Response::kRegionUnregistered,
             [](const v1::Response&) { return absl::OkStatus(); }, /*flush=*/true)
      .get();
}

Reply<absl::StatusOr<OffloadResult>> Client::Offload(uint64_t region_id, uint64_t offset,
                                                           uint64_t bytes,
                                                           absl::string_view ready_event,
                                                           uint64_t tag, OrderingHint ordering) {
  v1::Request request;
  v1::OffloadRequest* o = request.mutable_offload();
  o->set_tag(tag);
  o->set_region_id(region_id);
  o->set_offset(offset);
  o->set_bytes(bytes);
  if (!ready_event.empty()) o->set_ready_event(std::string(ready_event));
  if (ordering.valid) {
    o->mutable_ordering()->set_step(ordering.step);
    o->mutable_ordering()->set_position(ordering.position);
  }
  return Submit<absl::StatusOr<OffloadResult>>(
      std::move(request), v1::Response::kOffloadDone,
      [](const v1::Response& r) {
        const v1::OffloadDone& d = r.offload_done();
        return absl::StatusOr<OffloadResult>(
            OffloadResult{d.block_id(), d.bytes(), d.queued_seconds(), d.copy_seconds()});
      },
      /*flush=*/false);
}

Reply<absl::StatusOr<ReloadResult>> Client::Reload(uint64_t block_id, uint64_t region_id,
                                                         uint64_t offset, Priority priority,
                                                         bool release_after,
                                                         double deadline_seconds,
                                                         absl::string_view done_event,
                                                         absl::string_view ready_event) {
  return SubmitReload(block_id, 0, region_id, offset, priority, release_after, deadline_seconds,
                      done_event, ready_event);
}

Reply<absl::StatusOr<ReloadResult>> Client::ReloadTagged(uint64_t tag, uint64_t region_id,
                                                               uint64_t offset, Priority priority,
                                                               bool release_after,
                                                               double deadline_seconds,
                                                               absl::string_view done_event,
                                                               absl::string_view ready_event) {
  return SubmitReload(0, tag, region_id, offset, priority, release_after, deadline_seconds,
                      done_event, ready_event);
}

Reply<absl::StatusOr<ReloadResult>> Client::SubmitReload(uint64_t block_id, uint64_t tag,
                                                               uint64_t region_id, uint64_t offset,
                                                               Priority priority,
                                                               bool release_after,
                                                               double deadline_seconds,
                                                               absl::string_view done_event,
                                                               absl::string_view ready_event) {
  v1::Request request;
  v1::ReloadRequest* r = request.mutable_reload();
  r->set_block_id(block_id);
  r->set_tag(tag);
  if (!done_event.empty()) r->set_done_event(std::string(done_event));
  if (!ready_event.empty()) r->set_ready_event(std::string(ready_event));
  r->set_region_id(region_id);
  r->set_offset(offset);
  r->set_priority(priority == Priority::kUrgent ? v1::URGENT : v1::PREFETCH);
  r->set_release_after(release_after);
  r->set_deadline_seconds(deadline_seconds);
  return Submit<absl::StatusOr<ReloadResult>>(
      std::move(request), v1::Response::kReloadDone,
      [](const v1::Response& resp) {
        const v1::ReloadDone& d = resp.reload_done();
        return absl::StatusOr<ReloadResult>(
            ReloadResult{d.block_id(), d.bytes(), d.released(), d.copy_seconds(),
                         d.done_event_recorded()});
      },
      /*flush=*/false);
}

Reply<absl::Status> Client::Release(uint64_t block_id) { return SubmitRelease(block_id, 0); }

Reply<absl::Status> Client::ReleaseTagged(uint64_t tag) { return SubmitRelease(0, tag); }

Reply<absl::Status> Client::SubmitRelease(uint64_t block_id, uint64_t tag) {
  v1::Request request;
  request.mutable_release()->set_block_id(block_id);
  request.mutable_release()->set_tag(tag);
  return Submit<absl::Status>(
      std::move(request), v1::Response::kReleased,
      [](const v1::Response&) { return absl::OkStatus(); }, /*flush=*/false);
}

absl::Status Client::StatusWithPath(const grpc::Status& status, absl::string_view rpc) const {
  return absl::Status(
      static_cast<absl::StatusCode>(status.error_code()),
      absl::StrCat(rpc, " to offloadd at ", target_, " failed: ", status.error_message()));
}

absl::StatusOr<v1::Stats> Client::GetStats() {
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(options_.unary_timeout_seconds));
  v1::Stats stats;
  std::shared_ptr<grpc::Channel> channel;
  {
    base::MutexLock lock(mu_);
    channel = channel_;
  }
  grpc::Status status =
      v1::Offload::NewStub(channel)->GetStats(&context, v1::GetStatsRequest(), &stats);
  if (!status.ok()) return StatusWithPath(status, "GetStats");
  return stats;
}

absl::Status Client::CheckHealth(absl::string_view service) {
  std::shared_ptr<grpc::Channel> channel;
  {
    base::MutexLock lock(mu_);
    channel = channel_;
  }
  grpc::GenericStub generic(channel);
  grpc::ClientContext context;
  context.set_deadline(DeadlineIn(options_.unary_timeout_seconds));
  std::string encoded = EncodeHealthCheckRequest(service);
  grpc::Slice slice(encoded);
  grpc::ByteBuffer request(&slice, 1), response;
  std::promise<grpc::Status> done;
  generic.UnaryCall(&context, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&done](grpc::Status s) { done.set_value(std::move(s)); });
  grpc::Status status = done.get_future().get();
  if (!status.ok()) return StatusWithPath(status, "Health/Check");
  std::vector<grpc::Slice> slices;
  if (!response.Dump(&slices).ok()) return absl::InternalError("unreadable health reply");
  std::string bytes;
  for (const grpc::Slice& s : slices)
    bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  absl::StatusOr<int> serving = DecodeHealthCheckResponse(bytes);
  if (!serving.ok()) return serving.status();
  if (*serving == 1) return absl::OkStatus();
  static const char* const kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  return absl::UnavailableError(
      absl::StrCat("offloadd at ", target_, " reports ",
                   *serving >= 0 && *serving < 4 ? kNames[*serving] : "an unknown health status",
                   " for service \"", service, "\""));
}

absl::Status Client::stream_status() const {
  base::MutexLock lock(mu_);
  return stream_status_;
}

ClientCounters Client::counters() const {
  base::MutexLock lock(mu_);
  return counters_;
}

Client::ScopedBatch::ScopedBatch(Client& client) : client_(client) {
  base::MutexLock lock(client_.mu_);
  ++client_.batch_depth_;
}

Client::ScopedBatch::~ScopedBatch() {
  StreamStep step;
  {
    base::MutexLock lock(client_.mu_);
    if (--client_.batch_depth_ == 0) step = client_.NextStepLocked();  // send what it held
  }
  RunStep(std::move(step));
}

}  // namespace client
}  // namespace offloadd
