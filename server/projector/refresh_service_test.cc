#include "server/projector/refresh_service.h"

#include <chrono>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <limits>
#include <mutex>
#include <new>
#include <string>
#include <thread>
#include <vector>

#include "client/shm_region.h"
#include "common/base/fake_clock.h"
#include "glog/logging.h"
#include "gtest/gtest.h"
#include "server/copy/shm/shm_engine.h"
#include "server/projector/dtype.h"
#include "server/projector/lapack_backend.h"
#include "server/projector/subspace_metrics.h"
#include "server/projector/synthetic.h"

namespace offloadd::projector {
namespace {

// A shared-memory object created and mapped by the C++ client library (client/shm_region.h):
// the "client memory" G and P live in. Only sized, not reserved: a test maps a sparse 40 GiB one.
class Shm {
 public:
  explicit Shm(uint64_t bytes)
      : region_(client::ShmRegion::Create(bytes, {0600, /*reserve=*/false}).value()) {}
  copy::RegionSpec Spec() const {
    copy::RegionSpec s;
    s.shm_name = region_.name();
    s.size_bytes = region_.size_bytes();
    s.device_id = "cpu";
    return s;
  }
  uint8_t* data() { return static_cast<uint8_t*>(region_.data()); }

 private:
  client::ShmRegion region_;
};

constexpr uint64_t kProjectorOffset = 1 << 20;  // G at 0, P at 1 MiB

// LAPACK behind a gate: records the first element of every matrix it is given (a tag telling
// the tests which gradient ran) and, while closed, blocks each call until opened.
class GatedBackend : public SvdBackend {
 public:
  absl::string_view name() const override { return "gated-lapack"; }
  absl::StatusOr<TopSingular> Exact(DenseMatrix a, VectorSide side, int64_t k) const override {
    Enter(a);
    return lapack_.Exact(a, side, k);
  }
  absl::StatusOr<TopSingular> Randomized(DenseMatrix a, VectorSide side, int64_t k,
                                         const RandomizedOptions& o,
                                         DenseMatrix warm) const override {
    Enter(a);
    return lapack_.Randomized(a, side, k, o, warm);
  }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  void WaitForCalls(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return tags_.size() >= n; });
  }
  std::vector<float> tags() {
    std::lock_guard<std::mutex> lock(mu_);
    return tags_;
  }

 private:
  void Enter(DenseMatrix a) const {
    std::unique_lock<std::mutex> lock(mu_);
    tags_.push_back(a.data[0]);
    cv_.notify_all();
    cv_.wait(lock, [&] { return !closed_; });
  }
  LapackSvdBackend lapack_;
  mutable std::mutex mu_;
  mutable std::condition_variable cv_;
  mutable bool closed_ = false;
  mutable std::vector<float> tags_;
};

class RefreshServiceTest : public ::testing::Test {
 protected:
  void Start(RefreshServiceOptions options = {}) {
    if (options.cpu_backend == nullptr) options.cpu_backend = &backend_;
    service_ = std::make_unique<RefreshService>(options, &engine_, nullptr);
  }
  ServiceRequest Request(Shm& shm, const std::string& parameter, int64_t step, int64_t rows,
                         int64_t cols, int64_t rank, DType dtype = DType::kFloat32) {
    ServiceRequest r;
    r.parameter_id = parameter;
    r.step = step;
    r.gradient.region = shm.Spec();
    r.shape = {rows, cols};
    r.dtype = dtype;
    r.rank = rank;
    r.side = ProjectionSide::kStd;
    r.projector.offset_bytes = kProjectorOffset;
    return r;
  }
  static void WriteG(Shm& shm, const std::vector<float>& g, DType dtype = DType::kFloat32) {
    ConvertFromFloat32(g.data(), g.size(), dtype, shm.data());
  }
  static std::vector<float> ReadP(Shm& shm, const RefreshRecord& r) {
    std::vector<float> p(r.projector_rows * r.effective_rank);
    ConvertToFloat32(shm.data() + kProjectorOffset, r.dtype, p.size(), p.data());
    return p;
  }
  RefreshRecord SubmitAndWait(const ServiceRequest& r) {
    auto submitted = service_->Submit(r);
    EXPECT_TRUE(submitted.ok()) << submitted.status();
    if (!submitted.ok()) return {};
    auto record = service_->Wait(submitted->id);
    EXPECT_TRUE(record.ok()) << record.status();
    return record.ok() ? *record : RefreshRecord{};
  }

  GatedBackend backend_;
  copy::ShmCopyEngine engine_;
  std::unique_ptr<RefreshService> service_;
};

std::vector<float> Decaying(int64_t m, int64_t n, uint64_t seed) {
  return LowRankPlusNoise(m, n, GeometricSpectrum(std::min(m, n) / 2, 10.0, 0.9), 0.001, seed);
}

TEST_F(RefreshServiceTest, WritesTheLibrarysProjectorIntoClientMemory) {
  Start();
  Shm shm(2 << 20);
  const int64_t m = 96, n = 48, r = 8;
  std::vector<float> g = Decaying(m, n, 1);
  WriteG(shm, g);
  RefreshRecord rec = SubmitAndWait(Request(shm, "w", 0, m, n, r));
  ASSERT_EQ(rec.state, RefreshState::kDone) << rec.status;
  EXPECT_TRUE(rec.projector_written);
  EXPECT_EQ(rec.vector_side, VectorSide::kRight);
  EXPECT_EQ(rec.projector_rows, n);
  EXPECT_EQ(rec.backend, "gated-lapack");
  EXPECT_LE(rec.result.residual_ratio, 1.05);
  EXPECT_LE(rec.result.orthogonality_error, 1e-5);
  EXPECT_FALSE(rec.result.has_similarity);
  EXPECT_TRUE(rec.result.projector_bytes.empty());

  // The bytes in client memory are exactly what the library computes for the same G.
  RefreshRequest direct;
  direct.gradient = {g.data(), g.size() * 4, {m, n}, DType::kFloat32};
  direct.rank = r;
  auto expected = RefreshProjector(direct, LapackSvdBackend());
  ASSERT_TRUE(expected.ok());
  EXPECT_EQ(std::memcmp(shm.data() + kProjectorOffset, expected->projector_bytes.data(),
                        expected->projector_bytes.size()),
            0);
  std::vector<float> p = ReadP(shm, rec);
  EXPECT_LE(OrthogonalityError(p.data(), n, r), 1e-5);
}

