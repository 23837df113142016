// CopyEngine: moves bytes between client memory (a registered region) and the host pool.
//
// Two backends implement it (docs/ARCHITECTURE.md, "Copy backends"):
//  - shm  (shm_engine.h): the client's "device memory" is a POSIX shared-memory object; a chunk
//         copy is a memcpy on the calling worker thread.
//  - cuda (cuda_engine.h): the region is a CUDA IPC memory handle of an allocation base; chunk
//         copies are cudaMemcpyAsync on per-GPU D2H/H2D streams.
// Pacing, chunking and ordering between clients are the scheduler's job (sched/), not the
// engine's: CopyChunk moves exactly the bytes it is given.
#ifndef OFFLOADD_SERVER_COPY_COPY_ENGINE_H_
#define OFFLOADD_SERVER_COPY_COPY_ENGINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace offloadd::copy {

enum class Direction { kDeviceToHost = 0, kHostToDevice = 1 };
inline const char* DirectionName(Direction d) {
  return d == Direction::kDeviceToHost ? "d2h" : "h2d";
}

// How soon a posted chunk is needed (issue 16). An engine that queues chunks before its copy
// hardware serves urgent ones first (a reload a backward pass is blocked on); the others in the
// order they were posted.
enum class ChunkUrgency { kNormal = 0, kUrgent = 1 };

// What a client registers: exactly one of shm_name / cuda_ipc_handle is set.
struct RegionSpec {
  std::string shm_name;         // POSIX shm object name, starts with '/'
  std::string cuda_ipc_handle;  // 64 bytes of cudaIpcMemHandle_t (allocation base)
  uint64_t size_bytes = 0;      // size of the object / allocation
  std::string device_id;        // GPU UUID (cuda) or the session's device name (shm)
};

// Client memory opened by the daemon. Closed (unmapped / IPC handle released) when the last
// reference goes; copies in flight hold a reference.
class Region {
 public:
  virtual ~Region() = default;
  virtual uint64_t size_bytes() const = 0;
};

// Client memory handles of one GPU held by an engine.
struct HandleCounts {
  uint64_t opens_total = 0;  // opened since start (a handle shared by registrations counts once)
  uint64_t open = 0;         // open now
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // "shm" or "cuda".
  virtual std::string name() const = 0;

  // Opens a client region. Errors: INVALID_ARGUMENT when the spec names the other backend's
  // handle kind or is malformed; NOT_FOUND when the shm object does not exist; OUT_OF_RANGE when
  // size_bytes exceeds the object's real size; FAILED_PRECONDITION for CUDA handle failures.
  virtual absl::StatusOr<std::shared_ptr<Region>> OpenRegion(const RegionSpec& spec) = 0;

  // Copies `bytes` between region[region_offset, +bytes) and host[0, bytes), blocking until the
  // bytes have landed. Called concurrently from several worker threads. The caller has checked
  // bounds against region.size_bytes().
  virtual absl::Status CopyChunk(Direction direction, Region& region, uint64_t region_offset,
                                 uint8_t* host, uint64_t bytes) = 0;

  // The asynchronous form of CopyChunk (issue 16): queues the same copy and returns; `done` runs
  // exactly once, with CopyChunk's status, when the bytes have landed or the copy failed. It may
  // run inline (an error found before the copy is queued, or an engine without asynchronous
  // copies: the default here runs CopyChunk and then `done`) or on an engine thread, which must
  // not block in it: it may post further chunks (PostChunk) and otherwise only hand the
  // completion on. The caller keeps `region` and host[0, bytes) alive until `done` has run.
  // `urgency`: kUrgent chunks go ahead of every queued chunk that is not (never ahead of a copy
  // already issued to the hardware).
  virtual void PostChunk(Direction direction, Region& region, uint64_t region_offset, uint8_t* host,
                         uint64_t bytes, ChunkUrgency urgency,
                         std::function<void(absl::Status)> done) {
    (void)urgency;
    done(CopyChunk(direction, region, region_offset, host, bytes));
  }
  // Whether PostChunk returns before the copy completes (so a caller gains from keeping several
  // chunks posted). false for shm and for the cuda engine with asynchronous = false.
  virtual bool asynchronous() const { return false; }

  // Before the first chunk of an offload: wait until the client's data is ready (CUDA: the
  // client's IPC event). No-op for shm.
  virtual absl::Status WaitReady(Region& region, const std::string& ready_event) {
    (void)region;
    (void)ready_event;
    return absl::OkStatus();
  }

  // After the last chunk of a reload has been copied: record the client's IPC event `done_event`
  // (cudaIpcEventHandle_t bytes, 64) on the engine's H2D stream so the client's compute stream can
  // wait on it (cudaStreamWaitEvent) without a host round trip. The event is recorded when this
  // returns OK, so the session may then tell the client. Empty `done_event`: no-op. No-op for shm.
  virtual absl::Status SignalDone(Region& region, const std::string& done_event) {
    (void)region;
    (void)done_event;
    return absl::OkStatus();
  }

  // Once at start-up, after the pool's arena is mapped: make host[base, +size_bytes) usable for
  // asynchronous DMA (CUDA: cudaHostRegister(Portable) in chunks, in the background; copies work
  // meanwhile, slower). Must be undone before the arena is unmapped: the engine's destructor
  // does it, so the engine must be destroyed before the arena. No-op for shm.
  virtual absl::Status PrepareHostPool(uint8_t* base, uint64_t size_bytes) {
    (void)base;
    (void)size_bytes;
    return absl::OkStatus();
  }

  // Handles by GPU (device id), for metrics: shm mappings / CUDA IPC memory handles.
  virtual std::map<std::string, HandleCounts> handle_counts() const = 0;
  // Pool bytes the engine has registered for DMA (CUDA: cudaHostRegister); 0 for shm.
  virtual uint64_t pinned_bytes() const { return 0; }
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_COPY_ENGINE_H_
