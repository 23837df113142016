// `offloadctl bench`: measures the daemon on the shm backend, as ratios within one run.
//  1. Throughput: offload then reload `blocks` blocks of `block_bytes` (default 8 x 64 MiB) with
//     all requests in flight, against plain memcpy of the same bytes (region -> buffer -> region)
//     in the same run. Reports GB/s of both and their ratio (target >= 0.8).
//  2. Small requests: 4 KiB offload + reload(release) round trips, one at a time: p50/p99
//     latency in µs; and requests/s with `window` requests in flight on 1 and on 4 sessions.
// Output: a human-readable table, or one JSON object with --json.
#ifndef OFFLOADD_CLIENT_CLI_BENCH_H_
#define OFFLOADD_CLIENT_CLI_BENCH_H_

#include <string>
#include <vector>

namespace offloadd::cli {

// Returns the process exit code (0 ok, 1 daemon error, 2 usage).
int RunBench(const std::string& socket_path, const std::vector<std::string>& args);

}  // namespace offloadd::cli

#endif  // OFFLOADD_CLIENT_CLI_BENCH_H_
