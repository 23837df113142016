// A simulated client GPU for the C++ client library: the twin of client/python/offloadd/sim_gpu.py.
// SimClientGpu is a small CUDA runtime over a SimGpuTable this process creates
// (common/sim_gpu_table.h: device memory, segments with generations, interprocess event
// slots, violation counters), and NewSimClientCudaApi gives the ClientCudaApi (cuda_export.h)
// that CudaExporter uses on it. A daemon on `--backend=cuda-sim` opens the table's handles,
// moves the bytes of its copies when its timing model says they complete and records done
// events there (SimCudaApi, server/copy/cuda/cuda_api_sim.h), so the C++ exporter and Client run
// the whole CUDA data path with real bytes on machines without a GPU (docs/ARCHITECTURE.md, "The
// simulated client GPU"). Every time it reports is SIMULATED: kernels take the time they are
// told to, copies the time the daemon's model gives.
//
// What is modelled, and how it maps to CUDA:
//
// * Device pointers are host addresses inside the table's mapping of device memory, so a test
//   reads and writes them directly (HostBytes) and the daemon's copies are checked byte for byte.
// * Malloc/Free are cudaMalloc/cudaFree of one segment each (a slot of the table: live with a
//   new generation and buffer id before the pointer is returned; freed before its memory is
//   reused), first fit in 2 MiB granules per device. `vmm` = memory from cuMemCreate (PyTorch's
//   expandable segments): Describe reports it as not legacy-IPC capable and IpcGetMemHandle
//   fails on it. Freeing a segment the daemon has mapped counts kFreedWhileMapped.
// * Streams are timelines in CLOCK_MONOTONIC nanoseconds (SimNowNanoseconds): LaunchKernel
//   queues modelled work after the stream's tail; LaunchWrite is a kernel whose output bytes land
//   in device memory at its modelled end (so a copy that starts before its producer ended reads
//   the old bytes). EventRecord writes complete_at_ns (when the stream's work so far ends), then
//   increments seq, as the Python side does; behind a pending wait or a write not landed yet it
//   writes kSimPending and a resolver thread writes the time once both are known.
//   StreamWaitEvent orders the stream after the event's last record: after a daemon-recorded
//   pending event, until the daemon writes its completion time; a never-recorded event orders
//   nothing, as in CUDA. Work queued behind a pending wait starts when the wait resolves.
//   StreamSynchronize blocks the host until the stream's work is done.
// * Events are interprocess events (cudaEventInterprocess | cudaEventDisableTiming), one table
//   slot each; their IPC handle is the table's event handle.
// * Errors follow cudart: a failed runtime call returns its cudaError_t value (SimCudaError) and
//   sets the calling thread's last error until GetLastError() reads and clears it
//   (PeekAtLastError() reads it only: what PyTorch's next launch check would see). Describe is a
//   driver call (cuPointerGetAttribute) and never touches the runtime's last error.
//   NewSimClientCudaApi's methods clear it after every failure, as the real ClientCudaApi's Err()
//   does. InjectFailure makes the next call of one runtime function fail (error paths in tests).
// * Checks of the event protocol, counted in the table (violations()): after NoteReloadSent(done
//   event, destination), a StreamWaitEvent on that event before the daemon recorded it counts
//   kWaitUnrecorded (and orders nothing, as in CUDA: the client must wait only after the
//   ReloadDone answer, proto/offload.proto), and ReadOnStream of the destination before the
//   done event completed counts kConsumedEarly.
//
// Thread-safety: every method is safe to call from any thread (one mutex per SimClientGpu; host
// waits sleep outside it). The current device is per host thread (SetDevice), default 0.
#ifndef OFFLOADD_CLIENT_SIM_CLIENT_CUDA_API_H_
#define OFFLOADD_CLIENT_SIM_CLIENT_CUDA_API_H_

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cuda_export.h"
#include "common/base/mutex.h"
#include "common/sim_gpu_table.h"

