// CreateCudaCopyEngine over the real CUDA runtime (built only with the CUDA toolkit).
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "server/copy/cuda/cuda_engine.h"

namespace offloadd::copy {

absl::StatusOr<std::unique_ptr<CopyEngine>> CreateCudaCopyEngine(CudaEngineOptions options) {
  std::unique_ptr<CudaApi> api = NewRealCudaApi();
  // Fail at start-up, not at the first registration, on a node without a driver or GPU.
  // Listing devices creates no context.
  auto devices = api->ListDevices();
  if (!devices.ok()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "backend \"cuda\": no usable CUDA driver or device (%s): install the NVIDIA driver, "
        "expose the GPUs to offloadd (no CUDA_VISIBLE_DEVICES restriction; in containers the "
        "NVIDIA runtime), or use backend: \"shm\"",
        devices.status().message()));
  }
  if (devices->empty()) {
    return absl::FailedPreconditionError(
        "backend \"cuda\": the driver reports no GPU: expose the GPUs to offloadd or use "
        "backend: \"shm\"");
  }
  for (const CudaDeviceInfo& d : *devices) {
    LOG(INFO) << "cuda: GPU " << d.ordinal << " " << d.uuid << " " << d.name << " "
              << d.pci_bus_id << " NUMA node " << PciNumaNode(d.pci_bus_id) << " "
              << d.total_bytes << " bytes (no context yet)";
  }
  return std::unique_ptr<CopyEngine>(new CudaCopyEngine(std::move(api), options));
}

}  // namespace offloadd::copy
