#include "server/session/peer.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"

namespace offloadd::session {
namespace {
bool Contains(const std::vector<uint32_t>& v, uint32_t x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}
}  // namespace

absl::StatusOr<PeerCredentials> ReadPeerCredentials(int fd) {
  ucred cred{};
  socklen_t len = sizeof(cred);
  if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0) {
    return absl::InternalError(absl::StrFormat("SO_PEERCRED: %s", strerror(errno)));
  }
  PeerCredentials p;
  p.known = true;
  p.pid = cred.pid;
  p.uid = cred.uid;
  p.gid = cred.gid;
  std::vector<gid_t> groups(64);
  len = static_cast<socklen_t>(groups.size() * sizeof(gid_t));
  int rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len);
  if (rc != 0 && errno == ERANGE) {  // len now holds the size needed
    groups.resize(len / sizeof(gid_t));
    rc = getsockopt(fd, SOL_SOCKET, SO_PEERGROUPS, groups.data(), &len);
  }
  if (rc == 0) {
    groups.resize(len / sizeof(gid_t));
    p.groups.assign(groups.begin(), groups.end());
  }
  return p;
}

absl::Status CheckPeerAllowed(const AccessPolicy& policy, const PeerCredentials& peer) {
  if (!peer.known) return absl::OkStatus();
  if (policy.allowed_uids.empty() && policy.allowed_gids.empty()) return absl::OkStatus();
  if (Contains(policy.allowed_uids, peer.uid)) return absl::OkStatus();
  if (Contains(policy.allowed_gids, peer.gid)) return absl::OkStatus();
  for (uint32_t g : peer.groups) {
    if (Contains(policy.allowed_gids, g)) return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "uid %d (gid %d) may not open an offloadd session: the daemon's config restricts "
      "allowed_uids [%s] / allowed_gids [%s]; ask the node's administrator to add this user or "
      "one of its groups",
      peer.uid, peer.gid, absl::StrJoin(policy.allowed_uids, ","),
      absl::StrJoin(policy.allowed_gids, ",")));
}

bool IsAdmin(const AccessPolicy& policy, const PeerCredentials& peer) {
  if (!peer.known) return false;
  return peer.uid == 0 || peer.uid == geteuid() || Contains(policy.admin_uids, peer.uid);
}

absl::StatusOr<std::vector<int32_t>> NamespacePids(int32_t pid, const std::string& proc_root) {
  std::ifstream in(absl::StrFormat("%s/%d/status", proc_root, pid));
  if (!in) return absl::NotFoundError(absl::StrFormat("process %d does not exist", pid));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("NSpid:", 0) != 0) continue;
    std::istringstream fields(line.substr(6));
    std::vector<int32_t> pids;
    int32_t p;
    while (fields >> p) pids.push_back(p);
    if (!pids.empty()) return pids;
  }
  return std::vector<int32_t>{pid};
}

absl::Status CheckHelloPid(const PeerCredentials& peer, uint32_t hello_pid,
                           const std::string& proc_root) {
  // pid 0: the peer is in a PID namespace the daemon cannot see (e.g. the daemon runs in a
  // container of its own): nothing to compare with, and nothing to watch.
  if (!peer.known || hello_pid == 0 || peer.pid <= 0) return absl::OkStatus();
  if (static_cast<int32_t>(hello_pid) == peer.pid) return absl::OkStatus();
  auto pids = NamespacePids(peer.pid, proc_root);
  if (pids.ok() && !pids->empty() && pids->back() == static_cast<int32_t>(hello_pid)) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrFormat(
      "hello names pid %d but the connection belongs to pid %d: a session is bound to the "
      "process that opened the connection; send its own pid (or 0), and open one connection per "
      "process",
      hello_pid, peer.pid));
}

absl::Status CheckShmOwner(const PeerCredentials& peer, const std::string& shm_name,
                           const std::string& shm_dir) {
  if (!peer.known || peer.uid == 0 || shm_name.empty()) return absl::OkStatus();
  struct stat st;
  if (stat((shm_dir + shm_name).c_str(), &st) != 0) return absl::OkStatus();
  if (st.st_uid == peer.uid) return absl::OkStatus();
  return absl::PermissionDeniedError(absl::StrFormat(
      "shared-memory region %s belongs to uid %d, not to this session's uid %d: register memory "
      "your own process created",
      shm_name, st.st_uid, peer.uid));
}

}  // namespace offloadd::session
