// The daemon over gRPC with real clients: round trips, concurrency, and the bad-input list of
// the foundation issue, each asserting its status code while the daemon keeps serving.
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "proto/offload.grpc.pb.h"
#include "tests/e2e/daemon_fixture.h"

namespace offloadd::testing {
namespace {

using client::Client;
using client::Priority;
using client::ShmRegion;
constexpr uint64_t kMiB = 1ull << 20;

void FillRandom(ShmRegion& r, uint32_t seed) {
  std::mt19937_64 rng(seed);
  auto* w = static_cast<uint64_t*>(r.data());
  for (uint64_t i = 0; i < r.size_bytes() / 8; ++i) w[i] = rng();
}

class E2ETest : public ::testing::Test {
 protected:
  void SetUp() override {
    session::CoreOptions o;
    o.chunk_bytes = 1 * kMiB;
    o.store.admission_deadline_seconds = 0.3;
    daemon_ = std::make_unique<InProcessDaemon>(64 * kMiB, o, "e2e");
    client_ = daemon_->Connect();
    auto r = ShmRegion::Create(16 * kMiB);
    ASSERT_TRUE(r.ok());
    region_ = std::make_unique<ShmRegion>(*std::move(r));
    FillRandom(*region_, 42);
    auto id = client_->RegisterShmRegion(*region_);
    ASSERT_TRUE(id.ok()) << id.status();
    region_id_ = *id;
  }
  void TearDown() override {
    client_->Close();
    daemon_.reset();
  }
  // A valid offload + reload still works: the daemon keeps serving after errors.
  void ExpectStillServing() {
    auto off = client_->Offload(region_id_, 0, kMiB).get();
    ASSERT_TRUE(off.ok()) << off.status();
    auto rel = client_->Reload(off->block_id, region_id_, 0, Priority::kUrgent, true).get();
    ASSERT_TRUE(rel.ok()) << rel.status();
  }

  std::unique_ptr<InProcessDaemon> daemon_;
  std::unique_ptr<Client> client_;
  std::unique_ptr<ShmRegion> region_;
  uint64_t region_id_ = 0;
};

TEST_F(E2ETest, ManyConcurrentOffloadsAndReloadsReturnTheirBytes) {
  std::vector<uint8_t> original(static_cast<uint8_t*>(region_->data()),
                                static_cast<uint8_t*>(region_->data()) + region_->size_bytes());
  // 64 blocks of 256 KiB in flight at once.
  const uint64_t block = 256 * 1024;
  std::vector<std::future<absl::StatusOr<client::OffloadResult>>> offs;
  for (uint64_t i = 0; i < 64; ++i) offs.push_back(client_->Offload(region_id_, i * block, block));
  std::vector<uint64_t> ids;
  for (auto& f : offs) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->bytes, block);
    ids.push_back(r->block_id);
  }
  std::memset(region_->data(), 0, region_->size_bytes());
  // Reload in reverse order into the same places.
  std::vector<std::future<absl::StatusOr<client::ReloadResult>>> rels;
  for (int i = 63; i >= 0; --i) {
    rels.push_back(client_->Reload(ids[i], region_id_, i * block,
                                   i % 2 ? Priority::kUrgent : Priority::kPrefetch, true));
  }
  for (auto& f : rels) {
    auto r = f.get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_TRUE(r->released);
  }
  EXPECT_EQ(std::memcmp(region_->data(), original.data(), 64 * block), 0);
  auto stats = client_->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->pool_used_bytes(), 0u);
  EXPECT_EQ(stats->offloads_total(), 64u);
  EXPECT_EQ(stats->reload_bytes_total(), 64 * block);
  EXPECT_TRUE(client_->CheckHealth().ok());
}

TEST_F(E2ETest, BlockCanBeReloadedSeveralTimesUntilReleased) {
  auto off = client_->Offload(region_id_, kMiB, 2 * kMiB).get();
  ASSERT_TRUE(off.ok());
  for (int i = 0; i < 3; ++i) {
    auto r = client_->Reload(off->block_id, region_id_, 8 * kMiB + i * kMiB / 2, Priority::kUrgent)
                 .get();
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_FALSE(r->released);
  }
  EXPECT_TRUE(client_->Release(off->block_id).get().ok());
  EXPECT_EQ(client_->Release(off->block_id).get().code(), absl::StatusCode::kNotFound);
}

