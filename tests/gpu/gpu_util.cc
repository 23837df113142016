#include "tests/gpu/gpu_util.h"

#include <cstdio>
#include <cstdlib>

#include "common/base/clock.h"
#include "kernels/kernels.h"

namespace offloadd::gpucheck {

void Fail(const std::string& what) {
  std::printf("FAIL: %s\n", what.c_str());
  std::fflush(stdout);
  std::exit(1);
}

void Check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) Fail(std::string(what) + ": " + cudaGetErrorString(e));
}

void Check(const absl::Status& st, const char* what) {
  if (!st.ok()) Fail(std::string(what) + ": " + st.ToString());
}

bool UsableGpu() {
  int count = 0;
  cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess || count == 0) {
    std::printf("SKIPPED: no CUDA driver or GPU (error %d: %s)\n", static_cast<int>(e),
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return false;
  }
  Check(cudaSetDevice(0), "cudaSetDevice");
  return true;
}

uint64_t DeviceChecksum(const uint8_t* d, uint64_t bytes, uint64_t* d_result, cudaStream_t s) {
  Check(kernels::LaunchChecksum(d, bytes, d_result, s), "LaunchChecksum");
  uint64_t v = 0;
  Check(cudaMemcpyAsync(&v, d_result, sizeof(v), cudaMemcpyDeviceToHost, s), "checksum copy");
  Check(cudaStreamSynchronize(s), "sync");
  return v;
}

void Open(const std::string& socket, const std::string& name, uint64_t bytes, Session* s) {
  Check(cudaMalloc(&s->base, bytes), "cudaMalloc");
  s->bytes = bytes;
  auto exported = Check(s->exporter.Export(reinterpret_cast<uint64_t>(s->base), bytes), "Export");
  client::ClientOptions o;
  o.socket_path = socket;
  o.client_name = name;
  o.device_id = exported.device_uuid;
  s->client = Check(client::Client::Connect(o), "Connect");
  if (s->client->backend() != "cuda") Fail("the daemon runs backend " + s->client->backend());
  client::RegionHandle h;
  h.cuda_ipc_handle = exported.ipc_handle;
  h.size_bytes = exported.allocation_bytes;
  s->region_id = Check(s->client->RegisterRegion(h), "RegisterRegion");
}

double NowSeconds() { return base::SteadyNowSeconds(); }

}  // namespace offloadd::gpucheck
