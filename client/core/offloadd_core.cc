#include "client/core/offloadd_core.h"

#include <cstring>
#include <memory>
#include <string>

#include "client/core/ring_core.h"

static_assert(sizeof(offloadd_completion) == sizeof(offloadd::common::CompletionEntry),
              "offloadd_completion mirrors common::CompletionEntry");
static_assert(offsetof(offloadd_completion, message) ==
                  offsetof(offloadd::common::CompletionEntry, message),
              "offloadd_completion mirrors common::CompletionEntry");

struct offloadd_ring {
  std::unique_ptr<offloadd::client::RingCore> core;
};

namespace {

using offloadd::client::RingCore;

int ToC(RingCore::WaitResult r) {
  switch (r) {
    case RingCore::WaitResult::kDone:
      return OFFLOADD_DONE;
    case RingCore::WaitResult::kTimeout:
      return OFFLOADD_PENDING;
    case RingCore::WaitResult::kClosed:
      return OFFLOADD_CLOSED;
    default:
      return OFFLOADD_UNKNOWN;
  }
}

// Answers one drain call takes at most (a stack buffer; the caller calls again for more).
constexpr size_t kDrainBatch = 64;

int Copied(RingCore::WaitResult r, const offloadd::common::CompletionEntry& c,
           offloadd_completion* out) {
  if (r == RingCore::WaitResult::kDone && out != nullptr) std::memcpy(out, &c, sizeof(c));
  return ToC(r);
}

}  // namespace

extern "C" {

offloadd_ring* offloadd_ring_create(uint32_t submission_entries, uint32_t completion_entries,
                                    char* error, size_t error_bytes) {
  std::string why;
  auto core = RingCore::Create(submission_entries, completion_entries, &why);
  if (core == nullptr) {
    if (error != nullptr && error_bytes > 0) {
      std::strncpy(error, why.c_str(), error_bytes - 1);
      error[error_bytes - 1] = '\0';
    }
    return nullptr;
  }
  return new offloadd_ring{std::move(core)};
}

void offloadd_ring_destroy(offloadd_ring* ring) { delete ring; }

int offloadd_ring_fd(const offloadd_ring* ring) { return ring->core->fd(); }

uint64_t offloadd_ring_offload(offloadd_ring* ring, uint64_t region_id, uint64_t offset_bytes,
                               uint64_t size_bytes, uint64_t tag, const uint8_t* ready_event,
                               int has_ordering, uint64_t order_step, uint64_t order_position,
                               double timeout_seconds) {
  return ring->core->Offload(region_id, offset_bytes, size_bytes, tag, ready_event,
                             has_ordering != 0, order_step, order_position, timeout_seconds);
}

uint64_t offloadd_ring_reload(offloadd_ring* ring, uint64_t block_id, uint64_t tag,
                              uint64_t region_id, uint64_t offset_bytes, uint32_t priority,
                              int release_after, double deadline_seconds,
                              const uint8_t* ready_event, const uint8_t* done_event,
                              double timeout_seconds) {
  return ring->core->Reload(block_id, tag, region_id, offset_bytes, priority, release_after != 0,
                            deadline_seconds, ready_event, done_event, timeout_seconds);
}

uint64_t offloadd_ring_release(offloadd_ring* ring, uint64_t block_id, uint64_t tag,
                               double timeout_seconds) {
  return ring->core->Release(block_id, tag, timeout_seconds);
}

int offloadd_ring_poll(offloadd_ring* ring, uint64_t request_id, offloadd_completion* out) {
  offloadd::common::CompletionEntry c;
  return Copied(ring->core->Poll(request_id, &c), c, out);
}

int offloadd_ring_wait(offloadd_ring* ring, uint64_t request_id, double timeout_seconds,
                       offloadd_completion* out) {
  offloadd::common::CompletionEntry c;
  return Copied(ring->core->Wait(request_id, timeout_seconds, &c), c, out);
}

int offloadd_ring_drain(offloadd_ring* ring, offloadd_completion* out, size_t max,
                        double timeout_seconds) {
  offloadd::common::CompletionEntry batch[kDrainBatch];
  const int n = ring->core->TakeAny(batch, max < kDrainBatch ? max : kDrainBatch,
                                    timeout_seconds);
  for (int i = 0; i < n; ++i) std::memcpy(&out[i], &batch[i], sizeof(batch[i]));
  return n;
}

void offloadd_ring_wake(offloadd_ring* ring) { ring->core->WakeWaiters(); }

void offloadd_ring_shutdown(offloadd_ring* ring) { ring->core->Shutdown(); }

size_t offloadd_ring_pending(const offloadd_ring* ring) { return ring->core->pending(); }

int offloadd_ring_closed(const offloadd_ring* ring) { return ring->core->closed() ? 1 : 0; }

}  // extern "C"