TEST_F(E2ETest, ReloadByTagQueuedBehindItsOffloadReturnsTheBytes) {
  std::vector<uint8_t> original(static_cast<uint8_t*>(region_->data()),
                                static_cast<uint8_t*>(region_->data()) + 8 * kMiB);
  std::future<absl::StatusOr<client::OffloadResult>> off;
  std::future<absl::StatusOr<client::ReloadResult>> rel;
  {
    Client::ScopedBatch batch(*client_);  // both requests in one message
    off = client_->Offload(region_id_, 0, 8 * kMiB, "", /*tag=*/1234);
    rel = client_->ReloadTagged(1234, region_id_, 8 * kMiB, Priority::kUrgent, true);
  }
  auto r = rel.get();
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->released);
  ASSERT_TRUE(off.get().ok());
  EXPECT_EQ(
      std::memcmp(static_cast<uint8_t*>(region_->data()) + 8 * kMiB, original.data(), 8 * kMiB), 0);
  EXPECT_EQ(client_->ReleaseTagged(1234).get().code(), absl::StatusCode::kNotFound);
}

TEST_F(E2ETest, UnknownRegionIsNotFound) {
  EXPECT_EQ(client_->Offload(region_id_ + 99, 0, kMiB).get().status().code(),
            absl::StatusCode::kNotFound);
  ExpectStillServing();
}

TEST_F(E2ETest, UnknownBlockIsNotFound) {
  auto r = client_->Reload(0xdeadbeef, region_id_, 0, Priority::kUrgent).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kNotFound);
  EXPECT_NE(std::string(r.status().message()).find("not held by this session"), std::string::npos);
  ExpectStillServing();
}

TEST_F(E2ETest, OffsetPlusBytesOutsideRegionIsOutOfRange) {
  EXPECT_EQ(client_->Offload(region_id_, 15 * kMiB, 2 * kMiB).get().status().code(),
            absl::StatusCode::kOutOfRange);
  // Overflowing offset + bytes must not wrap around.
  EXPECT_EQ(client_->Offload(region_id_, ~0ull - 10, 100).get().status().code(),
            absl::StatusCode::kOutOfRange);
  // A reload whose block does not fit at that offset.
  auto off = client_->Offload(region_id_, 0, 2 * kMiB).get();
  ASSERT_TRUE(off.ok());
  EXPECT_EQ(client_->Reload(off->block_id, region_id_, 15 * kMiB, Priority::kUrgent)
                .get()
                .status()
                .code(),
            absl::StatusCode::kOutOfRange);
  // The block is still there and intact after the refused reload.
  EXPECT_TRUE(client_->Reload(off->block_id, region_id_, 0, Priority::kUrgent, true).get().ok());
  ExpectStillServing();
}

TEST_F(E2ETest, ZeroBytesIsInvalidArgument) {
  EXPECT_EQ(client_->Offload(region_id_, 0, 0).get().status().code(),
            absl::StatusCode::kInvalidArgument);
  ExpectStillServing();
}

TEST_F(E2ETest, RequestLargerThanPoolIsOutOfRange) {
  auto big = ShmRegion::Create(80 * kMiB);
  ASSERT_TRUE(big.ok());
  auto id = client_->RegisterShmRegion(*big);
  ASSERT_TRUE(id.ok());
  auto r = client_->Offload(*id, 0, 65 * kMiB).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kOutOfRange);
  EXPECT_NE(std::string(r.status().message()).find("larger than the whole pool"),
            std::string::npos);
  ExpectStillServing();
}

TEST_F(E2ETest, FullPoolWaitsThenFailsWithResourceExhausted) {
  std::vector<uint64_t> held;
  for (int i = 0; i < 4; ++i) {  // 4 x 16 MiB fills the 64 MiB pool
    auto r = client_->Offload(region_id_, 0, 16 * kMiB).get();
    ASSERT_TRUE(r.ok()) << r.status();
    held.push_back(r->block_id);
  }
  auto r = client_->Offload(region_id_, 0, kMiB).get();
  EXPECT_EQ(r.status().code(), absl::StatusCode::kResourceExhausted);
  // Nothing accepted was evicted: every held block reloads intact.
  for (uint64_t id : held) {
    EXPECT_TRUE(client_->Reload(id, region_id_, 0, Priority::kUrgent, true).get().ok());
  }
  ExpectStillServing();
}

