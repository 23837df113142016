// The request ring through the daemon's rpc layer (rpc::Server, the code the offloadd binary
// runs, in-process on the shm backend): a raw C++ client says Hello on the Session stream
// offering a memfd ring, registers a region on the stream, then drives offload / reload /
// release on the ring and checks the bytes, the answers and their codes; and hostile rings.
#include <grpcpp/grpcpp.h>
#include <unistd.h>

#include <cstring>
#include <memory>
#include <string>

#include "client/core/offloadd_core.h"
#include "client/shm_region.h"
#include "common/ring_memfd.h"
#include "gtest/gtest.h"
#include "proto/offload.grpc.pb.h"
#include "tests/e2e/daemon_fixture.h"

namespace offloadd::testing {
namespace {

using common::CompletionEntry;
using common::RingResult;
using common::SubmissionEntry;
constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kBit = common::kRingRequestIdBit;

// One session: the stream (Hello, regions) and, when offered, its ring.
class RawRingSession {
 public:
  RawRingSession(const std::string& socket_path, bool offer_ring) {
    channel_ = grpc::CreateChannel("unix:" + socket_path, grpc::InsecureChannelCredentials());
    stub_ = v1::Offload::NewStub(channel_);
    stream_ = stub_->Session(&ctx_);
    std::string error;
    if (!common::CreateRingMemfd(64, 64, &ring_, &error)) abort();
    control_ = common::ControlOf(ring_.base);
    submit_ = {common::SubmissionSlots(ring_.base, ring_.layout), 64, &control_->submission_tail,
               &control_->submission_head};
    take_ = {common::CompletionSlots(ring_.base, ring_.layout), 64, &control_->completion_tail,
             &control_->completion_head};
    v1::Request hello;
    hello.set_request_id(1);
    hello.mutable_hello()->set_device_id("gpu0");
    hello.mutable_hello()->set_client_name("ring-e2e");
    hello.mutable_hello()->set_pid(getpid());
    if (offer_ring) hello.mutable_hello()->mutable_ring()->set_fd(ring_.fd);
    hello_ = RoundTrip(hello);
  }
  ~RawRingSession() { common::DestroyRingMemfd(&ring_); }

  v1::Response RoundTrip(const v1::Request& request) {
    v1::ClientMessage m;
    *m.add_requests() = request;
    EXPECT_TRUE(stream_->Write(m));
    v1::ServerMessage reply;
    EXPECT_TRUE(stream_->Read(&reply));
    return reply.responses_size() == 1 ? reply.responses(0) : v1::Response();
  }
  uint64_t Register(const client::ShmRegion& region) {
    v1::Request reg;
    reg.set_request_id(2);
    reg.mutable_register_region()->mutable_handle()->set_shm_name(region.name());
    reg.mutable_register_region()->mutable_handle()->set_size_bytes(region.size_bytes());
    return RoundTrip(reg).region_registered().region_id();
  }
  void Submit(const SubmissionEntry& e) {
    ASSERT_EQ(submit_.TryPush(e), RingResult::kOk);
    control_->daemon_doorbell.Ring();
  }
  // The next completion; a zeroed entry when the daemon closed the ring first.
  CompletionEntry Take() {
    CompletionEntry c{};
    for (;;) {
      if (take_.TryPop(&c) == RingResult::kOk) break;
      const uint32_t seen = control_->client_doorbell.Arm();
      const bool closed = control_->state.closed.load() != 0;
      if (!closed && take_.Available() == RingResult::kEmpty) {
        control_->client_doorbell.Sleep(seen, 0.1);
      }
      control_->client_doorbell.Disarm();
      if (closed && take_.Available() == RingResult::kEmpty) return CompletionEntry{};
    }
    control_->daemon_doorbell.Ring();
    return c;
  }
  CompletionEntry Call(const SubmissionEntry& e) {
    Submit(e);
    return Take();
  }
  grpc::Status Finish() {
    stream_->WritesDone();
    return stream_->Finish();
  }
  // Reads until the stream ends; its status.
  grpc::Status AwaitEnd() {
    v1::ServerMessage m;
    while (stream_->Read(&m)) {
    }
    return stream_->Finish();
  }

