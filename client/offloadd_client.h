// offloadd C++ client: one Session stream per Client (per training process), many requests in
// flight on it. Protocol: proto/offload.proto (package offloadd.v1); the daemon listens on a Unix
// socket, gRPC target "unix:<socket_path>".
//
// Threading: every method is thread-safe. The Session stream runs on gRPC's callback API: one
// reactor per stream (a grpc::ClientBidiReactor) keeps one read posted at all times; each
// OnReadDone completes the Replies of the answers its ServerMessage carries (by request id: the
// daemon may answer in any order) and posts the next read, so a daemon that ends the stream is
// seen at once, also while nothing is pending. Writes go one at a time: a request submitted
// while no write is in flight starts its write on the calling thread (StartWrite queues the
// message with gRPC and returns; it does not wait for the daemon or the socket); requests
// submitted meanwhile queue in the client, and the write's OnWriteDone starts the next write
// with everything queued since, in ONE ClientMessage (batching: at most kMaxRequestsPerMessage
// requests / kMaxMessageBytes per message), so bursts are coalesced. A reaction never blocks,
// never waits for another thread and never calls user code: it takes the client's mutex briefly,
// and completes Replies (sets their promises) after releasing it. A caller waiting on a Reply
// (get, wait, wait_for, wait_until, or the std::future it converts to) waits for that
// completion; no caller ever reads the stream. Each Client runs one thread of its own, the
// session thread (named "offloadd-stream" in /proc/<pid>/task/*/comm): it sleeps until the
// stream's OnDone, then resumes the session on a new stream (auto_resume, below) or fails every
// pending request; reactions run on gRPC's threads.
// The request ring (ClientOptions::use_ring, on by default): when the daemon attaches it,
// Offload, Reload(Tagged) and Release(Tagged) are submitted into shared memory on the calling
// thread (client/core/ring_core.h; their ids carry bit 63) and answered there, and a third
// thread ("offloadd-ring") completes their Replies, sleeping on a futex while nothing is answered; the stream
// keeps everything else. Requests on the ring and on the stream are not ordered with each
// other (wait for a region's requests before unregistering it). When the stream breaks the ring
// is given up: requests still pending on it settle or are re-sent on the resumed stream as
// usual, and the resume's Hello offers a new ring, which carries the requests made after the
// resume once the daemon attached it (ring_active()).
// Replies never run user code when they complete, on whichever thread that is.
//
// Units: sizes and offsets are uint64 bytes; durations are double seconds.
//
// Errors (absl::Status codes; messages say what to do):
//   - A daemon Error{code, message} becomes a status with the same code and message. The daemon
//     documents its codes; the protocol names INVALID_ARGUMENT (bad offset/bytes/priority),
//     NOT_FOUND (unknown region/block id), RESOURCE_EXHAUSTED (pool or quota full),
//     FAILED_PRECONDITION (e.g. a request before Hello), OUT_OF_RANGE (offset+bytes past region).
//   - UNAVAILABLE: the session stream ended without Close() and the session could not be
//     resumed: the daemon's pool does not outlive it (no pool_shm_name; HelloReply's
//     resume_grace_seconds is 0), auto_resume is off, or the daemon did not come back within
//     the resume window. Every pending request and every later request fails with it; the
//     message says "the offloadd daemon at unix:<path> went away". Blocks and regions of the
//     session are gone (the daemon releases them with the stream).
//   - DATA_LOSS: after a resume, a request naming a confirmed block the restarted daemon did not
//     have (its record failed the check at adoption), or a reload with release_after whose block
//     is gone (it may have been copied before the crash; nothing can confirm it).
//
// Resuming by itself (auto_resume, a daemon with pool_shm_name): when the stream breaks the
// session thread reconnects with exponential backoff (reconnect_initial/max_backoff_seconds)
// for at most the resume window, presents the resume token, registers every region again (the
// region ids RegisterRegion returned are the client's own and stay valid) and re-sends every
// request not yet answered, in the order they were issued. Requests issued meanwhile wait.
// Idempotence: an offload not answered is sent again from the same source bytes (the caller
// keeps them until its future resolves); a block the dead daemon had stored for it but not
// confirmed (among HelloReply.resumed_block_ids, never acknowledged) is released by the client,
// so no offload leaves two blocks. A reload not answered is sent again (same bytes, same place).
// A release not answered is sent again and counts as done when the block is gone. Tags do not
// survive a restart in the daemon: requests naming a confirmed block's tag are sent by block id.
//   - CANCELLED: the request was pending when Close() ended the stream, or a resume still
//     waiting for the daemon (Close() does not wait for it to come back).
//   - FAILED_PRECONDITION (client side): a request issued after Close() began.
//   - INTERNAL: the daemon answered a request with the wrong response kind (protocol mismatch).
//     Also every pending and later request once the client found its request ring corrupt (its
//     shared memory overwritten): the client ends the session rather than wait for answers the
//     ring can no longer carry (not resumed; Connect anew).
#ifndef OFFLOADD_CLIENT_OFFLOADD_CLIENT_H_
#define OFFLOADD_CLIENT_OFFLOADD_CLIENT_H_

