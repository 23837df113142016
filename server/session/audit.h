// The daemon's audit log: one INFO line per session opened or closed and per admin action,
// each starting "audit: " followed by key=value fields (strings quoted and C-escaped), so that
// `journalctl -u offloadd | grep 'audit: '` (or the glog file) answers who held what and who
// ended whose session:
//   audit: session_open session=7 client="train.py pid 4242 cuda:0" device="GPU-..." pid=4242
//          uid=1000 gid=1000 peer_known=true resumed_blocks=0
//   audit: session_close session=7 cause=closed blocks=0 bytes=0 client="..." pid=4242 uid=1000
//   audit: end_session by_uid=0 by_pid=311 session=7 reason="..." outcome=OK blocks=12
//          bytes=805306368
#ifndef OFFLOADD_SERVER_SESSION_AUDIT_H_
#define OFFLOADD_SERVER_SESSION_AUDIT_H_

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "server/session/core_stats.h"
#include "server/session/peer.h"

namespace offloadd::session {

// Each logs its line and returns it.
// `s` as Session::info() has it once Hello was admitted; resumed: blocks taken over by a resume.
std::string AuditSessionOpen(const SessionInfo& s, uint64_t resumed_blocks);
// `s` just before its blocks are released; cause: EndCauseName's text.
std::string AuditSessionClose(const SessionInfo& s, const char* cause);
// An EndSession call by `caller` (refused ones too: outcome is the status, `ended` then zero).
std::string AuditEndSession(const PeerCredentials& caller, uint64_t session_id,
                     const std::string& reason, const absl::Status& outcome,
                     const SessionInfo& ended);
// Quoted and C-escaped, for a field value.
std::string AuditQuote(const std::string& text);

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_AUDIT_H_
