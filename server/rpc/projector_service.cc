#include "server/rpc/projector_service.h"

#include <algorithm>
#include <deque>
#include <limits>
#include <memory>
#include <mutex>
#include <set>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "common/base/mutex.h"
#include "server/rpc/translate.h"

namespace offloadd::rpc {
namespace {

namespace pj = ::offloadd::projector;

constexpr size_t kCudaIpcHandleBytes = 64;  // sizeof(cudaIpcMemHandle_t)

grpc::Status Disabled() {
  return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                      "the projector service is off in this daemon's config: set projector { "
                      "enabled: true } (the default) and restart it");
}

absl::StatusOr<copy::RegionSpec> RegionFromProto(const v1::RegionHandle& h,
                                                 const std::string& device_id, const char* what) {
  copy::RegionSpec spec;
  spec.size_bytes = h.size_bytes();
  spec.device_id = device_id.empty() ? "projector" : device_id;
  // A refresh is no session: its device id leaves no handle-count series once its regions
  // close (a client naming ever-new ids would otherwise grow the metrics without bound).
  spec.transient_device = true;
  switch (h.kind_case()) {
    case v1::RegionHandle::kShmName:
      spec.shm_name = h.shm_name();
      break;
    case v1::RegionHandle::kCudaIpcHandle:
      if (h.cuda_ipc_handle().size() != kCudaIpcHandleBytes) {
        return absl::InvalidArgumentError(
            absl::StrCat(what, ".cuda_ipc_handle is ", h.cuda_ipc_handle().size(),
                         " bytes; a cudaIpcMemHandle_t is 64 (send the raw handle bytes)"));
      }
      if (device_id.empty()) {
        return absl::InvalidArgumentError(absl::StrCat(
            what, " is a CUDA IPC handle: set device_id to the UUID of the GPU that holds it"));
      }
      spec.cuda_ipc_handle = h.cuda_ipc_handle();
      break;
    case v1::RegionHandle::KIND_NOT_SET:
      break;  // ValidateServiceRequest names it
  }
  return spec;
}

absl::StatusOr<pj::DType> DTypeFromProto(int v) {
  switch (v) {
    case v1::DTYPE_FLOAT32:
      return pj::DType::kFloat32;
    case v1::DTYPE_BFLOAT16:
      return pj::DType::kBFloat16;
    case v1::DTYPE_FLOAT16:
      return pj::DType::kFloat16;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "dtype ", v,
      " is unspecified or unknown: set DTYPE_FLOAT32, DTYPE_BFLOAT16 or DTYPE_FLOAT16"));
}

v1::DType DTypeToProto(pj::DType d) {
  switch (d) {
    case pj::DType::kFloat32:
      return v1::DTYPE_FLOAT32;
    case pj::DType::kBFloat16:
      return v1::DTYPE_BFLOAT16;
    case pj::DType::kFloat16:
      return v1::DTYPE_FLOAT16;
  }
  return v1::DTYPE_UNSPECIFIED;
}

absl::StatusOr<pj::ProjectionSide> SideFromProto(int v) {
  switch (v) {
    case v1::SIDE_STD:
      return pj::ProjectionSide::kStd;
    case v1::SIDE_REVERSE_STD:
      return pj::ProjectionSide::kReverseStd;
    case v1::SIDE_LEFT:
      return pj::ProjectionSide::kLeft;
    case v1::SIDE_RIGHT:
      return pj::ProjectionSide::kRight;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("side ", v,
                   " is unspecified or unknown: set SIDE_STD (the reference's default), "
                   "SIDE_REVERSE_STD, SIDE_LEFT or SIDE_RIGHT"));
}

absl::StatusOr<pj::SvdMethod> MethodFromProto(int v) {
  switch (v) {
    case v1::METHOD_EXACT:
      return pj::SvdMethod::kExact;
    case v1::METHOD_RANDOMIZED:
      return pj::SvdMethod::kRandomized;
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "method ", v, " is unspecified or unknown: set METHOD_EXACT or METHOD_RANDOMIZED"));
}

