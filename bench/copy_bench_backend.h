// What copy_sim_bench drives its workload through: the simulated GPUs (SimCudaApi, in
// copy_sim_bench.cc) or, for calibration on a GPU machine (tests/gpu/run.sh), the real CUDA
// runtime (copy_bench_cuda.cc, built only with the CUDA toolkit). Same engine, schedulers and
// workload either way, so the two print the same figures for the same configuration.
#ifndef OFFLOADD_BENCH_COPY_BENCH_BACKEND_H_
#define OFFLOADD_BENCH_COPY_BENCH_BACKEND_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/copy/copy_engine.h"
#include "server/copy/cuda/cuda_api.h"

namespace offloadd::bench {

class CopyBenchBackend {
 public:
  virtual ~CopyBenchBackend() = default;
  // A CudaApi for one CudaCopyEngine (the backend outlives it).
  virtual std::unique_ptr<copy::CudaApi> Borrow() = 0;
  // A device allocation of `size_bytes` on GPU `gpu` (0-based); returns the IPC handle the
  // engine's OpenRegion takes.
  virtual std::string AddAllocation(int gpu, uint64_t size_bytes) = 0;
  virtual std::string DeviceUuid(int gpu) = 0;
  // Host buffer number `slot` of GPU `gpu`, `bytes` long, on NUMA node `node` where the backend
  // places buffers by node (the simulator; the real one ignores `node`).
  virtual uint8_t* HostBuffer(int gpu, int slot, int node, uint64_t bytes) = 0;
  // Bytes the GPU's engine of `direction` has moved: completed copies (simulator) or copies
  // issued to the driver (real: at most the chunks in flight ahead of completion).
  virtual uint64_t BytesDone(int gpu, copy::Direction direction) = 0;
  // Host seconds the simulator charged as driver cost; 0 for the real driver.
  virtual double DriverHostSeconds() = 0;
};

// The real CUDA runtime, `gpus` devices from ordinal 0. UNAVAILABLE when there is no usable
// driver or too few GPUs (the message says which); UNIMPLEMENTED in builds without the CUDA
// toolkit (OFFLOADD_HAVE_CUDA undefined).
absl::StatusOr<std::unique_ptr<CopyBenchBackend>> NewRealCudaBenchBackend(int gpus);

}  // namespace offloadd::bench

#endif  // OFFLOADD_BENCH_COPY_BENCH_BACKEND_H_
