// offloadctl calibrate-links: measure the daemon's links again (CalibrateLinks).
//
//   offloadctl [--socket PATH] calibrate-links [--budget-seconds S] [--json]
//       asks the daemon to measure, within S seconds (default: its
//       link_calibration_budget_seconds), every link with a direction without a configured
//       capacity: each GPU alone, then the link's GPUs together, per direction; each such link
//       is then paced at what its GPUs moved together. Prints, per link, each GPU's figures
//       alone, the GPUs' together and what the link is now paced at (or why it was not
//       measured). While a link is measured its GPUs' copies wait on the daemon's device threads
//       (other links keep moving), and traffic already on its switch lowers the figures: run it
//       while the node is idle. Admins only (PERMISSION_DENIED otherwise); cuda and cuda-sim
//       backends (FAILED_PRECONDITION on shm).
// Exit codes: 0 measured (or nothing to measure), 1 the daemon refused, is unreachable, or a
// link could not be measured, 2 usage.
#ifndef OFFLOADD_CLIENT_CLI_CALIBRATE_H_
#define OFFLOADD_CLIENT_CLI_CALIBRATE_H_

#include <string>
#include <vector>

namespace offloadd::cli {

int RunCalibrateLinks(const std::string& socket, const std::vector<std::string>& args);

}  // namespace offloadd::cli

#endif  // OFFLOADD_CLIENT_CLI_CALIBRATE_H_
