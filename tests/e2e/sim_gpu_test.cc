// The C++ CUDA data path on a simulated client GPU against the real daemon on
// --backend=cuda-sim: CudaExporter and Client over SimClientGpu (client/sim_client_cuda_api.h),
// whose device memory, segments and events the daemon's SimCudaApi reads and writes in a shared
// table, moving the bytes of each copy when its model says the copy completed. Checked with
// bytes and the table's violation counters: the event protocol both ways (a reload's consumer
// waits on the done event only after the answer; an offload waits for its own producer only), a
// segment freed while the daemon copies from it, VMM memory, and CUDA's error state after a
// failed export. Every time figure is SIMULATED.
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>

#include "client/cuda_export.h"
#include "client/offloadd_client.h"
#include "client/sim_client_cuda_api.h"
#include "common/sim_gpu_table.h"
#include "gtest/gtest.h"
#include "tests/e2e/child_process.h"
#include "tests/e2e/sim_gpu_daemon.h"

namespace offloadd::testing {
namespace {

using client::IpcEvent;
using client::SimClientGpu;
using common::SimViolation;
constexpr uint64_t kMiB = 1ull << 20;
constexpr auto kAnswerTimeout = std::chrono::seconds(30);

int64_t NowNs() { return common::SimNowNanoseconds(); }

std::string Pattern(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string s(n, '\0');
  for (char& c : s) c = static_cast<char>(rng());
  return s;
}

template <typename T>
T Await(client::Reply<T>& reply) {
  EXPECT_EQ(reply.wait_for(kAnswerTimeout), std::future_status::ready) << "the daemon is silent";
  return reply.get();
}

class SimGpuTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    daemon_ = new SimGpuDaemon("simgpu", {"--pool_bytes=256MiB"});
  }
  static void TearDownTestSuite() {
    EXPECT_EQ(daemon_->Stop(), 0);
    delete daemon_;
  }

  void SetUp() override {
    ASSERT_TRUE(daemon_->ready()) << "the daemon did not start on --backend=cuda-sim";
    auto g = CreateOwnSimGpu(128 * kMiB);
    ASSERT_TRUE(g.ok()) << g.status();
    gpu_ = *g;
    exporter_ = std::make_unique<client::CudaExporter>(client::NewSimClientCudaApi(gpu_));
    api_ = client::NewSimClientCudaApi(gpu_);
    for (void** s : {&compute_, &reload_, &other_}) {
      ASSERT_EQ(gpu_->StreamCreate(s), client::kSimCudaSuccess);
    }
    client_ = Connect("sim-gpu-test");
    ASSERT_NE(client_, nullptr);
  }
  void TearDown() override {
    for (auto& c : {client_.get(), second_.get()}) {
      if (c != nullptr) c->Close();
    }
    exporter_.reset();
  }

  std::unique_ptr<client::Client> Connect(const std::string& name) {
    client::ClientOptions o;
    o.socket_path = daemon_->socket();
    o.client_name = name;
    o.device_id = client::SimDeviceUuid(0);
    auto c = client::Client::Connect(o);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? *std::move(c) : nullptr;
  }

  uint64_t Malloc(uint64_t bytes, bool vmm = false) {
    uint64_t p = 0;
    EXPECT_EQ(gpu_->Malloc(&p, bytes, vmm), client::kSimCudaSuccess);
    return p;
  }

  // (region id, offset) of [ptr, +bytes) for `c`: its allocation registered once per buffer id.
  std::pair<uint64_t, uint64_t> Region(client::Client& c, uint64_t ptr, uint64_t bytes) {
    auto x = exporter_->Export(ptr, bytes);
    EXPECT_TRUE(x.ok()) << x.status();
    if (!x.ok()) return {0, 0};
    auto& regions = regions_[&c];
    auto it = regions.find(x->buffer_id);
    if (it == regions.end()) {
      auto id = c.RegisterRegion({x->ipc_handle, "", x->allocation_bytes});
      EXPECT_TRUE(id.ok()) << id.status();
      it = regions.emplace(x->buffer_id, id.ok() ? *id : 0).first;
    }
    return {it->second, x->offset};
  }

