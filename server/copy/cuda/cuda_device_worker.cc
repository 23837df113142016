#include "server/copy/cuda/cuda_device_worker.h"

#include <sys/prctl.h>

#include <algorithm>
#include <chrono>
#include <limits>

#include "absl/strings/str_format.h"
#include "common/base/clock.h"

namespace offloadd::copy {
namespace {

constexpr double kSpinSeconds = 200e-6;  // past a predicted end: query continuously this long
constexpr double kBackoffSeconds = 20e-6;  // then between queries
constexpr double kWakeEarlySeconds = 5e-6;  // wake this much before a predicted end
constexpr double kNever = std::numeric_limits<double>::infinity();
// Where an unlearned lane stops doubling its assumed rate (well above any host link today:
// NVLink-C2C is ~450 GB/s per direction).
constexpr double kMaxAssumedBytesPerSecond = 4e12;

double Now() { return base::SteadyNowSeconds(); }

}  // namespace

DeviceWorker::DeviceWorker(CudaApi* api, CudaDeviceInfo device, DeviceWorkerOptions options)
    : api_(api), device_(std::move(device)), options_([&] {
        options.streams_per_direction = std::max<uint32_t>(1, options.streams_per_direction);
        options.max_issued_per_direction = std::max<uint32_t>(2, options.max_issued_per_direction);
        options.issue_ahead_seconds = std::max(0.0, options.issue_ahead_seconds);
        options.assumed_bytes_per_second = std::max(0.0, options.assumed_bytes_per_second);
        options.max_issue_ahead_seconds =
            std::max(options.issue_ahead_seconds, options.max_issue_ahead_seconds);
        return options;
      }()) {
  for (Lane& l : lanes_) {
    l.ahead_seconds = options_.issue_ahead_seconds;
    l.bytes_per_second = options_.assumed_bytes_per_second;
  }
}

DeviceWorker::~DeviceWorker() { Stop(); }

absl::Status DeviceWorker::Start() {
  std::promise<absl::Status> started;
  std::future<absl::Status> f = started.get_future();
  {
    base::MutexLock lock(mu_);
    running_ = true;
  }
  thread_ = std::thread(&DeviceWorker::Loop, this, &started);
  absl::Status st = f.get();
  if (!st.ok()) {
    thread_.join();
    base::MutexLock lock(mu_);
    running_ = false;
  }
  return st;
}

void DeviceWorker::Stop() {
  {
    base::MutexLock lock(mu_);
    if (!running_) return;
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  base::MutexLock lock(mu_);
  running_ = false;
}

absl::Status DeviceWorker::SetUp() {
  absl::Status st = api_->SetDevice(device_.ordinal);
  if (!st.ok()) return st;
  auto mem = api_->MemGetInfo();
  if (mem.ok()) mem_after_context_ = *mem;
  for (uint32_t i = 0; i < options_.streams_per_direction; ++i) {
    for (Lane& l : lanes_) {
      auto s = api_->CreateStream();
      if (!s.ok()) return s.status();
      l.streams.push_back(*s);
    }
  }
  return absl::OkStatus();
}

void DeviceWorker::TearDown() {
  for (Lane& l : lanes_) {
    for (void* s : l.streams) api_->DestroyStream(s);
    l.streams.clear();
  }
  for (void* e : free_events_) api_->DestroyEvent(e);
  free_events_.clear();
}

bool DeviceWorker::Idle() const {
  for (const Lane& l : lanes_) {
    if (!l.urgent.empty() || !l.normal.empty() || !l.issued.empty()) return false;
  }
  return true;
}

void DeviceWorker::Loop(std::promise<absl::Status>* started) {
  thread_id_.store(std::this_thread::get_id());
  // Sleeps until a predicted completion must end on time: the default 50 µs slack is a third of
  // an 8 MiB copy at 55 GB/s.
  prctl(PR_SET_TIMERSLACK, 1000UL, 0, 0, 0);
  absl::Status st = SetUp();
  if (!st.ok()) {
    TearDown();
    thread_id_.store(std::thread::id());
    started->set_value(absl::FailedPreconditionError(absl::StrFormat(
        "%s (%s, ordinal %d): setting up the daemon's context and streams failed: %s",
        device_.uuid, device_.pci_bus_id, device_.ordinal, st.message())));
    return;
  }
  started->set_value(absl::OkStatus());
  std::vector<std::function<void()>> tasks;
  std::vector<Incoming> incoming;
  base::MutexLock lock(mu_);
  while (true) {
    tasks.swap(tasks_);
    incoming.swap(incoming_);
    if (tasks.empty() && incoming.empty() && stopping_ && Idle()) break;
    lock.Unlock();
    for (auto& t : tasks) t();
    tasks.clear();
    for (Incoming& in : incoming) Enqueue(std::move(in));
    incoming.clear();
    for (Lane& l : lanes_) {
      Poll(l);   // completions may post more copies (Enqueue on this thread)
      Issue(l);
    }
    const double now = Now();
    const double wake = NextWakeSeconds(now);
    lock.Lock();
    for (int i = 0; i < 2; ++i) {
      const Lane& l = lanes_[i];
      lane_stats_[i] = LaneStats{l.dry_runs, l.ahead_seconds, l.bytes_per_second,
                                 l.urgent.size() + l.normal.size(), l.issued.size()};
    }
    if (!tasks_.empty() || !incoming_.empty()) continue;
    if (wake <= now) {  // a completion is due: query again soon
      lock.Unlock();
      std::this_thread::yield();
      lock.Lock();
      continue;
    }
    if (stopping_ && Idle()) continue;  // exits at the top
    sleeping_ = true;
    if (wake == kNever) {
      cv_.Wait(mu_);
    } else {
      cv_.WaitUntil(mu_, std::chrono::steady_clock::time_point(
                             std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(wake))));
    }
    sleeping_ = false;
  }
  lock.Unlock();
  TearDown();
}

void DeviceWorker::Enqueue(Incoming in) {
  Lane& l = lane(in.direction);
  (in.urgent ? l.urgent : l.normal).push_back(std::move(in.copy));
}

void DeviceWorker::Poll(Lane& l) {
  // One engine serves a lane's copies in issue order, but several streams may finish out of
  // order: query them all (a lane keeps few issued).
  for (size_t i = 0; i < l.issued.size();) {
    const double asked_at = Now();
    auto q = api_->EventQuery(l.issued[i].event);
    const double now = Now();
    if (q.ok() && !*q) {
      l.issued[i].seen_pending_at = asked_at;
      ++i;
      continue;
    }
    // Done (or failed): bring it to the front, keeping the order of the others.
    std::rotate(l.issued.begin(), l.issued.begin() + i, l.issued.begin() + i + 1);
    if (!q.ok()) {
      Issued failed = std::move(l.issued.front());
      l.issued.pop_front();
      free_events_.push_back(failed.event);
      failed.done(q.status());
      continue;
    }
    Complete(l, now);
  }
}

void DeviceWorker::Complete(Lane& l, double seen_done_at) {
  Issued c = std::move(l.issued.front());
  l.issued.pop_front();
  free_events_.push_back(c.event);
  // It ended between the last "not yet" and now; where a prediction falls in between, trust it
  // (the thread slept until then), else take the middle.
  double end = 0.5 * (c.seen_pending_at + seen_done_at);
  if (l.bytes_per_second > 0 && c.predicted_end > c.seen_pending_at &&
      c.predicted_end <= seen_done_at) {
    end = c.predicted_end;
  }
  // A failed issue (0 bytes) moved an unknown part of its copy: a window starts after it.
  l.rate.OnCompletion(c.bytes, c.bytes > 0 && c.queued_at <= l.last_seen_pending_at, seen_done_at);
  l.rate.OnCopySpan(c.bytes, c.issued_at, seen_done_at);  // lifts a rate learned while shared
  if (l.rate.samples() > 0) l.bytes_per_second = l.rate.bytes_per_second();
  l.last_seen_pending_at = c.seen_pending_at;
  if (l.issued.empty() && (!l.urgent.empty() || !l.normal.empty())) {
    ++l.dry_runs;  // the engine idles while copies wait: issue further ahead
    l.ahead_seconds = std::min(2 * l.ahead_seconds, options_.max_issue_ahead_seconds);
    // An assumed rate below the engine's makes every copy look longer than it is, so the next
    // one is issued late, the engine idles, and no back-to-back copies teach the real rate.
    // Copies so small that the host's cost of issuing them exceeds their time leave the lane
    // dry whatever the rate says; doubling on those drove the assumption to its ceiling and then
    // issued max_issued_per_direction large copies at once, ahead of any urgent one.
    if (l.rate.samples() == 0 && l.bytes_per_second > 0 && l.held_by_rate) {
      l.bytes_per_second = std::min(2 * l.bytes_per_second, kMaxAssumedBytesPerSecond);
    }
  } else {
    l.ahead_seconds = std::max(options_.issue_ahead_seconds, 0.99 * l.ahead_seconds);
  }
  // Re-predict what is still issued from this end.
  double prev = end;
  for (Issued& i : l.issued) {  // no rate yet: due now (queried until done)
    i.predicted_end = std::max(i.issued_at, prev) +
                      (l.bytes_per_second > 0 ? i.bytes / l.bytes_per_second : 0);
    prev = i.predicted_end;
  }
  l.free_at = prev;
  c.done(std::move(c.after_issue_status));
  c.gate.reset();  // after done: the transfer's owner drops its order only after that
}

bool DeviceWorker::MayIssueMore(Lane& l) {
  if (l.issued.empty()) return true;
  if (l.issued.size() >= options_.max_issued_per_direction) return false;
  if (l.bytes_per_second == 0) return l.issued.size() < 2;
  if (l.free_at - Now() > l.ahead_seconds) {
    l.held_by_rate = true;
    return false;
  }
  return true;
}

bool DeviceWorker::TakeFrom(Lane& l, std::deque<Copy>& q, Copy* out) {
  for (auto it = q.begin(); it != q.end();) {
    IssueGate* g = it->gate.get();
    if (g == nullptr || g->ready_) {
      *out = std::move(*it);
      q.erase(it);
      return true;
    }
    if (g->asked_in_pass_ == pass_) {  // said "not yet" in this pass already
      ++it;
      continue;
    }
    absl::StatusOr<bool> ready = g->Ready();
    if (!ready.ok()) {
      Copy failed = std::move(*it);
      it = q.erase(it);
      failed.done(ready.status());
      continue;
    }
    if (*ready) {
      g->ready_ = true;
      continue;  // taken on the next iteration
    }
    const double now = Now();
    g->asked_in_pass_ = pass_;
    if (g->waiting_since_ < 0) g->waiting_since_ = now;
    l.gated_since = l.gated ? std::min(l.gated_since, g->waiting_since_) : g->waiting_since_;
    l.gated = true;
    ++it;
  }
  return false;
}

bool DeviceWorker::TakeIssuable(Lane& l, Copy* out) {
  return TakeFrom(l, l.urgent, out) || TakeFrom(l, l.normal, out);
}

void DeviceWorker::Issue(Lane& l) {
  l.held_by_rate = false;
  l.gated = false;
  ++pass_;
  while ((!l.urgent.empty() || !l.normal.empty()) && MayIssueMore(l)) {
    Copy c;
    if (!TakeIssuable(l, &c)) return;
    IssueOne(l, std::move(c));
  }
}

void DeviceWorker::IssueOne(Lane& l, Copy c) {
  int index = c.gate != nullptr ? c.gate->stream_ : -1;
  if (index < 0) {
    index = static_cast<int>(l.next_stream++ % l.streams.size());
    if (c.gate != nullptr) c.gate->stream_ = index;
  }
  void* stream = l.streams[index];
  const double issued_at = Now();
  // A failed issue may have put part of the copy on the stream (a chunk across two pieces of
  // the host pool is one cudaMemcpyAsync per piece): it too ends behind its completion event,
  // with its error, so its gate (the transfer's mapping) and the host range stay held until
  // what was queued has run.
  const absl::Status issue_status = c.issue(stream);
  void* event = nullptr;
  if (!free_events_.empty()) {
    event = free_events_.back();
    free_events_.pop_back();
  } else {
    auto e = api_->CreateEvent();
    if (!e.ok()) return c.done(issue_status.ok() ? e.status() : issue_status);
    event = *e;
  }
  absl::Status st = api_->EventRecord(event, stream);
  if (!st.ok()) {
    free_events_.push_back(event);
    return c.done(issue_status.ok() ? st : issue_status);
  }
  absl::Status after = !issue_status.ok() ? issue_status
                       : c.after_issue    ? c.after_issue(stream)
                                          : absl::OkStatus();
  // A failed copy's bytes did not all move: it teaches the lane no rate (Complete).
  const uint64_t bytes = issue_status.ok() ? c.bytes : 0;
  if (l.issued.empty()) l.free_at = std::max(l.free_at, issued_at);
  const double predicted_end =
      std::max(l.free_at, issued_at) + (l.bytes_per_second > 0 ? bytes / l.bytes_per_second : 0);
  l.free_at = predicted_end;
  l.issued.push_back(Issued{event, bytes, std::move(c.done), issued_at, predicted_end, issued_at,
                            Now(), std::move(after), std::move(c.gate)});
}

double DeviceWorker::GateWakeSeconds(const Lane& l, double now) const {
  if (!l.gated) return kNever;
  const double waited = std::max(0.0, now - l.gated_since);
  return now + std::clamp(waited / 16, options_.gate_poll_seconds,
                          std::max(options_.gate_poll_seconds, options_.max_gate_poll_seconds));
}

double DeviceWorker::NextWakeSeconds(double now) const {
  double wake = kNever;
  for (const Lane& l : lanes_) {
    wake = std::min(wake, GateWakeSeconds(l, now));
    if (l.issued.empty()) continue;  // (queued copies are issued at once when nothing is)
    for (const Issued& i : l.issued) {
      // Past its prediction (or no rate yet): query continuously for a while, then back off.
      double at = i.predicted_end - kWakeEarlySeconds;
      if (now >= at) {
        const double late = now - std::max(i.predicted_end, i.issued_at);
        at = late < kSpinSeconds ? now : now + kBackoffSeconds;
      }
      wake = std::min(wake, at);
    }
    if (!l.urgent.empty() || !l.normal.empty()) {
      wake = std::min(wake, std::max(now, l.free_at - l.ahead_seconds));
    }
  }
  return wake;
}

DeviceWorker::LaneStats DeviceWorker::lane_stats(Direction direction) {
  base::MutexLock lock(mu_);
  return lane_stats_[static_cast<int>(direction)];
}

bool DeviceWorker::Post(std::function<void()> task) {
  bool notify;
  {
    base::MutexLock lock(mu_);
    if (!running_ || stopping_) return false;
    tasks_.push_back(std::move(task));
    notify = sleeping_;
  }
  if (notify) cv_.notify_all();
  return true;
}

absl::Status DeviceWorker::Run(const std::function<absl::Status()>& fn) {
  if (OnThread()) return fn();
  std::promise<absl::Status> done;
  std::future<absl::Status> f = done.get_future();
  if (!Post([&] { done.set_value(fn()); })) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the daemon's worker for %s has stopped", device_.uuid));
  }
  return f.get();
}