TEST_F(E2ETest, DoubleReleaseIsNotFound) {
  auto off = client_->Offload(region_id_, 0, kMiB).get();
  ASSERT_TRUE(off.ok());
  EXPECT_TRUE(client_->Release(off->block_id).get().ok());
  EXPECT_EQ(client_->Release(off->block_id).get().code(), absl::StatusCode::kNotFound);
  ExpectStillServing();
}

TEST_F(E2ETest, MissingShmRegionNameIsNotFound) {
  client::RegionHandle h;
  h.shm_name = "/offloadd-no-such-region-for-test";
  h.size_bytes = kMiB;
  EXPECT_EQ(client_->RegisterRegion(h).status().code(), absl::StatusCode::kNotFound);
  h.shm_name = "missing-slash";
  EXPECT_EQ(client_->RegisterRegion(h).status().code(), absl::StatusCode::kInvalidArgument);
  ExpectStillServing();
}

TEST_F(E2ETest, BlocksAreScopedToTheirSession) {
  auto off = client_->Offload(region_id_, 0, kMiB).get();
  ASSERT_TRUE(off.ok());
  auto other = daemon_->Connect("gpu1");
  auto region = other->RegisterShmRegion(*region_);
  ASSERT_TRUE(region.ok());
  EXPECT_EQ(other->Reload(off->block_id, *region, 0, Priority::kUrgent).get().status().code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(other->Release(off->block_id).get().code(), absl::StatusCode::kNotFound);
  other->Close();
  EXPECT_TRUE(client_->Release(off->block_id).get().ok());
}

// Raw protocol: what the C++ client never sends.
class RawStreamTest : public E2ETest {
 protected:
  v1::Response RoundTrip(
      std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>>& stream,
      const v1::Request& req) {
    v1::ClientMessage m;
    *m.add_requests() = req;
    EXPECT_TRUE(stream->Write(m));
    v1::ServerMessage reply;
    EXPECT_TRUE(stream->Read(&reply));
    EXPECT_EQ(reply.responses_size(), 1);
    return reply.responses(0);
  }
};

TEST_F(RawStreamTest, RequestsBeforeHelloUnknownKindAndUnknownPriority) {
  auto channel =
      grpc::CreateChannel("unix:" + daemon_->socket_path(), grpc::InsecureChannelCredentials());
  auto stub = v1::Offload::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);

  v1::Request reg;
  reg.set_request_id(1);
  reg.mutable_register_region()->mutable_handle()->set_shm_name(region_->name());
  reg.mutable_register_region()->mutable_handle()->set_size_bytes(region_->size_bytes());
  v1::Response r = RoundTrip(stream, reg);
  EXPECT_EQ(r.request_id(), 1u);
  ASSERT_TRUE(r.has_error());
  EXPECT_EQ(r.error().code(), grpc::StatusCode::FAILED_PRECONDITION);

  v1::Request hello;
  hello.set_request_id(2);
  hello.mutable_hello()->set_device_id("gpu9");
  EXPECT_TRUE(RoundTrip(stream, hello).has_hello());

  v1::Request empty;  // no body: a request kind this daemon does not know
  empty.set_request_id(3);
  r = RoundTrip(stream, empty);
  ASSERT_TRUE(r.has_error());
  EXPECT_EQ(r.error().code(), grpc::StatusCode::INVALID_ARGUMENT);

  reg.set_request_id(4);
  r = RoundTrip(stream, reg);
  ASSERT_TRUE(r.has_region_registered()) << r.DebugString();
  v1::Request off;
  off.set_request_id(5);
  off.mutable_offload()->set_region_id(r.region_registered().region_id());
  off.mutable_offload()->set_bytes(4096);
  r = RoundTrip(stream, off);
  ASSERT_TRUE(r.has_offload_done()) << r.DebugString();

  v1::Request reload;
  reload.set_request_id(6);
  reload.mutable_reload()->set_block_id(r.offload_done().block_id());
  reload.mutable_reload()->set_region_id(off.offload().region_id());
  reload.mutable_reload()->set_priority(static_cast<v1::Priority>(7));  // unknown enum value
  r = RoundTrip(stream, reload);
  ASSERT_TRUE(r.has_error());
  EXPECT_EQ(r.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
  reload.mutable_reload()->set_priority(v1::PRIORITY_UNSPECIFIED);
  reload.set_request_id(7);
  EXPECT_EQ(RoundTrip(stream, reload).error().code(), grpc::StatusCode::INVALID_ARGUMENT);

  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
  // The half-closed session released its block.
  EXPECT_TRUE(InProcessDaemon::WaitFor(
      [&] { return daemon_->core().store().stats().pool.used_bytes == 0; }));
}

TEST_F(RawStreamTest, LargeReplyBatchesAreSplit) {
  auto channel =
      grpc::CreateChannel("unix:" + daemon_->socket_path(), grpc::InsecureChannelCredentials());
  auto stub = v1::Offload::NewStub(channel);
  {
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    v1::ClientMessage m;
    m.add_requests()->mutable_hello()->set_device_id("gpu5");
    for (int i = 0; i < 4000; ++i) m.add_requests()->set_request_id(100 + i);  // 4000 errors
    ASSERT_TRUE(stream->Write(m));
    int responses = 0, messages = 0;
    v1::ServerMessage reply;
    while (responses < 4001 && stream->Read(&reply)) {
      ++messages;
      EXPECT_LE(reply.responses_size(), rpc::Server::kMaxResponsesPerMessage);
      responses += reply.responses_size();
    }
    EXPECT_EQ(responses, 4001);
    stream->WritesDone();
    EXPECT_TRUE(stream->Finish().ok());
  }
}

// A message with more requests than the clients send (kMaxRequestsPerMessage)
// is answered request by request, and the session keeps serving (it used to end the stream
// with RESOURCE_EXHAUSTED and release the session's blocks).
TEST_F(RawStreamTest, HugeBatchIsAnsweredPerRequestAndTheSessionKeepsServing) {
  auto channel =
      grpc::CreateChannel("unix:" + daemon_->socket_path(), grpc::InsecureChannelCredentials());
  auto stub = v1::Offload::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::ClientMessage m;
  v1::Request* hello = m.add_requests();
  hello->set_request_id(1);
  hello->mutable_hello()->set_device_id("gpu6");
  const int n = 3 * rpc::Server::kMaxRequestsPerMessage + 7;
  for (int i = 0; i < n; ++i) m.add_requests()->set_request_id(100 + i);  // unknown kind each
  ASSERT_TRUE(stream->Write(m));
  std::vector<int> answers(n, 0);
  int responses = 0;
  v1::ServerMessage reply;
  while (responses < n + 1 && stream->Read(&reply)) {
    for (const v1::Response& r : reply.responses()) {
      ++responses;
      if (r.request_id() == 1) {
        EXPECT_TRUE(r.has_hello());
        continue;
      }
      ASSERT_GE(r.request_id(), 100u);
      ASSERT_LT(r.request_id(), 100u + n);
      ++answers[r.request_id() - 100];
      EXPECT_EQ(r.error().code(), grpc::StatusCode::INVALID_ARGUMENT);
    }
  }
  EXPECT_EQ(responses, n + 1);
  EXPECT_EQ(std::count(answers.begin(), answers.end(), 1), n);
  // Same stream, next message: still served.
  v1::Request reg;
  reg.set_request_id(2);
  reg.mutable_register_region()->mutable_handle()->set_shm_name(region_->name());
  reg.mutable_register_region()->mutable_handle()->set_size_bytes(region_->size_bytes());
  EXPECT_TRUE(RoundTrip(stream, reg).has_region_registered());
  stream->WritesDone();
  grpc::Status st = stream->Finish();
  EXPECT_TRUE(st.ok()) << st.error_message();
}

TEST(SocketTest, StaleSocketIsReplacedAndLiveOneRefused) {
  std::string path;
  {
    InProcessDaemon first(8 * kMiB, {}, "sock");
    path = first.socket_path();
    session::CoreOptions o;
    pool::ArenaOptions a;
    a.size_bytes = 4 * kMiB;
    session::Core core(o, *pool::Arena::Create(a), std::make_unique<copy::ShmCopyEngine>());
    auto second = rpc::Server::Start(&core, path, 0660);
    EXPECT_EQ(second.status().code(), absl::StatusCode::kFailedPrecondition);
    EXPECT_NE(std::string(second.status().message()).find("already listening"), std::string::npos);
  }
  // Leave a stale socket file behind (bound, never listened on / its process gone), in the
  // directory the daemon's end removed.
  const std::string dir = path.substr(0, path.rfind('/'));
  ASSERT_EQ(mkdir(dir.c_str(), 0755), 0);
  int fd = socket(AF_UNIX, SOCK_STREAM, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  close(fd);
  ASSERT_TRUE(rpc::ClearStaleSocket(path).ok());
  EXPECT_NE(access(path.c_str(), F_OK), 0);
  rmdir(dir.c_str());
}

}  // namespace
}  // namespace offloadd::testing

