#include "client/cli/query.h"

#include <fcntl.h>
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <chrono>
#include <cstring>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/socket_path.h"
#include "grpcpp/generic/generic_stub.h"
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
          "cannot reach unix:%s: %s", path, client::PermissionDeniedReason(path)));
    }
    return absl::UnavailableError(absl::StrFormat("no offloadd socket at unix:%s (%s): %s", path,
                                                  std::strerror(err), kAdvice));
  }
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("%s exists but is not a socket: %s", path, kAdvice));
  }
  // Connecting needs write permission on the socket file: say which group admits this user
  // rather than leave gRPC's "failed to connect to all addresses ... Permission denied".
  if (faccessat(AT_FDCWD, path.c_str(), W_OK, AT_EACCESS) != 0 && errno == EACCES) {
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot reach unix:%s: %s", path, client::PermissionDeniedReason(path)));
  }
  // A socket file nobody listens on (a daemon that exited) refuses the connect at once: say so
  // rather than leave gRPC's "failed to connect to all addresses ... Connection refused".
  const int probe = client::ProbeUnixSocket(path);
  if (probe == EAGAIN) {
    return absl::UnavailableError(absl::StrFormat(
        "offloadd at unix:%s does not answer: %s", path,
        client::UnreachableSocketReason(path, probe)));
  }
  if (probe == ECONNREFUSED) {
    return absl::UnavailableError(absl::StrFormat(
        "no offloadd listens at unix:%s: the socket file exists but no daemon listens on it (the "
        "socket of a daemon that exited); start or restart offloadd (e.g. systemctl restart "
        "offloadd), or point offloadctl at a running daemon's socket (--socket PATH or "
        "$OFFLOADD_SOCKET)",
        path));
  }
  return absl::OkStatus();
}

namespace {

// Whether `st` is a failure of the connection (gRPC's own words) rather than an answer of the
// daemon, whose messages are sentences of its own.
bool IsConnectionFailure(const grpc::Status& st) {
  if (st.error_code() == grpc::StatusCode::DEADLINE_EXCEEDED) return true;
  if (st.error_code() != grpc::StatusCode::UNAVAILABLE &&
      st.error_code() != grpc::StatusCode::INTERNAL &&
      st.error_code() != grpc::StatusCode::UNKNOWN) {
    return false;
  }
  static const char* const kTransportWords[] = {
      "failed to connect to all addresses", "Socket closed", "Failed parsing HTTP/2",
      "Connection reset", "Broken pipe", "Stream removed", "GOAWAY", "Endpoint read failed",
      "connections to all backends failing", "Deadline Exceeded"};
  for (const char* words : kTransportWords) {
    if (st.error_message().find(words) != std::string::npos) return true;
  }
  return false;
}

}  // namespace

std::string RpcFailureText(const grpc::Status& st, const std::string& path, int probe) {
  if (probe == 0 && !IsConnectionFailure(st)) {
    return absl::StrFormat("%s (unix:%s)", st.error_message(), path);
  }
  return absl::StrFormat("no answer from offloadd at unix:%s: %s (gRPC: %s)", path,
                         client::UnreachableSocketReason(path, probe), st.error_message());
}

std::string RpcFailureText(const grpc::Status& st, const std::string& path) {
  return RpcFailureText(st, path, IsConnectionFailure(st) ? client::ProbeUnixSocket(path) : 0);
}

std::unique_ptr<v1::Offload::Stub> Stub(const std::string& path) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(-1);  // Stats grows with sessions and links
  return v1::Offload::NewStub(
      grpc::CreateCustomChannel("unix:" + path, grpc::InsecureChannelCredentials(), args));
}

absl::Status CheckHealth(const std::string& path, double timeout_seconds) {
  auto channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  grpc::GenericStub generic(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(timeout_seconds * 1000)));
  // HealthCheckRequest{service: ""} encodes as no bytes (proto3 default).
  grpc::ByteBuffer request, response;
  grpc::Slice empty("");
  request = grpc::ByteBuffer(&empty, 1);
  std::promise<grpc::Status> done;
  generic.UnaryCall(&ctx, "/grpc.health.v1.Health/Check", grpc::StubOptions(), &request,
                    &response, [&done](grpc::Status s) { done.set_value(std::move(s)); });
  const grpc::Status st = done.get_future().get();
  if (!st.ok()) {
    // A socket that refuses this user is PERMISSION_DENIED whatever gRPC reported.
    const int probe = client::ProbeUnixSocket(path);
    const absl::StatusCode code = probe == EACCES || probe == EPERM
                                      ? absl::StatusCode::kPermissionDenied
                                      : static_cast<absl::StatusCode>(st.error_code());
    return absl::Status(code, "health check failed: " + RpcFailureText(st, path, probe));
  }
  std::vector<grpc::Slice> slices;
  (void)response.Dump(&slices);
  std::string bytes;
  for (const grpc::Slice& s : slices) bytes.append(reinterpret_cast<const char*>(s.begin()), s.size());
  // HealthCheckResponse{status = 1 (varint)}: SERVING is 1; an empty reply is UNKNOWN (0).
  int status = 0;
  if (bytes.size() >= 2 && bytes[0] == 0x08) status = static_cast<unsigned char>(bytes[1]);
  if (status == 1) return absl::OkStatus();
  static const char* const kNames[] = {"UNKNOWN", "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN"};
  return absl::UnavailableError(absl::StrFormat("offloadd at unix:%s reports %s", path,
                                                status < 4 ? kNames[status] : "an unknown status"));
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
