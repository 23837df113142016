#include "server/sched/link_scheduler.h"

#include <algorithm>
#include <deque>
#include <optional>
#include <thread>
#include <unordered_map>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
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
    case TrafficClass::kProjector:
      return "projector";
  }
  return "unknown";
}

namespace {


// Pacing keeps a work-conserving virtual clock: while work has been queued since the link's
// last virtual finish, the next chunk starts at that finish even if the worker woke up late (a
// simulated link must not lose capacity to thread scheduling on a busy machine); after an idle
// gap it starts when the work arrived. A late worker catches up by at most this much, so over
// any interval T the link moves at most rate x (T + kMaxCatchUpSeconds) bytes plus one chunk.
constexpr double kMaxCatchUpSeconds = 0.02;

// Set while a thread posts chunks outside a worker (PostWhilePossible, from Submit or from an
// engine's completion): a completion reported inline from one of those posts is left to a
// worker, so posts never recurse.
thread_local bool posting_from_completion = false;
// Set while a small transfer copied on the submitting thread runs its `done`: a Submit from
// there queues instead (an admitted offload's Submit may come from a reload's `done`).
thread_local bool in_inline_done = false;

}  // namespace

struct LinkScheduler::Impl {
  struct Active {
    std::shared_ptr<Transfer> transfer;
    absl::Status status;  // first chunk error
    uint32_t chunks_in_flight = 0;
    bool all_popped = false;  // no chunk of it remains queued (popped or cancelled)
    double submit_seconds = 0;
    uint32_t posted = 0;  // chunks posted, not yet reported by the engine
    bool waiting_for_producer = false;  // SetWaitingForProducer: parked, posted ones uncounted
  };

  Impl(LinkSchedulerOptions opts, Clock* c)
      : options(std::move(opts)), clock(c), queue(ChunkQueueOptions::From(options)) {}

  // A transfer whose last chunk has finished, taken out of `active`.
  struct Finished {
    std::shared_ptr<Transfer> transfer;
    absl::Status status;
  };

