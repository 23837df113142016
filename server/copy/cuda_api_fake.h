// FakeCudaApi: a CPU stand-in for CudaApi (cuda_api.h) used by the cuda backend's unit tests.
//
// "Device memory" is host memory the test creates with AddAllocation(), which returns the
// 64-byte IPC handle a client would send. Copies really move bytes (memcpy at MemcpyAsync
// time), so tests check data. The fake records every call in order (name, calling thread, the
// device current on that thread) and counts affinity violations: a call on a stream, event or
// mapping of device D made from a thread whose current device is not D, or any device call
// before SetDevice on that thread. Completion can be held back (HoldCompletions) so a test can
// keep a copy "in flight"; failures are injected per function name (FailNext).
//
// Not modelled: real asynchrony between streams (every operation has finished when issued;
// only EventQuery's answer is held), peer access, device memory limits.
#ifndef OFFLOADD_SERVER_COPY_CUDA_API_FAKE_H_
#define OFFLOADD_SERVER_COPY_CUDA_API_FAKE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "server/base/mutex.h"
#include "server/copy/cuda_api.h"

namespace offloadd::copy {

class FakeCudaApi : public CudaApi {
 public:
  struct Call {
    std::string name;
    std::thread::id thread;
    int current_device = -1;  // on the calling thread; -1 = none set
    std::string detail;       // e.g. the handle's first bytes, the copy size
  };

  // `devices` get ordinals 0..n-1 in order; uuid/pci_bus_id/name taken as given.
  explicit FakeCudaApi(std::vector<CudaDeviceInfo> devices);
  ~FakeCudaApi() override;

  // A non-owning CudaApi that forwards to this fake, for handing to an engine (which owns its
  // CudaApi) while the test keeps observing the fake after the engine is gone.
  std::unique_ptr<CudaApi> Borrow();

  // Test setup. A device allocation of `size_bytes` on `ordinal` (zero-filled); returns its IPC
  // handle (64 bytes, unique per allocation, like the driver's).
  std::string AddAllocation(int ordinal, uint64_t size_bytes);
  uint8_t* allocation_data(const std::string& handle);
  // An interprocess event on `ordinal`; returns its IPC handle (64 bytes).
  std::string AddIpcEvent(int ordinal);
  // The next call to `function` (e.g. "IpcOpenMemHandle") returns `status` instead of running.
  void FailNext(const std::string& function, absl::Status status);
  // While held, EventQuery answers "not ready" for every event recorded after the hold began.
  void HoldCompletions(bool hold);
  // Blocks until `n` MemcpyAsync calls have been made in total.
  void WaitForMemcpys(int n);

  // Observation.
  std::vector<Call> calls() const;
  std::vector<std::string> call_names() const;  // names only, in order
  int count(const std::string& function) const;
  int wrong_device_calls() const;
  int open_mappings() const;     // IpcOpenMemHandle minus IpcCloseMemHandle
  int live_streams() const;
  int live_events() const;       // local + opened IPC events not destroyed
  int contexts_created() const;  // distinct devices ever made current
  std::set<std::thread::id> threads_for_device(int ordinal) const;
  uint64_t registered_host_bytes() const;

  // CudaApi.
  absl::StatusOr<std::vector<CudaDeviceInfo>> ListDevices() override;
  absl::Status SetDevice(int ordinal) override;
  absl::StatusOr<CudaMemInfo> MemGetInfo() override;
  absl::StatusOr<void*> CreateStream() override;
  void DestroyStream(void* stream) override;
  absl::StatusOr<void*> CreateEvent() override;
  void DestroyEvent(void* event) override;
  absl::StatusOr<void*> IpcOpenMemHandle(absl::string_view handle) override;
  absl::Status IpcCloseMemHandle(void* device_ptr) override;
  absl::StatusOr<uint64_t> AllocationSize(void* device_ptr) override;
  absl::StatusOr<void*> IpcOpenEventHandle(absl::string_view handle) override;
  absl::Status StreamWaitEvent(void* stream, void* event) override;
  absl::Status MemcpyAsync(void* dst, const void* src, uint64_t bytes, Direction direction,
                           void* stream) override;
  absl::Status EventRecord(void* event, void* stream) override;
  absl::StatusOr<bool> EventQuery(void* event) override;
  absl::Status HostRegister(void* host, uint64_t bytes) override;
  absl::Status HostUnregister(void* host) override;

 private:
  struct Allocation {
    int ordinal;
    std::vector<uint8_t> data;
    bool mapped = false;
  };
  struct Object {  // a stream or event
    int ordinal;
    bool is_event;
    bool held = false;  // event recorded while completions were held
    uint64_t id = 0;    // printed in call details as "s<id>" (stream) / "e<id>" (event)
  };
  std::string Name(void* object) const REQUIRES(mu_);  // "s3", "e7" or "?"
  // Records the call; returns the injected failure for `name`, if any. Caller holds mu_.
  absl::Status Enter(const std::string& name, int object_ordinal, const std::string& detail)
      REQUIRES(mu_);
  int Current() const REQUIRES(mu_);

  std::vector<CudaDeviceInfo> devices_;
  mutable base::Mutex mu_;
  base::CondVar cv_;
  std::vector<Call> calls_ GUARDED_BY(mu_);
  std::map<std::string, absl::Status> fail_next_ GUARDED_BY(mu_);
  std::map<std::string, Allocation> allocations_ GUARDED_BY(mu_);  // by handle
  std::map<void*, std::string> mapped_ GUARDED_BY(mu_);            // mapped pointer -> handle
  std::set<std::string> ipc_events_ GUARDED_BY(mu_);               // handles of client events
  std::map<void*, std::unique_ptr<Object>> objects_ GUARDED_BY(mu_);
  std::map<std::thread::id, int> current_ GUARDED_BY(mu_);  // thread -> device
  std::set<int> contexts_ GUARDED_BY(mu_);
  std::map<void*, uint64_t> host_registered_ GUARDED_BY(mu_);
  bool hold_ GUARDED_BY(mu_) = false;
  int wrong_device_calls_ GUARDED_BY(mu_) = 0;
  int memcpys_ GUARDED_BY(mu_) = 0;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_API_FAKE_H_
