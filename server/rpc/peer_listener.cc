#include "server/rpc/peer_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "glog/logging.h"

namespace offloadd::rpc {
namespace {

}  // namespace

absl::StatusOr<std::unique_ptr<PeerListener>> PeerListener::Listen(const std::string& path,
                                                                   uint32_t mode, int64_t gid) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrFormat("socket(): %s", strerror(errno)));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 || listen(fd, 128) != 0) {
    int err = errno;
    close(fd);
    return absl::UnavailableError(
        absl::StrFormat("cannot listen on unix:%s: %s", path, strerror(err)));
  }
  auto fail = [&](const char* what) {
    int err = errno;
    close(fd);
    unlink(path.c_str());
    return absl::PermissionDeniedError(absl::StrFormat(
        "%s of socket %s failed: %s; check socket_mode / socket_group in the config", what, path,
        strerror(err)));
  };
  if (chmod(path.c_str(), mode) != 0) return fail("chmod");
  if (gid >= 0 && chown(path.c_str(), static_cast<uid_t>(-1), static_cast<gid_t>(gid)) != 0) {
    return fail("chown to the socket group");
  }
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return std::unique_ptr<PeerListener>(new PeerListener(fd, wake));
}

std::unique_ptr<PeerListener> PeerListener::FromListeningFd(int fd) {
  int wake = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
  return std::unique_ptr<PeerListener>(new PeerListener(fd, wake));
}

PeerListener::~PeerListener() {
  Stop();
  close(wake_fd_);
}

void PeerListener::Start(std::function<void(int fd)> adopt, session::ConnectionLimits limits,
                         std::function<bool(const session::PeerCredentials&)> is_admin) {
  adopt_ = std::move(adopt);
  limits_ = limits;
  is_admin_ = std::move(is_admin);
  thread_ = std::thread([this] { Loop(); });
}

void PeerListener::Stop() {
  {
    base::MutexLock lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  uint64_t one = 1;
  (void)!write(wake_fd_, &one, sizeof(one));
  if (thread_.joinable()) thread_.join();
  close(fd_);
  fd_ = -1;
}

session::PeerCredentials PeerListener::Lookup(const std::string& peer) const {
  int fd;
  if (peer.rfind("fd:", 0) != 0 || !absl::SimpleAtoi(peer.substr(3), &fd)) return {};
  base::MutexLock lock(mu_);
  auto it = by_fd_.find(fd);
  if (it == by_fd_.end()) return {};
  it->second.used = true;
  return it->second.cred;
}

size_t PeerListener::connections_open() const {
  base::MutexLock lock(mu_);
  return by_fd_.size();
}

void PeerListener::ForgetLocked(std::unordered_map<int, Connection>::iterator it) {
  if (it->second.cred.known) {
    auto uid = per_uid_.find(it->second.cred.uid);
    if (uid != per_uid_.end() && --uid->second == 0) per_uid_.erase(uid);
  }
  by_fd_.erase(it);
}

void PeerListener::SweepLocked(double now) {
  const double timeout = limits_.unused_connection_timeout_seconds;
  for (auto it = by_fd_.begin(); it != by_fd_.end();) {
    struct stat st;
    Connection& c = it->second;
    if (fstat(it->first, &st) != 0 || st.st_dev != c.dev || st.st_ino != c.ino) {
      auto gone = it++;
      ForgetLocked(gone);  // gRPC closed it (the number may already name something else)
      continue;
    }
    if (timeout > 0 && !c.used && !c.shut_down && now - c.accepted_seconds > timeout) {
      // Never made an offloadd call: end it (gRPC sees EOF and closes the descriptor).
      shutdown(it->first, SHUT_RDWR);
      c.shut_down = true;
    }
    ++it;
  }
}

bool PeerListener::FitsLocked(const session::PeerCredentials& cred) const {
  const uint32_t reserve =
      is_admin_ && cred.known && is_admin_(cred) ? limits_.admin_reserved_connections : 0;
  if (limits_.max_connections_total > 0 &&
      by_fd_.size() >= static_cast<size_t>(limits_.max_connections_total) + reserve) {
    return false;
  }
  if (limits_.max_connections_per_uid > 0 && cred.known) {
    auto it = per_uid_.find(cred.uid);
    const size_t mine = it == per_uid_.end() ? 0 : it->second;
    if (mine >= static_cast<size_t>(limits_.max_connections_per_uid) + reserve) return false;
  }
  return true;
}

bool PeerListener::Admit(int conn) {
  auto cred = session::ReadPeerCredentials(conn);
  Connection c;
  if (cred.ok()) c.cred = *cred;
  struct stat st;
  if (fstat(conn, &st) == 0) {
    c.dev = st.st_dev;
    c.ino = st.st_ino;
  }
  c.accepted_seconds = base::SteadyNowSeconds();
  base::MutexLock lock(mu_);
  if (auto old = by_fd_.find(conn); old != by_fd_.end()) ForgetLocked(old);  // closed, reused
  if (!FitsLocked(c.cred)) SweepLocked(c.accepted_seconds);  // make room from closed ones
  if (!FitsLocked(c.cred)) {
    refused_total_.fetch_add(1);
    if (c.accepted_seconds - last_refusal_log_seconds_ > 10) {
      last_refusal_log_seconds_ = c.accepted_seconds;
      LOG(WARNING) << "offloadd refused a connection of uid " << c.cred.uid << " (pid "
                   << c.cred.pid << "): " << by_fd_.size() << " connections open, at most "
                   << limits_.max_connections_total << " in all and "
                   << limits_.max_connections_per_uid
                   << " per uid (max_connections_total / max_connections_per_uid); further "
                      "refusals in the next 10 s are not logged";
    }
    close(conn);
    return false;
  }
  if (c.cred.known) ++per_uid_[c.cred.uid];
  by_fd_[conn] = std::move(c);
  return true;
}

void PeerListener::Loop() {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  const double timeout = limits_.unused_connection_timeout_seconds;
  const int sweep_ms = timeout > 0 ? std::clamp(static_cast<int>(timeout * 500), 10, 1000) : 1000;
  double last_sweep = base::SteadyNowSeconds();
  while (true) {
    fds[0].revents = fds[1].revents = 0;
    if (const double now = base::SteadyNowSeconds(); now - last_sweep >= sweep_ms / 1000.0) {
      base::MutexLock lock(mu_);
      SweepLocked(now);
      last_sweep = now;
    }
    if (poll(fds, 2, sweep_ms) < 0) {
      if (errno == EINTR) continue;
      LOG(ERROR) << "offloadd listener: poll: " << strerror(errno);
      return;
    }
    if (fds[1].revents != 0) return;
    if (fds[0].revents == 0) continue;
    int conn = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (conn < 0) {
      if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) continue;
      // EMFILE / ENFILE / ENOBUFS: back off instead of spinning; the connection waits.
      LOG(WARNING) << "offloadd listener: accept: " << strerror(errno)
                   << " (raise LimitNOFILE if this repeats)";
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
      continue;
    }
    if (!Admit(conn)) continue;
    accepted_total_.fetch_add(1);
    adopt_(conn);
  }
}

}  // namespace offloadd::rpc
