// offloadctl: command-line tool for offloadd.
//
//   offloadctl [--socket PATH] stats [--json]   pool, sessions and counters (GetStats; links: topo),
//                                               GaLore projector refreshes (GetProjectorStats;
//                                               JSON: the "projector" member)
//   offloadctl [--socket PATH] health           gRPC health check; exit 0 when SERVING
//   offloadctl [--socket PATH] topo             NUMA nodes, host links, links (capacities,
//                                               busy share), GPUs with their bytes
//   offloadctl [--socket PATH] bench [...]      throughput and latency through the daemon
//   offloadctl [--socket PATH] sessions [--json] sessions with pid/uid/gid and pool usage
//   offloadctl [--socket PATH] end-session ID [--reason TEXT] [--force]   admin: end a session
//   offloadctl [--socket PATH] calibrate-links [--budget-seconds S] [--json]
//                                               admin: measure the links again (calibrate.h:
//                                               the measured link's GPUs hold their copies)
//   offloadctl plan [...]                       capacity planner (no daemon needed)
//   offloadctl --version                        the release (common/base/version.h), as offloadd --version
// Exit codes: 0 success, 1 the daemon answered with an error or is unreachable (a socket path
// with nothing there fails at once), 2 usage: an unknown command, option or argument is named
// on stderr and refused.
// stats, topo and sessions read GetStats without opening a session, so the sessions they show
// are the daemon's clients only.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "client/cli/bench.h"
#include "client/cli/calibrate.h"
#include "client/cli/projector_stats.h"
#include "client/cli/query.h"
#include "client/cli/sessions.h"
#include "client/offloadd_client.h"
#include "client/plan/plan_command.h"
#include "common/base/version.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"