  // An offload of [ptr, +bytes) whose ready event is recorded on `stream` (the producer's).
  client::Reply<absl::StatusOr<client::OffloadResult>> StartOffload(client::Client& c,
                                                                    uint64_t ptr,
                                                                    uint64_t bytes,
                                                                    void* stream,
                                                                    IpcEvent* ready) {
    auto [region, offset] = Region(c, ptr, bytes);
    auto ev = exporter_->RecordReady(stream);
    EXPECT_TRUE(ev.ok()) << ev.status();
    *ready = *ev;
    return c.Offload(region, offset, bytes, ev->handle);
  }
  uint64_t OffloadNow(client::Client& c, uint64_t ptr, uint64_t bytes, void* stream) {
    IpcEvent ready;
    auto reply = StartOffload(c, ptr, bytes, stream, &ready);
    auto r = Await(reply);
    exporter_->ReleaseEvent(ready);
    EXPECT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r.ok() ? r->bytes : 0, bytes);
    return r.ok() ? r->block_id : 0;
  }

  // A reload of `block` into [dst, +bytes), its destination's ready event on the reload stream.
  struct Reload {
    IpcEvent ready, done;
    uint64_t dst = 0, bytes = 0;
    client::Reply<absl::StatusOr<client::ReloadResult>> reply;
  };
  Reload StartReload(client::Client& c, uint64_t block, uint64_t dst, uint64_t bytes) {
    Reload r;
    r.dst = dst;
    r.bytes = bytes;
    auto [region, offset] = Region(c, dst, bytes);
    r.ready = *exporter_->RecordReady(reload_);
    r.done = *exporter_->AcquireEvent();
    gpu_->NoteReloadSent(r.done.event, dst, bytes);
    r.reply = c.Reload(block, region, offset, client::Priority::kUrgent, /*release_after=*/true,
                       0, r.done.handle, r.ready.handle);
    return r;
  }
  // The answer, then the compute stream ordered after the done event, then the consumer's read.
  std::string Consume(Reload& r) {
    auto result = Await(r.reply);
    EXPECT_TRUE(result.ok()) << result.status();
    if (!result.ok()) return "";
    EXPECT_TRUE(result->done_event_recorded);
    EXPECT_TRUE(result->released);
    EXPECT_TRUE(api_->StreamWaitEvent(compute_, r.done.event).ok());
    exporter_->ReleaseEvent(r.ready);
    exporter_->ReleaseEvent(r.done);  // the wait captured its record
    std::string out;
    absl::Status st = gpu_->ReadOnStream(compute_, r.dst, r.bytes, &out);
    EXPECT_TRUE(st.ok()) << st;
    return out;
  }

  std::map<std::string, uint64_t> Violations() const {
    return {{"freed_while_mapped", gpu_->violations(SimViolation::kFreedWhileMapped)},
            {"copy_on_freed", gpu_->violations(SimViolation::kCopyOnFreed)},
            {"wait_unrecorded", gpu_->violations(SimViolation::kWaitUnrecorded)},
            {"consumed_early", gpu_->violations(SimViolation::kConsumedEarly)}};
  }
  void ExpectNoViolations() {
    for (const auto& [name, n] : Violations()) EXPECT_EQ(n, 0u) << name;
  }

  static SimGpuDaemon* daemon_;
  std::shared_ptr<SimClientGpu> gpu_;
  std::unique_ptr<client::CudaExporter> exporter_;
  std::unique_ptr<client::ClientCudaApi> api_;  // the test's own calls (stream waits)
  void* compute_ = nullptr;
  void* reload_ = nullptr;
  void* other_ = nullptr;
  std::unique_ptr<client::Client> client_, second_;
  std::map<client::Client*, std::map<uint64_t, uint64_t>> regions_;  // buffer id -> region
};

SimGpuDaemon* SimGpuTest::daemon_ = nullptr;