namespace offloadd::client {

// cudaError_t values the simulated runtime returns (the same numbers as CUDA's).
enum SimCudaError : int {
  kSimCudaSuccess = 0,
  kSimCudaErrorInvalidValue = 1,
  kSimCudaErrorMemoryAllocation = 2,
  kSimCudaErrorInvalidDevice = 101,
  kSimCudaErrorInvalidResourceHandle = 400,
  kSimCudaErrorNotReady = 600,  // EventQuery only; never sets the last error (as in CUDA)
  kSimCudaErrorLaunchTimeout = 702,  // LaunchWrite behind a wait that never resolved
};
// "cudaErrorInvalidValue", ...; "cudaErrorUnknown" for other values.
const char* SimCudaErrorName(int error);

struct SimClientGpuOptions {
  uint32_t devices = 1;
  uint64_t device_bytes = 256ull << 20;  // per device; rounded up to 2 MiB
  uint32_t event_slots = 1024, segment_slots = 1024;
  // The number the table is named by ("/ofd-simgpu-<pid>") and that its handles carry; 0:
  // getpid(). A daemon accepts a table's handles only from a session of that pid (and of the
  // table's owner uid), so a number of one's own serves only tests without a daemon (Bazel
  // runs tests in PID namespaces sharing /dev/shm; tests with a daemon run unsandboxed).
  uint32_t pid = 0;
};

class SimClientGpu {
 public:
  // Creates the table (mode 0600; removed by the destructor). Errors: ALREADY_EXISTS when a table
  // of that pid exists (another SimClientGpu, or one left by a killed process: remove
  // /dev/shm/ofd-simgpu-<pid>); INVALID_ARGUMENT for 0 devices, bytes or slots;
  // RESOURCE_EXHAUSTED when /dev/shm has no room.
  static absl::StatusOr<std::shared_ptr<SimClientGpu>> Create(const SimClientGpuOptions& options);
  ~SimClientGpu();  // joins the resolver thread; segments still live go with the table
  SimClientGpu(const SimClientGpu&) = delete;
  SimClientGpu& operator=(const SimClientGpu&) = delete;

  // ---- the runtime (cudart): SimCudaError values; failures set the thread's last error ----
  int SetDevice(int device);
  int GetDevice(int* device);
  int GetLastError();    // returns and clears
  int PeekAtLastError();
  // cudaMalloc on the current device (`vmm`: cuMemCreate memory, no legacy IPC handle).
  int Malloc(uint64_t* ptr, uint64_t bytes, bool vmm = false);
  int Free(uint64_t ptr);  // ptr must be a segment base
  int StreamCreate(void** stream);  // on the current device; nullptr = its default stream
  int EventCreateIpc(void** event);
  int EventDestroy(void* event);
  int EventRecord(void* event, void* stream);
  int EventQuery(void* event);  // success, kSimCudaErrorNotReady, or a handle error
  int StreamWaitEvent(void* stream, void* event);
  int IpcGetMemHandle(uint64_t base, std::string* handle);  // 64 bytes
  int IpcGetEventHandle(void* event, std::string* handle);  // 64 bytes
  int DeviceUuid(int device, std::string* uuid);  // cudaGetDeviceProperties(...).uuid
  // cuPointerGetAttribute (driver: no last error). False when `ptr` is not in a live segment.
  bool PointerGetInfo(uint64_t ptr, PointerInfo* info);

