// RingFrontEnd: the daemon's side of one session's request ring (common/ring_format.h,
// docs/ARCHITECTURE.md "The request ring"), beside the session's stream reactor (server.cc).
//
// One thread per attached ring takes submissions in order, copies each entry once into its own
// memory, validates the copy (common::ValidateSubmission; a malformed entry is answered on the
// completion ring with INVALID_ARGUMENT, the session keeps serving) and hands the request to the
// session like a stream request (`handle`, i.e. Session::Handle); once the session has ended,
// the entry that finds it so is answered with the session's end status and no more are taken,
// so every entry taken gets exactly one answer. Requests that may block
// (Session::MayBlock: a release, an offload waiting for its ready event) block only this
// session's ring thread, as they would block only the stream's worker task; the requests of one
// ring are handled in order. Completions of ring requests (Complete, from any thread) go into
// the completion ring; when it is full they wait in daemon memory and the thread stops taking
// submissions while kMaxQueuedCompletions wait (back-pressure: the client's submissions then
// wait in its own ring). The client is woken through its doorbell.
//
// Hostile clients: the daemon never reads a slot twice nor trusts an index it does not own;
// an impossible index (a submission tail or completion head out of range, or moving backwards)
// ends the session through `end` with INVALID_ARGUMENT saying which, and the ring is not
// touched again. The object is a sealed memfd (cannot shrink: no SIGBUS in the daemon). A
// client that rings the daemon's doorbell with no work costs its own ring thread's wake-ups,
// bounded by a back-off (1 ms after 64 such wake-ups in a row; timed polls that find nothing
// do not count).
//
// Idle: the thread polls for spin_seconds after its last work, then sleeps on the daemon
// doorbell (futex). For common::kRingPollWindowSeconds after its last work those sleeps end
// after poll_seconds at most and the thread advertises it (RingState::poll_microseconds), so
// the client publishes offloads, releases and prefetch reloads without waking it (a futex wake
// is the dearest part of a client's per-tensor path; common/ring_format.h "Deferred
// wake-ups"); after the window it sleeps until the client rings: an idle session uses no CPU.
// The cost: up to 1 / poll_seconds timed wake-ups a second per active session (2000 at the
// default 0.5 ms), on the daemon's cores.
//
// Exported (server/metrics, docs/metrics-and-alerts.md): the threads running (Start to Stop),
// sleeps by wait (poll / doorbell), back-offs, malformed entries and the answers waiting in
// daemon memory (queued at Complete, moved by FlushQueued, dropped by Stop); `counters()` has
// the same per front end.
#ifndef OFFLOADD_SERVER_RPC_RING_FRONTEND_H_
#define OFFLOADD_SERVER_RPC_RING_FRONTEND_H_

#include <sys/types.h>

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "common/ring_format.h"
#include "server/session/request.h"

namespace offloadd::rpc {

// How a ring thread waits for work (above). poll_seconds 0: no timed polls, every submission
// rings.
struct RingWaiting {
  double spin_seconds = 20e-6;
  double poll_seconds = 500e-6;
};

class RingFrontEnd {
 public:
  // Hands a request to the session (Session::Handle): OK when the session took it (it answers
  // it exactly once), else the status the session ended with (Session::end_status): the front
  // end answers the request with it and takes no more submissions (the client's stay in its
  // ring, not taken: the ring is marked closed when Stop runs).
  using Handle = std::function<absl::Status(const session::Request&)>;
  // Counts an entry the front end refused itself (malformed: INVALID_ARGUMENT) among the
  // session's request errors (Session::CountRefused); may be null.
  using Refused = std::function<void(const absl::Status&)>;
  // Ends the session (the ring is corrupt); called at most once, on the ring thread.
  using End = std::function<void(const absl::Status&)>;

  // Completions waiting in daemon memory (completion ring full) before the thread stops taking
  // submissions.
  static constexpr size_t kMaxQueuedCompletions = 2048;
  // Submissions taken before the thread flushes waiting completions again.
  static constexpr int kTakeBatch = 64;
  using Waiting = RingWaiting;

