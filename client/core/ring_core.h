// RingCore: the client side of a session's request ring (common/ring_format.h), the native
// per-tensor path every client binds: it creates the ring (a sealed memfd whose descriptor the
// client names in Hello.ring), submits offloads, reloads and releases, takes completions into
// a table of answers by request id, and lets a thread wait for one answer (a futex sleep, no
// lock held) or poll. It links no gRPC: Hello and everything else of the session travel on
// the client's own stream, and the client tells the core when the daemon attached the ring.
//
// Wake-ups: a submission rings the daemon's doorbell, except one nobody waits for at once (an
// offload, a release, a prefetch reload) while the daemon polls the ring on its own
// (common/ring_format.h "Deferred wake-ups"); a thread about to sleep for an answer or a slot
// rings first when such a submission went unrung.
//
// Request ids: the core numbers its requests (bit 63 set, counting up from 1) unless the caller
// gives one (SubmitEntry). Units: bytes, seconds. Every method is thread-safe; waits release
// the core's mutex. Completion entries are copied out of the ring once into the table.
#ifndef OFFLOADD_CLIENT_CORE_RING_CORE_H_
#define OFFLOADD_CLIENT_CORE_RING_CORE_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "common/ring_format.h"
#include "common/ring_memfd.h"

namespace offloadd::client {

class RingCore {
 public:
  enum class WaitResult { kDone, kTimeout, kClosed, kUnknown };

  // A ring of the given entry counts (powers of two, common::kMinRingEntries to
  // kMaxRingEntries). nullptr and *error (a sentence) when it cannot be made.
  static std::unique_ptr<RingCore> Create(uint32_t submission_entries,
                                          uint32_t completion_entries, std::string* error);
  ~RingCore();
  RingCore(const RingCore&) = delete;
  RingCore& operator=(const RingCore&) = delete;

  // The descriptor to name in Hello.ring.fd (kept open until the core is destroyed).
  int fd() const { return memfd_.fd; }

  // Submits a request; returns its id (bit 63 set), or 0 when the ring is closed (the daemon
  // ended the session) or no slot freed within timeout_seconds (< 0: wait as long as it takes);
  // closed() tells which.
  // Events: nullptr or kRingEventBytes bytes.
  uint64_t Offload(uint64_t region_id, uint64_t offset_bytes, uint64_t size_bytes, uint64_t tag,
                   const uint8_t* ready_event, bool ordering, uint64_t order_step,
                   uint64_t order_position, double timeout_seconds = -1);
  uint64_t Reload(uint64_t block_id, uint64_t tag, uint64_t region_id, uint64_t offset_bytes,
                  uint32_t priority, bool release_after, double deadline_seconds,
                  const uint8_t* ready_event, const uint8_t* done_event,
                  double timeout_seconds = -1);
  uint64_t Release(uint64_t block_id, uint64_t tag, double timeout_seconds = -1);
  // Submits `entry` as it is (its request_id the caller's, bit 63 set). False when closed or
  // timed out.
  bool SubmitEntry(const common::SubmissionEntry& entry, double timeout_seconds = -1);

  // The answer of request `request_id` if it arrived (removed from the table): kDone; kTimeout
  // when not yet; kUnknown for an id not pending; kClosed when the ring closed without it.
  WaitResult Poll(uint64_t request_id, common::CompletionEntry* out);
  // Poll, sleeping until the answer arrives, the ring closes or timeout_seconds pass (< 0: no
  // limit).
  WaitResult Wait(uint64_t request_id, double timeout_seconds, common::CompletionEntry* out);
  // Any one answer that arrived (removed from the table), waiting as Wait does. `cancel`
  // (optional): returns kTimeout once it is true and WakeWaiters() was called.
  WaitResult WaitAny(double timeout_seconds, common::CompletionEntry* out,
                     const std::atomic<bool>* cancel = nullptr);
  // Up to `max` answers that arrived, of any requests (removed from the table, in no particular
  // order), waiting as WaitAny does for the first (timeout_seconds 0: not at all; < 0: no
  // limit). Returns how many it took; -1 when none was there and the ring is closed. A caller
  // that owns every request of the core (a language binding) drains with it instead of polling
  // each id.
  int TakeAny(common::CompletionEntry* out, size_t max, double timeout_seconds);

  // Wakes every thread waiting in Wait / WaitAny / a submission (they re-check and go on
  // waiting unless their condition changed): a caller that stops a waiting thread sets the
  // flag it passed as WaitAny's `cancel`, then calls this.
  void WakeWaiters() { control_->client_doorbell.RingAlways(); }
  // Ends the ring on this side (before destroying the core while other threads may be inside
  // it): every thread sleeping in Wait / WaitAny / TakeAny / a submission returns at once as if
  // the daemon had closed the ring (kClosed, -1, 0 / false), and so does every later call;
  // closed() is true from here on. The daemon is not told: its session ends with the stream.
  void Shutdown();
  // True once the daemon closed the ring (the session ended), the ring was found corrupt, or
  // Shutdown() was called. A submission that returned 0 / false while closed() is false found
  // no free slot within its timeout (the daemon is behind: take answers and retry).
  bool closed() const;
  // True once this side found an index the daemon owns impossible (the ring's shared memory was
  // overwritten): the daemon may still be serving the ring, but its answers cannot be read.
  bool corrupt() const;
  // Requests submitted and not yet taken by Poll / Wait / WaitAny.
  size_t pending() const;
  // Rings the daemon's doorbell if a submission went unrung (deferred wake-ups, above), as a
  // thread about to sleep in Wait / WaitAny / TakeAny does. A thread that waits for an answer
  // outside the core (a future another thread completes from the ring's answers) calls it
  // before it sleeps, so the daemon takes the submission now rather than at its next poll.
  // Costs one load when nothing went unrung.
  void RingDeferred();

  // Reload priority that never defers its wake-up (proto Priority URGENT).
  static constexpr uint32_t kUrgentPriority = 1;

 private:
  explicit RingCore(common::RingMemfd memfd);
  // Moves every completion in the ring into answers_; mu_ held. Corrupt: marks closed. Wakes
  // the daemon's ring thread only when it took a full ring (the daemon may hold answers back).
  void DrainLocked();
  // Rings the daemon's doorbell after a submission, unless `deferrable` and the daemon polls:
  // then marks unrung_ for the next sleep.
  void RingDaemon(bool deferrable);
  // Whether the ring ended (closed by the daemon, corrupt or shut down); mu_ held.
  bool EndedLocked() const;
  // Sleeps on the client doorbell until `ready` (checked with mu_ held) or the deadline.
  template <typename Ready>
  bool SleepUntil(Ready ready, double deadline_seconds);

  common::RingMemfd memfd_;
  common::RingControl* control_;
  mutable std::mutex mu_;
  common::RingProducer<common::SubmissionEntry> submit_;
  common::RingConsumer<common::CompletionEntry> take_;
  const uint32_t completion_entries_;
  uint64_t next_id_ = 1;
  bool corrupt_ = false;
  bool shut_ = false;  // Shutdown() was called
  std::atomic<bool> unrung_{false};            // a deferred submission not yet rung for
  std::unordered_set<uint64_t> pending_;                          // submitted, not answered
  std::unordered_map<uint64_t, common::CompletionEntry> answers_;  // answered, not yet taken
};

}  // namespace offloadd::client

#endif  // OFFLOADD_CLIENT_CORE_RING_CORE_H_
