// RequestWorkers: the threads that hand session streams' requests to their Sessions, so that
// work that may block — opening a client's memory (shm_open/mmap, a CUDA IPC handle on the
// device thread), waiting for a client's ready event — never runs on a gRPC callback thread
// (a reaction must not block). FIFO; each stream posts at most one task at a time, so its
// requests stay in order. Thread-safe.
#ifndef OFFLOADD_SERVER_RPC_REQUEST_WORKERS_H_
#define OFFLOADD_SERVER_RPC_REQUEST_WORKERS_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "server/base/mutex.h"

namespace offloadd::rpc {

class RequestWorkers {
 public:
  explicit RequestWorkers(int threads);
  // Runs every task posted so far, then joins the threads.
  ~RequestWorkers() EXCLUDES(mu_);
  // Queues `task` to run on one of the threads.
  void Post(std::function<void()> task) EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  base::Mutex mu_;
  base::CondVar cv_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  std::vector<std::thread> threads_;
};

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_REQUEST_WORKERS_H_