v1::RefreshState StateToProto(pj::RefreshState s) {
  switch (s) {
    case pj::RefreshState::kQueued:
      return v1::REFRESH_QUEUED;
    case pj::RefreshState::kRunning:
      return v1::REFRESH_RUNNING;
    case pj::RefreshState::kDone:
      return v1::REFRESH_DONE;
    case pj::RefreshState::kFailed:
      return v1::REFRESH_FAILED;
  }
  return v1::REFRESH_STATE_UNSPECIFIED;
}

// WatchBatch: one RefreshProgress per refresh as it finishes. Completions arrive on service
// worker threads through a State the reactor shares with them; at most one write is in flight,
// and Finish is called only when none is.
class WatchReactor : public grpc::ServerWriteReactor<v1::RefreshProgress> {
 public:
  // `caller_uid`: the caller's (-1 = unknown); it sees its own refreshes only.
  WatchReactor(pj::RefreshService* service, const v1::WatchRequest& request, int64_t caller_uid)
      : service_(service) {
    std::vector<uint64_t> ids = service->BatchIds(caller_uid, request.batch_id());
    std::set<uint64_t> seen(ids.begin(), ids.end());
    for (uint64_t id : request.refresh_ids()) {
      if (!service->Get(id, caller_uid).ok()) {
        Finish(grpc::Status(
            grpc::StatusCode::NOT_FOUND,
            absl::StrCat("no projector refresh with id ", id, ": unknown, or its result expired")));
        return;
      }
      if (seen.insert(id).second) ids.push_back(id);
    }
    if (ids.empty()) {
      Finish(grpc::Status(grpc::StatusCode::NOT_FOUND,
                          request.batch_id().empty()
                              ? std::string("WatchBatch names no refresh: set batch_id or "
                                            "refresh_ids")
                              : absl::StrCat("no refresh was submitted with batch_id \"",
                                             request.batch_id(), "\" (or all have expired)")));
      return;
    }
    state_ = std::make_shared<State>();
    state_->reactor = this;
    state_->total = static_cast<uint32_t>(ids.size());
    for (uint64_t id : ids) {
      std::shared_ptr<State> state = state_;
      uint64_t waiter = 0;
      absl::Status s = service->WhenFinished(
          id, caller_uid, [state](const pj::RefreshRecord& r) { state->Push(r); }, &waiter);
      if (waiter != 0) {
        base::MutexLock lock(state_->mu);
        state_->waiters.emplace_back(id, waiter);
      }
      if (absl::IsResourceExhausted(s)) {  // past the caller's waiting calls: no watch at all
        RefuseOverBound(s, ids.size());
        return;
      }
      if (!s.ok()) {  // expired between the lookup and now
        pj::RefreshRecord gone;
        gone.id = id;
        gone.state = pj::RefreshState::kFailed;
        gone.status = s;
        state_->Push(gone);
      }
    }
  }

  // A refresh of the watch found the caller's waiting calls used up: reporting it failed would
  // read as a failed refresh. The whole watch is refused and its waiters let go.
  void RefuseOverBound(const absl::Status& s, size_t watched) {
    std::vector<std::pair<uint64_t, uint64_t>> waiters;
    {
      base::MutexLock lock(state_->mu);
      state_->finished = true;
      waiters.swap(state_->waiters);
    }
    for (const auto& [id, waiter] : waiters) service_->CancelWait(id, waiter);
    Finish(grpc::Status(
        grpc::StatusCode::RESOURCE_EXHAUSTED,
        absl::StrCat("this watch of ", watched, " refreshes needs a waiting call for each "
                     "unfinished one, and ", s.message(), ": watch fewer at once (split the "
                     "batch, or GetResult the rest later); nothing was cancelled")));
  }

