// The daemon binary on --backend=cuda-sim as a child process, and a simulated GPU of this
// process's own, for the end-to-end tests of the simulated CUDA path (tests/e2e:sim_gpu_test,
// tests/attacks:slow_producer_test). Every time figure they give is SIMULATED.
#ifndef OFFLOADD_TESTS_E2E_SIM_GPU_DAEMON_H_
#define OFFLOADD_TESTS_E2E_SIM_GPU_DAEMON_H_

#include <signal.h>
#include <stdlib.h>
#include <sys/mman.h>
#include <unistd.h>

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "client/sim_client_cuda_api.h"
#include "common/sim_gpu_table.h"
#include "tests/e2e/child_process.h"

namespace offloadd::testing {

// Starts `server/offloadd --backend=cuda-sim` on a socket in a new /tmp directory (mkdtemp:
// pids repeat across Bazel sandboxes) with `flags` added, and waits for its "ready" line.
class SimGpuDaemon {
 public:
  SimGpuDaemon(const std::string& tag, const std::vector<std::string>& flags) {
    std::string dir = "/tmp/ofd-" + tag + "-XXXXXX";
    if (mkdtemp(dir.data()) == nullptr) abort();
    socket_ = dir + "/d.sock";
    std::vector<std::string> argv = {Runfile("server/offloadd"), "--socket_path=" + socket_,
                                     "--metrics_address=", "--backend=cuda-sim"};
    argv.insert(argv.end(), flags.begin(), flags.end());
    child_ = std::make_unique<ChildProcess>(SpawnChild(argv));
    ready_ = child_->pid > 0 && child_->ReadLine().find("ready") != std::string::npos;
  }
  // SIGTERM; the daemon's exit status (0: it stopped cleanly).
  int Stop() {
    child_->Signal(SIGTERM);
    const int status = child_->Wait();
    rmdir(socket_.substr(0, socket_.rfind('/')).c_str());
    return status;
  }
  bool ready() const { return ready_; }
  const std::string& socket() const { return socket_; }

 private:
  std::string socket_;
  std::unique_ptr<ChildProcess> child_;
  bool ready_ = false;
};

// A simulated GPU whose table is named by this process's own pid: the daemon accepts a table's
// handles only from a session of that process (so the tests using it run outside the sandbox's
// PID namespace, where pids are unique). A table left by a killed earlier run of this pid is
// removed first.
inline absl::StatusOr<std::shared_ptr<client::SimClientGpu>> CreateOwnSimGpu(
    uint64_t device_bytes) {
  shm_unlink(common::SimTableName(getpid()).c_str());
  client::SimClientGpuOptions o;
  o.device_bytes = device_bytes;
  return client::SimClientGpu::Create(o);
}

}  // namespace offloadd::testing

#endif  // OFFLOADD_TESTS_E2E_SIM_GPU_DAEMON_H_
