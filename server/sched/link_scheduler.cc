#include "server/sched/link_scheduler.h"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/base/clock.h"
#include "server/sched/drr.h"
#include "server/sched/host_link.h"

namespace offloadd::sched {

const char* TrafficClassName(TrafficClass c) {
  switch (c) {
    case TrafficClass::kUrgent:
      return "urgent";
    case TrafficClass::kPrefetch:
      return "prefetch";
    case TrafficClass::kOffload:
      return "offload";
  }
  return "unknown";
}

namespace {

class RealClock : public Clock {
 public:
  double NowSeconds() override { return base::SteadyNowSeconds(); }
  void SleepUntil(double t) override { base::SleepUntilSteadySeconds(t); }
};

// Pacing keeps a work-conserving virtual clock: while work has been queued since the link's
// last virtual finish, the next chunk starts at that finish even if the worker woke up late (a
// simulated link must not lose capacity to thread scheduling on a busy machine); after an idle
// gap it starts when the work arrived. A late worker catches up by at most this much, so over
// any interval T the link moves at most rate x (T + kMaxCatchUpSeconds) bytes plus one chunk.
constexpr double kMaxCatchUpSeconds = 0.02;

}  // namespace

Clock* Clock::Real() {
  static RealClock* clock = new RealClock();
  return clock;
}

struct LinkScheduler::Impl {
  struct Active {
    std::shared_ptr<Transfer> transfer;
    absl::Status status;  // first chunk error
    uint32_t chunks_in_flight = 0;
    bool all_popped = false;  // no chunk of it remains queued (popped or cancelled)
    double submit_seconds = 0;
  };

  Impl(LinkSchedulerOptions opts, Clock* c)
      : options(std::move(opts)), clock(c), queue(ChunkQueueOptions::From(options)) {}

  // A transfer whose last chunk has finished, taken out of `active`.
  struct Finished {
    std::shared_ptr<Transfer> transfer;
    absl::Status status;
  };

  void WorkerLoop();
  // Called with `mu` held: accounts a copied chunk (consumed, so its reference to the transfer
  // is gone on return). Returns true when it was the transfer's last: `finished` then holds the
  // transfer, taken out of `active`, for Complete.
  bool FinishChunk(Chunk chunk, absl::Status status, Finished* finished);
  // Called without `mu` held: runs `done` and drops the transfer. The transfer's callbacks may
  // hold the last reference to a Session or a Region, whose destructors may block (closing a
  // CUDA IPC handle on the device thread); they must not run while the link's workers wait for
  // `mu`.
  static void Complete(Finished finished);

  const LinkSchedulerOptions options;
  Clock* const clock;

  mutable std::mutex mu;
  std::condition_variable cv;
  ChunkQueue queue;
  std::unordered_map<uint64_t, Active> active;
  bool stopping = false;
  double link_free_at_seconds = 0;  // virtual finish of the last paced chunk
  double busy_since_seconds = 0;
  bool parent_turn_pending = false;  // a worker is waiting for a turn at options.parent
  double backlog_since_seconds = 0;  // when work last arrived to an empty queue
  LinkSchedulerStats stats;