  void WorkerLoop() EXCLUDES(mu);
  // Called with `mu` held: accounts a copied chunk (consumed, so its reference to the transfer
  // is gone on return). Returns true when it was the transfer's last: `finished` then holds the
  // transfer, taken out of `active`, for Complete.
  bool FinishChunk(Chunk chunk, absl::Status status, Finished* finished) REQUIRES(mu);
  // Called without `mu` held: runs `done` and drops the transfer. The transfer's callbacks may
  // hold the last reference to a Session or a Region, whose destructors may block (closing a
  // CUDA IPC handle on the device thread); they must not run while the link's workers wait for
  // `mu`, nor on an engine's thread.
  static void Complete(Finished finished);
  // Posted chunks (post_chunk transfers). Called with `mu` held. An URGENT chunk is never held
  // back by its GPU's limit: it is one chunk, and the engine serves it ahead of queued ones.
  // Chunks of a transfer waiting for its producer hold no slot (SetWaitingForProducer).
  bool MayPost(TrafficClass cls, const std::string& gpu) const REQUIRES(mu) {
    if (cls == TrafficClass::kUrgent) return true;
    auto it = posted_per_gpu.find(gpu);
    if (it == posted_per_gpu.end()) return true;
    auto waiting = waiting_posted_per_gpu.find(gpu);
    const uint32_t held =
        it->second - (waiting == waiting_posted_per_gpu.end() ? 0 : waiting->second);
    return held < max_posted_per_gpu;
  }
  // Moves `a`'s posted chunks in or out of its GPU's waiting count and parks or unparks its
  // queued chunks. Called with `mu` held.
  void MarkWaiting(uint64_t id, Active& a, bool waiting) REQUIRES(mu);
  bool CanPick() const REQUIRES(mu) { return !queue.empty() && queue.HasEligible(below_limit); }
  // Whether a completion may pick and post the next chunks itself, on the engine's thread that
  // reported it (no hand-off to a worker per chunk): the link is unpaced and has no parent (both
  // make a worker wait), and every transfer in it posts (copy_chunk blocks).
  bool CompletionMayPick() const REQUIRES(mu) {
    return bytes_per_second <= 0 && options.parent == nullptr && blocking_transfers == 0;
  }
  // A chunk taken off the queue and accounted as started, for the caller to post or copy once
  // it has released `mu`.
  struct Started {
    Chunk chunk;
    std::function<void(TrafficClass, double)> report;  // the first chunk's queue wait
    TrafficClass cls = TrafficClass::kOffload;  // read under `mu` (PromoteOwner changes it)
    double wait_seconds = 0;
    double finish_seconds = 0;  // paced finish; 0 = none
    uint64_t post_id = 0;       // post_chunk transfers
  };
  // Called with `mu` held and CanPick(): pops the next chunk, started at `start`.
  Started StartNext(double start) REQUIRES(mu);
  // Called without `mu` held: posts a started chunk of a post_chunk transfer.
  void Post(Started started) EXCLUDES(mu);
  // The engine's callback for post id `id`. Finishes the chunk and posts the next ones right
  // there when CompletionMayPick(), else queues the completion for a worker.
  void OnPosted(uint64_t id, absl::Status status) EXCLUDES(mu);
  // Called with `mu` held (released while posting): while CompletionMayPick(), posts every
  // chunk that may go now, on this thread.
  void PostWhilePossible() REQUIRES(mu);
  // Called with `mu` held (released while copying) and CanPick(), right after a small
  // copy_chunk transfer was queued alone: copies its one chunk on this thread. Returns true when
  // it was the transfer's last: the caller releases `mu` and runs Complete(*finished).
  bool CopyHere(Finished* finished) REQUIRES(mu);
  // WorkerLoop's steps, called with `mu` held (they release and retake it while they wait or
  // copy). Finishes one transfer finished on an engine thread, or one completed asynchronous
  // chunk; false when there is none.
  bool FinishOneCompletion() REQUIRES(mu);
  // With CanPick() and no parent turn pending: when the next chunk starts (paced links wait for
  // the link to free up; links under a host link take a turn there), or nullopt when the worker
  // waited and must look again (the link was busy, or the turn went back unused).
  std::optional<double> NextChunkStart() REQUIRES(mu);
  // Posts or copies a chunk StartNext returned, then finishes it when copied here.
  void RunStarted(Started started) REQUIRES(mu);

  const LinkSchedulerOptions options;
  Clock* const clock;

  mutable base::Mutex mu;
  base::CondVar cv;
  ChunkQueue queue GUARDED_BY(mu);
  double bytes_per_second GUARDED_BY(mu) = options.bytes_per_second;  // SetBytesPerSecond
  std::unordered_map<uint64_t, Active> active GUARDED_BY(mu);
  bool stopping GUARDED_BY(mu) = false;
  double link_free_at_seconds GUARDED_BY(mu) = 0;  // virtual finish of the last paced chunk
  double busy_since_seconds GUARDED_BY(mu) = 0;
  bool parent_turn_pending GUARDED_BY(mu) = false;  // a worker waits for a turn at options.parent
  double backlog_since_seconds GUARDED_BY(mu) = 0;  // when work last arrived to an empty queue
  LinkSchedulerStats stats GUARDED_BY(mu);

  // Asynchronous chunks: posted and not yet finished, and completions waiting for a worker.
  const uint32_t max_posted_per_gpu = std::max<uint32_t>(1, options.max_chunks_in_flight_per_gpu);
  // Called by `queue` (with mu held) as it picks.
  const ChunkQueue::GpuFilter below_limit = [this](TrafficClass cls, const std::string& gpu)
                                                REQUIRES(mu) { return MayPost(cls, gpu); };
  std::unordered_map<std::string, uint32_t> posted_per_gpu GUARDED_BY(mu);
  // Of those, the chunks of transfers waiting for their producer (they hold no slot).
  std::unordered_map<std::string, uint32_t> waiting_posted_per_gpu GUARDED_BY(mu);
  std::unordered_map<uint64_t, Chunk> posted GUARDED_BY(mu);  // by post id
  uint64_t next_post_id GUARDED_BY(mu) = 1;
  std::deque<std::pair<Chunk, absl::Status>> completed GUARDED_BY(mu);  // for a worker to finish
  // Finished on an engine thread: `done` for a worker.
  std::deque<Finished> finished_transfers GUARDED_BY(mu);
  uint64_t blocking_transfers GUARDED_BY(mu) = 0;  // in `active` without post_chunk

