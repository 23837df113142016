// Text and JSON renderings of planner results (client/plan/planner.h), as printed by
// `offloadctl plan`. Precision of the text output: times in ms with 2 decimals, percentages with
// 1 decimal, sizes in GiB (2^30 bytes) or MiB with 2 decimals plus exact bytes, link rates in
// GB/s (1e9 bytes/s) — the precision the reference document prints its worked figures at.
// JSON output carries base units (bytes, seconds, bytes/s, FLOP, FLOP/s, fractions) at full
// double precision, with the same field names as the Python package (offloadd.plan).
#ifndef OFFLOADD_CLIENT_PLAN_PLAN_FORMAT_H_
#define OFFLOADD_CLIENT_PLAN_PLAN_FORMAT_H_

#include <cstdint>
#include <string>
#include <vector>

#include "client/plan/planner.h"

namespace offloadd::plan {

// Human-readable report of one plan, one quantity per line, ending in '\n': the figures, the
// GPU memory lines (with --gpu-memory) and the decision line (planner.h Decision).
std::string FormatPlanText(const Plan& plan);

// The settings that follow from a plan, to paste: the enable() call (offloadd.transformers, and
// offloadd.torch's context for plain torch) and the daemon's pool_bytes config line; for
// kNotNeeded / kNothingToOffload one line saying no offload is set up. Ends in '\n'.
// `config_lines`, when not empty, replaces the pool_bytes line (the spill tier's lines).
std::string FormatSettingsText(const Plan& plan, const std::string& config_lines = "");

// "offloadd.transformers.enable(keep_last_n=1, prefetch=1)", with threshold_bytes when a
// checkpoint is below offloadd.torch's default threshold (it would not be offloaded otherwise).
std::string EnableCall(const Plan& plan);

// One JSON object (no trailing newline).
std::string FormatPlanJson(const Plan& plan);

// Table over the sequence lengths of `rows` (all from one Sweep call), ending in '\n'.
std::string FormatSweepText(const std::vector<Plan>& rows);

// {"sweep": [plan objects as FormatPlanJson writes them]}.
std::string FormatSweepJson(const std::vector<Plan>& rows);

// "1,234,567". Exposed for tests.
std::string WithThousands(uint64_t n);

// "32.00 MiB" below 1 GiB, else "36.00 GiB".
std::string FormatBytes(uint64_t bytes);

}  // namespace offloadd::plan

#endif  // OFFLOADD_CLIENT_PLAN_PLAN_FORMAT_H_
