// OffloadOp and ReloadOp state machines on the shm backend, with a fake session (OpOwner) that
// counts what each op does to it: every exit path reaches Finish exactly once, answers once,
// releases its transfer count and leaves the store as the path requires.
#include "server/session/ops.h"

#include <atomic>
#include <cstring>
#include <mutex>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/shm/shm_engine.h"
#include "server/session/session_test_util.h"

namespace offloadd::session {
namespace {

constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kSessionId = 7;
constexpr char kGpu[] = "gpu0";
constexpr char kBadEvent[] = "bad-event";
constexpr char kDoneEvent[] = "done-event";

// What the scripted engine keeps of an ordered transfer.
struct ScriptedOrder : copy::TransferOrder {
  copy::TransferSpec spec;
};

// The shm engine with failures on demand: BeginTransfer fails for kBadEvent (as a ready event:
// INVALID_ARGUMENT; as a done event: INTERNAL), a transfer with kDoneEvent "records" it after its
// last chunk as a cuda engine does (on_done_recorded, before the chunk completes), and every
// chunk copy fails while fail_copies is set.
class ScriptedShmEngine : public copy::ShmCopyEngine {
 public:
  absl::StatusOr<std::shared_ptr<copy::TransferOrder>> BeginTransfer(
      copy::Region&, copy::TransferSpec spec) override {
    if (spec.ready_event == kBadEvent) return absl::InvalidArgumentError("bad ready event");
    if (spec.done_event == kBadEvent) return absl::InternalError("bad done event");
    if (spec.done_event != kDoneEvent) return std::shared_ptr<copy::TransferOrder>();
    auto o = std::make_shared<ScriptedOrder>();
    o->spec = std::move(spec);
    return std::shared_ptr<copy::TransferOrder>(o);
  }
  absl::Status CopyOrderedChunk(copy::TransferOrder* order, uint64_t transfer_offset,
                                copy::Direction direction, copy::Region& region,
                                uint64_t region_offset, uint8_t* host, uint64_t bytes) override {
    auto* o = static_cast<ScriptedOrder*>(order);
    if (o != nullptr && transfer_offset + bytes == o->spec.bytes) o->spec.on_done_recorded();
    return BlockingCopyChunk(direction, region, region_offset, host, bytes);
  }
  absl::Status BlockingCopyChunk(copy::Direction direction, copy::Region& region,
                                 uint64_t region_offset, uint8_t* host, uint64_t bytes) override {
    if (fail_copies) return absl::DataLossError("scripted copy failure");
    return ShmCopyEngine::BlockingCopyChunk(direction, region, region_offset, host, bytes);
  }
  std::atomic<bool> fail_copies{false};
};

// A session as its ops see it; counts every call.
class FakeOwner : public OpOwner {
 public:
  void Answer(Completion c) override {
    std::lock_guard<std::mutex> lock(mu);
    answers.push_back(std::move(c));
  }
  void AnswerError(uint64_t request_id, absl::Status status) override {
    std::lock_guard<std::mutex> lock(mu);
    Completion c;
    c.request_id = request_id;
    c.status = std::move(status);
    errors.push_back(std::move(c));
  }
  bool SessionClosed() const override { return closed; }
  bool ClaimTag(uint64_t tag) override {
    std::lock_guard<std::mutex> lock(mu);
    ++claims;
    return tags_in_use.insert(tag).second;
  }
  void TagResolved(uint64_t tag, uint64_t block_id, const absl::Status&) override {
    std::lock_guard<std::mutex> lock(mu);
    (block_id != 0 ? tags_admitted : tags_failed).push_back(tag);
  }
  void ForgetBlock(uint64_t block_id) override {
    std::lock_guard<std::mutex> lock(mu);
    forgotten.push_back(block_id);
  }
  void FailAfterAnswer(uint64_t request_id, absl::Status status) override {
    std::lock_guard<std::mutex> lock(mu);
    Completion c;
    c.request_id = request_id;
    c.status = std::move(status);
    failed_after_answer.push_back(std::move(c));
  }