TEST_F(RefreshServiceTest, ResultsExpireAfterTheirTtlOnTheServiceClock) {
  base::FakeClock clock(1000);
  RefreshServiceOptions o;
  o.clock = &clock;
  o.result_ttl_seconds = 10;
  Start(o);
  Shm shm(2 << 20);
  WriteG(shm, Decaying(32, 32, 1));
  backend_.Close();
  auto first = service_->Submit(Request(shm, "w", 0, 32, 32, 4));
  ASSERT_TRUE(first.ok()) << first.status();
  backend_.WaitForCalls(1);  // running, held in the SVD
  clock.Advance(3);          // it takes 3 s on the service's clock
  backend_.Open();
  auto record = service_->Wait(first->id);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->queued_seconds, 0);
  EXPECT_EQ(record->elapsed_seconds, 3);
  // Finished at 1003: still held at 1012.9 (expiry is checked at each submit and finish).
  clock.Advance(9.9);
  ASSERT_EQ(SubmitAndWait(Request(shm, "w", 1, 32, 32, 4)).state, RefreshState::kDone);
  EXPECT_TRUE(service_->Get(first->id).ok());
  clock.Advance(0.2);  // 10.1 s after it finished
  ASSERT_EQ(SubmitAndWait(Request(shm, "w", 2, 32, 32, 4)).state, RefreshState::kDone);
  EXPECT_EQ(service_->Get(first->id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->Find(/*owner_uid=*/-1, "", "w", 0).status().code(),
            absl::StatusCode::kNotFound);
}

TEST_F(RefreshServiceTest, Bf16GradientGetsABf16Projector) {
  Start();
  Shm shm(2 << 20);
  const int64_t m = 40, n = 120, r = 6;
  WriteG(shm, Decaying(m, n, 2), DType::kBFloat16);
  RefreshRecord rec = SubmitAndWait(Request(shm, "w", 0, m, n, r, DType::kBFloat16));
  ASSERT_EQ(rec.state, RefreshState::kDone) << rec.status;
  EXPECT_EQ(rec.vector_side, VectorSide::kLeft);  // std, m < n
  EXPECT_EQ(rec.result.projector_dtype, DType::kBFloat16);
  std::vector<float> p = ReadP(shm, rec);
  // bf16 rounding: the reported error is the one of P as written.
  EXPECT_NEAR(OrthogonalityError(p.data(), m, r), rec.result.orthogonality_error, 1e-9);
  EXPECT_LT(rec.result.orthogonality_error, 2e-2);
}

// The bytes RefreshProjector writes for G (m x n fp32, std side, exact) at rank r.
std::vector<uint8_t> DirectProjector(const std::vector<float>& g, int64_t m, int64_t n, int64_t r) {
  RefreshRequest direct;
  direct.gradient = {g.data(), g.size() * 4, {m, n}, DType::kFloat32};
  direct.rank = r;
  auto expected = RefreshProjector(direct, LapackSvdBackend());
  EXPECT_TRUE(expected.ok()) << expected.status();
  return expected.ok() ? expected->projector_bytes : std::vector<uint8_t>{};
}

bool ProjectorIs(Shm& shm, const std::vector<uint8_t>& bytes) {
  return !bytes.empty() &&
         std::memcmp(shm.data() + kProjectorOffset, bytes.data(), bytes.size()) == 0;
}

TEST_F(RefreshServiceTest, RepeatedKeyWithTheSameGradientTakesTheFirstProjector) {
  Start();
  Shm first(2 << 20), second(2 << 20), third(2 << 20);  // three ranks' own regions
  const std::vector<float> g = Decaying(32, 32, 3);
  for (Shm* shm : {&first, &second, &third}) WriteG(*shm, g);
  backend_.Close();
  auto a = service_->Submit(Request(first, "w", 200, 32, 32, 4));
  backend_.WaitForCalls(1);  // the first is computing when the second arrives
  auto b = service_->Submit(Request(second, "w", 200, 32, 32, 4));
  ASSERT_TRUE(a.ok() && b.ok());
  EXPECT_FALSE(a->deduplicated);
  EXPECT_TRUE(b->deduplicated);
  EXPECT_NE(a->id, b->id);  // each submission has its own refresh
  backend_.Open();
  auto ra = service_->Wait(a->id);
  auto rb = service_->Wait(b->id);
  ASSERT_TRUE(ra.ok() && rb.ok());
  ASSERT_EQ(rb->state, RefreshState::kDone) << rb->status;
  EXPECT_TRUE(rb->deduplicated);
  EXPECT_EQ(rb->shared_from_id, a->id);
  EXPECT_TRUE(rb->projector_written);
  EXPECT_EQ(rb->result.singular_values, ra->result.singular_values);
  // After the first finished, too.
  RefreshRecord rc = SubmitAndWait(Request(third, "w", 200, 32, 32, 4));
  EXPECT_TRUE(rc.deduplicated);
  EXPECT_EQ(backend_.tags().size(), 1u);  // one SVD for the three
  const std::vector<uint8_t> p = DirectProjector(g, 32, 32, 4);
  EXPECT_TRUE(ProjectorIs(first, p));
  EXPECT_TRUE(ProjectorIs(second, p));
  EXPECT_TRUE(ProjectorIs(third, p));
  auto found = service_->Find(-1, "", "w", 200);
  ASSERT_TRUE(found.ok());
  EXPECT_EQ(*found, a->id);
  const RefreshService::Stats st = service_->stats();
  EXPECT_EQ(st.computed_total, 1u);
  EXPECT_EQ(st.deduplicated_total, 2u);
  EXPECT_EQ(st.content_mismatches_total, 0u);
}

