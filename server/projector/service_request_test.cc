#include "server/projector/service_request.h"

#include <string>

#include "gtest/gtest.h"

namespace offloadd::projector {
namespace {

// A valid request: a 64 x 32 fp32 gradient at offset 0 of a 1 MiB shm region, P after it.
ServiceRequest Valid() {
  ServiceRequest r;
  r.parameter_id = "layers.0.q_proj.weight";
  r.step = 200;
  r.gradient.region.shm_name = "/offloadd-test";
  r.gradient.region.size_bytes = 1 << 20;
  r.shape = {64, 32};
  r.dtype = DType::kFloat32;
  r.rank = 8;
  r.side = ProjectionSide::kStd;
  r.projector.offset_bytes = 64 * 32 * 4;
  return r;
}

TEST(ServiceRequestTest, ValidRequestGivesItsLayout) {
  absl::StatusOr<RefreshLayout> layout = ValidateServiceRequest(Valid());
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->rows, 64);
  EXPECT_EQ(layout->cols, 32);
  EXPECT_EQ(layout->vector_side, VectorSide::kRight);  // std, m >= n
  EXPECT_EQ(layout->projector_rows, 32);
  EXPECT_EQ(layout->effective_rank, 8);
  EXPECT_EQ(layout->gradient_bytes, 64u * 32 * 4);
  EXPECT_EQ(layout->projector_bytes, 32u * 8 * 4);
}

TEST(ServiceRequestTest, RankIsClampedAndBf16HalvesTheBytes) {
  ServiceRequest r = Valid();
  r.rank = 1000;
  r.dtype = DType::kBFloat16;
  r.side = ProjectionSide::kLeft;
  absl::StatusOr<RefreshLayout> layout = ValidateServiceRequest(r);
  ASSERT_TRUE(layout.ok()) << layout.status();
  EXPECT_EQ(layout->effective_rank, 32);
  EXPECT_EQ(layout->projector_rows, 64);
  EXPECT_EQ(layout->projector_bytes, 64u * 32 * 2);
}

void ExpectError(const ServiceRequest& r, absl::StatusCode code, const std::string& needle) {
  absl::StatusOr<RefreshLayout> layout = ValidateServiceRequest(r);
  ASSERT_FALSE(layout.ok());
  EXPECT_EQ(layout.status().code(), code) << layout.status();
  EXPECT_NE(layout.status().message().find(needle), std::string::npos) << layout.status();
}

TEST(ServiceRequestTest, OneDimensionalAndShapelessBuffersAreRejected) {
  ServiceRequest r = Valid();
  r.shape = {4096};
  ExpectError(r, absl::StatusCode::kInvalidArgument, "1-D");
  r.shape = {};
  ExpectError(r, absl::StatusCode::kInvalidArgument, "shapeless");
  r.shape = {2, 3, 4};
  ExpectError(r, absl::StatusCode::kInvalidArgument, "2-D");
  r.shape = {0, 4};
  ExpectError(r, absl::StatusCode::kInvalidArgument, ">= 1");
}

TEST(ServiceRequestTest, BadScalarsAreInvalidArgument) {
  ServiceRequest r = Valid();
  r.rank = 0;
  ExpectError(r, absl::StatusCode::kInvalidArgument, "rank");
  r = Valid();
  r.parameter_id = "";
  ExpectError(r, absl::StatusCode::kInvalidArgument, "parameter_id");
  r = Valid();
  r.job_id = std::string(kMaxJobIdBytes + 1, 'j');
  ExpectError(r, absl::StatusCode::kInvalidArgument, "job_id");
  r.job_id = std::string(kMaxJobIdBytes, 'j');
  EXPECT_TRUE(ValidateServiceRequest(r).ok());
  r = Valid();
  r.step = -1;
  ExpectError(r, absl::StatusCode::kInvalidArgument, "step");
  r = Valid();
  r.method = SvdMethod::kRandomized;
  r.randomized.power_iterations = -1;
  ExpectError(r, absl::StatusCode::kInvalidArgument, "power_iterations");
  r = Valid();
  r.warm_start = true;  // exact
  ExpectError(r, absl::StatusCode::kInvalidArgument, "warm_start");
  r = Valid();
  r.lazy = true;
  r.lazy_policy.similarity_threshold = 1.5;
  ExpectError(r, absl::StatusCode::kInvalidArgument, "threshold");
}

TEST(ServiceRequestTest, RegionsNeedExactlyOneHandleAndASize) {
  ServiceRequest r = Valid();
  r.gradient.region.shm_name = "";
  ExpectError(r, absl::StatusCode::kInvalidArgument, "no handle");
  r = Valid();
  r.gradient.region.cuda_ipc_handle = std::string(64, 'x');
  ExpectError(r, absl::StatusCode::kInvalidArgument, "both");
  r = Valid();
  r.gradient.region.size_bytes = 0;
  ExpectError(r, absl::StatusCode::kInvalidArgument, "size_bytes 0");
  r = Valid();
  r.has_projector_region = true;  // set but empty
  ExpectError(r, absl::StatusCode::kInvalidArgument, "projector_region has no handle");
}

TEST(ServiceRequestTest, RegionTooSmallIsOutOfRange) {
  ServiceRequest r = Valid();
  r.gradient.region.size_bytes = 64 * 32 * 4 - 1;
  ExpectError(r, absl::StatusCode::kOutOfRange, "gradient [64, 32] fp32 needs 8192 bytes");
  r = Valid();
  r.gradient.offset_bytes = (1 << 20) - 16;
  ExpectError(r, absl::StatusCode::kOutOfRange, "gradient");
  r = Valid();
  r.projector.offset_bytes = (1 << 20) - 4;  // P does not fit after it
  ExpectError(r, absl::StatusCode::kOutOfRange, "projector [32, 8] fp32 needs 1024 bytes");
  r = Valid();
  r.has_projector_region = true;
  r.projector.region.shm_name = "/offloadd-p";
  r.projector.region.size_bytes = 1023;
  r.projector.offset_bytes = 0;
  ExpectError(r, absl::StatusCode::kOutOfRange, "projector");
  r.projector.region.size_bytes = 1024;
  EXPECT_TRUE(ValidateServiceRequest(r).ok());
}

// A 16 KiB device id became a link and a metrics label; 64 of them made /metrics 154 MB.
TEST(ServiceRequestTest, DeviceIdsAreBounded) {
  ServiceRequest r = Valid();
  r.gradient.region.device_id = std::string(kMaxDeviceIdBytes, 'g');
  EXPECT_TRUE(ValidateServiceRequest(r).ok());
  r.gradient.region.device_id = std::string(16 << 10, 'g');
  absl::Status st = ValidateServiceRequest(r).status();
  EXPECT_EQ(st.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(st.message().find("device_id is 16384 bytes; use at most 256"), std::string::npos)
      << st;
  r = Valid();
  r.has_projector_region = true;
  r.projector.region = r.gradient.region;
  r.projector.region.device_id = std::string(kMaxDeviceIdBytes + 1, 'p');
  EXPECT_EQ(ValidateServiceRequest(r).status().code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace offloadd::projector