  std::mutex mu;
  std::atomic<bool> closed{false};
  std::set<uint64_t> tags_in_use;
  int claims = 0;
  std::vector<Completion> answers, errors, failed_after_answer;
  std::vector<uint64_t> tags_admitted, tags_failed, forgotten;
};

class OpsTest : public ::testing::Test {
 protected:
  OpsTest() : shm_(4 * kMiB) {
    auto engine = std::make_unique<ScriptedShmEngine>();
    engine_ = engine.get();
    CoreOptions options;
    options.chunk_bytes = 1 * kMiB;
    pool::ArenaOptions a;
    a.size_bytes = 16 * kMiB;
    core_ = std::make_unique<Core>(options, *pool::Arena::Create(a), std::move(engine));
    EXPECT_TRUE(core_->AcquireLink(kGpu).ok());
    copy::RegionSpec spec;
    spec.shm_name = shm_.name;
    spec.size_bytes = shm_.size;
    spec.device_id = kGpu;
    region_ = *core_->engine().OpenRegion(spec);
  }
  ~OpsTest() override {
    core_->store().ReleaseSession(kSessionId);
    core_->ReleaseLink(kGpu, false);
  }

  OpContext Context() {
    OpContext ctx;
    ctx.core = core_.get();
    ctx.owner = owner_;
    ctx.session_id = kSessionId;
    ctx.device_id = kGpu;
    ctx.gate = gate_;
    return ctx;
  }
  static Request Offload(uint64_t id, uint64_t bytes, uint64_t tag = 0) {
    Request r;
    r.request_id = id;
    r.kind = RequestKind::kOffload;
    r.bytes = bytes;
    r.tag = tag;
    return r;
  }
  static Request Reload(uint64_t id, uint64_t block_id, uint64_t offset = 0) {
    Request r;
    r.request_id = id;
    r.kind = RequestKind::kReload;
    r.block_id = block_id;
    r.offset = offset;
    r.priority = kPriorityUrgent;
    return r;
  }
  // Runs an op to its end: Start, then wait until the core counts no transfer (the op's last
  // step releases its ticket).
  template <typename OpT>
  std::shared_ptr<OpT> Run(const Request& r) {
    auto op = OpT::Create(Context(), r, region_);
    op->Start();
    EXPECT_TRUE(core_->WaitTransfers(10)) << "the op did not finish";
    return op;
  }
  // Offloads 1 MiB of pattern `fill` from the start of the region; returns the block id.
  uint64_t Stored(uint8_t fill) {
    std::memset(shm_.data, fill, kMiB);
    auto op = Run<OffloadOp>(Offload(100 + fill, kMiB));
    EXPECT_EQ(op->state(), OpState::kStored);
    std::lock_guard<std::mutex> lock(owner_->mu);
    return owner_->answers.empty() ? 0 : owner_->answers.back().id;
  }
  uint64_t StoreBlocks() { return core_->store().SessionBlocks(kSessionId); }

