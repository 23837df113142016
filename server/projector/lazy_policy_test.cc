#include "server/projector/lazy_policy.h"

#include <vector>

#include "gtest/gtest.h"

namespace offloadd::projector {
namespace {

// Drives the policy over a sequence of scheduled refresh steps; `similarity_at` gives the
// similarity a refresh would report at each step. Returns the decisions taken.
std::vector<LazyDecision> Drive(const LazyRefreshPolicy& policy,
                                const std::vector<double>& similarity_at) {
  LazyRefreshState state;
  std::vector<LazyDecision> decisions;
  bool first = true;
  for (double similarity : similarity_at) {
    const LazyDecision d = DecideRefresh(policy, state);
    decisions.push_back(d);
    if (d == LazyDecision::kSkip) {
      state = AfterSkip(state);
    } else {
      state =
          AfterRefresh(policy, state, first ? absl::nullopt : absl::optional<double>(similarity));
      first = false;
    }
  }
  return decisions;
}

constexpr LazyDecision R = LazyDecision::kRefresh;
constexpr LazyDecision S = LazyDecision::kSkip;

TEST(LazyPolicyTest, SkipsOnlyAfterEnoughStableRefreshesAndForcesARecheck) {
  LazyRefreshPolicy policy;
  policy.similarity_threshold = 0.9;
  policy.stable_refreshes_before_skip = 2;
  policy.max_consecutive_skips = 3;
  // Step 0 has no predecessor; steps 1 and 2 are stable; then 3 skips; step 6 is forced and still
  // stable, so skipping resumes.
  const std::vector<double> sim(10, 0.97);
  EXPECT_EQ(Drive(policy, sim), (std::vector<LazyDecision>{R, R, R, S, S, S, R, S, S, S}));
}

TEST(LazyPolicyTest, ASubspaceThatMovesStopsTheSkipping) {
  LazyRefreshPolicy policy;
  policy.similarity_threshold = 0.9;
  policy.stable_refreshes_before_skip = 1;
  policy.max_consecutive_skips = 2;
  // Steps: 0 first, 1 stable (0.95) -> skip 2, 3; step 4 forced reports 0.5 -> streak resets, so
  // step 5 refreshes; 5 reports 0.99 (stable) -> skips 6, 7.
  const std::vector<double> sim = {0.0, 0.95, 0.95, 0.95, 0.5, 0.99, 0.99, 0.99};
  EXPECT_EQ(Drive(policy, sim), (std::vector<LazyDecision>{R, R, S, S, R, R, S, S}));
}

TEST(LazyPolicyTest, ThresholdIsInclusiveAndBelowItNeverSkips) {
  LazyRefreshPolicy policy;
  policy.similarity_threshold = 0.9;
  policy.stable_refreshes_before_skip = 1;
  LazyRefreshState state = AfterRefresh(policy, {}, 0.9);
  EXPECT_EQ(state.stable_streak, 1);
  EXPECT_EQ(DecideRefresh(policy, state), S);
  EXPECT_EQ(Drive(policy, std::vector<double>(6, 0.89)), std::vector<LazyDecision>(6, R));
}

TEST(LazyPolicyTest, DisabledOrNoPredecessorNeverSkips) {
  LazyRefreshPolicy off;
  off.max_consecutive_skips = 0;
  EXPECT_EQ(Drive(off, std::vector<double>(5, 1.0)), std::vector<LazyDecision>(5, R));
  LazyRefreshPolicy policy;
  LazyRefreshState state{5, 0};
  state = AfterRefresh(policy, state, absl::nullopt);  // e.g. a degenerate gradient
  EXPECT_EQ(state.stable_streak, 0);
  EXPECT_EQ(DecideRefresh(policy, state), R);
}

}  // namespace
}  // namespace offloadd::projector
