// RequestWorkers: the threads that hand session streams' requests to their Sessions, so that
// work that may block — opening a client's memory (shm_open/mmap, a CUDA IPC handle on the
// device thread), waiting for a client's ready event — never runs on a gRPC callback thread
// (a reaction must not block). FIFO; each stream posts at most one task at a time, so its
// requests stay in order. Thread-safe.
#ifndef OFFLOADD_SERVER_RPC_REQUEST_WORKERS_H_
#define OFFLOADD_SERVER_RPC_REQUEST_WORKERS_H_

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace offloadd::rpc {

class RequestWorkers {
 public:
  explicit RequestWorkers(int threads);
  // Runs every task posted so far, then joins the threads.
  ~RequestWorkers();
  // Queues `task` to run on one of the threads.
  void Post(std::function<void()> task);

 private:
  void Loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_REQUEST_WORKERS_H_
