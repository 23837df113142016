// CopyEngine: moves bytes between client memory (a registered region) and the host pool.
//
// Two backends implement it (docs/ARCHITECTURE.md, "Copy backends"):
//  - shm  (shm/shm_engine.h): the client's "device memory" is a POSIX shared-memory object; a chunk
//         copy is a memcpy on the calling worker thread. It derives from BlockingCopyEngine
//         (blocking_copy_engine.h), the adapter that builds every other entry point from its one
//         blocking copy.
//  - cuda (cuda/cuda_engine.h): the region is a CUDA IPC memory handle of an allocation base; chunk
//         copies are cudaMemcpyAsync on per-GPU D2H/H2D streams (cuda-sim: the same engine over
//         a timing model).
// Every virtual method is pure: a backend implements each one (three copy calls: BeginTransfer,
// CopyOrderedChunk, PostOrderedChunk; CopyChunk and PostChunk are the latter two with a null
// order), and says in capabilities() what it does beyond a blocking copy, so callers ask
// instead of relying on silent defaults.
// Pacing, chunking and ordering between clients are the scheduler's job (sched/), not the
// engine's: a chunk copy moves exactly the bytes it is given.
#ifndef OFFLOADD_SERVER_COPY_COPY_ENGINE_H_
#define OFFLOADD_SERVER_COPY_COPY_ENGINE_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"

namespace offloadd::copy {

enum class Direction { kDeviceToHost = 0, kHostToDevice = 1 };
inline const char* DirectionName(Direction d) {
  return d == Direction::kDeviceToHost ? "d2h" : "h2d";
}

// How soon a posted chunk is needed. An engine that queues chunks before its copy
// hardware serves urgent ones first (a reload a backward pass is blocked on); the others in the
// order they were posted.
enum class ChunkUrgency { kNormal = 0, kUrgent = 1 };

// What a client registers: exactly one of shm_name / cuda_ipc_handle is set.
struct RegionSpec {
  std::string shm_name;         // POSIX shm object name, starts with '/'
  std::string cuda_ipc_handle;  // 64 bytes of cudaIpcMemHandle_t (allocation base)
  uint64_t size_bytes = 0;      // size of the object / allocation
  std::string device_id;        // GPU UUID (cuda) or the session's device name (shm)
  // The session's Hello said transient_device (a probe), or the region is a projector
  // refresh's: its handle counts may be forgotten with the device (ForgetDevice; the shm engine
  // also when the device's last such handle closes); a region of any other session keeps them.
  bool transient_device = false;
  // The registering session's uid; -1 when unknown. A CUDA IPC handle registered by one uid is
  // refused to sessions of another uid while any of the first uid's registrations of it lasts.
  int64_t owner_uid = -1;
};

// OK when `name` is a name shm_open accepts ("/name": one leading slash, no other slash or NUL,
// not . or .., under 255 bytes); else INVALID_ARGUMENT saying so (the name quoted escaped, at
// most 64 bytes of it). Checked before anything touches the file system, so a name such as
// "/../../root/x" never reaches stat() or shm_open().
inline absl::Status CheckShmRegionName(const std::string& name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() >= 255 || name.find('\0') != std::string::npos || name == "/." || name == "/..") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shared-memory region name '%s' is malformed: use \"/name\" (one leading slash, no other "
        "slash or NUL, not . or .., under 255 bytes) as passed to shm_open",
        absl::CHexEscape(name.substr(0, 64))));
  }
  return absl::OkStatus();
}

// What orders one transfer against the client's GPU work (BeginTransfer). Event handles are
// cudaIpcEventHandle_t bytes (64) or empty (none).
struct TransferSpec {
  Direction direction = Direction::kDeviceToHost;
  uint64_t bytes = 0;        // the whole transfer; its last chunk ends here
  std::string ready_event;   // client event: no chunk before it completed
  std::string done_event;    // reload: recorded right after the last chunk is issued
  std::function<void()> on_done_recorded;  // after that record was issued (engine thread)
  // Null, or true once the transfer's owner has gone (its session ended): a transfer still
  // waiting for its ready event then fails with CANCELLED instead of waiting on.
  std::function<bool()> cancelled;
  // Null, or told when the transfer's chunks start waiting for `ready_event` (true: the engine
  // found the event not yet completed; the client's producer still runs) and when that wait
  // ends (false: it completed, or the transfer failed while waiting); false comes only after
  // true, each at most once. Runs on the engine's thread while it picks copies to issue: it
  // must not block or post chunks (LinkScheduler::SetWaitingForProducer is made for it).
  std::function<void(bool waiting)> on_producer_wait;
  // The session the transfer is for (0: none). What the engine keeps for it beyond the
  // transfer (opened client events) is released by ReleaseOwner(owner_id).
  uint64_t owner_id = 0;
  // The owner's uid (-1: unknown): an event handle opened for one uid's transfers is refused
  // (PERMISSION_DENIED) to another uid's while it stays opened for the first.
  int64_t owner_uid = -1;
};

// Engine state of one ordered transfer (opaque to callers; see BeginTransfer).
class TransferOrder {
 public:
  virtual ~TransferOrder() = default;
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

// What an engine does beyond moving the bytes of a chunk (CopyEngine::capabilities()).
struct CopyCapabilities {
  // PostChunk returns before the copy completes, so a caller gains from keeping several chunks
  // posted. false: PostChunk runs the copy on the calling thread and then `done`.
  bool asynchronous = false;
  // BeginTransfer returns an order that honours the transfer's ready and done events and holds
  // the region's mapping. false: BeginTransfer returns null, the ordered calls are the
  // unordered ones and `on_done_recorded` never runs.
  bool orders_transfers = false;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  // See CopyCapabilities; fixed for the engine's lifetime.
  virtual CopyCapabilities capabilities() const = 0;
  // "shm" or "cuda".
  virtual std::string name() const = 0;

