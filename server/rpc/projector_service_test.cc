// The Projector service through a real gRPC client and server on a Unix socket, with the shm
// copy engine and LAPACK: every bad input of the issue is asserted by its status code.
#include "server/rpc/projector_service.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <memory>
#include <mutex>
#include <random>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "grpcpp/grpcpp.h"
#include "gtest/gtest.h"
#include "server/copy/shm/shm_engine.h"
#include "server/metrics/metrics.h"
#include "server/projector/dtype.h"
#include "server/projector/lapack_backend.h"
#include "server/projector/subspace_metrics.h"
#include "server/projector/synthetic.h"

namespace offloadd::rpc {
namespace {

// Unique per process even across Bazel sandboxes, whose PID namespaces may repeat pids while
// they share /dev/shm and /tmp.
std::string UniqueTag() {
  static const std::string tag = [] {
    std::random_device rd;
    return std::to_string(getpid()) + "-" + std::to_string(rd() % 1000000000u);
  }();
  return tag;
}

namespace pj = ::offloadd::projector;

constexpr uint64_t kShmBytes = 4 << 20;
constexpr uint64_t kProjectorOffset = 2 << 20;

class ProjectorRpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    static int n = 0;
    tag_ = UniqueTag() + "-" + std::to_string(n++);
    socket_ = "/tmp/ofd-prj-" + tag_ + ".sock";
    shm_name_ = "/ofd-prj-" + tag_;
    int fd = shm_open(shm_name_.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(ftruncate(fd, kShmBytes), 0);
    shm_ =
        static_cast<uint8_t*>(mmap(nullptr, kShmBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0));
    close(fd);
    StartServer(/*enabled=*/true);
  }
  void TearDown() override {
    StopServer();
    munmap(shm_, kShmBytes);
    shm_unlink(shm_name_.c_str());
  }
  void StartServer(bool enabled) {
    if (enabled) {
      pj::RefreshServiceOptions o;
      o.cpu_backend = &lapack_;
      o.workers = 2;
      refresh_ = std::make_unique<pj::RefreshService>(o, &engine_, nullptr);
    }
    service_ = std::make_unique<ProjectorService>(refresh_.get());
    grpc::ServerBuilder builder;
    builder.AddListeningPort("unix:" + socket_, grpc::InsecureServerCredentials());
    builder.RegisterService(service_.get());
    server_ = builder.BuildAndStart();
    ASSERT_NE(server_, nullptr);
    stub_ = v1::Projector::NewStub(
        grpc::CreateChannel("unix:" + socket_, grpc::InsecureChannelCredentials()));
  }
  void StopServer() {
    if (refresh_) refresh_->Shutdown();
    server_->Shutdown();
    unlink(socket_.c_str());
    refresh_.reset();
  }

  v1::RefreshRequest Request(const std::string& parameter, int64_t step, int64_t rows, int64_t cols,
                             int64_t rank) {
    v1::RefreshRequest r;
    r.mutable_key()->set_parameter_id(parameter);
    r.mutable_key()->set_step(step);
    r.mutable_gradient_region()->set_shm_name(shm_name_);
    r.mutable_gradient_region()->set_size_bytes(kShmBytes);
    r.add_shape(rows);
    r.add_shape(cols);
    r.set_dtype(v1::DTYPE_FLOAT32);
    r.set_rank(rank);
    r.set_side(v1::SIDE_STD);
    r.set_method(v1::METHOD_EXACT);
    r.set_projector_offset(kProjectorOffset);
    return r;
  }
  void WriteG(const std::vector<float>& g) { std::memcpy(shm_, g.data(), g.size() * 4); }

  grpc::Status Submit(const v1::RefreshRequest& r, v1::SubmitReply* reply) {
    grpc::ClientContext ctx;
    return stub_->Submit(&ctx, r, reply);
  }
  grpc::Status Get(uint64_t id, bool wait, v1::RefreshResult* out) {
    grpc::ClientContext ctx;
    v1::GetResultRequest g;
    g.set_refresh_id(id);
    g.set_wait(wait);
    return stub_->GetResult(&ctx, g, out);
  }
  // Submit + GetResult(wait): the GetResult status.
  grpc::Status Run(const v1::RefreshRequest& r, v1::RefreshResult* out) {
    v1::SubmitReply reply;
    grpc::Status s = Submit(r, &reply);
    if (!s.ok()) return s;
    return Get(reply.refresh_id(), true, out);
  }
  static double Outcomes(const std::string& outcome) {
    return metrics::Get().projector_refreshes_total->Add({{"outcome", outcome}}).Value();
  }

