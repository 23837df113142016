// The per-session shared-memory queue pair: the wire format a client and the daemon share for
// per-tensor requests (offload, reload, release) beside the gRPC Session stream
// (docs/ARCHITECTURE.md "The request ring").
//
// One shared-memory object per session, created by the client (a sealed memfd: it cannot
// shrink under the daemon) and named in Hello; the daemon maps it after checking it. Layout
// (byte offsets; every number is also in the header, and the daemon accepts a header only when
// it equals what RingLayout computes for its entry counts):
//   0      RingHeader (64 bytes): magic, version, entry counts and sizes, offsets, total size
//   64     submission tail   (client writes)     128  submission head   (daemon writes)
//   192    completion tail   (daemon writes)     256  completion head   (client writes)
//   320    daemon doorbell   (futex.h: the daemon sleeps on it, the client rings it)
//   384    client doorbell   (the client sleeps on it, the daemon rings it)
//   448    daemon state      (daemon writes: closed, the ring no longer served; poll interval)
//   512    submission slots: submission_entries x SubmissionEntry (256 bytes)
//   then   completion slots: completion_entries x CompletionEntry (256 bytes)
// Indices are on cache lines of their own (spsc_ring.h). Entry counts are powers of two in
// [kMinRingEntries, kMaxRingEntries].
//
// Wake-ups (futex.h Doorbell): the daemon's ring thread, finding no submission to take and no
// completion to flush, arms the daemon doorbell, re-checks, and sleeps; the client rings it
// after publishing a submission or taking completions when the daemon's flag is up. A client
// thread waiting for a completion (or for a free submission slot) arms the client doorbell,
// re-checks and sleeps; the daemon rings it after publishing completions, and always when it
// stops serving the ring (state closed). Nobody spins unboundedly; the daemon may poll briefly
// before it sleeps.
//
// Deferred wake-ups: a futex wake of a sleeping thread in another process costs the waker a
// system call and a cross-CPU wake-up (~17 us of the training thread per submission on a
// 2-vCPU VM, bench/hook_overhead.py's native-floor variant), more than the rest of a native
// per-tensor path. So while the daemon's ring thread polls the submission ring on its own
// (RingState::poll_microseconds non-zero: it had work within kRingPollWindowSeconds and wakes
// every that many microseconds), a client publishes the submissions nobody waits for at once
// (offloads, releases, prefetch reloads) without ringing; it rings for an urgent reload, and
// before it sleeps waiting for any answer while a submission of its is still unrung. The
// daemon stores poll_microseconds 0 before its last re-check ahead of an untimed sleep, and a
// client loads it after publishing (both sequentially consistent): a client that read non-zero
// published before the daemon's re-check, which then sees the submission; one that read 0
// rings as usual. An old daemon leaves the word 0: its clients ring for everything.
//
// Request ids: ids of requests sent on the ring have bit 63 set (kRingRequestIdBit), so the
// daemon answers them on the completion ring and everything else on the stream.
#ifndef OFFLOADD_COMMON_RING_FORMAT_H_
#define OFFLOADD_COMMON_RING_FORMAT_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>

#include "common/futex.h"
#include "common/spsc_ring.h"

