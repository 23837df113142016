#include "server/copy/cuda/cuda_rate_meter.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <optional>
#include <thread>

#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"
#include "server/copy/cuda/cuda_engine.h"

namespace offloadd::copy {
namespace {

using base::SteadyNowSeconds;

constexpr size_t kMinQueuedCopies = 4, kMaxQueuedCopies = 512;
constexpr double kPollSeconds = 20e-6;
// Copies a window counts at least (after its base; see the header).
constexpr size_t kMinCountedCopies = 3;
// Copies queued at a window's end must have completed this long after it.
constexpr double kDrainLimitSeconds = 5;
// Between a command and its window's start, so every GPU of a group starts at one instant.
constexpr double kStartDelaySeconds = 2e-3;

absl::Status Annotated(const absl::Status& st, const std::string& gpu) {
  return absl::Status(st.code(), absl::StrFormat("%s: %s", gpu, st.message()));
}

// One GPU's buffers, stream and events for the measurement; device thread only.
class GpuBench {
 public:
  explicit GpuBench(CudaApi& api) : api_(api) {}
  ~GpuBench() { TearDown(); }
  absl::Status SetUp(uint64_t copy_bytes);
  void TearDown();
  // The rate of copies in `direction` over [start, end] (steady-clock seconds; see the header).
  absl::StatusOr<double> Measure(Direction direction, double start, double end,
                                 double queue_seconds);

 private:
  struct Queued {
    void* event;
    uint64_t index;  // copies completed after the mark once this one has
  };
  // One window's count. It starts at `base`: the first copy issued after the queue's depth was
  // sized from a measured rate (the warm-up before it, with a shallow queue, is not counted:
  // its thread may have seen a completion late and left the engine idle).
  struct WindowCount {
    size_t target = kMinQueuedCopies, counted = 0;
    std::optional<Queued> base;
    bool deep = false;
    uint64_t deep_from = 0;         // index of the first copy issued deep
    double bytes = 0, seconds = 0;  // the last counted figure
  };
  // A copy `q` completed within the window: sizes the queue, or sets the base, or counts it.
  absl::Status Count(const Queued& q, double queue_seconds, WindowCount& w);
  absl::Status IssueOne(Direction direction);
  absl::StatusOr<void*> FreeEvent();
  absl::Status Drain();

  CudaApi& api_;
  uint64_t copy_bytes_ = 0;
  void* stream_ = nullptr;
  void* device_ = nullptr;
  uint8_t* host_ = nullptr;
  bool host_registered_ = false;
  void* mark_ = nullptr;
  std::vector<void*> events_;  // every timing event made (the ring draws from free_)
  std::vector<void*> free_;
  std::deque<Queued> queued_;
  uint64_t issued_ = 0;  // this window's copies, the mark's first one included
};

absl::Status GpuBench::SetUp(uint64_t copy_bytes) {
  copy_bytes_ = copy_bytes;
  auto stream = api_.CreateStream();
  if (!stream.ok()) return stream.status();
  stream_ = *stream;
  auto device = api_.DeviceMalloc(copy_bytes);
  if (!device.ok()) return device.status();
  device_ = *device;
  const uint64_t page = 4096, rounded = (copy_bytes + page - 1) / page * page;
  host_ = static_cast<uint8_t*>(std::aligned_alloc(page, rounded));
  if (host_ == nullptr) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("no host memory for a %d-byte calibration buffer", copy_bytes));
  }
  std::memset(host_, 0x5a, rounded);  // touched: the kernel has placed every page
  if (absl::Status st = api_.HostRegister(host_, rounded); !st.ok()) return st;
  host_registered_ = true;
  auto mark = api_.CreateTimingEvent();
  if (!mark.ok()) return mark.status();
  mark_ = *mark;
  return absl::OkStatus();
}