namespace offloadd {
namespace {

// Bounds on connections per uid and in total, and connections that never make a call.
// A raw Unix connection (no HTTP/2 from our side); -1 when connect failed.
int RawConnect(const std::string& path) {
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, path.c_str(), sizeof(addr.sun_path) - 1);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  return fd;
}

// Whether the daemon kept the connection: gRPC sends its HTTP/2 SETTINGS on an accepted one;
// a refused one is closed (EOF or reset).
bool Kept(int fd) {
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  return read(fd, buf, sizeof(buf)) > 0;
}

// Reads until the daemon closes the connection (true) or 10 s pass (false).
bool ClosedByDaemon(int fd) {
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[256];
  for (;;) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n == 0 || (n < 0 && errno == ECONNRESET)) return true;
    if (n < 0) return false;
  }
}

std::unique_ptr<testing::InProcessDaemon> DaemonWithConnectionLimits(
    session::ConnectionLimits limits) {
  session::CoreOptions o;
  o.connections = limits;
  auto daemon = std::make_unique<testing::InProcessDaemon>(16 << 20, o, "conn");
  return daemon;
}

// Opens `n` raw connections as this process's uid; returns how many the daemon kept (the fds
// stay open in *fds).
int KeptConnections(const std::string& path, int n, std::vector<int>* fds) {
  int kept = 0;
  for (int i = 0; i < n; ++i) {
    fds->push_back(RawConnect(path));
    kept += fds->back() >= 0 && Kept(fds->back()) ? 1 : 0;
  }
  return kept;
}

