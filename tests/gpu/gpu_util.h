// Helpers shared by the GPU check binaries (gpu_e2e.cc, gpu_probes.cc), run by tests/gpu/run.sh
// against a daemon with backend "cuda". Output conventions of every check: "PASS ...",
// "FAIL: ..." (exit 1), "SKIPPED: ..." (exit 0, no driver or GPU), "FIGURE <name> <value> <unit>".
#ifndef OFFLOADD_TESTS_GPU_GPU_UTIL_H_
#define OFFLOADD_TESTS_GPU_GPU_UTIL_H_

#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "client/cuda_export.h"
#include "client/offloadd_client.h"

namespace offloadd::gpucheck {

// Prints "FAIL: <what>" and exits 1.
[[noreturn]] void Fail(const std::string& what);

// Fail unless the call succeeded, naming `what` and the error.
void Check(cudaError_t e, const char* what);
void Check(const absl::Status& st, const char* what);
template <typename T>
T Check(absl::StatusOr<T> v, const char* what) {
  if (!v.ok()) Fail(std::string(what) + ": " + std::string(v.status().ToString()));
  return *std::move(v);
}

// Prints "SKIPPED: ..." and returns false when there is no usable driver or GPU; otherwise makes
// device 0 current and returns true.
bool UsableGpu();

// Checksum (kernels/checksum_ref.h) of device bytes [d, d + bytes), computed on `s` and read
// back; `d_result` is one device uint64 of scratch.
uint64_t DeviceChecksum(const uint8_t* d, uint64_t bytes, uint64_t* d_result, cudaStream_t s);

// One client process's session: a cudaMalloc of `bytes` registered with the daemon as one
// region (IPC handle of its base).
struct Session {
  std::unique_ptr<client::Client> client;
  client::CudaExporter exporter{client::NewRealClientCudaApi()};
  uint64_t region_id = 0;
  uint8_t* base = nullptr;
  uint64_t bytes = 0;
};

// Allocates `bytes` on the device, connects to `socket` as `name` and registers the allocation.
// Fails (exit 1) unless the daemon runs backend "cuda".
void Open(const std::string& socket, const std::string& name, uint64_t bytes, Session* s);

// A reload whose bytes are consumed on the device: the daemon records `event` on its H2D stream
// after the last chunk, and ReloadDone says only that it has been recorded (proto/offload.proto),
// so a consumer must wait on the event, not on the answer. An event the daemon never records
// (a daemon that answers after the copy) waits for nothing.
struct DoneEvent {
  client::IpcEvent event;
  explicit DoneEvent(Session* s) : session(s) {
    event = Check(s->exporter.AcquireEvent(), "AcquireEvent (reload done event)");
  }
  ~DoneEvent() { session->exporter.ReleaseEvent(event); }
  DoneEvent(const DoneEvent&) = delete;
  DoneEvent& operator=(const DoneEvent&) = delete;
  const std::string& handle() const { return event.handle; }
  // Makes `stream` wait for the copy, or (stream == nullptr) the host.
  void Wait(cudaStream_t stream) const {
    if (stream == nullptr) {
      Check(cudaEventSynchronize(static_cast<cudaEvent_t>(event.event)), "cudaEventSynchronize");
    } else {
      Check(cudaStreamWaitEvent(stream, static_cast<cudaEvent_t>(event.event), 0),
            "cudaStreamWaitEvent (reload done event)");
    }
  }

 private:
  Session* session;
};

// Seconds since an arbitrary start (CLOCK_MONOTONIC).
double NowSeconds();

}  // namespace offloadd::gpucheck

#endif  // OFFLOADD_TESTS_GPU_GPU_UTIL_H_
