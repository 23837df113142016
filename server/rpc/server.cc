#include "server/rpc/server.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <mutex>

#include "absl/strings/str_format.h"
#include "grpcpp/grpcpp.h"
#include "grpcpp/health_check_service_interface.h"
#include "proto/offload.grpc.pb.h"
#include "server/rpc/translate.h"

namespace offloadd::rpc {
namespace {

// One client stream. Reads batches of requests and hands each to the Session; completions
// from any thread are coalesced into one ServerMessage per write (at most one write in flight).
class SessionReactor : public grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage> {
 public:
  SessionReactor(session::Core* core, grpc::CallbackServerContext* ctx,
                 const std::atomic<bool>* shutting_down)
      : ctx_(ctx), shutting_down_(shutting_down) {
    session_ = session::Session::Create(
        core, [this](session::Completion c) { Enqueue(std::move(c)); });
    StartRead(&in_);
  }

  void OnReadDone(bool ok) override {
    if (ok) {
      for (const v1::Request& r : in_.requests()) session_->Handle(FromProto(r));
      in_.Clear();
      StartRead(&in_);
      return;
    }
    // The client half-closed, the stream broke, or the daemon is stopping.
    session::EndCause cause = shutting_down_->load()  ? session::EndCause::kShutdown
                              : ctx_->IsCancelled() ? session::EndCause::kCrashed
                                                    : session::EndCause::kClosed;
    session_->Close(cause);
    std::lock_guard<std::mutex> lock(mu_);
    finish_requested_ = true;
    MaybeFinishLocked();
  }

  void OnWriteDone(bool ok) override {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) {
      broken_ = true;
      out_pending_.Clear();
    }
    if (out_pending_.responses_size() > 0) {
      StartBatchLocked();
    } else {
      MaybeFinishLocked();
    }
  }

  void OnDone() override {
    session_->Close(session::EndCause::kCrashed);  // no-op if already closed
    delete this;
  }

 private:
  void Enqueue(session::Completion c) {
    std::lock_guard<std::mutex> lock(mu_);
    if (broken_ || finished_) return;
    ToProto(c, out_pending_.add_responses());
    if (!writing_) StartBatchLocked();
  }
  void StartBatchLocked() {
    out_.Swap(&out_pending_);
    out_pending_.Clear();
    writing_ = true;
    StartWrite(&out_);
  }
  void MaybeFinishLocked() {
    if (finish_requested_ && !writing_ && out_pending_.responses_size() == 0 && !finished_) {
      finished_ = true;
      Finish(grpc::Status::OK);
    }
  }

  grpc::CallbackServerContext* ctx_;
  const std::atomic<bool>* shutting_down_;
  std::shared_ptr<session::Session> session_;
  v1::ClientMessage in_;
  std::mutex mu_;
  v1::ServerMessage out_;          // being written
  v1::ServerMessage out_pending_;  // responses queued since the last write started
  bool writing_ = false, broken_ = false, finish_requested_ = false, finished_ = false;
};

class OffloadService : public v1::Offload::CallbackService {
 public:
  explicit OffloadService(session::Core* core) : core_(core) {}

  grpc::ServerBidiReactor<v1::ClientMessage, v1::ServerMessage>* Session(
      grpc::CallbackServerContext* ctx) override {
    return new SessionReactor(core_, ctx, &shutting_down_);
  }

  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* ctx,
                                     const v1::GetStatsRequest*, v1::Stats* out) override {
    ToProto(core_->Stats(), out);
    auto* reactor = ctx->DefaultReactor();
    reactor->Finish(grpc::Status::OK);
    return reactor;
  }

  std::atomic<bool> shutting_down_{false};

 private:
  session::Core* core_;
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
  std::unique_ptr<OffloadService> service;
  std::unique_ptr<grpc::Server> server;
  session::Core* core = nullptr;
  bool stopped = false;
};

absl::StatusOr<std::unique_ptr<Server>> Server::Start(session::Core* core,
                                                      const std::string& socket_path,
                                                      uint32_t socket_mode) {
  if (socket_path.size() > 107) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path %s is %d bytes; Unix socket paths are limited to 107: choose a shorter "
        "socket_path",
        socket_path, socket_path.size()));
  }
  std::string dir = socket_path.substr(0, socket_path.rfind('/'));
  if (!dir.empty()) {
    // mkdir -p
    for (size_t i = 1; i <= dir.size(); ++i) {
      if (i == dir.size() || dir[i] == '/') {
        std::string part = dir.substr(0, i);
        if (mkdir(part.c_str(), 0755) != 0 && errno != EEXIST) {
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
  }
  if (absl::Status st = ClearStaleSocket(socket_path); !st.ok()) return st;

  auto impl = std::make_unique<Impl>();
  impl->core = core;
  impl->service = std::make_unique<OffloadService>(core);
  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + socket_path, grpc::InsecureServerCredentials());
  builder.RegisterService(impl->service.get());
  builder.SetMaxReceiveMessageSize(64 << 20);
  impl->server = builder.BuildAndStart();
  if (!impl->server) {
    return absl::UnavailableError(
        absl::StrFormat("gRPC could not listen on unix:%s (see the log above)", socket_path));
  }
  if (chmod(socket_path.c_str(), socket_mode) != 0) {
    return absl::PermissionDeniedError(
        absl::StrFormat("chmod %o %s: %s", socket_mode, socket_path, strerror(errno)));
  }
  return std::unique_ptr<Server>(new Server(std::move(impl), socket_path));
}

Server::Server(std::unique_ptr<Impl> impl, std::string socket_path)
    : impl_(std::move(impl)), socket_path_(std::move(socket_path)) {}

Server::~Server() { Shutdown(); }

void Server::Shutdown() {
  if (impl_->stopped) return;
  impl_->stopped = true;
  impl_->service->shutting_down_ = true;
  impl_->core->Drain();  // finish copies in flight; completions go out on open streams
  impl_->server->GetHealthCheckService()->Shutdown();
  // Give streams a moment to flush their last completions, then cancel what remains.
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(500));
  impl_->server->Wait();
  unlink(socket_path_.c_str());
}

}  // namespace offloadd::rpc