  void OnWriteDone(bool ok) override {
    base::MutexLock lock(state_->mu);
    state_->writing = false;
    if (!ok) state_->broken = true;
    state_->NextLocked();
  }
  void OnCancel() override {
    if (!state_) return;
    std::vector<std::pair<uint64_t, uint64_t>> waiters;
    {
      base::MutexLock lock(state_->mu);
      state_->broken = true;
      waiters.swap(state_->waiters);
      state_->NextLocked();
    }
    // The refreshes not finished yet no longer hold the caller's waiting-call slots.
    for (const auto& [id, waiter] : waiters) service_->CancelWait(id, waiter);
  }
  void OnDone() override {
    if (state_) {
      base::MutexLock lock(state_->mu);
      state_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct State {
    base::Mutex mu;
    WatchReactor* reactor GUARDED_BY(mu) = nullptr;  // null once the call is done
    uint32_t total GUARDED_BY(mu) = 0;
    uint32_t completed GUARDED_BY(mu) = 0;
    std::deque<v1::RefreshProgress> pending GUARDED_BY(mu);
    v1::RefreshProgress current GUARDED_BY(mu);  // being written
    bool writing GUARDED_BY(mu) = false;
    bool broken GUARDED_BY(mu) = false;
    bool finished GUARDED_BY(mu) = false;
    // (refresh id, RefreshService waiter token) of the callbacks registered, for OnCancel.
    std::vector<std::pair<uint64_t, uint64_t>> waiters GUARDED_BY(mu);

    void Push(const pj::RefreshRecord& r) {
      base::MutexLock lock(mu);
      if (reactor == nullptr || finished) return;
      v1::RefreshProgress p;
      ToProto(r, p.mutable_result());
      p.set_completed(++completed);
      p.set_total(total);
      pending.push_back(std::move(p));
      NextLocked();
    }
    void NextLocked() REQUIRES(mu) {
      if (writing || finished || reactor == nullptr) return;
      if (broken) {
        finished = true;
        reactor->Finish(grpc::Status(grpc::StatusCode::CANCELLED, "the watch was cancelled"));
        return;
      }
      if (!pending.empty()) {
        current = std::move(pending.front());
        pending.pop_front();
        writing = true;
        reactor->StartWrite(&current);
      } else if (completed == total) {
        finished = true;
        reactor->Finish(grpc::Status::OK);
      }
    }
  };
  pj::RefreshService* const service_;
  std::shared_ptr<State> state_;
};

}  // namespace

absl::StatusOr<pj::ServiceRequest> FromProto(const v1::RefreshRequest& in) {
  pj::ServiceRequest r;
  r.job_id = in.key().job_id();
  r.parameter_id = in.key().parameter_id();
  r.step = in.key().step();
  absl::StatusOr<copy::RegionSpec> g =
      RegionFromProto(in.gradient_region(), in.device_id(), "gradient_region");
  if (!g.ok()) return g.status();
  r.gradient.region = *std::move(g);
  r.gradient.offset_bytes = in.gradient_offset();
  r.shape.assign(in.shape().begin(), in.shape().end());
  absl::StatusOr<pj::DType> dtype = DTypeFromProto(in.dtype());
  if (!dtype.ok()) return dtype.status();
  r.dtype = *dtype;
  r.rank = in.rank();
  absl::StatusOr<pj::ProjectionSide> side = SideFromProto(in.side());
  if (!side.ok()) return side.status();
  r.side = *side;
  absl::StatusOr<pj::SvdMethod> method = MethodFromProto(in.method());
  if (!method.ok()) return method.status();
  r.method = *method;
  if (in.has_oversampling()) r.randomized.oversampling = in.oversampling();
  if (in.has_power_iterations()) {
    // Checked here, on the uint32 sent, so the error names that value even above INT_MAX.
    if (in.power_iterations() > static_cast<uint32_t>(pj::kMaxPowerIterations)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "randomized options: power_iterations ", in.power_iterations(),
          " must be <= ", pj::kMaxPowerIterations, " (1-3 is usual)"));
    }
    r.randomized.power_iterations = static_cast<int>(in.power_iterations());
  }
  if (in.has_seed()) r.randomized.seed = in.seed();
  r.warm_start = in.warm_start();
  r.has_projector_region = in.has_projector_region();
  if (r.has_projector_region) {
    absl::StatusOr<copy::RegionSpec> p =
        RegionFromProto(in.projector_region(), in.device_id(), "projector_region");
    if (!p.ok()) return p.status();
    r.projector.region = *std::move(p);
  }
  r.projector.offset_bytes = in.projector_offset();
  r.measure_residual = !in.skip_residual();
  r.lazy = in.lazy();
  if (in.has_lazy_similarity_threshold()) {
    r.lazy_policy.similarity_threshold = in.lazy_similarity_threshold();
  }
  // uint32 on the wire, int in the policy: a count past INT32_MAX means as much as INT32_MAX
  // (in effect "never"), never a negative count.
  constexpr uint32_t kMaxCount = std::numeric_limits<int32_t>::max();
  if (in.has_lazy_stable_refreshes()) {
    r.lazy_policy.stable_refreshes_before_skip =
        static_cast<int>(std::min(in.lazy_stable_refreshes(), kMaxCount));
  }
  if (in.has_lazy_max_skips()) {
    r.lazy_policy.max_consecutive_skips = static_cast<int>(std::min(in.lazy_max_skips(), kMaxCount));
  }
  r.batch_id = in.batch_id();
  r.reset_history = in.reset_history();
  return r;
}