// Before the content check, a repeated key returned the first refresh's id and P was written
// only into the first submitter's region: the second process read its own region, all zeros.
TEST_F(RefreshServiceTest, RepeatedKeyWithAnotherGradientIsComputedOnItsOwn) {
  Start();
  Shm first(2 << 20), second(2 << 20);
  const std::vector<float> g1 = Decaying(48, 32, 4), g2 = Decaying(48, 32, 5);
  WriteG(first, g1);
  WriteG(second, g2);
  RefreshRecord r1 = SubmitAndWait(Request(first, "layers.0.q_proj.weight", 5, 48, 32, 4));
  RefreshRecord r2 = SubmitAndWait(Request(second, "layers.0.q_proj.weight", 5, 48, 32, 4));
  ASSERT_EQ(r2.state, RefreshState::kDone) << r2.status;
  EXPECT_FALSE(r2.deduplicated);
  EXPECT_TRUE(r2.content_mismatch);
  EXPECT_TRUE(r2.projector_written);
  EXPECT_FALSE(r2.result.has_similarity);  // on its own: not compared with the other's P
  EXPECT_TRUE(ProjectorIs(first, DirectProjector(g1, 48, 32, 4)));
  EXPECT_TRUE(ProjectorIs(second, DirectProjector(g2, 48, 32, 4)));
  // A third with the first one's gradient still takes the first one's P.
  Shm third(2 << 20);
  WriteG(third, g1);
  RefreshRecord r3 = SubmitAndWait(Request(third, "layers.0.q_proj.weight", 5, 48, 32, 4));
  EXPECT_TRUE(r3.deduplicated);
  EXPECT_TRUE(ProjectorIs(third, DirectProjector(g1, 48, 32, 4)));
  // Other request parameters are a mismatch too, even with the same gradient.
  WriteG(third, g1);
  RefreshRecord r4 = SubmitAndWait(Request(third, "layers.0.q_proj.weight", 5, 48, 32, 3));
  EXPECT_FALSE(r4.deduplicated);
  EXPECT_TRUE(r4.content_mismatch);
  EXPECT_TRUE(ProjectorIs(third, DirectProjector(g1, 48, 32, 3)));
  const RefreshService::Stats st = service_->stats();
  EXPECT_EQ(st.computed_total, 3u);
  EXPECT_EQ(st.deduplicated_total, 1u);
  EXPECT_EQ(st.content_mismatches_total, 2u);
}

TEST_F(RefreshServiceTest, JobsWithTheSameParameterNamesAreSeparateKeys) {
  Start();
  Shm first(2 << 20), second(2 << 20);
  const std::vector<float> g = Decaying(32, 32, 6);
  WriteG(first, g);
  WriteG(second, g);
  ServiceRequest a = Request(first, "w", 0, 32, 32, 4), b = Request(second, "w", 0, 32, 32, 4);
  a.job_id = "run-a";
  b.job_id = "run-b";
  RefreshRecord ra = SubmitAndWait(a), rb = SubmitAndWait(b);
  EXPECT_FALSE(rb.deduplicated);
  EXPECT_FALSE(rb.content_mismatch);
  EXPECT_EQ(backend_.tags().size(), 2u);
  EXPECT_EQ(service_->Find(-1, "run-a", "w", 0).value_or(0), ra.id);
  EXPECT_EQ(service_->Find(-1, "run-b", "w", 0).value_or(0), rb.id);
  // Each job has its own step order.
  a.step = 5;
  ASSERT_EQ(SubmitAndWait(a).state, RefreshState::kDone);
  b.step = 1;
  EXPECT_EQ(SubmitAndWait(b).state, RefreshState::kDone);
}

