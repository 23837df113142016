// offloadctl: command-line tool for offloadd.
//
//   offloadctl [--socket PATH] stats [--json]   pool, sessions, links and counters (GetStats)
//   offloadctl [--socket PATH] health           gRPC health check; exit 0 when SERVING
//   offloadctl [--socket PATH] topo             links with their GPUs and capacities
//   offloadctl [--socket PATH] bench [...]      throughput and latency through the daemon
//   offloadctl plan [...]                       capacity planner (no daemon needed)
// Exit codes: 0 success, 1 the daemon answered with an error or is unreachable, 2 usage.
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "client/cli/bench.h"
#include "client/offloadd_client.h"
#include "client/plan/plan_command.h"
#include "google/protobuf/util/json_util.h"

namespace {

using offloadd::client::Client;
using offloadd::client::ClientOptions;

int Usage() {
  std::cerr << "usage: offloadctl [--socket PATH] stats [--json] | health | topo | bench [--help]\n"
               "       offloadctl plan --help\n";
  return 2;
}

std::string Bytes(double b) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (b >= 1024 && u < 4) {
    b /= 1024;
    ++u;
  }
  return absl::StrFormat("%.2f %s", b, units[u]);
}

absl::StatusOr<std::unique_ptr<Client>> ConnectForQuery(const std::string& socket) {
  ClientOptions o;
  o.socket_path = socket;
  o.client_name = "offloadctl";
  o.device_id = "offloadctl";
  o.connect_timeout_seconds = 5;
  return Client::Connect(o);
}

int Stats(Client& c, bool json) {
  auto s = c.GetStats();
  if (!s.ok()) {
    std::cerr << "offloadctl: " << s.status().message() << "\n";
    return 1;
  }
  if (json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions opts;
    opts.always_print_primitive_fields = true;
    opts.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*s, &out, opts);
    std::cout << out << "\n";
    return 0;
  }
  std::cout << absl::StrFormat(
      "backend %s, uptime %.1f s\n"
      "pool: %s used of %s (peak %s), %d blocks, %d free extents (largest %s)\n"
      "offloads: %d (%s), reloads: %d (%s), errors: %d, waiting for space: %d\n"
      "sessions open: %d (stats query itself included)\n",
      s->backend(), s->uptime_seconds(), Bytes(s->pool_used_bytes()),
      Bytes(s->pool_capacity_bytes()), Bytes(s->pool_peak_used_bytes()), s->blocks(),
      s->pool_free_extents(), Bytes(s->pool_largest_free_bytes()), s->offloads_total(),
      Bytes(s->offload_bytes_total()), s->reloads_total(), Bytes(s->reload_bytes_total()),
      s->errors_total(), s->offloads_waiting(), s->sessions_open());
  for (const auto& ses : s->sessions()) {
    std::cout << absl::StrFormat("  session %d  %-20s device %-12s pid %-7d %d blocks, %s\n",
                                 ses.session_id(), ses.client_name(), ses.device_id(), ses.pid(),
                                 ses.blocks(), Bytes(ses.used_bytes()));
  }
  return 0;
}

int Topo(Client& c) {
  auto s = c.GetStats();
  if (!s.ok()) {
    std::cerr << "offloadctl: " << s.status().message() << "\n";
    return 1;
  }
  std::cout << "host memory (pool " << Bytes(s->pool_capacity_bytes()) << ")\n";
  for (const auto& l : s->links()) {
    auto rate = [](double r) {
      return r > 0 ? absl::StrFormat("%.2f GB/s", r / 1e9) : std::string("unpaced");
    };
    std::cout << absl::StrFormat("└─ link %s  d2h %s (%.3f s busy), h2d %s (%.3f s busy)\n",
                                 l.name(), rate(l.d2h_capacity_bytes_per_second()),
                                 l.d2h_busy_seconds(), rate(l.h2d_capacity_bytes_per_second()),
                                 l.h2d_busy_seconds());
    for (const auto& g : l.gpus()) std::cout << "   └─ gpu " << g << "\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string socket;
  int i = 1;
  for (; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--socket" && i + 1 < argc) {
      socket = argv[++i];
    } else if (a.rfind("--socket=", 0) == 0) {
      socket = a.substr(9);
    } else {
      break;
    }
  }
  if (i >= argc) return Usage();
  std::string cmd = argv[i];
  std::vector<std::string> rest(argv + i + 1, argv + argc);
  if (cmd == "plan") {
    return offloadd::plan::RunPlanCommand(rest, std::cout, std::cerr);
  }
  if (cmd == "bench") return offloadd::cli::RunBench(socket, rest);
  if (cmd != "stats" && cmd != "health" && cmd != "topo") return Usage();
  auto client = ConnectForQuery(socket);
  if (!client.ok()) {
    std::cerr << "offloadctl: " << client.status().message() << "\n";
    return 1;
  }
  if (cmd == "health") {
    absl::Status st = (*client)->CheckHealth();
    std::cout << (st.ok() ? "SERVING" : std::string(st.message())) << "\n";
    return st.ok() ? 0 : 1;
  }
  if (cmd == "topo") return Topo(**client);
  bool json = !rest.empty() && rest[0] == "--json";
  return Stats(**client, json);
}
