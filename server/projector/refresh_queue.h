// FairRefreshQueue: the pending refreshes of the projector service.
//
// Order: round robin over parameters, and within a parameter by increasing step (FIFO for equal
// steps). At most one refresh of a parameter is handed out at a time: a parameter whose refresh
// is running is out of the ring until Done(), then goes to its back if it has more queued. So a
// parameter with a long backlog delays every other parameter by at most one of its refreshes
// per turn (no head-of-line blocking), and one parameter's refreshes never overlap (each one's
// previous projector is the one before it).
//
// Not thread-safe: the service calls it under its own mutex.
#ifndef OFFLOADD_SERVER_PROJECTOR_REFRESH_QUEUE_H_
#define OFFLOADD_SERVER_PROJECTOR_REFRESH_QUEUE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "absl/types/optional.h"

namespace offloadd::projector {

class FairRefreshQueue {
 public:
  struct Item {
    std::string parameter;
    int64_t step = 0;
    uint64_t id = 0;
  };

  void Push(const std::string& parameter, int64_t step, uint64_t id);

  // The next runnable refresh (nullopt when every queued one belongs to a running parameter, or
  // nothing is queued). Marks its parameter running until Done(parameter).
  absl::optional<Item> Pop();

  // The parameter's refresh handed out by Pop has finished.
  void Done(const std::string& parameter);

  // Removes every queued (not running) refresh and returns their ids.
  std::vector<uint64_t> TakeAll();

  size_t queued() const { return queued_; }
  size_t running() const { return running_; }

 private:
  struct PerParameter {
    std::multimap<int64_t, uint64_t> by_step;  // step -> refresh id
    bool running = false;
    bool in_ring = false;
  };
  std::map<std::string, PerParameter> parameters_;
  std::deque<std::string> ring_;  // parameters with queued work, not running
  size_t queued_ = 0;
  size_t running_ = 0;
};

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_REFRESH_QUEUE_H_