bool DeviceWorker::IssueAsync(Direction direction, uint64_t bytes, bool urgent,
                              std::function<absl::Status(void*)> issue,
                              std::function<void(absl::Status)> done) {
  CopyRequest r;
  r.direction = direction;
  r.bytes = bytes;
  r.urgent = urgent;
  r.issue = std::move(issue);
  r.done = std::move(done);
  return Submit(std::move(r));
}

bool DeviceWorker::Submit(CopyRequest r) {
  Incoming in{r.direction, r.urgent,
              Copy{r.bytes, std::move(r.issue), std::move(r.done), std::move(r.gate),
                   std::move(r.after_issue)}};
  if (OnThread()) {  // from a completion callback: no hand-off; the loop issues it
    Enqueue(std::move(in));
    return true;
  }
  bool notify;
  {
    base::MutexLock lock(mu_);
    if (!running_ || stopping_) return false;
    incoming_.push_back(std::move(in));
    notify = sleeping_;
  }
  if (notify) cv_.notify_all();
  return true;
}

absl::Status DeviceWorker::SubmitAndWait(CopyRequest r) {
  if (OnThread()) {
    return absl::InternalError("SubmitAndWait called on the device thread (would deadlock)");
  }
  auto done = std::make_shared<std::promise<absl::Status>>();
  std::future<absl::Status> f = done->get_future();
  r.done = [done](absl::Status st) { done->set_value(std::move(st)); };
  if (!Submit(std::move(r))) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the daemon's worker for %s has stopped", device_.uuid));
  }
  return f.get();
}

absl::Status DeviceWorker::IssueAndWait(Direction direction, uint64_t bytes,
                                        const std::function<absl::Status(void*)>& issue) {
  if (OnThread()) {
    return absl::InternalError("IssueAndWait called on the device thread (would deadlock)");
  }
  std::promise<absl::Status> done;
  std::future<absl::Status> f = done.get_future();
  // `issue` outlives the call: this frame waits for `done`.
  if (!IssueAsync(
          direction, bytes, /*urgent=*/false, [&issue](void* stream) { return issue(stream); },
          [&done](absl::Status st) { done.set_value(std::move(st)); })) {
    return absl::FailedPreconditionError(
        absl::StrFormat("the daemon's worker for %s has stopped", device_.uuid));
  }
  return f.get();
}

}  // namespace offloadd::copy