namespace offloadd::common {

inline constexpr uint64_t kRingMagic = 0x31474e49'52444f4full;  // "OODRING1" in memory (little-endian)
inline constexpr uint32_t kRingVersion = 1;
inline constexpr uint32_t kMinRingEntries = 8;
inline constexpr uint32_t kMaxRingEntries = 1u << 16;
inline constexpr uint64_t kRingRequestIdBit = 1ull << 63;
// CUDA IPC event handles (cudaIpcEventHandle_t) are 64 bytes.
inline constexpr size_t kRingEventBytes = 64;
// The daemon's ring thread polls (deferred wake-ups, above) for this long after its last work;
// then it clears poll_microseconds and sleeps until rung.
inline constexpr double kRingPollWindowSeconds = 1.0;

enum class SubmissionKind : uint32_t { kOffload = 1, kReload = 2, kRelease = 3 };
// SubmissionEntry::flags
inline constexpr uint32_t kSubmitReleaseAfter = 1u << 0;  // reload: release once it completed
inline constexpr uint32_t kSubmitOrdering = 1u << 1;      // offload: order_step/position valid
inline constexpr uint32_t kSubmitKnownFlags = kSubmitReleaseAfter | kSubmitOrdering;

// Client -> daemon. Units: bytes; deadline in seconds from the daemon's reading of the entry
// (0: none). Unused fields and `reserved` are zero. Priorities are proto Priority values
// (1 URGENT, 2 PREFETCH; reload only).
struct SubmissionEntry {
  uint32_t kind;   // SubmissionKind
  uint32_t flags;  // kSubmit*
  uint64_t request_id;  // bit 63 set (kRingRequestIdBit)
  uint64_t region_id;     // offload, reload
  uint64_t offset_bytes;  // offload, reload: offset into the region
  uint64_t size_bytes;    // offload: bytes to copy
  uint64_t block_id;      // reload, release (0: by tag)
  uint64_t tag;           // offload: names the block; reload, release: the block when block_id 0
  uint32_t priority;      // reload
  uint8_t ready_event_bytes;  // 0 or kRingEventBytes
  uint8_t done_event_bytes;   // 0 or kRingEventBytes (reload)
  uint16_t reserved0;
  double deadline_seconds;  // reload
  uint64_t order_step;      // offload with kSubmitOrdering
  uint64_t order_position;
  uint8_t ready_event[kRingEventBytes];
  uint8_t done_event[kRingEventBytes];
  uint8_t reserved[40];
};
static_assert(sizeof(SubmissionEntry) == 256, "submission entries are 256 bytes");

enum class CompletionKind : uint32_t {
  kOffloadDone = 1,
  kReloadDone = 2,
  kReleased = 3,
  kError = 4,
};
inline constexpr uint32_t kCompleteReleased = 1u << 0;           // reload: block released
inline constexpr uint32_t kCompleteDoneEventRecorded = 1u << 1;  // reload: see proto ReloadDone
inline constexpr size_t kCompletionMessageBytes = 200;

// Daemon -> client: one per submission, with its request id. status_code: 0, or a
// google.rpc.Code (kind kError; message says what to do, truncated to fit, not NUL-terminated:
// message_bytes long).
struct CompletionEntry {
  uint64_t request_id;
  uint32_t kind;  // CompletionKind
  int32_t status_code;
  uint64_t block_id;
  uint64_t bytes;
  double queued_seconds;
  double copy_seconds;
  uint32_t flags;  // kComplete*
  uint32_t message_bytes;
  char message[kCompletionMessageBytes];
};
static_assert(sizeof(CompletionEntry) == 256, "completion entries are 256 bytes");

struct RingHeader {
  uint64_t magic;
  uint32_t version;
  uint32_t control_bytes;  // offset of the submission slots
  uint32_t submission_entries;
  uint32_t completion_entries;
  uint32_t submission_entry_bytes;
  uint32_t completion_entry_bytes;
  uint64_t submission_offset;
  uint64_t completion_offset;
  uint64_t total_bytes;
  uint64_t reserved;
};
static_assert(sizeof(RingHeader) == 64, "the header is one cache line");

// The daemon's line (the daemon writes it; the client only reads it). closed: non-zero once the
// daemon stopped serving the ring. poll_microseconds: non-zero while the daemon's ring thread
// polls the submission ring every that many microseconds without being rung ("Deferred
// wake-ups" above); a client reads it as a hint, the daemon never reads it back.
struct alignas(64) RingState {
  std::atomic<uint32_t> closed{0};
  std::atomic<uint32_t> poll_microseconds{0};
};
static_assert(sizeof(RingState) == 64, "the daemon's state is one cache line");

// The first 512 bytes of the object.
struct RingControl {
  RingHeader header;
  RingIndex submission_tail;
  RingIndex submission_head;
  RingIndex completion_tail;
  RingIndex completion_head;
  Doorbell daemon_doorbell;
  Doorbell client_doorbell;
  RingState state;
};
static_assert(sizeof(RingControl) == 512, "the control block is 512 bytes");

// Sizes and offsets of a ring with the given entry counts.
struct RingLayout {
  uint32_t submission_entries = 0;
  uint32_t completion_entries = 0;
  uint64_t submission_offset = 0;
  uint64_t completion_offset = 0;
  uint64_t total_bytes = 0;
};

// The layout for these counts; false (and *error says why) unless each is a power of two in
// [kMinRingEntries, kMaxRingEntries].
bool MakeRingLayout(uint32_t submission_entries, uint32_t completion_entries, RingLayout* out,
                    std::string* error);
// Writes a new ring's header and zeroes its control block (client side, before Hello).
void InitRing(void* base, const RingLayout& layout);
// Daemon side: checks a header copied out of the shared object (once) against an object of
// `object_bytes`: magic, version, counts (MakeRingLayout), every offset and size equal to the
// layout's and total_bytes == object_bytes. False and *error (a sentence) when not.
bool ParseRingHeader(const RingHeader& copy, uint64_t object_bytes, RingLayout* out,
                     std::string* error);

// Views of a mapped ring (the mapping outlives them).
RingControl* ControlOf(void* base);
SubmissionEntry* SubmissionSlots(void* base, const RingLayout& layout);
CompletionEntry* CompletionSlots(void* base, const RingLayout& layout);

// Checks a submission copied out of the ring (never the slot itself): known kind and flags,
// request id with kRingRequestIdBit, event sizes 0 or kRingEventBytes (done event on reloads
// only), a finite deadline in [0, 1e9], zero reserved bytes and zero fields the kind does not
// use. What the session checks itself (region ids, bounds, priorities, block ids) is left to
// it. False and *error (a sentence saying what to fix) when not.
bool ValidateSubmission(const SubmissionEntry& copy, std::string* error);

// A completion for `request_id` (every byte set: no stale or uninitialised bytes reach the
// client). `message` is truncated to kCompletionMessageBytes.
CompletionEntry MakeCompletion(uint64_t request_id, CompletionKind kind, int32_t status_code,
                               const std::string& message);

}  // namespace offloadd::common

#endif  // OFFLOADD_COMMON_RING_FORMAT_H_
