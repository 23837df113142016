// Client against a fake in-process offloadd: a sync gRPC Offload service that answers with canned
// results (and a miniature shm "pool" so bytes really round-trip), errors for some inputs, holds
// some requests unanswered, and can kill the stream.
#include "client/offloadd_client.h"

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "client/shm_region.h"
#include "common/ring_format.h"
#include "gtest/gtest.h"
#include "proto/offload.grpc.pb.h"

namespace offloadd {
namespace client {
namespace {

constexpr uint64_t kHoldOffset = 0xdead0000;  // offload never answered
constexpr uint64_t kKillOffset = 0xdead0001;  // the fake ends the stream with an error status
constexpr uint64_t kWrongKindBlock = 424242;  // Release answered with a HelloReply
// A reload at this offset releases its block (release_after) and the stream then ends
// UNAVAILABLE without an answer: a daemon killed after the release, before its answer went out.
constexpr uint64_t kReleaseThenDieOffset = 0xdead0002;

void SetError(v1::Response* r, grpc::StatusCode code, const std::string& message) {
  r->mutable_error()->set_code(static_cast<int>(code));
  r->mutable_error()->set_message(message);
}

// The request a ring submission stands for (the fake answers it as it answers the stream).
v1::Request RequestOfEntry(const common::SubmissionEntry& e) {
  v1::Request r;
  r.set_request_id(e.request_id);
  switch (static_cast<common::SubmissionKind>(e.kind)) {
    case common::SubmissionKind::kOffload:
      r.mutable_offload()->set_region_id(e.region_id);
      r.mutable_offload()->set_offset(e.offset_bytes);
      r.mutable_offload()->set_bytes(e.size_bytes);
      r.mutable_offload()->set_tag(e.tag);
      break;
    case common::SubmissionKind::kReload:
      r.mutable_reload()->set_block_id(e.block_id);
      r.mutable_reload()->set_tag(e.tag);
      r.mutable_reload()->set_region_id(e.region_id);
      r.mutable_reload()->set_offset(e.offset_bytes);
      r.mutable_reload()->set_release_after((e.flags & common::kSubmitReleaseAfter) != 0);
      r.mutable_reload()->set_deadline_seconds(e.deadline_seconds);
      break;
    case common::SubmissionKind::kRelease:
      r.mutable_release()->set_block_id(e.block_id);
      r.mutable_release()->set_tag(e.tag);
      break;
  }
  return r;
}

// The completion entry of the fake's answer `r`.
common::CompletionEntry CompletionOfResponse(const v1::Response& r) {
  if (r.has_error()) {
    return common::MakeCompletion(r.request_id(), common::CompletionKind::kError,
                                  r.error().code(), r.error().message());
  }
  const common::CompletionKind kind = r.has_offload_done()  ? common::CompletionKind::kOffloadDone
                                      : r.has_reload_done() ? common::CompletionKind::kReloadDone
                                                            : common::CompletionKind::kReleased;
  common::CompletionEntry c = common::MakeCompletion(r.request_id(), kind, 0, "");
  if (r.has_offload_done()) {
    c.block_id = r.offload_done().block_id();
    c.bytes = r.offload_done().bytes();
  } else if (r.has_reload_done()) {
    c.block_id = r.reload_done().block_id();
    c.bytes = r.reload_done().bytes();
    c.flags = r.reload_done().released() ? common::kCompleteReleased : 0;
  } else {
    c.block_id = r.released().block_id();
  }
  return c;
}

// The daemon side of one request ring the fake attached: maps the memfd a Hello named (the
// client runs in this process, so its descriptor is valid here), answers each submission on a
// thread of its own through `answer` (false: the answer is held back, never sent), and when
// destroyed (its stream ended) stops, marks the ring closed and wakes the client, as the daemon
// does.
class FakeRing {
 public:
  using Answer = std::function<bool(const v1::Request&, v1::Response*)>;
  // `polls`: the ring's state line says the daemon polls the ring every 500 us (deferred
  // wake-ups), while this fake takes submissions only when rung: a daemon whose next poll is
  // far off.
  static std::unique_ptr<FakeRing> Map(int fd, bool polls = false) {
    struct stat st;
    if (fstat(fd, &st) != 0) return nullptr;
    void* base = mmap(nullptr, st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED) return nullptr;
    common::RingHeader header;
    std::memcpy(&header, base, sizeof(header));
    common::RingLayout layout;
    std::string error;
    if (!common::ParseRingHeader(header, st.st_size, &layout, &error)) {
      munmap(base, st.st_size);
      return nullptr;
    }
    auto ring = std::unique_ptr<FakeRing>(new FakeRing(base, layout));
    if (polls) ring->control_->state.poll_microseconds.store(500);
    return ring;
  }
  void Serve(Answer answer) {
    thread_ = std::thread([this, answer = std::move(answer)] { Loop(answer); });
  }
  ~FakeRing() {
    stop_ = true;
    control_->daemon_doorbell.RingAlways();
    if (thread_.joinable()) thread_.join();
    control_->state.closed.store(1);
    control_->client_doorbell.RingAlways();
    munmap(base_, layout_.total_bytes);
  }

 private:
  FakeRing(void* base, const common::RingLayout& layout)
      : base_(base), layout_(layout), control_(common::ControlOf(base)),
        take_(common::SubmissionSlots(base, layout), layout.submission_entries,
              &control_->submission_tail, &control_->submission_head),
        give_(common::CompletionSlots(base, layout), layout.completion_entries,
              &control_->completion_tail, &control_->completion_head) {}

  void Loop(const Answer& answer) {
    while (!stop_) {
      common::SubmissionEntry e;
      if (take_.TryPop(&e) == common::RingResult::kOk) {
        v1::Response response;
        if (!answer(RequestOfEntry(e), &response)) continue;
        while (give_.TryPush(CompletionOfResponse(response)) == common::RingResult::kFull &&
               !stop_) {
          std::this_thread::yield();
        }
        control_->client_doorbell.Ring();
        continue;
      }
      const uint32_t seen = control_->daemon_doorbell.Arm();
      if (take_.Available() == common::RingResult::kEmpty && !stop_) {
        control_->daemon_doorbell.Sleep(seen, -1);
      }
      control_->daemon_doorbell.Disarm();
    }
  }