  std::mutex join_mu;  // serializes Shutdown's joins
  std::vector<std::thread> workers;
};

void LinkScheduler::Impl::WorkerLoop() {
  const double rate = options.bytes_per_second;
  HostLink* const parent = options.parent;
  std::unique_lock<std::mutex> lock(mu);
  for (;;) {
    // With a parent, one worker at a time waits there for a turn; the others wait here.
    cv.wait(lock, [&] {
      return (!queue.empty() && !parent_turn_pending) || (stopping && queue.empty());
    });
    if (queue.empty()) return;  // stopping, and everything queued has been handed out
    double start = 0;
    if (rate > 0) {
      const double now = clock->NowSeconds();
      if (now < link_free_at_seconds) {
        // The link is still busy: decide which chunk goes next only when it frees up, so a
        // reload queued in the meantime is not stuck behind a chunk picked too early.
        const double t = link_free_at_seconds;
        lock.unlock();
        clock->SleepUntil(t);
        lock.lock();
        continue;
      }
      start = std::max({link_free_at_seconds, backlog_since_seconds, now - kMaxCatchUpSeconds});
    }
    if (parent != nullptr) {
      parent_turn_pending = true;
      lock.unlock();
      const double parent_start = parent->WaitTurn(options.link_name);
      lock.lock();
      parent_turn_pending = false;
      cv.notify_all();
      if (queue.empty()) {  // cancelled meanwhile: give the turn back unused
        parent->Commit(options.link_name, 0);
        continue;
      }
      // Waiting for the turn may have left this link idle: it starts with the turn.
      start = std::max(start, parent_start);
    } else if (rate <= 0) {
      start = clock->NowSeconds();
    }
    Chunk chunk = *queue.Pop();
    Active& a = active.at(chunk.transfer_id);
    ++a.chunks_in_flight;
    if (chunk.last) a.all_popped = true;
    if (stats.chunks_in_flight++ == 0) busy_since_seconds = clock->NowSeconds();
    double finish_seconds = 0;
    if (rate > 0) {
      finish_seconds = start + static_cast<double>(chunk.len) / rate;
      link_free_at_seconds = finish_seconds;
    }
    // Lock order: this link's mu, then the parent's (the parent never calls back).
    if (parent != nullptr) {
      finish_seconds = std::max(finish_seconds, parent->Commit(options.link_name, chunk.len));
    }
    std::function<void(TrafficClass, double)> report;
    double wait_seconds = 0;
    if (chunk.offset == 0) {  // the transfer's first chunk
      const int c = static_cast<int>(chunk.transfer->cls);
      wait_seconds = std::max(0.0, start - a.submit_seconds);
      ++stats.started_transfers[c];
      stats.queue_wait_seconds_sum[c] += wait_seconds;
      stats.queue_wait_seconds_max[c] = std::max(stats.queue_wait_seconds_max[c], wait_seconds);
      report = options.on_queue_wait;
    }
    lock.unlock();
    if (report) report(chunk.transfer->cls, wait_seconds);
    absl::Status status = chunk.transfer->copy_chunk(chunk.offset, chunk.len);
    if (finish_seconds > 0) clock->SleepUntil(finish_seconds);
    lock.lock();
    Finished finished;
    if (FinishChunk(std::move(chunk), std::move(status), &finished)) {
      lock.unlock();
      Complete(std::move(finished));  // leaves `finished` empty
      lock.lock();
    }
  }
}

bool LinkScheduler::Impl::FinishChunk(Chunk chunk, absl::Status status, Finished* finished) {
  if (--stats.chunks_in_flight == 0) {
    stats.busy_seconds += clock->NowSeconds() - busy_since_seconds;
  }
  auto it = active.find(chunk.transfer_id);
  Active& a = it->second;
  --a.chunks_in_flight;
  if (status.ok()) {
    stats.bytes += chunk.len;
    stats.gpu_bytes[chunk.transfer->gpu] += chunk.len;
    stats.class_bytes[static_cast<int>(chunk.transfer->cls)] += chunk.len;
  } else if (a.status.ok()) {
    a.status = std::move(status);
    if (!a.all_popped) {
      queue.Cancel(chunk.transfer_id);  // skip the remaining chunks
      a.all_popped = true;
    }
  }
  // Not the last chunk: `active` still holds the transfer, so dropping the chunk's reference
  // here (with mu held) destroys nothing.
  if (!a.all_popped || a.chunks_in_flight > 0) return false;
  finished->transfer = std::move(a.transfer);
  finished->status = std::move(a.status);
  active.erase(it);
  const Transfer& t = *finished->transfer;
  if (finished->status.ok() && t.deadline_seconds > 0 && clock->NowSeconds() > t.deadline_seconds) {
    ++stats.gpu_deadline_misses[t.gpu];
  }
  return true;
}

void LinkScheduler::Impl::Complete(Finished finished) {
  if (finished.transfer->done) finished.transfer->done(std::move(finished.status));
  // `finished` (possibly the transfer's last reference) dies here, still without mu.
}

LinkScheduler::LinkScheduler(LinkSchedulerOptions options, Clock* clock)
    : impl_(std::make_unique<Impl>(std::move(options), clock)) {
  const uint32_t n = std::max<uint32_t>(1, impl_->options.worker_threads);
  impl_->workers.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    impl_->workers.emplace_back([this] { impl_->WorkerLoop(); });
  }
}

