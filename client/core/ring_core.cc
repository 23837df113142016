#include "client/core/ring_core.h"

#include <chrono>
#include <cstring>

namespace offloadd::client {
namespace {

double NowSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// Whether nobody waits for `e` to be taken at once (common/ring_format.h "Deferred
// wake-ups"): everything but an urgent reload.
bool Deferrable(const common::SubmissionEntry& e) {
  return e.kind != static_cast<uint32_t>(common::SubmissionKind::kReload) ||
         e.priority != RingCore::kUrgentPriority;
}

common::SubmissionEntry Zeroed(common::SubmissionKind kind) {
  common::SubmissionEntry e;
  std::memset(&e, 0, sizeof(e));
  e.kind = static_cast<uint32_t>(kind);
  return e;
}

void CopyEvent(const uint8_t* event, uint8_t* bytes, uint8_t* length) {
  if (event == nullptr) return;
  std::memcpy(bytes, event, common::kRingEventBytes);
  *length = common::kRingEventBytes;
}

}  // namespace

std::unique_ptr<RingCore> RingCore::Create(uint32_t submission_entries,
                                           uint32_t completion_entries, std::string* error) {
  common::RingMemfd memfd;
  if (!common::CreateRingMemfd(submission_entries, completion_entries, &memfd, error)) {
    return nullptr;
  }
  return std::unique_ptr<RingCore>(new RingCore(memfd));
}

RingCore::RingCore(common::RingMemfd memfd)
    : memfd_(memfd),
      control_(common::ControlOf(memfd.base)),
      submit_(common::SubmissionSlots(memfd.base, memfd.layout), memfd.layout.submission_entries,
              &control_->submission_tail, &control_->submission_head),
      take_(common::CompletionSlots(memfd.base, memfd.layout), memfd.layout.completion_entries,
            &control_->completion_tail, &control_->completion_head),
      completion_entries_(memfd.layout.completion_entries) {}

RingCore::~RingCore() { common::DestroyRingMemfd(&memfd_); }

bool RingCore::closed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return EndedLocked();
}

bool RingCore::corrupt() const {
  std::lock_guard<std::mutex> lock(mu_);
  return corrupt_;
}

bool RingCore::EndedLocked() const {
  return corrupt_ || shut_ || control_->state.closed.load(std::memory_order_seq_cst) != 0;
}

void RingCore::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    shut_ = true;
  }
  WakeWaiters();
}

size_t RingCore::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return pending_.size() + answers_.size();
}

void RingCore::RingDaemon(bool deferrable) {
  if (deferrable && control_->state.poll_microseconds.load(std::memory_order_seq_cst) != 0) {
    unrung_.store(true, std::memory_order_release);
    return;
  }
  control_->daemon_doorbell.Ring();
}

void RingCore::RingDeferred() {
  if (unrung_.load(std::memory_order_relaxed) &&
      unrung_.exchange(false, std::memory_order_acq_rel)) {
    control_->daemon_doorbell.Ring();
  }
}

template <typename Ready>
bool RingCore::SleepUntil(Ready ready, double deadline_seconds) {
  for (;;) {
    const uint32_t seen = control_->client_doorbell.Arm();
    bool done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = ready();
    }
    const double left = deadline_seconds - NowSeconds();
    if (!done && left > 0) {
      // About to sleep on an answer (or a slot) while a submission went unrung: ring now
      // rather than wait for the daemon's next poll.
      RingDeferred();
      control_->client_doorbell.Sleep(seen, left);
    }
    control_->client_doorbell.Disarm();
    if (done) return true;
    if (left <= 0) return false;
  }
}

bool RingCore::SubmitEntry(const common::SubmissionEntry& entry, double timeout_seconds) {
  const double deadline = timeout_seconds < 0 ? 1e300 : NowSeconds() + timeout_seconds;
  common::RingResult pushed = common::RingResult::kFull;
  auto try_push = [&] {
    if (EndedLocked()) return true;
    pushed = submit_.TryPush(entry);
    if (pushed == common::RingResult::kCorrupt) corrupt_ = true;
    if (pushed == common::RingResult::kOk) pending_.insert(entry.request_id);
    return pushed != common::RingResult::kFull;
  };
  SleepUntil(try_push, deadline);
  if (pushed != common::RingResult::kOk) return false;
  RingDaemon(Deferrable(entry));
  return true;
}

uint64_t RingCore::Offload(uint64_t region_id, uint64_t offset_bytes, uint64_t size_bytes,
                           uint64_t tag, const uint8_t* ready_event, bool ordering,
                           uint64_t order_step, uint64_t order_position, double timeout_seconds) {
  common::SubmissionEntry e = Zeroed(common::SubmissionKind::kOffload);
  e.region_id = region_id;
  e.offset_bytes = offset_bytes;
  e.size_bytes = size_bytes;
  e.tag = tag;
  CopyEvent(ready_event, e.ready_event, &e.ready_event_bytes);
  if (ordering) {
    e.flags = common::kSubmitOrdering;
    e.order_step = order_step;
    e.order_position = order_position;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    e.request_id = common::kRingRequestIdBit | next_id_++;
  }
  return SubmitEntry(e, timeout_seconds) ? e.request_id : 0;
}

