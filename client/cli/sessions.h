// offloadctl sessions | end-session: the admin view of offloadd's sessions.
//
//   offloadctl [--socket PATH] sessions [--json]
//       every open session with its process (pid, uid, gid from the connection's credentials),
//       device, blocks, pool bytes and requests in flight; per-uid usage against the uid quota.
//       A caller that is not an admin (root, the daemon's uid, admin_uids) sees its own uid's
//       sessions only, and is told so.
//   offloadctl [--socket PATH] end-session ID [--reason TEXT]
//       ends session ID as if its process had exited: its blocks return to the pool, its client
//       gets ABORTED with the reason. Admins only (PERMISSION_DENIED otherwise).
// Both use unary RPCs on their own channel: offloadctl opens no session of its own.
// Exit codes: 0 success, 1 the daemon refused or is unreachable, 2 usage.
#ifndef OFFLOADD_CLIENT_CLI_SESSIONS_H_
#define OFFLOADD_CLIENT_CLI_SESSIONS_H_

#include <string>
#include <vector>

namespace offloadd::cli {

int RunSessions(const std::string& socket, const std::vector<std::string>& args);
int RunEndSession(const std::string& socket, const std::vector<std::string>& args);

}  // namespace offloadd::cli

#endif  // OFFLOADD_CLIENT_CLI_SESSIONS_H_