TEST(ConnectionLimitTest, ConnectionsAreBoundedPerUidAndInTotal) {
  session::ConnectionLimits per_uid;
  per_uid.max_connections_total = 0;
  per_uid.max_connections_per_uid = 3;
  per_uid.admin_reserved_connections = 0;
  per_uid.unused_connection_timeout_seconds = 0;
  session::ConnectionLimits total = per_uid;
  total.max_connections_total = 2;
  total.max_connections_per_uid = 0;
  for (const session::ConnectionLimits& limits : {per_uid, total}) {
    auto daemon = DaemonWithConnectionLimits(limits);
    const int bound = limits.max_connections_total > 0 ? 2 : 3;
    std::vector<int> fds;
    EXPECT_EQ(KeptConnections(daemon->socket_path(), bound + 2, &fds), bound);
    // Closed connections are noticed: room again.
    for (int fd : fds) close(fd);
    fds.clear();
    EXPECT_TRUE(testing::InProcessDaemon::WaitFor(
        [&] { return KeptConnections(daemon->socket_path(), 1, &fds) == 1; }));
    for (int fd : fds) close(fd);
  }
}

// Admins (here root, the test's uid) may pass the bounds by admin_reserved_connections, so an
// operator's health check or offloadctl still gets through when others filled them.
TEST(ConnectionLimitTest, AdminsHaveAReserveAboveTheBounds) {
  session::ConnectionLimits limits;
  limits.max_connections_total = 2;
  limits.max_connections_per_uid = 2;
  limits.admin_reserved_connections = 1;
  limits.unused_connection_timeout_seconds = 0;
  auto daemon = DaemonWithConnectionLimits(limits);
  std::vector<int> fds;
  EXPECT_EQ(KeptConnections(daemon->socket_path(), 2, &fds), 2);
  auto c = daemon->Connect();  // the reserved slot: a session and a health check
  EXPECT_TRUE(c->CheckHealth().ok());
  EXPECT_EQ(KeptConnections(daemon->socket_path(), 1, &fds), 0);
  c->Close();
  for (int fd : fds) close(fd);
}

