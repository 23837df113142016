#include "server/projector/refresh_service.h"

#include <openssl/sha.h>
#include <sys/random.h>

#include <algorithm>
#include <atomic>
#include <new>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "common/base/clock.h"
#include "glog/logging.h"
#include "server/base/log_text.h"
#include "server/metrics/metrics.h"

namespace offloadd::projector {
namespace {

// The uid holding the most in `by_uid` (uid -> count or bytes; not empty).
template <typename Map>
int64_t LargestHolder(const Map& by_uid) {
  auto largest = by_uid.begin();
  for (auto it = by_uid.begin(); it != by_uid.end(); ++it) {
    if (it->second > largest->second) largest = it;
  }
  return largest->first;
}

bool Finished(RefreshState state) {
  return state == RefreshState::kDone || state == RefreshState::kFailed;
}

const char* OutcomeOf(const RefreshRecord& r) {
  if (r.state == RefreshState::kFailed) {
    if (r.status.code() == absl::StatusCode::kInvalidArgument) return "invalid_input";
    if (r.status.code() == absl::StatusCode::kUnavailable) return "cancelled";
    return "error";
  }
  if (r.skipped) return "skipped";
  if (r.result.degenerate) return "degenerate";
  return "ok";
}

// The request parameters two submissions of one key must share for one to take the other's
// outcome (everything but the regions and offsets, which are each submitter's own).
std::string SignatureOf(const ServiceRequest& r) {
  return absl::StrCat(absl::StrJoin(r.shape, "x"), "|", static_cast<int>(r.dtype), "|", r.rank,
                      "|", static_cast<int>(r.side), "|", static_cast<int>(r.method), "|",
                      r.randomized.oversampling, "|", r.randomized.power_iterations, "|",
                      r.randomized.seed, "|", r.warm_start, "|", r.measure_residual, "|", r.lazy,
                      "|", r.lazy_policy.similarity_threshold, "|",
                      r.lazy_policy.stable_refreshes_before_skip, "|",
                      r.lazy_policy.max_consecutive_skips);
}

void Fail(RefreshRecord& record, absl::Status status) {
  record.state = RefreshState::kFailed;
  record.status = std::move(status);
}

absl::Status Prefixed(const absl::Status& s, const std::string& prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// A caller other than root may only name shm objects it owns (see ServiceRequest::caller_uid).
absl::Status CheckOwner(const RegionCache::Opened& opened, const copy::RegionSpec& spec,
                        int64_t caller_uid, const char* what) {
  if (caller_uid <= 0 || opened.owner_uid < 0 || opened.owner_uid == caller_uid) {
    return absl::OkStatus();
  }
  return absl::PermissionDeniedError(absl::StrCat(
      what, ": shared-memory object ", spec.shm_name, " belongs to uid ", opened.owner_uid,
      ", not to the caller (uid ", caller_uid, "): name an object your own process created"));
}

}  // namespace

GradientDigest DigestOf(const uint8_t* data, uint64_t bytes) {
  GradientDigest d{};
  SHA256(data, bytes, d.data());
  return d;
}

// Per-worker memory reused across refreshes (see projector.h, RefreshScratch).
struct RefreshService::WorkerBuffers {
  std::unique_ptr<float[]> gradient;  // float storage: aligned for an in-place fp32 refresh
  size_t capacity_floats = 0;
  RefreshScratch scratch;

  uint8_t* Gradient(uint64_t bytes) {
    const size_t floats = (bytes + sizeof(float) - 1) / sizeof(float);
    if (floats > capacity_floats) {
      gradient.reset();
      capacity_floats = 0;  // stays right if the allocation throws
      gradient.reset(new float[floats]);
      capacity_floats = floats;
    }
    return reinterpret_cast<uint8_t*>(gradient.get());
  }
};

RefreshService::RefreshService(RefreshServiceOptions options, copy::CopyEngine* shm_engine,
                               copy::CopyEngine* cuda_engine)
    : cuda_regions_(cuda_engine != nullptr),
      options_(WithClock(std::move(options))),
      regions_(shm_engine, cuda_engine, options_.region_cache) {
  if (options_.cpu_backend == nullptr) options_.cpu_backend = &own_lapack_;
  const int workers = std::max(1, options_.workers);
  base::MutexLock once(shutdown_mu_);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i); });
  metrics::Get().projector_queue_depth->Set(0);
}

RefreshService::~RefreshService() { Shutdown(); }

RefreshServiceOptions RefreshService::WithClock(RefreshServiceOptions options) {
  if (options.clock == nullptr) options.clock = base::Clock::Real();
  if (!options.region_cache.now_seconds) {
    base::Clock* clock = options.clock;
    options.region_cache.now_seconds = [clock] { return clock->NowSeconds(); };
  }
  return options;
}

double RefreshService::Now() const { return options_.clock->NowSeconds(); }