  // ---- the modelled GPU ----
  // A kernel of `seconds` after the stream's work.
  int LaunchKernel(void* stream, double seconds);
  // A kernel of `seconds` whose output `bytes` land at [ptr, ptr + bytes.size()) at its end
  // (nothing lands if the segment was freed meanwhile). Waits on the host first while the
  // stream waits on a pending daemon event (the modelled GPU does not queue behind one).
  int LaunchWrite(void* stream, double seconds, uint64_t ptr, std::string bytes);
  // Blocks until the stream's work is done (writes landed, waits resolved). DEADLINE_EXCEEDED
  // after `timeout_seconds` (an event it waits on never completed).
  absl::Status StreamSynchronize(void* stream, double timeout_seconds = 30);
  // A kernel on `stream` reading [ptr, ptr + bytes) into `out`, run on the host now: synchronizes
  // the stream, then checks the NoteReloadSent ranges (kConsumedEarly) and copies.
  // INVALID_ARGUMENT when the range is not in one live segment.
  absl::Status ReadOnStream(void* stream, uint64_t ptr, uint64_t bytes, std::string* out);
  // Host address of device pointer `ptr` (its bytes, for tests to fill and compare).
  uint8_t* HostBytes(uint64_t ptr) const { return reinterpret_cast<uint8_t*>(ptr); }
  // When the stream's known work ends (ns, CLOCK_MONOTONIC); work behind a pending wait is not in it.
  int64_t StreamTailNanoseconds(void* stream) EXCLUDES(mu_);
  // The event's complete_at_ns and seq in the table (kSimNever / kSimPending as there).
  int64_t EventCompleteAtNanoseconds(void* event) EXCLUDES(mu_);
  uint64_t EventSeq(void* event) EXCLUDES(mu_);
  // How many mappings the daemon holds of the segment at `base` (0 for unknown pointers).
  uint32_t DaemonMaps(uint64_t base) EXCLUDES(mu_);

  // ---- checks and test hooks ----
  // `done_event`'s handle was sent as a reload's done event into [dst, dst + bytes): see
  // "Checks of the event protocol" above. The note ends once the daemon's record completed.
  void NoteReloadSent(void* done_event, uint64_t dst, uint64_t bytes) EXCLUDES(mu_);
  // The next call of runtime function `function` ("cudaIpcGetMemHandle", "cudaEventRecord", ...,
  // the CUDA names) fails with `error`, as a driver fault would.
  void InjectFailure(const std::string& function, int error) EXCLUDES(mu_);
  uint64_t violations(common::SimViolation v) const { return table_->violations(v); }
  const common::SimGpuTable& table() const { return *table_; }
  uint32_t pid() const { return pid_; }
  uint32_t devices() const { return devices_; }

 private:
  struct Segment {
    uint32_t slot = 0, device = 0;
    uint64_t offset = 0, size = 0, buffer_id = 0, generation = 0;
    bool vmm = false;
  };
  struct Wait {  // a StreamWaitEvent on an event pending when waited on
    uint32_t slot = 0;
    uint64_t seq = 0;
  };
  struct Stream {
    int device = 0;
    int64_t tail_ns = 0;           // known work ends here
    std::vector<Wait> waits;       // pending daemon events the stream waits on
    int64_t after_waits_ns = 0;    // kernel time queued behind those waits
    uint64_t last_write = 0;       // id of its last LaunchWrite (landed or not)
  };
  struct Event {
    uint32_t slot = 0;
    int device = 0;
  };
  struct PendingWrite {
    uint64_t ptr = 0;
    std::string bytes;
    int64_t end_ns = 0;
    uint64_t buffer_id = 0;  // of its segment: nothing lands once that was freed
  };
  struct DeferredRecord {  // a record behind pending waits or a write not landed yet
    uint32_t slot = 0;
    uint64_t seq = 0;  // the record's own; dropped when the event was recorded again
    std::vector<Wait> waits;
    uint64_t write = 0;
    int64_t tail_ns = 0, after_waits_ns = 0;
  };
  struct ReloadNote {
    uint32_t slot = 0;
    uint64_t seq_at_send = 0, dst = 0, bytes = 0;
  };