  // Opens a client region. Errors: INVALID_ARGUMENT when the spec names the other backend's
  // handle kind or is malformed; NOT_FOUND when the shm object does not exist; OUT_OF_RANGE when
  // size_bytes exceeds the object's real size; FAILED_PRECONDITION for CUDA handle failures.
  virtual absl::StatusOr<std::shared_ptr<Region>> OpenRegion(const RegionSpec& spec) = 0;

  // A backend implements three copy calls: BeginTransfer, CopyOrderedChunk and
  // PostOrderedChunk. CopyChunk and PostChunk are those calls with a null order (a chunk that is
  // a transfer of its own), not separate entry points.

  // The ordered form of a transfer (docs/ARCHITECTURE.md, "The event protocol"). BeginTransfer
  // is called once per transfer before its first chunk; the chunks then go through
  // CopyOrderedChunk / PostOrderedChunk with the returned order, which the caller keeps until
  // the transfer is over (the last chunk's `done` has run) and then drops. With
  // capabilities().orders_transfers (cuda):
  //  - the region's mapping is held open from here until the order is dropped (and only then:
  //    the daemon maps client memory only while a transfer uses it);
  //  - `ready_event`: no chunk is issued to the hardware before this client event has completed
  //    (the engine queries it; it never makes a stream wait, so other transfers keep moving);
  //  - `done_event`: recorded on the stream of the transfer's chunks right after its last chunk
  //    (the one ending at `bytes`) is issued; then `on_done_recorded` runs, on the engine's
  //    thread (it must not block: it may only hand an answer on).
  // Returns null when the engine orders nothing (!capabilities().orders_transfers, shm:
  // `on_done_recorded` never runs). Errors: INVALID_ARGUMENT for malformed event handles or a
  // region of another engine.
  virtual absl::StatusOr<std::shared_ptr<TransferOrder>> BeginTransfer(Region& region,
                                                                      TransferSpec spec) = 0;

  // Copies `bytes` between region[region_offset, +bytes) and host[0, bytes), the chunk at
  // `transfer_offset` of the transfer `order` (null: a chunk that is a transfer of its own),
  // blocking until the bytes have landed. Called concurrently from several worker threads. The
  // caller has checked bounds against region.size_bytes().
  virtual absl::Status CopyOrderedChunk(TransferOrder* order, uint64_t transfer_offset,
                                        Direction direction, Region& region,
                                        uint64_t region_offset, uint8_t* host,
                                        uint64_t bytes) = 0;
  // The asynchronous form of CopyOrderedChunk: queues the same copy and returns; `done` runs
  // exactly once, with CopyOrderedChunk's status, when the bytes have landed or the copy failed.
  // It may run inline (an error found before the copy is queued, or an engine without
  // capabilities().asynchronous: the copy and then `done`) or on an engine thread, which must
  // not block in it: it may post further chunks and otherwise only hand the completion on. The
  // caller keeps `region` and host[0, bytes) alive until `done` has run. `urgency`: kUrgent
  // chunks go ahead of every queued chunk that is not (never ahead of a copy already issued to
  // the hardware).
  virtual void PostOrderedChunk(TransferOrder* order, uint64_t transfer_offset,
                                Direction direction, Region& region, uint64_t region_offset,
                                uint8_t* host, uint64_t bytes, ChunkUrgency urgency,
                                std::function<void(absl::Status)> done) = 0;

  // CopyOrderedChunk / PostOrderedChunk for a chunk that is a transfer of its own (null order).
  absl::Status CopyChunk(Direction direction, Region& region, uint64_t region_offset,
                         uint8_t* host, uint64_t bytes) {
    return CopyOrderedChunk(nullptr, 0, direction, region, region_offset, host, bytes);
  }
  void PostChunk(Direction direction, Region& region, uint64_t region_offset, uint8_t* host,
                 uint64_t bytes, ChunkUrgency urgency, std::function<void(absl::Status)> done) {
    PostOrderedChunk(nullptr, 0, direction, region, region_offset, host, bytes, urgency,
                     std::move(done));
  }
  // capabilities().asynchronous: false for shm and for the cuda engine with asynchronous = false.
  bool asynchronous() const { return capabilities().asynchronous; }

  // Once at start-up, after the pool's arena is mapped: make host[base, +size_bytes) usable for
  // asynchronous DMA (CUDA: cudaHostRegister(Portable) in chunks, in the background; copies work
  // meanwhile, slower). Must be undone before the arena is unmapped: the engine's destructor
  // does it, so the engine must be destroyed before the arena. No-op for shm.
  virtual absl::Status PrepareHostPool(uint8_t* base, uint64_t size_bytes) = 0;

  // Handles by GPU (device id), for metrics: shm mappings / CUDA IPC memory handles.
  virtual std::map<std::string, HandleCounts> handle_counts() const = 0;
  // Drops `device_id` from handle_counts() when none of its handles is open and only sessions
  // with transient_device ever opened one (a probe's device, after its last session). No-op
  // otherwise, and on engines that key the counts by device UUID rather than by the client's
  // device id (cuda).
  virtual void ForgetDevice(const std::string& device_id) = 0;
  // The owner's (TransferSpec::owner_id's) session ended: release what the engine kept for its
  // transfers and no other owner uses (cuda: cached client IPC events; a simulated client's
  // table stays mapped only while something holds it). Transfers still running keep theirs
  // until they end. No-op for shm.
  virtual void ReleaseOwner(uint64_t owner_id) = 0;
  // Pool bytes the engine has registered for DMA (CUDA: cudaHostRegister); 0 for shm.
  virtual uint64_t pinned_bytes() const = 0;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_COPY_ENGINE_H_