#include <grpcpp/grpcpp.h>

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/container/flat_hash_set.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "client/core/ring_core.h"
#include "client/shm_region.h"
#include "common/base/mutex.h"
#include "proto/offload.grpc.pb.h"
#include "proto/offload.pb.h"

namespace offloadd {
namespace client {

struct ClientOptions {
  std::string socket_path;  // empty: DefaultSocketPath() (client/socket_path.h)
  std::string client_name;  // free text shown in the daemon's stats, e.g. "train.py rank 3"
  // The GPU the client's memory lives on: its UUID ("GPU-...") on the cuda backend, any stable
  // name on the shm backend. Selects the link the daemon schedules this client's copies on.
  std::string device_id;
  uint32_t pid = 0;                       // 0: getpid()
  // Socket connect + HelloReply, together. A missing socket or a daemon not listening yet is
  // retried for this long (a training process may start before its sidecar daemon), so with no
  // daemon at all Connect returns UNAVAILABLE only after the whole timeout.
  double connect_timeout_seconds = 10.0;
  double close_timeout_seconds = 5.0;     // Close(): wait this long for the daemon, then cancel
  double unary_timeout_seconds = 10.0;    // GetStats(), CheckHealth()
  // Resume() / auto_resume: presented in Hello to take over the blocks of the session that token names (a
  // daemon restarted on a shared pool, docs/failure-modes.md). Empty: a new session.
  std::string resume_token;
  // The device_id is not a GPU whose link should persist (a benchmark or probe): the daemon
  // removes the link it made for it when the last session naming it ends (proto Hello).
  bool transient_device = false;
  // Resume(): retry a connection refused with UNAVAILABLE (daemon restarting) for at most this
  // long in total, waiting between attempts from the initial backoff, doubling up to the max.
  double reconnect_total_seconds = 30.0;
  double reconnect_initial_backoff_seconds = 0.05;
  double reconnect_max_backoff_seconds = 1.0;
  // Reconnect and resume by itself when the session stream breaks (see the top of this file),
  // for at most resume_window_seconds (0: the daemon's resume_grace_seconds).
  bool auto_resume = true;
  double resume_window_seconds = 0;
  // HTTP/2 keepalive: ping the daemon this often, also while the stream is idle, and drop the
  // connection when a ping is not answered within the timeout (a frozen daemon: the stream
  // then ends UNAVAILABLE, and auto_resume reconnects as after a crash). 0 = no pings. The
  // daemon accepts pings at any rate.
  double keepalive_time_seconds = 10.0;
  double keepalive_timeout_seconds = 30.0;
  // Offer the daemon a request ring in Hello (client/core/ring_core.h, docs/ARCHITECTURE.md
  // "The request ring"). When it attaches it, offloads, reloads and releases (and their
  // answers) travel through shared memory with futex wake-ups instead of gRPC messages; a
  // daemon that refuses it or predates it is used through the stream alone. The Hello of a
  // resume (auto_resume) offers a new ring the same way: the old one ends with its stream.
  bool use_ring = true;
  uint32_t ring_entries = 1024;  // submission and completion slots each (a power of two)
};

// A region of client memory the daemon may copy from/to. Exactly one of cuda_ipc_handle (the 64
// raw bytes of a cudaIpcMemHandle_t of an allocation *base*) and shm_name (a POSIX shm name,
// "/...") is non-empty. size_bytes: size of the allocation / object; offsets are checked against
// it by the daemon.
struct RegionHandle {
  std::string cuda_ipc_handle;
  std::string shm_name;
  uint64_t size_bytes = 0;
};
inline constexpr size_t kCudaIpcHandleBytes = 64;

enum class Priority {
  kUrgent,    // the caller is blocked on this reload (backward is waiting)
  kPrefetch,  // needed soon; scheduled after urgent reloads, before offloads
};

// Where an offloaded block falls in the reload order (OffloadRequest.ordering), for the
// daemon's spill tier: within a step backward reloads in reverse of position.
struct OrderingHint {
  bool valid = false;  // false: no hint is sent
  uint64_t step = 0;
  uint64_t position = 0;
};

struct OffloadResult {
  uint64_t block_id = 0;      // names the pool block for Reload/Release
  uint64_t bytes = 0;         // bytes copied device-to-host
  double queued_seconds = 0;  // waiting for pool space
  double copy_seconds = 0;    // admission to last chunk copied
};

struct ReloadResult {
  uint64_t block_id = 0;
  uint64_t bytes = 0;     // bytes copied host-to-device
  bool released = false;  // release_after: the block is released once the copy completed
  double copy_seconds = 0;
  // CUDA with a done_event: answered when the daemon recorded the event after its last chunk;
  // the copy may still run. Make the consuming stream wait on the event (cudaStreamWaitEvent)
  // before reading; false: the copy has completed (proto/offload.proto, ReloadRequest).
  bool done_event_recorded = false;
};

// Counts since Connect(); batching shows as requests_sent / messages_sent > 1.
struct ClientCounters {
  uint64_t messages_sent = 0;       // ClientMessages written on the stream (Hello's included)
  // Of which the write was started on the submitting thread (no write was in flight); the
  // others were started by the previous write's OnWriteDone.
  uint64_t messages_sent_by_caller = 0;
  uint64_t messages_read_by_caller = 0;  // always 0: the stream's reactor reads every answer
  uint64_t requests_sent = 0;       // Requests inside them
  uint64_t messages_received = 0;   // ServerMessages read
  uint64_t responses_received = 0;  // Responses inside them
  uint64_t unknown_responses = 0;   // responses whose request id was not pending (ignored)
  uint64_t resumes = 0;             // sessions resumed by auto_resume after the stream broke
  uint64_t resent = 0;              // requests sent again after a resume
  uint64_t orphans_released = 0;    // blocks stored for offloads whose answer a crash swallowed
  uint64_t ring_requests_sent = 0;  // requests submitted on the request ring (not in the above)
  uint64_t ring_responses_received = 0;  // answers taken from it
};

// A request's answer: std::future-like (get, wait, wait_for, wait_until, valid) and convertible
// to std::future<T> (an rvalue Reply converts). Every wait waits for the stream's reactor (or
// the ring thread, or the session thread when the stream ends) to complete it; a Reply may be
// waited on after its Client is gone (the Client completes every request before it goes).
// A request submitted on the request ring without waking the daemon (it was polling the ring:
// RingCore "Deferred wake-ups") is rung for when its Reply is first waited on (get, wait,
// wait_for / wait_until with time left; a zero-timeout check does not ring) or converted to
// std::future, so a caller that waits does not also wait for the daemon's next poll. Moves
// only.
template <typename T>
class Reply {
 public:
  Reply() = default;
  Reply(Reply&& other) noexcept = default;
  Reply& operator=(Reply&& other) noexcept = default;

