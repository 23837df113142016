// SimGpuTable: the shared-memory table through which a simulated client GPU and a cuda-sim
// daemon see the same device memory, allocations and interprocess events, so the whole CUDA
// data path — IPC memory and event handles, the event protocol, allocations freed under the
// daemon — runs and is checked on machines without a GPU (docs/ARCHITECTURE.md, "The simulated
// client GPU"). The client side is client/python/offloadd/sim_gpu.py (and its C++ twin
// client/sim_client_cuda_api.h); the daemon side is SimCudaApi (server/copy/cuda/cuda_api_sim.h),
// which moves the bytes of copies on such memory when its timing model says they complete.
//
// This file is the format both sides share: the layout, the handles, the clock, and the mapping
// class that creates a table (clients) and checks a mapped one (both). What only the daemon
// does with a client's table — opening it under a SIGBUS guard, checking whose it is — is
// server/copy/cuda/sim_gpu_table.h.
//
// One POSIX shared-memory object per client process, "/ofd-simgpu-<pid>", created by the
// client, mode 0600 unless the client asks otherwise. Layout (little-endian; offsets from the
// start of the object; every field 8-byte aligned; counters and times are updated with atomic
// 8-byte stores):
//
//   header (4096 bytes):      magic "OFDSIMG1" | version u32 (1) | devices u32 |
//                             event_slots u32 | segment_slots u32 | device_bytes u64 |
//                             events_offset u64 | segments_offset u64 | memory_offset u64 |
//                             instance u64 (random, per table) | violations u64[8]
//                             (by SimViolation)
//   event slot (32 bytes):    seq u64 | complete_at_ns i64 | device u32 | in_use u32 | pad u64
//   segment slot (64 bytes):  generation u64 | state u32 (SimSegmentState) | device u32 |
//                             offset u64 (in its device's memory) | size u64 |
//                             daemon_maps u32 | flags u32 (kSimSegmentVmm: no legacy IPC) |
//                             buffer_id u64 | pad u64[2]
//   memory:                   devices x device_bytes, device d at memory_offset + d x device_bytes
//
// Handles (64 bytes each, zero-padded): memory "OFDSIMM1" | pid u32 | segment slot u32 |
// generation u64 | instance u64; event "OFDSIME1" | pid u32 | event slot u32 | 0 u64 |
// instance u64. The instance (random, never 0) tells a table from an earlier one of the same
// pid; the daemon opens a handle only when it equals the table's, so a handle also proves that
// its sender has read the table (mode 0600: its owner).
//
// The daemon reads the header and every slot field it uses once, checks it against the table's
// size, and keeps its own copy: a client that rewrites its table afterwards changes nothing the
// daemon computes addresses from.
//
// Events. complete_at_ns is CLOCK_MONOTONIC nanoseconds (std::chrono::steady_clock; Python's
// time.monotonic_ns()); kSimNever (-1) = never recorded; kSimPending (INT64_MAX) = recorded,
// completion not known yet. A record writes complete_at_ns, then increments seq. An event is
// complete when now >= complete_at_ns. The client records its own events with the completion
// time its modelled stream gives; the daemon records done events as kSimPending and writes the
// completion time once the copies before it have completed and their bytes have been moved.
//
// Segments: the client's allocator marks a segment live (generation incremented) before
// handing out its handle, and freed before reusing its memory. The daemon refuses to open a
// handle whose generation or state does not match, counts its open mappings in daemon_maps,
// and checks the segment again when it moves a copy's bytes.
#ifndef OFFLOADD_COMMON_SIM_GPU_TABLE_H_
#define OFFLOADD_COMMON_SIM_GPU_TABLE_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offloadd::common {

inline constexpr char kSimTableMagic[8] = {'O', 'F', 'D', 'S', 'I', 'M', 'G', '1'};
inline constexpr char kSimMemMagic[8] = {'O', 'F', 'D', 'S', 'I', 'M', 'M', '1'};
inline constexpr char kSimEventMagic[8] = {'O', 'F', 'D', 'S', 'I', 'M', 'E', '1'};
inline constexpr uint32_t kSimTableVersion = 1;
inline constexpr int64_t kSimNever = -1;
inline constexpr int64_t kSimPending = INT64_MAX;
inline constexpr uint32_t kSimSegmentVmm = 1;

enum class SimSegmentState : uint32_t { kFree = 0, kLive = 1, kFreed = 2 };

// What the table counts (header violations[]); every one is a bug of the side that caused it.
enum class SimViolation : int {
  kFreedWhileMapped = 0,  // client freed a segment the daemon had open
  kCopyOnFreed = 1,       // daemon moved bytes of a copy whose segment had been freed
  kWaitUnrecorded = 2,    // client waited on an event not recorded since its request
  kConsumedEarly = 3,     // client read a reload destination before its done event completed
  kCount = 8,
};

struct SimTableHeader {
  char magic[8];
  uint32_t version, devices, event_slots, segment_slots;
  uint64_t device_bytes, events_offset, segments_offset, memory_offset;
  uint64_t instance;
  std::atomic<uint64_t> violations[static_cast<int>(SimViolation::kCount)];
};

