// For tests: collects a Session's completions (its Emit) and waits for the one answering a
// request. Thread-safe; Wait gives up after 10 seconds with a test failure and a Completion
// whose status is DEADLINE_EXCEEDED (so callers that only check the status, e.g. in a forked
// child where gtest failures are not seen, also notice).
#ifndef OFFLOADD_SERVER_SESSION_COMPLETION_COLLECTOR_H_
#define OFFLOADD_SERVER_SESSION_COMPLETION_COLLECTOR_H_

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <utility>
#include <vector>

#include "gtest/gtest.h"
#include "server/session/session.h"

namespace offloadd::session {

class CompletionCollector {
 public:
  Session::Emit emit() {
    return [this](Completion c) {
      std::lock_guard<std::mutex> lock(mu_);
      got_.push_back(std::move(c));
      cv_.notify_all();
    };
  }
  // Waits for the completion of `request_id`.
  Completion Wait(uint64_t request_id) {
    std::unique_lock<std::mutex> lock(mu_);
    Completion out;
    out.status = absl::DeadlineExceededError("no completion for this request within 10 s");
    bool found = cv_.wait_for(lock, std::chrono::seconds(10), [&] {
      for (auto& c : got_) {
        if (c.request_id == request_id) {
          out = c;
          return true;
        }
      }
      return false;
    });
    EXPECT_TRUE(found) << "no completion for request " << request_id;
    return out;
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Completion> got_;
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_COMPLETION_COLLECTOR_H_
