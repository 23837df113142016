// Runs the pack/unpack and checksum kernels on the first GPU and compares every byte and value
// with the CPU references. Prints "SKIPPED: ..." and exits 0 when no driver or GPU is usable;
// prints "FAIL: ..." and exits 1 on any mismatch; "PASS ..." with a gather rate otherwise.
#include <cuda_runtime.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#include "kernels/kernels.h"

namespace {

using offloadd::kernels::ChecksumRef;
using offloadd::kernels::PackSegment;

#define CHECK_CUDA(call)                                                                       \
  do {                                                                                         \
    cudaError_t e_ = (call);                                                                   \
    if (e_ != cudaSuccess) {                                                                   \
      std::printf("FAIL: %s: %s (%d)\n", #call, cudaGetErrorString(e_), static_cast<int>(e_)); \
      return 1;                                                                                \
    }                                                                                          \
  } while (0)

int CheckPack(std::mt19937& rng) {
  // Mixed sizes; odd byte offsets on some tensors to exercise the byte path.
  std::vector<uint64_t> sizes = {1, 16, 17, 4096, 65536, 65537, 1 << 20, 3, 1000000, 256};
  const uint64_t slack = 16;
  std::vector<uint8_t*> bases;
  std::vector<uint64_t> ptrs;
  std::vector<std::vector<uint8_t>> host;
  uint64_t max_bytes = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    uint8_t* d = nullptr;
    CHECK_CUDA(cudaMalloc(&d, sizes[i] + slack));
    bases.push_back(d);
    const uint64_t shift = i % 3 == 1 ? 1 : 0;
    ptrs.push_back(reinterpret_cast<uint64_t>(d + shift));
    host.emplace_back(sizes[i]);
    for (auto& b : host.back()) b = static_cast<uint8_t>(rng());
    CHECK_CUDA(cudaMemcpy(d + shift, host.back().data(), sizes[i], cudaMemcpyHostToDevice));
    max_bytes = std::max(max_bytes, sizes[i]);
  }
  auto plan = offloadd::kernels::PlanPack(sizes, 256);
  auto segs = offloadd::kernels::MakeSegments(ptrs, sizes, plan);
  // The reference gathers from host copies.
  std::vector<PackSegment> host_segs = segs;
  for (size_t i = 0; i < sizes.size(); ++i)
    host_segs[i].ptr = reinterpret_cast<uint64_t>(host[i].data());
  std::vector<uint8_t> want(plan.total_bytes, 0), got(plan.total_bytes, 1);
  offloadd::kernels::GatherRef(host_segs.data(), host_segs.size(), want.data());

  PackSegment* d_segs = nullptr;
  uint8_t* d_staging = nullptr;
  CHECK_CUDA(cudaMalloc(&d_segs, segs.size() * sizeof(PackSegment)));
  CHECK_CUDA(cudaMalloc(&d_staging, plan.total_bytes));
  CHECK_CUDA(cudaMemset(d_staging, 0, plan.total_bytes));
  CHECK_CUDA(
      cudaMemcpy(d_segs, segs.data(), segs.size() * sizeof(PackSegment), cudaMemcpyHostToDevice));
  CHECK_CUDA(offloadd::kernels::LaunchGather(d_segs, segs.size(), max_bytes, d_staging, 0));
  CHECK_CUDA(cudaMemcpy(got.data(), d_staging, plan.total_bytes, cudaMemcpyDeviceToHost));
  if (got != want) {
    std::printf("FAIL: gather differs from GatherRef\n");
    return 1;
  }
  // Scatter into zeroed tensors and compare with the originals.
  for (size_t i = 0; i < sizes.size(); ++i) {
    CHECK_CUDA(cudaMemset(bases[i], 0, sizes[i] + slack));
  }
  CHECK_CUDA(offloadd::kernels::LaunchScatter(d_segs, segs.size(), max_bytes, d_staging, 0));
  for (size_t i = 0; i < sizes.size(); ++i) {
    std::vector<uint8_t> back(sizes[i]);
    CHECK_CUDA(cudaMemcpy(back.data(), reinterpret_cast<void*>(ptrs[i]), sizes[i],
                          cudaMemcpyDeviceToHost));
    if (back != host[i]) {
      std::printf("FAIL: scatter of tensor %zu (%llu bytes) differs\n", i,
                  static_cast<unsigned long long>(sizes[i]));
      return 1;
    }
  }
  // Rate of gathering 4,096 tensors of 64 KiB (256 MiB) into one staging buffer.
  const uint32_t n = 4096;
  const uint64_t each = 64 << 10;
  uint8_t* d_src = nullptr;
  uint8_t* d_dst = nullptr;
  CHECK_CUDA(cudaMalloc(&d_src, n * each));
  CHECK_CUDA(cudaMalloc(&d_dst, n * each));
  std::vector<PackSegment> many(n);
  for (uint32_t i = 0; i < n; ++i) {
    many[i] = PackSegment{reinterpret_cast<uint64_t>(d_src + i * each), i * each, each};
  }
  PackSegment* d_many = nullptr;
  CHECK_CUDA(cudaMalloc(&d_many, n * sizeof(PackSegment)));
  CHECK_CUDA(cudaMemcpy(d_many, many.data(), n * sizeof(PackSegment), cudaMemcpyHostToDevice));
  CHECK_CUDA(offloadd::kernels::LaunchGather(d_many, n, each, d_dst, 0));
  CHECK_CUDA(cudaDeviceSynchronize());
  auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < 10; ++r)
    CHECK_CUDA(offloadd::kernels::LaunchGather(d_many, n, each, d_dst, 0));
  CHECK_CUDA(cudaDeviceSynchronize());
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("gather: %u tensors x %llu KiB: %.1f GB/s (device read+write counted once)\n", n,
              static_cast<unsigned long long>(each >> 10), 10.0 * n * each / s / 1e9);
  for (uint8_t* b : bases) cudaFree(b);
  cudaFree(d_segs);
  cudaFree(d_staging);
  cudaFree(d_src);
  cudaFree(d_dst);
  cudaFree(d_many);
  return 0;
}