  TestShm shm_;
  ScriptedShmEngine* engine_ = nullptr;
  std::unique_ptr<Core> core_;
  std::shared_ptr<copy::Region> region_;
  std::shared_ptr<FakeOwner> owner_ = std::make_shared<FakeOwner>();
  std::shared_ptr<CopyGate> gate_ = std::make_shared<CopyGate>();
};

TEST_F(OpsTest, OffloadStoresTheBlockAndAnswersOnce) {
  auto op = Run<OffloadOp>(Offload(1, 2 * kMiB, /*tag=*/5));
  EXPECT_EQ(op->state(), OpState::kStored);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->answers.size(), 1u);
  EXPECT_TRUE(owner_->errors.empty());
  EXPECT_EQ(owner_->answers[0].kind, CompletionKind::kOffloadDone);
  EXPECT_EQ(owner_->answers[0].bytes, 2 * kMiB);
  EXPECT_EQ(owner_->tags_admitted, std::vector<uint64_t>{5});
  EXPECT_TRUE(owner_->tags_failed.empty());
  EXPECT_TRUE(owner_->forgotten.empty());
  EXPECT_EQ(StoreBlocks(), 1u);
  EXPECT_EQ(core_->Stats().offloads_total, 1u);
}

TEST_F(OpsTest, OffloadRefusedWhileDrainingHoldsNothing) {
  core_->StopAccepting();
  auto op = Run<OffloadOp>(Offload(1, kMiB, /*tag=*/5));
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(owner_->claims, 0);  // refused before the tag was claimed
  EXPECT_TRUE(owner_->tags_failed.empty());
  EXPECT_EQ(StoreBlocks(), 0u);
}

TEST_F(OpsTest, OffloadWithATagInUseLeavesThatTagAlone) {
  owner_->tags_in_use.insert(5);
  auto op = Run<OffloadOp>(Offload(1, kMiB, /*tag=*/5));
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(owner_->tags_failed.empty());  // the tag names another block
  EXPECT_EQ(StoreBlocks(), 0u);
}

TEST_F(OpsTest, OffloadLargerThanThePoolFailsItsTagWaiters) {
  auto op = Run<OffloadOp>(Offload(1, 64 * kMiB, /*tag=*/5));
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(owner_->tags_failed, std::vector<uint64_t>{5});
  EXPECT_EQ(StoreBlocks(), 0u);
  EXPECT_EQ(core_->Stats().offloads_total, 0u);  // no copy was counted
}

TEST_F(OpsTest, OffloadAdmittedAfterTheSessionClosedGivesTheSpaceBackUnanswered) {
  owner_->closed = true;
  auto op = Run<OffloadOp>(Offload(1, kMiB));
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  EXPECT_TRUE(owner_->answers.empty());
  EXPECT_TRUE(owner_->errors.empty());  // the session's close answers it
  EXPECT_EQ(StoreBlocks(), 0u);
  EXPECT_EQ(core_->store().SessionUsedBytes(kSessionId), 0u);
}

TEST_F(OpsTest, OffloadWhoseReadyEventFailsFreesTheBlock) {
  Request r = Offload(1, kMiB, /*tag=*/5);
  r.ready_event = kBadEvent;
  auto op = Run<OffloadOp>(r);
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(owner_->tags_failed, std::vector<uint64_t>{5});
  EXPECT_EQ(StoreBlocks(), 0u);
}

TEST_F(OpsTest, OffloadWhoseCopyFailsForgetsTheBlockAndCountsAFailedTransfer) {
  engine_->fail_copies = true;
  auto op = Run<OffloadOp>(Offload(1, 2 * kMiB, /*tag=*/5));
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(owner_->tags_admitted, std::vector<uint64_t>{5});
  ASSERT_EQ(owner_->forgotten.size(), 1u);  // the tag went to the block, then the block went
  EXPECT_TRUE(owner_->tags_failed.empty());
  EXPECT_EQ(StoreBlocks(), 0u);
  EXPECT_EQ(core_->Stats().offloads_total, 0u);  // counted as an error, not as an offload
}

TEST_F(OpsTest, OffloadAfterTheGateClosedCopiesNothing) {
  gate_->Close();
  auto op = Run<OffloadOp>(Offload(1, kMiB));
  EXPECT_EQ(op->state(), OpState::kFailed);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(gate_->running(), 0u);
  EXPECT_EQ(StoreBlocks(), 0u);
}

TEST_F(OpsTest, ReloadReturnsTheBytesAndReleasesWhenAsked) {
  const uint64_t block = Stored(0x5A);
  ASSERT_NE(block, 0u);
  std::memset(shm_.data + kMiB, 0, kMiB);
  Request r = Reload(2, block, /*offset=*/kMiB);
  r.release_after = true;
  auto op = Run<ReloadOp>(r);
  EXPECT_EQ(op->state(), OpState::kReloaded);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->answers.size(), 2u);
  EXPECT_EQ(owner_->answers[1].kind, CompletionKind::kReloadDone);
  EXPECT_EQ(owner_->answers[1].bytes, kMiB);
  EXPECT_TRUE(owner_->answers[1].released);
  std::vector<uint8_t> expected(kMiB, 0x5A);
  EXPECT_EQ(std::memcmp(shm_.data + kMiB, expected.data(), kMiB), 0);
  EXPECT_EQ(owner_->forgotten, std::vector<uint64_t>{block});
  EXPECT_EQ(StoreBlocks(), 0u);
  EXPECT_EQ(core_->Stats().reloads_total, 1u);
}

TEST_F(OpsTest, ReloadOfAnUnknownBlockIsNotFoundAndHoldsNothing) {
  auto op = Run<ReloadOp>(Reload(1, /*block_id=*/999));
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(core_->Stats().reloads_total, 0u);
}

TEST_F(OpsTest, ReloadThatDoesNotFitTheRegionKeepsTheBlock) {
  const uint64_t block = Stored(1);
  auto op = Run<ReloadOp>(Reload(2, block, /*offset=*/shm_.size - kMiB / 2));
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(StoreBlocks(), 1u);
  // The store's reload was ended: releasing the block frees it at once.
  EXPECT_TRUE(core_->store().Release(kSessionId, block).ok());
  EXPECT_EQ(StoreBlocks(), 0u);
}

