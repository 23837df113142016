// CopyRateEstimator: rates from late, batched observations of completions.
#include "server/copy/timing/copy_rate_estimator.h"

#include <cstdint>

#include "gtest/gtest.h"

namespace offloadd::copy {
namespace {

constexpr uint64_t kBytes = 1000000;  // 1 ms each at 1 GB/s
constexpr double kRate = 1e9;

TEST(CopyRateEstimatorTest, NoRateUntilAWindowOfEnoughCopiesAndTimeCloses) {
  CopyRateEstimator e({/*min_window_seconds=*/2e-3, /*min_window_copies=*/4, 0.3});
  e.OnCompletion(kBytes, true, 0.001);  // opens the window (its bytes ended before it)
  for (int i = 2; i <= 4; ++i) e.OnCompletion(kBytes, true, i * 1e-3);
  EXPECT_EQ(e.bytes_per_second(), 0);  // 3 copies in the window, 3 ms
  e.OnCompletion(kBytes, true, 0.005);
  EXPECT_DOUBLE_EQ(e.bytes_per_second(), kRate);  // 4 MB over 4 ms
  EXPECT_EQ(e.samples(), 1u);
}

// Completions seen late (up to 300 us, deterministic jitter) and two at a time, as a busy host
// sees them: the rate stays within 5 %. One sample per copy (bytes over the time since the
// previous observation) would give 0 s for every second copy of a pair.
TEST(CopyRateEstimatorTest, LateAndBatchedObservationsStillGiveTheRate) {
  CopyRateEstimator e;
  uint32_t seed = 12345;
  for (int i = 1; i <= 400; i += 2) {
    seed = seed * 1103515245u + 12345u;
    const double late = 300e-6 * ((seed >> 8) % 1000) / 1000.0;
    const double seen = (i + 1) * 1e-3 + late;  // copies i and i+1 seen in one pass
    e.OnCompletion(kBytes, true, seen);
    e.OnCompletion(kBytes, true, seen);
  }
  EXPECT_GT(e.samples(), 50u);
  EXPECT_NEAR(e.bytes_per_second(), kRate, 0.05 * kRate);
}

// A copy queued after the engine had gone idle starts a new window: the idle time is not
// counted as copying (that would halve the rate here).
TEST(CopyRateEstimatorTest, ACopyThatFollowedAnIdleEngineStartsANewWindow) {
  CopyRateEstimator e({2e-3, 4, 1.0});
  double t = 0;
  for (int round = 0; round < 10; ++round) {
    t += 5e-3;  // idle 5 ms, then 5 back-to-back copies
    e.OnCompletion(kBytes, /*contiguous=*/false, t);
    for (int i = 0; i < 4; ++i) {
      t += 1e-3;
      e.OnCompletion(kBytes, true, t);
    }
  }
  EXPECT_EQ(e.samples(), 10u);
  EXPECT_NEAR(e.bytes_per_second(), kRate, 1e-6 * kRate);
}

// A rate learned while the engine was shared (its other direction busy, or other GPUs on a
// switch) is a floor once that ends: each copy then ends before its prediction, the worker
// issues the next one late, the engine idles between copies and no window of back-to-back
// copies forms to correct it. A single copy's issue-to-seen-done span bounds the rate from
// below (it cannot have started before it was issued), which lifts the learned rate.
TEST(CopyRateEstimatorTest, ACopyFasterThanTheLearnedRateRaisesIt) {
  CopyRateEstimator e({2e-3, 4, 0.3});
  e.OnCopySpan(kBytes, 0, 1e-6);  // no learned rate yet: nothing to raise
  EXPECT_EQ(e.bytes_per_second(), 0);
  for (int i = 1; i <= 5; ++i) e.OnCompletion(kBytes, true, i * 2e-3);  // 0.5 GB/s
  ASSERT_DOUBLE_EQ(e.bytes_per_second(), kRate / 2);
  e.OnCopySpan(kBytes, 0.010, 0.0104);  // seen done 0.4 ms after it was issued: >= 2.5 GB/s
  EXPECT_NEAR(e.bytes_per_second(), 2.5 * kRate, 1e-6 * kRate);
  e.OnCopySpan(kBytes, 0.011, 0.013);  // slower than learned (late observation): no change
  EXPECT_NEAR(e.bytes_per_second(), 2.5 * kRate, 1e-6 * kRate);
  e.OnCopySpan(kBytes, 0.014, 0.014);  // no span: no bound
  EXPECT_NEAR(e.bytes_per_second(), 2.5 * kRate, 1e-6 * kRate);
}

}  // namespace
}  // namespace offloadd::copy