  T get() {
    RingDeferred();
    return future_.get();
  }
  void wait() const {
    RingDeferred();
    future_.wait();
  }
  template <typename Rep, typename Period>
  std::future_status wait_for(const std::chrono::duration<Rep, Period>& timeout) const {
    if (timeout > timeout.zero()) RingDeferred();  // a check that does not sleep does not ring
    return future_.wait_for(timeout);
  }
  template <typename Clock, typename Duration>
  std::future_status wait_until(const std::chrono::time_point<Clock, Duration>& deadline) const {
    if (deadline > Clock::now()) RingDeferred();
    return future_.wait_until(deadline);
  }
  bool valid() const { return future_.valid(); }
  operator std::future<T>() && {  // NOLINT(google-explicit-constructor): drop-in for futures
    RingDeferred();  // a std::future cannot ring when it is waited on
    return std::move(future_);
  }

 private:
  friend class Client;
  // `ring`: the request ring the request was submitted on (empty: the stream).
  Reply(std::future<T> future, std::weak_ptr<RingCore> ring)
      : future_(std::move(future)), ring_(std::move(ring)) {}
  // Rings the daemon for the ring's unrung submissions (RingCore::RingDeferred), if the ring
  // still exists.
  void RingDeferred() const {
    if (std::shared_ptr<RingCore> ring = ring_.lock()) ring->RingDeferred();
  }

  std::future<T> future_;
  std::weak_ptr<RingCore> ring_;
};

class Client {
 public:
  static constexpr size_t kMaxRequestsPerMessage = 4096;
  static constexpr size_t kMaxMessageBytes = 1 << 20;  // below gRPC's 4 MiB receive default

  // Connects to the daemon, opens the Session stream, sends Hello and waits for HelloReply.
  // Errors: INVALID_ARGUMENT socket path empty or longer than 107 bytes;
  //         PERMISSION_DENIED at once when this user may not connect to the socket (the
  //           message names the file that shuts it out, its group and how to join it);
  //         UNAVAILABLE nothing accepted a connection at the socket within the connect timeout
  //           (message says whether the socket file exists and how to start the daemon);
  //         DEADLINE_EXCEEDED connected but no HelloReply within the connect timeout;
  //         any code of an Error the daemon returns for Hello.
  static absl::StatusOr<std::unique_ptr<Client>> Connect(const ClientOptions& options);