  const v1::Response& hello() const { return hello_; }
  common::RingControl* control() { return control_; }
  common::RingProducer<SubmissionEntry>& submit() { return submit_; }

 private:
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Offload::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  common::RingMemfd ring_;
  common::RingControl* control_;
  common::RingProducer<SubmissionEntry> submit_;
  common::RingConsumer<CompletionEntry> take_;
  v1::Response hello_;
};

SubmissionEntry Entry(common::SubmissionKind kind, uint64_t id) {
  SubmissionEntry e;
  std::memset(&e, 0, sizeof(e));
  e.kind = static_cast<uint32_t>(kind);
  e.request_id = kBit | id;
  return e;
}
SubmissionEntry Offload(uint64_t id, uint64_t region, uint64_t offset, uint64_t bytes,
                        uint64_t tag = 0) {
  SubmissionEntry e = Entry(common::SubmissionKind::kOffload, id);
  e.region_id = region;
  e.offset_bytes = offset;
  e.size_bytes = bytes;
  e.tag = tag;
  return e;
}
SubmissionEntry Reload(uint64_t id, uint64_t block, uint64_t region, uint64_t offset,
                       bool release_after, uint64_t tag = 0) {
  SubmissionEntry e = Entry(common::SubmissionKind::kReload, id);
  e.block_id = block;
  e.region_id = region;
  e.offset_bytes = offset;
  e.priority = 1;
  e.tag = tag;
  if (release_after) e.flags = common::kSubmitReleaseAfter;
  return e;
}
SubmissionEntry Release(uint64_t id, uint64_t block, uint64_t tag = 0) {
  SubmissionEntry e = Entry(common::SubmissionKind::kRelease, id);
  e.block_id = block;
  e.tag = tag;
  return e;
}
std::string Message(const CompletionEntry& c) { return std::string(c.message, c.message_bytes); }

class RingE2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    daemon_ = std::make_unique<InProcessDaemon>(64 * kMiB, session::CoreOptions{}, "ring");
    region_ = std::make_unique<client::ShmRegion>(*client::ShmRegion::Create(4 * kMiB));
  }
  std::unique_ptr<InProcessDaemon> daemon_;
  std::unique_ptr<client::ShmRegion> region_;
};

TEST_F(RingE2ETest, OffloadReloadReleaseOnTheRingAreBitwiseExact) {
  RawRingSession s(daemon_->socket_path(), /*offer_ring=*/true);
  ASSERT_TRUE(s.hello().has_hello()) << s.hello().DebugString();
  ASSERT_TRUE(s.hello().hello().ring_attached()) << s.hello().hello().ring_error();
  const uint64_t region = s.Register(*region_);
  ASSERT_NE(region, 0u);
  uint8_t* bytes = static_cast<uint8_t*>(region_->data());
  for (uint64_t i = 0; i < kMiB; ++i) bytes[i] = static_cast<uint8_t>(i * 131 + 7);

  CompletionEntry done = s.Call(Offload(1, region, 0, kMiB, /*tag=*/77));
  ASSERT_EQ(done.kind, static_cast<uint32_t>(common::CompletionKind::kOffloadDone))
      << Message(done);
  EXPECT_EQ(done.request_id, kBit | 1);
  EXPECT_EQ(done.bytes, kMiB);
  const uint64_t block = done.block_id;
  ASSERT_NE(block, 0u);

  // Reload into the second MiB, then release_after: the block goes with the reload.
  CompletionEntry back = s.Call(Reload(2, block, region, kMiB, /*release_after=*/true));
  ASSERT_EQ(back.kind, static_cast<uint32_t>(common::CompletionKind::kReloadDone))
      << Message(back);
  EXPECT_EQ(back.block_id, block);
  EXPECT_EQ(back.bytes, kMiB);
  EXPECT_NE(back.flags & common::kCompleteReleased, 0u);
  EXPECT_EQ(std::memcmp(bytes, bytes + kMiB, kMiB), 0);
  EXPECT_EQ(daemon_->core().Stats().store.blocks, 0u);

  // Offload by tag, release by tag before reading its answer (the tag names the block).
  s.Submit(Offload(3, region, 0, 4096, /*tag=*/5));
  s.Submit(Release(4, 0, /*tag=*/5));
  CompletionEntry a = s.Take(), b = s.Take();
  EXPECT_EQ(a.request_id, kBit | 3);
  EXPECT_EQ(b.request_id, kBit | 4);
  EXPECT_EQ(b.kind, static_cast<uint32_t>(common::CompletionKind::kReleased)) << Message(b);
  EXPECT_EQ(b.block_id, a.block_id);
  EXPECT_EQ(daemon_->core().Stats().store.blocks, 0u);
  EXPECT_TRUE(s.Finish().ok());
}

