#include "server/session/ops.h"

#include <functional>
#include <utility>

#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "glog/logging.h"
#include "server/base/crc32c.h"
#include "server/metrics/metrics.h"

namespace offloadd::session {
namespace {

// Held across a per-GPU counter's Add and Increment, and by ForgetTransferSeries: a series
// removed between the two would be incremented after it was freed (a new probe session on the
// device the last one's close forgets).
base::Mutex& TransferSeriesMutex() {
  static base::Mutex* mu = new base::Mutex;
  return *mu;
}

void RecordTransfer(const char* direction, const std::string& gpu, uint64_t bytes,
                    double seconds, bool ok) {
  auto& m = metrics::Get();
  const char* status = ok ? "ok" : "error";
  {
    base::MutexLock lock(TransferSeriesMutex());
    m.transfers_total->Add({{"direction", direction}, {"gpu", gpu}, {"status", status}})
        .Increment();
    if (ok) {
      m.transfer_bytes_total->Add({{"direction", direction}, {"gpu", gpu}, {"status", status}})
          .Increment(static_cast<double>(bytes));
    }
  }
  if (!ok) return;
  m.transfer_duration_seconds->Add({{"direction", direction}}, metrics::DurationBuckets())
      .Observe(seconds);
  m.transfer_size_bytes
      ->Add({{"direction", direction}},
            prometheus::Histogram::BucketBoundaries{4096, 65536, 1 << 20, 8 << 20, 64 << 20,
                                                    256 << 20, 1 << 30})
      .Observe(static_cast<double>(bytes));
}

}  // namespace

void ForgetTransferSeries(const std::string& gpu) {
  auto& m = metrics::Get();
  base::MutexLock lock(TransferSeriesMutex());
  for (const char* direction : {"d2h", "h2d"}) {
    for (const char* status : {"ok", "error"}) {
      const prometheus::Labels labels{{"direction", direction}, {"gpu", gpu}, {"status", status}};
      for (auto* family : {m.transfers_total, m.transfer_bytes_total}) {
        if (family->Has(labels)) family->Remove(&family->Add(labels));
      }
    }
  }
}

namespace {

absl::Status SessionEndedBeforeCopy() {
  return absl::CancelledError("the session ended before this copy started");
}

// One chunk copy between client memory and the pool, run only while the session is open
// (copy_gate.h): after the session ended, queued chunks fail without touching client memory.
std::function<absl::Status(uint64_t, uint64_t)> GatedCopy(
    const OpContext& ctx, std::shared_ptr<copy::Region> region,
    std::shared_ptr<copy::TransferOrder> order, copy::Direction direction,
    uint64_t region_offset, uint8_t* host) {
  return [gate = ctx.gate, core = ctx.core, region, order, direction, region_offset, host](
             uint64_t o, uint64_t len) {
    CopyGate::Pass pass(gate);
    if (!pass) return SessionEndedBeforeCopy();
    return core->engine().CopyOrderedChunk(order.get(), o, direction, *region, region_offset + o,
                                           host + o, len);
  };
}

// The asynchronous form of GatedCopy: a chunk is posted only while the session is
// open, and its pass is held until the engine reports it done, so the session's end waits for
// the chunks already posted (their copies touch client memory) and no chunk is posted after it.
std::function<void(uint64_t, uint64_t, std::function<void(absl::Status)>)> GatedPost(
    const OpContext& ctx, std::shared_ptr<copy::Region> region,
    std::shared_ptr<copy::TransferOrder> order, copy::Direction direction,
    uint64_t region_offset, uint8_t* host, sched::TrafficClass cls) {
  const copy::ChunkUrgency urgency = cls == sched::TrafficClass::kUrgent
                                         ? copy::ChunkUrgency::kUrgent
                                         : copy::ChunkUrgency::kNormal;
  return [gate = ctx.gate, core = ctx.core, region, order, direction, region_offset, host,
          urgency](uint64_t o, uint64_t len, std::function<void(absl::Status)> done) {
    auto pass = std::make_shared<CopyGate::Pass>(gate);
    if (!*pass) return done(SessionEndedBeforeCopy());
    core->engine().PostOrderedChunk(order.get(), o, direction, *region, region_offset + o,
                                    host + o, len, urgency,
                                    [pass, done = std::move(done)](absl::Status st) mutable {
                                      pass.reset();  // the chunk no longer touches client memory
                                      done(std::move(st));
                                    });
  };
}

// The chunk callbacks of a transfer between `region` at `region_offset` and the pool at `host`.
void SetChunkCopy(const OpContext& ctx, const std::shared_ptr<copy::Region>& region,
                  const std::shared_ptr<copy::TransferOrder>& order, copy::Direction direction,
                  uint64_t region_offset, uint8_t* host, sched::Transfer* t) {
  t->copy_chunk = GatedCopy(ctx, region, order, direction, region_offset, host);
  if (ctx.core->engine().asynchronous()) {  // posted; completion from the engine
    t->post_chunk = GatedPost(ctx, region, order, direction, region_offset, host, t->cls);
  }
}

// The engine's ordering of one transfer of `ctx`'s session: it stops waiting for a ready
// event once the session has ended.
absl::StatusOr<std::shared_ptr<copy::TransferOrder>> BeginOrderedTransfer(
    const OpContext& ctx, copy::Region& region, copy::TransferSpec spec) {
  spec.cancelled = [gate = ctx.gate] { return gate->closed(); };
  spec.owner_id = ctx.session_id;
  spec.owner_uid = ctx.uid;
  return ctx.core->engine().BeginTransfer(region, std::move(spec));
}

// Tells the link carrying `t` when the engine holds its chunks for the client's producer
// (LinkScheduler::SetWaitingForProducer), so that a producer running for seconds, or never
// ending, holds none of the GPU's chunk slots. The transfer is named by address only: the
// engine reports while one of its chunks is posted, so it is then in flight on that link.
void ReportProducerWaits(const OpContext& ctx, copy::Direction direction,
                         const sched::Transfer* t, copy::TransferSpec* spec) {
  std::shared_ptr<Core::Link> link = ctx.core->LinkFor(ctx.device_id);
  std::weak_ptr<sched::LinkScheduler> scheduler =
      direction == copy::Direction::kDeviceToHost ? link->d2h : link->h2d;
  spec->on_producer_wait = [scheduler, t](bool waiting) {
    if (auto s = scheduler.lock()) s->SetWaitingForProducer(t, waiting);
  };
}

}  // namespace

const char* OpStateName(OpState state) {
  switch (state) {
    case OpState::kValidated: return "validated";
    case OpState::kAdmitting: return "admitting";
    case OpState::kAdmitted: return "admitted";
    case OpState::kWaitingForBlock: return "waiting_for_block";
    case OpState::kCopying: return "copying";
    case OpState::kStored: return "stored";
    case OpState::kReloaded: return "reloaded";
    case OpState::kFailed: return "failed";
  }
  return "unknown";
}

TransferTicket TransferTicket::Take(Core* core) {
  return core->BeginTransfer() ? TransferTicket(core) : TransferTicket();
}

TransferTicket::TransferTicket(TransferTicket&& other) noexcept
    : core_(std::exchange(other.core_, nullptr)) {}

TransferTicket& TransferTicket::operator=(TransferTicket&& other) noexcept {
  if (this != &other) {
    Release();
    core_ = std::exchange(other.core_, nullptr);
  }
  return *this;
}

void TransferTicket::Release() {
  if (Core* core = std::exchange(core_, nullptr)) core->EndTransfer();
}

Op::Op(OpContext context, Request request)
    : ctx_(std::move(context)),
      request_(std::move(request)),
      start_seconds_(ctx_.core->clock().NowSeconds()) {}

bool Op::BeginFinish() {
  if (finish_calls_.fetch_add(1) == 0) return true;
  LOG(DFATAL) << "request " << request_.request_id << " finished twice (state "
              << OpStateName(state()) << "); the second finish is ignored";
  return false;
}

// ---- OffloadOp ----

std::shared_ptr<OffloadOp> OffloadOp::Create(OpContext context, Request request,
                                             std::shared_ptr<copy::Region> region) {
  return std::shared_ptr<OffloadOp>(
      new OffloadOp(std::move(context), std::move(request), std::move(region)));
}

OffloadOp::OffloadOp(OpContext context, Request request, std::shared_ptr<copy::Region> region)
    : Op(std::move(context), std::move(request)), region_(std::move(region)) {}

void OffloadOp::Start() {
  ticket_ = TransferTicket::Take(ctx_.core);
  if (!ticket_) {
    return Finish(absl::UnavailableError(
        "offloadd is shutting down: keep the tensor in process memory and reconnect when the "
        "daemon is back"));
  }
  if (request_.tag != 0) {
    if (!ctx_.owner->ClaimTag(request_.tag)) {
      return Finish(absl::InvalidArgumentError(absl::StrFormat(
          "tag %d already names a live block of this session: use a fresh tag, or release "
          "that block first",
          request_.tag)));
    }
    tag_claimed_ = true;
  }
  SetState(OpState::kAdmitting);
  ctx_.core->store().Reserve(
      ctx_.session_id, request_.bytes,
      [self = shared_from_this()](absl::StatusOr<store::BlockRef> ref) {
        self->Admitted(std::move(ref));
      },
      request_.order);
}

void OffloadOp::Admitted(absl::StatusOr<store::BlockRef> ref) {
  if (!ref.ok()) return Finish(ref.status());
  block_ = *ref;
  SetState(OpState::kAdmitted);
  // Admitted as the session ended: give the space back; the session's close answers.
  if (ctx_.owner->SessionClosed()) {
    return Finish(absl::CancelledError("session ended"), /*answer=*/false);
  }
  auto t = std::make_shared<sched::Transfer>();
  copy::TransferSpec spec;
  spec.direction = copy::Direction::kDeviceToHost;
  spec.bytes = request_.bytes;
  spec.ready_event = request_.ready_event;  // the first chunk waits for it, nothing else does
  ReportProducerWaits(ctx_, spec.direction, t.get(), &spec);
  auto order = BeginOrderedTransfer(ctx_, *region_, std::move(spec));
  if (!order.ok()) return Finish(order.status());
  order_ = *std::move(order);
  admitted_seconds_ = ctx_.core->clock().NowSeconds();
  // Reloads and releases that named the block by tag before it existed run now; the store
  // orders reloads after the copy.
  if (tag_claimed_) ctx_.owner->TagResolved(request_.tag, block_.block_id, absl::OkStatus());
  SubmitCopy(std::move(t));
}

void OffloadOp::SubmitCopy(std::shared_ptr<sched::Transfer> t) {
  t->gpu = ctx_.device_id;
  t->cls = sched::TrafficClass::kOffload;
  t->bytes = request_.bytes;
  t->owner_id = ctx_.session_id;
  uint8_t* host = ctx_.core->pool_base() + block_.extent.offset;
  SetChunkCopy(ctx_, region_, order_, copy::Direction::kDeviceToHost, request_.offset, host,
               t.get());
  order_.reset();  // the chunks hold it until the last one completed
  t->done = [self = shared_from_this()](absl::Status st) { self->Finish(std::move(st)); };
  SetState(OpState::kCopying);
  ctx_.core->LinkFor(ctx_.device_id)->d2h->Submit(std::move(t));
}

std::optional<uint32_t> OffloadOp::DataCrc(const absl::Status& status) const {
  Core* core = ctx_.core;
  if (!status.ok() || block_.block_id == 0 || !core->options().pool_data_checksums ||
      !core->store().survives_restart()) {
    return std::nullopt;
  }
  // The copy is over and the block not yet resident: nothing else reads or frees its extent.
  return base::Crc32c(core->pool_base() + block_.extent.offset, block_.bytes);
}

void OffloadOp::Finish(absl::Status status, bool answer) {
  if (!BeginFinish()) return;
  const bool copied = state() == OpState::kCopying;
  const bool tag_resolved = copied;  // TagResolved(block) ran just before the copy
  SetState(status.ok() ? OpState::kStored : OpState::kFailed);
  Core* core = ctx_.core;
  if (block_.block_id != 0) core->store().OffloadFinished(block_.block_id, status, DataCrc(status));
  const double now = ctx_.core->clock().NowSeconds();
  if (copied) {
    core->CountTransfer(/*offload=*/true, request_.bytes, status.ok());
    RecordTransfer("d2h", ctx_.device_id, request_.bytes, now - start_seconds_, status.ok());
  }
  if (!status.ok() && tag_claimed_ && answer) {
    if (tag_resolved) {
      ctx_.owner->ForgetBlock(block_.block_id);
    } else {
      ctx_.owner->TagResolved(request_.tag, 0, status);
    }
  }
  if (status.ok()) {
    Completion c;
    c.request_id = request_.request_id;
    c.kind = CompletionKind::kOffloadDone;
    c.id = block_.block_id;
    c.bytes = request_.bytes;
    c.queued_seconds = block_.queued_seconds;
    c.copy_seconds = now - admitted_seconds_;
    ctx_.owner->Answer(std::move(c));
  } else if (answer) {
    ctx_.owner->AnswerError(request_.request_id, std::move(status));
  }
  ticket_.Release();
}

// ---- ReloadOp ----

std::shared_ptr<ReloadOp> ReloadOp::Create(OpContext context, Request request,
                                           std::shared_ptr<copy::Region> region) {
  return std::shared_ptr<ReloadOp>(
      new ReloadOp(std::move(context), std::move(request), std::move(region)));
}

ReloadOp::ReloadOp(OpContext context, Request request, std::shared_ptr<copy::Region> region)
    : Op(std::move(context), std::move(request)), region_(std::move(region)) {}

void ReloadOp::Start() {
  ticket_ = TransferTicket::Take(ctx_.core);
  if (!ticket_) {
    return Finish(absl::UnavailableError(
        "offloadd is shutting down: the block cannot be reloaded; recompute it or fail the "
        "step"));
  }
  SetState(OpState::kWaitingForBlock);
  // The store calls back at once for a resident block (before BeginReload returns), later for
  // one still copying or on disk, or not at all when it refuses.
  absl::Status begun = ctx_.core->store().BeginReload(
      ctx_.session_id, request_.block_id,
      [self = shared_from_this()](absl::StatusOr<store::BlockRef> ref) {
        self->Readable(std::move(ref));
      });
  if (!begun.ok()) Finish(begun);
}

void ReloadOp::Readable(absl::StatusOr<store::BlockRef> ref) {
  store_reload_open_ = true;
  if (!ref.ok()) return Finish(ref.status());
  if (!RangeInside(request_.offset, ref->bytes, region_->size_bytes())) {
    return Finish(absl::OutOfRangeError(absl::StrFormat(
        "reload of block %d (%d bytes) at offset %d does not fit region %d of %d bytes: reload "
        "into a region with room for the whole block",
        request_.block_id, ref->bytes, request_.offset, request_.region_id,
        region_->size_bytes())));
  }
  bytes_ = ref->bytes;
  ready_seconds_ = ctx_.core->clock().NowSeconds();
  SubmitCopy(*ref);
}

void ReloadOp::SubmitCopy(const store::BlockRef& block) {
  auto t = std::make_shared<sched::Transfer>();
  t->gpu = ctx_.device_id;
  t->cls = request_.priority == kPriorityUrgent ? sched::TrafficClass::kUrgent
                                                : sched::TrafficClass::kPrefetch;
  t->deadline_at_seconds =
      request_.timeout_seconds > 0 ? start_seconds_ + request_.timeout_seconds : 0;
  t->bytes = block.bytes;
  t->owner_id = ctx_.session_id;
  uint8_t* host = ctx_.core->pool_base() + block.extent.offset;
  copy::TransferSpec spec;
  spec.direction = copy::Direction::kHostToDevice;
  spec.bytes = block.bytes;
  spec.ready_event = request_.ready_event;  // the destination is free to write
  spec.done_event = request_.done_event;
  std::weak_ptr<ReloadOp> weak = shared_from_this();
  spec.on_done_recorded = [weak] {
    if (auto self = weak.lock()) self->AnswerRecorded();
  };
  ReportProducerWaits(ctx_, spec.direction, t.get(), &spec);
  auto order = BeginOrderedTransfer(ctx_, *region_, std::move(spec));
  if (!order.ok()) return Finish(order.status());
  SetChunkCopy(ctx_, region_, *order, copy::Direction::kHostToDevice, request_.offset, host,
               t.get());
  t->done = [self = shared_from_this()](absl::Status st) { self->Finish(std::move(st)); };
  SetState(OpState::kCopying);
  ctx_.core->LinkFor(ctx_.device_id)->h2d->Submit(std::move(t));
}

Completion ReloadOp::DoneCompletion(bool recorded) const {
  Completion c;
  c.request_id = request_.request_id;
  c.kind = CompletionKind::kReloadDone;
  c.id = request_.block_id;
  c.bytes = bytes_;
  c.released = request_.release_after;
  c.copy_seconds = ctx_.core->clock().NowSeconds() - ready_seconds_;
  c.done_event_recorded = recorded;
  return c;
}

void ReloadOp::AnswerRecorded() {
  base::MutexLock lock(answer_mu_);
  if (finishing_ || answered_) return;
  answered_ = true;
  ctx_.owner->Answer(DoneCompletion(/*recorded=*/true));
}

void ReloadOp::Finish(absl::Status status) {
  if (!BeginFinish()) return;
  bool answered;
  {
    base::MutexLock lock(answer_mu_);
    finishing_ = true;
    answered = answered_;
  }
  const bool copied = state() == OpState::kCopying;
  SetState(status.ok() ? OpState::kReloaded : OpState::kFailed);
  Core* core = ctx_.core;
  // A failed reload keeps the block so the client can retry: nothing accepted is lost.
  const bool release = request_.release_after && status.ok();
  if (store_reload_open_) core->store().EndReload(request_.block_id, release);
  if (release) ctx_.owner->ForgetBlock(request_.block_id);
  const double now = ctx_.core->clock().NowSeconds();
  if (copied) {
    core->CountTransfer(/*offload=*/false, bytes_, status.ok());
    RecordTransfer("h2d", ctx_.device_id, bytes_, now - start_seconds_, status.ok());
  }
  if (status.ok()) {
    if (!answered) ctx_.owner->Answer(DoneCompletion(/*recorded=*/false));
  } else if (answered) {
    // The client was told the done event is recorded and may already consume the bytes: only
    // ending the session reaches it now.
    ctx_.owner->FailAfterAnswer(request_.request_id, std::move(status));
  } else {
    ctx_.owner->AnswerError(request_.request_id, std::move(status));
  }
  ticket_.Release();
}

}  // namespace offloadd::session