void GpuBench::TearDown() {
  if (!queued_.empty() && !Drain().ok()) {
    // Copies that did not complete may still write the buffers: leave them allocated rather
    // than let a DMA land in freed memory (a device in that state needs a restart anyway).
    return;
  }
  for (void* e : events_) api_.DestroyEvent(e);
  events_.clear();
  free_.clear();
  if (mark_ != nullptr) api_.DestroyEvent(mark_);
  if (host_registered_) (void)api_.HostUnregister(host_);
  std::free(host_);
  if (device_ != nullptr) (void)api_.DeviceFree(device_);
  if (stream_ != nullptr) api_.DestroyStream(stream_);
  mark_ = device_ = stream_ = nullptr;
  host_ = nullptr;
  host_registered_ = false;
}

absl::StatusOr<void*> GpuBench::FreeEvent() {
  if (!free_.empty()) {
    void* e = free_.back();
    free_.pop_back();
    return e;
  }
  auto e = api_.CreateTimingEvent();
  if (e.ok()) events_.push_back(*e);
  return e;
}

absl::Status GpuBench::IssueOne(Direction direction) {
  const bool d2h = direction == Direction::kDeviceToHost;
  absl::Status st = d2h ? api_.MemcpyAsync(host_, device_, copy_bytes_, direction, stream_)
                        : api_.MemcpyAsync(device_, host_, copy_bytes_, direction, stream_);
  if (!st.ok()) return st;
  if (issued_++ == 0) return api_.EventRecord(mark_, stream_);
  auto e = FreeEvent();
  if (!e.ok()) return e.status();
  queued_.push_back({*e, issued_ - 1});
  return api_.EventRecord(*e, stream_);
}

absl::Status GpuBench::Drain() {
  const double limit = SteadyNowSeconds() + kDrainLimitSeconds;
  while (!queued_.empty()) {
    auto done = api_.EventQuery(queued_.front().event);
    if (!done.ok()) return done.status();
    if (*done) {
      free_.push_back(queued_.front().event);
      queued_.pop_front();
    } else if (SteadyNowSeconds() > limit) {
      return absl::DeadlineExceededError("calibration copies did not complete within 5 s");
    } else {
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
    }
  }
  return absl::OkStatus();
}

absl::Status GpuBench::Count(const Queued& q, double queue_seconds, WindowCount& w) {
  if (!w.base.has_value() && w.deep) {
    if (q.index < w.deep_from) {
      free_.push_back(q.event);
    } else {
      w.base = q;  // its event is kept until the window ends
    }
    return absl::OkStatus();
  }
  auto elapsed = api_.EventElapsedSeconds(w.base ? w.base->event : mark_, q.event);
  free_.push_back(q.event);
  if (!elapsed.ok()) return elapsed.status();
  if (*elapsed <= 0) return absl::OkStatus();
  const double b = static_cast<double>(q.index - (w.base ? w.base->index : 0)) * copy_bytes_;
  const double ahead = std::ceil(queue_seconds * b / *elapsed / copy_bytes_);
  w.target =
      std::clamp<size_t>(static_cast<size_t>(ahead) + 1, kMinQueuedCopies, kMaxQueuedCopies);
  if (!w.deep) w.deep_from = issued_;  // the next copy issued is the first of the deep queue
  w.deep = true;
  if (w.base.has_value()) {
    ++w.counted;
    w.bytes = b;
    w.seconds = *elapsed;
  }
  return absl::OkStatus();
}

