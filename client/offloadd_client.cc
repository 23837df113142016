#include "client/offloadd_client.h"

#include <glog/logging.h>
#include <grpcpp/generic/generic_stub.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
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

}  // namespace

absl::StatusOr<std::unique_ptr<Client>> Client::Connect(const ClientOptions& options) {
  std::string path = options.socket_path.empty() ? DefaultSocketPath() : options.socket_path;
  if (!SocketPathFits(path)) {
    return absl::InvalidArgumentError(
        absl::StrCat("socket path \"", path, "\" is empty or longer than ", kMaxSocketPathBytes,
                     " bytes (the Unix socket limit); choose a shorter ClientOptions.socket_path"));
  }
  grpc::ChannelArguments args;
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // own connection per Client
  args.SetMaxReceiveMessageSize(-1);                   // Stats grows with sessions and links
  std::shared_ptr<grpc::Channel> channel =
      grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args);
  if (!channel->WaitForConnected(DeadlineIn(options.connect_timeout_seconds))) {
    return absl::UnavailableError(absl::StrCat(
        "could not connect to offloadd at unix:", path, " within ", options.connect_timeout_seconds,
        " s: ", UnreachableSocketReason(path, ProbeUnixSocket(path)),
        "; start the daemon (e.g. systemctl start offloadd) or point the client at its socket "
        "(ClientOptions.socket_path; offloadctl --socket PATH or $OFFLOADD_SOCKET)"));
  }
  std::unique_ptr<Client> client(new Client(options, path, std::move(channel)));
  client->Start();

  v1::Request request;
  v1::Hello* hello = request.mutable_hello();
  hello->set_client_name(options.client_name);
  hello->set_device_id(options.device_id);
  hello->set_pid(options.pid != 0 ? options.pid : static_cast<uint32_t>(getpid()));
  if (!options.resume_token.empty()) hello->set_resume_token(options.resume_token);
  std::future<absl::StatusOr<v1::HelloReply>> reply =
      client->Submit<absl::StatusOr<v1::HelloReply>>(
          std::move(request), v1::Response::kHello,
          [](const v1::Response& r) { return absl::StatusOr<v1::HelloReply>(r.hello()); },
          /*flush=*/true);
  if (reply.wait_for(std::chrono::duration<double>(options.connect_timeout_seconds)) !=
      std::future_status::ready) {
    client->stream_context_.TryCancel();  // Close() then returns at once
    return absl::DeadlineExceededError(absl::StrCat(
        "offloadd at unix:", path, " accepted the connection but sent no HelloReply within ",
        options.connect_timeout_seconds, " s; check the daemon's log"));
  }
  absl::StatusOr<v1::HelloReply> result = reply.get();
  if (!result.ok()) return result.status();
  client->hello_ = *std::move(result);
  return client;
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

Client::Client(const ClientOptions& options, std::string socket_path,
               std::shared_ptr<grpc::Channel> channel)
    : options_(options),
      socket_path_(std::move(socket_path)),
      target_("unix:" + socket_path_),
      channel_(std::move(channel)),
      stub_(v1::Offload::NewStub(channel_)) {}

void Client::Start() {
  stream_ = stub_->Session(&stream_context_);
  writer_ = std::thread([this] { WriterLoop(); });
  reader_ = std::thread([this] { ReaderLoop(); });
}

Client::~Client() { Close(); }

void Client::Close() {
  std::lock_guard<std::mutex> close_lock(close_mu_);
  bool finished;
  {
    std::unique_lock<std::mutex> lock(mu_);
    closing_ = true;  // the writer sends what is queued, then half-closes
    cv_.notify_all();
    finished = cv_.wait_for(lock, std::chrono::duration<double>(options_.close_timeout_seconds),
                            [this] { return finished_; });
  }
  if (!finished) {
    LOG(WARNING) << "offloadd at " << target_ << " did not end the session within "
                 << options_.close_timeout_seconds << " s of Close(); cancelling it";
    stream_context_.TryCancel();
  }
  if (writer_.joinable()) writer_.join();
  if (reader_.joinable()) reader_.join();
}

bool Client::WriterHasWork() const {
  if (reading_done_ || closing_) return true;
  return !outbox_.empty() && (batch_depth_ == 0 || flush_);
}

void Client::WriterLoop() {
  for (;;) {
    v1::ClientMessage message;
    bool half_close = false;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return WriterHasWork(); });
      if (reading_done_) break;  // the daemon ended the stream: nothing more can be sent
      if (outbox_.empty()) {
        half_close = closing_;
        if (!half_close) continue;
      } else if (batch_depth_ == 0 || flush_ || closing_) {
        size_t message_bytes = 0;
        while (!outbox_.empty() && message.requests_size() < kMaxRequestsPerMessage) {
          size_t request_bytes = outbox_.front().ByteSizeLong() + 4;
          if (message.requests_size() > 0 && message_bytes + request_bytes > kMaxMessageBytes) {
            break;
          }
          message_bytes += request_bytes;
          *message.add_requests() = std::move(outbox_.front());
          outbox_.pop_front();
        }
        if (outbox_.empty()) flush_ = false;
        ++counters_.messages_sent;
        counters_.requests_sent += message.requests_size();
      } else {
        continue;  // corked by a ScopedBatch
      }
    }
    if (half_close) {
      stream_->WritesDone();
      break;
    }
    if (!stream_->Write(message)) break;  // stream is over; the reader sees it end too
  }
  std::lock_guard<std::mutex> lock(mu_);
  writer_done_ = true;
  cv_.notify_all();
}

