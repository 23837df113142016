#include "server/rpc/peer_listener.h"

#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace offloadd::rpc {

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

PeerListener::~PeerListener() {
  Stop();
  close(wake_fd_);
}

void PeerListener::Start(std::function<void(int fd)> adopt) {
  adopt_ = std::move(adopt);
  thread_ = std::thread([this] { Loop(); });
}

void PeerListener::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  std::lock_guard<std::mutex> lock(mu_);
  auto it = by_fd_.find(fd);
  return it == by_fd_.end() ? session::PeerCredentials{} : it->second;
}

void PeerListener::Loop() {
  pollfd fds[2] = {{fd_, POLLIN, 0}, {wake_fd_, POLLIN, 0}};
  while (true) {
    fds[0].revents = fds[1].revents = 0;
    if (poll(fds, 2, -1) < 0) {
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
    auto cred = session::ReadPeerCredentials(conn);
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (cred.ok()) {
        by_fd_[conn] = *cred;
      } else {
        by_fd_.erase(conn);
      }
    }
    accepted_total_.fetch_add(1);
    adopt_(conn);
  }
}

}  // namespace offloadd::rpc