int CheckChecksum(std::mt19937& rng) {
  const uint64_t sizes[] = {0, 1, 7, 8, 9, 4095, 1 << 20, (64 << 20) + 5};
  uint64_t* d_result = nullptr;
  CHECK_CUDA(cudaMalloc(&d_result, sizeof(uint64_t)));
  for (uint64_t size : sizes) {
    for (uint64_t shift : {0, 3}) {
      std::vector<uint8_t> h(size);
      for (auto& b : h) b = static_cast<uint8_t>(rng());
      uint8_t* d = nullptr;
      CHECK_CUDA(cudaMalloc(&d, size + 8));
      if (size) CHECK_CUDA(cudaMemcpy(d + shift, h.data(), size, cudaMemcpyHostToDevice));
      CHECK_CUDA(offloadd::kernels::LaunchChecksum(d + shift, size, d_result, 0));
      uint64_t got = 0;
      CHECK_CUDA(cudaMemcpy(&got, d_result, sizeof(got), cudaMemcpyDeviceToHost));
      const uint64_t want = ChecksumRef(h.data(), size);
      cudaFree(d);
      if (got != want) {
        std::printf("FAIL: checksum of %llu bytes at +%llu: device %016llx, reference %016llx\n",
                    static_cast<unsigned long long>(size), static_cast<unsigned long long>(shift),
                    static_cast<unsigned long long>(got), static_cast<unsigned long long>(want));
        return 1;
      }
    }
  }
  cudaFree(d_result);
  return 0;
}

}  // namespace

int main() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess || n == 0) {
    std::printf("SKIPPED: no CUDA driver or GPU (error %d: %s)\n", static_cast<int>(e),
                e != cudaSuccess ? cudaGetErrorString(e) : "no device");
    return 0;
  }
  std::mt19937 rng(42);
  if (int rc = CheckPack(rng)) return rc;
  if (int rc = CheckChecksum(rng)) return rc;
  std::printf("PASS kernels: gather/scatter and checksum match the CPU references\n");
  return 0;
}
