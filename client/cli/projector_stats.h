// The GaLore projector service's counters in `offloadctl stats` (Projector.GetProjectorStats,
// proto/projector.proto): refreshes the daemon computed, those it deduplicated (a repeated key
// that took the first refresh's result, no SVD), gradients that differed from the first one's,
// and the queue. Read on its own channel, without opening a session.
#ifndef OFFLOADD_CLIENT_CLI_PROJECTOR_STATS_H_
#define OFFLOADD_CLIENT_CLI_PROJECTOR_STATS_H_

#include <string>

#include "absl/status/statusor.h"
#include "proto/projector.pb.h"

namespace offloadd::cli {

// The service's counters since the daemon started (daemon-wide). UNAVAILABLE when the daemon
// runs without the projector service (its config turns it off); other RPC errors as gRPC
// reports them, with the socket path.
absl::StatusOr<v1::ProjectorStats> QueryProjectorStats(const std::string& socket);

// One line of `stats` text: "GaLore projector refreshes: 28 computed, 14 deduplicated, ...",
// or why there are none ("off": the service is disabled; else the error).
std::string ProjectorLine(const absl::StatusOr<v1::ProjectorStats>& stats);

// `json_object` (a JSON object's text, "{...}") with "projector": the counters' JSON (proto
// field names, zeros included) added as its last member; unchanged when `stats` is an error.
std::string WithProjectorJson(const std::string& json_object,
                              const absl::StatusOr<v1::ProjectorStats>& stats);

}  // namespace offloadd::cli

#endif  // OFFLOADD_CLIENT_CLI_PROJECTOR_STATS_H_