absl::StatusOr<SubmitOutcome> RefreshService::Submit(const ServiceRequest& request) {
  absl::StatusOr<RefreshLayout> layout = ValidateServiceRequest(request);
  if (!layout.ok()) return layout.status();
  base::MutexLock lock(mu_);
  if (stopping_) {
    return absl::UnavailableError("the projector service is shutting down: resubmit later");
  }
  const std::string parameter =
      ParameterKey(request.caller_uid, request.job_id, request.parameter_id);
  const auto key = std::make_pair(parameter, request.step);
  if (absl::Status admitted = AdmitLocked(request, *layout); !admitted.ok()) return admitted;
  if (auto it = by_key_.find(key); it != by_key_.end()) {
    // A repeated key: queued behind the first (FIFO within a step), compared when it runs.
    const uint64_t id = AddEntryLocked(request, *layout, parameter, it->second);
    lock.Unlock();
    work_cv_.notify_one();
    return SubmitOutcome{id, true, RefreshState::kQueued};
  }
  if (request.reset_history) {
    if (auto h = history_.find(parameter); h != history_.end()) EraseHistoryLocked(h);
  } else if (auto h = history_.find(parameter);
             h != history_.end() && h->second.last_started_step >= request.step) {
    return absl::FailedPreconditionError(absl::StrCat(
        "parameter ", request.parameter_id, ": step ", request.step, " is not newer than step ",
        h->second.last_started_step,
        ", which has already run (one parameter's refreshes run in increasing step order); "
        "set reset_history to start over, e.g. after loading an older checkpoint"));
  }
  const uint64_t id = AddEntryLocked(request, *layout, parameter, 0);
  by_key_[key] = id;
  lock.Unlock();
  work_cv_.notify_one();
  return SubmitOutcome{id, false, RefreshState::kQueued};
}

uint64_t RefreshService::AddEntryLocked(const ServiceRequest& request,
                                        const RefreshLayout& layout, const std::string& parameter,
                                        uint64_t primary_id) {
  const double now = Now();
  const uint64_t id = NewIdLocked();
  Entry& e = entries_[id];
  e.request = request;
  e.submitted_at = now;
  e.caller_uid = request.caller_uid;
  e.parameter = parameter;
  e.primary_id = primary_id;
  e.signature = SignatureOf(request);
  ++unfinished_;
  ++unfinished_by_uid_[request.caller_uid];
  RefreshRecord& r = e.record;
  r.id = id;
  r.job_id = request.job_id;
  r.parameter_id = request.parameter_id;
  r.step = request.step;
  r.batch_id = request.batch_id;
  r.vector_side = layout.vector_side;
  r.projector_rows = layout.projector_rows;
  r.effective_rank = layout.effective_rank;
  r.dtype = request.dtype;
  if (!request.batch_id.empty()) {
    by_batch_[Scoped(request.caller_uid, request.batch_id)].push_back(id);
  }
  queue_.Push(parameter, request.step, id, request.caller_uid);
  UpdateQueueGaugeLocked();
  EvictResultsLocked(now, request.caller_uid);
  return id;
}

void RefreshService::WorkerLoop(int index) {
  (void)index;
  WorkerBuffers buffers;
  for (;;) {
    base::MutexLock lock(mu_);
    absl::optional<FairRefreshQueue::Item> item;
    while (!stopping_ && !(item = queue_.Pop()).has_value()) work_cv_.Wait(mu_);
    if (!item) return;  // stopping
    Started started = StartLocked(*item);
    lock.Unlock();
    std::vector<uint8_t> written = Run(started, buffers);
    lock.Lock();
    RecordOutcomeLocked(*item, started, std::move(written));
    lock.Unlock();
    Finish(item->id, std::move(started.record));
  }
}

RefreshService::Started RefreshService::StartLocked(const FairRefreshQueue::Item& item) {
  Entry& e = entries_.at(item.id);
  Started s;
  s.start_seconds = Now();
  e.record.state = RefreshState::kRunning;
  e.record.queued_seconds = s.start_seconds - e.submitted_at;
  s.request = std::move(e.request);
  e.request = ServiceRequest();
  s.record = e.record;
  if (e.primary_id != 0) {
    StartAttachedLocked(e, item, s);
    UpdateQueueGaugeLocked();
    return s;
  }
  // Failed and skipped refreshes make entries too: the bound is kept as one is added.
  if (history_.count(item.parameter) == 0 && options_.max_parameters > 0) {
    ForgetParametersPastLocked(options_.max_parameters - 1);
  }
  auto [hit, created] = history_.try_emplace(item.parameter);
  History& h = hit->second;
  if (created) {
    h.owner = item.owner;
    ++parameters_by_uid_[h.owner];
  }
  h.last_started_step = std::max(h.last_started_step, item.step);
  TouchLocked(hit);
  UpdateQueueGaugeLocked();
  if (s.request.lazy && DecideRefresh(s.request.lazy_policy, h.lazy) == LazyDecision::kSkip) {
    h.lazy = AfterSkip(h.lazy);
    s.skip = true;
  } else if (h.projector && h.side == s.record.vector_side &&
             h.projector_rows == s.record.projector_rows) {
    s.previous = h.projector;
    s.previous_shape = h;
  }
  return s;
}