  std::string tag_, socket_, shm_name_;
  uint8_t* shm_ = nullptr;
  pj::LapackSvdBackend lapack_;
  copy::ShmCopyEngine engine_;
  std::unique_ptr<pj::RefreshService> refresh_;
  std::unique_ptr<ProjectorService> service_;
  std::unique_ptr<grpc::Server> server_;
  std::unique_ptr<v1::Projector::Stub> stub_;
};

std::vector<float> Decaying(int64_t m, int64_t n, uint64_t seed) {
  return pj::LowRankPlusNoise(m, n, pj::GeometricSpectrum(std::min(m, n) / 2, 10.0, 0.9), 0.001,
                              seed);
}

TEST_F(ProjectorRpcTest, ExactRefreshEndToEnd) {
  const int64_t m = 128, n = 64, r = 8;
  WriteG(Decaying(m, n, 1));
  const double ok_before = Outcomes("ok");
  v1::RefreshResult res;
  grpc::Status s = Run(Request("w", 0, m, n, r), &res);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(res.state(), v1::REFRESH_DONE);
  EXPECT_TRUE(res.projector_written());
  EXPECT_EQ(res.vector_side(), v1::VECTOR_SIDE_RIGHT);
  EXPECT_EQ(res.projector_rows(), n);
  EXPECT_EQ(res.effective_rank(), r);
  EXPECT_EQ(res.projector_dtype(), v1::DTYPE_FLOAT32);
  EXPECT_EQ(res.singular_values_size(), r);
  EXPECT_LE(res.residual_ratio(), 1.05);
  EXPECT_LE(res.orthogonality_error(), 1e-5);
  EXPECT_EQ(res.backend(), "lapack");
  EXPECT_GT(res.captured_energy(), 0.5);
  // P in client memory, checked independently of what the result says.
  std::vector<float> p(n * r);
  std::memcpy(p.data(), shm_ + kProjectorOffset, p.size() * 4);
  EXPECT_LE(pj::OrthogonalityError(p.data(), n, r), 1e-5);
  EXPECT_EQ(Outcomes("ok"), ok_before + 1);
}

TEST_F(ProjectorRpcTest, NanInGradientIsInvalidArgumentNamingTheFirstBadRow) {
  const int64_t m = 64, n = 32;
  std::vector<float> g = Decaying(m, n, 2);
  g[5 * n + 7] = std::numeric_limits<float>::quiet_NaN();
  g[9 * n + 1] = std::numeric_limits<float>::infinity();
  WriteG(g);
  const double before = Outcomes("invalid_input");
  v1::RefreshResult res;
  grpc::Status s = Run(Request("w", 0, m, n, 4), &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("row 5"), std::string::npos) << s.error_message();
  EXPECT_NE(s.error_message().find("NaN"), std::string::npos) << s.error_message();
  EXPECT_EQ(Outcomes("invalid_input"), before + 1);
}

TEST_F(ProjectorRpcTest, AllZeroGradientIsDegenerateAndKeepsThePreviousProjector) {
  const int64_t m = 64, n = 32, r = 4;
  WriteG(Decaying(m, n, 3));
  v1::RefreshResult first;
  ASSERT_TRUE(Run(Request("w", 0, m, n, r), &first).ok());
  std::vector<uint8_t> before(shm_ + kProjectorOffset, shm_ + kProjectorOffset + n * r * 4);
  std::memset(shm_, 0, m * n * 4);
  v1::RefreshResult zero;
  grpc::Status s = Run(Request("w", 200, m, n, r), &zero);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(zero.state(), v1::REFRESH_DONE);
  EXPECT_TRUE(zero.degenerate());
  EXPECT_FALSE(zero.projector_written());
  EXPECT_EQ(std::memcmp(before.data(), shm_ + kProjectorOffset, before.size()), 0);
}

TEST_F(ProjectorRpcTest, OneDimensionalAndShapelessBuffersAreRejectedAtSubmit) {
  v1::RefreshRequest bias = Request("bias", 0, 64, 1, 4);
  bias.clear_shape();
  bias.add_shape(64);
  v1::SubmitReply reply;
  grpc::Status s = Submit(bias, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("1-D"), std::string::npos) << s.error_message();
  v1::RefreshRequest shapeless = Request("blob", 0, 64, 1, 4);
  shapeless.clear_shape();
  s = Submit(shapeless, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("shapeless"), std::string::npos) << s.error_message();
}

TEST_F(ProjectorRpcTest, HugeMagnitudesAreRescaledNotOverflowed) {
  const int64_t m = 64, n = 48, r = 4;
  std::vector<float> g = Decaying(m, n, 4);
  for (float& x : g) x *= 3e33f;
  WriteG(g);
  v1::RefreshResult res;
  grpc::Status s = Run(Request("w", 0, m, n, r), &res);
  ASSERT_TRUE(s.ok()) << s.error_message();
  EXPECT_TRUE(res.projector_written());
  EXPECT_TRUE(std::isfinite(res.gradient_fro()));
  EXPECT_GT(res.singular_values(0), 1e33);
  EXPECT_LE(res.orthogonality_error(), 1e-5);
  EXPECT_LE(res.residual_ratio(), 1.05);
}

TEST_F(ProjectorRpcTest, UnknownRefreshIdOrKeyIsNotFound) {
  v1::RefreshResult res;
  EXPECT_EQ(Get(987654, false, &res).error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(Get(987654, true, &res).error_code(), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext ctx;
  v1::GetResultRequest by_key;
  by_key.mutable_key()->set_parameter_id("never");
  by_key.mutable_key()->set_step(7);
  EXPECT_EQ(stub_->GetResult(&ctx, by_key, &res).error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ProjectorRpcTest, BadRankSideMethodOrDtypeIsInvalidArgument) {
  v1::SubmitReply reply;
  v1::RefreshRequest r = Request("w", 0, 64, 32, 0);
  EXPECT_EQ(Submit(r, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request("w", 0, 64, 32, 4);
  r.set_side(v1::SIDE_UNSPECIFIED);
  EXPECT_EQ(Submit(r, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request("w", 0, 64, 32, 4);
  r.set_side(static_cast<v1::ProjectionSide>(17));
  EXPECT_EQ(Submit(r, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request("w", 0, 64, 32, 4);
  r.set_method(v1::METHOD_UNSPECIFIED);
  EXPECT_EQ(Submit(r, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request("w", 0, 64, 32, 4);
  r.set_dtype(v1::DTYPE_UNSPECIFIED);
  EXPECT_EQ(Submit(r, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request("w", 0, 64, 32, 4);
  r.mutable_gradient_region()->set_cuda_ipc_handle("short");
  EXPECT_EQ(Submit(r, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  r = Request("w", 0, 64, 32, 4);
  r.set_warm_start(true);  // with METHOD_EXACT
  EXPECT_EQ(Submit(r, &reply).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

TEST_F(ProjectorRpcTest, RegionTooSmallIsOutOfRange) {
  v1::SubmitReply reply;
  // Declared region too small for G.
  v1::RefreshRequest r = Request("g", 0, 1025, 1024, 4);  // > 4 MiB of fp32
  grpc::Status s = Submit(r, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
  // P past the end.
  r = Request("p", 0, 64, 32, 4);
  r.set_projector_offset(kShmBytes - 8);
  EXPECT_EQ(Submit(r, &reply).error_code(), grpc::StatusCode::OUT_OF_RANGE);
  // Declared bigger than the real object: found when the daemon opens it.
  r = Request("real", 0, 64, 32, 4);
  r.mutable_gradient_region()->set_size_bytes(kShmBytes * 2);
  WriteG(Decaying(64, 32, 5));
  v1::RefreshResult res;
  s = Run(r, &res);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::OUT_OF_RANGE) << s.error_message();
}

TEST_F(ProjectorRpcTest, RepeatedKeyIsDeduplicatedAndOlderStepRefused) {
  WriteG(Decaying(64, 32, 6));
  v1::SubmitReply a, b;
  ASSERT_TRUE(Submit(Request("w", 400, 64, 32, 4), &a).ok());
  ASSERT_TRUE(Submit(Request("w", 400, 64, 32, 4), &b).ok());
  EXPECT_FALSE(a.deduplicated());
  EXPECT_TRUE(b.deduplicated());
  EXPECT_NE(a.refresh_id(), b.refresh_id());  // each submission has its own refresh
  v1::RefreshResult res, shared;
  ASSERT_TRUE(Get(a.refresh_id(), true, &res).ok());
  ASSERT_TRUE(Get(b.refresh_id(), true, &shared).ok());
  EXPECT_FALSE(res.deduplicated());
  EXPECT_TRUE(shared.deduplicated());  // the same bytes of G: the first one's P, no SVD
  EXPECT_EQ(shared.shared_from_refresh_id(), a.refresh_id());
  EXPECT_FALSE(shared.content_mismatch());
  {
    grpc::ClientContext stats_ctx;
    v1::ProjectorStats stats;
    ASSERT_TRUE(stub_->GetProjectorStats(&stats_ctx, v1::ProjectorStatsRequest(), &stats).ok());
    EXPECT_EQ(stats.computed_total(), 1u);
    EXPECT_EQ(stats.deduplicated_total(), 1u);
    EXPECT_EQ(stats.backend(), "lapack");
  }
  v1::SubmitReply old;
  EXPECT_EQ(Submit(Request("w", 200, 64, 32, 4), &old).error_code(),
            grpc::StatusCode::FAILED_PRECONDITION);
  // GetResult by key finds the same refresh.
  grpc::ClientContext ctx;
  v1::GetResultRequest by_key;
  by_key.mutable_key()->set_parameter_id("w");
  by_key.mutable_key()->set_step(400);
  v1::RefreshResult found;
  ASSERT_TRUE(stub_->GetResult(&ctx, by_key, &found).ok());
  EXPECT_EQ(found.refresh_id(), a.refresh_id());
  EXPECT_EQ(found.state(), v1::REFRESH_DONE);
}

TEST_F(ProjectorRpcTest, WatchBatchStreamsEveryRefreshThenEnds) {
  const int64_t m = 48, n = 32;
  // Three parameters share G (read-only) at offset 0; each writes P at its own offset. One more
  // has a NaN in its own copy of G.
  WriteG(Decaying(m, n, 7));
  std::vector<float> bad = Decaying(m, n, 8);
  bad[3 * n] = std::numeric_limits<float>::quiet_NaN();
  const uint64_t bad_offset = 1 << 20;
  std::memcpy(shm_ + bad_offset, bad.data(), bad.size() * 4);
  std::set<uint64_t> ids;
  for (int i = 0; i < 4; ++i) {
    v1::RefreshRequest r = Request("p" + std::to_string(i), 0, m, n, 4);
    r.set_batch_id("step-0");
    r.set_projector_offset(kProjectorOffset + i * 4096);
    if (i == 3) r.set_gradient_offset(bad_offset);
    v1::SubmitReply reply;
    ASSERT_TRUE(Submit(r, &reply).ok());
    ids.insert(reply.refresh_id());
  }
  grpc::ClientContext ctx;
  v1::WatchRequest w;
  w.set_batch_id("step-0");
  auto reader = stub_->WatchBatch(&ctx, w);
  v1::RefreshProgress p;
  std::vector<uint32_t> completed;
  int failed = 0;
  std::set<uint64_t> seen;
  while (reader->Read(&p)) {
    completed.push_back(p.completed());
    EXPECT_EQ(p.total(), 4u);
    seen.insert(p.result().refresh_id());
    if (p.result().state() == v1::REFRESH_FAILED) {
      ++failed;
      EXPECT_EQ(p.result().error().code(), 3);  // INVALID_ARGUMENT
      EXPECT_NE(p.result().error().message().find("row 3"), std::string::npos);
    } else {
      EXPECT_EQ(p.result().state(), v1::REFRESH_DONE);
      EXPECT_TRUE(p.result().projector_written());
    }
  }
  grpc::Status s = reader->Finish();
  EXPECT_TRUE(s.ok()) << s.error_message();
  EXPECT_EQ(completed, (std::vector<uint32_t>{1, 2, 3, 4}));
  EXPECT_EQ(failed, 1);
  EXPECT_EQ(seen, ids);

  // An unknown batch or id is NOT_FOUND.
  grpc::ClientContext ctx2;
  v1::WatchRequest none;
  none.set_batch_id("no-such-batch");
  auto r2 = stub_->WatchBatch(&ctx2, none);
  while (r2->Read(&p)) {
  }
  EXPECT_EQ(r2->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
}

TEST_F(ProjectorRpcTest, DisabledServiceIsUnavailable) {
  StopServer();
  StartServer(/*enabled=*/false);
  v1::SubmitReply reply;
  EXPECT_EQ(Submit(Request("w", 0, 64, 32, 4), &reply).error_code(), grpc::StatusCode::UNAVAILABLE);
  v1::RefreshResult res;
  EXPECT_EQ(Get(1, true, &res).error_code(), grpc::StatusCode::UNAVAILABLE);
  grpc::ClientContext ctx;
  v1::WatchRequest w;
  w.set_batch_id("x");
  auto reader = stub_->WatchBatch(&ctx, w);
  v1::RefreshProgress p;
  while (reader->Read(&p)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::UNAVAILABLE);
}

}  // namespace
}  // namespace offloadd::rpc

namespace offloadd::rpc {
namespace {

// An SVD backend that holds every call until Open(): a refresh stays running while a test
// makes calls wait for it.
class GatedLapack : public pj::SvdBackend {
 public:
  absl::string_view name() const override { return "gated"; }
  absl::StatusOr<pj::TopSingular> Exact(pj::DenseMatrix a, pj::VectorSide side,
                                        int64_t k) const override {
    Enter();
    return lapack_.Exact(a, side, k);
  }
  absl::StatusOr<pj::TopSingular> Randomized(pj::DenseMatrix a, pj::VectorSide side, int64_t k,
                                             const pj::RandomizedOptions& o,
                                             pj::DenseMatrix warm) const override {
    Enter();
    return lapack_.Randomized(a, side, k, o, warm);
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }

 private:
  void Enter() const {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }
  pj::LapackSvdBackend lapack_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  bool open_ = false;
};

// The service on a GatedLapack (no refresh gets past its SVD until Open), one worker and
// `max_waiters_per_uid` waiting calls per uid. The backend outlives the service (it is never
// freed: a worker may still be inside it as TearDown stops the service) and is opened first in
// TearDown, so every worker ends.
class GatedProjectorRpcTest : public ProjectorRpcTest {
 protected:
  void TearDown() override {
    if (gated_ != nullptr) gated_->Open();
    ProjectorRpcTest::TearDown();
  }
  GatedLapack& StartGated(size_t max_waiters_per_uid) {
    StopServer();
    gated_ = new GatedLapack;
    pj::RefreshServiceOptions o;
    o.cpu_backend = gated_;
    o.workers = 1;
    o.max_waiters_per_uid = max_waiters_per_uid;
    refresh_ = std::make_unique<pj::RefreshService>(o, &engine_, nullptr);
    StartServer(/*enabled=*/false);  // the service made here
    return *gated_;
  }

 private:
  GatedLapack* gated_ = nullptr;
};

// 256 GetResult(wait) calls cut off by a 20 ms deadline (a "wait with a timeout" loop) used to
// keep the uid's 256 waiting-call slots (projector.max_waiting_calls_per_uid) until the refresh
// finished: the next wait got RESOURCE_EXHAUSTED. A cancelled or expired wait, and a cancelled
// WatchBatch, now frees its slot at once.
TEST_F(GatedProjectorRpcTest, ExpiredAndCancelledWaitsFreeTheirSlots) {
  GatedLapack& gated = StartGated(256);
  WriteG(std::vector<float>(64 * 32, 1.0f));
  v1::SubmitReply reply;
  ASSERT_TRUE(Submit(Request("w", 0, 64, 32, 4), &reply).ok());
  for (int i = 0; i < 256; ++i) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::milliseconds(20));
    v1::GetResultRequest g;
    g.set_refresh_id(reply.refresh_id());
    g.set_wait(true);
    v1::RefreshResult res;
    ASSERT_EQ(stub_->GetResult(&ctx, g, &res).error_code(), grpc::StatusCode::DEADLINE_EXCEEDED);
  }
  for (int i = 0; i < 64; ++i) {  // cancelled watches of the same refresh
    grpc::ClientContext ctx;
    v1::WatchRequest w;
    w.add_refresh_ids(reply.refresh_id());
    auto reader = stub_->WatchBatch(&ctx, w);
    ctx.TryCancel();
    v1::RefreshProgress p;
    while (reader->Read(&p)) {
    }
    EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  }
  // The server learns of each cancellation asynchronously: give the last ones a moment.
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  std::thread open([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    gated.Open();
  });
  v1::RefreshResult res;
  grpc::Status real = Get(reply.refresh_id(), /*wait=*/true, &res);
  open.join();
  EXPECT_TRUE(real.ok()) << real.error_message();
  EXPECT_EQ(res.state(), v1::REFRESH_DONE);
}

// A malformed shm name is refused at Submit, before anything looks at the file system: a path
// such as "/../../root/.bashrc" answered INVALID_ARGUMENT where the file existed and NOT_FOUND
// where it did not, telling any user which files exist. A batch_id is bounded like the ids.
TEST_F(ProjectorRpcTest, MalformedShmNamesAndLongBatchIdsAreRefusedAtSubmit) {
  const std::vector<std::string> names = {"/../../root/.bashrc", "/../../no/such/file",
                                          "noslash", "/" + std::string(300, 'x'), "/.."};
  for (const std::string& name : names) {
    v1::RefreshRequest r = Request("p", 0, 16, 16, 2);
    r.mutable_gradient_region()->set_shm_name(name);
    v1::SubmitReply reply;
    grpc::Status s = Submit(r, &reply);
    EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << name;
    EXPECT_NE(s.error_message().find("is malformed"), std::string::npos) << s.error_message();
  }
  v1::RefreshRequest r = Request("p", 0, 16, 16, 2);
  r.set_batch_id(std::string(257, 'b'));
  v1::SubmitReply reply;
  grpc::Status s = Submit(r, &reply);
  EXPECT_EQ(s.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(s.error_message().find("batch_id is 257 bytes"), std::string::npos)
      << s.error_message();
  r.set_batch_id(std::string(256, 'b'));
  EXPECT_TRUE(Submit(r, &reply).ok());
}

// A watch of more unfinished refreshes than the uid has waiting calls left used to stream the
// extra ones as REFRESH_FAILED (RESOURCE_EXHAUSTED) although they later succeeded: a client
// would have thrown good projectors away. The watch is refused whole, and frees what it took.
TEST_F(GatedProjectorRpcTest, AWatchPastTheWaitingCallsIsRefusedNotReportedAsFailures) {
  GatedLapack& gated = StartGated(4);
  WriteG(std::vector<float>(64 * 32, 1.0f));
  std::vector<uint64_t> ids;
  for (int i = 0; i < 6; ++i) {
    v1::RefreshRequest r = Request("p" + std::to_string(i), 0, 64, 32, 4);
    r.set_batch_id("big");
    r.set_projector_offset(kProjectorOffset + i * 4096);
    v1::SubmitReply reply;
    ASSERT_TRUE(Submit(r, &reply).ok());
    ids.push_back(reply.refresh_id());
  }
  grpc::ClientContext ctx;
  v1::WatchRequest w;
  w.set_batch_id("big");
  auto reader = stub_->WatchBatch(&ctx, w);
  v1::RefreshProgress p;
  int streamed = 0;
  while (reader->Read(&p)) ++streamed;
  grpc::Status refused = reader->Finish();
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_NE(refused.error_message().find("watch fewer at once"), std::string::npos)
      << refused.error_message();
  EXPECT_EQ(streamed, 0);
  // The watch let its 4 waiting calls go: a wait for an unfinished refresh finds a slot.
  std::thread open([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(300));
    gated.Open();
  });
  v1::RefreshResult last;
  grpc::Status waited = Get(ids.back(), /*wait=*/true, &last);
  open.join();
  ASSERT_TRUE(waited.ok()) << waited.error_message();
  for (uint64_t id : ids) {  // every refresh succeeds
    v1::RefreshResult res;
    grpc::Status got = Get(id, /*wait=*/true, &res);
    ASSERT_TRUE(got.ok()) << got.error_message();
    EXPECT_EQ(res.state(), v1::REFRESH_DONE);
  }
}

// The power_iterations error names the value sent (it used to report the
// clamped kMaxPowerIterations + 1).
TEST_F(ProjectorRpcTest, PowerIterationsErrorNamesTheValueSent) {
  v1::RefreshRequest r = Request("w", 0, 24, 16, 2);
  r.set_method(v1::METHOD_RANDOMIZED);
  r.set_power_iterations(1000);
  v1::SubmitReply reply;
  grpc::Status st = Submit(r, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("power_iterations 1000"), std::string::npos)
      << st.error_message();
}

// Above INT_MAX the value sent is named too (it used to be reported clamped to 2147483647).
TEST_F(ProjectorRpcTest, PowerIterationsAboveIntMaxNamesTheValueSent) {
  v1::RefreshRequest r = Request("w", 0, 24, 16, 2);
  r.set_method(v1::METHOD_RANDOMIZED);
  r.set_power_iterations(4000000000u);
  v1::SubmitReply reply;
  grpc::Status st = Submit(r, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(st.error_message().find("power_iterations 4000000000"), std::string::npos)
      << st.error_message();
}

}  // namespace
}  // namespace offloadd::rpc
