#include "client/cli/query.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_format.h"
#include "client/socket_path.h"
#include "grpcpp/grpcpp.h"

namespace offloadd::cli {

std::string ResolveSocket(const std::string& flag_value) {
  if (!flag_value.empty()) return flag_value;
  if (const char* env = std::getenv("OFFLOADD_SOCKET"); env != nullptr && *env != '\0') return env;
  return client::DefaultSocketPath();
}

absl::Status CheckSocketPresent(const std::string& path) {
  constexpr const char* kAdvice =
      "start the daemon (e.g. systemctl start offloadd) or point offloadctl at its socket "
      "(--socket PATH or $OFFLOADD_SOCKET)";
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    const int err = errno;
    if (err == EACCES) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "cannot reach unix:%s: %s; a directory on the way is not searchable by this user (ask "
          "for the daemon's socket group, or use a socket you can reach)",
          path, std::strerror(err)));
    }
    return absl::UnavailableError(absl::StrFormat("no offloadd socket at unix:%s (%s): %s", path,
                                                  std::strerror(err), kAdvice));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s exists but is not a socket: %s", path, kAdvice));
  }
  return absl::OkStatus();
}

std::unique_ptr<v1::Offload::Stub> Stub(const std::string& path) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // Stats grows with sessions and links
  return v1::Offload::NewStub(
      grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args));
}

std::string Bytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  return absl::StrFormat("%.2f %s", bytes, units[u]);
}

}  // namespace offloadd::cli