  base::Mutex join_mu;  // serializes Shutdown's joins
  std::vector<std::thread> workers GUARDED_BY(join_mu);
};

void LinkScheduler::Impl::WorkerLoop() {
  base::MutexLock lock(mu);
  for (;;) {
    // With a parent, one worker at a time waits there for a turn; the others wait here.
    const auto all_done = [&]() REQUIRES(mu) {
      return stopping && queue.empty() && posted.empty() && completed.empty() &&
             finished_transfers.empty();
    };
    const auto has_work = [&]() REQUIRES(mu) {
      return !completed.empty() || !finished_transfers.empty() ||
             (CanPick() && !parent_turn_pending) || all_done();
    };
    while (!has_work()) {
      cv.Wait(mu);
      ++stats.worker_wakeups;
    }
    if (FinishOneCompletion()) continue;
    if (!CanPick() || parent_turn_pending) {
      if (all_done()) return;  // stopping, everything handed out and completed
      continue;
    }
    const std::optional<double> start = NextChunkStart();
    if (!start.has_value()) continue;
    Started started = StartNext(*start);
    // A Submit wakes one worker; when more chunks can be picked (the rest of a multi-chunk
    // transfer, another GPU's), the next worker takes one while this one copies. A chunk that
    // is posted returns at once, and this worker picks the next itself.
    if (!started.chunk.transfer->post_chunk && CanPick()) cv.notify_one();
    RunStarted(std::move(started));
  }
}

bool LinkScheduler::Impl::FinishOneCompletion() {
  if (!finished_transfers.empty()) {  // its last chunk finished on an engine thread
    Finished finished = std::move(finished_transfers.front());
    finished_transfers.pop_front();
    mu.Unlock();
    Complete(std::move(finished));
    mu.Lock();
    return true;
  }
  if (completed.empty()) return false;
  // An asynchronous chunk completed: finish it.
  auto [done_chunk, done_status] = std::move(completed.front());
  completed.pop_front();
  Finished finished;
  const bool last = FinishChunk(std::move(done_chunk), std::move(done_status), &finished);
  cv.notify_all();  // its GPU may take another chunk; Shutdown may be waiting on it
  if (last) {
    mu.Unlock();
    Complete(std::move(finished));  // leaves `finished` empty
    mu.Lock();
  }
  return true;
}

std::optional<double> LinkScheduler::Impl::NextChunkStart() {
  const double rate = bytes_per_second;
  HostLink* const parent = options.parent;
  double start = 0;
  if (rate > 0) {
    const double now = clock->NowSeconds();
    if (now < link_free_at_seconds) {
      // The link is still busy: decide which chunk goes next only when it frees up, so a
      // reload queued in the meantime is not stuck behind a chunk picked too early.
      const double t = link_free_at_seconds;
      mu.Unlock();
      clock->SleepUntil(t);
      mu.Lock();
      return std::nullopt;
    }
    start = std::max({link_free_at_seconds, backlog_since_seconds, now - kMaxCatchUpSeconds});
  }
  if (parent != nullptr) {
    parent_turn_pending = true;
    mu.Unlock();
    const double parent_start = parent->WaitTurn(options.link_name);
    mu.Lock();
    parent_turn_pending = false;
    cv.notify_all();
    if (!CanPick()) {  // cancelled meanwhile, or its GPUs at their limit: turn back unused
      parent->Commit(options.link_name, 0);
      return std::nullopt;
    }
    // Waiting for the turn may have left this link idle: it starts with the turn.
    start = std::max(start, parent_start);
  } else if (rate <= 0) {
    start = clock->NowSeconds();
  }
  return start;
}