void RefreshService::StartAttachedLocked(const Entry& e, const FairRefreshQueue::Item& item,
                                         Started& s) {
  s.attached = true;
  // The queue runs one refresh of a parameter at a time, equal steps in arrival order, so the
  // first refresh of this key has finished (Finish records it before the parameter is free).
  auto p = entries_.find(e.primary_id);
  if (p == entries_.end() || !Finished(p->second.record.state)) return;  // expired: own SVD
  s.primary = p->second.record;
  s.same_signature = p->second.signature == e.signature;
  auto h = history_.find(item.parameter);
  if (h != history_.end() && h->second.projector && h->second.projector_step == item.step &&
      h->second.projector_digest == s.primary->gradient_digest) {
    s.shared = h->second.projector;
    TouchLocked(h);
  }
}

void RefreshService::RunAttached(Started& s, WorkerBuffers& buffers) {
  RefreshRecord& record = s.record;
  absl::StatusOr<RefreshLayout> layout = ValidateServiceRequest(s.request);
  if (!layout.ok()) return Fail(record, layout.status());
  absl::StatusOr<uint8_t*> g = ReadGradient(s.request, *layout, buffers);
  if (!g.ok()) return Fail(record, g.status());
  record.gradient_digest = DigestOf(*g, layout->gradient_bytes);
  record.digest_known = true;
  if (s.primary && s.primary->digest_known) {
    if (s.same_signature && s.primary->gradient_digest == record.gradient_digest) {
      if (TakePrimaryOutcome(s, *layout)) return;
    } else {
      record.content_mismatch = true;
    }
  }
  RefreshRequest refresh;  // on its own: no previous projector, no warm start
  Compute(s.request, *layout, *g, buffers, &refresh, &record);
}

bool RefreshService::TakePrimaryOutcome(Started& s, const RefreshLayout& layout) {
  const RefreshRecord& first = *s.primary;
  RefreshRecord& record = s.record;
  if (first.state == RefreshState::kFailed) {
    // Only a verdict on the gradient itself (NaN/Inf) carries over; anything else (the first
    // submitter's region, memory) was its own, so this one runs.
    if (first.status.code() != absl::StatusCode::kInvalidArgument) return false;
    Fail(record, first.status);
  } else if (first.skipped) {
    record.state = RefreshState::kDone;
    record.skipped = true;
  } else if (first.result.degenerate) {
    record.state = RefreshState::kDone;
    record.result = first.result;
  } else if (first.projector_written && s.shared) {
    std::vector<uint8_t> bytes(*s.shared);  // exactly the bytes the first refresh wrote
    if (absl::Status st = WriteProjector(s.request, layout, bytes); !st.ok()) {
      Fail(record, st);
      return true;
    }
    record.state = RefreshState::kDone;
    record.projector_written = true;
    record.result = first.result;
    record.backend = first.backend;
    record.warm_started = first.warm_started;
  } else {
    return false;
  }
  record.deduplicated = true;
  record.shared_from_id = first.id;
  return true;
}

std::vector<uint8_t> RefreshService::Run(Started& s, WorkerBuffers& buffers) {
  std::vector<uint8_t> written;
  RefreshRecord& record = s.record;
  if (s.skip) {
    record.state = RefreshState::kDone;
    record.skipped = true;
  } else if (s.attached) {
    Guarded(&record, [&] { RunAttached(s, buffers); });
    record.result.projector_bytes.clear();
  } else {
    RefreshRequest refresh;
    if (s.previous) {
      refresh.previous_projector = {
          s.previous->data(),
          s.previous->size(),
          {s.previous_shape.projector_rows, s.previous_shape.projector_cols},
          s.previous_shape.dtype};
    }
    Guarded(&record, [&] { Execute(s.request, buffers, &refresh, &record); });
    if (record.projector_written) written = std::move(record.result.projector_bytes);
    record.result.projector_bytes.clear();
  }
  record.elapsed_seconds = Now() - s.start_seconds;
  if (record.state == RefreshState::kDone && !s.skip && !record.deduplicated) {
    metrics::Get()
        .projector_refresh_duration_seconds
        ->Add({{"method", s.request.method == SvdMethod::kExact ? "exact" : "randomized"},
               {"backend", record.backend}},
              metrics::DurationBuckets())
        .Observe(record.elapsed_seconds);
  }
  return written;
}