void ToProto(const pj::RefreshRecord& record, v1::RefreshResult* out) {
  out->set_refresh_id(record.id);
  out->mutable_key()->set_parameter_id(record.parameter_id);
  out->mutable_key()->set_step(record.step);
  out->mutable_key()->set_job_id(record.job_id);
  out->set_deduplicated(record.deduplicated);
  out->set_shared_from_refresh_id(record.shared_from_id);
  out->set_content_mismatch(record.content_mismatch);
  out->set_state(StateToProto(record.state));
  if (record.state == pj::RefreshState::kFailed) {
    out->mutable_error()->set_code(static_cast<int32_t>(record.status.code()));
    out->mutable_error()->set_message(std::string(record.status.message()));
  }
  out->set_projector_written(record.projector_written);
  out->set_skipped(record.skipped);
  out->set_vector_side(record.vector_side == pj::VectorSide::kLeft ? v1::VECTOR_SIDE_LEFT
                                                                   : v1::VECTOR_SIDE_RIGHT);
  out->set_projector_rows(record.projector_rows);
  out->set_effective_rank(record.effective_rank);
  out->set_projector_dtype(DTypeToProto(record.dtype));
  out->set_warm_started(record.warm_started);
  out->set_backend(record.backend);
  out->set_queued_seconds(record.queued_seconds);
  out->set_elapsed_seconds(record.elapsed_seconds);
  if (record.state != pj::RefreshState::kDone || record.skipped) return;
  const pj::RefreshResult& r = record.result;
  out->set_degenerate(r.degenerate);
  for (double s : r.singular_values) out->add_singular_values(s);
  out->set_gradient_fro(r.gradient_fro);
  out->set_captured_energy(r.captured_energy);
  out->set_residual_fro(r.residual_fro);
  out->set_residual_ratio(r.residual_ratio);
  out->set_residual_ratio_upper_bound(r.residual_ratio_upper_bound);
  out->set_tail_energy_lower(r.tail_energy_lower);
  out->set_tail_energy_upper(r.tail_energy_upper);
  out->set_orthogonality_error(r.orthogonality_error);
  out->set_has_similarity(r.has_similarity);
  out->set_similarity(r.similarity);
  out->set_svd_seconds(r.svd_seconds);
}

