// Session: one client process's state machine, independent of gRPC (rpc/ translates protobuf
// messages to Request and Completion back).
//
// Protocol rules enforced here (each violation is answered with a Completion carrying a
// specific status and a sentence saying what to do; the session keeps serving):
//  - Hello first, exactly once (FAILED_PRECONDITION otherwise); device_id must be non-empty.
//    With peer credentials (rpc/ reads them from the connection): the peer must pass the access
//    policy and Hello's pid must name it (PERMISSION_DENIED otherwise, session/peer.h); the
//    session is then bound to that pid (watched: CoreOptions::watch_pids) and its uid (uid
//    quota). More than max_sessions open, or a new device id beyond max_links:
//    RESOURCE_EXHAUSTED; names over kMaxNameBytes: INVALID_ARGUMENT.
//  - Resume token: Hello returns 16 random bytes (getrandom) whose SHA-256 keys the session's
//    block records in a shared pool. A Hello presenting a token takes the blocks a previous
//    daemon recorded under it (store/block_store.h ResumeSession): NOT_FOUND when none wait,
//    PERMISSION_DENIED when the peer's uid is not the recorded owner's.
//  - At most max_requests_in_flight requests accepted and not yet answered; more get
//    RESOURCE_EXHAUSTED at once (the client should wait for completions before sending more).
//  - Regions are registered once and named by the id the daemon returns (NOT_FOUND for an
//    unknown id); every offset + bytes is checked against the region's size (OUT_OF_RANGE).
//  - Offload of 0 bytes: INVALID_ARGUMENT; larger than the pool or quota: OUT_OF_RANGE; pool
//    full past the admission deadline: RESOURCE_EXHAUSTED.
//  - Reload priority must be URGENT or PREFETCH (INVALID_ARGUMENT otherwise); blocks are
//    scoped to the session (NOT_FOUND for unknown, foreign or released ids).
//  - A request kind the daemon does not know: INVALID_ARGUMENT.
//  - ClientReport (client_reports.h): cumulative counts that never go down within the session,
//    finite non-negative seconds, all within what a session of its age can have seen (seconds
//    up to its age + 1 s, counts up to 1e6 a second; INVALID_ARGUMENT otherwise); kept as its
//    latest report, their increase summed into the Core's per-GPU totals. Session opens and
//    closes are written to the audit log (audit.h).
//  - Tags: an offload may name its block with a tag unique among the session's live blocks
//    (INVALID_ARGUMENT if in use); reloads and releases may use the tag before OffloadDone
//    (NOT_FOUND for a tag with no live block). If the tagged offload fails, requests waiting on
//    the tag fail with its status.
// Every request gets exactly one Completion with its request id; ids are the client's and are
// not checked for uniqueness (two in flight with one id are each answered). An offload copies
// client memory in chunks until its completion: bytes the client writes meanwhile end up in the
// block or not, chunk by chunk (a mixed block, not detected).
// When the stream ends (client
// exit or crash), Close() releases every block and region the session holds; copies in flight
// finish first. Every request accepted and not yet answered is answered before Close() returns
// (the stream can still carry answers after a half-close): with its own completion if it
// finished meanwhile, else CANCELLED saying the session ended first (UNAVAILABLE "offloadd is
// shutting down" for cause kShutdown). End() does the same from the daemon's side (admin call,
// process exited, hello timeout) and also ends the stream with a status.
// Streams (Open) count as awaiting Hello until a Hello succeeds (Core::AdmitPendingHello):
// bounded in total and per uid, and ended with DEADLINE_EXCEEDED after hello_timeout_seconds.
// Client memory after the end: Close()/End() return (and End() ends the stream) only after
// every chunk copy of the session into or out of client memory has finished; chunks not yet
// started are cancelled and never run (copy_gate.h). Once the client sees its stream end it may
// reuse or free its registered memory.
#ifndef OFFLOADD_SERVER_SESSION_SESSION_H_
#define OFFLOADD_SERVER_SESSION_SESSION_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_set>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "server/copy/copy_engine.h"
#include "server/session/copy_gate.h"
#include "server/session/core.h"
#include "server/session/ops.h"
#include "server/session/peer.h"
#include "server/session/request.h"