  void* const base_;
  const common::RingLayout layout_;
  common::RingControl* const control_;
  common::RingConsumer<common::SubmissionEntry> take_;
  common::RingProducer<common::CompletionEntry> give_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

class FakeOffload final : public v1::Offload::Service {
 public:
  grpc::Status Session(
      grpc::ServerContext*,
      grpc::ServerReaderWriter<v1::ServerMessage, v1::ClientMessage>* stream) override {
    if (EndAtOpen()) return grpc::Status(grpc::StatusCode::UNAVAILABLE, "ended at its open");
    v1::ClientMessage in;
    std::unique_ptr<FakeRing> ring;  // the ring this stream's Hello attached
    while (stream->Read(&in)) {
      v1::ServerMessage out;
      bool kill = false;
      bool unavailable = false;
      std::unique_ptr<FakeRing> fresh;
      {
        std::lock_guard<std::mutex> lock(mu_);
        ++messages_;
        requests_ += in.requests_size();
        cv_.notify_all();
        last_batch_size_ = in.requests_size();
        // Answer in reverse order: the client must match responses by request id.
        for (int i = in.requests_size() - 1; i >= 0; --i) {
          if (RefusedOnStream(in.requests(i), ring != nullptr, &out)) continue;
          kill |= Handle(in.requests(i), &out);
        }
        unavailable = die_unavailable_;
        die_unavailable_ = false;
        fresh = std::move(attached_);
      }
      if (fresh != nullptr) {  // served before the HelloReply goes out
        ring = std::move(fresh);
        ring->Serve([this](const v1::Request& r, v1::Response* response) {
          return AnswerFromRing(r, response);
        });
      }
      if (kill && unavailable) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "daemon killed by the test");
      }
      if (kill) return grpc::Status(grpc::StatusCode::INTERNAL, "killed by the test");
      if (out.responses_size() > 0 && !stream->Write(out)) break;
      if (HelloThenEnd()) {
        return grpc::Status(grpc::StatusCode::UNAVAILABLE, "ended after the HelloReply");
      }
    }
    return grpc::Status::OK;
  }

  grpc::Status GetStats(grpc::ServerContext*, const v1::GetStatsRequest*,
                        v1::Stats* stats) override {
    std::lock_guard<std::mutex> lock(mu_);
    stats->set_backend("shm");
    stats->set_pool_capacity_bytes(1 << 30);
    stats->set_blocks(blocks_.size());
    return grpc::Status::OK;
  }

