// An offloadd daemon inside the test process (Core + rpc::Server on the shm backend), listening
// on a short unique Unix socket under /tmp (Bazel's TEST_TMPDIR is too long for sun_path).
#ifndef OFFLOADD_TESTS_E2E_DAEMON_FIXTURE_H_
#define OFFLOADD_TESTS_E2E_DAEMON_FIXTURE_H_

#include <stdlib.h>
#include <unistd.h>

#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "client/offloadd_client.h"
#include "server/copy/shm_engine.h"
#include "server/pool/arena.h"
#include "server/rpc/server.h"
#include "server/session/core.h"

namespace offloadd::testing {

inline std::string UniqueSocketPath(const std::string& tag) {
  // mkdtemp, not the pid: pids repeat across Bazel sandboxes (PID namespaces) sharing /tmp.
  std::string dir = "/tmp/ofd-" + tag + "-XXXXXX";
  if (mkdtemp(dir.data()) == nullptr) abort();
  return dir + "/d.sock";
}

class InProcessDaemon {
 public:
  explicit InProcessDaemon(uint64_t pool_bytes, session::CoreOptions options = {},
                           const std::string& tag = "t")
      : socket_path_(UniqueSocketPath(tag)) {
    pool::ArenaOptions a;
    a.size_bytes = pool_bytes;
    core_ = std::make_unique<session::Core>(options, *pool::Arena::Create(a),
                                            std::make_unique<copy::ShmCopyEngine>());
    auto server = rpc::Server::Start(core_.get(), socket_path_, 0660);
    if (!server.ok()) abort();
    server_ = *std::move(server);
  }
  ~InProcessDaemon() { Stop(); }
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
    auto end = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    while (std::chrono::steady_clock::now() < end) {
      if (pred()) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return pred();
  }

 private:
  std::string socket_path_;
  std::unique_ptr<session::Core> core_;
  std::unique_ptr<rpc::Server> server_;
};

}  // namespace offloadd::testing

#endif  // OFFLOADD_TESTS_E2E_DAEMON_FIXTURE_H_
