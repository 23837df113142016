// A projector refresh's copies go through the device's link (class
// PROJECTOR) — chunked and counted there, and overtaken by an URGENT reload — via the
// CopyThroughLink the session layer supplies (Core::CopyOverLink), as main wires it.
#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <map>
#include <string>
#include <cstring>
#include <memory>
#include <mutex>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/blocking_copy_engine.h"
#include "server/copy/shm/shm_engine.h"
#include "server/pool/arena.h"
#include "server/projector/refresh_service.h"
#include "server/session/core.h"
#include "server/session/session_test_util.h"

namespace offloadd::session {
namespace {

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;
constexpr uint64_t kChunkBytes = 256 * kKiB;
constexpr int64_t kRows = 2048, kCols = 512;  // fp32 G: 4 MiB = 16 chunks
constexpr uint64_t kGradientBytes = kRows * kCols * sizeof(float);
constexpr uint64_t kProjectorOffset = 4 * kMiB;

// The shm engine, recording every chunk copy; while closed, reads (d2h) wait at a gate.
class GatedShmEngine : public copy::BlockingCopyEngine {
 public:
  struct Call {
    copy::Direction direction;
    uint64_t offset, bytes;
  };
  std::string name() const override { return "shm"; }
  absl::StatusOr<std::shared_ptr<copy::Region>> OpenRegion(const copy::RegionSpec& s) override {
    return shm_.OpenRegion(s);
  }
  absl::Status BlockingCopyChunk(copy::Direction direction, copy::Region& region,
                                 uint64_t offset, uint8_t* host, uint64_t bytes) override {
    {
      std::unique_lock<std::mutex> lock(mu_);
      calls_.push_back({direction, offset, bytes});
      cv_.notify_all();
      cv_.wait(lock, [&] { return !closed_ || direction != copy::Direction::kDeviceToHost; });
    }
    return shm_.CopyChunk(direction, region, offset, host, bytes);
  }
  std::map<std::string, copy::HandleCounts> handle_counts() const override {
    return shm_.handle_counts();
  }
  void ForgetDevice(const std::string& device_id) override { (void)device_id; }
  void Close() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = true;
  }
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    closed_ = false;
    cv_.notify_all();
  }
  // Whether n copies have started (bounded so that a test of the old, unchunked path fails
  // instead of hanging: it makes one copy).
  bool WaitForCalls(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(20), [&] { return calls_.size() >= n; });
  }
  std::vector<Call> calls(copy::Direction direction) {
    std::lock_guard<std::mutex> lock(mu_);
    std::vector<Call> out;
    for (const Call& c : calls_) {
      if (c.direction == direction) out.push_back(c);
    }
    return out;
  }

 private:
  copy::ShmCopyEngine shm_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool closed_ = false;
  std::vector<Call> calls_;
};