  int messages() {
    std::lock_guard<std::mutex> l(mu_);
    return messages_;
  }
  int requests() {
    std::lock_guard<std::mutex> l(mu_);
    return requests_;
  }
  int last_batch_size() {
    std::lock_guard<std::mutex> l(mu_);
    return last_batch_size_;
  }
  v1::Hello last_hello() {
    std::lock_guard<std::mutex> l(mu_);
    return last_hello_;
  }
  v1::ReloadRequest last_reload() {
    std::lock_guard<std::mutex> l(mu_);
    return last_reload_;
  }
  void set_hello_error(bool v) {
    std::lock_guard<std::mutex> l(mu_);
    hello_error_ = v;
  }
  // Hello replies offer resuming (as a daemon on a shared pool does); a Hello presenting the
  // token is handed every block the fake still holds.
  void set_resumable(bool v) {
    std::lock_guard<std::mutex> l(mu_);
    resumable_ = v;
  }
  int resumed_hellos() {
    std::lock_guard<std::mutex> l(mu_);
    return resumed_hellos_;
  }
  // A restarted daemon on a fresh pool: a Hello presenting a resume token is refused
  // NOT_FOUND, and new sessions get `token`.
  void set_unknown_tokens(const std::string& token) {
    std::lock_guard<std::mutex> l(mu_);
    unknown_tokens_ = true;
    token_ = token;
  }
  // Hello replies say the request ring is attached (it is not mapped), and the stream ends
  // right after the HelloReply: a daemon that dies as a client connects.
  void set_hello_then_end(bool v) {
    std::lock_guard<std::mutex> l(mu_);
    hello_then_end_ = v;
  }
  bool HelloThenEnd() {
    std::lock_guard<std::mutex> l(mu_);
    return hello_then_end_;
  }
  // Every stream ends UNAVAILABLE as it opens, before reading the Hello: a daemon that dies
  // while a client connects, before the client has sent anything.
  void set_end_at_open(bool v) {
    std::lock_guard<std::mutex> l(mu_);
    end_at_open_ = v;
  }
  bool EndAtOpen() {
    std::lock_guard<std::mutex> l(mu_);
    return end_at_open_;
  }
  void set_hello_silent(bool v) {
    std::lock_guard<std::mutex> l(mu_);
    hello_silent_ = v;
  }
  // Hello replies attach the request ring the Hello offers, and the fake serves it: its
  // submissions are answered as the same requests on the stream.
  void set_serve_ring(bool v) {
    std::lock_guard<std::mutex> l(mu_);
    serve_ring_ = v;
  }
  // With serve_ring: the rings say their daemon polls them (FakeRing::Map's `polls`).
  void set_ring_polls(bool v) {
    std::lock_guard<std::mutex> l(mu_);
    ring_polls_ = v;
  }
  // Ring submissions are taken and never answered (a daemon that dies before answering).
  void set_hold_ring_requests(bool v) {
    std::lock_guard<std::mutex> l(mu_);
    hold_ring_requests_ = v;
  }
  int ring_requests() {
    std::lock_guard<std::mutex> l(mu_);
    return ring_requests_;
  }
  int ring_ids_on_stream() {
    std::lock_guard<std::mutex> l(mu_);
    return ring_ids_on_stream_;
  }
  // The pool's blocks (block id -> bytes), and a restarted daemon on the same shared pool.
  std::map<uint64_t, std::string> blocks() {
    std::lock_guard<std::mutex> l(mu_);
    return blocks_;
  }
  void set_blocks(std::map<uint64_t, std::string> blocks) {
    std::lock_guard<std::mutex> l(mu_);
    blocks_ = std::move(blocks);
    if (!blocks_.empty()) next_block_ = blocks_.rbegin()->first + 1;
  }
  // Blocks until rings handed the fake at least `n` submissions in total.
  void WaitForRingRequests(int n) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return ring_requests_ >= n; });
  }
  // Blocks until the fake has read at least `n` requests in total.
  void WaitForRequests(int n) {
    std::unique_lock<std::mutex> l(mu_);
    cv_.wait(l, [&] { return requests_ >= n; });
  }

 private:
  // A submission the ring thread took: answered as on the stream (false: held, no answer).
  bool AnswerFromRing(const v1::Request& r, v1::Response* response) {
    std::lock_guard<std::mutex> lock(mu_);
    ++ring_requests_;
    cv_.notify_all();
    if (hold_ring_requests_) return false;
    v1::ServerMessage out;
    Handle(r, &out);
    if (out.responses_size() == 0) return false;
    *response = out.responses(0);
    return true;
  }

  // On the stream of a ring session a ring request id is refused, as the daemon does: true
  // (and the error appended to `out`) for such a request. mu_ held.
  bool RefusedOnStream(const v1::Request& r, bool ring_session, v1::ServerMessage* out) {
    if (!ring_session || (r.request_id() & common::kRingRequestIdBit) == 0) return false;
    ++ring_ids_on_stream_;
    v1::Response* resp = out->add_responses();
    resp->set_request_id(r.request_id());
    SetError(resp, grpc::StatusCode::INVALID_ARGUMENT, "a ring request id on the stream");
    return true;
  }

  // Appends the response to `r` (unless held); returns true to kill the stream.
  bool Handle(const v1::Request& r, v1::ServerMessage* out) {  // mu_ held
    v1::Response resp;
    resp.set_request_id(r.request_id());
    switch (r.body_case()) {
      case v1::Request::kHello:
        last_hello_ = r.hello();
        if (hello_silent_) return false;
        if (hello_error_) {
          SetError(&resp, grpc::StatusCode::FAILED_PRECONDITION, "hello refused by the test");
          break;
        }
        resp.mutable_hello()->set_session_id(7);
        resp.mutable_hello()->set_backend("shm");
        resp.mutable_hello()->set_pool_capacity_bytes(1ull << 30);
        resp.mutable_hello()->set_session_quota_bytes(1ull << 28);
        resp.mutable_hello()->set_chunk_bytes(4 << 20);
        resp.mutable_hello()->set_link(r.hello().device_id() + "-link");
        if (hello_then_end_) resp.mutable_hello()->set_ring_attached(true);
        if (resumable_ && unknown_tokens_ && !r.hello().resume_token().empty()) {
          SetError(&resp, grpc::StatusCode::NOT_FOUND, "no session holds this resume token");
          break;
        }
        if (serve_ring_ && r.hello().has_ring()) {
          attached_ = FakeRing::Map(r.hello().ring().fd(), ring_polls_);
          resp.mutable_hello()->set_ring_attached(attached_ != nullptr);
        }
        if (resumable_) {
          resp.mutable_hello()->set_resume_token(token_);
          resp.mutable_hello()->set_resume_grace_seconds(30);
          if (!r.hello().resume_token().empty()) {
            ++resumed_hellos_;
            for (const auto& [id, data] : blocks_) resp.mutable_hello()->add_resumed_block_ids(id);
          }
        }
        break;
      case v1::Request::kRegisterRegion: {
        const v1::RegionHandle& h = r.register_region().handle();
        uint64_t id = next_region_++;
        if (h.kind_case() == v1::RegionHandle::kShmName) {
          absl::StatusOr<ShmRegion> region = ShmRegion::Open(h.shm_name());
          if (!region.ok()) {
            SetError(&resp, static_cast<grpc::StatusCode>(region.status().code()),
                     std::string(region.status().message()));
            break;
          }
          if (region->size_bytes() != h.size_bytes()) {
            SetError(&resp, grpc::StatusCode::OUT_OF_RANGE, "size mismatch");
            break;
          }
          regions_.emplace(id, std::make_shared<ShmRegion>(*std::move(region)));
        } else {
          regions_.emplace(id, nullptr);  // cuda handle: accepted, not mapped
        }
        resp.mutable_region_registered()->set_region_id(id);
        break;
      }
      case v1::Request::kUnregisterRegion:
        if (regions_.erase(r.unregister_region().region_id()) == 0) {
          SetError(&resp, grpc::StatusCode::NOT_FOUND, "unknown region");
        } else {
          resp.mutable_region_unregistered()->set_region_id(r.unregister_region().region_id());
        }
        break;
      case v1::Request::kOffload: {
        const v1::OffloadRequest& o = r.offload();
        if (o.offset() == kHoldOffset) return false;
        if (o.offset() == kKillOffset) return true;
        if (o.bytes() == 0) {
          SetError(&resp, grpc::StatusCode::INVALID_ARGUMENT, "bytes must be > 0");
          break;
        }
        auto it = regions_.find(o.region_id());
        if (it == regions_.end()) {
          SetError(&resp, grpc::StatusCode::NOT_FOUND, "unknown region");
          break;
        }
        std::string data;
        if (it->second != nullptr) {
          if (o.offset() + o.bytes() > it->second->size_bytes()) {
            SetError(&resp, grpc::StatusCode::OUT_OF_RANGE, "past the region");
            break;
          }
          data.assign(static_cast<const char*>(it->second->data()) + o.offset(), o.bytes());
        } else {
          data.assign(o.bytes(), '\0');
        }
        uint64_t block = next_block_++;
        blocks_[block] = std::move(data);
        resp.mutable_offload_done()->set_block_id(block);
        resp.mutable_offload_done()->set_bytes(o.bytes());
        resp.mutable_offload_done()->set_queued_seconds(o.offset() * 0.5);
        resp.mutable_offload_done()->set_copy_seconds(0.25);
        break;
      }
      case v1::Request::kReload: {
        const v1::ReloadRequest& rl = r.reload();
        last_reload_ = rl;
        auto block = blocks_.find(rl.block_id());
        auto region = regions_.find(rl.region_id());
        if (block == blocks_.end() || region == regions_.end()) {
          SetError(&resp, grpc::StatusCode::NOT_FOUND, "unknown block or region");
          break;
        }
        if (rl.offset() == kReleaseThenDieOffset && rl.release_after()) {
          blocks_.erase(block);
          die_unavailable_ = true;
          return true;
        }
        if (region->second != nullptr) {
          if (rl.offset() + block->second.size() > region->second->size_bytes()) {
            SetError(&resp, grpc::StatusCode::OUT_OF_RANGE, "past the region");
            break;
          }
          std::memcpy(static_cast<char*>(region->second->data()) + rl.offset(),
                      block->second.data(), block->second.size());
        }
        resp.mutable_reload_done()->set_block_id(rl.block_id());
        resp.mutable_reload_done()->set_bytes(block->second.size());
        resp.mutable_reload_done()->set_released(rl.release_after());
        resp.mutable_reload_done()->set_copy_seconds(rl.deadline_seconds() + 1);
        if (rl.release_after()) blocks_.erase(block);
        break;
      }
      case v1::Request::kRelease:
        if (r.release().block_id() == kWrongKindBlock) {
          resp.mutable_hello();
        } else if (blocks_.erase(r.release().block_id()) == 0) {
          SetError(&resp, grpc::StatusCode::NOT_FOUND, "no such block: it was released");
        } else {
          resp.mutable_released()->set_block_id(r.release().block_id());
        }
        break;
      default:
        SetError(&resp, grpc::StatusCode::INVALID_ARGUMENT, "empty request");
    }
    *out->add_responses() = std::move(resp);
    return false;
  }

  std::mutex mu_;  // guards everything below
  std::condition_variable cv_;
  bool serve_ring_ = false;
  bool hold_ring_requests_ = false;
  bool ring_polls_ = false;
  int ring_requests_ = 0;       // submissions taken from rings
  int ring_ids_on_stream_ = 0;  // ring request ids refused on a ring session's stream
  std::unique_ptr<FakeRing> attached_;  // the ring a Hello just attached, for its stream
  int messages_ = 0;
  int requests_ = 0;
  int last_batch_size_ = 0;
  bool hello_error_ = false;
  bool hello_silent_ = false;
  bool hello_then_end_ = false;
  bool end_at_open_ = false;
  bool resumable_ = false;
  bool unknown_tokens_ = false;
  std::string token_ = "token-of-the-test";
  bool die_unavailable_ = false;
  int resumed_hellos_ = 0;
  v1::Hello last_hello_;
  v1::ReloadRequest last_reload_;
  uint64_t next_region_ = 100;
  uint64_t next_block_ = 1000;
  std::map<uint64_t, std::shared_ptr<ShmRegion>> regions_;
  std::map<uint64_t, std::string> blocks_;
};