TEST_F(RefreshServiceTest, RepeatedKeyWithTheSameBadGradientGetsTheSameError) {
  Start();
  Shm first(2 << 20), second(2 << 20);
  std::vector<float> g = Decaying(16, 16, 7);
  g[5 * 16 + 3] = std::numeric_limits<float>::quiet_NaN();
  WriteG(first, g);
  WriteG(second, g);
  RefreshRecord r1 = SubmitAndWait(Request(first, "w", 0, 16, 16, 4));
  RefreshRecord r2 = SubmitAndWait(Request(second, "w", 0, 16, 16, 4));
  ASSERT_EQ(r1.state, RefreshState::kFailed);
  EXPECT_EQ(r1.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(r2.status, r1.status);
  EXPECT_TRUE(r2.deduplicated);
}

TEST_F(RefreshServiceTest, StepsOfAParameterMustIncreaseUnlessHistoryIsReset) {
  Start();
  Shm shm(2 << 20);
  WriteG(shm, Decaying(32, 32, 4));
  ASSERT_EQ(SubmitAndWait(Request(shm, "w", 400, 32, 32, 4)).state, RefreshState::kDone);
  auto old = service_->Submit(Request(shm, "w", 200, 32, 32, 4));
  ASSERT_FALSE(old.ok());
  EXPECT_EQ(old.status().code(), absl::StatusCode::kFailedPrecondition) << old.status();
  ServiceRequest reset = Request(shm, "w", 200, 32, 32, 4);
  reset.reset_history = true;
  RefreshRecord rec = SubmitAndWait(reset);
  EXPECT_EQ(rec.state, RefreshState::kDone);
  EXPECT_FALSE(rec.result.has_similarity);  // history was forgotten
}

TEST_F(RefreshServiceTest, SimilarityAndWarmStartUseThePreviousProjector) {
  Start();
  Shm shm(2 << 20);
  const int64_t m = 80, n = 60, r = 6;
  WriteG(shm, Decaying(m, n, 5));
  ServiceRequest req = Request(shm, "w", 0, m, n, r);
  req.method = SvdMethod::kRandomized;
  RefreshRecord first = SubmitAndWait(req);
  ASSERT_EQ(first.state, RefreshState::kDone) << first.status;
  EXPECT_FALSE(first.warm_started);
  req.step = 200;
  req.warm_start = true;
  RefreshRecord same = SubmitAndWait(req);
  ASSERT_EQ(same.state, RefreshState::kDone) << same.status;
  EXPECT_TRUE(same.warm_started);
  ASSERT_TRUE(same.result.has_similarity);
  EXPECT_GT(same.result.similarity, 0.999);
  // A gradient with an unrelated spectrum moves the subspace.
  WriteG(shm, Decaying(m, n, 99));
  req.step = 400;
  RefreshRecord moved = SubmitAndWait(req);
  ASSERT_EQ(moved.state, RefreshState::kDone);
  ASSERT_TRUE(moved.result.has_similarity);
  EXPECT_LT(moved.result.similarity, 0.5);
}

TEST_F(RefreshServiceTest, AllZeroGradientIsDegenerateAndLeavesTheProjector) {
  Start();
  Shm shm(2 << 20);
  const int64_t m = 64, n = 32, r = 4;
  WriteG(shm, Decaying(m, n, 6));
  RefreshRecord first = SubmitAndWait(Request(shm, "w", 0, m, n, r));
  ASSERT_EQ(first.state, RefreshState::kDone);
  std::vector<uint8_t> before(shm.data() + kProjectorOffset,
                              shm.data() + kProjectorOffset + n * r * 4);
  std::memset(shm.data(), 0, m * n * 4);
  RefreshRecord zero = SubmitAndWait(Request(shm, "w", 200, m, n, r));
  ASSERT_EQ(zero.state, RefreshState::kDone) << zero.status;
  EXPECT_TRUE(zero.result.degenerate);
  EXPECT_FALSE(zero.projector_written);
  EXPECT_EQ(std::memcmp(before.data(), shm.data() + kProjectorOffset, before.size()), 0);
  // The previous projector is still the parameter's: the next refresh compares with it.
  WriteG(shm, Decaying(m, n, 6));
  RefreshRecord again = SubmitAndWait(Request(shm, "w", 400, m, n, r));
  ASSERT_TRUE(again.result.has_similarity);
  EXPECT_GT(again.result.similarity, 0.999);
}

TEST_F(RefreshServiceTest, NonFiniteGradientFailsNamingTheRow) {
  Start();
  Shm shm(2 << 20);
  const int64_t m = 64, n = 32;
  std::vector<float> g = Decaying(m, n, 7);
  g[17 * n + 3] = std::numeric_limits<float>::quiet_NaN();
  g[40 * n] = std::numeric_limits<float>::infinity();
  WriteG(shm, g);
  RefreshRecord rec = SubmitAndWait(Request(shm, "w", 0, m, n, 4));
  ASSERT_EQ(rec.state, RefreshState::kFailed);
  EXPECT_EQ(rec.status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(rec.status.message().find("row 17"), std::string::npos) << rec.status;
  EXPECT_FALSE(rec.projector_written);
  EXPECT_TRUE(backend_.tags().empty());  // rejected before any SVD
}

TEST_F(RefreshServiceTest, HugeMagnitudesAreRescaled) {
  Start();
  Shm shm(2 << 20);
  const int64_t m = 48, n = 48, r = 4;
  std::vector<float> g = Decaying(m, n, 8);
  for (float& x : g) x *= 1e30f;  // squares overflow fp32
  WriteG(shm, g);
  RefreshRecord rec = SubmitAndWait(Request(shm, "w", 0, m, n, r));
  ASSERT_EQ(rec.state, RefreshState::kDone) << rec.status;
  EXPECT_TRUE(std::isfinite(rec.result.gradient_fro));
  EXPECT_GT(rec.result.singular_values[0], 1e30);
  EXPECT_LE(rec.result.orthogonality_error, 1e-5);
  EXPECT_LE(rec.result.residual_ratio, 1.05);
}

TEST_F(RefreshServiceTest, LazyModeSkipsWhileTheSubspaceIsStable) {
  Start();
  Shm shm(2 << 20);
  const int64_t m = 48, n = 32, r = 4;
  WriteG(shm, Decaying(m, n, 9));
  std::vector<bool> skipped;
  for (int step = 0; step < 6; ++step) {
    ServiceRequest req = Request(shm, "w", step * 200, m, n, r);
    req.lazy = true;
    req.lazy_policy.similarity_threshold = 0.9;
    req.lazy_policy.stable_refreshes_before_skip = 1;
    req.lazy_policy.max_consecutive_skips = 2;
    RefreshRecord rec = SubmitAndWait(req);
    ASSERT_EQ(rec.state, RefreshState::kDone) << rec.status;
    EXPECT_EQ(rec.projector_written, !rec.skipped);
    skipped.push_back(rec.skipped);
  }
  // 0: first (no similarity); 1: stable; 2, 3: skipped; 4: forced; 5: skipped again.
  EXPECT_EQ(skipped, (std::vector<bool>{false, false, true, true, false, true}));
  EXPECT_EQ(backend_.tags().size(), 3u);
}

// Gradient for parameter `tag`: its first element is the tag, so GatedBackend's log says which
// ran.
std::vector<float> Tagged(int64_t m, int64_t n, float tag) {
  std::vector<float> g = Decaying(m, n, static_cast<uint64_t>(tag));
  g[0] = tag;
  return g;
}

TEST_F(RefreshServiceTest, ParametersAreServedRoundRobinInStepOrder) {
  Start();  // one worker
  const int64_t m = 24, n = 16, r = 2;
  Shm big(2 << 20), a(2 << 20), b(2 << 20);
  WriteG(big, Tagged(m, n, 100));
  WriteG(a, Tagged(m, n, 200));
  WriteG(b, Tagged(m, n, 300));
  backend_.Close();
  auto first = service_->Submit(Request(big, "big", 0, m, n, r));
  ASSERT_TRUE(first.ok());
  backend_.WaitForCalls(1);  // big@0 is running, blocked in the backend
  std::vector<uint64_t> ids;
  for (int64_t step : {3, 1, 2}) {
    auto s = service_->Submit(Request(big, "big", step, m, n, r));
    ASSERT_TRUE(s.ok());
    ids.push_back(s->id);
  }
  for (auto* shm : {&a, &b}) {
    auto s = service_->Submit(Request(*shm, shm == &a ? "a" : "b", 0, m, n, r));
    ASSERT_TRUE(s.ok());
    ids.push_back(s->id);
  }
  EXPECT_EQ(service_->stats().queued, 5u);
  backend_.Open();
  for (uint64_t id : ids) ASSERT_TRUE(service_->Wait(id).ok());
  // big's backlog does not hold a and b back; big's own steps run in order (1, 2, 3: same tag).
  EXPECT_EQ(backend_.tags(), (std::vector<float>{100, 200, 300, 100, 100, 100}));
  auto s3 = service_->Get(ids[0]), s1 = service_->Get(ids[1]);
  ASSERT_TRUE(s3.ok() && s1.ok());
  EXPECT_GT(s3->queued_seconds, s1->queued_seconds);  // step 3 started after step 1
}

TEST_F(RefreshServiceTest, ShutdownFailsQueuedRefreshesAndFinishesTheRunningOne) {
  Start();
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 10));
  backend_.Close();
  auto running = service_->Submit(Request(shm, "a", 0, 24, 16, 2));
  ASSERT_TRUE(running.ok());
  backend_.WaitForCalls(1);
  auto queued = service_->Submit(Request(shm, "b", 0, 24, 16, 2));
  ASSERT_TRUE(queued.ok());
  std::thread stopper([&] { service_->Shutdown(); });
  auto cancelled = service_->Wait(queued->id);
  ASSERT_TRUE(cancelled.ok());
  EXPECT_EQ(cancelled->state, RefreshState::kFailed);
  EXPECT_EQ(cancelled->status.code(), absl::StatusCode::kUnavailable);
  backend_.Open();
  stopper.join();
  auto done = service_->Get(running->id);
  ASSERT_TRUE(done.ok());
  EXPECT_EQ(done->state, RefreshState::kDone);
  auto late = service_->Submit(Request(shm, "c", 0, 24, 16, 2));
  EXPECT_EQ(late.status().code(), absl::StatusCode::kUnavailable);
}