struct SimEventSlot {
  std::atomic<uint64_t> seq;
  std::atomic<int64_t> complete_at_ns;
  uint32_t device, in_use;
  uint64_t pad;
};

struct SimSegmentSlot {
  std::atomic<uint64_t> generation;
  std::atomic<uint32_t> state;
  uint32_t device;
  uint64_t offset, size;
  std::atomic<uint32_t> daemon_maps;
  uint32_t flags;
  uint64_t buffer_id;
  uint64_t pad[2];
};

static_assert(sizeof(SimEventSlot) == 32, "layout is shared with Python");
static_assert(sizeof(SimSegmentSlot) == 64, "layout is shared with Python");
static_assert(std::atomic<uint64_t>::is_always_lock_free, "atomics must be plain words");

// What a handle names.
struct SimMemRef {
  uint32_t pid = 0, slot = 0;
  uint64_t generation = 0, instance = 0;
};
struct SimEventRef {
  uint32_t pid = 0, slot = 0;
  uint64_t instance = 0;
};
// Parse a 64-byte handle; false when it is not one of ours.
bool ParseSimMemHandle(absl::string_view handle, SimMemRef* out);
bool ParseSimEventHandle(absl::string_view handle, SimEventRef* out);
std::string MakeSimMemHandle(const SimMemRef& ref);
std::string MakeSimEventHandle(const SimEventRef& ref);
std::string SimTableName(uint32_t pid);  // "/ofd-simgpu-<pid>"

// Where a segment's bytes are, as the daemon read and checked them once (SimGpuTable::Geometry).
struct SimSegmentGeometry {
  uint32_t device = 0;
  uint64_t offset = 0, size_bytes = 0;
  uint8_t* memory = nullptr;  // host address of its first byte, inside the table's mapping
};

// A mapping of one client's table (created by the client, adopted by the daemon). Thread-safe:
// fields are atomics or fixed after Create / Adopt. The layout (header fields and slot counts)
// is read once, checked against the object's size, and kept: event(), segment() and Geometry()
// use that copy, never the client-writable header again.
class SimGpuTable {
 public:
  // Takes over a shared mapping of a table, base[0, size_bytes) of the object `name` (owned by
  // `owner_uid`), reads its layout once and checks it against size_bytes. `before_unmap` (may be
  // null) runs when the table is destroyed, before the mapping goes. FAILED_PRECONDITION when the
  // mapping is not a table of this version or its layout does not fit; the mapping is released
  // (before_unmap, munmap) then too. The daemon's way in is copy::OpenSimGpuTable.
  static absl::StatusOr<std::shared_ptr<SimGpuTable>> Adopt(std::string name, uint8_t* base,
                                                           uint64_t size_bytes,
                                                           uint32_t owner_uid,
                                                           std::function<void()> before_unmap);
  // Creates one (tests and the C++ simulated client): `devices` x `device_bytes` of memory.
  // ALREADY_EXISTS when "/ofd-simgpu-<pid>" exists; RESOURCE_EXHAUSTED when it cannot be sized
  // or mapped. The creator owns it: the object is unlinked when the table is destroyed.
  static absl::StatusOr<std::shared_ptr<SimGpuTable>> Create(uint32_t pid, uint32_t devices,
                                                            uint64_t device_bytes,
                                                            uint32_t event_slots,
                                                            uint32_t segment_slots);
  ~SimGpuTable();

  SimTableHeader& header() const { return *header_; }
  uint64_t instance() const { return layout_.instance; }
  SimEventSlot* event(uint32_t slot) const;      // null when out of range
  SimSegmentSlot* segment(uint32_t slot) const;  // null when out of range
  // Host address of a segment's first byte; null when the slot's range is out of bounds.
  // Reads the slot's fields once.
  uint8_t* SegmentMemory(const SimSegmentSlot& s) const;
  // The slot's device, offset and size read once, and the address they give; false when they
  // lie outside the table (the copy to use from then on: the client may rewrite the slot).
  bool Geometry(const SimSegmentSlot& s, SimSegmentGeometry* out) const;
  void CountViolation(SimViolation v) const;
  uint64_t violations(SimViolation v) const;
  const std::string& name() const { return name_; }
  bool owner() const { return owner_; }
  uint32_t owner_uid() const { return owner_uid_; }  // of the shared-memory object

 private:
  // The header's layout fields as read (and checked) once.
  struct Layout {
    uint32_t devices = 0, event_slots = 0, segment_slots = 0;
    uint64_t device_bytes = 0, events_offset = 0, segments_offset = 0, memory_offset = 0;
    uint64_t instance = 0;
  };
  SimGpuTable() = default;
  // Copies the header's layout into layout_; false when it does not fit in size_.
  bool ReadLayout();
  std::string name_;
  uint8_t* base_ = nullptr;
  uint64_t size_ = 0;
  SimTableHeader* header_ = nullptr;
  Layout layout_;
  uint32_t owner_uid_ = 0;
  bool owner_ = false;                 // created it: unlinks it
  std::function<void()> before_unmap_;  // Adopt's
};

// CLOCK_MONOTONIC now in nanoseconds (what complete_at_ns is compared with).
int64_t SimNowNanoseconds();

}  // namespace offloadd::common

#endif  // OFFLOADD_COMMON_SIM_GPU_TABLE_H_
