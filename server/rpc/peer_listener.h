// PeerListener: offloadd's own listening Unix socket. gRPC 1.51 does not expose a Unix peer's
// credentials (ServerContext::peer() is "unix:" and the insecure AuthContext carries none), so
// the daemon accepts connections itself, reads each one's SO_PEERCRED / SO_PEERGROUPS, and hands
// the file descriptor to gRPC (grpc::AddInsecureChannelFromFd). Calls on such a connection have
// the peer string "fd:<N>" (checked with gRPC 1.51), which Lookup() maps back to the credentials
// read at accept time. A descriptor number is only reused after gRPC closed the connection that
// had it, and every call looks its peer up when it starts, so a call never sees another
// connection's credentials.
//
// Connections are counted (per peer uid and in total) and bounded, and connections that never
// make an offloadd call are shut down after a timeout (session::ConnectionLimits). The listener
// learns that gRPC closed a connection by re-checking each recorded descriptor's inode (fstat):
// on every accept that would pass a bound, and at least once a second. Only this thread
// accepts, so a descriptor number it checks cannot meanwhile name another accepted connection.
//
// The socket file is created with `mode` (chmod after bind) and, when gid >= 0, the group `gid`
// (chown): the first gate, before the access policy of session/peer.h.
#ifndef OFFLOADD_SERVER_RPC_PEER_LISTENER_H_
#define OFFLOADD_SERVER_RPC_PEER_LISTENER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "server/session/peer.h"

namespace offloadd::rpc {

class PeerListener {
 public:
  // Binds `path` (which must not exist: see ClearStaleSocket) and listens. Errors:
  // UNAVAILABLE when bind/listen fail; PERMISSION_DENIED when chmod/chown fail (each with the
  // path and errno's text).
  static absl::StatusOr<std::unique_ptr<PeerListener>> Listen(const std::string& path,
                                                              uint32_t mode, int64_t gid);
  // Takes `fd`, a socket already listening (socket activation); closes it at Stop().
  static std::unique_ptr<PeerListener> FromListeningFd(int fd);
  ~PeerListener();  // Stop()

  // Starts the accept thread; each accepted connection (non-blocking, close-on-exec) within
  // `limits` is recorded with its credentials and passed to `adopt`, which takes ownership of
  // the fd; one past them is closed. `is_admin` says which peers get the admin reserve.
  void Start(std::function<void(int fd)> adopt, session::ConnectionLimits limits = {},
             std::function<bool(const session::PeerCredentials&)> is_admin = nullptr);
  // Stops accepting and closes the listening socket (new connects are refused); joins the
  // thread. Connections already adopted are unaffected. Idempotent.
  void Stop();

  // Credentials of the connection a call arrived on, from the call's peer string. Unknown
  // (known = false) for a peer string that is not "fd:<N>" of an accepted connection. Marks
  // the connection as used (no unused-connection timeout).
  session::PeerCredentials Lookup(const std::string& peer) const;

  uint64_t accepted_total() const { return accepted_total_.load(); }
  uint64_t refused_total() const { return refused_total_.load(); }
  // Connections recorded as open (as of the last check).
  size_t connections_open() const;

 private:
  struct Connection {
    session::PeerCredentials cred;
    uint64_t dev = 0, ino = 0;  // of the socket, to notice the descriptor was closed
    double accepted_seconds = 0;
    bool used = false, shut_down = false;
  };
  PeerListener(int fd, int wake_fd) : fd_(fd), wake_fd_(wake_fd) {}
  void Loop();
  // Records (true) or closes (false) a new connection, by the limits.
  bool Admit(int conn);
  // Forgets connections gRPC closed, shuts down unused ones past the timeout; mu_ held.
  void SweepLocked(double now) REQUIRES(mu_);
  // Whether one more connection of `cred` fits; mu_ held.
  bool FitsLocked(const session::PeerCredentials& cred) const REQUIRES(mu_);
  void ForgetLocked(std::unordered_map<int, Connection>::iterator it) REQUIRES(mu_);

  int fd_ = -1, wake_fd_ = -1;
  std::function<void(int)> adopt_;
  std::thread thread_;
  bool stopped_ = false;
  session::ConnectionLimits limits_;
  std::function<bool(const session::PeerCredentials&)> is_admin_;
  mutable base::Mutex mu_;
  mutable std::unordered_map<int, Connection> by_fd_ GUARDED_BY(mu_);  // Lookup marks `used`
  std::unordered_map<uint32_t, size_t> per_uid_ GUARDED_BY(mu_);  // open connections, known peers
  double last_refusal_log_seconds_ GUARDED_BY(mu_) = -1e9;
  std::atomic<uint64_t> accepted_total_{0}, refused_total_{0};
};

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_PEER_LISTENER_H_