LinkScheduler::~LinkScheduler() { Shutdown(); }

void LinkScheduler::Submit(std::shared_ptr<Transfer> transfer) {
  if (transfer == nullptr) return;
  absl::Status error;
  if (transfer->copy_chunk == nullptr) {
    error = absl::InvalidArgumentError("transfer has no copy_chunk function");
  }
  std::unique_lock<std::mutex> lock(impl_->mu);
  if (error.ok() && impl_->stopping) {
    error = absl::UnavailableError(absl::StrCat("link ", impl_->options.link_name, " ",
                                                impl_->options.direction,
                                                " is shutting down; the daemon is stopping"));
  }
  if (error.ok()) {
    const bool was_empty = impl_->queue.empty();
    absl::StatusOr<uint64_t> id = impl_->queue.Push(transfer);
    if (id.ok() && was_empty) impl_->backlog_since_seconds = impl_->clock->NowSeconds();
    if (id.ok()) {
      Impl::Active& a = impl_->active[*id];
      a.transfer = std::move(transfer);
      a.submit_seconds = impl_->clock->NowSeconds();
      lock.unlock();
      impl_->cv.notify_one();
      return;
    }
    error = id.status();
  }
  lock.unlock();
  if (transfer->done) transfer->done(std::move(error));
}

size_t LinkScheduler::CancelOwner(uint64_t owner_id, const absl::Status& status) {
  if (owner_id == 0) return 0;
  std::vector<std::shared_ptr<Transfer>> finished;
  size_t cancelled = 0;
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    for (auto it = impl_->active.begin(); it != impl_->active.end();) {
      Impl::Active& a = it->second;
      if (a.transfer == nullptr || a.transfer->owner_id != owner_id || a.all_popped) {
        ++it;
        continue;
      }
      impl_->queue.Cancel(it->first);
      a.all_popped = true;
      if (a.status.ok()) a.status = status;
      ++cancelled;
      if (a.chunks_in_flight > 0) {  // FinishChunk calls done when they return
        ++it;
        continue;
      }
      finished.push_back(std::move(a.transfer));
      it = impl_->active.erase(it);
    }
  }
  impl_->cv.notify_all();  // workers waiting on an emptied queue re-check it
  for (auto& t : finished) {
    if (t->done) t->done(status);
  }
  return cancelled;
}

void LinkScheduler::Shutdown() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  std::lock_guard<std::mutex> join_lock(impl_->join_mu);
  for (std::thread& t : impl_->workers) {
    if (t.joinable()) t.join();
  }
}

LinkSchedulerStats LinkScheduler::stats() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  LinkSchedulerStats s = impl_->stats;
  s.queued_transfers = impl_->queue.queued_transfers();
  if (s.chunks_in_flight > 0) {
    s.busy_seconds += impl_->clock->NowSeconds() - impl_->busy_since_seconds;
  }
  return s;
}

const LinkSchedulerOptions& LinkScheduler::options() const { return impl_->options; }

bool LinkScheduler::MutexHeldForTesting() const {
  bool held = false;
  std::thread([&] {
    if (impl_->mu.try_lock()) {
      impl_->mu.unlock();
    } else {
      held = true;
    }
  }).join();
  return held;
}

}  // namespace offloadd::sched