class ClientTest : public ::testing::Test {
 protected:
  void SetUp() override {
    // Bazel's TEST_TMPDIR is too long for a Unix socket path: use a short one under /tmp, in a
    // fresh directory (sandboxed runs share /tmp and may all have the same pid).
    char dir[] = "/tmp/offc-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
    socket_path_ = dir_ + "/d.sock";
    StartServer();
  }
  void TearDown() override {
    StopServer();
    unlink(socket_path_.c_str());
    rmdir(dir_.c_str());
  }

  // `configure` sets the new fake up before it serves (a client may be waiting to resume).
  void StartServer(const std::function<void(FakeOffload*)>& configure = nullptr) {
    grpc::EnableDefaultHealthCheckService(true);
    service_ = std::make_unique<FakeOffload>();
    if (configure) configure(service_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_path_, grpc::InsecureServerCredentials());
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
  }
  void StopServer() {
    if (server_ == nullptr) return;
    server_->Shutdown(std::chrono::system_clock::now());  // cancels open streams
    server_->Wait();
    server_.reset();
  }

  ClientOptions Options() {
    ClientOptions options;
    options.socket_path = socket_path_;
    options.client_name = "client_test";
    options.device_id = "shm0";
    options.connect_timeout_seconds = 5;
    return options;
  }
  std::unique_ptr<Client> MustConnect() {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(Options());
    EXPECT_TRUE(client.ok()) << client.status();
    return client.ok() ? *std::move(client) : nullptr;
  }

  std::string dir_;
  std::string socket_path_;
  std::unique_ptr<FakeOffload> service_;
  std::unique_ptr<grpc::Server> server_;
};

TEST_F(ClientTest, ConnectSendsHelloAndExposesReply) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->session_id(), 7u);
  EXPECT_EQ(client->backend(), "shm");
  EXPECT_EQ(client->pool_capacity_bytes(), 1ull << 30);
  EXPECT_EQ(client->session_quota_bytes(), 1ull << 28);
  EXPECT_EQ(client->chunk_bytes(), 4u << 20);
  EXPECT_EQ(client->link(), "shm0-link");
  EXPECT_EQ(client->socket_path(), socket_path_);
  v1::Hello hello = service_->last_hello();
  EXPECT_EQ(hello.client_name(), "client_test");
  EXPECT_EQ(hello.device_id(), "shm0");
  EXPECT_EQ(hello.pid(), static_cast<uint32_t>(getpid()));
  EXPECT_TRUE(client->stream_status().ok());
}

TEST_F(ClientTest, ConnectWithoutDaemonIsUnavailable) {
  ClientOptions options = Options();
  options.socket_path = socket_path_ + ".none";
  options.connect_timeout_seconds = 0.3;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
  EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(client.status().message().find(options.socket_path), std::string::npos);
  EXPECT_NE(client.status().message().find("no socket file"), std::string::npos);
}

TEST_F(ClientTest, ConnectRejectsOverlongSocketPath) {
  ClientOptions options = Options();
  options.socket_path = "/tmp/" + std::string(120, 'x');
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kInvalidArgument);
}

TEST_F(ClientTest, HelloErrorIsReturnedByConnect) {
  service_->set_hello_error(true);
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(Options());
  EXPECT_EQ(client.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client.status().message(), "hello refused by the test");
}

TEST_F(ClientTest, MissingHelloReplyIsDeadlineExceeded) {
  service_->set_hello_silent(true);
  ClientOptions options = Options();
  options.connect_timeout_seconds = 0.3;
  EXPECT_EQ(Client::Connect(options).status().code(), absl::StatusCode::kDeadlineExceeded);
}