void RefreshService::RecordOutcomeLocked(const FairRefreshQueue::Item& item, const Started& s,
                                         std::vector<uint8_t> written) {
  const RefreshRecord& record = s.record;
  if (!record.backend.empty() && !record.deduplicated) ++computed_total_;
  if (record.deduplicated) ++deduplicated_total_;
  if (record.content_mismatch) ++content_mismatches_total_;
  auto hit = history_.find(item.parameter);
  if (hit != history_.end() && !s.skip && !s.attached && record.state == RefreshState::kDone) {
    History& h = hit->second;
    if (!record.result.degenerate) {
      SetProjectorLocked(h, std::make_shared<const std::vector<uint8_t>>(std::move(written)));
      h.projector_step = record.step;
      h.projector_digest = record.gradient_digest;
      h.projector_rows = record.projector_rows;
      h.projector_cols = record.effective_rank;
      h.dtype = record.dtype;
      h.side = record.vector_side;
    }
    h.lazy =
        AfterRefresh(s.request.lazy_policy, h.lazy,
                     record.result.has_similarity ? absl::optional<double>(record.result.similarity)
                                                  : absl::nullopt);
    TouchLocked(hit);
    EvictHistoryLocked(h.owner);
  }
}

absl::Status RefreshService::AdmitLocked(const ServiceRequest& request,
                                         const RefreshLayout& layout) const {
  const uint64_t limit = options_.max_refresh_bytes;
  if (limit > 0 && layout.working_bytes > limit) {
    return absl::OutOfRangeError(absl::StrCat(
        "a refresh of gradient [", layout.rows, ", ", layout.cols, "] ", DTypeName(request.dtype),
        " needs about ", layout.working_bytes, " bytes of daemon memory; this daemon allows ",
        limit,
        " per refresh (projector.max_refresh_bytes): refresh this parameter in your process, "
        "use method RANDOMIZED with a smaller rank, or ask the operator to raise the bound"));
  }
  if (options_.max_queued_refreshes > 0 && unfinished_ >= options_.max_queued_refreshes) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "the projector service already has ", unfinished_,
        " refreshes queued or running (projector.max_queued_refreshes): wait for results "
        "before submitting more"));
  }
  auto mine = unfinished_by_uid_.find(request.caller_uid);
  const size_t own = mine == unfinished_by_uid_.end() ? 0 : mine->second;
  if (options_.max_queued_refreshes_per_uid > 0 && own >= options_.max_queued_refreshes_per_uid) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "this user already has ", own,
        " refreshes queued or running (projector.max_queued_refreshes_per_uid): wait for "
        "results before submitting more"));
  }
  return absl::OkStatus();
}

void RefreshService::Guarded(RefreshRecord* record, const std::function<void()>& body) {
  try {
    body();
  } catch (const std::bad_alloc&) {
    record->state = RefreshState::kFailed;
    record->status = absl::ResourceExhaustedError(
        "the daemon could not allocate memory for this refresh (host memory is short): retry "
        "later, or refresh this parameter in your process");
  }
}

void RefreshService::Execute(const ServiceRequest& request, WorkerBuffers& buffers,
                             RefreshRequest* refresh, RefreshRecord* record) {
  auto fail = [record](absl::Status status) {
    record->state = RefreshState::kFailed;
    record->status = std::move(status);
  };
  absl::StatusOr<RefreshLayout> layout = ValidateServiceRequest(request);
  if (!layout.ok()) return fail(layout.status());
  absl::StatusOr<uint8_t*> g = ReadGradient(request, *layout, buffers);
  if (!g.ok()) return fail(g.status());
  record->gradient_digest = DigestOf(*g, layout->gradient_bytes);
  record->digest_known = true;
  Compute(request, *layout, *g, buffers, refresh, record);
}

void RefreshService::Compute(const ServiceRequest& request, const RefreshLayout& layout,
                             uint8_t* g, WorkerBuffers& buffers, RefreshRequest* refresh,
                             RefreshRecord* record) {
  auto fail = [record](absl::Status status) { Fail(*record, std::move(status)); };
  const SvdBackend* backend = options_.cpu_backend;
  if (options_.gpu_backend_for) {
    if (const SvdBackend* gpu = options_.gpu_backend_for(request.gradient.region)) backend = gpu;
  }
  refresh->gradient = {g, layout.gradient_bytes, {layout.rows, layout.cols}, request.dtype};
  refresh->rank = request.rank;
  refresh->side = request.side;
  refresh->method = request.method;
  refresh->randomized = request.randomized;
  refresh->measure_residual = request.measure_residual;
  refresh->warm_start = request.warm_start && request.method == SvdMethod::kRandomized &&
                        refresh->previous_projector.data != nullptr;
  absl::StatusOr<RefreshResult> result = RefreshProjector(*refresh, *backend, &buffers.scratch);
  if (!result.ok()) return fail(result.status());
  record->backend = std::string(backend->name());
  record->warm_started = refresh->warm_start;

  // Write P (not for a degenerate G: the caller keeps its projector).
  if (!result->degenerate) {
    if (absl::Status s = WriteProjector(request, layout, result->projector_bytes); !s.ok()) {
      return fail(s);
    }
    record->projector_written = true;
  }
  record->state = RefreshState::kDone;
  record->result = *std::move(result);
}

