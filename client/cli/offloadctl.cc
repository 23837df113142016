// offloadctl: command-line tool for offloadd.
//
//   offloadctl [--socket PATH] stats [--json]   pool, sessions, links and counters (GetStats)
//   offloadctl [--socket PATH] health           gRPC health check; exit 0 when SERVING
//   offloadctl [--socket PATH] topo             NUMA nodes, host links, links (capacities,
//                                               busy share), GPUs with their bytes
//   offloadctl [--socket PATH] bench [...]      throughput and latency through the daemon
//   offloadctl [--socket PATH] sessions [--json] sessions with pid/uid/gid and pool usage
//   offloadctl [--socket PATH] end-session ID [--reason TEXT]   admin: end a session
//   offloadctl plan [...]                       capacity planner (no daemon needed)
// Exit codes: 0 success, 1 the daemon answered with an error or is unreachable, 2 usage.
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/bench.h"
#include "client/cli/sessions.h"
#include "client/offloadd_client.h"
#include "client/plan/plan_command.h"
#include "google/protobuf/util/json_util.h"

namespace {

using offloadd::client::Client;
using offloadd::client::ClientOptions;

int Usage(bool help = false) {
  (help ? std::cout : std::cerr) << "usage: offloadctl [--socket PATH] stats [--json] | health | topo | bench [--help]\n"
               "       offloadctl [--socket PATH] sessions [--json] | end-session ID [--reason T]\n"
               "       offloadctl plan --help\n"
               "The socket is --socket PATH, else $OFFLOADD_SOCKET, else the default path\n"
               "(/run/offloadd/offloadd.sock as root, $XDG_RUNTIME_DIR/offloadd/offloadd.sock,\n"
               "/tmp/offloadd-$UID/offloadd.sock).\n";
  return help ? 0 : 2;
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

// The link tree from GetStats: NUMA node, host link (root port / memory node) if any, link with
// its capacities and PCI place, GPUs with the bytes each moved. "busy" is the share of the
// daemon's uptime a link direction was copying (for a host link: bytes / capacity / uptime).
int Topo(Client& c) {
  auto s = c.GetStats();
  if (!s.ok()) {
    std::cerr << "offloadctl: " << s.status().message() << "\n";
    return 1;
  }
  const double up = s->uptime_seconds() > 0 ? s->uptime_seconds() : 1;
  auto rate = [](double r) {
    return r > 0 ? absl::StrFormat("%.2f GB/s", r / 1e9) : std::string("unpaced");
  };
  auto busy = [up](double seconds) { return absl::StrFormat("%.1f%%", 100 * seconds / up); };
  std::cout << absl::StrFormat("offloadd topology: backend %s, pool %s, uptime %.1f s\n",
                               s->backend(), Bytes(s->pool_capacity_bytes()), up);
  std::map<std::string, const offloadd::v1::LinkStats*> by_name;
  for (const auto& l : s->links()) by_name[l.name()] = &l;
  auto print_link = [&](const offloadd::v1::LinkStats& l, const std::string& indent) {
    std::string line = absl::StrFormat("%slink %s  ", indent, l.name());
    if (l.half_duplex()) {
      line += absl::StrFormat("both directions %s (busy %s)",
                              rate(l.d2h_capacity_bytes_per_second()), busy(l.d2h_busy_seconds()));
    } else {
      line += absl::StrFormat("d2h %s (busy %s)  h2d %s (busy %s)",
                              rate(l.d2h_capacity_bytes_per_second()), busy(l.d2h_busy_seconds()),
                              rate(l.h2d_capacity_bytes_per_second()), busy(l.h2d_busy_seconds()));
    }
    if (l.pcie_bytes_per_second() > 0) line += "  pcie " + rate(l.pcie_bytes_per_second());
    if (!l.root_port().empty()) line += "  root port " + l.root_port();
    if (l.d2h_queued_transfers() + l.h2d_queued_transfers() > 0) {
      line += absl::StrFormat("  queued %d/%d", l.d2h_queued_transfers(), l.h2d_queued_transfers());
    }
    std::cout << line << "\n";
    for (const auto& g : l.gpu_bytes()) {
      const std::string bus = g.pci_bus_id().empty() ? "" : "  " + g.pci_bus_id();
      if (l.half_duplex()) {  // one queue: the bytes of both directions are in d2h_bytes
        std::cout << absl::StrFormat("%s  gpu %s%s  both directions %s\n", indent, g.gpu(), bus,
                                     Bytes(g.d2h_bytes()));
      } else {
        std::cout << absl::StrFormat("%s  gpu %s%s  d2h %s  h2d %s\n", indent, g.gpu(), bus,
                                     Bytes(g.d2h_bytes()), Bytes(g.h2d_bytes()));
      }
    }
  };
  // NUMA node of a host link: its own, else its first known child's.
  auto host_numa = [&](const offloadd::v1::HostLinkStats& h) {
    if (h.numa_node() >= 0) return h.numa_node();
    for (const auto& child : h.links()) {
      auto it = by_name.find(child);
      if (it != by_name.end() && it->second->numa_node() >= 0) return it->second->numa_node();
    }
    return -1;
  };
  std::set<int> nodes;
  for (const auto& l : s->links()) {
    if (l.parent().empty()) nodes.insert(l.numa_node());
  }
  for (const auto& h : s->host_links()) nodes.insert(host_numa(h));
  for (int node : nodes) {
    std::cout << (node < 0 ? std::string("numa node ?") : absl::StrCat("numa node ", node)) << "\n";
    for (const auto& h : s->host_links()) {
      if (host_numa(h) != node) continue;
      std::cout << absl::StrFormat(
          "  host link %s  d2h %s (busy %s)  h2d %s (busy %s)\n", h.name(),
          rate(h.d2h_capacity_bytes_per_second()), busy(h.d2h_busy_seconds()),
          rate(h.h2d_capacity_bytes_per_second()), busy(h.h2d_busy_seconds()));
      for (const auto& child : h.links()) {
        auto it = by_name.find(child);
        if (it != by_name.end()) {
          print_link(*it->second, "    ");
        } else {
          std::cout << "    link " << child << "  (not in use yet)\n";
        }
      }
    }
    for (const auto& l : s->links()) {
      if (l.parent().empty() && l.numa_node() == node) print_link(l, "  ");
    }
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
  if (socket.empty() && std::getenv("OFFLOADD_SOCKET") != nullptr) {
    socket = std::getenv("OFFLOADD_SOCKET");
  }
  std::string cmd = argv[i];
  if (cmd == "--help" || cmd == "-h" || cmd == "help") return Usage(/*help=*/true);
  std::vector<std::string> rest(argv + i + 1, argv + argc);
  if (cmd == "plan") {
    return offloadd::plan::RunPlanCommand(rest, std::cout, std::cerr);
  }
  if (cmd == "bench") return offloadd::cli::RunBench(socket, rest);
  if (cmd == "sessions") return offloadd::cli::RunSessions(socket, rest);
  if (cmd == "end-session") return offloadd::cli::RunEndSession(socket, rest);
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