  struct Counters {
    uint64_t submissions = 0;    // entries taken
    uint64_t malformed = 0;      // of which refused by ValidateSubmission
    uint64_t completions = 0;    // entries written into the completion ring
    uint64_t sleeps = 0;         // times the thread slept on its doorbell
    uint64_t polls = 0;          // of which timed polls (clients deferring their wake-ups)
    uint64_t queued_peak = 0;    // most completions waiting in daemon memory at once
    uint64_t backoffs = 0;       // 1 ms back-offs after 64 rings in a row that found no work
  };

  // Opens the ring a client offered in Hello: descriptor `fd` of process `pid` (the
  // connection's, /proc/<pid>/fd/<fd>), which must be owned by `uid`. Errors (the sentence goes
  // into HelloReply.ring_error): PERMISSION_DENIED (the daemon may not open it, or its owner is
  // not `uid`), FAILED_PRECONDITION (`fd` is not open in `pid`; not a regular sealed memfd of
  // a ring's size; or the ring, by file identity, is attached to a live session already: a ring
  // serves one session until that session's front-end stops), INVALID_ARGUMENT (a header the
  // daemon does not accept).
  static absl::StatusOr<std::unique_ptr<RingFrontEnd>> Attach(
      int32_t pid, uint32_t fd, uid_t uid, Handle handle, End end, Waiting waiting = {},
      Refused refused = nullptr);
  // The same for a path (tests).
  static absl::StatusOr<std::unique_ptr<RingFrontEnd>> AttachPath(
      const std::string& path, uid_t uid, Handle handle, End end, Waiting waiting = {},
      Refused refused = nullptr);
  ~RingFrontEnd();  // Stop()

  // Starts the ring thread (once; Attach does not, so the caller can first make Complete
  // reachable from the session's answers: a client may submit before it was told the ring is
  // attached).
  void Start();
  // Stops the thread (joins it; not from the ring thread), marks the ring closed, wakes the
  // client's waiters and lets another session attach the ring. Completions after it are
  // dropped. Idempotent.
  void Stop() EXCLUDES(mu_);
  // A completion of a ring request (request_id with common::kRingRequestIdBit), from any thread.
  void Complete(const session::Completion& completion) EXCLUDES(mu_);
  Counters counters() const EXCLUDES(mu_);
  uint64_t object_bytes() const { return layout_.total_bytes; }

 private:
  RingFrontEnd(void* base, const common::RingLayout& layout, std::pair<dev_t, ino_t> ring_id,
               Handle handle, End end, Waiting waiting, Refused refused);
  void Run();
  // Takes up to kTakeBatch submissions; returns how many (0 also when paused or corrupt).
  int TakeSubmissions() EXCLUDES(mu_);
  // Moves waiting completions into the ring; returns how many.
  size_t FlushQueued() EXCLUDES(mu_);
  // Whether there is work for the thread now (checked after arming the doorbell).
  bool WorkReady() EXCLUDES(mu_);
  // Waits for work: polls for spin_seconds, then sleeps on the doorbell (at most poll_seconds
  // within the poll window after last_work_seconds, advertised in poll_microseconds). False
  // when the sleep ended by its timeout (nobody rang), true otherwise.
  bool WaitForWork(double last_work_seconds);
  // Records a corrupt index (`what`) once; the thread ends the session.
  void MarkCorrupt(const std::string& what) EXCLUDES(mu_);

  void* const base_;
  const common::RingLayout layout_;
  const std::pair<dev_t, ino_t> ring_id_;  // the file's identity, claimed while attached
  common::RingControl* const control_;
  const Handle handle_;
  const End end_;
  const Waiting waiting_;
  const Refused refused_;
  common::RingConsumer<common::SubmissionEntry> submissions_;  // the ring thread's alone
  bool intake_closed_ = false;  // the session ended: no more submissions (the ring thread's)
  mutable base::Mutex mu_;
  common::RingProducer<common::CompletionEntry> completions_ GUARDED_BY(mu_);
  std::deque<common::CompletionEntry> queued_ GUARDED_BY(mu_);  // ring full: wait here
  std::string corrupt_ GUARDED_BY(mu_);  // non-empty: which index was impossible
  bool stopped_ GUARDED_BY(mu_) = false;
  Counters counters_ GUARDED_BY(mu_);
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_RING_FRONTEND_H_