TEST_F(SimGpuTest, OffloadThenReloadIsBitwiseEqualAndTheConsumerWaitsOnlyAfterTheAnswer) {
  const uint64_t n = 16 * kMiB + 12345;  // three chunks, the last one short
  const std::string data = Pattern(n, 1);
  const uint64_t src = Malloc(n + 4096);
  ASSERT_EQ(gpu_->LaunchWrite(compute_, 0.002, src + 4096, data), client::kSimCudaSuccess);
  const uint64_t block = OffloadNow(*client_, src + 4096, n, compute_);
  ASSERT_NE(block, 0u);

  const uint64_t dst = Malloc(n);
  Reload r = StartReload(*client_, block, dst, n);
  auto answer = Await(r.reply);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->done_event_recorded);  // answered when the record was issued
  EXPECT_EQ(answer->bytes, n);
  // The bytes are in the destination by the time the done event completes.
  while (gpu_->EventQuery(r.done.event) == client::kSimCudaErrorNotReady) {
  }
  EXPECT_EQ(std::memcmp(gpu_->HostBytes(dst), data.data(), n), 0);
  ASSERT_TRUE(api_->StreamWaitEvent(compute_, r.done.event).ok());
  std::string out;
  ASSERT_TRUE(gpu_->ReadOnStream(compute_, dst, n, &out).ok());
  EXPECT_TRUE(out == data);
  EXPECT_EQ(exporter_->stats().handles_created_total, 2u);
  EXPECT_EQ(gpu_->PeekAtLastError(), client::kSimCudaSuccess);
  ExpectNoViolations();
}

// The negative control of the rule above: a wait issued before the answer orders nothing, and
// the table counts it.
TEST_F(SimGpuTest, AWaitOnTheDoneEventBeforeTheAnswerOrdersNothingAndIsCounted) {
  const uint64_t n = 2 * kMiB;
  const std::string data = Pattern(n, 2);
  const uint64_t src = Malloc(n);
  std::memcpy(gpu_->HostBytes(src), data.data(), n);
  const uint64_t block = OffloadNow(*client_, src, n, compute_);
  const uint64_t dst = Malloc(n);
  ASSERT_EQ(gpu_->LaunchKernel(reload_, 0.5), client::kSimCudaSuccess);  // dst still in use
  Reload r = StartReload(*client_, block, dst, n);
  const int64_t ready_at = gpu_->EventCompleteAtNanoseconds(r.ready.event);
  ASSERT_TRUE(api_->StreamWaitEvent(compute_, r.done.event).ok());  // too early
  EXPECT_EQ(gpu_->violations(SimViolation::kWaitUnrecorded), 1u);
  EXPECT_LE(gpu_->StreamTailNanoseconds(compute_), NowNs());  // it ordered nothing
  auto answer = Await(r.reply);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_TRUE(answer->done_event_recorded);
  EXPECT_GE(NowNs(), ready_at);  // no chunk (nor the record after the last) before dst was free
  ASSERT_TRUE(api_->StreamWaitEvent(compute_, r.done.event).ok());  // now, as the rule says
  std::string out;
  ASSERT_TRUE(gpu_->ReadOnStream(compute_, dst, n, &out).ok());
  EXPECT_TRUE(out == data);
  EXPECT_EQ(gpu_->violations(SimViolation::kWaitUnrecorded), 1u);
  EXPECT_EQ(gpu_->violations(SimViolation::kConsumedEarly), 0u);
}

TEST_F(SimGpuTest, AReadyOffloadIsStoredBeforeAnotherOffloadsProducerEnds) {
  const uint64_t n = 4 * kMiB;
  const std::string a_data = Pattern(n, 3), b_data = Pattern(n, 4);
  const uint64_t a = Malloc(n), b = Malloc(n);
  Region(*client_, a, n);  // registered before the timing
  Region(*client_, b, n);
  const double producer_seconds = 0.2;
  ASSERT_EQ(gpu_->LaunchWrite(compute_, producer_seconds, b, b_data), client::kSimCudaSuccess);
  const int64_t b_ready_at = gpu_->StreamTailNanoseconds(compute_);
  IpcEvent b_ready, a_ready;
  auto b_reply = StartOffload(*client_, b, n, compute_, &b_ready);
  ASSERT_EQ(gpu_->LaunchWrite(other_, 0, a, a_data), client::kSimCudaSuccess);
  const int64_t a_submitted_at = NowNs();
  auto a_reply = StartOffload(*client_, a, n, other_, &a_ready);
  auto a_result = Await(a_reply);
  const int64_t a_done_at = NowNs();
  auto b_result = Await(b_reply);
  const int64_t b_done_at = NowNs();
  ASSERT_TRUE(a_result.ok()) << a_result.status();
  ASSERT_TRUE(b_result.ok()) << b_result.status();
  exporter_->ReleaseEvent(a_ready);
  exporter_->ReleaseEvent(b_ready);
  std::printf(
      "SIMULATED: offload A (4 MiB) stored %.1f ms after its submit, %.1f ms before B's "
      "producer ended; B stored %.1f ms after that\n",
      (a_done_at - a_submitted_at) / 1e6, (b_ready_at - a_done_at) / 1e6,
      (b_done_at - b_ready_at) / 1e6);
  EXPECT_LT(a_done_at, b_ready_at);
  EXPECT_GE(b_done_at, b_ready_at);  // B's bytes waited for its producer
  // By content: B's block holds the producer's output, which landed only at its end.
  const uint64_t dst = Malloc(2 * n);
  Reload ra = StartReload(*client_, a_result->block_id, dst, n);
  Reload rb = StartReload(*client_, b_result->block_id, dst + n, n);
  EXPECT_TRUE(Consume(ra) == a_data);
  EXPECT_TRUE(Consume(rb) == b_data);
  ExpectNoViolations();
}

