/* offloadd native client core, C ABI: the per-tensor path of a session's request ring
 * (client/core/ring_core.h; docs/ARCHITECTURE.md "The request ring"), callable from any
 * language without its runtime's ABI (Python loads liboffloadd_core.so with ctypes, which
 * releases the GIL during each call). It links no gRPC: the caller says Hello on its own
 * Session stream naming offloadd_ring_fd() in Hello.ring.fd, and uses the ring once
 * HelloReply.ring_attached is true; region ids are the daemon's.
 *
 * Units: bytes, seconds. Request ids returned have bit 63 set; 0 means the request was not
 * submitted: offloadd_ring_closed() then tells why (1: the ring is closed, the session ended;
 * 0: no slot freed within the timeout, the daemon is behind: take answers and retry).
 * Event handles: NULL or 64 bytes (cudaIpcEventHandle_t). Every function is thread-safe. */
#ifndef OFFLOADD_CLIENT_CORE_OFFLOADD_CORE_H_
#define OFFLOADD_CLIENT_CORE_OFFLOADD_CORE_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct offloadd_ring offloadd_ring;

/* One answer; the layout of common::CompletionEntry (256 bytes). kind: 1 offload done,
 * 2 reload done, 3 released, 4 error (status_code a google.rpc.Code, message_bytes of message,
 * not NUL-terminated). flags: 1 released (reload with release_after), 2 done event recorded. */
typedef struct offloadd_completion {
  uint64_t request_id;
  uint32_t kind;
  int32_t status_code;
  uint64_t block_id;
  uint64_t bytes;
  double queued_seconds;
  double copy_seconds;
  uint32_t flags;
  uint32_t message_bytes;
  char message[200];
} offloadd_completion;

/* Results of poll and wait. */
#define OFFLOADD_DONE 1
#define OFFLOADD_PENDING 0 /* not yet (poll), or the timeout passed (wait) */
#define OFFLOADD_CLOSED -1 /* the ring closed without this answer: the session ended */
#define OFFLOADD_UNKNOWN -2 /* no such request pending (never submitted, or already taken) */

/* A new ring (entry counts: powers of two from 8 to 65536). NULL on failure, with a sentence in
 * error (NUL-terminated, at most error_bytes). Free with offloadd_ring_destroy. */
offloadd_ring* offloadd_ring_create(uint32_t submission_entries, uint32_t completion_entries,
                                    char* error, size_t error_bytes);
void offloadd_ring_destroy(offloadd_ring* ring);
/* The memfd's descriptor to name in Hello.ring.fd. */
int offloadd_ring_fd(const offloadd_ring* ring);

/* Submissions; timeout_seconds < 0 waits for a free slot as long as it takes. */
uint64_t offloadd_ring_offload(offloadd_ring* ring, uint64_t region_id, uint64_t offset_bytes,
                               uint64_t size_bytes, uint64_t tag, const uint8_t* ready_event,
                               int has_ordering, uint64_t order_step, uint64_t order_position,
                               double timeout_seconds);
/* priority: 1 urgent, 2 prefetch. block_id 0: the block offloaded with `tag`. */
uint64_t offloadd_ring_reload(offloadd_ring* ring, uint64_t block_id, uint64_t tag,
                              uint64_t region_id, uint64_t offset_bytes, uint32_t priority,
                              int release_after, double deadline_seconds,
                              const uint8_t* ready_event, const uint8_t* done_event,
                              double timeout_seconds);
uint64_t offloadd_ring_release(offloadd_ring* ring, uint64_t block_id, uint64_t tag,
                               double timeout_seconds);

/* The answer of request_id into *out if it arrived (OFFLOADD_DONE), else OFFLOADD_PENDING,
 * OFFLOADD_CLOSED or OFFLOADD_UNKNOWN. */
int offloadd_ring_poll(offloadd_ring* ring, uint64_t request_id, offloadd_completion* out);
/* As poll, sleeping (futex) until the answer, the ring's end or timeout_seconds (< 0: none).
 * Only a live daemon ends the ring: one that was killed leaves it open, so wait with a timeout
 * and check the session's stream (which ends at once) between waits. */
int offloadd_ring_wait(offloadd_ring* ring, uint64_t request_id, double timeout_seconds,
                       offloadd_completion* out);
/* Up to `max` (and at most 64) answers of any requests into out[0..n) (taken from the core, in
 * no particular order; call again while it returns a full batch), sleeping up to
 * timeout_seconds (0: not at all; < 0: no limit) for the first. Returns
 * n (0: none within the timeout), or OFFLOADD_CLOSED when none was there and the ring closed.
 * For a caller that owns every request of the ring: one call takes every answer that arrived,
 * instead of a poll per pending id. */
int offloadd_ring_drain(offloadd_ring* ring, offloadd_completion* out, size_t max,
                        double timeout_seconds);
/* Wakes every thread sleeping in wait, drain or a submission of this ring; they re-check and
 * sleep again unless what they wait for changed (a caller that stops waiting for a reason of
 * its own, such as its session's stream ending, wakes them so that they notice at once). */
void offloadd_ring_wake(offloadd_ring* ring);
/* Ends the ring on this side, to be called before offloadd_ring_destroy while other threads may
 * still be inside calls on it: every thread sleeping in wait, drain or a submission returns at
 * once as if the daemon had closed the ring (OFFLOADD_CLOSED, or 0 for a submission), and so
 * does every later call; offloadd_ring_closed() returns 1. The daemon is not told (its session
 * ends with the stream). Destroy only once no thread is inside a call on the ring. */
void offloadd_ring_shutdown(offloadd_ring* ring);
/* Requests submitted whose answers were not yet taken. */
size_t offloadd_ring_pending(const offloadd_ring* ring);
/* 1 once the daemon closed the ring (the session ended), the ring was found corrupt, or
 * offloadd_ring_shutdown was called; else 0. */
int offloadd_ring_closed(const offloadd_ring* ring);

/* The submission and drain functions' types, for code that calls a loaded core through the
 * functions' addresses instead of linking a second copy of it (the Python package's extension
 * module, client/core/ring_fast_module.c). */
typedef uint64_t (*offloadd_ring_offload_fn)(offloadd_ring*, uint64_t, uint64_t, uint64_t,
                                             uint64_t, const uint8_t*, int, uint64_t, uint64_t,
                                             double);
typedef uint64_t (*offloadd_ring_reload_fn)(offloadd_ring*, uint64_t, uint64_t, uint64_t,
                                            uint64_t, uint32_t, int, double, const uint8_t*,
                                            const uint8_t*, double);
typedef uint64_t (*offloadd_ring_release_fn)(offloadd_ring*, uint64_t, uint64_t, double);
typedef int (*offloadd_ring_drain_fn)(offloadd_ring*, offloadd_completion*, size_t, double);

#ifdef __cplusplus
}
#endif

#endif /* OFFLOADD_CLIENT_CORE_OFFLOADD_CORE_H_ */