void LinkScheduler::Impl::RunStarted(Started started) {
  mu.Unlock();
  if (started.chunk.transfer->post_chunk) {
    Post(std::move(started));
    mu.Lock();
    return;
  }
  Chunk& chunk = started.chunk;
  if (started.report) started.report(started.cls, started.wait_seconds);
  absl::Status status = chunk.transfer->copy_chunk(chunk.offset, chunk.len);
  if (started.finish_seconds > 0) clock->SleepUntil(started.finish_seconds);
  mu.Lock();
  Finished finished;
  if (FinishChunk(std::move(chunk), std::move(status), &finished)) {
    mu.Unlock();
    Complete(std::move(finished));  // leaves `finished` empty
    mu.Lock();
  }
}

LinkScheduler::Impl::Started LinkScheduler::Impl::StartNext(double start) {
  const double rate = bytes_per_second;
  Started s;
  s.chunk = *queue.Pop(below_limit);
  Chunk& chunk = s.chunk;
  s.cls = chunk.transfer->cls;
  Active& a = active.at(chunk.transfer_id);
  ++a.chunks_in_flight;
  if (chunk.last) a.all_popped = true;
  if (stats.chunks_in_flight++ == 0) busy_since_seconds = clock->NowSeconds();
  if (rate > 0) {
    s.finish_seconds = start + static_cast<double>(chunk.len) / rate;
    link_free_at_seconds = s.finish_seconds;
  }
  // Lock order: this link's mu, then the parent's (the parent never calls back).
  if (options.parent != nullptr) {
    s.finish_seconds =
        std::max(s.finish_seconds, options.parent->Commit(options.link_name, chunk.len));
  }
  if (chunk.offset == 0) {  // the transfer's first chunk
    const int c = static_cast<int>(chunk.transfer->cls);
    s.wait_seconds = std::max(0.0, start - a.submit_seconds);
    ++stats.started_transfers[c];
    stats.queue_wait_seconds_sum[c] += s.wait_seconds;
    stats.queue_wait_seconds_max[c] = std::max(stats.queue_wait_seconds_max[c], s.wait_seconds);
    s.report = options.on_queue_wait;
  }
  if (chunk.transfer->post_chunk) {
    ++posted_per_gpu[chunk.transfer->gpu];
    ++a.posted;
    if (a.waiting_for_producer) ++waiting_posted_per_gpu[chunk.transfer->gpu];
    s.post_id = next_post_id++;
    posted[s.post_id] = chunk;  // `active` holds the transfer too: this copy destroys nothing
  }
  return s;
}

void LinkScheduler::Impl::Post(Started started) {
  Chunk& chunk = started.chunk;
  if (started.report) started.report(started.cls, started.wait_seconds);
  chunk.transfer->post_chunk(
      chunk.offset, chunk.len,
      [this, id = started.post_id](absl::Status st) { OnPosted(id, std::move(st)); });
  chunk.transfer.reset();  // not under the lock (see Complete)
}

bool LinkScheduler::Impl::CopyHere(Finished* finished) {
  Started started = StartNext(clock->NowSeconds());
  mu.Unlock();
  Chunk& chunk = started.chunk;
  if (started.report) started.report(started.cls, started.wait_seconds);
  absl::Status status = chunk.transfer->copy_chunk(chunk.offset, chunk.len);
  mu.Lock();
  const bool last = FinishChunk(std::move(chunk), std::move(status), finished);
  // Wake the workers only when one may have something to do: chunks queued meanwhile (their
  // Submit woke one already, but the copied chunk may have held a GPU's turn) or Shutdown.
  // Waking them after every small copy cost two thread switches per request.
  if (!queue.empty() || stopping) cv.notify_all();
  return last;
}