TEST_F(OpsTest, ReloadWhoseDoneEventFailsKeepsTheBlockForARetry) {
  const uint64_t block = Stored(2);
  Request r = Reload(2, block);
  r.done_event = kBadEvent;
  r.release_after = true;
  auto op = Run<ReloadOp>(r);
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(owner_->forgotten.empty());
  EXPECT_EQ(StoreBlocks(), 1u);
  auto retry = Run<ReloadOp>(Reload(3, block));
  EXPECT_EQ(retry->state(), OpState::kReloaded);
  EXPECT_TRUE(core_->store().Release(kSessionId, block).ok());
  EXPECT_EQ(StoreBlocks(), 0u);  // both reloads were ended in the store
}

TEST_F(OpsTest, AReloadIsAnsweredWhenItsDoneEventIsRecordedAndOnceOnly) {
  const uint64_t block = Stored(2);
  Request r = Reload(2, block);
  r.done_event = kDoneEvent;
  r.release_after = true;
  const size_t before = owner_->answers.size();  // the offload's
  auto op = Run<ReloadOp>(r);
  EXPECT_EQ(op->state(), OpState::kReloaded);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->answers.size(), before + 1);
  EXPECT_EQ(owner_->answers.back().kind, CompletionKind::kReloadDone);
  EXPECT_TRUE(owner_->answers.back().done_event_recorded);
  EXPECT_TRUE(owner_->answers.back().released);
  EXPECT_TRUE(owner_->errors.empty());
  EXPECT_EQ(StoreBlocks(), 0u);  // released once the copy completed
}

TEST_F(OpsTest, AReloadThatFailsAfterItsDoneEventWasRecordedEndsTheSession) {
  const uint64_t block = Stored(2);
  Request r = Reload(2, block);
  r.done_event = kDoneEvent;
  engine_->fail_copies = true;  // the last chunk fails after the record was issued
  const size_t before = owner_->answers.size();
  auto op = Run<ReloadOp>(r);
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->answers.size(), before + 1);  // the early answer...
  EXPECT_TRUE(owner_->errors.empty());    // ...and no second one
  ASSERT_EQ(owner_->failed_after_answer.size(), 1u);  // the session must end
  EXPECT_EQ(owner_->failed_after_answer[0].status.code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(StoreBlocks(), 1u);  // the block is kept (nothing accepted is lost)
}

TEST_F(OpsTest, ReloadRefusedWhileDrainingHoldsNothing) {
  const uint64_t block = Stored(3);
  core_->StopAccepting();
  auto op = Run<ReloadOp>(Reload(2, block));
  EXPECT_EQ(op->state(), OpState::kFailed);
  EXPECT_EQ(op->finish_calls(), 1);
  ASSERT_EQ(owner_->errors.size(), 1u);
  EXPECT_EQ(owner_->errors[0].status.code(), absl::StatusCode::kUnavailable);
  EXPECT_EQ(StoreBlocks(), 1u);
}

TEST(TransferTicketTest, CountsOneTransferUntilReleasedOrDestroyed) {
  pool::ArenaOptions a;
  a.size_bytes = kMiB;
  Core core(CoreOptions{}, *pool::Arena::Create(a), std::make_unique<copy::ShmCopyEngine>());
  {
    TransferTicket t = TransferTicket::Take(&core);
    EXPECT_TRUE(static_cast<bool>(t));
    EXPECT_FALSE(core.WaitTransfers(0));
    TransferTicket moved = std::move(t);
    EXPECT_FALSE(static_cast<bool>(t));
    moved.Release();
    EXPECT_TRUE(core.WaitTransfers(0));
    moved.Release();  // no second EndTransfer
  }
  {
    TransferTicket t = TransferTicket::Take(&core);
    EXPECT_FALSE(core.WaitTransfers(0));
  }
  EXPECT_TRUE(core.WaitTransfers(0));
  core.StopAccepting();
  EXPECT_FALSE(static_cast<bool>(TransferTicket::Take(&core)));
  EXPECT_TRUE(core.WaitTransfers(0));
}

TEST(CopyGatePassTest, EntersWhileOpenAndExitsOnDestruction) {
  auto gate = std::make_shared<CopyGate>();
  {
    CopyGate::Pass pass(gate);
    EXPECT_TRUE(static_cast<bool>(pass));
    EXPECT_EQ(gate->running(), 1u);
  }
  EXPECT_EQ(gate->running(), 0u);
  gate->Close();
  CopyGate::Pass refused(gate);
  EXPECT_FALSE(static_cast<bool>(refused));
  EXPECT_EQ(gate->running(), 0u);
}

}  // namespace
}  // namespace offloadd::session