TEST_F(ClientTest, OffloadReloadRoundTripsBytesThroughShm) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ShmRegion> region = ShmRegion::Create(64 << 10);
  ASSERT_TRUE(region.ok()) << region.status();
  auto* bytes = static_cast<unsigned char*>(region->data());
  for (size_t i = 0; i < region->size_bytes(); ++i) bytes[i] = static_cast<unsigned char>(i % 251);
  absl::StatusOr<uint64_t> region_id = client->RegisterShmRegion(*region);
  ASSERT_TRUE(region_id.ok()) << region_id.status();
  // The client's own region id (stable when auto_resume registers the region again with a
  // restarted daemon); the daemon's id (100 here) is what goes on the wire.
  EXPECT_EQ(*region_id, 1u);

  absl::StatusOr<OffloadResult> offload = client->Offload(*region_id, 4096, 8192).get();
  ASSERT_TRUE(offload.ok()) << offload.status();
  EXPECT_EQ(offload->block_id, 1000u);
  EXPECT_EQ(offload->bytes, 8192u);
  EXPECT_DOUBLE_EQ(offload->queued_seconds, 2048.0);
  EXPECT_DOUBLE_EQ(offload->copy_seconds, 0.25);

  std::memset(region->data(), 0, region->size_bytes());
  absl::StatusOr<ReloadResult> reload =
      client
          ->Reload(offload->block_id, *region_id, 0, Priority::kUrgent,
                   /*release_after=*/true, /*deadline_seconds=*/2.5)
          .get();
  ASSERT_TRUE(reload.ok()) << reload.status();
  EXPECT_EQ(reload->block_id, 1000u);
  EXPECT_EQ(reload->bytes, 8192u);
  EXPECT_TRUE(reload->released);
  EXPECT_DOUBLE_EQ(reload->copy_seconds, 3.5);
  for (size_t i = 0; i < 8192; ++i) {
    ASSERT_EQ(bytes[i], static_cast<unsigned char>((i + 4096) % 251)) << "byte " << i;
  }
  EXPECT_EQ(bytes[8192], 0);
  v1::ReloadRequest sent = service_->last_reload();
  EXPECT_EQ(sent.region_id(), 100u);
  EXPECT_EQ(sent.priority(), v1::URGENT);
  EXPECT_TRUE(sent.release_after());
  EXPECT_DOUBLE_EQ(sent.deadline_seconds(), 2.5);

  // Prefetch priority is sent as PREFETCH.
  absl::StatusOr<OffloadResult> second = client->Offload(*region_id, 0, 16).get();
  ASSERT_TRUE(second.ok()) << second.status();
  ASSERT_TRUE(client->Reload(second->block_id, *region_id, 0, Priority::kPrefetch).get().ok());
  EXPECT_EQ(service_->last_reload().priority(), v1::PREFETCH);
  EXPECT_FALSE(service_->last_reload().release_after());
  EXPECT_TRUE(client->Release(second->block_id).get().ok());

  // The first block was released by its reload: the daemon's NOT_FOUND comes through verbatim.
  absl::Status release = client->Release(offload->block_id).get();
  EXPECT_EQ(release.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(release.message(), "no such block: it was released");
  EXPECT_TRUE(client->UnregisterRegion(*region_id).ok());
  EXPECT_EQ(client->UnregisterRegion(*region_id).code(), absl::StatusCode::kNotFound);
}

TEST_F(ClientTest, ErrorsKeepTheDaemonsCodeAndMessage) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x01');
  cuda.size_bytes = 1 << 20;
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok()) << region_id.status();

  absl::StatusOr<OffloadResult> zero = client->Offload(*region_id, 0, 0).get();
  EXPECT_EQ(zero.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(zero.status().message(), "bytes must be > 0");
  EXPECT_EQ(client->Offload(999, 0, 8).get().status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(client->Reload(5, *region_id, 0, Priority::kUrgent).get().status().code(),
            absl::StatusCode::kNotFound);

  RegionHandle missing;
  missing.shm_name = "/offloadd-client-test-missing";
  missing.size_bytes = 4096;
  absl::StatusOr<uint64_t> not_found = client->RegisterRegion(missing);
  EXPECT_EQ(not_found.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(not_found.status().message().find(missing.shm_name), std::string::npos);

  // Rejected by the client before anything is sent.
  RegionHandle both = cuda;
  both.shm_name = "/x";
  EXPECT_EQ(client->RegisterRegion(both).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(client->RegisterRegion(RegionHandle()).status().code(),
            absl::StatusCode::kInvalidArgument);
  RegionHandle short_handle;
  short_handle.cuda_ipc_handle = "short";
  EXPECT_EQ(client->RegisterRegion(short_handle).status().code(),
            absl::StatusCode::kInvalidArgument);

  // A response of the wrong kind is a protocol mismatch.
  EXPECT_EQ(client->Release(kWrongKindBlock).get().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(client->stream_status().ok());
}

TEST_F(ClientTest, ConcurrentRequestsGetTheirOwnResults) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ShmRegion> region = ShmRegion::Create(1 << 20);
  ASSERT_TRUE(region.ok());
  absl::StatusOr<uint64_t> region_id = client->RegisterShmRegion(*region);
  ASSERT_TRUE(region_id.ok()) << region_id.status();
  constexpr int kThreads = 4, kPerThread = 250;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      std::vector<std::future<absl::StatusOr<OffloadResult>>> futures;
      for (int i = 0; i < kPerThread; ++i) {
        futures.push_back(client->Offload(*region_id, t * 1000 + i, 1 + t * kPerThread + i));
      }
      for (int i = 0; i < kPerThread; ++i) {
        absl::StatusOr<OffloadResult> r = futures[i].get();
        if (!r.ok() || r->bytes != static_cast<uint64_t>(1 + t * kPerThread + i) ||
            r->queued_seconds != (t * 1000 + i) * 0.5) {
          ++wrong;
        }
      }
    });
  }
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(wrong.load(), 0);
  ClientCounters counters = client->counters();
  EXPECT_EQ(counters.requests_sent, 2u + kThreads * kPerThread);  // + hello, register
  EXPECT_EQ(counters.responses_received, counters.requests_sent);
  EXPECT_EQ(counters.unknown_responses, 0u);
  EXPECT_EQ(service_->requests(), 2 + kThreads * kPerThread);
  EXPECT_EQ(service_->messages(), static_cast<int>(counters.messages_sent));
}

// Requests issued one after another (each waited for) go out one message each. The first
// request after the client went quiet finds no write in flight and starts its write on the
// calling thread; a request that finds the previous write's OnWriteDone not yet run is written
// from it instead, so only the bounds are fixed.
TEST_F(ClientTest, SequentialRequestsGoOutOneMessageEach) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x04');
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok());
  const ClientCounters before = client->counters();
  const int messages_before = service_->messages();
  constexpr int kRequests = 50;
  for (int i = 0; i < kRequests; ++i) {
    absl::StatusOr<OffloadResult> r = client->Offload(*region_id, i, 64 + i).get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->bytes, static_cast<uint64_t>(64 + i));
  }
  const ClientCounters after = client->counters();
  EXPECT_EQ(after.messages_sent - before.messages_sent, kRequests);
  EXPECT_GE(after.messages_sent_by_caller - before.messages_sent_by_caller, 1u);
  EXPECT_LE(after.messages_sent_by_caller - before.messages_sent_by_caller, kRequests);
  EXPECT_EQ(service_->messages() - messages_before, kRequests);
  EXPECT_EQ(service_->last_batch_size(), 1);
}

