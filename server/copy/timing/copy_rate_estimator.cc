#include "server/copy/timing/copy_rate_estimator.h"

#include <algorithm>

namespace offloadd::copy {

void CopyRateEstimator::OnCompletion(uint64_t bytes, bool contiguous, double seen_done_at) {
  if (!open_ || !contiguous) {  // the engine may have idled before this copy: start afresh
    open_ = true;
    window_start_ = seen_done_at;
    window_bytes_ = 0;
    window_copies_ = 0;
    return;
  }
  window_bytes_ += bytes;
  ++window_copies_;
  const double span = seen_done_at - window_start_;
  if (window_copies_ < options_.min_window_copies || span < options_.min_window_seconds) return;
  const double sample = static_cast<double>(window_bytes_) / span;
  bytes_per_second_ = samples_ == 0 ? sample
                                    : (1 - options_.sample_weight) * bytes_per_second_ +
                                          options_.sample_weight * sample;
  ++samples_;
  window_start_ = seen_done_at;  // the next window starts where this one ended
  window_bytes_ = 0;
  window_copies_ = 0;
}

void CopyRateEstimator::OnCopySpan(uint64_t bytes, double issued_at, double seen_done_at) {
  const double span = seen_done_at - issued_at;
  if (samples_ == 0 || !(span > 0)) return;
  bytes_per_second_ = std::max(bytes_per_second_, static_cast<double>(bytes) / span);
}

}  // namespace offloadd::copy