  // Reconnects after the daemon went away (a call failed with UNAVAILABLE): Connect() with
  // options.resume_token set to `resume_token` (the previous Client's resume_token()), retried
  // with bounded exponential backoff while it fails with UNAVAILABLE or DEADLINE_EXCEEDED (the
  // daemon is restarting), at most options.reconnect_total_seconds. The new session holds the
  // blocks the previous one was told were stored (OffloadDone), under the same block ids;
  // regions are not kept: register them again (new region ids). Requests that were not
  // answered before the daemon went away are not re-sent: an offload not confirmed must be
  // offloaded again (its source is still the caller's); a reload not answered, again.
  // Errors: the last UNAVAILABLE / DEADLINE_EXCEEDED when the time is up; NOT_FOUND when the
  // daemon holds nothing for the token (it was restarted without a shared pool, the grace
  // period passed, or every block was released): the blocks are lost, Connect() anew;
  // PERMISSION_DENIED when the token belongs to another uid; others as Connect().
  static absl::StatusOr<std::unique_ptr<Client>> Resume(ClientOptions options,
                                                        absl::string_view resume_token);

  ~Client();  // Close()
  Client(const Client&) = delete;
  Client& operator=(const Client&) = delete;

  // Fields of the HelloReply that Connect() received (a resume by auto_resume does not change
  // them). Thread-safe: each takes the client's mutex and returns a copy.
  uint64_t session_id() const EXCLUDES(mu_);
  // Whether the daemon attached the request ring offered (ClientOptions::use_ring); when not,
  // ring_error() says why ("" when none was offered or the daemon predates rings). Connect's
  // Hello only: ring_active() tells whether a ring is in use now.
  bool ring_attached() const EXCLUDES(mu_);
  std::string ring_error() const EXCLUDES(mu_);
  // True while Offload, Reload(Tagged) and Release(Tagged) go on a request ring: the current
  // stream's Hello (Connect's, or the last resume's) attached the ring it offered and the stream
  // has not broken. False meanwhile, while a resume is under way, and after the session ended.
  bool ring_active() const EXCLUDES(mu_);
  std::string backend() const EXCLUDES(mu_);  // "shm" or "cuda"
  uint64_t pool_capacity_bytes() const EXCLUDES(mu_);
  uint64_t session_quota_bytes() const EXCLUDES(mu_);  // 0: none
  uint64_t chunk_bytes() const EXCLUDES(mu_);
  std::string link() const EXCLUDES(mu_);
  // The claim on this session's blocks across a daemon restart (keep it secret); pass it to
  // Resume(). The current session's: after an automatic resume that had to begin a new session
  // (the restarted daemon had none of this one, and the client held no blocks) it is the new
  // session's. Empty from a daemon older than resume tokens.
  std::string resume_token() const EXCLUDES(mu_);
  uint64_t blocks_resumed() const EXCLUDES(mu_);  // Resume() only
  // Seconds a restarted daemon holds this session's blocks; 0: its pool does not outlive it
  // (auto_resume then does nothing).
  double hello_resume_grace_seconds() const EXCLUDES(mu_);
  // Set at construction and never changed: read without the lock.
  const std::string& socket_path() const { return socket_path_; }

  // Registers a region; blocks until the daemon answers. Returns the region id to use in
  // Offload/Reload (the client's own id: it stays valid when auto_resume registers the region
  // again with a restarted daemon, so the handle must stay valid — keep the shm name). Errors: INVALID_ARGUMENT not exactly one of the handle kinds set, or a
  // cuda_ipc_handle that is not 64 bytes; the daemon's errors (e.g. NOT_FOUND shm object missing,
  // PERMISSION_DENIED cannot open it); UNAVAILABLE / FAILED_PRECONDITION as above.
  absl::StatusOr<uint64_t> RegisterRegion(const RegionHandle& handle);
  // RegisterRegion({.shm_name = region.name(), .size_bytes = region.size_bytes()}). The region
  // must outlive every request that uses it.
  absl::StatusOr<uint64_t> RegisterShmRegion(const ShmRegion& region);
  // Blocks until the daemon answers. Errors: the daemon's (NOT_FOUND unknown id, ...).
  absl::Status UnregisterRegion(uint64_t region_id);

  // Copies `bytes` at `offset` of region `region_id` into a new pool block. The client must not
  // modify those bytes until the future resolves: bytes written meanwhile give a block that
  // mixes old and new data (per chunk and within one), silently — the daemon cannot tell.
  // ready_event: CUDA IPC event handle bytes recorded after the kernels that wrote the data; the
  // daemon issues no chunk before it completed (cuda backend; empty = none, ignored by shm). tag: optional name
  // for the block, unique among the session's live blocks (0 = none; INVALID_ARGUMENT if in
  // use), so ReloadTagged/ReleaseTagged can be sent before this future resolves.
  // ordering: the block's place in the reload order (spill tier policy; optional).
  Reply<absl::StatusOr<OffloadResult>> Offload(uint64_t region_id, uint64_t offset,
                                                     uint64_t bytes,
                                                     absl::string_view ready_event = "",
                                                     uint64_t tag = 0,
                                                     OrderingHint ordering = {});