void LinkScheduler::Impl::PostWhilePossible() {
  posting_from_completion = true;
  while (CompletionMayPick() && CanPick()) {
    Started started = StartNext(clock->NowSeconds());
    mu.Unlock();
    Post(std::move(started));
    mu.Lock();
  }
  posting_from_completion = false;
}

void LinkScheduler::Impl::OnPosted(uint64_t id, absl::Status status) {
  base::MutexLock lock(mu);
  auto it = posted.find(id);
  Chunk chunk = std::move(it->second);
  posted.erase(it);
  auto per_gpu = posted_per_gpu.find(chunk.transfer->gpu);
  if (--per_gpu->second == 0) posted_per_gpu.erase(per_gpu);
  Active& a = active.at(chunk.transfer_id);  // its FinishChunk has not run yet
  --a.posted;
  if (a.waiting_for_producer) {
    auto waiting = waiting_posted_per_gpu.find(chunk.transfer->gpu);
    if (--waiting->second == 0) waiting_posted_per_gpu.erase(waiting);
  }
  if (posting_from_completion || !CompletionMayPick()) {
    completed.emplace_back(std::move(chunk), std::move(status));
    // Under the lock: once it is released, Shutdown may finish and the scheduler go.
    cv.notify_all();  // a worker finishes it; its GPU may take another chunk
    return;
  }
  Finished finished;
  bool wake_worker = false;
  if (FinishChunk(std::move(chunk), std::move(status), &finished)) {
    finished_transfers.push_back(std::move(finished));  // `done` may block: not on this thread
    wake_worker = true;
  }
  PostWhilePossible();
  // Under the lock: once it is released, Shutdown may finish and the scheduler go.
  if (stopping) {
    cv.notify_all();  // Shutdown's workers wait for the last posted chunk
  } else if (wake_worker) {
    cv.notify_one();
  }
}

void LinkScheduler::Impl::MarkWaiting(uint64_t id, Active& a, bool waiting) {
  a.waiting_for_producer = waiting;
  const std::string& gpu = a.transfer->gpu;
  if (waiting) {
    if (a.posted > 0) waiting_posted_per_gpu[gpu] += a.posted;
    if (!a.all_popped) queue.Park(id);
    ++stats.producer_waits;
    return;
  }
  auto it = waiting_posted_per_gpu.find(gpu);
  if (it != waiting_posted_per_gpu.end()) {
    it->second -= a.posted;
    if (it->second == 0) waiting_posted_per_gpu.erase(it);
  }
  if (!a.all_popped) queue.Unpark(id);
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
  if (!a.transfer->post_chunk) --blocking_transfers;
  finished->transfer = std::move(a.transfer);
  finished->status = std::move(a.status);
  active.erase(it);
  const Transfer& t = *finished->transfer;
  if (finished->status.ok() && t.deadline_at_seconds > 0 &&
      clock->NowSeconds() > t.deadline_at_seconds) {
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
  base::MutexLock join_lock(impl_->join_mu);
  impl_->workers.reserve(n);
  for (uint32_t i = 0; i < n; ++i) {
    impl_->workers.emplace_back([this] { impl_->WorkerLoop(); });
  }
}

LinkScheduler::~LinkScheduler() { Shutdown(); }

void LinkScheduler::Submit(std::shared_ptr<Transfer> transfer) {
  if (transfer == nullptr) return;
  absl::Status error;
  if (transfer->copy_chunk == nullptr && transfer->post_chunk == nullptr) {
    error = absl::InvalidArgumentError("transfer has neither copy_chunk nor post_chunk");
  }
  base::MutexLock lock(impl_->mu);
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
      if (!transfer->post_chunk) ++impl_->blocking_transfers;
      a.transfer = std::move(transfer);
      a.submit_seconds = impl_->clock->NowSeconds();
      if (impl_->CompletionMayPick() && !posting_from_completion) {
        // Posting does not block: post from here rather than wake a worker to do it.
        impl_->PostWhilePossible();
        return;
      }
      const LinkSchedulerOptions& o = impl_->options;
      if (was_empty && !a.transfer->post_chunk && a.transfer->bytes <= o.inline_copy_max_bytes &&
          a.transfer->bytes <= o.chunk_bytes && impl_->bytes_per_second <= 0 &&
          o.parent == nullptr && !in_inline_done && !posting_from_completion &&
          impl_->CanPick()) {
        Impl::Finished finished;
        const bool last = impl_->CopyHere(&finished);
        lock.Unlock();
        if (last) {
          in_inline_done = true;
          Impl::Complete(std::move(finished));
          in_inline_done = false;
        }
        return;
      }
      lock.Unlock();
      impl_->cv.notify_one();
      return;
    }
    error = id.status();
  }
  lock.Unlock();
  if (transfer->done) transfer->done(std::move(error));
}

