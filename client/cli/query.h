// What every daemon-facing offloadctl command shares: the socket it talks to, a check that the
// socket is there before gRPC spends its connect timeout on a path with nothing behind it, a
// stub for the unary calls that open no session (GetStats, EndSession), and byte formatting.
#ifndef OFFLOADD_CLIENT_CLI_QUERY_H_
#define OFFLOADD_CLIENT_CLI_QUERY_H_

#include <memory>
#include <string>

#include "absl/status/status.h"
#include "proto/offload.grpc.pb.h"

namespace offloadd::cli {

// `flag_value` when not empty, else $OFFLOADD_SOCKET, else client::DefaultSocketPath().
std::string ResolveSocket(const std::string& flag_value);

// OK when `path` exists and is a socket a daemon listens on. Else UNAVAILABLE (nothing there, or
// a socket file no daemon listens on), FAILED_PRECONDITION (something that is not a socket) or
// PERMISSION_DENIED (a directory on the way cannot be searched, or the socket's mode shuts this
// user out: client::PermissionDeniedReason), each naming the path, the errno text where there
// is one, and what to do. Connects once (and closes) to tell a listening daemon from none.
absl::Status CheckSocketPresent(const std::string& path);

// A stub on unix:`path` (no session is opened; GetStats answers without one).
std::unique_ptr<v1::Offload::Stub> Stub(const std::string& path);

// grpc.health.v1.Health/Check ("" = the whole daemon) on unix:`path`, without opening a
// session (so it needs no session slot and works while the session bounds are full). OK when
// SERVING; UNAVAILABLE naming the reported status otherwise; RPC errors with the socket path.
absl::Status CheckHealth(const std::string& path, double timeout_seconds = 5);

// The sentence for an RPC to unix:`path` that failed with `st`: the daemon's own message for a
// status it answered; for a failure of the connection itself (gRPC's deadline, "failed to
// connect", "Socket closed", a listener that speaks no HTTP/2) why, in words, from one more
// connect() (client::UnreachableSocketReason: a stopped or hung daemon, a stale socket,
// permission, or another program on the socket), with gRPC's text after it.
std::string RpcFailureText(const grpc::Status& st, const std::string& path);
// The same with the connect() already made: `probe` is client::ProbeUnixSocket(path)'s result
// (0: the socket accepted); any other value is read as a failure of the connection.
std::string RpcFailureText(const grpc::Status& st, const std::string& path, int probe);

// "1.50 GiB": binary units (KiB, MiB, GiB, TiB), two decimals.
std::string Bytes(double bytes);

}  // namespace offloadd::cli

#endif  // OFFLOADD_CLIENT_CLI_QUERY_H_