  // Copies block `block_id` back to `offset` of region `region_id`. release_after: free the
  // block once copied. deadline_seconds: seconds from now by which the data is needed (0: none).
  // done_event / ready_event (cuda backend; empty = none): the event protocol of
  // proto/offload.proto ReloadRequest — the daemon records done_event right after its last chunk
  // and answers then (ReloadResult::done_event_recorded; wait on the event only after the
  // answer); it writes nothing before ready_event (recorded after the destination's allocation
  // on its stream) completed.
  Reply<absl::StatusOr<ReloadResult>> Reload(uint64_t block_id, uint64_t region_id,
                                                   uint64_t offset, Priority priority,
                                                   bool release_after = false,
                                                   double deadline_seconds = 0,
                                                   absl::string_view done_event = "",
                                                   absl::string_view ready_event = "");
  // Reload of the block offloaded with `tag`; may be sent while that offload is still queued or
  // copying: the daemon runs it after the copy, so it returns the offloaded bytes. NOT_FOUND for
  // a tag with no live block; the offload's error if the tagged offload fails.
  Reply<absl::StatusOr<ReloadResult>> ReloadTagged(uint64_t tag, uint64_t region_id,
                                                         uint64_t offset, Priority priority,
                                                         bool release_after = false,
                                                         double deadline_seconds = 0,
                                                         absl::string_view done_event = "",
                                                         absl::string_view ready_event = "");

  // Frees block `block_id` in the pool. Errors: the daemon's (NOT_FOUND unknown block, ...).
  Reply<absl::Status> Release(uint64_t block_id);
  // Frees the block offloaded with `tag` (NOT_FOUND for a tag with no live block).
  Reply<absl::Status> ReleaseTagged(uint64_t tag);

  // Unary GetStats on the same channel (independent of the session stream).
  // Errors: the RPC's status (UNAVAILABLE daemon gone, DEADLINE_EXCEEDED after
  // unary_timeout_seconds), with the socket path appended.
  absl::StatusOr<v1::Stats> GetStats();

  // grpc.health.v1.Health/Check for `service` ("" = the whole daemon). OK when SERVING;
  // UNAVAILABLE when NOT_SERVING / UNKNOWN (message has the reported status); NOT_FOUND when the
  // daemon does not know `service`; UNIMPLEMENTED when it runs no health service; INTERNAL on a
  // malformed reply; other RPC errors as GetStats.
  absl::Status CheckHealth(absl::string_view service = "");

  // OK while the session stream is alive; afterwards the status pending requests failed with.
  absl::Status stream_status() const EXCLUDES(mu_);
  ClientCounters counters() const EXCLUDES(mu_);

  // Half-closes the stream (WritesDone) after sending every queued request, waits up to
  // close_timeout_seconds for the daemon to end it (cancelling it otherwise), and joins the
  // threads. Requests still pending then fail with CANCELLED. Idempotent; blocks concurrent
  // callers until done. The daemon releases the session's blocks and regions.
  void Close() EXCLUDES(close_mu_);

  // While at least one ScopedBatch is alive, queued requests are held and sent together when the
  // last one ends (or when a blocking call such as RegisterRegion flushes, or on Close()).
  // Do not wait on a future of a held request inside the scope: it cannot complete.
  class ScopedBatch {
   public:
    explicit ScopedBatch(Client& client);
    ~ScopedBatch();
    ScopedBatch(const ScopedBatch&) = delete;
    ScopedBatch& operator=(const ScopedBatch&) = delete;

   private:
    Client& client_;
  };

 private:
  // Completes one request: with the daemon's response, or (response == nullptr) with `failure`.
  using Completer = std::function<void(const v1::Response* response, const absl::Status& failure)>;

  // A request waiting for its answer: `request` names client region ids; internal ones (orphan
  // releases) are never re-sent; `region` is the client id a RegisterRegion will get.
  struct Pending {
    Completer done;
    v1::Request request;
    bool internal = false;
    uint64_t region = 0;
  };
  // One Session stream (offloadd_client.cc): a grpc::ClientBidiReactor whose reactions call
  // the Client's OnStream* methods.
  class SessionStream;
  // A resumed stream from its Hello until Install: its reactions fill this in, the session
  // thread waits for it (all under mu_).
  struct Handshake {
    std::unique_ptr<SessionStream> stream;
    // The request ring its Hello offers (null: none); closed with the Handshake unless Install
    // adopts it (the daemon attached it).
    std::shared_ptr<RingCore> ring;
    std::string ring_error;  // why no ring was offered ("" if one was)
    uint64_t hello_id = 0;
    absl::flat_hash_map<uint64_t, uint64_t> region_of_request;  // request id -> client region
    absl::flat_hash_map<uint64_t, uint64_t> daemon_region;      // client region id -> daemon's
    v1::HelloReply hello;
    bool hello_answered = false;
    absl::Status error;        // the first Error the daemon answered
    bool written = false;      // the Hello's OnWriteDone ran
    bool write_ok = false;
    bool read_ended = false;   // an OnReadDone(false) ran
    bool done = false;         // OnDone ran
  };
  // What to start on the current stream, chosen under mu_ and started after releasing it (a
  // Start* may run a reaction inline, and reactions take mu_).
  struct StreamStep {
    enum Kind { kNone, kWrite, kWritesDone, kReleaseHold } kind = kNone;
    SessionStream* stream = nullptr;
    v1::ClientMessage message;  // kWrite
  };

