// DeviceWorker: the one thread that owns a GPU for the cuda backend (cuda_engine.h).
//
// Start() spawns the thread, which makes the device current (creating the daemon's context on
// it), records cudaMemGetInfo, and creates `streams_per_direction` D2H and H2D streams. From then
// on every CUDA call for the device runs on this thread: callers hand it closures (Run) or copy
// operations (IssueAsync / IssueAndWait). Stop() (and the destructor) lets queued work and
// outstanding copies finish, destroys the streams and events, and joins.
//
// Copies. Each direction is one lane: a software queue of copies not yet issued
// (urgent ones first, then FIFO) in front of the CUDA stream(s), which serve what was issued in
// order. A copy is issued (cudaMemcpyAsync + a completion event) only "just in time": while the
// lane's issued work is predicted to end within `issue_ahead_seconds`, so the copy engine never
// idles between copies, yet an urgent copy waits for at most the copy running now plus that
// much. Predictions use the lane's rate, learned over windows of back-to-back completions
// (timing/copy_rate_estimator.h: one copy's time, as a late-waking host sees it, is too noisy; it
// only lifts a learned rate it beats, as after the engine stops being shared);
// until then it plans with `assumed_bytes_per_second`, or, without one, keeps two copies
// issued. Completions are learned by querying the issued events: the
// thread sleeps (timer slack 1 µs) until the earliest predicted end or issue time, then queries;
// past a prediction it spins (yielding) for up to ~200 µs, then sleeps 20 µs between queries.
// Completion callbacks run on this thread; a copy posted from one of them (IssueAsync on the
// device thread) joins its lane without a thread hand-off.
//
// Gated copies. A copy may carry an IssueGate shared by the copies of one transfer: it is not
// issued until the gate says so (the transfer's mapping is open, the client's ready event has
// completed), and meanwhile the lane issues the copies behind it that are not gated, so one
// transfer waiting for its producer never holds up another here (nothing is put on a stream to
// wait: a stream wait would hold every copy issued after it; and the link scheduler, told of
// the wait through TransferSpec::on_producer_wait, keeps posting other transfers' copies).
// Gates are asked once per pass of the thread, at least every `gate_poll_seconds` (growing to
// 1/16 of the time waited so far, at most `max_gate_poll_seconds`, so a long wait costs few
// queries). A transfer's copies all go to one stream (the one its first copy took), so an event
// recorded after its last copy (`after_issue`) follows every one of them.
#ifndef OFFLOADD_SERVER_COPY_CUDA_CUDA_DEVICE_WORKER_H_
#define OFFLOADD_SERVER_COPY_CUDA_CUDA_DEVICE_WORKER_H_

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "common/base/mutex.h"
#include "server/copy/timing/copy_rate_estimator.h"
#include "server/copy/cuda/cuda_api.h"

namespace offloadd::copy {

// How a DeviceWorker paces its copies (see above).
struct DeviceWorkerOptions {
  uint32_t streams_per_direction = 1;  // >= 1
  // Issued work a lane keeps ahead of the copy running now, in seconds of its learned rate, at
  // least: covers the host's cost of issuing (cudaMemcpyAsync + event, ~6 µs) and how late the
  // thread wakes. Each time a lane runs dry while copies wait (the thread woke too late) its
  // margin doubles, up to `max_issue_ahead_seconds`, and it shrinks back by 1 % a completion.
  // Larger: robust to a busier host; an urgent copy may wait that much longer.
  double issue_ahead_seconds = 50e-6;
  double max_issue_ahead_seconds = 1e-3;
  uint32_t max_issued_per_direction = 16;  // a bound whatever the rate says; >= 2
  // The rate a lane plans with until it has learned its own; 0 = none (keep two copies issued
  // until then). Learning needs copies that run back to back, which two issued copies give only
  // when the thread wakes within one copy's time: on a busy host with small copies a lane could
  // stay unlearned at two copies (copy_sim_bench, 1 MiB chunks, 8 GPUs). An assumed rate below
  // the engine's issues each copy late (it looks longer than it is), so the engine idles; each
  // time an unlearned lane runs dry after holding a copy back by that rate the assumption
  // doubles (copies the host issues slower than the engine moves them run dry at any rate).
  // The engine's default is 25 GB/s (a PCIe 4.0 x16 link's order; an H200 reaches 55 GB/s, so
  // two doublings).
  double assumed_bytes_per_second = 0;
  // How often a gated copy's gate is asked while it says "not yet" (see "Gated copies").
  double gate_poll_seconds = 20e-6;
  double max_gate_poll_seconds = 500e-6;
};

// What the copies of one transfer wait for before they may be issued (see "Gated copies").
// Ready() is called on the device thread only.
class IssueGate {
 public:
  virtual ~IssueGate() = default;
  // true: issue now (never asked again); false: not yet; an error fails each copy of the gate
  // as the worker reaches it.
  virtual absl::StatusOr<bool> Ready() = 0;

