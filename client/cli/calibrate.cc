#include "client/cli/calibrate.h"

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "client/cli/query.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/offload.grpc.pb.h"

namespace offloadd::cli {
namespace {

std::string Gbps(double bytes_per_second) {
  return bytes_per_second > 0 ? absl::StrFormat("%.2f GB/s", bytes_per_second / 1e9)
                              : std::string("-");
}

std::string Paced(double rate, bool configured) {
  if (rate <= 0) return "unpaced";
  return absl::StrFormat("%s (%s)", Gbps(rate), configured ? "configured" : "measured");
}

void Print(const v1::LinkCalibration& r) {
  std::cout << absl::StrFormat("link calibration: %d link(s) in %.2f s (budget %.2f s)\n",
                               r.links_size(), r.seconds(), r.budget_seconds());
  if (!r.note().empty()) std::cout << "  " << r.note() << "\n";
  for (const v1::CalibratedLink& l : r.links()) {
    std::cout << "link " << l.name() << "\n";
    for (const v1::GpuCopyRates& g : l.gpus()) {
      std::cout << absl::StrFormat("  gpu %s alone      d2h %-11s h2d %s\n", g.gpu(),
                                   Gbps(g.d2h_bytes_per_second()), Gbps(g.h2d_bytes_per_second()));
    }
    std::cout << absl::StrFormat("  %d GPU(s) together  d2h %-11s h2d %s\n", l.gpus_size(),
                                 Gbps(l.d2h_bytes_per_second()), Gbps(l.h2d_bytes_per_second()));
    if (!l.error().empty()) std::cout << "  not measured: " << l.error() << "\n";
    if (l.half_duplex()) {
      std::cout << "  paced at      " << Paced(l.paced_d2h_bytes_per_second(), l.d2h_configured())
                << " (half duplex: both directions)\n";
    } else {
      std::cout << "  paced at      d2h "
                << Paced(l.paced_d2h_bytes_per_second(), l.d2h_configured()) << ", h2d "
                << Paced(l.paced_h2d_bytes_per_second(), l.h2d_configured()) << "\n";
    }
  }
}

}  // namespace

int RunCalibrateLinks(const std::string& socket, const std::vector<std::string>& args) {
  v1::CalibrateLinksRequest req;
  bool json = false;
  for (size_t i = 0; i < args.size(); ++i) {
    std::string value;
    if (args[i] == "--json") {
      json = true;
      continue;
    }
    if (args[i] == "--budget-seconds" && i + 1 < args.size()) {
      value = args[++i];
    } else if (args[i].rfind("--budget-seconds=", 0) == 0) {
      value = args[i].substr(17);
    } else {
      std::cerr << "offloadctl calibrate-links: unexpected argument '" << args[i] << "'\n"
                << "usage: offloadctl [--socket PATH] calibrate-links [--budget-seconds S] "
                   "[--json]\n";
      return 2;
    }
    double budget = 0;
    if (!absl::SimpleAtod(value, &budget) || !(budget > 0 && budget <= 600)) {
      std::cerr << "offloadctl calibrate-links: --budget-seconds takes seconds in (0, 600], not '"
                << value << "'\n";
      return 2;
    }
    req.set_budget_seconds(budget);
  }
  if (absl::Status st = CheckSocketPresent(socket); !st.ok()) {
    std::cerr << "offloadctl: " << st.message() << "\n";
    return 1;
  }
  grpc::ClientContext ctx;
  // The daemon answers within its budget; allow for the drain and a slow start of each GPU.
  const double wait = (req.budget_seconds() > 0 ? req.budget_seconds() : 600) + 30;
  ctx.set_deadline(std::chrono::system_clock::now() +
                   std::chrono::milliseconds(static_cast<int64_t>(wait * 1000)));
  v1::LinkCalibration reply;
  grpc::Status st = Stub(socket)->CalibrateLinks(&ctx, req, &reply);
  if (!st.ok()) {
    std::cerr << "offloadctl: " << RpcFailureText(st, socket) << "\n";
    return 1;
  }
  if (json) {
    std::string out;
    google::protobuf::util::JsonPrintOptions opts;
    opts.always_print_primitive_fields = true;
    opts.preserve_proto_field_names = true;
    (void)google::protobuf::util::MessageToJsonString(reply, &out, opts);
    std::cout << out << "\n";
  } else {
    Print(reply);
  }
  for (const v1::CalibratedLink& l : reply.links()) {
    if (!l.error().empty()) return 1;
  }
  return 0;
}

}  // namespace offloadd::cli