absl::StatusOr<uint8_t*> RefreshService::ReadGradient(const ServiceRequest& request,
                                                      const RefreshLayout& layout,
                                                      WorkerBuffers& buffers) {
  absl::StatusOr<RegionCache::Opened> g_region = regions_.Open(request.gradient.region);
  if (!g_region.ok()) return Prefixed(g_region.status(), "gradient_region: ");
  if (absl::Status s =
          CheckOwner(*g_region, request.gradient.region, request.caller_uid, "gradient_region");
      !s.ok()) {
    return s;
  }
  const uint64_t g_offset = request.gradient.offset_bytes;
  const uint64_t g_size = g_region->region->size_bytes();
  if (g_offset > g_size || layout.gradient_bytes > g_size - g_offset) {
    return absl::OutOfRangeError(absl::StrCat("gradient needs ", layout.gradient_bytes,
                                              " bytes at offset ", g_offset, " but its region is ",
                                              g_size, " bytes"));
  }
  uint8_t* g = buffers.Gradient(layout.gradient_bytes);
  if (absl::Status s =
          CopyRegion(*g_region, request.gradient.region, copy::Direction::kDeviceToHost, g_offset,
                     g, layout.gradient_bytes);
      !s.ok()) {
    return Prefixed(s, "reading the gradient: ");
  }
  return g;
}

absl::Status RefreshService::WriteProjector(const ServiceRequest& request,
                                            const RefreshLayout& layout,
                                            std::vector<uint8_t>& projector_bytes) {
  absl::StatusOr<RegionCache::Opened> p_region = regions_.Open(*layout.projector_region);
  if (!p_region.ok()) return Prefixed(p_region.status(), "projector_region: ");
  if (absl::Status s =
          CheckOwner(*p_region, *layout.projector_region, request.caller_uid, "projector_region");
      !s.ok()) {
    return s;
  }
  const uint64_t p_offset = request.projector.offset_bytes;
  const uint64_t p_size = p_region->region->size_bytes();
  const uint64_t p_bytes = projector_bytes.size();
  if (p_offset > p_size || p_bytes > p_size - p_offset) {
    return absl::OutOfRangeError(absl::StrCat("projector needs ", p_bytes, " bytes at offset ",
                                              p_offset, " but its region is ", p_size, " bytes"));
  }
  if (absl::Status s =
          CopyRegion(*p_region, *layout.projector_region, copy::Direction::kHostToDevice, p_offset,
                     projector_bytes.data(), p_bytes);
      !s.ok()) {
    return Prefixed(s, "writing the projector: ");
  }
  return absl::OkStatus();
}

absl::Status RefreshService::CopyRegion(const RegionCache::Opened& opened,
                                        const copy::RegionSpec& spec, copy::Direction direction,
                                        uint64_t region_offset, uint8_t* host,
                                        uint64_t bytes) const {
  if (!options_.copy_through_link) {
    return opened.engine->CopyChunk(direction, *opened.region, region_offset, host, bytes);
  }
  RegionCopy c;
  c.engine = opened.engine;
  c.region = opened.region;
  c.direction = direction;
  c.region_offset = region_offset;
  c.host = host;
  c.bytes = bytes;
  c.device_id = spec.device_id;
  return options_.copy_through_link(c);
}

void RefreshService::Finish(uint64_t id, RefreshRecord record) {
  metrics::Get().projector_refreshes_total->Add({{"outcome", OutcomeOf(record)}}).Increment();
  if (record.deduplicated) {
    metrics::Get().projector_refresh_sources_total->Add({{"source", "deduplicated"}}).Increment();
  } else if (!record.backend.empty()) {
    metrics::Get().projector_refresh_sources_total->Add({{"source", "computed"}}).Increment();
  }
  if (record.content_mismatch) metrics::Get().projector_content_mismatches_total->Increment();
  if (record.state == RefreshState::kFailed &&
      record.status.code() != absl::StatusCode::kInvalidArgument &&
      record.status.code() != absl::StatusCode::kUnavailable) {
    // Both may carry client text (the parameter id, a region's name): escaped, so a client
    // cannot write a line of its own into the log; and a client can fail refreshes at will,
    // so one line a second at most, saying how many were not written.
    uint64_t held_back = 0;
    if (failure_log_.Allow(&held_back)) {
      LOG(WARNING) << "projector refresh " << id << " (" << base::LogText(record.parameter_id)
                   << ", step " << record.step << ") failed: "
                   << base::LogText(record.status.ToString(), 2048) << " (" << held_back
                   << " more failures since the last such line, not logged: "
                      "offloadd_projector_refreshes_total counts every one)";
    }
  }
  std::vector<Entry::Waiter> waiters;
  {
    base::MutexLock lock(mu_);
    auto it = entries_.find(id);
    if (it != entries_.end()) {
      // The parameter is free for its next refresh only once this record is in place, so a
      // repeated key queued behind this one finds it finished (StartAttachedLocked).
      if (it->second.record.state == RefreshState::kRunning) queue_.Done(it->second.parameter);
      if (!Finished(it->second.record.state)) {
        --unfinished_;
        auto uid = unfinished_by_uid_.find(it->second.caller_uid);
        if (uid != unfinished_by_uid_.end() && --uid->second == 0) unfinished_by_uid_.erase(uid);
      }
      it->second.record = record;
      waiters = std::move(it->second.waiters);
      it->second.waiters.clear();
      for (const Entry::Waiter& w : waiters) {
        if (w.owner_uid != kAnyOwner) ForgetWaiterLocked(w.owner_uid);
      }
      const double now = Now();
      const int64_t owner = it->second.caller_uid;
      finished_by_uid_[owner].emplace_back(now, id);
      ++finished_count_;
      EvictResultsLocked(now, owner);
    }
    UpdateQueueGaugeLocked();
  }
  for (auto& w : waiters) w.done(record);
  work_cv_.notify_all();  // the parameter may have more queued
}