// Every answer is read by the stream's reactor, never by a waiting caller: get, wait_for and a
// Reply dropped unread all see their own answers; with several pending, each Reply gets its
// own; a Reply outlives its Client.
TEST_F(ClientTest, TheReactorReadsEveryAnswer) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x07');
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok());
  constexpr int kRequests = 50;
  for (int i = 0; i < kRequests; ++i) {
    absl::StatusOr<OffloadResult> r = client->Offload(*region_id, i, 64 + i).get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->bytes, static_cast<uint64_t>(64 + i));
  }
  auto polled = client->Offload(*region_id, 1, 100);
  ASSERT_EQ(polled.wait_for(std::chrono::seconds(5)), std::future_status::ready);
  EXPECT_EQ(polled.get()->bytes, 100u);
  // A Reply dropped unread: its answer is still taken off the stream.
  const uint64_t answered = client->counters().responses_received;
  { auto dropped = client->Offload(*region_id, 2, 101); }
  for (int i = 0; i < 5000 && client->counters().responses_received == answered; ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(client->counters().responses_received, answered + 1);
  EXPECT_EQ(client->Offload(*region_id, 3, 102).get()->bytes, 102u);

  // Several pending, answered out of order: each Reply gets its own answer.
  const int requests_before = service_->requests();
  auto held = client->Offload(*region_id, kHoldOffset, 64);  // never answered by the fake
  service_->WaitForRequests(requests_before + 1);
  auto second = client->Offload(*region_id, 4, 128);
  auto third = client->Offload(*region_id, 5, 256);
  EXPECT_EQ(third.get()->bytes, 256u);
  EXPECT_EQ(second.get()->bytes, 128u);
  EXPECT_EQ(client->counters().messages_read_by_caller, 0u);
  EXPECT_EQ(client->counters().unknown_responses, 0u);

  // The held request's Reply is waited on after its Client is gone.
  client.reset();
  EXPECT_EQ(held.get().status().code(), absl::StatusCode::kCancelled);
}

// The reactor keeps a read posted while nothing is pending: a daemon that goes away then is
// seen without any request (the stream status turns UNAVAILABLE; auto_resume finds no pool to
// resume from, the fake's HelloReply has resume_grace_seconds 0).
TEST_F(ClientTest, AnIdleClientSeesTheDaemonGo) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->stream_status().ok());
  StopServer();
  for (int i = 0; i < 10000 && client->stream_status().ok(); ++i) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  EXPECT_EQ(client->stream_status().code(), absl::StatusCode::kUnavailable)
      << client->stream_status();
  EXPECT_EQ(client->Release(1).get().code(), absl::StatusCode::kUnavailable);
}

// A daemon that attaches the ring and ends the stream right after its HelloReply: whichever of
// Connect (starting the ring thread) and the session thread (stopping the ring at the stream's
// end) comes first, the Client ends cleanly (a ring thread left unjoined aborts the process).
TEST_F(ClientTest, AStreamEndingRightAfterHelloLeavesNoRingThreadBehind) {
  service_->set_hello_then_end(true);
  for (int i = 0; i < 300; ++i) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(Options());
    ASSERT_TRUE(client.ok()) << client.status();
    EXPECT_TRUE((*client)->ring_attached());
    EXPECT_EQ((*client)->Release(1).get().code(), absl::StatusCode::kUnavailable);
  }
}

// A daemon that ends every stream as it opens: the session thread stops the ring (StopRing)
// while Connect is still setting the client up (its RingCore, the Hello). Connect must fail
// with the stream's UNAVAILABLE every time, and leave no ring thread behind (one left
// unjoined aborts the process). Under --config=tsan this also checks that the ring and the
// ring thread are published to the session thread before it can read them.
TEST_F(ClientTest, AStreamEndingAsItOpensFailsConnectUnavailable) {
  service_->set_end_at_open(true);
  for (int i = 0; i < 200; ++i) {
    ClientOptions options = Options();
    options.use_ring = true;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(options);
    ASSERT_FALSE(client.ok()) << "attempt " << i;
    EXPECT_EQ(client.status().code(), absl::StatusCode::kUnavailable) << client.status();
    EXPECT_NE(client.status().message().find("went away"), absl::string_view::npos)
        << client.status();
  }
}

TEST_F(ClientTest, BurstIsCoalescedIntoFewerMessages) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x02');
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok());
  const int messages_before = service_->messages();
  constexpr int kBurst = 2000;
  std::vector<std::future<absl::StatusOr<OffloadResult>>> futures;
  for (int i = 0; i < kBurst; ++i) futures.push_back(client->Offload(*region_id, i, 64));
  for (auto& f : futures) ASSERT_TRUE(f.get().ok());
  const int messages = service_->messages() - messages_before;
  EXPECT_EQ(service_->requests(), 2 + kBurst);
  // The writer sends whatever queued while it was writing: a burst needs fewer messages than
  // requests.
  EXPECT_LT(messages, kBurst);
  std::cout << kBurst << " requests arrived in " << messages << " messages\n";
  EXPECT_GE(messages, 1);
}

TEST_F(ClientTest, ScopedBatchSendsExactlyOneMessage) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x03');
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok());
  const int messages_before = service_->messages();
  std::vector<std::future<absl::StatusOr<OffloadResult>>> futures;
  {
    Client::ScopedBatch batch(*client);
    for (int i = 0; i < 100; ++i) futures.push_back(client->Offload(*region_id, i, 64));
  }
  for (auto& f : futures) ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(service_->messages(), messages_before + 1);
  EXPECT_EQ(service_->last_batch_size(), 100);
}

TEST_F(ClientTest, LargeBatchIsSplitAtTheMessageCap) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x07');
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok());
  const int messages_before = service_->messages();
  const int n = Client::kMaxRequestsPerMessage + 100;
  std::vector<std::future<absl::StatusOr<OffloadResult>>> futures;
  {
    Client::ScopedBatch batch(*client);
    for (int i = 0; i < n; ++i) futures.push_back(client->Offload(*region_id, i, 64));
  }
  for (auto& f : futures) ASSERT_TRUE(f.get().ok());
  EXPECT_EQ(service_->messages(), messages_before + 2);
  EXPECT_EQ(service_->last_batch_size(), 100);
}

TEST_F(ClientTest, StreamKilledFailsPendingAndLaterRequestsUnavailable) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x04');
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok());
  std::vector<std::future<absl::StatusOr<OffloadResult>>> held;
  for (int i = 0; i < 3; ++i) held.push_back(client->Offload(*region_id, kHoldOffset, 64));
  service_->WaitForRequests(2 + 3);
  auto killer = client->Offload(*region_id, kKillOffset, 64);
  for (auto& f : held) {
    absl::Status s = f.get().status();
    EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
    EXPECT_NE(s.message().find("went away"), std::string::npos) << s;
    EXPECT_NE(s.message().find("unix:" + socket_path_), std::string::npos) << s;
  }
  EXPECT_EQ(killer.get().status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->stream_status().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->Offload(*region_id, 0, 64).get().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->Release(1).get().code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->RegisterRegion(cuda).status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(ClientTest, DaemonShutdownFailsPendingThenReconnectWorks) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x05');
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok());
  auto held = client->Offload(*region_id, kHoldOffset, 64);
  service_->WaitForRequests(3);
  StopServer();
  absl::Status s = held.get().status();
  EXPECT_EQ(s.code(), absl::StatusCode::kUnavailable) << s;
  EXPECT_NE(s.message().find("went away"), std::string::npos) << s;
  EXPECT_EQ(client->Reload(1, *region_id, 0, Priority::kUrgent).get().status().code(),
            absl::StatusCode::kUnavailable);
  EXPECT_EQ(client->GetStats().status().code(), absl::StatusCode::kUnavailable);
  client.reset();  // Close() after the stream broke returns promptly

  unlink(socket_path_.c_str());
  StartServer();  // "the daemon restarted"
  std::unique_ptr<Client> again = MustConnect();
  ASSERT_NE(again, nullptr);
  EXPECT_EQ(again->session_id(), 7u);
}

