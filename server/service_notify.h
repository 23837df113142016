// Start-up and shutdown progress for the service manager: systemd's notify protocol (sd_notify(3),
// libsystemd), which the unit's Type=notify waits on, so `systemctl start offloadd` returns once
// the daemon serves (pool mapped and pre-faulted, socket listening) rather than when the process
// was forked, and `systemctl status` shows what start-up is doing (STATUS=). Every call is a no-op
// when $NOTIFY_SOCKET is not set (started by hand, in a container, by a test), and a failure to
// send is logged once, never fatal: the daemon works the same without a service manager.
#ifndef OFFLOADD_SERVER_SERVICE_NOTIFY_H_
#define OFFLOADD_SERVER_SERVICE_NOTIFY_H_

#include <string>

namespace offloadd {

// STATUS=<status>: one line of what the daemon is doing ("mapping and pre-faulting the pool").
void NotifyStatus(const std::string& status);

// READY=1 with STATUS=<status> and MAINPID: start-up is over, the socket serves.
void NotifyReady(const std::string& status);

// STOPPING=1 with STATUS=<status>: shutdown began (SIGTERM), copies in flight are finishing.
void NotifyStopping(const std::string& status);

}  // namespace offloadd

#endif  // OFFLOADD_SERVER_SERVICE_NOTIFY_H_