void Client::ReaderLoop() {
  v1::ServerMessage message;
  std::vector<std::pair<Completer, const v1::Response*>> ready;
  while (stream_->Read(&message)) {
    ready.clear();
    {
      std::lock_guard<std::mutex> lock(mu_);
      ++counters_.messages_received;
      counters_.responses_received += message.responses_size();
      for (const v1::Response& response : message.responses()) {
        auto it = pending_.find(response.request_id());
        if (it == pending_.end()) {
          ++counters_.unknown_responses;
          LOG(WARNING) << "offloadd answered unknown request id " << response.request_id();
          continue;
        }
        ready.emplace_back(std::move(it->second), &response);
        pending_.erase(it);
      }
    }
    for (auto& [done, response] : ready) done(response, absl::OkStatus());
  }
  {
    std::unique_lock<std::mutex> lock(mu_);
    reading_done_ = true;
    cv_.notify_all();
    cv_.wait(lock, [this] { return writer_done_; });
  }
  grpc::Status final_status = stream_->Finish();
  absl::flat_hash_map<uint64_t, Completer> orphans;
  absl::Status failure;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closing_) {
      failure = absl::CancelledError(absl::StrCat("the client was closed before offloadd at ",
                                                  target_, " answered this request"));
      stream_status_ = absl::FailedPreconditionError("Client::Close() was called");
    } else {
      failure = absl::UnavailableError(absl::StrCat(
          "the offloadd daemon at ", target_, " went away (session stream ended with ",
          absl::StatusCodeToString(static_cast<absl::StatusCode>(final_status.error_code())),
          final_status.error_message().empty() ? "" : ": ", final_status.error_message(),
          "); its blocks and regions are gone: reconnect with Client::Connect"));
      stream_status_ = failure;
    }
    orphans.swap(pending_);
  }
  for (auto& [id, done] : orphans) done(nullptr, failure);
  std::lock_guard<std::mutex> lock(mu_);
  finished_ = true;
  cv_.notify_all();
}

absl::Status Client::Enqueue(v1::Request request, Completer done, bool flush) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!stream_status_.ok()) return stream_status_;
  if (closing_) return absl::FailedPreconditionError("Client::Close() was called");
  // After the stream ended but before the reader collected pending_, the request still goes into
  // pending_ (and fails with the others); it is not written.
  pending_.emplace(request.request_id(), std::move(done));
  if (!reading_done_) {
    outbox_.push_back(std::move(request));
    if (flush) flush_ = true;
    cv_.notify_all();
  }
  return absl::OkStatus();
}

template <typename R, typename Convert>
std::future<R> Client::Submit(v1::Request request, v1::Response::BodyCase expected, Convert convert,
                              bool flush) {
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
  absl::Status refused = Enqueue(std::move(request), std::move(done), flush);
  if (!refused.ok()) promise->set_value(R(refused));
  return future;
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
  return Submit<absl::StatusOr<uint64_t>>(
             std::move(request), v1::Response::kRegionRegistered,
             [](const v1::Response& r) {
               return absl::StatusOr<uint64_t>(r.region_registered().region_id());
             },
             /*flush=*/true)
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

std::future<absl::StatusOr<OffloadResult>> Client::Offload(uint64_t region_id, uint64_t offset,
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

std::future<absl::StatusOr<ReloadResult>> Client::Reload(uint64_t block_id, uint64_t region_id,
                                                         uint64_t offset, Priority priority,
                                                         bool release_after,
                                                         double deadline_seconds,
                                                         absl::string_view done_event) {
  return SubmitReload(block_id, 0, region_id, offset, priority, release_after, deadline_seconds,
                      done_event);
}

std::future<absl::StatusOr<ReloadResult>> Client::ReloadTagged(uint64_t tag, uint64_t region_id,
                                                               uint64_t offset, Priority priority,
                                                               bool release_after,
                                                               double deadline_seconds,
                                                               absl::string_view done_event) {
  return SubmitReload(0, tag, region_id, offset, priority, release_after, deadline_seconds,
                      done_event);
}

std::future<absl::StatusOr<ReloadResult>> Client::SubmitReload(uint64_t block_id, uint64_t tag,
                                                               uint64_t region_id, uint64_t offset,
                                                               Priority priority,
                                                               bool release_after,
                                                               double deadline_seconds,
                                                               absl::string_view done_event) {
  v1::Request request;
  v1::ReloadRequest* r = request.mutable_reload();
  r->set_block_id(block_id);
  r->set_tag(tag);
  if (!done_event.empty()) r->set_done_event(std::string(done_event));
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
            ReloadResult{d.block_id(), d.bytes(), d.released(), d.copy_seconds()});
      },
      /*flush=*/false);
}

std::future<absl::Status> Client::Release(uint64_t block_id) { return SubmitRelease(block_id, 0); }

std::future<absl::Status> Client::ReleaseTagged(uint64_t tag) { return SubmitRelease(0, tag); }

std::future<absl::Status> Client::SubmitRelease(uint64_t block_id, uint64_t tag) {
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
  grpc::Status status = stub_->GetStats(&context, v1::GetStatsRequest(), &stats);
  if (!status.ok()) return StatusWithPath(status, "GetStats");
  return stats;
}

absl::Status Client::CheckHealth(absl::string_view service) {
  grpc::GenericStub generic(channel_);
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
  std::lock_guard<std::mutex> lock(mu_);
  return stream_status_;
}

ClientCounters Client::counters() const {
  std::lock_guard<std::mutex> lock(mu_);
  return counters_;
}

Client::ScopedBatch::ScopedBatch(Client& client) : client_(client) {
  std::lock_guard<std::mutex> lock(client_.mu_);
  ++client_.batch_depth_;
}

Client::ScopedBatch::~ScopedBatch() {
  std::lock_guard<std::mutex> lock(client_.mu_);
  if (--client_.batch_depth_ == 0) client_.cv_.notify_all();
}

}  // namespace client
}  // namespace offloadd