absl::StatusOr<double> GpuBench::Measure(Direction direction, double start, double end,
                                         double queue_seconds) {
  base::SleepUntilSteadySeconds(start);
  // A window that counted too few copies by its end (its thread woke late on a busy host)
  // goes on until it has, for at most as long again.
  const double late_end = end + std::max(end - start, 0.05);
  issued_ = 0;
  WindowCount w;
  absl::Status st;
  while (st.ok()) {
    double now = SteadyNowSeconds();
    if ((now >= end && w.counted >= kMinCountedCopies) || now >= late_end) break;
    const size_t want = w.target;
    while (st.ok() && queued_.size() < want && (now = SteadyNowSeconds()) < late_end) {
      st = IssueOne(direction);
    }
    if (!st.ok() || queued_.empty()) break;  // empty: the late end passed before an issue
    auto done = api_.EventQuery(queued_.front().event);
    if (!done.ok() || !*done) {
      if (!done.ok()) st = done.status();
      std::this_thread::sleep_for(std::chrono::duration<double>(kPollSeconds));
      continue;
    }
    const Queued q = queued_.front();
    queued_.pop_front();
    now = SteadyNowSeconds();
    if ((now > end && w.counted >= kMinCountedCopies) || now > late_end) {  // not counted
      free_.push_back(q.event);
      break;
    }
    st = Count(q, queue_seconds, w);
  }
  if (w.base.has_value()) free_.push_back(w.base->event);
  if (absl::Status drained = Drain(); st.ok()) st = drained;
  if (!st.ok()) return st;
  if (w.seconds <= 0) {
    return absl::DeadlineExceededError(absl::StrFormat(
        "fewer than three %d-byte copies completed in %.3f s: the link is slower than the "
        "calibration can time; give it more time (link_calibration_budget_seconds)",
        copy_bytes_, late_end - start));
  }
  return w.bytes / w.seconds;
}

// The controller's commands to the GPUs of one group and their answers.
class GroupRun {
 public:
  explicit GroupRun(const std::vector<std::string>& gpus) : slots_(gpus.size()) {
    for (size_t i = 0; i < gpus.size(); ++i) slots_[i].gpu = gpus[i];
  }

  // Device thread of GPU i: buffers, then windows as commanded, until Quit.
  absl::Status Serve(size_t i, CudaApi& api, uint64_t copy_bytes, double queue_seconds)
      EXCLUDES(mu_);
  // The helper thread of GPU i after RunOnDevice returned.
  void Exited(size_t i, absl::Status st) EXCLUDES(mu_);
  // Waits until every GPU is ready or gone, at most until `deadline`; the first set-up error,
  // DEADLINE_EXCEEDED at the deadline.
  absl::Status WaitReady(double deadline) EXCLUDES(mu_);
  // One window on GPUs `which` at once; their rates in `which` order.
  absl::StatusOr<std::vector<double>> Window(const std::vector<size_t>& which, Direction d,
                                             double start, double end) EXCLUDES(mu_);
  void Quit() EXCLUDES(mu_);

 private:
  struct Slot {
    std::string gpu;  // for messages
    int command = 0, answered = 0;
    Direction direction = Direction::kDeviceToHost;
    double start = 0, end = 0;
    double rate = 0;
    absl::Status status;  // the answer's, or set-up's / exit's
    bool ready = false, gone = false;
  };
  base::Mutex mu_;
  base::CondVar cv_;
  std::vector<Slot> slots_ GUARDED_BY(mu_);
  bool quit_ GUARDED_BY(mu_) = false;
};

absl::Status GroupRun::Serve(size_t i, CudaApi& api, uint64_t copy_bytes, double queue_seconds) {
  GpuBench bench(api);
  absl::Status setup = bench.SetUp(copy_bytes);
  int seen = 0;
  base::MutexLock lock(mu_);
  slots_[i].ready = setup.ok();
  if (!setup.ok()) slots_[i].status = Annotated(setup, slots_[i].gpu);
  cv_.notify_all();
  if (!setup.ok()) return slots_[i].status;
  while (true) {
    while (!quit_ && slots_[i].command == seen) cv_.Wait(mu_);
    if (quit_) return absl::OkStatus();
    seen = slots_[i].command;
    const Direction direction = slots_[i].direction;
    const double start = slots_[i].start, end = slots_[i].end;
    lock.Unlock();
    absl::StatusOr<double> rate = bench.Measure(direction, start, end, queue_seconds);
    lock.Lock();
    slots_[i].answered = seen;
    slots_[i].rate = rate.ok() ? *rate : 0;
    slots_[i].status = rate.ok() ? absl::OkStatus() : Annotated(rate.status(), slots_[i].gpu);
    cv_.notify_all();
  }
}