class ProjectorLinkTest : public ::testing::Test {
 protected:
  // One half-duplex link "pcie0" for gpu0 (reads, writes and reloads share its queue), two
  // copy threads, 256 KiB chunks; the refresh service copies through it as main wires it.
  void SetUp() override {
    CoreOptions o;
    o.chunk_bytes = kChunkBytes;
    o.copy_threads = 2;
    LinkSpec link;
    link.name = "pcie0";
    link.gpus = {"gpu0"};
    link.half_duplex = true;
    o.links = {link};
    pool::ArenaOptions a;
    a.size_bytes = 16 * kMiB;
    core_ = std::make_unique<Core>(o, *pool::Arena::Create(a),
                                   std::make_unique<copy::ShmCopyEngine>());
    projector::RefreshServiceOptions p;
    p.copy_through_link = [this](const projector::RegionCopy& c) {
      return core_->CopyOverLink(c.device_id, sched::TrafficClass::kProjector, *c.engine,
                                 c.direction, c.region, c.region_offset, c.host, c.bytes);
    };
    service_ = std::make_unique<projector::RefreshService>(p, &engine_, nullptr);
    uint32_t x = 12345;  // a non-zero G, so P is written
    auto* g = reinterpret_cast<float*>(shm_.data);
    for (uint64_t i = 0; i < kGradientBytes / sizeof(float); ++i) {
      x = x * 1664525u + 1013904223u;
      g[i] = static_cast<float>(x >> 8) / static_cast<float>(1u << 24) - 0.5f;
    }
  }
  void TearDown() override {
    service_.reset();
    core_.reset();
  }
  projector::ServiceRequest Request() const {
    projector::ServiceRequest r;
    r.parameter_id = "w";
    r.gradient.region = {shm_.name, "", shm_.size, "gpu0"};
    r.shape = {kRows, kCols};
    r.rank = 4;
    r.method = projector::SvdMethod::kRandomized;
    r.measure_residual = false;
    r.projector.offset_bytes = kProjectorOffset;
    return r;
  }
  sched::LinkSchedulerStats LinkStats() {
    for (const LinkInfo& l : core_->Stats().links) {
      if (l.name == "pcie0") return l.d2h;  // half duplex: both directions
    }
    ADD_FAILURE() << "no link pcie0";
    return {};
  }

  TestShm shm_{8 * kMiB};
  GatedShmEngine engine_;
  std::unique_ptr<Core> core_;
  std::unique_ptr<projector::RefreshService> service_;
};

constexpr int kProjector = static_cast<int>(sched::TrafficClass::kProjector);

TEST_F(ProjectorLinkTest, ARefreshCopiesTheGradientAsLinkChunksCountedInItsClass) {
  auto submitted = service_->Submit(Request());
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto record = service_->Wait(submitted->id);
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_EQ(record->state, projector::RefreshState::kDone) << record->status;
  ASSERT_TRUE(record->projector_written);
  const uint64_t p_bytes = record->projector_rows * record->effective_rank * sizeof(float);

  // G read as 16 chunks of 256 KiB covering [0, 4 MiB) once, P written as one (small) chunk.
  std::vector<GatedShmEngine::Call> reads = engine_.calls(copy::Direction::kDeviceToHost);
  ASSERT_EQ(reads.size(), kGradientBytes / kChunkBytes);
  std::vector<uint64_t> offsets;
  for (const auto& c : reads) {
    EXPECT_EQ(c.bytes, kChunkBytes);
    offsets.push_back(c.offset);
  }
  std::sort(offsets.begin(), offsets.end());
  for (size_t i = 0; i < offsets.size(); ++i) EXPECT_EQ(offsets[i], i * kChunkBytes);
  std::vector<GatedShmEngine::Call> writes = engine_.calls(copy::Direction::kHostToDevice);
  ASSERT_EQ(writes.size(), 1u);
  EXPECT_EQ(writes[0].offset, kProjectorOffset);
  EXPECT_EQ(writes[0].bytes, p_bytes);

  // The link counted both, in the projector class and for gpu0.
  const sched::LinkSchedulerStats link = LinkStats();
  EXPECT_EQ(link.class_bytes[kProjector], kGradientBytes + p_bytes);
  EXPECT_EQ(link.started_transfers[kProjector], 2u);
  EXPECT_EQ(link.bytes, kGradientBytes + p_bytes);
  EXPECT_EQ(link.gpu_bytes.at("gpu0"), kGradientBytes + p_bytes);
}