size_t LinkScheduler::CancelOwner(uint64_t owner_id, const absl::Status& status) {
  if (owner_id == 0) return 0;
  std::vector<std::shared_ptr<Transfer>> finished;
  size_t cancelled = 0;
  {
    base::MutexLock lock(impl_->mu);
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
      if (!a.transfer->post_chunk) --impl_->blocking_transfers;
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

bool LinkScheduler::SetWaitingForProducer(const Transfer* transfer, bool waiting) {
  if (transfer == nullptr) return false;
  bool wake = false;
  {
    base::MutexLock lock(impl_->mu);
    auto it = std::find_if(impl_->active.begin(), impl_->active.end(),
                           [&](const auto& e) { return e.second.transfer.get() == transfer; });
    if (it == impl_->active.end()) return false;
    Impl::Active& a = it->second;
    if (!a.transfer->post_chunk || a.waiting_for_producer == waiting) return false;
    impl_->MarkWaiting(it->first, a, waiting);
    wake = impl_->CanPick();
  }
  // Never posts here (the caller may be inside the engine's issue loop): a worker does, when
  // there is something to post now.
  if (wake) impl_->cv.notify_all();
  return true;
}

size_t LinkScheduler::PromoteOwner(uint64_t owner_id, TrafficClass cls) {
  if (owner_id == 0) return 0;
  size_t promoted = 0;
  {
    base::MutexLock lock(impl_->mu);
    for (auto& [id, a] : impl_->active) {
      if (a.transfer == nullptr || a.transfer->owner_id != owner_id || a.all_popped) continue;
      promoted += impl_->queue.Promote(id, cls) > 0;
    }
  }
  if (promoted > 0) impl_->cv.notify_all();  // an URGENT chunk may pass a GPU's post limit
  return promoted;
}

void LinkScheduler::Shutdown() {
  {
    base::MutexLock lock(impl_->mu);
    impl_->stopping = true;
  }
  impl_->cv.notify_all();
  base::MutexLock join_lock(impl_->join_mu);
  for (std::thread& t : impl_->workers) {
    if (t.joinable()) t.join();
  }
}

LinkSchedulerStats LinkScheduler::stats() const {
  base::MutexLock lock(impl_->mu);
  LinkSchedulerStats s = impl_->stats;
  s.queued_transfers = impl_->queue.queued_transfers();
  for (const auto& [gpu, n] : impl_->waiting_posted_per_gpu) s.chunks_waiting_for_producer += n;
  if (s.chunks_in_flight > 0) {
    s.busy_seconds += impl_->clock->NowSeconds() - impl_->busy_since_seconds;
  }
  return s;
}

const LinkSchedulerOptions& LinkScheduler::options() const { return impl_->options; }

void LinkScheduler::SetBytesPerSecond(double bytes_per_second) {
  {
    base::MutexLock lock(impl_->mu);
    impl_->bytes_per_second = std::max(0.0, bytes_per_second);
  }
  impl_->cv.notify_all();  // a worker sleeping on the old pace looks again
}

double LinkScheduler::bytes_per_second() const {
  base::MutexLock lock(impl_->mu);
  return impl_->bytes_per_second;
}

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
