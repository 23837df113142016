#include "server/service_notify.h"

#include <systemd/sd-daemon.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "glog/logging.h"

namespace offloadd {
namespace {

std::atomic<bool> g_failure_logged{false};

void Send(const std::string& state) {
  // 0: keep $NOTIFY_SOCKET for the later messages. sd_notify returns 0 when it is not set.
  const int rc = sd_notify(0, state.c_str());
  if (rc < 0 && !g_failure_logged.exchange(true)) {
    LOG(WARNING) << "cannot tell the service manager the daemon's state (sd_notify: "
                 << std::strerror(-rc) << "); the daemon runs on";
  }
}

// A STATUS= value is one line.
std::string OneLine(const std::string& status) {
  return absl::StrReplaceAll(status, {{"\n", " "}});
}

}  // namespace

void NotifyStatus(const std::string& status) { Send("STATUS=" + OneLine(status)); }

void NotifyReady(const std::string& status) {
  Send(absl::StrCat("READY=1\nMAINPID=", getpid(), "\nSTATUS=", OneLine(status)));
}

void NotifyStopping(const std::string& status) {
  Send("STOPPING=1\nSTATUS=" + OneLine(status));
}

}  // namespace offloadd