TEST_F(SimGpuTest, ASegmentFreedUnderACopyFailsThatTransferAndTheDaemonServesOthers) {
  const uint64_t n = 4 * kMiB;
  const uint64_t src = Malloc(n);
  std::memset(gpu_->HostBytes(src), 3, n);
  ASSERT_EQ(gpu_->LaunchKernel(compute_, 0.5), client::kSimCudaSuccess);  // the producer runs
  IpcEvent ready;
  auto reply = StartOffload(*client_, src, n, compute_, &ready);
  const int64_t deadline = NowNs() + 5'000'000'000;
  while (gpu_->DaemonMaps(src) == 0 && NowNs() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ASSERT_GT(gpu_->DaemonMaps(src), 0u) << "the daemon never mapped the offload's source";
  ASSERT_EQ(gpu_->Free(src), client::kSimCudaSuccess);  // the bug: freed under the daemon
  auto result = Await(reply);
  exporter_->ReleaseEvent(ready);
  ASSERT_FALSE(result.ok());
  std::printf("the offload of freed memory failed: %s\n", result.status().ToString().c_str());
  EXPECT_GE(gpu_->violations(SimViolation::kFreedWhileMapped), 1u);
  // Where the free lands decides how the transfer fails: inside the copy (the simulated
  // device counts a copy on freed memory) or before the copy engine's open of the handle, which
  // then refuses the dead allocation. Either way the transfer fails, and says why.
  const bool copied_on_freed = gpu_->violations(SimViolation::kCopyOnFreed) >= 1;
  const bool open_refused =
      result.status().message().find("is not live") != absl::string_view::npos;
  EXPECT_TRUE(copied_on_freed || open_refused) << result.status();

  // Another session on the same daemon is unaffected.
  second_ = Connect("sim-gpu-test second");
  ASSERT_NE(second_, nullptr);
  const std::string data = Pattern(n, 5);
  const uint64_t other_src = Malloc(n), dst = Malloc(n);
  std::memcpy(gpu_->HostBytes(other_src), data.data(), n);
  const uint64_t block = OffloadNow(*second_, other_src, n, other_);
  Reload r = StartReload(*second_, block, dst, n);
  EXPECT_TRUE(Consume(r) == data);
}

TEST_F(SimGpuTest, VmmMemoryIsRefusedAndAFailedExportLeavesNoLastError) {
  const uint64_t vmm = Malloc(4 * kMiB, /*vmm=*/true);  // PyTorch's expandable segments
  auto v = exporter_->Export(vmm, kMiB);
  EXPECT_EQ(v.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(v.status().message().find("expandable_segments"), std::string::npos) << v.status();
  EXPECT_EQ(gpu_->PeekAtLastError(), client::kSimCudaSuccess);

  const uint64_t n = kMiB;
  const std::string data = Pattern(n, 6);
  const uint64_t src = Malloc(n);
  std::memcpy(gpu_->HostBytes(src), data.data(), n);
  gpu_->InjectFailure("cudaIpcGetMemHandle", client::kSimCudaErrorInvalidValue);
  auto failed = exporter_->Export(src, n);
  EXPECT_EQ(failed.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_EQ(gpu_->PeekAtLastError(), client::kSimCudaSuccess);  // the next launch sees nothing
  // The same exporter, client and runtime go on.
  const uint64_t block = OffloadNow(*client_, src, n, compute_);
  const uint64_t dst = Malloc(n);
  Reload r = StartReload(*client_, block, dst, n);
  EXPECT_TRUE(Consume(r) == data);
  ExpectNoViolations();
}

}  // namespace
}  // namespace offloadd::testing