TEST_F(ProjectorLinkTest, AnUrgentReloadOvertakesAGradientReadInProgress) {
  engine_.Close();  // the link's two copy threads stop in the first two chunks of G
  auto submitted = service_->Submit(Request());
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  if (!engine_.WaitForCalls(2)) {
    engine_.Open();
    FAIL() << "the gradient read did not start as separate chunks on two copy threads";
  }

  ASSERT_TRUE(core_->AcquireLink("gpu0").ok());
  std::mutex mu;
  std::condition_variable cv;
  bool urgent_done = false;
  size_t reads_started_before_urgent = 0;
  uint64_t projector_bytes_before_urgent = 0;
  auto urgent = std::make_shared<sched::Transfer>();
  urgent->gpu = "gpu0";
  urgent->cls = sched::TrafficClass::kUrgent;
  urgent->bytes = kChunkBytes;
  urgent->copy_chunk = [&](uint64_t, uint64_t) {
    std::lock_guard<std::mutex> lock(mu);
    reads_started_before_urgent = engine_.calls(copy::Direction::kDeviceToHost).size();
    projector_bytes_before_urgent = LinkStats().class_bytes[kProjector];
    return absl::OkStatus();
  };
  urgent->done = [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    std::lock_guard<std::mutex> lock(mu);
    urgent_done = true;
    cv.notify_all();
  };
  core_->LinkFor("gpu0")->h2d->Submit(urgent);
  engine_.Open();
  {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return urgent_done; });
  }
  auto record = service_->Wait(submitted->id);
  ASSERT_TRUE(record.ok()) << record.status();
  EXPECT_EQ(record->state, projector::RefreshState::kDone) << record->status;
  core_->ReleaseLink("gpu0", false);

  // The reload went after the two chunks being copied when it came (and at most one more that
  // a copy thread picked as the other took the reload), not after all 16.
  EXPECT_GE(reads_started_before_urgent, 2u);
  EXPECT_LE(reads_started_before_urgent, 3u);
  EXPECT_LE(projector_bytes_before_urgent, 3 * kChunkBytes);
  EXPECT_EQ(engine_.calls(copy::Direction::kDeviceToHost).size(), kGradientBytes / kChunkBytes);
  EXPECT_GE(LinkStats().class_bytes[kProjector], kGradientBytes);
}

// Refreshes naming ever new device ids each left a link (two schedulers, their threads and
// series) behind: 64 refreshes with new ids, 256 more threads and /metrics grown by each id.
TEST_F(ProjectorLinkTest, ALinkMadeForRefreshesAloneIsRemovedAfterThem) {
  for (int i = 0; i < 3; ++i) {
    projector::ServiceRequest r = Request();
    r.step = i;
    r.gradient.region.device_id = "refresh-gpu-" + std::to_string(i);
    auto submitted = service_->Submit(r);
    ASSERT_TRUE(submitted.ok()) << submitted.status();
    auto record = service_->Wait(submitted->id);
    ASSERT_TRUE(record.ok()) << record.status();
    ASSERT_EQ(record->state, projector::RefreshState::kDone) << record->status;
  }
  for (const LinkInfo& l : core_->Stats().links) {
    EXPECT_EQ(l.name.rfind("refresh-gpu-", 0), std::string::npos) << "left behind: " << l.name;
  }
  // A device a session used keeps its link, and the refresh's bytes count on it.
  ASSERT_TRUE(core_->AcquireLink("gpu9").ok());
  core_->LinkFor("gpu9");
  core_->ReleaseLink("gpu9", /*remove_if_unused=*/false);
  projector::ServiceRequest r = Request();
  r.step = 3;
  r.gradient.region.device_id = "gpu9";
  auto submitted = service_->Submit(r);
  ASSERT_TRUE(submitted.ok()) << submitted.status();
  auto record = service_->Wait(submitted->id);
  ASSERT_TRUE(record.ok()) << record.status();
  ASSERT_EQ(record->state, projector::RefreshState::kDone) << record->status;
  bool kept = false;
  for (const LinkInfo& l : core_->Stats().links) {
    if (l.name != "gpu9") continue;
    kept = true;
    EXPECT_EQ(l.d2h.class_bytes[kProjector], kGradientBytes);
  }
  EXPECT_TRUE(kept) << "the link of a device a session used was removed";
}

}  // namespace
}  // namespace offloadd::session
