#include "server/projector/lazy_policy.h"

#include <algorithm>

namespace offloadd::projector {

LazyDecision DecideRefresh(const LazyRefreshPolicy& policy, const LazyRefreshState& state) {
  if (policy.max_consecutive_skips <= 0) return LazyDecision::kRefresh;
  const int needed = std::max(1, policy.stable_refreshes_before_skip);
  if (state.stable_streak >= needed && state.skipped_in_a_row < policy.max_consecutive_skips) {
    return LazyDecision::kSkip;
  }
  return LazyDecision::kRefresh;
}

LazyRefreshState AfterRefresh(const LazyRefreshPolicy& policy, LazyRefreshState state,
                              absl::optional<double> similarity) {
  state.skipped_in_a_row = 0;
  if (similarity.has_value() && *similarity >= policy.similarity_threshold) {
    ++state.stable_streak;
  } else {
    state.stable_streak = 0;
  }
  return state;
}

LazyRefreshState AfterSkip(LazyRefreshState state) {
  ++state.skipped_in_a_row;
  return state;
}

}  // namespace offloadd::projector
