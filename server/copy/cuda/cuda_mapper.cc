#include "server/copy/cuda/cuda_mapper.h"

#include <future>

#include "absl/strings/str_format.h"

namespace offloadd::copy {

MapperThread::MapperThread(CudaApi* api, int ordinal) : api_(api), ordinal_(ordinal) {}

MapperThread::~MapperThread() { Stop(); }

absl::Status MapperThread::Start() {
  {
    base::MutexLock lock(mu_);
    started_ = true;
  }
  thread_ = std::thread(&MapperThread::Loop, this);
  base::MutexLock lock(mu_);
  while (!start_done_) cv_.Wait(mu_);
  return start_status_;
}

void MapperThread::Stop() {
  {
    base::MutexLock lock(mu_);
    if (!started_ || stopping_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void MapperThread::Loop() {
  absl::Status st = api_->SetDevice(ordinal_);
  std::vector<std::function<void()>> tasks;
  base::MutexLock lock(mu_);
  start_status_ = st;
  start_done_ = true;
  cv_.notify_all();
  if (!st.ok()) {
    stopping_ = true;
    return;
  }
  while (true) {
    while (tasks_.empty() && !stopping_) cv_.Wait(mu_);
    if (tasks_.empty()) break;  // stopping, nothing left
    tasks.swap(tasks_);
    lock.Unlock();
    for (auto& t : tasks) t();
    tasks.clear();
    lock.Lock();
  }
}

bool MapperThread::Post(std::function<void()> task) {
  {
    base::MutexLock lock(mu_);
    if (!started_ || stopping_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
  return true;
}

absl::Status MapperThread::Run(const std::function<absl::Status()>& fn) {
  if (OnThread()) return fn();
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = done->get_future();
  if (!Post([&fn, done] { done->set_value(fn()); })) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the daemon's mapper thread for GPU ordinal %d has stopped", ordinal_));
  }
  return f.get();
}

}  // namespace offloadd::copy
