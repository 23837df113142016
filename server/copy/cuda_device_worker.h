// DeviceWorker: the one thread that owns a GPU for the cuda backend (cuda_engine.h).
//
// Start() spawns the thread, which makes the device current (creating the daemon's context on
// it), records cudaMemGetInfo, and creates `streams_per_direction` D2H and H2D streams. From then
// on every CUDA call for the device runs on this thread: callers hand it closures (Run) or copy
// operations (IssueAndWait). Copy completions are tracked with events the thread polls: while any
// is outstanding it spins (yielding) for up to ~200 µs, then sleeps 20 µs between polls — a chunk
// of 8 MiB takes ~150 µs at 55 GB/s, so a sleeping poller would cost a large share of the link.
// Stop() (and the destructor) lets queued work and outstanding copies finish, destroys the
// streams and events, and joins.
#ifndef OFFLOADD_SERVER_COPY_CUDA_DEVICE_WORKER_H_
#define OFFLOADD_SERVER_COPY_CUDA_DEVICE_WORKER_H_

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <future>
#include <mutex>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "server/copy/cuda_api.h"

namespace offloadd::copy {

class DeviceWorker {
 public:
  DeviceWorker(CudaApi* api, CudaDeviceInfo device, uint32_t streams_per_direction);
  ~DeviceWorker();  // Stop()
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // Starts the thread and waits for its set-up; the set-up's error (the thread has then exited).
  absl::Status Start();
  void Stop();

  // Runs `fn` on the device thread and returns its result. Runs it inline when called on the
  // device thread itself. FAILED_PRECONDITION after Stop().
  absl::Status Run(const std::function<absl::Status()>& fn);

  // On the device thread: `issue(stream)` on the next stream of `direction` (round robin), then a
  // completion event recorded after it; returns once that event has completed (or the first
  // error). Must not be called on the device thread.
  absl::Status IssueAndWait(Direction direction, const std::function<absl::Status(void*)>& issue);
  // The same without waiting: `done` runs once on the device thread when the event completes,
  // or with the first error (issue 16's asynchronous engine). false (and `done` not called)
  // after Stop().
  bool IssueAsync(Direction direction, std::function<absl::Status(void*)> issue,
                  std::function<void(absl::Status)> done);

  // The device thread's streams of one direction (valid after Start(); use them on the thread).
  const std::vector<void*>& streams(Direction direction) const {
    return direction == Direction::kDeviceToHost ? d2h_ : h2d_;
  }
  const CudaDeviceInfo& device() const { return device_; }
  CudaMemInfo mem_after_context() const { return mem_after_context_; }
  bool OnThread() const { return std::this_thread::get_id() == thread_id_.load(); }

 private:
  struct Pending {
    void* event;
    std::function<void(absl::Status)> done;
  };
  void Loop(std::promise<absl::Status>* started);
  absl::Status SetUp();
  void TearDown();
  void Poll();  // device thread: completes finished pendings
  bool Post(std::function<void()> task);

  CudaApi* const api_;
  const CudaDeviceInfo device_;
  const uint32_t streams_per_direction_;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};

  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::function<void()>> tasks_;
  bool stopping_ = false;
  bool running_ = false;

  // Device-thread only.
  std::vector<void*> d2h_, h2d_;
  size_t next_d2h_ = 0, next_h2d_ = 0;
  std::vector<void*> free_events_;
  std::vector<Pending> pending_;
  CudaMemInfo mem_after_context_;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_DEVICE_WORKER_H_
