// FairRefreshQueue: the pending refreshes of the projector service.
//
// Order: round robin over owners (caller uids), within an owner round robin over its
// parameters, and within a parameter by increasing step (FIFO for equal steps). Each Pop takes
// the front owner's front parameter and sends the owner behind every owner waiting at the next
// Pop (including owners that arrived in between), so one
// owner's backlog (many parameters or many steps) delays another owner's refresh by at most one
// of its own refreshes per turn. At most one refresh of a parameter is handed out at a time: a
// parameter whose refresh is running is out of the rings until Done(), then goes to the back of
// its owner's ring if it has more queued. So no parameter blocks another (no head-of-line
// blocking), and one parameter's refreshes never overlap (each one's previous projector is the
// one before it). Parameter names must be unique across owners (the service scopes them).
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
    int64_t owner = 0;
  };

  // Queues refresh `id` of `parameter` (owned by `owner`; a parameter keeps its first owner).
  void Push(const std::string& parameter, int64_t step, uint64_t id, int64_t owner = 0);

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
    int64_t owner = 0;
    bool running = false;
    bool in_ring = false;
  };
  struct PerOwner {
    std::deque<std::string> ring;  // its parameters with queued work, not running
    bool in_ring = false;
  };
  // Puts a parameter with queued work (not running) at the back of its owner's ring.
  void Enter(const std::string& parameter, PerParameter& p);
  std::map<std::string, PerParameter> parameters_;
  std::map<int64_t, PerOwner> owners_;  // owners with a non-empty ring
  std::deque<int64_t> owner_ring_;      // those owners, in turn order (but served_)
  absl::optional<int64_t> served_;      // owner served by the last Pop, still with work
  size_t queued_ = 0;
  size_t running_ = 0;
};

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_REFRESH_QUEUE_H_
