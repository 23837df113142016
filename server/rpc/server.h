// The gRPC server of offloadd: the offloadd.v1.Offload service (one bidi Session stream per
// client process, unary GetStats) and the standard gRPC health service, on a Unix socket.
//
// Socket handling: the parent directory is created (0755) if missing; an existing socket file
// is probed with connect(): a live daemon there is refused (FAILED_PRECONDITION naming the path),
// a stale file from a dead daemon is removed. The socket gets `socket_mode` (default 0660) and,
// with socket_gid >= 0, that group; it is removed by Shutdown().
//
// Connections are accepted by the daemon itself (rpc/peer_listener.h) so that each session is
// bound to its peer's credentials (session/peer.h). Back-pressure on a stream: while more than
// kMaxQueuedResponses completions wait to be written (the client does not read), the daemon
// stops reading that stream's requests, so HTTP/2 flow control holds the client's writes.
#ifndef OFFLOADD_SERVER_RPC_SERVER_H_
#define OFFLOADD_SERVER_RPC_SERVER_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/projector/refresh_service.h"
#include "server/session/core.h"

namespace offloadd::rpc {

class Server {
 public:
  // Errors: FAILED_PRECONDITION when another daemon listens on the path; PERMISSION_DENIED when
  // the directory cannot be created or written; INVALID_ARGUMENT for a path over 107 bytes;
  // UNAVAILABLE when gRPC cannot listen.
  // `projector`: what the offloadd.v1.Projector service runs on (rpc/projector_service.h);
  // nullptr: that service answers UNAVAILABLE. Its calls pass the same access policy as sessions.
  // Installs a process-wide protobuf log handler that sends libprotobuf's messages to glog at
  // most once per 10 s (a client sending unparsable messages must not flood the log).
  // `listen_fd` >= 0: a listening socket passed by the service manager (socket_activation.h)
  // for `socket_path`: it is used as is (no directory, stale-socket check, chmod or chown: the
  // .socket unit sets them) and the socket file is left in place at Shutdown, so connects made
  // while the daemon restarts wait in its backlog.
  static absl::StatusOr<std::unique_ptr<Server>> Start(
      session::Core* core, const std::string& socket_path, uint32_t socket_mode,
      int64_t socket_gid = -1, projector::RefreshService* projector = nullptr,
      int listen_fd = -1);
  static constexpr int kMaxQueuedResponses = 2048;
  // Requests of one ClientMessage handled between checks of the answers waiting to be written
  // (the C++ and Python clients send at most 4096 per message): a larger batch is handled in
  // slices, each request answered as usual (requests past max_requests_in_flight get
  // RESOURCE_EXHAUSTED each), and the session keeps serving. Responses per ServerMessage
  // written.
  static constexpr int kMaxRequestsPerMessage = 4096;
  static constexpr int kMaxResponsesPerMessage = 4096;
  // Threads that hand requests to sessions (base/worker_threads.h), off the gRPC callback
  // threads (a reaction must not block: opening a client's memory, waiting for its ready event); a stream's requests are handled in order on one of them at a time.
  static constexpr int kRequestWorkerThreads = 4;
  ~Server();  // Shutdown()

  // Graceful stop: new requests get UNAVAILABLE; transfers already accepted may finish for
  // CoreOptions::shutdown_grace_seconds (0 = as long as they take) and their completions are
  // sent; after it every session is closed (cause "shutdown"): queued chunks are cancelled,
  // running ones finish, and each request not yet answered is answered UNAVAILABLE "offloadd is
  // shutting down". Then every stream is closed and the socket file is removed. Queued projector refreshes fail with UNAVAILABLE first; running
  // ones finish and the calls waiting for them are answered. Idempotent.
  void Shutdown();
  const std::string& socket_path() const { return socket_path_; }
  // True when the listening socket came from the service manager (left in place at Shutdown).
  bool socket_activated() const;

  struct Impl;

 private:
  Server(std::unique_ptr<Impl> impl, std::string socket_path);
  std::unique_ptr<Impl> impl_;
  std::string socket_path_;
};

// Removes `path` if it is a socket no process listens on; FAILED_PRECONDITION if one does.
absl::Status ClearStaleSocket(const std::string& path);

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_SERVER_H_