  // `ring`: the request ring to offer in Hello (null: none).
  Client(const ClientOptions& options, std::string socket_path,
         std::shared_ptr<grpc::Channel> channel, std::shared_ptr<RingCore> ring);
  // Connect, after Start(): sends Hello (offering ring_) and waits for the HelloReply, at most
  // connect_timeout_seconds; then AdoptHello. Errors: as Connect's after the socket connected.
  absl::Status SayHello(const std::string& ring_error) EXCLUDES(mu_);
  // Under mu_: records `reply` (ring_error: why no ring was offered, "" if one was) and starts
  // the ring thread when the daemon attached the ring and StopRing has not run yet; a ring it
  // did not attach is closed.
  void AdoptHello(v1::HelloReply reply, const std::string& ring_error) EXCLUDES(mu_);
  // Opens the first stream and starts the session thread.
  void Start() EXCLUDES(mu_);
  // The session thread: waits for each stream's OnDone; resumes or fails what is pending.
  void SessionLoop() EXCLUDES(mu_);
  // Session thread, after the stream ended: resume on a restarted daemon. True when a new
  // stream is installed; false (with *failure set) to give up.
  bool ResumeAfterBreak(absl::Status* failure) EXCLUDES(mu_);
  // Opens a stream, says Hello with `token` (offering a new request ring when use_ring) and
  // registers `regions` again, all within `seconds`. OK: handshake_ holds the stream and the
  // ring offered, ready for Install; otherwise both are gone (the ring closed).
  absl::Status OpenResumed(const std::string& token,
                           const absl::flat_hash_map<uint64_t, RegionHandle>& regions,
                           double seconds) EXCLUDES(mu_);
  // The message that opens a resumed stream: Hello with `token` offering a new request ring
  // (made here, into h->ring, when use_ring), then `regions` registered again (their request
  // ids go to h->region_of_request).
  v1::ClientMessage ResumeMessage(const std::string& token,
                                  const absl::flat_hash_map<uint64_t, RegionHandle>& regions,
                                  Handshake* h);
  // Whether the handshake is over (answered, failed, or its stream ended); its result.
  static bool HandshakeOver(const Handshake& h);
  absl::Status HandshakeResult(const Handshake& h, double seconds) const;
  // Installs handshake_'s stream: settles the pending requests across the restart, re-sends
  // the others on the stream, and moves later requests to the ring its Hello offered when the
  // daemon attached it.
  void Install() EXCLUDES(mu_);
  // Install's work on pending_: every request not answered is settled (into *answered or
  // *failed, taken off pending_) or queued in outbox_ to be sent again, in the order they
  // were issued; one the old ring carried gets the stream id its number without
  // kRingRequestIdBit makes (the daemon refuses ring ids on the stream of a ring session).
  // Orphan releases of an earlier resume are dropped.
  void ResendLocked(const absl::flat_hash_set<uint64_t>& resumed,
                    std::vector<std::pair<Pending, v1::Response>>* answered,
                    std::vector<std::pair<Pending, absl::Status>>* failed) REQUIRES(mu_);
  // Queues an internal release of each block in `orphans` (stored for an offload whose answer
  // the crash swallowed).
  void ReleaseOrphansLocked(const std::vector<uint64_t>& orphans) REQUIRES(mu_);
  // Install: the resume's ring (h.ring) becomes ring_ and gets a ring thread when the daemon
  // attached it; otherwise ring_ is null. The ring it replaces (stopped by StopRing) goes to
  // *old, to be dropped without mu_.
  void AdoptResumedRingLocked(Handshake* h, std::shared_ptr<RingCore>* old) REQUIRES(mu_);
  // Starts the ring thread of ring_ (attached; no ring thread running) and routes requests to
  // it (ring_active_).
  void StartRingLocked() REQUIRES(mu_);
  // What an unanswered request becomes across a restart: false (send it again), or true with
  // its answer in *answer (body set) or *failure.
  bool SettleLocked(const v1::Request& request, const absl::flat_hash_set<uint64_t>& resumed,
                    v1::Response* answer, absl::Status* failure) REQUIRES(mu_);
  // `request` as the daemon must see it: client region ids mapped, confirmed tags as block ids.
  v1::Request WireLocked(const v1::Request& request) const REQUIRES(mu_);
  // Keeps the client's view of its blocks and regions; rewrites region ids to the client's.
  void AccountLocked(const Pending& p, v1::Response* response) REQUIRES(mu_);
  // Whether `request` goes on the request ring (attached, still in use, and a per-tensor
  // request the ring can carry); mu_ held.
  bool OnRingLocked(const v1::Request& request) const REQUIRES(mu_);
  // The ring thread of `ring`: takes its answers and completes their requests, until the
  // stream ended (ring_stop_) and every answer already in the ring was taken.
  void RingLoop(const std::shared_ptr<RingCore>& ring) EXCLUDES(mu_);
  // Completes the request `response` answers, if still pending (taken off pending_ under mu_,
  // completed without it).
  void CompleteFromRing(v1::Response response) EXCLUDES(mu_);
  // Stops and joins the ring thread (the stream ended) and shuts the ring down: it is not used
  // again (a resume offers a new one). Safe to call more than once, also concurrently: only
  // the first finds a thread to join.
  void StopRing() EXCLUDES(mu_);
  Reply<absl::StatusOr<ReloadResult>> SubmitReload(uint64_t block_id, uint64_t tag,
                                                         uint64_t region_id, uint64_t offset,
                                                         Priority priority, bool release_after,
                                                         double deadline_seconds,
                                                         absl::string_view done_event,
                                                         absl::string_view ready_event);
  Reply<absl::Status> SubmitRelease(uint64_t block_id, uint64_t tag);

