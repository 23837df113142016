#include "client/cli/projector_stats.h"

#include <chrono>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "google/protobuf/util/json_util.h"
#include "grpcpp/grpcpp.h"
#include "proto/projector.grpc.pb.h"

namespace offloadd::cli {

absl::StatusOr<v1::ProjectorStats> QueryProjectorStats(const std::string& socket) {
  auto stub = v1::Projector::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
  v1::ProjectorStats stats;
  grpc::Status st = stub->GetProjectorStats(&ctx, v1::ProjectorStatsRequest(), &stats);
  if (!st.ok()) {
    return absl::Status(static_cast<absl::StatusCode>(st.error_code()),
                        absl::StrCat(st.error_message(), " (unix:", socket, ")"));
  }
  return stats;
}

std::string ProjectorLine(const absl::StatusOr<v1::ProjectorStats>& stats) {
  if (absl::IsUnavailable(stats.status())) {
    return "GaLore projector refreshes: off (the daemon runs without the projector service)\n";
  }
  if (!stats.ok()) {
    return absl::StrCat("GaLore projector refreshes: not available: ", stats.status().message(),
                        "\n");
  }
  const v1::ProjectorStats& s = *stats;
  return absl::StrFormat(
      "GaLore projector refreshes: %d computed, %d deduplicated (no SVD: a repeated key took "
      "the first result), %d gradient mismatches; %d queued, %d running; %d parameters held; "
      "backend %s\n",
      s.computed_total(), s.deduplicated_total(), s.content_mismatches_total(), s.queued(),
      s.running(), s.parameters_held(), s.backend());
}

std::string WithProjectorJson(const std::string& json_object,
                              const absl::StatusOr<v1::ProjectorStats>& stats) {
  if (!stats.ok() || json_object.size() < 2 || json_object.back() != '}') return json_object;
  std::string member;
  google::protobuf::util::JsonPrintOptions opts;
  opts.always_print_primitive_fields = true;
  opts.preserve_proto_field_names = true;
  if (!google::protobuf::util::MessageToJsonString(*stats, &member, opts).ok()) {
    return json_object;
  }
  std::string out = json_object.substr(0, json_object.size() - 1);
  const bool empty = out.find_first_not_of(" \n{") == std::string::npos;
  return absl::StrCat(out, empty ? "" : ",", "\"projector\":", member, "}");
}

}  // namespace offloadd::cli
