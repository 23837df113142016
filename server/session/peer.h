// Peer credentials and the access policy built on them.
//
// The rpc layer accepts every connection on its own listening socket and reads the connecting
// process's credentials from the connection's file descriptor (SO_PEERCRED: pid, uid, gid;
// SO_PEERGROUPS: supplementary groups). A session is bound to them:
//  - Hello's pid must name the peer: either the pid SO_PEERCRED reports (the daemon's PID
//    namespace) or, for a client in a child PID namespace (a container), the innermost entry of
//    the NSpid line of /proc/<peer pid>/status (the pid the client sees for itself). Hello pid 0
//    means "take the peer's". Anything else: PERMISSION_DENIED. SO_PEERCRED reports pid 0 for a
//    peer in a PID namespace the daemon cannot see (a daemon in its own container): then Hello's
//    pid is taken as given and the process is not watched.
//  - allowed_uids / allowed_gids (config) restrict who may open a session, on top of the
//    socket's file mode and group: empty lists allow everyone who can connect; with either list
//    set, a peer must match one of them (its uid in allowed_uids, or its primary or a
//    supplementary group in allowed_gids). PERMISSION_DENIED otherwise.
//  - A shared-memory region (shm backend) must belong to the peer's uid (or the peer is root):
//    the daemon may run as root and could open anyone's object by name; PERMISSION_DENIED.
//  - Admin calls (ending another process's session, seeing every session in GetStats) need uid
//    0, the daemon's own effective uid, or a uid in admin_uids.
#ifndef OFFLOADD_SERVER_SESSION_PEER_H_
#define OFFLOADD_SERVER_SESSION_PEER_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace offloadd::session {

struct PeerCredentials {
  bool known = false;  // false: connection not accepted through our listener (unit tests)
  int32_t pid = 0;     // in the daemon's PID namespace
  uint32_t uid = 0, gid = 0;
  std::vector<uint32_t> groups;  // supplementary groups (SO_PEERGROUPS), may be empty
};

struct AccessPolicy {
  std::vector<uint32_t> allowed_uids;  // empty (and allowed_gids empty): anyone who can connect
  std::vector<uint32_t> allowed_gids;
  std::vector<uint32_t> admin_uids;  // besides root and the daemon's own uid
};

// Bounds on the connections the daemon holds (each is a file descriptor and gRPC transport
// state). A connection past a bound is closed at accept (the client sees UNAVAILABLE at
// connect); admins (IsAdmin: root, the daemon's uid, admin_uids) may hold
// admin_reserved_connections more than both bounds, so health checks and offloadctl keep
// working while others fill them. A connection that has made no offloadd call (Session,
// GetStats, EndSession, Projector) within unused_connection_timeout_seconds of its accept is
// shut down. 0 = no bound / no timeout.
struct ConnectionLimits {
  uint32_t max_connections_total = 4096;
  uint32_t max_connections_per_uid = 512;
  uint32_t admin_reserved_connections = 32;
  double unused_connection_timeout_seconds = 30;
  // HTTP/2 streams (calls) open at once on one connection (gRPC's max concurrent streams
  // setting); a client's further calls wait in its own gRPC library. 0 = gRPC's default.
  uint32_t max_streams_per_connection = 64;
  // HTTP/2 keepalive pings to each client connection every keepalive_time_seconds; one not
  // answered within keepalive_timeout_seconds closes the connection. 0 = no pings.
  double keepalive_time_seconds = 60;
  double keepalive_timeout_seconds = 60;
};

// Reads SO_PEERCRED and SO_PEERGROUPS of a connected Unix socket. Errors: INTERNAL with errno's
// text when SO_PEERCRED fails (not a Unix socket); missing supplementary groups are not an error.
absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd);

// PERMISSION_DENIED (naming the uid/gid and the config fields) when the policy's allow lists
// exclude the peer; OK for unknown credentials (nothing to check).
absl::Status CheckPeerAllowed(const AccessPolicy& policy, const PeerCredentials& peer);

// Root, the daemon's effective uid, or a configured admin uid. Unknown credentials: false.
bool IsAdmin(const AccessPolicy& policy, const PeerCredentials& peer);

// The pids of `pid` in each PID namespace it belongs to, outermost (= `pid`) first, from the
// NSpid line of <proc_root>/<pid>/status. Just {pid} when the line is absent (old kernels);
// NOT_FOUND when the process does not exist.
absl::StatusOr<std::vector<int32_t>> NamespacePids(int32_t pid,
                                                   const std::string& proc_root = "/proc");

// OK when hello_pid names the peer (see above); PERMISSION_DENIED otherwise. Unknown
// credentials: OK.
absl::Status CheckHelloPid(const PeerCredentials& peer, uint32_t hello_pid,
                           const std::string& proc_root = "/proc");

// OK when the POSIX shared-memory object `shm_name` ("/name", under shm_dir) is owned by the
// peer's uid, the peer is root, the credentials are unknown, or the object does not exist (the
// engine then answers NOT_FOUND); PERMISSION_DENIED naming the owner otherwise.
absl::Status CheckShmOwner(const PeerCredentials& peer, const std::string& shm_name,
                           const std::string& shm_dir = "/dev/shm");

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_PEER_H_