  // The reactions of `stream` (the current one, or handshake_'s), forwarded by SessionStream.
  // message == nullptr: the read failed (the stream ended).
  void OnStreamRead(SessionStream* stream, v1::ServerMessage* message) EXCLUDES(mu_);
  void OnStreamWritten(SessionStream* stream, bool ok) EXCLUDES(mu_);
  void OnStreamDone(SessionStream* stream, const grpc::Status& status) EXCLUDES(mu_);
  // Moves the answers in `message` to *ready, for the caller to run without mu_.
  void TakeAnswersLocked(v1::ServerMessage* message,
                         std::vector<std::pair<Completer, v1::Response>>* ready) REQUIRES(mu_);
  // Records a handshake stream's answers in handshake_.
  void TakeHandshakeAnswersLocked(const v1::ServerMessage& message) REQUIRES(mu_);
  // The next operation the current stream needs (see StreamStep): a write of what outbox_ holds
  // when none is in flight and no ScopedBatch holds it, WritesDone once closing with nothing
  // left, or the release of the stream's hold once it ended.
  StreamStep NextStepLocked() REQUIRES(mu_);
  // Starts `step` on its stream; mu_ not held.
  static void RunStep(StreamStep step);
  // Cancels the current stream unless a resume is under way (its stream then ended already).
  void CancelStream() EXCLUDES(mu_);
  void FailAll(const absl::Status& failure) EXCLUDES(mu_);
  // Close() ended the session: sets stream_status_ (later requests: FAILED_PRECONDITION) and
  // returns what pending requests fail with (CANCELLED).
  absl::Status ClosedLocked() REQUIRES(mu_);
  // Queues `request` (its id already set) unless the stream is over; returns why not. A request
  // submitted on the request ring sets *ring to it (for the Reply to ring for a deferred
  // wake-up).
  absl::Status Enqueue(v1::Request request, Completer done, bool flush, uint64_t region,
                       std::weak_ptr<RingCore>* ring) EXCLUDES(mu_);
  template <typename R, typename Convert>
  Reply<R> Submit(v1::Request request, v1::Response::BodyCase expected, Convert convert,
                        bool flush, uint64_t region = 0);
  absl::Status StatusWithPath(const grpc::Status& status, absl::string_view rpc) const;

  // Moves what outbox_ holds (up to the message limits) into *message and sets writing_.
  void TakeMessageLocked(v1::ClientMessage* message) REQUIRES(mu_);

  const ClientOptions options_;
  const std::string socket_path_;
  const std::string target_;  // "unix:" + socket_path_
  std::atomic<uint64_t> next_request_id_{1};