void RefreshService::EraseResultLocked(uint64_t id) {
  auto it = entries_.find(id);
  if (it == entries_.end()) return;
  const RefreshRecord& r = it->second.record;
  const int64_t owner = it->second.caller_uid;
  auto key = by_key_.find({ParameterKey(owner, r.job_id, r.parameter_id), r.step});
  if (key != by_key_.end() && key->second == id) by_key_.erase(key);
  if (!r.batch_id.empty()) {
    auto b = by_batch_.find(Scoped(owner, r.batch_id));
    if (b != by_batch_.end()) {
      b->second.erase(std::remove(b->second.begin(), b->second.end(), id), b->second.end());
      if (b->second.empty()) by_batch_.erase(b);
    }
  }
  entries_.erase(it);
}

void RefreshService::EvictResultsLocked(double now, int64_t owner) {
  // Pops the oldest result of `uid`'s deque `it`; drops the deque when empty.
  using ByUid = std::map<int64_t, std::deque<std::pair<double, uint64_t>>>;
  auto pop_oldest = [&](ByUid::iterator it) REQUIRES(mu_) {
    const uint64_t id = it->second.front().second;
    it->second.pop_front();
    --finished_count_;
    EraseResultLocked(id);
    if (it->second.empty()) finished_by_uid_.erase(it);
  };
  for (auto it = finished_by_uid_.begin(); it != finished_by_uid_.end();) {
    auto next = std::next(it);
    while (it != finished_by_uid_.end() && !it->second.empty() &&
           now - it->second.front().first > options_.result_ttl_seconds) {
      const bool last = it->second.size() == 1;
      pop_oldest(it);
      if (last) break;  // the deque and `it` are gone
    }
    it = next;
  }
  if (options_.max_results_per_uid > 0) {
    auto mine = finished_by_uid_.find(owner);
    while (mine != finished_by_uid_.end() && mine->second.size() > options_.max_results_per_uid) {
      const bool last = mine->second.size() == 1;
      pop_oldest(mine);
      if (last) break;
    }
  }
  while (finished_count_ > options_.max_results && !finished_by_uid_.empty()) {
    auto largest = finished_by_uid_.begin();
    for (auto it = finished_by_uid_.begin(); it != finished_by_uid_.end(); ++it) {
      if (it->second.size() > largest->second.size()) largest = it;
    }
    pop_oldest(largest);
  }
}

std::map<std::string, RefreshService::History>::iterator RefreshService::LeastRecentLocked(
    int64_t owner, bool with_projector) {
  auto uses = by_use_.find(owner);
  if (uses == by_use_.end()) return history_.end();
  for (const auto& [tick, key] : uses->second) {
    auto it = history_.find(key);
    if (it != history_.end() && (!with_projector || it->second.projector)) return it;
  }
  return history_.end();
}

void RefreshService::TouchLocked(std::map<std::string, History>::iterator it) {
  History& h = it->second;
  auto& uses = by_use_[h.owner];
  if (h.last_used != 0) uses.erase(h.last_used);
  h.last_used = ++tick_;
  uses.emplace(h.last_used, it->first);
}

void RefreshService::ForgetParametersPastLocked(size_t keep) {
  while (history_.size() > keep && !parameters_by_uid_.empty()) {
    auto it = LeastRecentLocked(LargestHolder(parameters_by_uid_), /*with_projector=*/false);
    if (it == history_.end()) break;
    EraseHistoryLocked(it);
  }
}

void RefreshService::SetProjectorLocked(History& h,
                                        std::shared_ptr<const std::vector<uint8_t>> projector) {
  const uint64_t before = h.projector ? h.projector->size() : 0;
  const uint64_t after = projector ? projector->size() : 0;
  history_bytes_ = history_bytes_ - before + after;
  uint64_t& mine = history_bytes_by_uid_[h.owner];
  mine = mine - before + after;
  if (mine == 0) history_bytes_by_uid_.erase(h.owner);
  h.projector = std::move(projector);
}