uint64_t RingCore::Reload(uint64_t block_id, uint64_t tag, uint64_t region_id,
                          uint64_t offset_bytes, uint32_t priority, bool release_after,
                          double deadline_seconds, const uint8_t* ready_event,
                          const uint8_t* done_event, double timeout_seconds) {
  common::SubmissionEntry e = Zeroed(common::SubmissionKind::kReload);
  e.block_id = block_id;
  e.tag = tag;
  e.region_id = region_id;
  e.offset_bytes = offset_bytes;
  e.priority = priority;
  e.flags = release_after ? common::kSubmitReleaseAfter : 0;
  e.deadline_seconds = deadline_seconds;
  CopyEvent(ready_event, e.ready_event, &e.ready_event_bytes);
  CopyEvent(done_event, e.done_event, &e.done_event_bytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    e.request_id = common::kRingRequestIdBit | next_id_++;
  }
  return SubmitEntry(e, timeout_seconds) ? e.request_id : 0;
}

uint64_t RingCore::Release(uint64_t block_id, uint64_t tag, double timeout_seconds) {
  common::SubmissionEntry e = Zeroed(common::SubmissionKind::kRelease);
  e.block_id = block_id;
  e.tag = tag;
  {
    std::lock_guard<std::mutex> lock(mu_);
    e.request_id = common::kRingRequestIdBit | next_id_++;
  }
  return SubmitEntry(e, timeout_seconds) ? e.request_id : 0;
}

void RingCore::DrainLocked() {
  common::CompletionEntry c;
  uint32_t taken = 0;
  for (;;) {
    const common::RingResult r = take_.TryPop(&c);
    if (r == common::RingResult::kCorrupt) corrupt_ = true;
    if (r != common::RingResult::kOk) break;
    ++taken;
    if (pending_.erase(c.request_id) == 0) continue;  // not ours (or answered twice): dropped
    answers_[c.request_id] = c;
  }
  // The daemon keeps an answer it could not push (the ring was full) and then pushes none
  // directly until its thread flushes them: the ring holds exactly `completion_entries_`
  // answers from that moment until a drain, which pops until empty. So only a drain that took
  // a full ring's worth can have freed slots such an answer waits for: that one wakes the
  // daemon's thread; any other would wake it for nothing (a futex wake per drain).
  if (taken >= completion_entries_) control_->daemon_doorbell.Ring();
}

RingCore::WaitResult RingCore::Poll(uint64_t request_id, common::CompletionEntry* out) {
  std::lock_guard<std::mutex> lock(mu_);
  DrainLocked();
  auto it = answers_.find(request_id);
  if (it != answers_.end()) {
    *out = it->second;
    answers_.erase(it);
    return WaitResult::kDone;
  }
  if (pending_.count(request_id) == 0) return WaitResult::kUnknown;
  if (EndedLocked()) return WaitResult::kClosed;
  return WaitResult::kTimeout;
}

RingCore::WaitResult RingCore::Wait(uint64_t request_id, double timeout_seconds,
                                    common::CompletionEntry* out) {
  const double deadline = timeout_seconds < 0 ? 1e300 : NowSeconds() + timeout_seconds;
  WaitResult result = WaitResult::kTimeout;
  SleepUntil(
      [&] {
        DrainLocked();
        auto it = answers_.find(request_id);
        if (it != answers_.end()) {
          *out = it->second;
          answers_.erase(it);
          result = WaitResult::kDone;
        } else if (pending_.count(request_id) == 0) {
          result = WaitResult::kUnknown;
        } else if (EndedLocked()) {
          result = WaitResult::kClosed;
        }
        return result != WaitResult::kTimeout;
      },
      deadline);
  return result;
}

RingCore::WaitResult RingCore::WaitAny(double timeout_seconds, common::CompletionEntry* out,
                                       const std::atomic<bool>* cancel) {
  const double deadline = timeout_seconds < 0 ? 1e300 : NowSeconds() + timeout_seconds;
  WaitResult result = WaitResult::kTimeout;
  SleepUntil(
      [&] {
        DrainLocked();
        if (!answers_.empty()) {
          auto it = answers_.begin();
          *out = it->second;
          answers_.erase(it);
          result = WaitResult::kDone;
        } else if (EndedLocked()) {
          result = WaitResult::kClosed;
        }
        return result != WaitResult::kTimeout || (cancel != nullptr && cancel->load());
      },
      deadline);
  return result;
}

int RingCore::TakeAny(common::CompletionEntry* out, size_t max, double timeout_seconds) {
  int taken = 0;
  bool closed = false;
  auto take = [&] {
    DrainLocked();
    while (!answers_.empty() && static_cast<size_t>(taken) < max) {
      auto it = answers_.begin();
      out[taken++] = it->second;
      answers_.erase(it);
    }
    closed = taken == 0 && (EndedLocked());
    return taken > 0 || closed || max == 0;
  };
  if (timeout_seconds == 0) {
    std::lock_guard<std::mutex> lock(mu_);
    take();
  } else {
    SleepUntil(take, timeout_seconds < 0 ? 1e300 : NowSeconds() + timeout_seconds);
  }
  return closed ? -1 : taken;
}

}  // namespace offloadd::client