  // base::Mutex (over std::mutex) rather than absl::Mutex so that ThreadSanitizer (--config=tsan)
  // sees the locking: Debian's absl is not instrumented.
  mutable base::Mutex mu_;
  base::CondVar cv_;  // any change of the state below that a thread may wait for
  // The channel of the current stream (GetStats, CheckHealth); replaced by a resume.
  std::shared_ptr<grpc::Channel> channel_ GUARDED_BY(mu_);
  // The current stream. Replaced only by Install, after the old one's OnDone; a thread that
  // read the pointer under mu_ uses it without mu_ while it holds a reason the stream cannot
  // reach OnDone (writing_ or holding_ set by it), or after Close() began (nothing replaces it
  // then).
  std::unique_ptr<SessionStream> stream_ GUARDED_BY(mu_);
  // The current stream still has its hold: writes may be started on it from outside its
  // reactions. Released once (NextStepLocked) after WritesDone or once the stream ended.
  bool holding_ GUARDED_BY(mu_) = false;
  // A write is in flight (started, OnWriteDone not yet run): one at a time.
  bool writing_ GUARDED_BY(mu_) = false;
  bool stream_ended_ GUARDED_BY(mu_) = false;  // a read or write on the current stream failed
  bool stream_done_ GUARDED_BY(mu_) = false;   // the current stream's OnDone ran
  grpc::Status stream_final_ GUARDED_BY(mu_);  // and the status it gave
  // A resume's stream until Install (null otherwise).
  std::unique_ptr<Handshake> handshake_ GUARDED_BY(mu_);
  std::deque<v1::Request> outbox_ GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, Pending> pending_ GUARDED_BY(mu_);
  // The session's resume token (a fresh one after NOT_FOUND).
  std::string token_ GUARDED_BY(mu_);
  bool reconnecting_ GUARDED_BY(mu_) = false;  // the stream broke; requests wait in pending_
  uint64_t next_region_id_ GUARDED_BY(mu_) = 1;
  // Client region id -> handle.
  absl::flat_hash_map<uint64_t, RegionHandle> regions_ GUARDED_BY(mu_);
  // Client region id -> daemon's.
  absl::flat_hash_map<uint64_t, uint64_t> daemon_region_ GUARDED_BY(mu_);
  absl::flat_hash_set<uint64_t> confirmed_ GUARDED_BY(mu_);  // block ids confirmed and not released
  // Confirmed, but the restarted daemon lacked them.
  absl::flat_hash_set<uint64_t> lost_ GUARDED_BY(mu_);
  absl::flat_hash_map<uint64_t, uint64_t> tag_block_ GUARDED_BY(mu_);  // tag -> confirmed block id
  int batch_depth_ GUARDED_BY(mu_) = 0;
  bool flush_ GUARDED_BY(mu_) = false;
  bool closing_ GUARDED_BY(mu_) = false;   // Close() began: no new requests
  bool finished_ GUARDED_BY(mu_) = false;  // the last stream ended, pending requests failed
  absl::Status stream_status_ GUARDED_BY(mu_);
  // The first HelloReply: set by Connect (under mu_, as the session thread and the reactions
  // may already read it), never changed by a resume. Read under mu_ only; the accessors copy.
  v1::HelloReply hello_ GUARDED_BY(mu_);
  ClientCounters counters_ GUARDED_BY(mu_);

  // The request ring of the current session: the one Connect's Hello offered (set by the
  // constructor), then the one the last resume's Hello offered and the daemon attached (set by
  // Install, after StopRing stopped and shut down the one before). Null: none offered, or the
  // daemon did not attach it. A thread that uses it without mu_ (Enqueue's submission, the ring
  // thread, StopRing) holds its own reference, taken under mu_, so a ring replaced meanwhile
  // lives until that thread is done with it (a shut-down ring refuses every submission); its
  // RingCore is thread-safe on its own.
  std::shared_ptr<RingCore> ring_ GUARDED_BY(mu_);
  bool ring_active_ GUARDED_BY(mu_) = false;  // ring_ attached, and its stream has not broken
  // Set when the ring thread found the ring corrupt and cancelled the stream: what pending and
  // later requests fail with (the session is not resumed).
  absl::Status ring_failure_ GUARDED_BY(mu_);
  // Set under mu_ by StopRing (the stream ended), cleared under mu_ by Install when it starts
  // the next ring's thread (the session thread, which also runs StopRing, joined the old one
  // before); read without mu_ by the ring thread.
  std::atomic<bool> ring_stop_{false};
  // Started by AdoptHello under mu_ unless ring_stop_ is set; moved out and joined by the first
  // StopRing, which sets ring_stop_ in the same critical section. So a ring thread is either
  // never started or joined, whichever of Connect and the stream's end comes first. AdoptHello
  // cannot run after an Install: a resume needs hello_'s resume_grace_seconds, which
  // AdoptHello sets in the same critical section as its decision. Install starts the thread of
  // a resume's ring; the StopRing after that stream's end joins it.
  std::thread ring_thread_ GUARDED_BY(mu_);
  base::Mutex close_mu_;  // serialises Close()
  std::thread session_thread_;
};

}  // namespace client
}  // namespace offloadd

#endif  // OFFLOADD_CLIENT_OFFLOADD_CLIENT_H_