TEST_F(RingE2ETest, ErrorsOnTheRingCarryTheSessionsCodes) {
  RawRingSession s(daemon_->socket_path(), true);
  ASSERT_TRUE(s.hello().hello().ring_attached()) << s.hello().hello().ring_error();
  const uint64_t region = s.Register(*region_);
  CompletionEntry c = s.Call(Reload(1, 12345, region, 0, false));
  EXPECT_EQ(c.kind, static_cast<uint32_t>(common::CompletionKind::kError));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(grpc::StatusCode::NOT_FOUND)) << Message(c);
  c = s.Call(Offload(2, region, 4 * kMiB - 100, 4096));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(grpc::StatusCode::OUT_OF_RANGE)) << Message(c);
  c = s.Call(Offload(3, region, 0, 0));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT));
  c = s.Call(Offload(4, 999, 0, 4096));
  EXPECT_EQ(c.status_code, static_cast<int32_t>(grpc::StatusCode::NOT_FOUND)) << Message(c);
  SubmissionEntry bad = Release(5, 1);
  bad.size_bytes = 9;  // a field a release does not use
  c = s.Call(bad);
  EXPECT_EQ(c.status_code, static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT));
  EXPECT_NE(Message(c).find("does not use"), std::string::npos) << Message(c);
  // A ring id on the stream of a ring session is refused on the stream.
  v1::Request on_stream;
  on_stream.set_request_id(kBit | 6);
  on_stream.mutable_release()->set_block_id(1);
  v1::Response r = s.RoundTrip(on_stream);
  EXPECT_EQ(r.request_id(), kBit | 6);
  EXPECT_EQ(r.error().code(), grpc::StatusCode::INVALID_ARGUMENT) << r.DebugString();
  // The session still serves the ring.
  c = s.Call(Offload(7, region, 0, 4096));
  EXPECT_EQ(c.kind, static_cast<uint32_t>(common::CompletionKind::kOffloadDone)) << Message(c);
  EXPECT_TRUE(s.Finish().ok());
}