TEST_F(RefreshServiceTest, ResultsAndHistoryAreBounded) {
  RefreshServiceOptions options;
  options.max_results = 2;
  options.history_bytes = 16 * 2 * 4;  // exactly one 16 x 2 fp32 projector
  Start(options);
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 11));
  RefreshRecord a0 = SubmitAndWait(Request(shm, "a", 0, 24, 16, 2));
  RefreshRecord b0 = SubmitAndWait(Request(shm, "b", 0, 24, 16, 2));  // forgets a's projector
  RefreshRecord b1 = SubmitAndWait(Request(shm, "b", 1, 24, 16, 2));
  EXPECT_EQ(service_->Get(a0.id).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->Find(-1, "", "a", 0).status().code(), absl::StatusCode::kNotFound);
  EXPECT_TRUE(service_->Get(b0.id).ok());
  EXPECT_TRUE(b1.result.has_similarity);
  EXPECT_EQ(service_->stats().history_bytes, 16u * 2 * 4);
  RefreshRecord a1 = SubmitAndWait(Request(shm, "a", 1, 24, 16, 2));
  EXPECT_EQ(a1.state, RefreshState::kDone);
  EXPECT_FALSE(a1.result.has_similarity);  // a's projector had been forgotten
}

// Failed refreshes make history entries too: they must not pile past max_parameters (an
// eviction pass over thousands of them later held the service's lock for seconds).
TEST_F(RefreshServiceTest, FailedRefreshesOfNewParametersStayWithinMaxParameters) {
  RefreshServiceOptions options;
  options.max_parameters = 8;
  Start(options);
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 11));
  RefreshRecord kept = SubmitAndWait(Request(shm, "kept", 0, 24, 16, 2));
  ASSERT_EQ(kept.state, RefreshState::kDone);
  for (int i = 0; i < 40; ++i) {
    ServiceRequest bad = Request(shm, "missing-" + std::to_string(i), 0, 16, 16, 2);
    bad.gradient.region.shm_name = "/ofd-no-such-object";
    EXPECT_EQ(SubmitAndWait(bad).state, RefreshState::kFailed);
    EXPECT_LE(service_->stats().parameters_held, 8u) << "after failure " << i;
  }
  EXPECT_EQ(service_->stats().parameters_held, 8u);
  // The least recently used went first: "kept" (used before every failure) is forgotten, and
  // the newest failures are held.
  RefreshRecord again = SubmitAndWait(Request(shm, "kept", 0, 24, 16, 2));
  EXPECT_EQ(again.state, RefreshState::kDone) << again.status;  // step 0 again: history gone
}

TEST_F(RefreshServiceTest, MissingRegionAndUnknownIdsAreNotFound) {
  Start();
  Shm shm(2 << 20);
  ServiceRequest req = Request(shm, "w", 0, 16, 16, 2);
  req.gradient.region.shm_name = "/ofd-no-such-object";
  RefreshRecord rec = SubmitAndWait(req);
  EXPECT_EQ(rec.state, RefreshState::kFailed);
  EXPECT_EQ(rec.status.code(), absl::StatusCode::kNotFound) << rec.status;
  EXPECT_EQ(service_->Get(12345).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->WhenFinished(12345, [](const RefreshRecord&) {}).code(),
            absl::StatusCode::kNotFound);
}

// Collects the lines glog writes while it is installed.
class LogLines : public google::LogSink {
 public:
  LogLines() { google::AddLogSink(this); }
  ~LogLines() override { google::RemoveLogSink(this); }
  void send(google::LogSeverity, const char*, const char*, int, const struct ::tm*,
            const char* message, size_t length) override {
    std::lock_guard<std::mutex> lock(mu_);
    text_.append(message, length).append("\n");
  }
  std::string text() {
    std::lock_guard<std::mutex> lock(mu_);
    return text_;
  }

 private:
  std::mutex mu_;
  std::string text_;
};