TEST(ConnectionLimitTest, ConnectionsThatMakeNoCallAreShutDown) {
  session::ConnectionLimits limits;
  limits.unused_connection_timeout_seconds = 0.3;
  auto daemon = DaemonWithConnectionLimits(limits);
  int idle = RawConnect(daemon->socket_path());
  ASSERT_GE(idle, 0);
  EXPECT_TRUE(ClosedByDaemon(idle));
  close(idle);
  // A connection with a session is not touched by the timeout.
  auto c = daemon->Connect();
  std::this_thread::sleep_for(std::chrono::milliseconds(1000));
  EXPECT_TRUE(c->CheckHealth().ok());
  auto region = client::ShmRegion::Create(1 << 20);
  ASSERT_TRUE(region.ok());
  EXPECT_TRUE(c->RegisterShmRegion(*region).ok());
  c->Close();
}

}  // namespace
}  // namespace offloadd

namespace offloadd::testing {
namespace {

// A message that does not parse, or one over the receive limit, ends the
// session with a status that says so (it used to end with OK, as if the client had closed).
class BadMessageTest : public E2ETest {
 protected:
  // Opens a session, offloads 1 MiB, then writes `bad` and returns the stream's final status.
  grpc::Status SendAfterAnOffload(const v1::ClientMessage& bad) {
    auto channel =
        grpc::CreateChannel("unix:" + daemon_->socket_path(), grpc::InsecureChannelCredentials());
    auto stub = v1::Offload::NewStub(channel);
    grpc::ClientContext ctx;
    auto stream = stub->Session(&ctx);
    v1::ClientMessage m;
    m.add_requests()->mutable_hello()->set_device_id("gpu7");
    v1::Request* reg = m.add_requests();
    reg->set_request_id(1);
    reg->mutable_register_region()->mutable_handle()->set_shm_name(region_->name());
    reg->mutable_register_region()->mutable_handle()->set_size_bytes(region_->size_bytes());
    v1::ServerMessage reply;
    EXPECT_TRUE(stream->Write(m));
    uint64_t region = 0;
    while (region == 0 && stream->Read(&reply)) {
      for (const auto& r : reply.responses()) {
        if (r.has_region_registered()) region = r.region_registered().region_id();
      }
    }
    m.Clear();
    v1::Request* off = m.add_requests();
    off->set_request_id(2);
    off->mutable_offload()->set_region_id(region);
    off->mutable_offload()->set_bytes(kMiB);
    EXPECT_TRUE(stream->Write(m));
    bool done = false;
    while (!done && stream->Read(&reply)) {
      for (const auto& r : reply.responses()) done = done || r.has_offload_done();
    }
    EXPECT_TRUE(done);
    stream->Write(bad);
    while (stream->Read(&reply)) {
    }
    return stream->Finish();
  }
  uint64_t PoolUsedBytes() { return daemon_->core().store().stats().pool.used_bytes; }
};

TEST_F(BadMessageTest, InvalidUtf8EndsTheSessionWithInvalidArgument) {
  const uint64_t before = PoolUsedBytes();
  v1::ClientMessage bad;
  v1::Request* r = bad.add_requests();
  r->set_request_id(3);
  r->mutable_register_region()->mutable_handle()->set_shm_name(std::string("/x\xff\xfe", 4));
  r->mutable_register_region()->mutable_handle()->set_size_bytes(4096);
  grpc::Status st = SendAfterAnOffload(bad);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << st.error_message();
  EXPECT_NE(st.error_message().find("UTF-8"), std::string::npos) << st.error_message();
  EXPECT_TRUE(InProcessDaemon::WaitFor([&] { return PoolUsedBytes() == before; }));
  ExpectStillServing();
}

TEST_F(BadMessageTest, MessageOverTheReceiveLimitEndsTheSessionWithAnError) {
  v1::ClientMessage bad;
  v1::Request* r = bad.add_requests();
  r->set_request_id(3);
  r->mutable_register_region()->mutable_handle()->set_shm_name(std::string(9 << 20, 'a'));
  grpc::Status st = SendAfterAnOffload(bad);
  EXPECT_FALSE(st.ok()) << "an 9 MiB message ended the stream with OK";
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  ExpectStillServing();
}

}  // namespace
}  // namespace offloadd::testing

