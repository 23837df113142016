// The cuda copy-rate meter (cuda_rate_meter.h) against the timing model (SimCudaApi on the real
// clock: the figures must come out within 5 % of the modelled ones) and against FakeCudaApi
// (device affinity, every buffer and event released, errors naming the GPU).
#include "server/copy/cuda/cuda_rate_meter.h"

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "common/base/clock.h"
#include "gtest/gtest.h"
#include "server/copy/cuda/cuda_api_fake.h"
#include "server/copy/cuda/cuda_api_sim.h"
#include "server/copy/cuda/cuda_engine.h"

namespace offloadd::copy {
namespace {

constexpr Direction kD2H = Direction::kDeviceToHost, kH2D = Direction::kHostToDevice;

// 4 simulated GPUs, 2 per switch: 20 GB/s per GPU and direction, 30 GB/s per switch.
SimCudaOptions SwitchLimited() {
  SimCudaOptions o;
  o.model.gpus = 4;
  o.model.gpus_per_switch = 2;
  o.model.engine_bytes_per_second = 20e9;
  o.model.switch_bytes_per_second = 30e9;
  return o;
}

std::string Sim(int i) { return SimCudaApi::DeviceUuid(i); }

void ExpectWithin5Percent(double measured, double modelled, const std::string& what) {
  EXPECT_NEAR(measured, modelled, 0.05 * modelled)
      << what << ": " << measured / 1e9 << " GB/s measured, " << modelled / 1e9 << " modelled";
}

TEST(LinkCalibrationSimTest, FiguresAreWithinFivePercentOfTheModel) {
  SimCudaApi sim(SwitchLimited());
  CudaCopyEngine engine(sim.Borrow());
  auto meter = NewCudaCopyRateMeter(&engine);
  RateMeasurementOptions o;
  o.budget_seconds = 3;
  const double t0 = base::SteadyNowSeconds();
  std::vector<GroupRates> r =
      meter->Measure({{"switch0", {Sim(0), Sim(1)}}, {"gpu2", {Sim(2)}}}, o);
  const double took = base::SteadyNowSeconds() - t0;
  ASSERT_EQ(r.size(), 2u);
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  ASSERT_TRUE(r[1].status.ok()) << r[1].status;
  for (Direction d : {kD2H, kH2D}) {
    const std::string dir = DirectionName(d);
    ExpectWithin5Percent(r[0].alone[0].of(d), 20e9, "GPU 0 alone " + dir);
    ExpectWithin5Percent(r[0].alone[1].of(d), 20e9, "GPU 1 alone " + dir);
    ExpectWithin5Percent(r[0].together.of(d), 30e9, "switch 0's GPUs together " + dir);
    ExpectWithin5Percent(r[1].alone[0].of(d), 20e9, "GPU 2 alone " + dir);
    EXPECT_EQ(r[1].together.of(d), r[1].alone[0].of(d));
  }
  std::printf("SIMULATED calibration (model 20 GB/s per GPU, 30 GB/s per switch): GPU 0 alone "
              "d2h %.2f h2d %.2f, switch 0 together d2h %.2f h2d %.2f GB/s in %.2f s\n",
              r[0].alone[0].of(kD2H) / 1e9, r[0].alone[0].of(kH2D) / 1e9,
              r[0].together.of(kD2H) / 1e9, r[0].together.of(kH2D) / 1e9, took);
  // 8 windows of at most 0.1 s, each with its drain: well within the budget.
  EXPECT_LT(took, o.budget_seconds + 0.5);
  EXPECT_GT(r[0].seconds, 0.3);
  // Everything was given back: the model saw the copies, nothing is left queued.
  EXPECT_GT(sim.engine_stats(0, kD2H).bytes_done, 0u);
}

TEST(LinkCalibrationSimTest, AGroupAcrossTwoSwitchesMovesBoth) {
  SimCudaApi sim(SwitchLimited());
  CudaCopyEngine engine(sim.Borrow());
  RateMeasurementOptions o;
  o.budget_seconds = 2;
  std::vector<GroupRates> r = NewCudaCopyRateMeter(&engine)->Measure({{"x", {Sim(1), Sim(2)}}}, o);
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  ExpectWithin5Percent(r[0].together.of(kD2H), 40e9, "GPUs 1 and 2 (two switches) d2h");
  ExpectWithin5Percent(r[0].together.of(kH2D), 40e9, "GPUs 1 and 2 (two switches) h2d");
}

TEST(LinkCalibrationSimTest, TheBudgetBoundsTheTimeAndShortensTheWindows) {
  SimCudaApi sim(SwitchLimited());
  CudaCopyEngine engine(sim.Borrow());
  RateMeasurementOptions o;
  o.budget_seconds = 0.4;  // 12 windows: ~0.01 s each after the drains are set aside
  o.queue_seconds = 0.005;
  const double t0 = base::SteadyNowSeconds();
  std::vector<GroupRates> r = NewCudaCopyRateMeter(&engine)->Measure(
      {{"switch0", {Sim(0), Sim(1)}}, {"switch1", {Sim(2), Sim(3)}}}, o);
  EXPECT_LT(base::SteadyNowSeconds() - t0, o.budget_seconds + 0.3);
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  ExpectWithin5Percent(r[0].together.of(kD2H), 30e9, "switch 0 d2h in short windows");
}

TEST(LinkCalibrationSimTest, ABudgetTooSmallReportsDeadlineExceeded) {
  SimCudaApi sim(SwitchLimited());
  CudaCopyEngine engine(sim.Borrow());
  RateMeasurementOptions o;
  o.budget_seconds = 0.02;
  std::vector<GroupRates> r =
      NewCudaCopyRateMeter(&engine)->Measure({{"switch0", {Sim(0), Sim(1)}}}, o);
  ASSERT_EQ(r.size(), 1u);
  EXPECT_EQ(r[0].status.code(), absl::StatusCode::kDeadlineExceeded) << r[0].status;
  EXPECT_NE(r[0].status.message().find("link_calibration_budget_seconds"), std::string::npos);
  EXPECT_EQ(r[0].together.of(kD2H), 0);
}

std::vector<CudaDeviceInfo> TwoFakeGpus() {
  std::vector<CudaDeviceInfo> gpus(2);
  for (int i = 0; i < 2; ++i) {
    gpus[i].uuid = "GPU-0000000" + std::to_string(i) + "-0000-0000-0000-000000000000";
    gpus[i].pci_bus_id = "0000:0" + std::to_string(i) + ":00.0";
    gpus[i].name = "fake";
    gpus[i].total_bytes = 1ull << 30;
  }
  return gpus;
}

RateMeasurementOptions SmallCopies() {
  RateMeasurementOptions o;
  o.budget_seconds = 1;
  o.max_window_seconds = 0.02;
  o.copy_bytes = 64 << 10;  // the fake really copies: keep it cheap
  return o;
}

TEST(LinkCalibrationFakeTest, RunsOnEachDeviceThreadAndGivesEverythingBack) {
  FakeCudaApi fake(TwoFakeGpus());
  fake.SetCopyBytesPerSecond(10e9);
  CudaCopyEngine engine(fake.Borrow());
  const std::string a = TwoFakeGpus()[0].uuid, b = TwoFakeGpus()[1].uuid;
  // Start both device threads first, so their own streams and events are counted before.
  for (const std::string& g : {a, b}) {
    ASSERT_TRUE(engine.RunOnDevice(g, [](CudaApi&) { return absl::OkStatus(); }).ok());
  }
  const int streams = fake.live_streams(), events = fake.live_events();
  std::vector<GroupRates> r =
      NewCudaCopyRateMeter(&engine)->Measure({{"l", {a, b}}}, SmallCopies());
  ASSERT_TRUE(r[0].status.ok()) << r[0].status;
  for (Direction d : {kD2H, kH2D}) {
    EXPECT_NEAR(r[0].alone[0].of(d), 10e9, 1e6);  // the fake's clock: bytes / 10 GB/s exactly
    EXPECT_NEAR(r[0].alone[1].of(d), 10e9, 1e6);
    EXPECT_NEAR(r[0].together.of(d), 20e9, 2e6);  // each stream has its own clock
  }
  EXPECT_EQ(fake.wrong_device_calls(), 0);
  EXPECT_EQ(fake.live_device_allocations(), 0);
  EXPECT_EQ(fake.registered_host_bytes(), 0u);
  EXPECT_EQ(fake.live_streams(), streams);
  EXPECT_EQ(fake.live_events(), events);
  EXPECT_GT(fake.count("CreateTimingEvent"), 2);
  EXPECT_EQ(fake.count("DeviceMalloc"), 2);
  EXPECT_EQ(fake.count("DeviceFree"), 2);
  EXPECT_EQ(fake.threads_for_device(0).size(), 1u);  // the device thread only
}

TEST(LinkCalibrationFakeTest, AFailedDeviceAllocationFailsItsGroupAndNamesTheGpu) {
  FakeCudaApi fake(TwoFakeGpus());
  CudaCopyEngine engine(fake.Borrow());
  const std::string a = TwoFakeGpus()[0].uuid, b = TwoFakeGpus()[1].uuid;
  fake.FailNext("DeviceMalloc",
                absl::FailedPreconditionError("cudaMalloc: cudaErrorMemoryAllocation (2)"));
  std::vector<GroupRates> r =
      NewCudaCopyRateMeter(&engine)->Measure({{"l0", {a}}, {"l1", {b}}}, SmallCopies());
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r[0].status.message().find(a), std::string::npos) << r[0].status;
  EXPECT_NE(r[0].status.message().find("cudaMalloc"), std::string::npos);
  EXPECT_EQ(r[0].alone[0].of(kD2H), 0);
  ASSERT_TRUE(r[1].status.ok()) << r[1].status;  // the next group is measured all the same
  EXPECT_GT(r[1].alone[0].of(kH2D), 0);
  EXPECT_EQ(fake.live_device_allocations(), 0);
  EXPECT_EQ(fake.registered_host_bytes(), 0u);
}

TEST(LinkCalibrationFakeTest, AGpuTheDaemonCannotSeeFailsItsGroupOnly) {
  FakeCudaApi fake(TwoFakeGpus());
  CudaCopyEngine engine(fake.Borrow());
  const std::string a = TwoFakeGpus()[0].uuid;
  std::vector<GroupRates> r = NewCudaCopyRateMeter(&engine)->Measure(
      {{"ghost", {a, "GPU-99999999-0000-0000-0000-000000000000"}}, {"l0", {a}}}, SmallCopies());
  EXPECT_EQ(r[0].status.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r[0].status.message().find("not visible"), std::string::npos) << r[0].status;
  EXPECT_TRUE(r[1].status.ok()) << r[1].status;
  EXPECT_EQ(fake.live_device_allocations(), 0);
}

}  // namespace
}  // namespace offloadd::copy
