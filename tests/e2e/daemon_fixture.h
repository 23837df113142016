// An offloadd daemon inside the test process (Core + rpc::Server on the shm backend), listening
// on a short unique Unix socket under /tmp (Bazel's TEST_TMPDIR is too long for sun_path). Used
// by tests/e2e and tests/faults.
#ifndef OFFLOADD_TESTS_E2E_DAEMON_FIXTURE_H_
#define OFFLOADD_TESTS_E2E_DAEMON_FIXTURE_H_

#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "client/offloadd_client.h"
#include "common/base/clock.h"
#include "server/copy/shm/shm_engine.h"
#include "server/pool/arena.h"
#include "server/rpc/server.h"
#include "server/session/core.h"

namespace offloadd::testing {

// "/tmp/ofd-<tag>-XXXXXX/d.sock" in a new directory of mode 0755, so that the socket file's own
// mode decides who may connect (tests/faults connects as another uid).
inline std::string UniqueSocketPath(const std::string& tag) {
  // mkdtemp, not the pid: pids repeat across Bazel sandboxes (PID namespaces) sharing /tmp.
  std::string dir = "/tmp/ofd-" + tag + "-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr || chmod(dir.c_str(), 0755) != 0) abort();
  return dir + "/d.sock";
}

class InProcessDaemon {
 public:
  // `socket_mode`: the socket file's mode (rpc::Server::Start).
  explicit InProcessDaemon(uint64_t pool_bytes, session::CoreOptions options = {},
                           const std::string& tag = "t", uint32_t socket_mode = 0660)
      : socket_path_(UniqueSocketPath(tag)) {
    pool::ArenaOptions a;
    a.size_bytes = pool_bytes;
    auto arena = *pool::Arena::Create(a);
    std::unique_ptr<spill::SpillTier> spill;  // with options.spill.directory set
    if (!options.spill.directory.empty()) {
      auto tier = spill::SpillTier::Create(options.spill, arena->base(), arena->size_bytes());
      if (!tier.ok()) abort();
      spill = *std::move(tier);
    }
    core_ = std::make_unique<session::Core>(options, std::move(arena),
                                            std::make_unique<copy::ShmCopyEngine>(),
                                            std::move(spill));
    auto server = rpc::Server::Start(core_.get(), socket_path_, socket_mode);
    if (!server.ok()) abort();
    server_ = *std::move(server);
  }
  // Stops the daemon (which removes the socket file) and removes the socket's directory.
  ~InProcessDaemon() {
    Stop();
    rmdir(socket_path_.substr(0, socket_path_.rfind('/')).c_str());
  }
  void Stop() {
    if (server_) server_->Shutdown();
    server_.reset();
  }

  const std::string& socket_path() const { return socket_path_; }
  session::Core& core() { return *core_; }

  std::unique_ptr<client::Client> Connect(const std::string& device = "gpu0") {
    client::ClientOptions o;
    o.socket_path = socket_path_;
    o.client_name = "e2e";
    o.device_id = device;
    auto c = client::Client::Connect(o);
    if (!c.ok()) abort();
    return *std::move(c);
  }

  // Polls `pred` every 10 ms for up to `seconds`.
  static bool WaitFor(const std::function<bool()>& pred, double seconds = 10) {
    return base::PollUntil(pred, seconds, /*poll_seconds=*/0.01);
  }

 private:
  std::string socket_path_;
  std::unique_ptr<session::Core> core_;
  std::unique_ptr<rpc::Server> server_;
};

}  // namespace offloadd::testing

#endif  // OFFLOADD_TESTS_E2E_DAEMON_FIXTURE_H_