namespace offloadd::testing {
namespace {

// Hostile bytes before and inside HTTP/2 on the raw socket. Deterministic random inputs
// (seeded): plain garbage, a truncated or wrong connection preface, and the real preface
// followed by random frames (random types, flags, stream ids, lengths and payloads, some
// claiming more bytes than sent). Each goes on its own connection, which is then half-closed
// and read until the daemon closes it. Afterwards the daemon must serve a normal client and
// hold no session or block from them.
std::string RandomFrames(std::mt19937& rng, int frames) {
  std::string out;
  for (int f = 0; f < frames; ++f) {
    const uint32_t len = rng() % 64;
    const uint32_t claimed = (rng() % 8 == 0) ? rng() % (1 << 24) : len;
    out.push_back(static_cast<char>((claimed >> 16) & 0xff));
    out.push_back(static_cast<char>((claimed >> 8) & 0xff));
    out.push_back(static_cast<char>(claimed & 0xff));
    out.push_back(static_cast<char>(rng() % 12));  // DATA .. CONTINUATION, and beyond
    out.push_back(static_cast<char>(rng() & 0xff));
    const uint32_t stream = (rng() % 4 == 0) ? rng() : rng() % 8;
    for (int shift : {24, 16, 8, 0}) out.push_back(static_cast<char>((stream >> shift) & 0xff));
    for (uint32_t i = 0; i < len; ++i) out.push_back(static_cast<char>(rng() & 0xff));
  }
  return out;
}

void SendAndDrain(const std::string& path, const std::string& bytes) {
  int fd = RawConnect(path);
  ASSERT_GE(fd, 0);
  (void)!write(fd, bytes.data(), bytes.size());
  shutdown(fd, SHUT_WR);
  timeval tv{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  char buf[4096];
  while (read(fd, buf, sizeof(buf)) > 0) {
  }
  close(fd);
}

TEST(RawSocketFuzzTest, GarbageBeforeAndInsideHttp2LeavesTheDaemonServing) {
  InProcessDaemon daemon(16 << 20, {}, "rawfuzz");
  const std::string preface = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
  std::mt19937 rng(13);
  for (int i = 0; i < 60; ++i) {
    std::string input;
    switch (i % 4) {
      case 0:  // garbage
        for (uint32_t n = rng() % 512; n > 0; --n) input.push_back(static_cast<char>(rng()));
        break;
      case 1:  // a truncated or corrupted preface, then frames
        input = preface.substr(0, rng() % preface.size());
        if (!input.empty()) input[rng() % input.size()] ^= 0x20;
        input += RandomFrames(rng, 4);
        break;
      default:  // the real preface, then random frames
        input = preface + RandomFrames(rng, 1 + static_cast<int>(rng() % 16));
    }
    SendAndDrain(daemon.socket_path(), input);
  }
  auto c = daemon.Connect();
  EXPECT_TRUE(c->CheckHealth().ok());
  auto region = client::ShmRegion::Create(1 << 20);
  ASSERT_TRUE(region.ok());
  auto id = c->RegisterShmRegion(*region);
  ASSERT_TRUE(id.ok()) << id.status();
  auto off = c->Offload(*id, 0, 1 << 20).get();
  EXPECT_TRUE(off.ok()) << off.status();
  EXPECT_EQ(daemon.core().Stats().sessions_open, 1u);  // only this client's
  c->Close();
  EXPECT_TRUE(
      InProcessDaemon::WaitFor([&] { return daemon.core().store().stats().pool.used_bytes == 0; }));
}

}  // namespace
}  // namespace offloadd::testing