// A failed refresh's warning quoted the client's parameter_id (and the region name in its
// status) as sent: a newline in it wrote a line of the client's choosing, e.g. a forged audit
// record of an admin ending a session.
TEST_F(RefreshServiceTest, AFailedRefreshLogsTheClientsStringsEscaped) {
  Start();
  Shm shm(2 << 20);
  const std::string forged = "\naudit: end_session by_uid=0 by_pid=1 session=1 outcome=OK\n";
  ServiceRequest req = Request(shm, "w" + forged, 0, 16, 16, 2);
  req.gradient.region.shm_name = "/ofd-no-such-object" + forged;
  LogLines log;
  RefreshRecord rec = SubmitAndWait(req);
  ASSERT_EQ(rec.state, RefreshState::kFailed);
  const std::string text = log.text();
  ASSERT_NE(text.find("projector refresh"), std::string::npos) << text;  // the warning came
  EXPECT_EQ(text.find("\naudit: "), std::string::npos) << text;
  EXPECT_NE(text.find("(w\\naudit: end_session by_uid=0"), std::string::npos) << text;
}

// A client can fail refreshes at will (5000 naming a missing object wrote 9.7 MB of log in
// 1.3 s): a second's failures write one line.
TEST_F(RefreshServiceTest, FailedRefreshWarningsAreLimitedToOneASecond) {
  Start();
  Shm shm(2 << 20);
  LogLines log;
  const auto start = std::chrono::steady_clock::now();
  int failed = 0;
  for (int i = 0; i < 200; ++i) {
    ServiceRequest req = Request(shm, "f" + std::to_string(i), 0, 16, 16, 2);
    req.gradient.region.shm_name = "/ofd-no-such-object";
    failed += SubmitAndWait(req).state == RefreshState::kFailed;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  EXPECT_EQ(failed, 200);
  const std::string text = log.text();
  size_t lines = 0;
  for (size_t at = text.find("projector refresh"); at != std::string::npos;
       at = text.find("projector refresh", at + 1)) {
    ++lines;
  }
  EXPECT_GE(lines, 1u) << text;
  EXPECT_LE(lines, static_cast<size_t>(seconds) + 1) << text;  // one per started second
}

TEST_F(RefreshServiceTest, ShmObjectsOfAnotherUserAreRefused) {
  Start();
  Shm shm(2 << 20);  // owned by this test's uid
  WriteG(shm, Decaying(24, 16, 13));
  ServiceRequest req = Request(shm, "w", 0, 24, 16, 2);
  req.caller_uid = static_cast<int64_t>(getuid()) + 1000;  // someone else, not root
  RefreshRecord denied = SubmitAndWait(req);
  EXPECT_EQ(denied.state, RefreshState::kFailed);
  EXPECT_EQ(denied.status.code(), absl::StatusCode::kPermissionDenied) << denied.status;
  EXPECT_TRUE(backend_.tags().empty());
  req.step = 1;
  req.caller_uid = getuid();  // the owner
  EXPECT_EQ(SubmitAndWait(req).state, RefreshState::kDone);
  req.step = 2;
  req.caller_uid = 0;  // root may name any object
  EXPECT_EQ(SubmitAndWait(req).state, RefreshState::kDone);
}

TEST_F(RefreshServiceTest, RepeatedRefreshesReuseTheOpenedRegion) {
  Start();
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 12));
  for (int step = 0; step < 4; ++step) {
    ASSERT_EQ(SubmitAndWait(Request(shm, "w", step, 24, 16, 2)).state, RefreshState::kDone);
  }
  EXPECT_EQ(service_->stats().region_opens_total, 1u);
}

}  // namespace
}  // namespace offloadd::projector

namespace offloadd::projector {
namespace {

// A sparse 40 GiB object passes the region checks, but a [100000, 100000]
// fp32 refresh would need ~80 GB: refused at Submit, before anything is allocated (it used to
// throw std::bad_alloc on a worker and terminate the daemon).
TEST_F(RefreshServiceTest, OversizedGradientIsRefusedBeforeAnythingIsAllocated) {
  Start();
  Shm sparse(40ull << 30);  // ftruncate only: no page is allocated
  auto submitted = service_->Submit(Request(sparse, "huge", 0, 100000, 100000, 128));
  ASSERT_EQ(submitted.status().code(), absl::StatusCode::kOutOfRange) << submitted.status();
  EXPECT_NE(submitted.status().message().find("max_refresh_bytes"), std::string::npos);
  // The service keeps serving.
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 3));
  EXPECT_EQ(SubmitAndWait(Request(shm, "small", 0, 24, 16, 2)).state, RefreshState::kDone);
}

// Whatever the bound, an allocation that fails on a worker fails that refresh only.
class ThrowingBackend : public SvdBackend {
 public:
  absl::string_view name() const override { return "throwing"; }
  absl::StatusOr<TopSingular> Exact(DenseMatrix a, VectorSide side, int64_t k) const override {
    if (throw_next_.exchange(false)) throw std::bad_alloc();
    return lapack_.Exact(a, side, k);
  }
  absl::StatusOr<TopSingular> Randomized(DenseMatrix a, VectorSide side, int64_t k,
                                         const RandomizedOptions& o,
                                         DenseMatrix warm) const override {
    return lapack_.Randomized(a, side, k, o, warm);
  }
  mutable std::atomic<bool> throw_next_{true};

 private:
  LapackSvdBackend lapack_;
};

TEST_F(RefreshServiceTest, BadAllocOnAWorkerFailsThatRefreshWithResourceExhausted) {
  ThrowingBackend throwing;
  RefreshServiceOptions options;
  options.cpu_backend = &throwing;
  Start(options);
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 4));
  RefreshRecord failed = SubmitAndWait(Request(shm, "a", 0, 24, 16, 2));
  EXPECT_EQ(failed.state, RefreshState::kFailed);
  EXPECT_EQ(failed.status.code(), absl::StatusCode::kResourceExhausted) << failed.status;
  EXPECT_EQ(SubmitAndWait(Request(shm, "a", 1, 24, 16, 2)).state, RefreshState::kDone);
}

