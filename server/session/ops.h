// Offload and reload as operation objects: one accepted request's walk from the store to the
// link scheduler and back, with named states and a single Finish that does every cleanup once.
//
// Session validates a request (region known, bounds, priority) and hands it to an operation:
//   OffloadOp: kValidated -> kAdmitting (BlockStore::Reserve) -> kAdmitted (block reserved,
//              CopyEngine::BeginTransfer with the ready event) -> kCopying (sched::Transfer on the GPU's d2h link) -> kStored
//   ReloadOp:  kValidated -> kWaitingForBlock (BlockStore::BeginReload; waits while the block's
//              offload copies or it is on disk) -> kCopying (h2d link) -> kReloaded
// Any step may end in kFailed instead. Every exit goes through Finish(status), exactly once,
// which undoes what the op holds in the order the states took it: the store's block
// (OffloadFinished / EndReload), the transfer counters and metrics (only once copying began),
// the session's tag bookkeeping, the one answer to the client, and last the Core's transfer
// count (TransferTicket), so a shutdown waiting for transfers sees the answer sent.
// An offload admitted after its session closed finishes without an answer: the session's close
// answers every request it still counts.
// Threads: Start runs on the caller's thread; the store's callbacks and the transfer's done run
// on store or link-worker threads, one after another for one op (the store and the scheduler
// order them), never two at once. Ops hold their session's OpOwner alive until they finish.
#ifndef OFFLOADD_SERVER_SESSION_OPS_H_
#define OFFLOADD_SERVER_SESSION_OPS_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "server/copy/copy_engine.h"
#include "server/session/copy_gate.h"
#include "server/session/core.h"
#include "server/session/request.h"

namespace offloadd::session {

// Removes the per-GPU transfer series of `gpu` (offloadd_transfers_total and
// offloadd_transfer_bytes_total, both directions and statuses) from the metrics registry: for a
// probe's device once its last session ended (Core::ReleaseLink). The unlabelled duration and
// size histograms keep the probe's observations.
void ForgetTransferSeries(const std::string& gpu);

// Whether [offset, +bytes) lies inside [0, size_bytes), without overflow.
inline bool RangeInside(uint64_t offset, uint64_t bytes, uint64_t size_bytes) {
  return offset <= size_bytes && bytes <= size_bytes - offset;
}

// What an operation needs from the session that started it (Session implements it; tests fake
// it). Called from any thread, never with the op's own locks held.
class OpOwner {
 public:
  virtual ~OpOwner() = default;
  // The op's one answer: a completion, or an error for `request_id`.
  virtual void Answer(Completion c) = 0;
  virtual void AnswerError(uint64_t request_id, absl::Status status) = 0;
  // Whether the session has closed (an op admitted then gives its space back unanswered).
  virtual bool SessionClosed() const = 0;
  // Claims `tag` for a new block; false when it already names a live block of the session.
  virtual bool ClaimTag(uint64_t tag) = 0;
  // The claimed tag's offload was admitted as `block_id`, or failed (block_id 0, `status`).
  virtual void TagResolved(uint64_t tag, uint64_t block_id, const absl::Status& status) = 0;
  // The block is gone (failed copy, released after a reload): drop its tag.
  virtual void ForgetBlock(uint64_t block_id) = 0;
  // A reload already answered (its done event was recorded) then failed: the client may have
  // consumed bytes that never landed, so the session must end with `status` (DATA_LOSS to the
  // client). Must not block or close on the calling thread (a link or device thread).
  virtual void FailAfterAnswer(uint64_t request_id, absl::Status status) = 0;
};

// Core::BeginTransfer / EndTransfer as a scoped object: a taken ticket counts one accepted
// transfer until it is released or destroyed (Core::Drain waits for the count to reach 0).
class TransferTicket {
 public:
  TransferTicket() = default;
  // An empty ticket (false) once the core has begun draining.
  static TransferTicket Take(Core* core);
  TransferTicket(TransferTicket&& other) noexcept;
  TransferTicket& operator=(TransferTicket&& other) noexcept;
  TransferTicket(const TransferTicket&) = delete;
  TransferTicket& operator=(const TransferTicket&) = delete;
  ~TransferTicket() { Release(); }
  explicit operator bool() const { return core_ != nullptr; }
  // Ends the transfer now (Core::EndTransfer); no-op for an empty or released ticket.
  void Release();