// A client holding no blocks whose daemon came back without its session (a fresh pool) resumes
// as a new session: resume_token() is then the new session's, the one a later Resume() needs.
TEST_F(ClientTest, AResumeThatBeganANewSessionReportsItsToken) {
  service_->set_resumable(true);
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  EXPECT_EQ(client->resume_token(), "token-of-the-test");
  StopServer();
  unlink(socket_path_.c_str());
  StartServer([](FakeOffload* fake) {
    fake->set_resumable(true);
    fake->set_unknown_tokens("token-of-the-new-session");
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (client->counters().resumes == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(client->counters().resumes, 1u);
  EXPECT_EQ(client->resume_token(), "token-of-the-new-session");
  EXPECT_TRUE(client->GetStats().ok());
}

// A reload with release_after whose daemon released the block and died before answering: after
// the resume the block is gone, and the reload's answer is the documented DATA_LOSS of a
// release_after cut by a crash ("nothing can confirm it"), not that of a confirmed block the
// restarted daemon lost.
TEST_F(ClientTest, ReleaseAfterReloadCutByARestartIsUnconfirmedNotLost) {
  service_->set_resumable(true);
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<ShmRegion> region = ShmRegion::Create(64 << 10);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::StatusOr<uint64_t> region_id = client->RegisterShmRegion(*region);
  ASSERT_TRUE(region_id.ok()) << region_id.status();
  absl::StatusOr<OffloadResult> kept = client->Offload(*region_id, 0, 4096).get();
  ASSERT_TRUE(kept.ok()) << kept.status();
  absl::StatusOr<OffloadResult> offload = client->Offload(*region_id, 4096, 4096).get();
  ASSERT_TRUE(offload.ok()) << offload.status();

  absl::StatusOr<ReloadResult> reload =
      client
          ->Reload(offload->block_id, *region_id, kReleaseThenDieOffset, Priority::kUrgent,
                   /*release_after=*/true)
          .get();
  ASSERT_FALSE(reload.ok());
  EXPECT_EQ(reload.status().code(), absl::StatusCode::kDataLoss) << reload.status();
  EXPECT_NE(reload.status().message().find("release_after"), absl::string_view::npos)
      << reload.status();
  EXPECT_EQ(reload.status().message().find("confirmed stored"), absl::string_view::npos)
      << reload.status();
  EXPECT_EQ(service_->resumed_hellos(), 1);
  EXPECT_EQ(client->counters().resumes, 1u);
  // The block the reload released is not reported lost later either: the daemon's own answer
  // (NOT_FOUND, released) is what a second reload gets. The other block is still there.
  absl::StatusOr<ReloadResult> again =
      client->Reload(offload->block_id, *region_id, 0, Priority::kUrgent).get();
  EXPECT_EQ(again.status().code(), absl::StatusCode::kNotFound) << again.status();
  absl::StatusOr<ReloadResult> other =
      client->Reload(kept->block_id, *region_id, 8192, Priority::kUrgent).get();
  EXPECT_TRUE(other.ok()) << other.status();
}

// The daemon says it polls the ring, so offloads, releases and prefetch reloads are submitted
// without waking it (deferred wake-ups), but its next poll is far off (the fake takes
// submissions only when rung). A caller that waits on such a request's Reply (wait_for,
// wait_until, get) or converts it to a std::future rings the daemon first, and is answered
// without any poll.
TEST_F(ClientTest, WaitingOnARingReplyWakesTheDaemonForADeferredSubmission) {
  service_->set_serve_ring(true);
  service_->set_ring_polls(true);
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->ring_active());
  absl::StatusOr<ShmRegion> region = ShmRegion::Create(64 << 10);
  ASSERT_TRUE(region.ok()) << region.status();
  std::memset(region->data(), 0x5a, 8192);
  absl::StatusOr<uint64_t> region_id = client->RegisterShmRegion(*region);
  ASSERT_TRUE(region_id.ok()) << region_id.status();
  const auto bound = std::chrono::seconds(10);  // never reached unless nobody rings

  Reply<absl::StatusOr<OffloadResult>> offload = client->Offload(*region_id, 0, 4096);
  ASSERT_EQ(offload.wait_for(bound), std::future_status::ready);
  absl::StatusOr<OffloadResult> stored = offload.get();
  ASSERT_TRUE(stored.ok()) << stored.status();
  Reply<absl::StatusOr<ReloadResult>> prefetch =
      client->Reload(stored->block_id, *region_id, 4096, Priority::kPrefetch);
  ASSERT_EQ(prefetch.wait_until(std::chrono::steady_clock::now() + bound),
            std::future_status::ready);
  absl::StatusOr<ReloadResult> reloaded = prefetch.get();
  ASSERT_TRUE(reloaded.ok()) << reloaded.status();
  EXPECT_EQ(reloaded->bytes, 4096u);
  std::future<absl::Status> released = client->Release(stored->block_id);
  ASSERT_EQ(released.wait_for(bound), std::future_status::ready);
  EXPECT_TRUE(released.get().ok());
  EXPECT_EQ(service_->ring_requests(), 3);
  EXPECT_EQ(client->counters().ring_requests_sent, 3u);
}

// A daemon restart on a shared pool with the request ring in use: the resume's Hello offers a
// new ring, the restarted daemon attaches it, and the offloads, reloads and releases made after
// the resume go on it again (counted by the client and taken by the daemon's ring thread). The
// offload the old ring carried when the daemon died unanswered is sent again on the new stream,
// under a stream id (the daemon refuses ring ids on a ring session's stream), and a block
// offloaded before the restart reloads byte-exact.
TEST_F(ClientTest, AResumedSessionOffersANewRingAndSendsOnIt) {
  service_->set_resumable(true);
  service_->set_serve_ring(true);
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->ring_active());
  absl::StatusOr<ShmRegion> region = ShmRegion::Create(64 << 10);
  ASSERT_TRUE(region.ok()) << region.status();
  auto* bytes = static_cast<unsigned char*>(region->data());
  for (size_t i = 0; i < 8192; ++i) bytes[i] = static_cast<unsigned char>(i * 7 + 3);
  const std::string sent(reinterpret_cast<const char*>(bytes), 4096);
  absl::StatusOr<uint64_t> region_id = client->RegisterShmRegion(*region);
  ASSERT_TRUE(region_id.ok()) << region_id.status();
  absl::StatusOr<OffloadResult> before = client->Offload(*region_id, 0, 4096).get();
  ASSERT_TRUE(before.ok()) << before.status();
  EXPECT_EQ(service_->ring_requests(), 1);
  // The daemon takes the next offload from the ring and dies before answering it.
  service_->set_hold_ring_requests(true);
  Reply<absl::StatusOr<OffloadResult>> cut = client->Offload(*region_id, 4096, 4096);
  service_->WaitForRingRequests(2);
  EXPECT_EQ(client->counters().ring_requests_sent, 2u);

  StopServer();
  std::map<uint64_t, std::string> pool = service_->blocks();
  ASSERT_EQ(pool.size(), 1u);
  unlink(socket_path_.c_str());
  StartServer([&pool](FakeOffload* fake) {
    fake->set_resumable(true);
    fake->set_serve_ring(true);
    fake->set_blocks(pool);
  });
  absl::StatusOr<OffloadResult> resent = cut.get();
  ASSERT_TRUE(resent.ok()) << resent.status();
  EXPECT_EQ(client->counters().resumes, 1u);
  EXPECT_EQ(client->counters().resent, 1u);
  EXPECT_EQ(service_->ring_ids_on_stream(), 0);
  EXPECT_TRUE(service_->last_hello().has_ring());
  EXPECT_EQ(service_->last_hello().resume_token(), "token-of-the-test");
  EXPECT_TRUE(client->ring_active());

  std::memset(bytes + 16384, 0, 4096);
  absl::StatusOr<ReloadResult> reload =
      client->Reload(before->block_id, *region_id, 16384, Priority::kUrgent).get();
  ASSERT_TRUE(reload.ok()) << reload.status();
  EXPECT_EQ(reload->bytes, 4096u);
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(bytes + 16384), 4096), sent);
  EXPECT_TRUE(client->Release(resent->block_id).get().ok());
  absl::StatusOr<OffloadResult> after = client->Offload(*region_id, 8192, 4096).get();
  ASSERT_TRUE(after.ok()) << after.status();
  // The reload, the release and the offload after the resume went on the new ring.
  EXPECT_EQ(service_->ring_requests(), 3);
  EXPECT_EQ(client->counters().ring_requests_sent, 5u);
  EXPECT_EQ(client->counters().ring_responses_received, 4u);
}

