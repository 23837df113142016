// Socket activation (systemd's LISTEN_FDS protocol, read here so the descriptor's kind is
// checked and the variables are unset in one place): a service manager that holds the listening socket (deploy/offloadd.socket)
// passes it to the daemon as file descriptor 3 with LISTEN_PID = the daemon's pid and
// LISTEN_FDS = 1. The socket then outlives the daemon: while it restarts, clients' connects
// queue in the socket's backlog instead of being refused.
#ifndef OFFLOADD_SERVER_RPC_SOCKET_ACTIVATION_H_
#define OFFLOADD_SERVER_RPC_SOCKET_ACTIVATION_H_

#include "absl/status/statusor.h"

namespace offloadd::rpc {

inline constexpr int kListenFdsStart = 3;  // SD_LISTEN_FDS_START

// The listening socket passed by the service manager, or -1 when none was (LISTEN_PID unset or
// naming another process, as after a fork). Unsets LISTEN_PID, LISTEN_FDS and LISTEN_FDNAMES
// either way (children must not take the socket) and marks the descriptor close-on-exec.
// Errors: FAILED_PRECONDITION when more than one descriptor is passed, or descriptor 3 is not a
// listening Unix stream socket (the message says how to fix the .socket unit).
absl::StatusOr<int> TakeListenFd();

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_SOCKET_ACTIVATION_H_