void GroupRun::Exited(size_t i, absl::Status st) {
  base::MutexLock lock(mu_);
  slots_[i].gone = true;
  if (slots_[i].status.ok()) slots_[i].status = std::move(st);
  cv_.notify_all();
}

absl::Status GroupRun::WaitReady(double deadline) {
  base::MutexLock lock(mu_);
  const auto settled = [&]() REQUIRES(mu_) {
    for (const Slot& s : slots_) {
      if (!s.ready && !s.gone && s.status.ok()) return false;
    }
    return true;
  };
  while (!settled() && SteadyNowSeconds() < deadline) {
    cv_.WaitUntil(mu_, base::CondVar::DeadlineIn(std::max(0.0, deadline - SteadyNowSeconds())));
  }
  for (const Slot& s : slots_) {
    if (!s.status.ok()) return s.status;
    if (!s.ready) return absl::DeadlineExceededError(
          "the calibration budget (link_calibration_budget_seconds) ran out while the GPUs' "
          "buffers were set up");
  }
  return absl::OkStatus();
}

absl::StatusOr<std::vector<double>> GroupRun::Window(const std::vector<size_t>& which,
                                                     Direction d, double start, double end) {
  base::MutexLock lock(mu_);
  for (size_t i : which) {
    Slot& s = slots_[i];
    s.direction = d;
    s.start = start;
    s.end = end;
    ++s.command;
  }
  cv_.notify_all();
  std::vector<double> rates;
  for (size_t i : which) {
    while (slots_[i].answered != slots_[i].command && !slots_[i].gone) cv_.Wait(mu_);
    if (!slots_[i].status.ok()) return slots_[i].status;
    if (slots_[i].gone) return absl::InternalError("a GPU's measurement ended early");
    rates.push_back(slots_[i].rate);
  }
  return rates;
}

void GroupRun::Quit() {
  base::MutexLock lock(mu_);
  quit_ = true;
  cv_.notify_all();
}

// The windows of one group: (GPUs, direction) in order.
struct Window {
  std::vector<size_t> gpus;
  Direction direction;
};

std::vector<Window> WindowsOf(size_t gpus) {
  std::vector<Window> out;
  const Direction dirs[2] = {Direction::kDeviceToHost, Direction::kHostToDevice};
  for (size_t i = 0; i < gpus; ++i) {
    for (Direction d : dirs) out.push_back({{i}, d});
  }
  if (gpus >= 2) {
    std::vector<size_t> all(gpus);
    for (size_t i = 0; i < gpus; ++i) all[i] = i;
    for (Direction d : dirs) out.push_back({all, d});
  }
  return out;
}

class CudaCopyRateMeter : public CopyRateMeter {
 public:
  explicit CudaCopyRateMeter(CudaCopyEngine* engine) : engine_(engine) {}

  std::vector<GroupRates> Measure(const std::vector<RateGroup>& groups,
                                  const RateMeasurementOptions& options) override;

 private:
  // Starts the device thread of every GPU of `groups` at once (contexts are made in parallel).
  void StartDevices(const std::vector<RateGroup>& groups);
  // One group; `windows_left` counts this group's windows and every later group's.
  GroupRates MeasureGroup(const RateGroup& group, const RateMeasurementOptions& o,
                          double deadline, size_t windows_left);
  // Runs the group's windows on `run`; fills `out`.
  absl::Status RunWindows(GroupRun& run, const RateMeasurementOptions& o, double deadline,
                          size_t windows_left, GroupRates& out);

  CudaCopyEngine* const engine_;
};

