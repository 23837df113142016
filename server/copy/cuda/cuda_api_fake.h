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
// Opening a handle already open returns the same address and counts a reference (as CUDA
// does); the mapping goes with the last close.
//
// Not modelled: real asynchrony between streams (every operation has finished when issued;
// only EventQuery's answer is held), peer access, device memory limits. Timing events
// (CreateTimingEvent) see a device clock per stream that each copy on it advances by bytes /
// SetCopyBytesPerSecond (default 10 GB/s), so EventElapsedSeconds gives that rate exactly.
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_API_FAKE_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_API_FAKE_H_

#include <cstdint>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/base/mutex.h"
#include "server/copy/cuda/cuda_api.h"

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
  // The next call to `function` (e.g. "IpcOpenMemHandle") returns `status` instead of running;
  // with `after`, the call after `after` more calls that run.
  void FailNext(const std::string& function, absl::Status status, int after = 0);
  // While held, EventQuery answers "not ready" for every event recorded after the hold began.
  void HoldCompletions(bool hold);
  // A client IPC event (AddIpcEvent's handle) that EventQuery reports not complete until
  // set back to false: a producer kernel still running.
  void SetIpcEventPending(const std::string& handle, bool pending);
  // Blocks until `n` MemcpyAsync calls have been made in total.
  void WaitForMemcpys(int n);
  // The rate of the per-stream device clock timing events read (bytes/s, > 0).
  void SetCopyBytesPerSecond(double bytes_per_second);

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
  // MemcpyAsync calls refused because their host range spanned two HostRegister ranges.
  int split_registration_copies() const;
  int live_device_allocations() const;  // DeviceMalloc minus DeviceFree

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
  absl::StatusOr<void*> DeviceMalloc(uint64_t bytes) override;
  absl::Status DeviceFree(void* device_ptr) override;
  absl::StatusOr<void*> CreateTimingEvent() override;
  absl::StatusOr<double> EventElapsedSeconds(void* start, void* end) override;

 private:
  struct Allocation {
    int ordinal;
    std::vector<uint8_t> data;
    int opens = 0;  // CUDA counts a process's opens of one handle and returns one address
  };
  struct Object {  // a stream or event
    int ordinal;
    bool is_event;
    bool held = false;  // event recorded while completions were held
    uint64_t id = 0;    // printed in call details as "s<id>" (stream) / "e<id>" (event)
    std::string ipc_handle;  // an event opened from a client's handle
    bool timing = false;        // an event from CreateTimingEvent
    double seconds = 0;         // stream: its device clock; event: the clock at its record
  };
  absl::StatusOr<void*> NewEvent(const char* call, bool timing) REQUIRES(mu_);
  std::string Name(void* object) const REQUIRES(mu_);  // "s3", "e7" or "?"
  // Records the call; returns the injected failure for `name`, if any. Caller holds mu_.
  absl::Status Enter(const std::string& name, int object_ordinal, const std::string& detail)
      REQUIRES(mu_);
  int Current() const REQUIRES(mu_);

  std::vector<CudaDeviceInfo> devices_;
  mutable base::Mutex mu_;
  base::CondVar cv_;
  std::vector<Call> calls_ GUARDED_BY(mu_);
  struct Failure {
    absl::Status status;
    int after = 0;  // calls still to run before it
  };
  // The injected failure for a call of `name`, if its turn has come (else OK).
  absl::Status TakeFailure(const std::string& name) REQUIRES(mu_);
  std::map<std::string, Failure> fail_next_ GUARDED_BY(mu_);
  std::map<std::string, Allocation> allocations_ GUARDED_BY(mu_);  // by handle
  std::map<void*, std::string> mapped_ GUARDED_BY(mu_);            // mapped pointer -> handle
  std::set<std::string> ipc_events_ GUARDED_BY(mu_);               // handles of client events
  std::set<std::string> pending_ipc_events_ GUARDED_BY(mu_);
  std::map<void*, std::unique_ptr<Object>> objects_ GUARDED_BY(mu_);
  std::map<std::thread::id, int> current_ GUARDED_BY(mu_);  // thread -> device
  std::set<int> contexts_ GUARDED_BY(mu_);
  std::map<void*, uint64_t> host_registered_ GUARDED_BY(mu_);
  std::set<void*> device_malloced_ GUARDED_BY(mu_);  // DeviceMalloc'd, in mapped_
  double copy_bytes_per_second_ GUARDED_BY(mu_) = 10e9;
  bool hold_ GUARDED_BY(mu_) = false;
  int wrong_device_calls_ GUARDED_BY(mu_) = 0;
  int memcpys_ GUARDED_BY(mu_) = 0;
  int split_registration_copies_ GUARDED_BY(mu_) = 0;
  uint64_t next_id_ GUARDED_BY(mu_) = 1;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_API_FAKE_H_