void RefreshService::EraseHistoryLocked(std::map<std::string, History>::iterator it) {
  SetProjectorLocked(it->second, nullptr);
  auto count = parameters_by_uid_.find(it->second.owner);
  if (count != parameters_by_uid_.end() && --count->second == 0) parameters_by_uid_.erase(count);
  if (auto uses = by_use_.find(it->second.owner); uses != by_use_.end()) {
    uses->second.erase(it->second.last_used);
    if (uses->second.empty()) by_use_.erase(uses);
  }
  history_.erase(it);
}

void RefreshService::EvictHistoryLocked(int64_t owner) {
  const uint64_t per_uid = options_.history_bytes_per_uid;
  while (per_uid > 0 && history_bytes_by_uid_.count(owner) != 0 &&
         history_bytes_by_uid_[owner] > per_uid) {
    auto it = LeastRecentLocked(owner, /*with_projector=*/true);
    if (it == history_.end()) break;
    EraseHistoryLocked(it);
  }
  // Past a total: the least recently used of the uid holding the most.
  while (history_bytes_ > options_.history_bytes && !history_bytes_by_uid_.empty()) {
    auto it = LeastRecentLocked(LargestHolder(history_bytes_by_uid_), true);
    if (it == history_.end()) break;
    EraseHistoryLocked(it);
  }
  ForgetParametersPastLocked(options_.max_parameters);
}

void RefreshService::UpdateQueueGaugeLocked() {
  metrics::Get().projector_queue_depth->Set(
      static_cast<double>(queue_.queued() + queue_.running()));
}

std::string RefreshService::Scoped(int64_t owner_uid, const std::string& name) {
  return absl::StrCat(owner_uid, ":", name);
}

std::string RefreshService::ParameterKey(int64_t owner_uid, const std::string& job_id,
                                         const std::string& parameter_id) {
  return absl::StrCat(owner_uid, ":", job_id.size(), ":", job_id, ":", parameter_id);
}

uint64_t RefreshService::NewIdLocked() const {
  for (;;) {
    uint64_t id = 0;
    if (getrandom(&id, sizeof(id), 0) != sizeof(id)) {
      // No entropy source (very old kernel): still unique, mixed with the clock.
      static std::atomic<uint64_t> fallback{0};
      id = (fallback.fetch_add(1) + 1) * 0x9E3779B97F4A7C15ull ^ static_cast<uint64_t>(Now() * 1e9);
    }
    if (id != 0 && entries_.count(id) == 0) return id;
  }
}

const RefreshService::Entry* RefreshService::FindEntryLocked(uint64_t id, int64_t owner_uid) const {
  auto it = entries_.find(id);
  if (it == entries_.end()) return nullptr;
  if (owner_uid != kAnyOwner && it->second.caller_uid != owner_uid) return nullptr;
  return &it->second;
}

absl::StatusOr<RefreshRecord> RefreshService::Get(uint64_t id, int64_t owner_uid) const {
  base::MutexLock lock(mu_);
  const Entry* e = FindEntryLocked(id, owner_uid);
  if (e == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "no projector refresh with id ", id, ": unknown, or its result expired (results are kept ",
        options_.result_ttl_seconds, " s, at most ", options_.max_results, ")"));
  }
  return e->record;
}

absl::StatusOr<uint64_t> RefreshService::Find(int64_t owner_uid, const std::string& job_id,
                                              const std::string& parameter_id,
                                              int64_t step) const {
  base::MutexLock lock(mu_);
  auto it = by_key_.find({ParameterKey(owner_uid, job_id, parameter_id), step});
  if (it == by_key_.end()) {
    return absl::NotFoundError(absl::StrCat("no projector refresh for parameter ", parameter_id,
                                            " at step ", step, ": never submitted, or expired"));
  }
  return it->second;
}

std::vector<uint64_t> RefreshService::BatchIds(int64_t owner_uid,
                                               const std::string& batch_id) const {
  base::MutexLock lock(mu_);
  auto it = by_batch_.find(Scoped(owner_uid, batch_id));
  if (it == by_batch_.end()) return {};
  return it->second;
}

absl::Status RefreshService::WhenFinished(uint64_t id, int64_t owner_uid,
                                          std::function<void(const RefreshRecord&)> done,
                                          uint64_t* waiter) {
  if (waiter != nullptr) *waiter = 0;
  RefreshRecord record;
  {
    base::MutexLock lock(mu_);
    if (FindEntryLocked(id, owner_uid) == nullptr) {
      return absl::NotFoundError(
          absl::StrCat("no projector refresh with id ", id, ": unknown, or its result expired"));
    }
    auto it = entries_.find(id);
    if (!Finished(it->second.record.state)) {
      if (owner_uid != kAnyOwner) {
        if (absl::Status admitted = AdmitWaiterLocked(owner_uid); !admitted.ok()) return admitted;
      }
      const uint64_t token = next_waiter_token_++;
      it->second.waiters.push_back(Entry::Waiter{token, owner_uid, std::move(done)});
      if (waiter != nullptr) *waiter = token;
      return absl::OkStatus();
    }
    record = it->second.record;
  }
  done(record);
  return absl::OkStatus();
}

