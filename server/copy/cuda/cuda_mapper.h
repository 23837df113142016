// MapperThread: the thread that opens and closes a GPU's client mappings for the cuda engine
// (cuda_engine.h), so that cudaIpcOpenMemHandle (120-270 µs measured elsewhere),
// cudaIpcCloseMemHandle and cudaIpcOpenEventHandle never run on the GPU's device thread, whose
// issue-ahead margin is 50 µs (cuda_device_worker.h). One per GPU the daemon serves; it makes
// the device current once (the same primary context as the device thread, so what it opens is
// usable there) and runs posted tasks in order.
//
// Threading: Post and Run may be called from any thread; tasks run one at a time on the mapper
// thread, in the order posted. Stop() runs what is queued, then joins.
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_MAPPER_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_MAPPER_H_

#include <functional>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/base/mutex.h"
#include "server/copy/cuda/cuda_api.h"

namespace offloadd::copy {

class MapperThread {
 public:
  MapperThread(CudaApi* api, int ordinal);
  ~MapperThread();  // Stop()
  MapperThread(const MapperThread&) = delete;
  MapperThread& operator=(const MapperThread&) = delete;

  // Starts the thread and makes `ordinal` current on it; SetDevice's error.
  absl::Status Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);
  // Queues `task`; false after Stop() (the task is dropped).
  bool Post(std::function<void()> task) EXCLUDES(mu_);
  // Runs `fn` on the thread and returns its status (inline when already on it).
  // FAILED_PRECONDITION after Stop().
  absl::Status Run(const std::function<absl::Status()>& fn) EXCLUDES(mu_);
  bool OnThread() const { return std::this_thread::get_id() == thread_.get_id(); }

 private:
  void Loop();

  CudaApi* const api_;
  const int ordinal_;
  std::thread thread_;
  base::Mutex mu_;
  base::CondVar cv_;
  std::vector<std::function<void()>> tasks_ GUARDED_BY(mu_);
  bool started_ GUARDED_BY(mu_) = false;
  bool stopping_ GUARDED_BY(mu_) = false;
  absl::Status start_status_ GUARDED_BY(mu_);
  bool start_done_ GUARDED_BY(mu_) = false;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_MAPPER_H_