TEST_F(RefreshServiceTest, QueuedRefreshesAreBoundedInTotalAndPerUid) {
  RefreshServiceOptions options;
  options.max_queued_refreshes = 3;
  options.max_queued_refreshes_per_uid = 2;
  Start(options);
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 5));
  backend_.Close();
  auto request = [&](const std::string& parameter, int64_t uid) {
    ServiceRequest r = Request(shm, parameter, 0, 24, 16, 2);
    r.caller_uid = uid;
    return service_->Submit(r);
  };
  auto a = request("a", -1), b = request("b", -1);
  ASSERT_TRUE(a.ok() && b.ok());
  auto c = request("c", -1);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(c.status().message().find("max_queued_refreshes_per_uid"), std::string::npos);
  auto d = request("d", 7);  // another user still has room
  ASSERT_TRUE(d.ok()) << d.status();
  auto e = request("e", 8);
  EXPECT_EQ(e.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_NE(e.status().message().find("max_queued_refreshes)"), std::string::npos);
  backend_.Open();
  ASSERT_TRUE(service_->Wait(a->id).ok());
  ASSERT_TRUE(service_->Wait(b->id).ok());
  ASSERT_TRUE(service_->Wait(d->id).ok());
  EXPECT_TRUE(request("c", -1).ok());  // room again once they finished
}

}  // namespace
}  // namespace offloadd::projector

namespace offloadd::projector {
namespace {

// Projector names (parameter, step, batch) and history are scoped by the
// caller's uid, and ids cannot be guessed from one's own.
TEST_F(RefreshServiceTest, AnotherUidsSameKeyIsNotDeduplicatedNorOrdered) {
  Start();
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 6));
  auto as = [&](int64_t uid, int64_t step) {
    ServiceRequest r = Request(shm, "layer0.q", step, 24, 16, 2);
    r.caller_uid = uid;
    r.batch_id = "b";
    return r;
  };
  auto mine = service_->Submit(as(-1, 5));
  ASSERT_TRUE(mine.ok());
  ASSERT_TRUE(service_->Wait(mine->id).ok());
  auto theirs = service_->Submit(as(2000, 5));  // same key, another user
  ASSERT_TRUE(theirs.ok()) << theirs.status();
  EXPECT_FALSE(theirs->deduplicated);
  EXPECT_NE(theirs->id, mine->id);
  EXPECT_NE(theirs->id, mine->id + 1) << "sequential ids let another user guess them";
  auto poison = service_->Submit(as(2000, int64_t{1000000000000000000}));
  ASSERT_TRUE(poison.ok());
  ASSERT_TRUE(service_->Wait(poison->id).ok());
  // The other user's step 10^18 does not reorder this user's parameter.
  auto next = service_->Submit(as(-1, 6));
  EXPECT_TRUE(next.ok()) << next.status();
}

TEST_F(RefreshServiceTest, ResultsKeysAndBatchesAreVisibleToTheirOwnerOnly) {
  Start();
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 7));
  ServiceRequest r = Request(shm, "layer0.k", 3, 24, 16, 2);
  r.batch_id = "step-3";
  auto mine = service_->Submit(r);
  ASSERT_TRUE(mine.ok());
  ASSERT_TRUE(service_->Wait(mine->id).ok());
  EXPECT_TRUE(service_->Get(mine->id, -1).ok());
  EXPECT_EQ(service_->Get(mine->id, 2000).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->Find(-1, "", "layer0.k", 3).value_or(0), mine->id);
  EXPECT_EQ(service_->Find(2000, "", "layer0.k", 3).status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(service_->BatchIds(-1, "step-3"), std::vector<uint64_t>{mine->id});
  EXPECT_TRUE(service_->BatchIds(2000, "step-3").empty());
  EXPECT_EQ(service_->WhenFinished(mine->id, 2000, [](const RefreshRecord&) {}).code(),
            absl::StatusCode::kNotFound);
}


// Second adversarial pass: the result cache and the history have a budget per uid, so another
// uid's flood of refreshes does not evict this uid's results or projectors (they used to be one
// LRU for everyone).
TEST_F(RefreshServiceTest, AnotherUidsFloodDoesNotEvictThisUidsResultsOrHistory) {
  RefreshServiceOptions options;
  options.max_results = 8;
  options.max_results_per_uid = 4;
  options.history_bytes = 4 * 16 * 2 * 4;          // four 16 x 2 fp32 projectors
  options.history_bytes_per_uid = 2 * 16 * 2 * 4;  // two per uid
  Start(options);
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 12));
  // Two owners that may both name this test's shm object: unknown credentials and our uid.
  const int64_t victim = -1, flooder = static_cast<int64_t>(getuid());
  auto as = [&](int64_t uid, const std::string& parameter, int64_t step) {
    ServiceRequest r = Request(shm, parameter, step, 24, 16, 2);
    r.caller_uid = uid;
    return SubmitAndWait(r);
  };
  RefreshRecord mine = as(victim, "w", 0);
  ASSERT_EQ(mine.state, RefreshState::kDone);
  for (int p = 0; p < 20; ++p) {
    ASSERT_EQ(as(flooder, "p" + std::to_string(p), 0).state, RefreshState::kDone);
  }
  EXPECT_TRUE(service_->Get(mine.id, victim).ok()) << "another uid's flood evicted this result";
  EXPECT_EQ(service_->Find(victim, "", "w", 0).value_or(0), mine.id);
  EXPECT_EQ(service_->stats().results_held, 1u + 4u);  // the flooder keeps its own 4
  RefreshRecord next = as(victim, "w", 1);
  EXPECT_TRUE(next.result.has_similarity) << "this uid's projector was forgotten";
  EXPECT_LE(service_->stats().history_bytes, options.history_bytes);
}