 private:
  friend class DeviceWorker;
  // Device thread only.
  bool ready_ = false;
  uint64_t asked_in_pass_ = 0;  // the pass that last got "not yet"
  double waiting_since_ = -1;   // first "not yet"
  int stream_ = -1;             // index in the lane's streams, chosen at the first issue
};

// One copy handed to DeviceWorker::Submit.
struct CopyRequest {
  Direction direction = Direction::kDeviceToHost;
  uint64_t bytes = 0;
  bool urgent = false;  // ahead of every queued copy that is not urgent
  // Puts the copy on `stream` (cudaMemcpyAsync); called on the device thread when its turn
  // comes. Its error fails the copy once what it may have put on the stream before failing has
  // run (a completion event is recorded behind it all the same).
  std::function<absl::Status(void*)> issue;
  // Once: when the copy's completion event completed, or with the first error.
  std::function<void(absl::Status)> done;
  std::shared_ptr<IssueGate> gate;  // null: issued as soon as the lane's pacing allows
  // Null, or called right after the copy and its completion event are on `stream` (e.g. to
  // record a client's event behind it); an error fails the copy when it completes.
  std::function<absl::Status(void*)> after_issue;
};

class DeviceWorker {
 public:
  DeviceWorker(CudaApi* api, CudaDeviceInfo device, DeviceWorkerOptions options);
  ~DeviceWorker();  // Stop()
  DeviceWorker(const DeviceWorker&) = delete;
  DeviceWorker& operator=(const DeviceWorker&) = delete;

  // Starts the thread and waits for its set-up; the set-up's error (the thread has then exited).
  absl::Status Start() EXCLUDES(mu_);
  void Stop() EXCLUDES(mu_);

  // Runs `fn` on the device thread and returns its result. Runs it inline when called on the
  // device thread itself. FAILED_PRECONDITION after Stop().
  absl::Status Run(const std::function<absl::Status()>& fn) EXCLUDES(mu_);

  // Queues a copy of `bytes` on the lane of `direction` (urgent: ahead of every queued copy
  // that is not urgent); when its turn comes the device thread calls `issue(stream)` on the
  // lane's next stream (round robin), then records a completion event after it. `done` runs once
  // on the device thread when the event completes, or with the first error. Returns at once;
  // false (and `done` not called) after Stop(). May be called on the device thread (from a
  // completion callback): the copy then joins its lane directly.
  bool IssueAsync(Direction direction, uint64_t bytes, bool urgent,
                  std::function<absl::Status(void*)> issue, std::function<void(absl::Status)> done)
      EXCLUDES(mu_);
  // IssueAsync with a gate and an after-issue step (CopyRequest); same contract.
  bool Submit(CopyRequest request) EXCLUDES(mu_);
  // IssueAsync (not urgent), then blocks until `done`; its status. Must not be called on the
  // device thread.
  absl::Status IssueAndWait(Direction direction, uint64_t bytes,
                            const std::function<absl::Status(void*)>& issue) EXCLUDES(mu_);
  // Submit (its `done` ignored), then blocks until the copy is done; its status. Not on the
  // device thread.
  absl::Status SubmitAndWait(CopyRequest request) EXCLUDES(mu_);

  // The device thread's streams of one direction (valid after Start(); use them on the thread).
  const std::vector<void*>& streams(Direction direction) const {
    return lanes_[static_cast<int>(direction)].streams;
  }
  const CudaDeviceInfo& device() const { return device_; }
  CudaMemInfo mem_after_context() const { return mem_after_context_; }
  bool OnThread() const { return std::this_thread::get_id() == thread_id_.load(); }
  // A lane's figures as of the device thread's last pass, for the benchmark and tests: times
  // its copy engine was left idle with copies queued (the thread woke too late), its current
  // issue-ahead margin, its rate (learned, else the assumed one; 0 = neither), copies queued
  // and issued.
  struct LaneStats {
    uint64_t dry_runs = 0;
    double ahead_seconds = 0, bytes_per_second = 0;
    size_t queued = 0, issued = 0;
  };
  LaneStats lane_stats(Direction direction) EXCLUDES(mu_);

