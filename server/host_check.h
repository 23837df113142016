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
//   3. memlock: with pool_mlock, pool_bytes within RLIMIT_MEMLOCK (unless the process holds
//      CAP_IPC_LOCK); backend cuda alone does not need it (cudaHostRegister pins through the
//      NVIDIA driver, outside the limit; a failed registration leaves copies pageable);
//   4. memory: pool_bytes within MemAvailable, less what a shared pool object that exists holds
//      already (a restarted daemon adopts it: its memory is not allocated again, and the
//      advice never asks to shrink or remove a pool that may hold blocks); an object start-up
//      would refuse (another size, owner or mode) is a problem of its own, in start-up's words.
//   5. spill_directory: it, or the parent it is created in, writable by this process (a
//      read-only file system, as ProtectSystem=strict makes every path the unit does not list in
//      ReadWritePaths=, is named as such with the unit's fix); one that exists is the daemon's
//      own -- owned by its uid, not writable by group or others -- on a file system that takes
//      O_DIRECT (spill::SpillTier::CheckDirectory);
//   6. metrics_address (when set): a TCP socket can bind it now (metrics::CheckAddressFree), so a
//      port another process listens on is named with its remedy before start-up meets it.
// Notes (HostNotes) do not stop a start: pool_huge_pages on a /dev/shm that gives no huge pages;
// a spill_directory start-up will create, or whose lock a running offloadd holds
// (spill::SpillTier::DirectoryNote).
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
#include "server/pool/arena.h"

namespace offloadd {

// What the host offers, read once (ReadHostFacts) or made up in tests.
struct HostFacts {
  absl::StatusOr<uint64_t> mem_available_bytes = uint64_t{0};  // /proc/meminfo MemAvailable
  uint64_t memlock_limit_bytes = 0;      // RLIMIT_MEMLOCK soft limit; RLIM_INFINITY = none
  bool memlock_privileged = false;       // CAP_IPC_LOCK
  absl::Status cuda = absl::OkStatus();  // the CUDA driver (only read for backend cuda)
  pool::SharedPoolObject shared_pool;    // /dev/shm/<pool_shm_name> (only read when set)
  absl::Status shm_huge_pages = absl::OkStatus();  // pool::ShmHugePages (pool_huge_pages + shm)
  absl::Status spill_directory = absl::OkStatus();  // CheckSpillDirectory (only when set)
  absl::Status metrics_address = absl::OkStatus();  // metrics::CheckAddressFree (when set)
};

// Check 5 for `directory`, without creating anything: OK when it is a directory this process
// may create files in, or does not exist and its parent is one (the daemon creates it, one
// level, mode 0700). FAILED_PRECONDITION naming the path and the errno text otherwise; for a
// read-only file system (EROFS) the message says how to make it writable under the systemd unit.
absl::Status CheckSpillDirectory(const std::string& directory);

// The facts of this host for `config`. `cuda_in_build`: whether this binary has the cuda
// backend; the driver is probed only for backend cuda, the pool object only with pool_shm_name.
HostFacts ReadHostFacts(const v1::DaemonConfig& config, bool cuda_in_build);

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

// The checks 2-6 above against `facts`, in that order; empty when the host can run `config`.
std::vector<absl::Status> HostProblems(const v1::DaemonConfig& config, const HostFacts& facts);

// What start-up would log as warnings about `config` on this host (each a sentence with the
// fix); they do not stop it.
std::vector<std::string> HostNotes(const v1::DaemonConfig& config, const HostFacts& facts);

}  // namespace offloadd

#endif  // OFFLOADD_SERVER_HOST_CHECK_H_
