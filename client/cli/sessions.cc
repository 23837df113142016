#include "client/cli/sessions.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "client/cli/query.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/offload.grpc.pb.h"

namespace offloadd::cli {
namespace {

void SetDeadline(grpc::ClientContext* ctx) {
  ctx->set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
}

int Failed(const grpc::Status& st, const std::string& socket) {
  std::cerr << "offloadctl: " << RpcFailureText(st, socket) << "\n";
  return 1;
}

// OK, or prints why the socket cannot be reached and returns false.
bool SocketPresent(const std::string& socket) {
  absl::Status st = CheckSocketPresent(socket);
  if (!st.ok()) std::cerr << "offloadctl: " << st.message() << "\n";
  return st.ok();
}

std::string Json(const google::protobuf::Message& m) {
  std::string out;
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  (void)google::protobuf::util::MessageToJsonString(m, &out, opts);
  return out;
}

// The session part of Stats and nothing else: sessions, per-uid usage, the quotas and the pool
// they count against (64-bit counts as strings, as in `stats --json`, the protobuf JSON mapping).
std::string SessionsJson(const v1::Stats& s) {
  std::vector<std::string> sessions, uids;
  for (const auto& x : s.sessions()) sessions.push_back(Json(x));
  for (const auto& u : s.uid_usage()) uids.push_back(Json(u));
  return absl::StrFormat(
      "{\"sessions\":[%s],\"sessions_filtered\":%s,\"uid_usage\":[%s],"
      "\"session_quota_bytes\":\"%d\",\"uid_quota_bytes\":\"%d\","
      "\"pool_capacity_bytes\":\"%d\",\"pool_used_bytes\":\"%d\"}",
      absl::StrJoin(sessions, ","), s.sessions_filtered() ? "true" : "false",
      absl::StrJoin(uids, ","), s.session_quota_bytes(), s.uid_quota_bytes(),
      s.pool_capacity_bytes(), s.pool_used_bytes());
}

}  // namespace

int RunSessions(const std::string& socket, const std::vector<std::string>& args) {
  bool json = false;
  for (const std::string& a : args) {
    if (a == "--json") {
      json = true;
    } else {
      std::cerr << "offloadctl sessions: unknown argument '" << a
                << "'\nusage: offloadctl [--socket PATH] sessions [--json]\n";
      return 2;
    }
  }
  if (!SocketPresent(socket)) return 1;
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::GetStatsRequest req;
  v1::Stats s;
  grpc::Status st = Stub(socket)->GetStats(&ctx, req, &s);
  if (!st.ok()) return Failed(st, socket);
  if (json) {
    std::cout << SessionsJson(s) << "\n";
    return 0;
  }
  std::cout << absl::StrFormat("pool %s used of %s; session quota %s, uid quota %s\n",
                               Bytes(s.pool_used_bytes()), Bytes(s.pool_capacity_bytes()),
                               s.session_quota_bytes() ? Bytes(s.session_quota_bytes()) : "none",
                               s.uid_quota_bytes() ? Bytes(s.uid_quota_bytes()) : "none");
  if (s.sessions_filtered()) {
    std::cout << "(not an admin: only this user's sessions are shown)\n";
  }
  int client_width = 6, device_width = 6;  // the columns fit the longest name
  for (const auto& x : s.sessions()) {
    client_width = std::max<int>(client_width, x.client_name().size());
    device_width = std::max<int>(device_width, x.device_id().size());
  }
  std::cout << absl::StrFormat("%8s %-*s %-*s %8s %6s %6s %7s %12s %9s %9s %10s\n", "SESSION",
                               client_width, "CLIENT", device_width, "DEVICE", "PID", "UID",
                               "GID", "BLOCKS", "POOL", "IN-FLIGHT", "FALLBACKS", "HOST-WAIT");
  for (const auto& x : s.sessions()) {
    const v1::ClientReport& r = x.client_report();
    std::cout << absl::StrFormat(
        "%8d %-*s %-*s %8d %6s %6s %7d %12s %9d %9d %9.2fs\n", x.session_id(), client_width,
        x.client_name(), device_width, x.device_id(), x.pid(),
        x.peer_known() ? std::to_string(x.uid()) : "?",
        x.peer_known() ? std::to_string(x.gid()) : "?", x.blocks(), Bytes(x.used_bytes()),
        x.requests_in_flight(), r.fallbacks_total(), r.host_wait_seconds_total());
  }
  if (s.sessions_size() > 0) {
    std::cout << "(FALLBACKS, HOST-WAIT: as the client reported them for this session)\n";
  }
  for (const auto& u : s.uid_usage()) {
    std::cout << absl::StrFormat(
        "uid %d holds %s%s\n", u.uid(), Bytes(u.used_bytes()),
        s.uid_quota_bytes() ? absl::StrFormat(" of %s", Bytes(s.uid_quota_bytes())) : "");
  }
  return 0;
}

int RunEndSession(const std::string& socket, const std::vector<std::string>& args) {
  v1::EndSessionRequest req;
  bool have_id = false, force = false;
  for (size_t i = 0; i < args.size(); ++i) {
    if (args[i] == "--reason" && i + 1 < args.size() && !args[i + 1].empty() &&
        args[i + 1].rfind("--", 0) != 0) {
      req.set_reason(args[++i]);
    } else if (args[i] == "--reason" || args[i] == "--reason=") {
      std::cerr << "offloadctl end-session: --reason needs a value (--reason TEXT)\n";
      return 2;
    } else if (args[i].rfind("--reason=", 0) == 0) {
      req.set_reason(args[i].substr(9));
    } else if (args[i] == "--force") {
      force = true;
    } else if (!have_id && !args[i].empty() && args[i][0] != '-') {
      // Digits only, within 64 bits: strtoull made 18446744073709551616 the id ...615.
      uint64_t id = 0;
      have_id = args[i].find_first_not_of("0123456789") == std::string::npos &&
                absl::SimpleAtoi(args[i], &id) && id != 0;
      if (!have_id) {
        std::cerr << "offloadctl end-session: '" << args[i]
                  << "' is not a session id: a whole number from 1 to 18446744073709551615 (the "
                     "SESSION column of `offloadctl sessions`)\n";
        break;
      }
      req.set_session_id(id);
    } else {
      std::cerr << "offloadctl end-session: unexpected argument '" << args[i] << "'\n";
      have_id = false;
      break;
    }
  }
  if (!have_id) {
    std::cerr << "usage: offloadctl [--socket PATH] end-session SESSION_ID [--reason TEXT] "
                 "[--force]\n";
    return 2;
  }
  if (!SocketPresent(socket)) return 1;
  if (req.reason().empty()) req.set_reason("ended with offloadctl end-session");
  req.set_force(force);
  auto stub = Stub(socket);
  grpc::ClientContext ctx;
  SetDeadline(&ctx);
  v1::EndSessionReply reply;
  grpc::Status st = stub->EndSession(&ctx, req, &reply);
  if (!st.ok()) return Failed(st, socket);
  const v1::SessionStats& x = reply.session();
  std::cout << absl::StrFormat("ended session %d (%s, device %s, pid %d): released %d blocks, %s\n",
                               x.session_id(), x.client_name(), x.device_id(), x.pid(), x.blocks(),
                               Bytes(x.used_bytes()));
  return 0;
}

}  // namespace offloadd::cli
