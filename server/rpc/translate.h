// Translation between offloadd.v1 protobuf messages and the session layer's plain structs.
// rpc/ is the only layer that includes generated protobuf/gRPC headers (docs/ARCHITECTURE.md).
#ifndef OFFLOADD_SERVER_RPC_TRANSLATE_H_
#define OFFLOADD_SERVER_RPC_TRANSLATE_H_

#include "absl/status/status.h"
#include "grpcpp/support/status.h"
#include "proto/offload.pb.h"
#include "server/projector/blas_core.h"
#include "server/session/core.h"
#include "server/session/session.h"

namespace offloadd::rpc {

// The one mapping from absl::Status to grpc::Status (codes share numeric values).
grpc::Status ToGrpcStatus(const absl::Status& status);

session::Request FromProto(const v1::Request& request);
void ToProto(const session::Completion& completion, v1::Response* response);
void ToProto(const session::CoreStats& stats, v1::Stats* out);
void ToProto(const session::SessionInfo& info, v1::SessionStats* out);
void ToProto(const session::LinkCalibrationReport& report, v1::LinkCalibration* out);
void ToProto(const projector::BlasCoreReport& report, v1::ProjectorBlas* out);

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_TRANSLATE_H_