  SimClientGpu() = default;
  // Fails with `error`, setting the thread's last error, or returns a pending injected failure.
  int FailLocked(int error) REQUIRES(mu_);
  int InjectedLocked(const char* function) REQUIRES(mu_);
  int CurrentLocked() const REQUIRES(mu_);
  uint8_t* DeviceBase(uint32_t device) const;
  const Segment* FindLocked(uint64_t ptr) const REQUIRES(mu_);
  Stream* StreamLocked(void* stream) REQUIRES(mu_);
  Event* EventLocked(void* event) REQUIRES(mu_);
  // The completion time a wait resolved to, or kSimPending while the daemon has not written it.
  int64_t WaitResolvedLocked(const Wait& w) const REQUIRES(mu_);
  // Folds resolved waits into the tail; true when none is pending.
  bool ResolveLocked(Stream& s) REQUIRES(mu_);
  // Lands writes whose end passed and completes deferred records that can be; returns the
  // earliest end of a write still pending (INT64_MAX: none) and whether records still wait.
  int64_t ProgressLocked(bool* records_pending) REQUIRES(mu_);
  void RecordEventLocked(uint32_t slot, int64_t complete_at_ns) REQUIRES(mu_);
  void StartResolverLocked() REQUIRES(mu_);
  void ResolverLoop() EXCLUDES(mu_);

  std::shared_ptr<common::SimGpuTable> table_;
  uint32_t pid_ = 0, devices_ = 0;
  uint64_t device_bytes_ = 0;

  mutable base::Mutex mu_;
  base::CondVar cv_;  // a write or a deferred record was added, or closing_
  std::map<std::thread::id, int> current_ GUARDED_BY(mu_);     // device per host thread
  std::map<std::thread::id, int> last_error_ GUARDED_BY(mu_);  // cudaGetLastError's, per thread
  std::map<std::string, int> injected_ GUARDED_BY(mu_);
  std::vector<std::map<uint64_t, uint64_t>> free_ranges_ GUARDED_BY(mu_);  // per device
  std::map<uint64_t, Segment> segments_ GUARDED_BY(mu_);  // by base pointer
  std::deque<uint32_t> free_segment_slots_ GUARDED_BY(mu_);  // freed ones are reused last
  std::vector<uint64_t> generations_ GUARDED_BY(mu_);
  uint64_t next_buffer_id_ GUARDED_BY(mu_) = 1;
  std::vector<std::unique_ptr<Stream>> streams_ GUARDED_BY(mu_);  // [0, devices): defaults
  std::vector<std::unique_ptr<Event>> events_ GUARDED_BY(mu_);    // live and destroyed
  std::vector<uint32_t> free_event_slots_ GUARDED_BY(mu_);
  uint32_t next_event_slot_ GUARDED_BY(mu_) = 0;
  std::map<uint64_t, PendingWrite> writes_ GUARDED_BY(mu_);  // not landed yet, by id
  uint64_t next_write_ GUARDED_BY(mu_) = 1;
  std::vector<DeferredRecord> deferred_ GUARDED_BY(mu_);
  std::vector<ReloadNote> notes_ GUARDED_BY(mu_);
  bool closing_ GUARDED_BY(mu_) = false;
  std::thread resolver_;  // started with the first write or deferred record
};

// The ClientCudaApi of `gpu` (kept alive by it): each method makes the runtime calls the real
// one makes and, after a failure, clears the thread's last error as the real Err() does.
// Errors: FAILED_PRECONDITION "<function>: <cudaError name> (<value>)" for runtime failures;
// Describe: INVALID_ARGUMENT for a pointer outside every live segment.
std::unique_ptr<ClientCudaApi> NewSimClientCudaApi(std::shared_ptr<SimClientGpu> gpu);

// The UUID a cuda-sim daemon gives its simulated device `ordinal` (SimCudaApi::DeviceUuid).
std::string SimDeviceUuid(int ordinal);

}  // namespace offloadd::client

#endif  // OFFLOADD_CLIENT_SIM_CLIENT_CUDA_API_H_