 private:
  struct Copy {  // queued, not issued
    uint64_t bytes;
    std::function<absl::Status(void*)> issue;
    std::function<void(absl::Status)> done;
    std::shared_ptr<IssueGate> gate;
    std::function<absl::Status(void*)> after_issue;
  };
  struct Issued {
    void* event;
    uint64_t bytes;
    std::function<void(absl::Status)> done;
    double issued_at, predicted_end;
    double seen_pending_at;  // start of the last query that said "not yet" (issued_at before any)
    double queued_at;        // its copy and event were on the stream by then
    absl::Status after_issue_status;  // reported at completion when not OK
    std::shared_ptr<IssueGate> gate;   // what the copy's transfer holds (its mapping) until done
  };
  struct Lane {  // one direction; device thread only
    std::vector<void*> streams;
    size_t next_stream = 0;
    std::deque<Copy> urgent, normal;
    std::deque<Issued> issued;
    double free_at = 0;   // predicted end of the last issued copy
    CopyRateEstimator rate;
    double bytes_per_second = 0;  // learned, else assumed; 0 = neither
    // seen_pending_at of the copy that completed last: a copy queued before it ran back to back.
    double last_seen_pending_at = -1;
    double ahead_seconds = 0;     // current margin (see DeviceWorkerOptions)
    uint64_t dry_runs = 0;        // completions that left the engine idle with copies waiting
    // Issue's last pass held a copy back because the lane's work was predicted to run longer
    // than the margin: only then can an assumed rate below the engine's have made the lane run
    // dry (host-bound copies run dry at any rate).
    bool held_by_rate = false;
    // Issue's last pass left copies queued whose gate said "not yet"; the longest such wait
    // began at gated_since.
    bool gated = false;
    double gated_since = 0;
  };
  struct Incoming {
    Direction direction;
    bool urgent;
    Copy copy;
  };
  Lane& lane(Direction d) { return lanes_[static_cast<int>(d)]; }
  void Loop(std::promise<absl::Status>* started) EXCLUDES(mu_);
  absl::Status SetUp();
  void TearDown();
  void Enqueue(Incoming in);
  bool Idle() const;  // nothing queued or issued
  void Poll(Lane& l);   // completes the lane's finished copies
  void Issue(Lane& l);  // issues the lane's queued copies that are due
  bool MayIssueMore(Lane& l);  // the lane's pacing allows another issue now
  // Removes and returns the first queued copy that may be issued (urgent first; gates asked
  // at most once per pass); false when every queued copy waits on its gate. Copies whose gate
  // fails are completed with the error on the way.
  bool TakeIssuable(Lane& l, Copy* out);
  bool TakeFrom(Lane& l, std::deque<Copy>& q, Copy* out);
  void IssueOne(Lane& l, Copy c);
  double GateWakeSeconds(const Lane& l, double now) const;
  void Complete(Lane& l, double seen_done_at);  // its oldest issued copy completed
  double NextWakeSeconds(double now) const;  // 0 = now; huge = nothing to wait for
  bool Post(std::function<void()> task) EXCLUDES(mu_);

  CudaApi* const api_;
  const CudaDeviceInfo device_;
  const DeviceWorkerOptions options_;
  std::thread thread_;
  std::atomic<std::thread::id> thread_id_{};

  base::Mutex mu_;
  base::CondVar cv_;
  std::vector<std::function<void()>> tasks_ GUARDED_BY(mu_);
  std::vector<Incoming> incoming_ GUARDED_BY(mu_);
  LaneStats lane_stats_[2] GUARDED_BY(mu_);  // copies of the lanes' figures, by Direction
  bool sleeping_ GUARDED_BY(mu_) = false;    // the device thread waits on cv_ (posters then notify)
  bool stopping_ GUARDED_BY(mu_) = false;
  bool running_ GUARDED_BY(mu_) = false;

  // Device-thread only.
  Lane lanes_[2];  // by Direction
  std::vector<void*> free_events_;
  CudaMemInfo mem_after_context_;
  uint64_t pass_ = 0;  // Issue passes, for asking each gate once per pass
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_CUDA_CUDA_DEVICE_WORKER_H_
