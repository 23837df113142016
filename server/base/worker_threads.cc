#include "server/base/worker_threads.h"

#include <algorithm>
#include <utility>

namespace offloadd::base {

WorkerThreads::WorkerThreads(int threads) {
  for (int i = 0; i < std::max(threads, 1); ++i) threads_.emplace_back([this] { Loop(); });
}

WorkerThreads::~WorkerThreads() { Shutdown(); }

void WorkerThreads::Post(std::function<void()> task) {
  {
    MutexLock lock(mu_);
    if (!stopping_) {
      tasks_.push_back(std::move(task));
      cv_.NotifyOne();
      return;
    }
  }
  task();
}

void WorkerThreads::Shutdown() {
  {
    MutexLock lock(mu_);
    stopping_ = true;
    cv_.NotifyAll();
  }
  // One joiner at a time: a second Shutdown waits here until the threads are gone (two
  // joins of one thread would hang).
  MutexLock join(join_mu_);
  for (std::thread& t : threads_) {
    if (t.joinable()) t.join();
  }
}

void WorkerThreads::Loop() {
  for (;;) {
    std::function<void()> task;
    {
      MutexLock lock(mu_);
      while (tasks_.empty() && !stopping_) cv_.Wait(mu_);
      if (tasks_.empty()) return;  // stopping, and every queued task has run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

}  // namespace offloadd::base