 private:
  explicit TransferTicket(Core* core) : core_(core) {}
  Core* core_ = nullptr;
};

// What an op works with: the core, the session it belongs to and that session's copy gate.
struct OpContext {
  Core* core = nullptr;
  std::shared_ptr<OpOwner> owner;  // kept alive until the op finishes
  uint64_t session_id = 0;
  int64_t uid = -1;  // the session's peer uid; -1 when unknown
  std::string device_id;  // the session's GPU: its link carries the copy (AcquireLink done)
  std::shared_ptr<CopyGate> gate;  // every chunk copy passes it
};

enum class OpState {
  kValidated,        // accepted by the session, nothing held yet
  kAdmitting,        // offload: waiting for BlockStore::Reserve
  kAdmitted,         // offload: block reserved, waiting for the client's ready event
  kWaitingForBlock,  // reload: waiting for the block's bytes to be in the pool
  kCopying,          // a sched::Transfer is on the link
  kStored,           // offload done: block resident, OffloadDone sent
  kReloaded,         // reload done: bytes in client memory, ReloadDone sent
  kFailed,           // finished with an error (answered unless the session had closed)
};
const char* OpStateName(OpState state);

// Base of both ops: state, the transfer ticket and the count of Finish calls.
class Op {
 public:
  virtual ~Op() = default;
  OpState state() const { return state_.load(); }
  // Times Finish was called (1 once finished; a second call is a bug, logged and ignored).
  int finish_calls() const { return finish_calls_.load(); }

 protected:
  explicit Op(OpContext context, Request request);
  // True for the first call only: the caller then does the cleanup.
  bool BeginFinish();
  void SetState(OpState state) { state_.store(state); }

  const OpContext ctx_;
  const Request request_;
  TransferTicket ticket_;
  const double start_seconds_;

 private:
  std::atomic<OpState> state_{OpState::kValidated};
  std::atomic<int> finish_calls_{0};
};

class OffloadOp : public Op, public std::enable_shared_from_this<OffloadOp> {
 public:
  // `request`: an offload whose region is `region` and whose [offset, +bytes) lies inside it.
  static std::shared_ptr<OffloadOp> Create(OpContext context, Request request,
                                           std::shared_ptr<copy::Region> region);
  // Takes a transfer ticket (UNAVAILABLE while shutting down), claims the tag (INVALID_ARGUMENT
  // when in use) and asks the store for space; the rest follows on the store's callback.
  void Start();

 private:
  OffloadOp(OpContext context, Request request, std::shared_ptr<copy::Region> region);
  void Admitted(absl::StatusOr<store::BlockRef> ref);
  // Fills in `t`, the d2h transfer of the reserved block, and submits it to the GPU's link.
  void SubmitCopy(std::shared_ptr<sched::Transfer> t);
  // `answer` false: the session closed first and answers the request itself.
  void Finish(absl::Status status, bool answer = true);
  // The CRC32C of the block's bytes in the pool for its record (CoreOptions::pool_data_checksums
  // on a shared pool, the copy OK); nullopt otherwise.
  std::optional<uint32_t> DataCrc(const absl::Status& status) const;

  std::shared_ptr<copy::TransferOrder> order_;  // from admission until the transfer is built

  const std::shared_ptr<copy::Region> region_;
  bool tag_claimed_ = false;
  store::BlockRef block_;  // block_id != 0 once reserved
  double admitted_seconds_ = 0;
};

class ReloadOp : public Op, public std::enable_shared_from_this<ReloadOp> {
 public:
  // `request`: a reload with a known priority into `region`, block_id resolved (not a tag).
  static std::shared_ptr<ReloadOp> Create(OpContext context, Request request,
                                          std::shared_ptr<copy::Region> region);
  // Takes a transfer ticket (UNAVAILABLE while shutting down) and starts the store's reload
  // (its error, e.g. NOT_FOUND for a block of another session, finishes the op at once).
  void Start();

 private:
  ReloadOp(OpContext context, Request request, std::shared_ptr<copy::Region> region);
  void Readable(absl::StatusOr<store::BlockRef> ref);
  // Builds the h2d transfer of the block and submits it to the GPU's link.
  void SubmitCopy(const store::BlockRef& block);
  // The engine recorded the client's done event after the last chunk (CUDA): answer now, before
  // the copy completes; the client's compute stream waits on the event (the event protocol,
  // docs/ARCHITECTURE.md). Runs on the device thread.
  void AnswerRecorded() EXCLUDES(answer_mu_);
  Completion DoneCompletion(bool recorded) const;
  void Finish(absl::Status status) EXCLUDES(answer_mu_);

  const std::shared_ptr<copy::Region> region_;
  bool store_reload_open_ = false;  // BeginReload accepted: EndReload is owed
  uint64_t bytes_ = 0;               // the block's size once readable
  double ready_seconds_ = 0;
  // AnswerRecorded (device thread) and Finish (link worker) may race on an error: one answer.
  base::Mutex answer_mu_;
  bool answered_ GUARDED_BY(answer_mu_) = false;
  bool finishing_ GUARDED_BY(answer_mu_) = false;
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_OPS_H_