void CudaCopyRateMeter::StartDevices(const std::vector<RateGroup>& groups) {
  std::vector<std::thread> threads;
  for (const RateGroup& g : groups) {
    for (const std::string& gpu : g.gpus) {
      // Errors surface again (with the group) when the group is measured.
      threads.emplace_back([this, gpu] {
        (void)engine_->RunOnDevice(gpu, [](CudaApi&) { return absl::OkStatus(); });
      });
    }
  }
  for (std::thread& t : threads) t.join();
}

std::vector<GroupRates> CudaCopyRateMeter::Measure(const std::vector<RateGroup>& groups,
                                                   const RateMeasurementOptions& options) {
  const double deadline = SteadyNowSeconds() + options.budget_seconds;
  StartDevices(groups);
  size_t windows_left = 0;
  for (const RateGroup& g : groups) windows_left += WindowsOf(g.gpus.size()).size();
  std::vector<GroupRates> out;
  for (const RateGroup& g : groups) {
    out.push_back(MeasureGroup(g, options, deadline, windows_left));
    windows_left -= WindowsOf(g.gpus.size()).size();
  }
  return out;
}

GroupRates CudaCopyRateMeter::MeasureGroup(const RateGroup& group,
                                           const RateMeasurementOptions& o, double deadline,
                                           size_t windows_left) {
  const double t0 = SteadyNowSeconds();
  GroupRates out;
  out.name = group.name;
  out.gpus = group.gpus;
  out.alone.resize(group.gpus.size());
  if (group.gpus.empty()) {
    out.status = absl::InvalidArgumentError("a group without GPUs");
    return out;
  }
  if (t0 >= deadline) {
    out.status = absl::DeadlineExceededError(
        "the calibration budget (link_calibration_budget_seconds) ran out before this link");
    return out;
  }
  GroupRun run(group.gpus);
  std::vector<std::thread> threads;
  for (size_t i = 0; i < group.gpus.size(); ++i) {
    threads.emplace_back([this, &run, &group, &o, i] {
      absl::Status st = engine_->RunOnDevice(group.gpus[i], [&](CudaApi& api) {
        return run.Serve(i, api, o.copy_bytes, o.queue_seconds);
      });
      run.Exited(i, st);
    });
  }
  out.status = run.WaitReady(deadline);
  if (out.status.ok()) out.status = RunWindows(run, o, deadline, windows_left, out);
  run.Quit();
  for (std::thread& t : threads) t.join();
  if (group.gpus.size() == 1) out.together = out.alone[0];
  out.seconds = SteadyNowSeconds() - t0;
  return out;
}

absl::Status CudaCopyRateMeter::RunWindows(GroupRun& run, const RateMeasurementOptions& o,
                                           double deadline, size_t windows_left,
                                           GroupRates& out) {
  for (const Window& w : WindowsOf(out.gpus.size())) {
    const double now = SteadyNowSeconds();
    const double share = (deadline - now) / static_cast<double>(windows_left--);
    const double window =
        std::min(o.max_window_seconds, share - o.queue_seconds - kStartDelaySeconds);
    if (window < o.min_window_seconds) {
      return absl::DeadlineExceededError(absl::StrFormat(
          "the calibration budget (link_calibration_budget_seconds) ran out: %.3f s left for "
          "%d more measurements of at least %.3f s",
          std::max(0.0, deadline - now), windows_left + 1, o.min_window_seconds));
    }
    const double start = now + kStartDelaySeconds;
    auto rates = run.Window(w.gpus, w.direction, start, start + window);
    if (!rates.ok()) return rates.status();
    const int d = static_cast<int>(w.direction);
    if (w.gpus.size() == 1) {
      out.alone[w.gpus[0]].bytes_per_second[d] = (*rates)[0];
    } else {
      double sum = 0;
      for (double r : *rates) sum += r;
      out.together.bytes_per_second[d] = sum;
    }
  }
  return absl::OkStatus();
}

}  // namespace

std::unique_ptr<CopyRateMeter> NewCudaCopyRateMeter(CudaCopyEngine* engine) {
  return std::make_unique<CudaCopyRateMeter>(engine);
}

}  // namespace offloadd::copy