namespace offloadd::session {

// Regions one session may hold at once (each is a mapping in the daemon: vm.max_map_count is
// shared by every session). More get RESOURCE_EXHAUSTED.
inline constexpr size_t kMaxRegionsPerSession = 4096;

// Longest device_id / client_name / resume_token a Hello may carry (INVALID_ARGUMENT beyond).
inline constexpr size_t kMaxNameBytes = 256;
// Resume tokens issued: 128 random bits.
inline constexpr size_t kResumeTokenBytes = 16;
// kResumeTokenBytes from getrandom(2). UNAVAILABLE when the kernel refuses.
absl::StatusOr<std::string> NewResumeToken();

// Metric label values: closed (client half-closed), crashed (stream broke), shutdown (daemon
// stopping), pid_exited (process gone, stream lingered), admin (ended by an admin call),
// bad_message (the client sent bytes that are not a valid message), hello_timeout (no Hello
// within hello_timeout_seconds).
enum class EndCause {
  kClosed, kCrashed, kShutdown, kPidExited, kAdmin, kBadMessage, kHelloTimeout,
  kCopyFailed,  // a reload failed after its done event was recorded (OpOwner::FailAfterAnswer)
};
const char* EndCauseName(EndCause cause);

class Session : public OpOwner, public std::enable_shared_from_this<Session> {
 public:
  using Emit = std::function<void(Completion)>;
  // Ends the transport stream with a status (rpc/); called at most once, without the session's
  // lock held, after the session's copies have stopped; it must not call back into the session.
  using EndStream = std::function<void(const absl::Status&)>;
  // `emit` is called from any thread, never after Close() has returned. `peer`: the
  // connection's credentials (unknown = not checked).
  static std::shared_ptr<Session> Create(Core* core, Emit emit, PeerCredentials peer = {},
                                         EndStream end_stream = nullptr);
  // Create for a client stream, admitted as awaiting Hello (Core::AdmitPendingHello):
  // RESOURCE_EXHAUSTED naming the bound when too many streams of the peer's uid, or in all,
  // have not sent Hello (no session is then kept).
  static absl::StatusOr<std::shared_ptr<Session>> Open(Core* core, Emit emit,
                                                       PeerCredentials peer,
                                                       EndStream end_stream);
  ~Session();

  // Takes `request`: true when the session answers it (exactly once, later or already);
  // false when the session has ended and did not take it (nothing will answer it: a transport
  // that outlives the session, the request ring, answers it with end_status()).
  bool Handle(const Request& request) EXCLUDES(mu_);
  // The status the session's end gives every request it did not carry out (CANCELLED or, at a
  // shutdown, UNAVAILABLE, with a sentence); OK while it is open.
  absl::Status end_status() const EXCLUDES(mu_);
  // Counts a request the transport answered with `status` itself, before the session saw it (a
  // malformed ring entry, a ring request id on the stream), in the daemon's request errors as
  // the session's own refusals are counted.
  void CountRefused(const absl::Status& status);
  // Whether Handle(request) may block the calling thread, asked before handing it so rpc/ can
  // keep such requests off the gRPC reaction. False only after Hello, for an offload without a
  // ready event or a reload, each naming a region already registered (Handle then only checks
  // it and queues the op: the store and the link scheduler call back on their own threads).
  // False for a ClientReport (a lock and a sum). True for everything else: Hello (getrandom,
  // resuming blocks), RegisterRegion (opens the client's memory: shm_open/mmap, a CUDA IPC
  // handle on the device thread), UnregisterRegion
  // (may close one), Release, an offload waiting for a ready event, an unknown region (it may
  // be registered by an earlier request not yet handled), and a closed session.
  bool MayBlock(const Request& request) const EXCLUDES(mu_);
  // Ends the session: releases its blocks, waiting offloads and regions. Idempotent.
  void Close(EndCause cause) EXCLUDES(mu_);
  // Starts no chunk copy of this session from now on (its queued chunks fail with the status
  // Close(cause) would answer) without waiting; Close follows. Lets a shutdown stop every
  // session's copies before it waits for any.
  void StopCopies(EndCause cause) EXCLUDES(mu_);
  // Close(cause), and ends the stream with `status` (EndStream). Idempotent with Close.
  void End(EndCause cause, const absl::Status& status) EXCLUDES(mu_);

  SessionInfo info() const EXCLUDES(mu_);
  uint64_t id() const { return id_; }
  bool closed() const EXCLUDES(mu_);
  const PeerCredentials& peer() const { return peer_; }
  // Whether some thread holds the session's mutex (asked from another thread). Tests only.
  bool MutexHeldForTesting() const;