// A restarted daemon that does not attach the ring the resume offered: the session goes on
// over the stream alone (ring_active() false, nothing counted on the ring) and works.
TEST_F(ClientTest, AResumeWhoseRingIsRefusedRunsOnTheStream) {
  service_->set_resumable(true);
  service_->set_serve_ring(true);
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  ASSERT_TRUE(client->ring_active());
  absl::StatusOr<ShmRegion> region = ShmRegion::Create(64 << 10);
  ASSERT_TRUE(region.ok()) << region.status();
  absl::StatusOr<uint64_t> region_id = client->RegisterShmRegion(*region);
  ASSERT_TRUE(region_id.ok()) << region_id.status();
  absl::StatusOr<OffloadResult> before = client->Offload(*region_id, 0, 4096).get();
  ASSERT_TRUE(before.ok()) << before.status();
  StopServer();
  std::map<uint64_t, std::string> pool = service_->blocks();
  unlink(socket_path_.c_str());
  StartServer([&pool](FakeOffload* fake) {
    fake->set_resumable(true);
    fake->set_blocks(pool);
  });
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (client->counters().resumes == 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_EQ(client->counters().resumes, 1u);
  EXPECT_TRUE(service_->last_hello().has_ring());  // offered, not attached
  EXPECT_FALSE(client->ring_active());
  absl::StatusOr<ReloadResult> reload =
      client->Reload(before->block_id, *region_id, 8192, Priority::kUrgent).get();
  ASSERT_TRUE(reload.ok()) << reload.status();
  EXPECT_TRUE(client->Release(before->block_id).get().ok());
  EXPECT_EQ(client->counters().ring_requests_sent, 1u);
  EXPECT_EQ(service_->ring_requests(), 0);
}

TEST_F(ClientTest, CloseCancelsPendingAndRejectsNewRequests) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  RegionHandle cuda;
  cuda.cuda_ipc_handle = std::string(kCudaIpcHandleBytes, '\x06');
  absl::StatusOr<uint64_t> region_id = client->RegisterRegion(cuda);
  ASSERT_TRUE(region_id.ok());
  auto held = client->Offload(*region_id, kHoldOffset, 64);
  auto answered = client->Offload(*region_id, 0, 64);
  client->Close();
  EXPECT_TRUE(answered.get().ok());  // queued before Close(): sent and answered
  EXPECT_EQ(held.get().status().code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(client->Offload(*region_id, 0, 64).get().status().code(),
            absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(client->stream_status().code(), absl::StatusCode::kFailedPrecondition);
  client->Close();  // idempotent
}

TEST_F(ClientTest, GetStatsAndHealth) {
  std::unique_ptr<Client> client = MustConnect();
  ASSERT_NE(client, nullptr);
  absl::StatusOr<v1::Stats> stats = client->GetStats();
  ASSERT_TRUE(stats.ok()) << stats.status();
  EXPECT_EQ(stats->backend(), "shm");
  EXPECT_EQ(stats->pool_capacity_bytes(), 1u << 30);

  EXPECT_TRUE(client->CheckHealth().ok()) << client->CheckHealth();
  EXPECT_EQ(client->CheckHealth("no.such.Service").code(), absl::StatusCode::kNotFound);
  server_->GetHealthCheckService()->SetServingStatus(false);
  absl::Status not_serving = client->CheckHealth();
  EXPECT_EQ(not_serving.code(), absl::StatusCode::kUnavailable);
  EXPECT_NE(not_serving.message().find("NOT_SERVING"), std::string::npos) << not_serving;
  server_->GetHealthCheckService()->SetServingStatus("offloadd.v1.Offload", true);
  EXPECT_TRUE(client->CheckHealth("offloadd.v1.Offload").ok());
}

}  // namespace
}  // namespace client
}  // namespace offloadd
