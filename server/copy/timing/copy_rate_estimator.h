// CopyRateEstimator: a copy engine's rate (bytes per second), learned from the completions the
// host observes. The cuda device worker predicts when its issued copies end from this
// rate, to issue the next copy just in time (cuda/cuda_device_worker.h).
//
// Why windows, not one sample per copy: the host sees a completion only when its thread next
// queries the event, which on a busy host can be hundreds of microseconds after the copy ended,
// and several completions are often seen in one pass. Dividing one copy's bytes by the time
// between two such observations gave rates off by 10x either way (learned 36 to 1,241 GB/s for
// a 55 GB/s engine with 8 simulated GPUs on 2 cores: copy_sim_bench, BENCHMARKS.md), and a rate
// too high makes the worker issue far more work ahead than it means to, which an urgent copy
// then waits behind. Here a sample spans a window of at least `min_window_seconds` and
// `min_window_copies` completions in which the engine never idled; its error is the lateness of
// two observations divided by the window, not by one copy's time.
//
// "Never idled" is known without a GPU clock: a copy queued while the copy before it on the
// lane was still seen pending (by a query that began after it was queued) started the moment
// that one ended. A completion that is not contiguous in this sense starts a new window.
//
// Not thread-safe (the device thread owns it). Units: bytes, seconds on one monotonic clock.
#ifndef OFFLOADD_SERVER_COPY_TIMING_COPY_RATE_ESTIMATOR_H_
#define OFFLOADD_SERVER_COPY_TIMING_COPY_RATE_ESTIMATOR_H_

#include <cstdint>

namespace offloadd::copy {

struct CopyRateEstimatorOptions {
  double min_window_seconds = 2e-3;  // a sample spans at least this much time ...
  int min_window_copies = 4;         // ... and this many completions
  double sample_weight = 0.3;        // of a new sample in the rate (exponential average)
};

class CopyRateEstimator {
 public:
  explicit CopyRateEstimator(CopyRateEstimatorOptions options = {}) : options_(options) {}

  // One copy of `bytes` completed, seen by the host at `seen_done_at`. `contiguous`: it was
  // queued to the engine while the copy before it on the lane was still running (see above).
  void OnCompletion(uint64_t bytes, bool contiguous, double seen_done_at);

  // A copy of `bytes` issued at `issued_at` was seen complete at `seen_done_at` (any copy,
  // contiguous or not): it cannot have started before it was issued, so the engine moved it at
  // bytes / (seen_done_at - issued_at) or faster. A learned rate below that bound is raised to
  // it. Without this a rate learned while the engine was shared (its other direction busy,
  // other GPUs behind a switch) stays once the sharing ends: copies end before their
  // predictions, the worker issues each next one late, the engine idles between them, and no
  // window of back-to-back copies forms to correct it. No effect before the first window.
  void OnCopySpan(uint64_t bytes, double issued_at, double seen_done_at);

  // The learned rate; 0 until the first window closes.
  double bytes_per_second() const { return bytes_per_second_; }
  uint64_t samples() const { return samples_; }

 private:
  CopyRateEstimatorOptions options_;
  bool open_ = false;          // a window is open
  double window_start_ = 0;    // when its first completion was seen
  uint64_t window_bytes_ = 0;  // completed after window_start_
  int window_copies_ = 0;
  double bytes_per_second_ = 0;
  uint64_t samples_ = 0;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_TIMING_COPY_RATE_ESTIMATOR_H_