 private:
  Session(Core* core, Emit emit, PeerCredentials peer, EndStream end_stream);
  // `counted`: the completion answers a request counted in requests_in_flight_.
  void Send(Completion c, bool counted = true) EXCLUDES(mu_);
  void Fail(uint64_t request_id, absl::Status status, bool counted = true) EXCLUDES(mu_);
  void CloseWith(EndCause cause, const absl::Status* end_status) EXCLUDES(mu_);
  // Handle() without the in-flight accounting (replays of requests already counted).
  void Dispatch(const Request& r);
  void OnHello(const Request& r);
  // Hello's own checks (names, peer, pid, token size): OK or the status to answer.
  absl::Status CheckHello(const Request& r) const;
  // Admits the Hello (session slot, link, resumed blocks; each undone on a later refusal) and
  // binds the session to it; mu_ held. Returns the number of blocks resumed.
  absl::StatusOr<uint64_t> AdmitHelloLocked(const Request& r, const pool::ResumeKey& key,
                                            std::vector<uint64_t>* resumed_ids) REQUIRES(mu_);
  Completion HelloReply(const Request& r, const std::string& token, uint64_t blocks_resumed,
                        std::vector<uint64_t> resumed_ids);
  void OnRegister(const Request& r);
  // PERMISSION_DENIED when a handle of `r` (region, ready and done events) is a simulated GPU
  // table's and names a table that is not this session's process's and uid's
  // (copy::CheckSimHandleOwner). OK without known peer credentials.
  absl::Status CheckHandleOwners(const Request& r) const EXCLUDES(mu_);
  void OnUnregister(const Request& r);
  // Offload and reload: validated here, carried out by an OffloadOp / ReloadOp (ops.h).
  void OnOffload(const Request& r);
  void OnReload(const Request& r);
  OpContext OpContextFor() EXCLUDES(mu_);
  // OpOwner, for this session's ops.
  void Answer(Completion c) override;
  void AnswerError(uint64_t request_id, absl::Status status) override;
  bool SessionClosed() const override;
  bool ClaimTag(uint64_t tag) override EXCLUDES(mu_);
  void OnRelease(const Request& r);
  // Keeps the client's cumulative counts and adds their increase to the Core's sums.
  void OnClientReport(const Request& r) EXCLUDES(mu_);
  // Region by id, or NOT_FOUND.
  absl::StatusOr<std::shared_ptr<copy::Region>> FindRegion(uint64_t region_id) EXCLUDES(mu_);
  // Fills r.block_id from r.tag. Returns false when the request was queued (offload not yet
  // admitted) or failed (answered: NOT_FOUND for an unknown tag, UNAVAILABLE for one while the
  // core drains, since the tagged offload may have been refused by the drain).
  bool ResolveTag(Request& r);
  // The tagged offload was admitted (block_id != 0) or failed: replays or fails its waiters.
  void TagResolved(uint64_t tag, uint64_t block_id, const absl::Status& status) override;
  // The block is gone: drop its tag.
  void ForgetBlock(uint64_t block_id) override;
  void FailAfterAnswer(uint64_t request_id, absl::Status status) override;

  Core* const core_;
  const uint64_t id_;
  const PeerCredentials peer_;
  mutable base::Mutex mu_;
  Emit emit_ GUARDED_BY(mu_);             // null once closed
  EndStream end_stream_ GUARDED_BY(mu_);  // null once closed
  // Chunk copies of this session's transfers pass it; closed by CloseWith.
  const std::shared_ptr<CopyGate> gate_ = std::make_shared<CopyGate>();
  uint64_t requests_in_flight_ GUARDED_BY(mu_) = 0;
  // Request ids accepted and not yet answered (requests_in_flight_ of them), answered by
  // CloseWith when the session ends first.
  std::unordered_multiset<uint64_t> unanswered_ GUARDED_BY(mu_);
  // Set when the session closes: what requests that could not finish are answered with.
  absl::Status close_status_ GUARDED_BY(mu_);
  bool hello_done_ GUARDED_BY(mu_) = false;
  bool closed_ GUARDED_BY(mu_) = false;
  std::string client_name_ GUARDED_BY(mu_);
  // Written once by the accepted Hello, under mu_ and before hello_done_; every reader runs after
  // a request passed the hello_done_ check (under mu_), so it is read without the lock.
  std::string device_id_;
  bool transient_device_ = false;  // Hello's transient_device
  uint32_t pid_ GUARDED_BY(mu_) = 0;
  uint32_t hello_pid_ GUARDED_BY(mu_) = 0;  // the pid the client named (its own view)
  ClientCounters client_report_ GUARDED_BY(mu_);  // the latest ClientReport
  double hello_seconds_ GUARDED_BY(mu_) = 0;       // core clock at Hello: a report's bound
  std::map<uint64_t, std::shared_ptr<copy::Region>> regions_ GUARDED_BY(mu_);
  uint64_t next_region_id_ GUARDED_BY(mu_) = 1;
  struct TaggedBlock {
    uint64_t block_id = 0;  // 0 until the offload is admitted
    std::vector<Request> waiting;
  };
  std::map<uint64_t, TaggedBlock> tags_ GUARDED_BY(mu_);     // tag -> block
  std::map<uint64_t, uint64_t> block_tags_ GUARDED_BY(mu_);  // block id -> tag
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_SESSION_H_