absl::StatusOr<int64_t> ProjectorService::Authorize(grpc::CallbackServerContext* ctx) const {
  if (!authorize_) return -1;
  return authorize_(ctx);
}

grpc::ServerUnaryReactor* ProjectorService::Submit(grpc::CallbackServerContext* ctx,
                                                   const v1::RefreshRequest* request,
                                                   v1::SubmitReply* reply) {
  auto* reactor = ctx->DefaultReactor();
  if (service_ == nullptr) {
    reactor->Finish(Disabled());
    return reactor;
  }
  absl::StatusOr<int64_t> caller = Authorize(ctx);
  if (!caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  absl::StatusOr<pj::ServiceRequest> r = FromProto(*request);
  if (!r.ok()) {
    reactor->Finish(ToGrpcStatus(r.status()));
    return reactor;
  }
  r->caller_uid = *caller;
  absl::StatusOr<pj::SubmitOutcome> outcome = service_->Submit(*r);
  if (!outcome.ok()) {
    reactor->Finish(ToGrpcStatus(outcome.status()));
    return reactor;
  }
  reply->set_refresh_id(outcome->id);
  reply->set_deduplicated(outcome->deduplicated);
  reply->set_state(StateToProto(outcome->state));
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

namespace {
// GetResult with wait: finishes from the worker that completes the refresh (or now, if it has),
// or, when the call is cancelled or its deadline passes first, withdraws its waiter at once
// (RefreshService::CancelWait), so the caller's waiting-call slot is free again immediately.
class WaitReactor : public grpc::ServerUnaryReactor {
 public:
  WaitReactor(pj::RefreshService* service, uint64_t id, int64_t caller_uid,
              v1::RefreshResult* result)
      : service_(service), id_(id), state_(std::make_shared<State>()) {
    state_->reactor = this;
    state_->result = result;
    std::shared_ptr<State> state = state_;
    uint64_t waiter = 0;
    absl::Status s = service->WhenFinished(
        id, caller_uid, [state](const pj::RefreshRecord& r) { state->Answer(r); }, &waiter);
    base::MutexLock lock(state_->mu);
    state_->waiter = waiter;
    if (!s.ok()) state_->FinishLocked(ToGrpcStatus(s));
  }
  void OnCancel() override {
    uint64_t waiter;
    {
      base::MutexLock lock(state_->mu);
      if (state_->finished) return;
      waiter = state_->waiter;
    }
    // Withdrawn: done will not run. Not withdrawn: it runs (or ran) and finishes the call.
    if (!service_->CancelWait(id_, waiter)) return;
    base::MutexLock lock(state_->mu);
    state_->FinishLocked(grpc::Status(grpc::StatusCode::CANCELLED,
                                      "the wait was cancelled or its deadline passed"));
  }
  void OnDone() override {
    {
      base::MutexLock lock(state_->mu);
      state_->reactor = nullptr;
    }
    delete this;
  }

 private:
  struct State {
    base::Mutex mu;
    WaitReactor* reactor GUARDED_BY(mu) = nullptr;  // null once the call is done
    v1::RefreshResult* result GUARDED_BY(mu) = nullptr;
    uint64_t waiter GUARDED_BY(mu) = 0;
    bool finished GUARDED_BY(mu) = false;

    void Answer(const pj::RefreshRecord& r) {
      base::MutexLock lock(mu);
      if (finished || reactor == nullptr) return;
      if (r.state == pj::RefreshState::kFailed) {
        FinishLocked(ToGrpcStatus(r.status));
        return;
      }
      ToProto(r, result);
      FinishLocked(grpc::Status::OK);
    }
    void FinishLocked(grpc::Status status) REQUIRES(mu) {
      if (finished || reactor == nullptr) return;
      finished = true;
      reactor->Finish(std::move(status));
    }
  };
  pj::RefreshService* const service_;
  const uint64_t id_;
  std::shared_ptr<State> state_;
};
}  // namespace

grpc::ServerUnaryReactor* ProjectorService::GetResult(grpc::CallbackServerContext* ctx,
                                                      const v1::GetResultRequest* request,
                                                      v1::RefreshResult* result) {
  // The refresh id asked for, or the status that answers the call at once.
  auto lookup = [&]() -> absl::StatusOr<std::pair<uint64_t, int64_t>> {
    if (service_ == nullptr) return absl::Status(absl::StatusCode::kFailedPrecondition, "");
    absl::StatusOr<int64_t> caller = Authorize(ctx);
    if (!caller.ok()) return caller.status();
    if (request->refresh_id() != 0) return std::make_pair(request->refresh_id(), *caller);
    absl::StatusOr<uint64_t> found =
        service_->Find(*caller, request->key().job_id(),
                       request->key().parameter_id(), request->key().step());
    if (!found.ok()) return found.status();
    return std::make_pair(*found, *caller);
  };
  absl::StatusOr<std::pair<uint64_t, int64_t>> target = lookup();
  if (target.ok() && request->wait()) {
    return new WaitReactor(service_, target->first, target->second, result);
  }
  auto* reactor = ctx->DefaultReactor();
  if (!target.ok()) {
    reactor->Finish(service_ == nullptr ? Disabled() : ToGrpcStatus(target.status()));
    return reactor;
  }
  absl::StatusOr<pj::RefreshRecord> record = service_->Get(target->first, target->second);
  if (!record.ok()) {
    reactor->Finish(ToGrpcStatus(record.status()));
  } else if (record->state == pj::RefreshState::kFailed) {
    reactor->Finish(ToGrpcStatus(record->status));
  } else {
    ToProto(*record, result);
    reactor->Finish(grpc::Status::OK);
  }
  return reactor;
}

grpc::ServerUnaryReactor* ProjectorService::GetProjectorStats(
    grpc::CallbackServerContext* ctx, const v1::ProjectorStatsRequest* /*request*/,
    v1::ProjectorStats* reply) {
  auto* reactor = ctx->DefaultReactor();
  if (service_ == nullptr) {
    reactor->Finish(Disabled());
    return reactor;
  }
  if (absl::StatusOr<int64_t> caller = Authorize(ctx); !caller.ok()) {
    reactor->Finish(ToGrpcStatus(caller.status()));
    return reactor;
  }
  const pj::RefreshService::Stats s = service_->stats();
  reply->set_queued(s.queued);
  reply->set_running(s.running);
  reply->set_results_held(s.results_held);
  reply->set_parameters_held(s.parameters_held);
  reply->set_history_bytes(s.history_bytes);
  reply->set_regions_cached(s.regions_cached);
  reply->set_region_opens_total(s.region_opens_total);
  reply->set_computed_total(s.computed_total);
  reply->set_deduplicated_total(s.deduplicated_total);
  reply->set_content_mismatches_total(s.content_mismatches_total);
  reply->set_backend(s.backend);
  reply->set_cuda_regions(s.cuda_regions);
  reactor->Finish(grpc::Status::OK);
  return reactor;
}

grpc::ServerWriteReactor<v1::RefreshProgress>* ProjectorService::WatchBatch(
    grpc::CallbackServerContext* ctx, const v1::WatchRequest* request) {
  class Refused : public grpc::ServerWriteReactor<v1::RefreshProgress> {
   public:
    explicit Refused(grpc::Status status) { Finish(std::move(status)); }
    void OnDone() override { delete this; }
  };
  if (service_ == nullptr) return new Refused(Disabled());
  absl::StatusOr<int64_t> caller = Authorize(ctx);
  if (!caller.ok()) return new Refused(ToGrpcStatus(caller.status()));
  return new WatchReactor(service_, *request, *caller);
}

}  // namespace offloadd::rpc
