// WorkerThreads: a fixed set of threads that run posted tasks, oldest first.
//
// Used where work must leave the thread that has it: the RPC layer's request workers (a gRPC
// reaction must not block, so requests that may block run here) and the spill tier's checksum
// threads (the disk's I/O workers hand them each chunk's CRC32C and go on to the next chunk).
//
// Thread-safe. A task runs on one thread; tasks posted by one thread start in the order posted
// (with more than one thread, a later task may finish before an earlier one).
#ifndef OFFLOADD_SERVER_BASE_WORKER_THREADS_H_
#define OFFLOADD_SERVER_BASE_WORKER_THREADS_H_

#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "common/base/mutex.h"

namespace offloadd::base {

class WorkerThreads {
 public:
  // `threads` >= 1 (0 or less is taken as 1).
  explicit WorkerThreads(int threads);
  ~WorkerThreads();  // Shutdown()
  WorkerThreads(const WorkerThreads&) = delete;
  WorkerThreads& operator=(const WorkerThreads&) = delete;

  // Queues `task`; once Shutdown has begun, runs it on the calling thread instead.
  void Post(std::function<void()> task) EXCLUDES(mu_);
  // Runs every task already queued, then joins the threads; returns when they are gone, also
  // when another thread's Shutdown is joining them. Idempotent; not from a task.
  void Shutdown() EXCLUDES(mu_);

 private:
  void Loop() EXCLUDES(mu_);

  Mutex mu_;
  CondVar cv_;
  std::deque<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool stopping_ GUARDED_BY(mu_) = false;
  Mutex join_mu_;  // held while joining (not mu_: the threads take mu_ until they leave)
  std::vector<std::thread> threads_ GUARDED_BY(join_mu_);
};

}  // namespace offloadd::base

#endif  // OFFLOADD_SERVER_BASE_WORKER_THREADS_H_
