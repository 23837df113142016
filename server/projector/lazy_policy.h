// Lazy refresh policy: skip a layer's scheduled projector refresh while its subspace has stayed
// stable, i.e. while consecutive refreshes kept returning almost the same projector
// (RefreshResult::similarity = ||P_new^T P_old||_F^2 / r close to 1). The SVD is the expensive
// part of GaLore's refresh step, and a stable layer gains nothing from repeating it.
//
// The idea follows Q-GaLore (Zhang et al. 2024, "Q-GaLore: Quantized GaLore with INT4 Projection
// and Layer-Adaptive Low-Rank Gradients", arXiv 2407.08296), which lengthens a layer's SVD
// interval once its successive projections stay aligned over k checks. Here the same idea takes
// the form of bounded skips, with our subspace similarity (mean squared cosine of the principal
// angles) in place of their cosine measure; the defaults are this project's, not the paper's.
// After max_consecutive_skips the refresh runs anyway, so a subspace that starts to move is
// caught.
//
// Pure functions over a small per-layer state the caller keeps; no locking needed.
#ifndef OFFLOADD_SERVER_PROJECTOR_LAZY_POLICY_H_
#define OFFLOADD_SERVER_PROJECTOR_LAZY_POLICY_H_

#include "absl/types/optional.h"

namespace offloadd::projector {

struct LazyRefreshPolicy {
  // A refresh whose similarity to the projector it replaced is >= this counts as stable.
  double similarity_threshold = 0.9;
  // Consecutive stable refreshes needed before scheduled refreshes start being skipped (>= 1).
  int stable_refreshes_before_skip = 2;
  // Skips in a row before a refresh is forced; <= 0 disables lazy mode (never skip).
  int max_consecutive_skips = 4;
};

struct LazyRefreshState {
  int stable_streak = 0;     // consecutive refreshes that were stable
  int skipped_in_a_row = 0;  // scheduled refreshes skipped since the last one that ran
};

enum class LazyDecision { kRefresh, kSkip };

// What to do at a scheduled refresh step.
LazyDecision DecideRefresh(const LazyRefreshPolicy& policy, const LazyRefreshState& state);

// The state after a refresh ran. `similarity` is RefreshResult::similarity, or nullopt when there
// was nothing to compare with (first refresh, degenerate gradient): the streak restarts.
LazyRefreshState AfterRefresh(const LazyRefreshPolicy& policy, LazyRefreshState state,
                              absl::optional<double> similarity);

// The state after a scheduled refresh was skipped.
LazyRefreshState AfterSkip(LazyRefreshState state);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_LAZY_POLICY_H_