// One uid's backlog over many parameters delays another uid's single refresh by at most one
// job (it used to wait for one job of every parameter queued before it).
TEST_F(RefreshServiceTest, WorkersServeUidsRoundRobin) {
  Start();  // one worker
  const int64_t m = 24, n = 16, r = 2;
  Shm flood(2 << 20), mine(2 << 20);
  WriteG(flood, Tagged(m, n, 100));
  WriteG(mine, Tagged(m, n, 200));
  backend_.Close();
  std::vector<uint64_t> ids;
  for (int p = 0; p < 6; ++p) {
    ServiceRequest req = Request(flood, "p" + std::to_string(p), 0, m, n, r);
    req.caller_uid = static_cast<int64_t>(getuid());  // the flooder
    auto s = service_->Submit(req);
    ASSERT_TRUE(s.ok());
    ids.push_back(s->id);
    if (p == 0) backend_.WaitForCalls(1);  // p0 is running, blocked in the backend
  }
  ServiceRequest req = Request(mine, "w", 0, m, n, r);
  req.caller_uid = -1;  // another owner (unknown credentials)
  auto s = service_->Submit(req);
  ASSERT_TRUE(s.ok());
  ids.push_back(s->id);
  backend_.Open();
  for (uint64_t id : ids) ASSERT_TRUE(service_->Wait(id).ok());
  const std::vector<float> tags = backend_.tags();
  ASSERT_EQ(tags.size(), 7u);
  // After the running p0, at most one more of the flood (it queued first) runs before this
  // uid's refresh; the rest of the flood follows.
  const auto position = std::find(tags.begin(), tags.end(), 200.0f) - tags.begin();
  EXPECT_LE(position, 2) << "this uid's refresh waited behind " << position << " jobs";
}


// Calls waiting for refreshes (GetResult with wait, WatchBatch) are bounded per uid and in
// total: 8192 GetResult(wait) calls of one uid on one queued refresh held ~190 MiB in the daemon.
TEST_F(RefreshServiceTest, WaitingCallsAreBoundedPerUidAndInTotal) {
  RefreshServiceOptions options;
  options.max_waiters_per_uid = 2;
  options.max_waiters = 3;
  Start(options);
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 13));
  backend_.Close();
  const int64_t me = -1, other = static_cast<int64_t>(getuid());
  auto submitted = service_->Submit(Request(shm, "w", 0, 24, 16, 2));
  ASSERT_TRUE(submitted.ok());
  std::atomic<int> answered{0};
  auto waiter = [&](const RefreshRecord&) { ++answered; };
  EXPECT_TRUE(service_->WhenFinished(submitted->id, me, waiter).ok());
  EXPECT_TRUE(service_->WhenFinished(submitted->id, me, waiter).ok());
  absl::Status third = service_->WhenFinished(submitted->id, me, waiter);
  EXPECT_EQ(third.code(), absl::StatusCode::kResourceExhausted) << third;
  EXPECT_NE(third.message().find("max_waiting_calls_per_uid"), std::string::npos) << third;
  ServiceRequest theirs = Request(shm, "v", 0, 24, 16, 2);
  theirs.caller_uid = other;
  auto their_id = service_->Submit(theirs);
  ASSERT_TRUE(their_id.ok());
  EXPECT_TRUE(service_->WhenFinished(their_id->id, other, waiter).ok());
  absl::Status total = service_->WhenFinished(their_id->id, other, waiter);
  EXPECT_EQ(total.code(), absl::StatusCode::kResourceExhausted) << total;
  EXPECT_NE(total.message().find("max_waiting_calls)"), std::string::npos) << total;
  backend_.Open();
  ASSERT_TRUE(service_->Wait(submitted->id).ok());
  ASSERT_TRUE(service_->Wait(their_id->id).ok());
  EXPECT_EQ(answered.load(), 3);
  // Answered waiters no longer count.
  auto next = service_->Submit(Request(shm, "w", 1, 24, 16, 2));
  ASSERT_TRUE(next.ok());
  EXPECT_TRUE(service_->WhenFinished(next->id, me, waiter).ok());
  EXPECT_TRUE(service_->WhenFinished(next->id, me, waiter).ok());
}

}  // namespace
}  // namespace offloadd::projector

namespace offloadd::projector {
namespace {

// A withdrawn waiter (a GetResult whose deadline passed, a cancelled WatchBatch) frees its slot
// at once, and its callback never runs.
TEST_F(RefreshServiceTest, CancelledWaitersFreeTheirSlotsAtOnce) {
  RefreshServiceOptions options;
  options.max_waiters_per_uid = 2;
  Start(options);
  Shm shm(2 << 20);
  WriteG(shm, Decaying(24, 16, 13));
  backend_.Close();
  const int64_t me = -1;
  auto submitted = service_->Submit(Request(shm, "w", 0, 24, 16, 2));
  ASSERT_TRUE(submitted.ok());
  std::atomic<int> answered{0}, withdrawn_answered{0};
  auto waiter = [&](const RefreshRecord&) { ++answered; };
  uint64_t first = 0, second = 0;
  ASSERT_TRUE(service_->WhenFinished(submitted->id, me,
                                     [&](const RefreshRecord&) { ++withdrawn_answered; }, &first)
                  .ok());
  ASSERT_TRUE(service_->WhenFinished(submitted->id, me, waiter, &second).ok());
  EXPECT_NE(first, 0u);
  EXPECT_NE(first, second);
  EXPECT_EQ(service_->WhenFinished(submitted->id, me, waiter).code(),
            absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(service_->CancelWait(submitted->id, first));
  EXPECT_FALSE(service_->CancelWait(submitted->id, first));  // already withdrawn
  EXPECT_TRUE(service_->WhenFinished(submitted->id, me, waiter).ok());
  backend_.Open();
  ASSERT_TRUE(service_->Wait(submitted->id).ok());
  EXPECT_EQ(answered.load(), 2);
  EXPECT_EQ(withdrawn_answered.load(), 0);
  EXPECT_FALSE(service_->CancelWait(submitted->id, second));  // answered: nothing to withdraw
  uint64_t token = 1;  // a finished refresh answers at once: no token
  ASSERT_TRUE(service_->WhenFinished(submitted->id, me, waiter, &token).ok());
  EXPECT_EQ(token, 0u);
}

}  // namespace
}  // namespace offloadd::projector
