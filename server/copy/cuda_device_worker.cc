#include "server/copy/cuda_device_worker.h"

#include <chrono>

#include "absl/strings/str_format.h"

namespace offloadd::copy {
namespace {

constexpr auto kSpinFor = std::chrono::microseconds(200);
constexpr auto kSleepStep = std::chrono::microseconds(20);

}  // namespace

DeviceWorker::DeviceWorker(CudaApi* api, CudaDeviceInfo device, uint32_t streams_per_direction)
    : api_(api),
      device_(std::move(device)),
      streams_per_direction_(streams_per_direction == 0 ? 1 : streams_per_direction) {}

DeviceWorker::~DeviceWorker() { Stop(); }

absl::Status DeviceWorker::Start() {
  std::promise<absl::Status> started;
  std::future<absl::Status> f = started.get_future();
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_ = true;
  }
  thread_ = std::thread(&DeviceWorker::Loop, this, &started);
  absl::Status st = f.get();
  if (!st.ok()) {
    thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    running_ = false;
  }
  return st;
}

void DeviceWorker::Stop() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  running_ = false;
}

absl::Status DeviceWorker::SetUp() {
  absl::Status st = api_->SetDevice(device_.ordinal);
  if (!st.ok()) return st;
  auto mem = api_->MemGetInfo();
  if (mem.ok()) mem_after_context_ = *mem;
  for (uint32_t i = 0; i < streams_per_direction_; ++i) {
    for (auto* v : {&d2h_, &h2d_}) {
      auto s = api_->CreateStream();
      if (!s.ok()) return s.status();
      v->push_back(*s);
    }
  }
  return absl::OkStatus();
}

void DeviceWorker::TearDown() {
  for (void* s : d2h_) api_->DestroyStream(s);
  for (void* s : h2d_) api_->DestroyStream(s);
  for (void* e : free_events_) api_->DestroyEvent(e);
  d2h_.clear();
  h2d_.clear();
  free_events_.clear();
}

void DeviceWorker::Loop(std::promise<absl::Status>* started) {
  thread_id_.store(std::this_thread::get_id());
  absl::Status st = SetUp();
  if (!st.ok()) {
    TearDown();
    thread_id_.store(std::thread::id());
    started->set_value(absl::FailedPreconditionError(absl::StrFormat(
        "%s (%s, ordinal %d): setting up the daemon's context and streams failed: %s",
        device_.uuid, device_.pci_bus_id, device_.ordinal, st.message())));
    return;
  }
  started->set_value(absl::OkStatus());
  auto idle_since = std::chrono::steady_clock::now();
  std::unique_lock<std::mutex> lock(mu_);
  while (true) {
    if (!tasks_.empty()) {
      std::vector<std::function<void()>> tasks;
      tasks.swap(tasks_);
      lock.unlock();
      for (auto& t : tasks) t();
      Poll();
      idle_since = std::chrono::steady_clock::now();
      lock.lock();
      continue;
    }
    if (!pending_.empty()) {
      lock.unlock();
      size_t before = pending_.size();
      Poll();
      auto now = std::chrono::steady_clock::now();
      if (pending_.size() != before) idle_since = now;
      if (now - idle_since < kSpinFor) {
        std::this_thread::yield();
        lock.lock();
      } else {
        lock.lock();
        cv_.wait_for(lock, kSleepStep);
      }
      continue;
    }
    if (stopping_) break;
    cv_.wait(lock);
    idle_since = std::chrono::steady_clock::now();
  }
  lock.unlock();
  TearDown();
}

void DeviceWorker::Poll() {
  for (size_t i = 0; i < pending_.size();) {
    auto q = api_->EventQuery(pending_[i].event);
    if (q.ok() && !*q) {
      ++i;
      continue;
    }
    std::function<void(absl::Status)> done = std::move(pending_[i].done);
    free_events_.push_back(pending_[i].event);
    pending_.erase(pending_.begin() + i);
    done(q.ok() ? absl::OkStatus() : q.status());
  }
}

bool DeviceWorker::Post(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!running_ || stopping_) return false;
    tasks_.push_back(std::move(task));
  }
  cv_.notify_all();
  return true;
}

absl::Status DeviceWorker::Run(const std::function<absl::Status()>& fn) {
  if (OnThread()) return fn();
  std::promise<absl::Status> done;
  std::future<absl::Status> f = done.get_future();
  if (!Post([&] { done.set_value(fn()); })) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the daemon's worker for %s has stopped", device_.uuid));
  }
  return f.get();
}

absl::Status DeviceWorker::IssueAndWait(Direction direction,
                                        const std::function<absl::Status(void*)>& issue) {
  if (OnThread()) {
    return absl::InternalError("IssueAndWait called on the device thread (would deadlock)");
  }
  std::promise<absl::Status> done;
  std::future<absl::Status> f = done.get_future();
  // `issue` outlives the call: this frame waits for `done`.
  if (!IssueAsync(
          direction, [&issue](void* stream) { return issue(stream); },
          [&done](absl::Status st) { done.set_value(std::move(st)); })) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the daemon's worker for %s has stopped", device_.uuid));
  }
  return f.get();
}

bool DeviceWorker::IssueAsync(Direction direction, std::function<absl::Status(void*)> issue,
                              std::function<void(absl::Status)> done) {
  return Post([this, direction, issue = std::move(issue), done = std::move(done)]() mutable {
    std::vector<void*>& streams = direction == Direction::kDeviceToHost ? d2h_ : h2d_;
    size_t& next = direction == Direction::kDeviceToHost ? next_d2h_ : next_h2d_;
    void* stream = streams[next++ % streams.size()];
    absl::Status st = issue(stream);
    if (!st.ok()) return done(st);
    void* event = nullptr;
    if (!free_events_.empty()) {
      event = free_events_.back();
      free_events_.pop_back();
    } else {
      auto e = api_->CreateEvent();
      if (!e.ok()) return done(e.status());
      event = *e;
    }
    st = api_->EventRecord(event, stream);
    if (!st.ok()) {
      free_events_.push_back(event);
      return done(st);
    }
    pending_.push_back(Pending{event, std::move(done)});
  });
}

}  // namespace offloadd::copy
