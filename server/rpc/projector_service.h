// The offloadd.v1.Projector gRPC service (proto/projector.proto) over projector::RefreshService:
// translation of messages to the service's plain structs and back, and the callback-API
// reactors. No refresh logic lives here.
//
// Status mapping (through ToGrpcStatus): Submit returns the service's validation errors
// (INVALID_ARGUMENT, OUT_OF_RANGE, FAILED_PRECONDITION) plus INVALID_ARGUMENT for unspecified
// or unknown enum values and a CUDA handle that is not 64 bytes. GetResult returns a failed
// refresh's own status (e.g. INVALID_ARGUMENT naming the first bad row of G) and NOT_FOUND for an
// unknown or expired id or key. WatchBatch reports failures inside RefreshProgress (state
// REFRESH_FAILED + error) and ends OK after the last one. With no RefreshService (projector
// disabled in the config) every call answers UNAVAILABLE.
#ifndef OFFLOADD_SERVER_RPC_PROJECTOR_SERVICE_H_
#define OFFLOADD_SERVER_RPC_PROJECTOR_SERVICE_H_

#include <cstdint>
#include <functional>

#include "absl/status/statusor.h"
#include "proto/projector.grpc.pb.h"
#include "proto/projector.pb.h"
#include "server/projector/refresh_service.h"

namespace offloadd::rpc {

// Translation, exposed for tests.
absl::StatusOr<projector::ServiceRequest> FromProto(const v1::RefreshRequest& in);
void ToProto(const projector::RefreshRecord& record, v1::RefreshResult* out);

class ProjectorService final : public v1::Projector::CallbackService {
 public:
  // Says whether a call may use the service and who made it: the caller's uid (>= 0), -1 when
  // unknown, or an error (e.g. PERMISSION_DENIED from the daemon's access policy) that refuses
  // the call. Submit hands the uid on as ServiceRequest::caller_uid.
  using Authorizer = std::function<absl::StatusOr<int64_t>(grpc::CallbackServerContext*)>;

  // `service` may be null (disabled); it must outlive this object's calls. A null `authorize`
  // admits every call with an unknown uid.
  explicit ProjectorService(projector::RefreshService* service, Authorizer authorize = nullptr)
      : service_(service), authorize_(std::move(authorize)) {}

  grpc::ServerUnaryReactor* Submit(grpc::CallbackServerContext* ctx,
                                   const v1::RefreshRequest* request,
                                   v1::SubmitReply* reply) override;
  grpc::ServerUnaryReactor* GetResult(grpc::CallbackServerContext* ctx,
                                      const v1::GetResultRequest* request,
                                      v1::RefreshResult* result) override;
  grpc::ServerWriteReactor<v1::RefreshProgress>* WatchBatch(
      grpc::CallbackServerContext* ctx, const v1::WatchRequest* request) override;
  grpc::ServerUnaryReactor* GetProjectorStats(grpc::CallbackServerContext* ctx,
                                              const v1::ProjectorStatsRequest* request,
                                              v1::ProjectorStats* reply) override;

 private:
  absl::StatusOr<int64_t> Authorize(grpc::CallbackServerContext* ctx) const;

  projector::RefreshService* service_;
  Authorizer authorize_;
};

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_PROJECTOR_SERVICE_H_
