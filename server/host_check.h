// Checks of the host a config is to run on, made before the pool is mapped: by the daemon at
// start-up (so a second daemon on a taken socket refuses before pre-faulting gigabytes) and by
// `offloadd --check-config` (the unit's ExecStartPre), so what would fail at start-up fails
// there, with the same sentences.
//
// The checks, in the order the daemon meets them at start-up (HostProblems keeps this order,
// so the first entry is the one that blocks first):
//   1. socket: path length, its directory creatable and writable, no daemon listening on it;
//   2. backend cuda: the build has it, the driver library (libcuda.so.1) loads, cuInit succeeds
//      and finds at least one GPU;
//   3. memlock: with pool_mlock or backend cuda, pool_bytes within RLIMIT_MEMLOCK (unless the
//      process holds CAP_IPC_LOCK);
//   4. memory: pool_bytes within MemAvailable.
// A socket another daemon listens on is an error at start-up and a warning for --check-config
// (the unit's ExecStartPre runs after the old daemon stopped).
#ifndef OFFLOADD_SERVER_HOST_CHECK_H_
#define OFFLOADD_SERVER_HOST_CHECK_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "proto/config.pb.h"

namespace offloadd {

// What the host offers, read once (ReadHostFacts) or made up in tests.
struct HostFacts {
  absl::StatusOr<uint64_t> mem_available_bytes = uint64_t{0};  // /proc/meminfo MemAvailable
  uint64_t memlock_limit_bytes = 0;      // RLIMIT_MEMLOCK soft limit; RLIM_INFINITY = none
  bool memlock_privileged = false;       // CAP_IPC_LOCK
  absl::Status cuda = absl::OkStatus();  // the CUDA driver (only read for backend cuda)
};

// The facts of this host. `cuda_in_build`: whether this binary has the cuda backend; the
// driver is probed only when `probe_cuda`.
HostFacts ReadHostFacts(bool cuda_in_build, bool probe_cuda);

// OK when libcuda.so.1 loads, cuInit(0) succeeds and cuDeviceGetCount finds a GPU; else
// FAILED_PRECONDITION saying which step failed (dlerror text or the CUDA error's name) and what
// to do. Loads the driver with dlopen: nothing is linked against it.
absl::Status ProbeCudaDriver();

// The socket checks (1. above) for `socket_path`, without creating or removing anything:
// INVALID_ARGUMENT for a path over 107 bytes, PERMISSION_DENIED when its directory (or the
// nearest existing parent of a directory still to be created) is not writable, with the errno
// text; FAILED_PRECONDITION when something that is not a socket is at the path, or
// ALREADY_EXISTS when a daemon accepts connections on it.
absl::Status CheckSocketPath(const std::string& socket_path);

// Makes CAP_IPC_LOCK effective when the process holds it only as permitted: the image's
// file capability (setcap cap_ipc_lock+p, deploy/container/Containerfile) gives a non-root
// daemon that much wherever the bounding set has it, and exec does not fail where it has not.
// Returns whether CAP_IPC_LOCK is effective afterwards.
bool RaiseIpcLockCapability();

// Descriptors the configured bounds may make the daemon hold: a socket per connection
// (max_connections_total plus the admin reserve), a pidfd per session (max_sessions) and 256
// of its own (listener, eventfds, metrics, logs, libraries). 0 when connections are unbounded.
uint64_t FileDescriptorsNeeded(const v1::DaemonConfig& config);

// RLIMIT_NOFILE against FileDescriptorsNeeded: raises the soft limit toward the hard one when
// it is lower (returns OK); FAILED_PRECONDITION naming both limits, the need and the fix when
// even the hard limit is lower (the bounds would not protect the daemon: accept() would fail
// with EMFILE first, health checks included).
absl::Status RaiseFileLimit(const v1::DaemonConfig& config);

// The checks 2-4 above against `facts`, in that order; empty when the host can run `config`.
std::vector<absl::Status> HostProblems(const v1::DaemonConfig& config, const HostFacts& facts);

}  // namespace offloadd

#endif  // OFFLOADD_SERVER_HOST_CHECK_H_