TEST_F(RingE2ETest, AHelloWithoutARingAndARefusedRingKeepTheStream) {
  RawRingSession plain(daemon_->socket_path(), /*offer_ring=*/false);
  ASSERT_TRUE(plain.hello().has_hello());
  EXPECT_FALSE(plain.hello().hello().ring_attached());
  EXPECT_EQ(plain.hello().hello().ring_error(), "");
  // A descriptor that is not a ring: Hello succeeds, the ring is refused saying why.
  auto channel = grpc::CreateChannel("unix:" + daemon_->socket_path(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Offload::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::ClientMessage m;
  v1::Request* hello = m.add_requests();
  hello->set_request_id(1);
  hello->mutable_hello()->set_device_id("gpu0");
  hello->mutable_hello()->set_pid(getpid());
  hello->mutable_hello()->mutable_ring()->set_fd(0);  // stdin
  ASSERT_TRUE(stream->Write(m));
  v1::ServerMessage reply;
  ASSERT_TRUE(stream->Read(&reply));
  ASSERT_TRUE(reply.responses(0).has_hello()) << reply.DebugString();
  EXPECT_FALSE(reply.responses(0).hello().ring_attached());
  EXPECT_NE(reply.responses(0).hello().ring_error(), "");
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  EXPECT_TRUE(plain.Finish().ok());
}

// A client that corrupts its submission tail: its session ends with INVALID_ARGUMENT on the
// stream, its blocks are released, and another session keeps working.
TEST_F(RingE2ETest, ACorruptRingEndsOnlyItsSession) {
  RawRingSession good(daemon_->socket_path(), true);
  RawRingSession bad(daemon_->socket_path(), true);
  ASSERT_TRUE(bad.hello().hello().ring_attached());
  const uint64_t good_region = good.Register(*region_);
  const uint64_t bad_region = bad.Register(*region_);
  ASSERT_EQ(bad.Call(Offload(1, bad_region, 0, 4096)).kind,
            static_cast<uint32_t>(common::CompletionKind::kOffloadDone));
  // Garbage in the slots first (answered, not fatal), then an impossible tail.
  SubmissionEntry garbage;
  std::memset(&garbage, 0xa5, sizeof(garbage));
  CompletionEntry c = bad.Call(garbage);
  EXPECT_EQ(c.status_code, static_cast<int32_t>(grpc::StatusCode::INVALID_ARGUMENT));
  bad.control()->submission_tail.value.store(bad.submit().tail() + 100000);
  bad.control()->daemon_doorbell.RingAlways();
  const grpc::Status ended = bad.AwaitEnd();
  EXPECT_EQ(ended.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(ended.error_message().find("submission tail"), std::string::npos)
      << ended.error_message();
  ASSERT_TRUE(InProcessDaemon::WaitFor(
      [&]() -> bool { return daemon_->core().Stats().store.blocks == 0; }));
  EXPECT_EQ(good.Call(Offload(1, good_region, 0, 4096)).kind,
            static_cast<uint32_t>(common::CompletionKind::kOffloadDone));
  EXPECT_TRUE(good.Finish().ok());
}

// A client that never takes its completions: the daemon holds it at its bound and keeps
// serving others; ending the stream still ends the session.
TEST_F(RingE2ETest, AClientThatNeverDrainsCompletionsDoesNotHoldTheDaemon) {
  RawRingSession idle(daemon_->socket_path(), true);
  RawRingSession good(daemon_->socket_path(), true);
  const uint64_t idle_region = idle.Register(*region_);
  const uint64_t good_region = good.Register(*region_);
  uint64_t id = 0;
  for (int round = 0; round < 200; ++round) {
    while (idle.submit().TryPush(Release(++id, 424242)) == RingResult::kOk) {
    }
    idle.control()->daemon_doorbell.Ring();
  }
  (void)idle_region;
  EXPECT_EQ(good.Call(Offload(1, good_region, 0, 4096)).kind,
            static_cast<uint32_t>(common::CompletionKind::kOffloadDone));
  EXPECT_TRUE(good.Finish().ok());
  EXPECT_TRUE(idle.Finish().ok());
  ASSERT_TRUE(InProcessDaemon::WaitFor(
      [&]() -> bool { return daemon_->core().Stats().sessions_open == 0; }));
}

// The native core's C ABI (client/core/offloadd_core.h) on a ring the daemon attached: the
// stream carries Hello and the region, the core everything per tensor.
TEST_F(RingE2ETest, TheNativeCoreDrivesTheRingThroughItsCAbi) {
  offloadd_ring* ring = offloadd_ring_create(64, 64, nullptr, 0);
  ASSERT_NE(ring, nullptr);
  auto channel = grpc::CreateChannel("unix:" + daemon_->socket_path(),
                                     grpc::InsecureChannelCredentials());
  auto stub = v1::Offload::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::ClientMessage m;
  v1::Request* hello = m.add_requests();
  hello->set_request_id(1);
  hello->mutable_hello()->set_device_id("gpu0");
  hello->mutable_hello()->set_pid(getpid());
  hello->mutable_hello()->mutable_ring()->set_fd(offloadd_ring_fd(ring));
  v1::Request* reg = m.add_requests();
  reg->set_request_id(2);
  reg->mutable_register_region()->mutable_handle()->set_shm_name(region_->name());
  reg->mutable_register_region()->mutable_handle()->set_size_bytes(region_->size_bytes());
  ASSERT_TRUE(stream->Write(m));
  v1::ServerMessage reply;
  uint64_t region = 0;
  while (region == 0 && stream->Read(&reply)) {
    for (const v1::Response& r : reply.responses()) {
      if (r.has_hello()) {
        ASSERT_TRUE(r.hello().ring_attached()) << r.hello().ring_error();
      }
      if (r.has_region_registered()) region = r.region_registered().region_id();
    }
  }
  ASSERT_NE(region, 0u);
  uint8_t* bytes = static_cast<uint8_t*>(region_->data());
  for (uint64_t i = 0; i < 65536; ++i) bytes[i] = static_cast<uint8_t>(i * 7 + 3);

  offloadd_completion out;
  const uint64_t off = offloadd_ring_offload(ring, region, 0, 65536, /*tag=*/9, nullptr, 0, 0, 0,
                                             -1);
  // The reload names the block by its tag before the offload's answer is read.
  const uint64_t back = offloadd_ring_reload(ring, 0, 9, region, 65536, 1, 1, 0, nullptr,
                                             nullptr, -1);
  ASSERT_EQ(offloadd_ring_wait(ring, off, 10, &out), OFFLOADD_DONE);
  EXPECT_EQ(out.kind, 1u) << std::string(out.message, out.message_bytes);
  const uint64_t block = out.block_id;
  ASSERT_EQ(offloadd_ring_wait(ring, back, 10, &out), OFFLOADD_DONE);
  EXPECT_EQ(out.kind, 2u) << std::string(out.message, out.message_bytes);
  EXPECT_EQ(out.block_id, block);
  EXPECT_EQ(out.flags & 1u, 1u);  // released
  EXPECT_EQ(std::memcmp(bytes, bytes + 65536, 65536), 0);
  const uint64_t gone = offloadd_ring_release(ring, block, 0, -1);
  ASSERT_EQ(offloadd_ring_wait(ring, gone, 10, &out), OFFLOADD_DONE);
  EXPECT_EQ(out.kind, 4u);
  EXPECT_EQ(out.status_code, static_cast<int32_t>(grpc::StatusCode::NOT_FOUND));
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  // The session ended: the daemon closed the ring.
  ASSERT_TRUE(InProcessDaemon::WaitFor([&]() -> bool { return offloadd_ring_closed(ring) == 1; }));
  offloadd_ring_destroy(ring);
}

// The C++ client puts offloads, reloads and releases on the ring when the daemon attaches it
// (the stream then carries only Hello and the region), and on the stream when asked not to.
TEST_F(RingE2ETest, TheCppClientSendsPerTensorRequestsOnTheRing) {
  for (const bool use_ring : {true, false}) {
    client::ClientOptions o;
    o.socket_path = daemon_->socket_path();
    o.device_id = "gpu0";
    o.use_ring = use_ring;
    auto connected = client::Client::Connect(o);
    ASSERT_TRUE(connected.ok()) << connected.status();
    std::unique_ptr<client::Client> c = *std::move(connected);
    EXPECT_EQ(c->ring_attached(), use_ring) << c->ring_error();
    auto region = c->RegisterShmRegion(*region_);
    ASSERT_TRUE(region.ok()) << region.status();
    uint8_t* bytes = static_cast<uint8_t*>(region_->data());
    for (uint64_t i = 0; i < 8192; ++i) bytes[i] = static_cast<uint8_t>(i * 13 + use_ring);
    auto offload = c->Offload(*region, 0, 8192, "", /*tag=*/3);
    // By tag, before the offload's answer: the reload with release_after frees the block.
    auto reload = c->ReloadTagged(3, *region, 8192, client::Priority::kUrgent, true);
    auto stored = offload.get();
    ASSERT_TRUE(stored.ok()) << stored.status();
    auto back = reload.get();
    ASSERT_TRUE(back.ok()) << back.status();
    EXPECT_EQ(back->block_id, stored->block_id);
    EXPECT_TRUE(back->released);
    EXPECT_EQ(std::memcmp(bytes, bytes + 8192, 8192), 0);
    absl::Status gone = c->Release(stored->block_id).get();
    EXPECT_EQ(gone.code(), absl::StatusCode::kNotFound) << gone;
    const client::ClientCounters n = c->counters();
    EXPECT_EQ(n.ring_requests_sent, use_ring ? 3u : 0u);
    EXPECT_EQ(n.ring_responses_received, use_ring ? 3u : 0u);
    EXPECT_EQ(n.requests_sent, use_ring ? 2u : 5u);  // Hello and the region (+ the three)
    c->Close();
    EXPECT_TRUE(InProcessDaemon::WaitFor(
        [&]() -> bool { return daemon_->core().Stats().sessions_open == 0; }));
  }
}

}  // namespace
}  // namespace offloadd::testing
