#include "server/session/audit.h"

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"

namespace offloadd::session {
namespace {

std::string Log(std::string line) {
  LOG(INFO) << line;
  return line;
}

}  // namespace

std::string AuditQuote(const std::string& text) {
  // glog cuts a line at 30000 bytes: a long text (an EndSession reason is not bounded) would
  // cut off the fields after it, the closing quote and outcome= among them.
  constexpr size_t kMaxQuotedBytes = 1024;
  if (text.size() <= kMaxQuotedBytes) return absl::StrCat("\"", absl::CEscape(text), "\"");
  return absl::StrCat("\"", absl::CEscape(text.substr(0, kMaxQuotedBytes)), "...[",
                      text.size(), "B]\"");
}

std::string AuditSessionOpen(const SessionInfo& s, uint64_t resumed_blocks) {
  return Log(absl::StrFormat(
      "audit: session_open session=%d client=%s device=%s pid=%d uid=%d gid=%d peer_known=%s "
      "resumed_blocks=%d",
      s.session_id, AuditQuote(s.client_name), AuditQuote(s.device_id), s.pid, s.uid, s.gid,
      s.peer_known ? "true" : "false", resumed_blocks));
}

std::string AuditSessionClose(const SessionInfo& s, const char* cause) {
  return Log(absl::StrFormat(
      "audit: session_close session=%d cause=%s blocks=%d bytes=%d client=%s device=%s pid=%d "
      "uid=%d fallbacks=%d host_wait_seconds=%.3f",
      s.session_id, cause, s.blocks, s.used_bytes, AuditQuote(s.client_name),
      AuditQuote(s.device_id), s.pid, s.uid, s.client_report.fallbacks_total,
      s.client_report.host_wait_seconds_total));
}

std::string AuditEndSession(const PeerCredentials& caller, uint64_t session_id,
                     const std::string& reason, const absl::Status& outcome,
                     const SessionInfo& ended) {
  return Log(absl::StrFormat(
      "audit: end_session by_uid=%d by_pid=%d session=%d reason=%s outcome=%s blocks=%d "
      "bytes=%d",
      caller.uid, caller.pid, session_id, AuditQuote(reason),
      outcome.ok() ? "OK" : absl::StatusCodeToString(outcome.code()), ended.blocks,
      ended.used_bytes));
}

}  // namespace offloadd::session