bool RefreshService::CancelWait(uint64_t id, uint64_t waiter) {
  if (waiter == 0) return false;
  std::function<void(const RefreshRecord&)> dropped;  // destroyed after the lock is released
  base::MutexLock lock(mu_);
  auto it = entries_.find(id);
  if (it == entries_.end()) return false;
  std::vector<Entry::Waiter>& waiters = it->second.waiters;
  for (auto w = waiters.begin(); w != waiters.end(); ++w) {
    if (w->token != waiter) continue;
    if (w->owner_uid != kAnyOwner) ForgetWaiterLocked(w->owner_uid);
    dropped = std::move(w->done);
    waiters.erase(w);
    return true;
  }
  return false;
}

absl::Status RefreshService::AdmitWaiterLocked(int64_t owner_uid) {
  size_t& mine = waiters_by_uid_[owner_uid];
  if (options_.max_waiters_per_uid > 0 && mine >= options_.max_waiters_per_uid) {
    if (mine == 0) waiters_by_uid_.erase(owner_uid);
    return absl::ResourceExhaustedError(absl::StrCat(
        "this user already has ", options_.max_waiters_per_uid,
        " calls waiting for projector refreshes (projector.max_waiting_calls_per_uid): wait for "
        "one refresh per call, or poll GetResult without wait"));
  }
  if (options_.max_waiters > 0 && waiters_total_ >= options_.max_waiters) {
    if (mine == 0) waiters_by_uid_.erase(owner_uid);
    return absl::ResourceExhaustedError(absl::StrCat(
        "the projector service already has ", options_.max_waiters,
        " calls waiting for refreshes (projector.max_waiting_calls): retry shortly, or poll "
        "GetResult without wait"));
  }
  ++mine;
  ++waiters_total_;
  return absl::OkStatus();
}

void RefreshService::ForgetWaiterLocked(int64_t owner_uid) {
  auto it = waiters_by_uid_.find(owner_uid);
  if (it == waiters_by_uid_.end()) return;
  --waiters_total_;
  if (--it->second == 0) waiters_by_uid_.erase(it);
}

absl::StatusOr<RefreshRecord> RefreshService::Wait(uint64_t id) {
  struct Shared {
    base::Mutex mu;
    base::CondVar cv;
    bool ready GUARDED_BY(mu) = false;
    RefreshRecord record GUARDED_BY(mu);
  };
  auto shared = std::make_shared<Shared>();
  absl::Status s = WhenFinished(id, [shared](const RefreshRecord& r) {
    base::MutexLock lock(shared->mu);
    shared->record = r;
    shared->ready = true;
    shared->cv.notify_all();
  });
  if (!s.ok()) return s;
  base::MutexLock lock(shared->mu);
  while (!shared->ready) shared->cv.Wait(shared->mu);
  return shared->record;
}

void RefreshService::Shutdown() {
  base::MutexLock once(shutdown_mu_);
  std::vector<uint64_t> cancelled;
  {
    base::MutexLock lock(mu_);
    if (stopping_ && workers_.empty()) return;
    stopping_ = true;
    cancelled = queue_.TakeAll();
  }
  work_cv_.notify_all();
  for (uint64_t id : cancelled) {
    RefreshRecord record;
    {
      base::MutexLock lock(mu_);
      record = entries_.at(id).record;
      entries_.at(id).request = ServiceRequest();
    }
    record.state = RefreshState::kFailed;
    record.status = absl::UnavailableError(
        "the daemon is shutting down: this refresh did not run; resubmit it when the daemon is "
        "back");
    Finish(id, std::move(record));
  }
  for (std::thread& t : workers_) t.join();
  workers_.clear();
  regions_.Clear();
}

RefreshService::Stats RefreshService::stats() const {
  Stats s;
  {
    base::MutexLock lock(mu_);
    s.queued = queue_.queued();
    s.running = queue_.running();
    s.results_held = entries_.size();
    s.parameters_held = history_.size();
    s.history_bytes = history_bytes_;
    s.computed_total = computed_total_;
    s.deduplicated_total = deduplicated_total_;
    s.content_mismatches_total = content_mismatches_total_;
  }
  s.backend = std::string(options_.cpu_backend->name());
  if (options_.gpu_backend_for) {
    s.backend += "+" + (options_.gpu_backend_name.empty() ? "gpu" : options_.gpu_backend_name);
  }
  s.cuda_regions = cuda_regions_;
  s.regions_cached = regions_.size();
  s.region_opens_total = regions_.opens_total();
  return s;
}

}  // namespace offloadd::projector
