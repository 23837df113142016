// The daemon's side of the simulated client GPU tables (the format, shared with the clients, is
// common/sim_gpu_table.h): opening a client's table under a truncation guard, and checking that
// a handle names a table of the session's own process and uid.
//
// Whose table (CheckSimHandleOwner): a session may name only the table of its own process (the
// handle's pid is the session's peer pid, or the pid the client sees for itself in a PID
// namespace) and only one its own uid owns. There is no sharing between processes: every
// process registers its own memory.
#ifndef OFFLOADD_SERVER_COPY_CUDA_SIM_GPU_TABLE_H_
#define OFFLOADD_SERVER_COPY_CUDA_SIM_GPU_TABLE_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "common/sim_gpu_table.h"

namespace offloadd::copy {

// Maps "/ofd-simgpu-<pid>" (the table a client created) for the daemon. NOT_FOUND when it does
// not exist (the client is gone); FAILED_PRECONDITION when it is not a table of this version,
// when `instance` is 0, or when it is not the table of that instance; RESOURCE_EXHAUSTED past
// 4096 tables mapped at once. The mapping is guarded: if the client truncates the object, the
// first access to a vanished page (SIGBUS) replaces the whole mapping by zero-filled private
// memory and retries, so the daemon reads zeros (every event complete, every segment free)
// instead of dying. Installs a process-wide SIGBUS handler on first use that passes other faults
// to the one before it.
absl::StatusOr<std::shared_ptr<common::SimGpuTable>> OpenSimGpuTable(uint32_t pid,
                                                                     uint64_t instance);

// PERMISSION_DENIED when `handle` (a memory or event handle of a simulated table) names a table
// that is not the session's own: its pid is none of `session_pids` (the peer pid and the pid
// the client sent in Hello), or the object "/ofd-simgpu-<pid>" under `shm_dir` is not a regular
// file owned by `session_uid`. OK for a handle of any other kind (not a simulated table's) and
// for a table that does not exist (opening it then fails with NOT_FOUND).
absl::Status CheckSimHandleOwner(absl::string_view handle,
                                 const std::vector<uint32_t>& session_pids, uint32_t session_uid,
                                 const std::string& shm_dir = "/dev/shm");

// Tables the daemon found truncated under it (a SIGBUS in its mapping of one, which then reads
// as zeros: see OpenSimGpuTable), since start.
uint64_t SimTablesZeroedTotal();

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_SIM_GPU_TABLE_H_