namespace {


using offloadd::cli::Bytes;

int Usage(bool help = false) {
  (help ? std::cout : std::cerr)
      << "usage: offloadctl [--socket PATH] stats [--json] | health | topo | bench [--help]\n"
         "       offloadctl [--socket PATH] sessions [--json] | end-session ID [--reason T] [--force]\n"
         "       offloadctl [--socket PATH] calibrate-links [--budget-seconds S] [--json]\n"
         "         admin: measure the links without a configured capacity again (each GPU\n"
         "         alone, then a link's GPUs together) and pace them at it; while a link is\n"
         "         measured its GPUs' copies wait (other links keep moving): run it idle\n"
         "       offloadctl plan --help\n"
         "       offloadctl --version\n"
         "The socket is --socket PATH, else $OFFLOADD_SOCKET, else the default path\n"
         "(/run/offloadd/offloadd.sock as root, or for anyone where /run/offloadd exists;\n"
         "else $XDG_RUNTIME_DIR/offloadd/offloadd.sock, else /tmp/offloadd-$UID/offloadd.sock).\n";
  return help ? 0 : 2;
}

// An empty --socket is refused rather than read as "the default path": a script whose variable
// came out empty would otherwise talk to whatever daemon the default finds.
constexpr const char* kEmptySocket =
    "--socket needs a path, not an empty one (leave --socket out to use $OFFLOADD_SOCKET or the "
    "default path)";

// Prints `problem` and the usage; returns the usage exit code.
int UsageError(const std::string& problem) {
  std::cerr << "offloadctl: " << problem << "\n";
  return Usage();
}

// The daemon's Stats without opening a session; nullopt after printing why there are none.
std::optional<offloadd::v1::Stats> QueryStats(const std::string& socket) {
  if (absl::Status st = offloadd::cli::CheckSocketPresent(socket); !st.ok()) {
    std::cerr << "offloadctl: " << st.message() << "\n";
    return std::nullopt;
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  offloadd::v1::Stats stats;
  grpc::Status st =
      offloadd::cli::Stub(socket)->GetStats(&ctx, offloadd::v1::GetStatsRequest(), &stats);
  if (!st.ok()) {
    std::cerr << "offloadctl: " << offloadd::cli::RpcFailureText(st, socket) << "\n";
    return std::nullopt;
  }
  return stats;
}

// The spill tier's line of `stats` ("" without a tier): disk use, traffic, losses, pacing.
std::string SpillLine(const offloadd::v1::Stats& s) {
  if (!s.has_spill()) return "";
  const auto& sp = s.spill();
  const std::string pace =
      sp.bytes_per_second() > 0
          ? absl::StrFormat("paced %.2f GB/s%s", sp.bytes_per_second() / 1e9,
                            sp.bytes_per_second_measured() ? " (measured)" : "")
          : std::string("unpaced");
  return absl::StrFormat(
      "spill: %s on disk of %s (%d blocks), spilled %d (%s), staged back %d (%s), reloads "
      "from disk %d (waited %.2f s), lost %d, write failures %d; %s, %s\n",
      Bytes(sp.disk_bytes()), Bytes(sp.capacity_bytes()), sp.disk_blocks(),
      sp.spilled_blocks_total(), Bytes(sp.spill_bytes_total()), sp.staged_blocks_total(),
      Bytes(sp.stage_bytes_total()), sp.reloads_from_disk_total(),
      sp.reload_disk_wait_seconds_total(), sp.blocks_lost_total(), sp.spill_failures_total(),
      sp.io(), pace);
}

// The projector's BLAS line of `stats` ("" without a projector): the OpenBLAS core refreshes run
// on, who chose it, and the start-up self-check.
std::string ProjectorBlasLine(const offloadd::v1::Stats& s) {
  if (!s.has_projector_blas()) return "";
  const auto& b = s.projector_blas();
  std::string line = absl::StrFormat(
      "projector BLAS: OpenBLAS core %s (%s; OpenBLAS alone picks %s; CPU %s), self-check SGEMM "
      "%.1f GFLOP/s of about %.0f expected%s\n",
      b.core(), b.source(), b.openblas_core().empty() ? "?" : b.openblas_core(), b.isa(),
      b.self_check_gflops(), b.self_check_expected_gflops(),
      b.self_check_slow() ? " (SLOW: refreshes run far below this CPU's rate)" : "");
  for (const auto& note : b.notes()) line += "  note: " + note + "\n";
  return line;
}

int Stats(const std::string& socket, bool json) {
  auto s = QueryStats(socket);
  if (!s) return 1;
  if (json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions opts;
    opts.always_print_primitive_fields = true;
    opts.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(*s, &out, opts);
    std::cout << offloadd::cli::WithProjectorJson(out, offloadd::cli::QueryProjectorStats(socket))
              << "\n";
    return 0;
  }
  std::cout << absl::StrFormat(
      "backend %s, uptime %.1f s\n"
      "pool: %s used of %s (peak %s), %d blocks, %d free extents (largest %s)\n"
      "offloads: %d (%s), reloads: %d (%s), errors: %d, waiting for space: %d\n"
      "sessions open: %d%s\n",
      s->backend(), s->uptime_seconds(), Bytes(s->pool_used_bytes()),
      Bytes(s->pool_capacity_bytes()), Bytes(s->pool_peak_used_bytes()), s->blocks(),
      s->pool_free_extents(), Bytes(s->pool_largest_free_bytes()), s->offloads_total(),
      Bytes(s->offload_bytes_total()), s->reloads_total(), Bytes(s->reload_bytes_total()),
      s->errors_total(), s->offloads_waiting(), s->sessions_size(),
      s->sessions_filtered() ? " (not an admin: only this user's sessions)" : "");
  std::cout << SpillLine(*s);
  std::cout << offloadd::cli::ProjectorLine(offloadd::cli::QueryProjectorStats(socket));
  for (const auto& ses : s->sessions()) {
    std::cout << absl::StrFormat("  session %d  %-20s device %-12s pid %-7d %d blocks, %s\n",
                                 ses.session_id(), ses.client_name(), ses.device_id(), ses.pid(),
                                 ses.blocks(), Bytes(ses.used_bytes()));
  }
  std::cout << ProjectorBlasLine(*s);
  if (s->has_link_calibration()) {
    const auto& c = s->link_calibration();
    int failed = 0;
    for (const auto& l : c.links()) failed += l.error().empty() ? 0 : 1;
    std::cout << absl::StrFormat(
        "link calibration: %d link(s) measured, %d not, in %.2f s (the figures: stats --json, "
        "link_calibration)\n",
        c.links_size() - failed, failed, c.seconds());
  }
  return 0;
}

// The link tree from GetStats: NUMA node, host link (root port / memory node) if any, link with
// its capacities and PCI place, GPUs with the bytes each moved. "busy" is the share of the
// daemon's uptime a link direction was copying (for a host link: bytes / capacity / uptime).
int Topo(const std::string& socket) {
  auto s = QueryStats(socket);
  if (!s) return 1;
  const double up = s->uptime_seconds() > 0 ? s->uptime_seconds() : 1;
  auto rate = [](double r) {
    return r > 0 ? absl::StrFormat("%.2f GB/s", r / 1e9) : std::string("unpaced");
  };
  auto busy = [up](double seconds) { return absl::StrFormat("%.1f%%", 100 * seconds / up); };
  std::cout << absl::StrFormat("offloadd topology: backend %s, pool %s, uptime %.1f s\n",
                               s->backend(), Bytes(s->pool_capacity_bytes()), up);
  if (s->has_spill()) {
    const auto& sp = s->spill();
    std::cout << absl::StrFormat(
        "disk link spill  both directions %s%s  %s, %s moved (the spill tier: stats)\n",
        rate(sp.bytes_per_second()), sp.bytes_per_second_measured() ? " (measured)" : "",
        sp.io(), Bytes(sp.spill_bytes_total() + sp.stage_bytes_total()));
  }
  if (s->links().empty() && s->host_links().empty()) {
    std::cout << "no links yet: a link appears when a GPU's first copy is scheduled (each device "
                 "id gets one of its own), or at start-up for the links and gpus the config "
                 "names (links { name gpus d2h_bytes_per_second ... }, gpus { id pci_bus_id }; "
                 "offloadd --print-default-config)\n";
    return 0;
  }
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
    if (l.d2h_capacity_calibrated() || l.h2d_capacity_calibrated()) {
      line += "  (measured at start-up or by calibrate-links)";
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
    std::cout << (node < 0 ? std::string("numa node unknown") : absl::StrCat("numa node ", node)) << "\n";
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
    if (a == "--socket") {
      if (i + 1 >= argc) return UsageError("--socket needs a path");
      socket = argv[++i];
      if (socket.empty()) return UsageError(kEmptySocket);
    } else if (a.rfind("--socket=", 0) == 0) {
      socket = a.substr(9);
      if (socket.empty()) return UsageError(kEmptySocket);
    } else if (a == "--help" || a == "-h" || a == "help") {
      return Usage(/*help=*/true);
    } else if (a == "--version") {
      std::cout << "offloadctl " << offloadd::base::kVersion << "\n";
      return 0;
    } else if (a.rfind("-", 0) == 0) {
      return UsageError("unknown option '" + a + "'");
    } else {
      break;
    }
  }
  if (i >= argc) return UsageError("no command given");
  const std::string cmd = argv[i];
  std::vector<std::string> rest(argv + i + 1, argv + argc);
  if (cmd == "plan") {
    return offloadd::plan::RunPlanCommand(rest, std::cout, std::cerr);
  }
  const std::set<std::string> known = {"stats",    "health",      "topo",           "bench",
                                       "sessions", "end-session", "calibrate-links"};
  if (known.count(cmd) == 0) return UsageError("unknown command '" + cmd + "'");
  socket = offloadd::cli::ResolveSocket(socket);
  if (cmd == "bench") return offloadd::cli::RunBench(socket, rest);
  if (cmd == "sessions") return offloadd::cli::RunSessions(socket, rest);
  if (cmd == "end-session") return offloadd::cli::RunEndSession(socket, rest);
  if (cmd == "calibrate-links") return offloadd::cli::RunCalibrateLinks(socket, rest);
  bool json = false;
  for (const std::string& a : rest) {
    if (cmd == "stats" && a == "--json") {
      json = true;
    } else {
      std::cerr << "offloadctl " << cmd << ": unknown argument '" << a << "'\n";
      return Usage();
    }
  }
  if (cmd == "stats") return Stats(socket, json);
  if (cmd == "topo") return Topo(socket);
  // health: the gRPC health service, without a session (it must not take a session slot).
  if (absl::Status st = offloadd::cli::CheckSocketPresent(socket); !st.ok()) {
    std::cerr << "offloadctl: " << st.message() << "\n";
    return 1;
  }
  absl::Status st = offloadd::cli::CheckHealth(socket);
  if (!st.ok()) {
    std::cerr << "offloadctl: " << st.message() << "\n";
    return 1;
  }
  std::cout << "SERVING\n";
  return 0;
}
