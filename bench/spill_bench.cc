// Spill tier throughput: writes `blocks` blocks of `block_bytes` from a pool buffer to
// spill files through SpillTier (unpaced, as the daemon moves them: chunks on the spill link,
// O_DIRECT, io_uring or pread/pwrite), then stages them all back, and checks the bytes. Prints
// one JSON line: {"io": ..., "spill_gbps": ..., "stage_gbps": ...}. bench/spill_bench.sh runs it
// next to `dd oflag=direct` on the same directory and prints the ratios (BENCHMARKS.md).
//
// --checksums=0 turns the tier's CRC32C off (SpillOptions::checksums), to measure what it costs;
// "crc_gbps" is Crc32c alone over the same bytes in memory, on one thread, by the wall clock;
// "crc_cpu_gbps" by that thread's CPU time (what the machine's load does not change).
//
//   spill_bench --dir=DIR [--blocks=8 --block_bytes=67108864 --chunk_bytes=8388608
//                          --io_threads=2 --posix=0 --checksums=1]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <future>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "server/base/clock.h"
#include "server/base/crc32c.h"
#include "server/spill/spill_tier.h"

namespace {

// Runs `start(i, done)` for every block at once and waits for all; seconds, or -1 on error.
double RunAll(int blocks, const std::function<void(int, offloadd::spill::SpillTier::Done)>& start) {
  std::vector<std::future<absl::Status>> done;
  const double t0 = offloadd::base::SteadyNowSeconds();
  for (int i = 0; i < blocks; ++i) {
    auto p = std::make_shared<std::promise<absl::Status>>();
    done.push_back(p->get_future());
    start(i, [p](absl::Status st) { p->set_value(st); });
  }
  for (auto& f : done) {
    absl::Status st = f.get();
    if (!st.ok()) {
      std::fprintf(stderr, "spill_bench: %s\n", st.ToString().c_str());
      return -1;
    }
  }
  return offloadd::base::SteadyNowSeconds() - t0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir;
  double blocks = 8, block_bytes = 64 << 20, chunk_bytes = 8 << 20, io_threads = 2, posix = 0,
         checksums = 1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    const size_t eq = a.find('=');
    const std::string k = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    double* num = k == "--blocks" ? &blocks : k == "--block_bytes" ? &block_bytes
                : k == "--chunk_bytes" ? &chunk_bytes : k == "--io_threads" ? &io_threads
                : k == "--posix" ? &posix : k == "--checksums" ? &checksums : nullptr;
    if (k == "--dir") dir = v;
    else if (num == nullptr || !absl::SimpleAtod(v, num)) {
      std::fprintf(stderr, "usage: spill_bench --dir=DIR [--blocks=8 --block_bytes=B "
                           "--chunk_bytes=B --io_threads=2 --posix=0 --checksums=1]\n");
      return 2;
    }
  }
  if (dir.empty()) return 2;
  const uint64_t n = static_cast<uint64_t>(blocks);
  const uint64_t bytes = static_cast<uint64_t>(block_bytes) / 4096 * 4096;
  uint8_t* pool = nullptr;
  if (posix_memalign(reinterpret_cast<void**>(&pool), 4096, n * bytes) != 0) return 1;
  for (uint64_t i = 0; i < n * bytes; i += 8) {
    const uint64_t v = i * 0x9E3779B97F4A7C15ull;
    memcpy(pool + i, &v, 8);
  }
  offloadd::spill::SpillOptions o;
  o.directory = dir;
  o.capacity_bytes = n * offloadd::spill::SpillTier::FileBytes(bytes);
  o.checksums = checksums != 0;
  o.bytes_per_second = -1;  // unpaced: measure the path, not the pacing
  o.io_uring = posix == 0;
  o.chunk_bytes = static_cast<uint64_t>(chunk_bytes);
  o.io_threads = static_cast<uint32_t>(io_threads);
  auto tier = offloadd::spill::SpillTier::Create(o, pool, n * bytes);
  if (!tier.ok()) {
    std::fprintf(stderr, "spill_bench: %s\n", tier.status().ToString().c_str());
    return 1;
  }
  auto extent = [&](int i) { return offloadd::pool::Extent{i * bytes, bytes}; };
  const double spill_s = RunAll(static_cast<int>(n), [&](int i, auto done) {
    (*tier)->TryReserve(bytes);
    (*tier)->Spill(i + 1, extent(i), "bench", std::move(done));
  });
  std::vector<uint8_t> copy(pool, pool + n * bytes);
  memset(pool, 0, n * bytes);
  const double stage_s = RunAll(static_cast<int>(n), [&](int i, auto done) {
    (*tier)->Stage(i + 1, extent(i), offloadd::spill::DiskClass::kPrefetch, "bench",
                   std::move(done));
  });
  const bool same = memcmp(pool, copy.data(), n * bytes) == 0;
  for (uint64_t i = 0; i < n; ++i) (*tier)->Remove(i + 1, bytes);
  if (spill_s < 0 || stage_s < 0 || !same) {
    std::fprintf(stderr, "spill_bench: %s\n", same ? "I/O failed" : "staged bytes differ");
    return 1;
  }
  auto thread_cpu = [] {
    timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
  };
  const double c0 = offloadd::base::SteadyNowSeconds(), cpu0 = thread_cpu();
  volatile uint32_t crc = offloadd::base::Crc32c(pool, n * bytes);
  (void)crc;
  const double crc_s = offloadd::base::SteadyNowSeconds() - c0;
  const double crc_cpu_s = thread_cpu() - cpu0;
  std::printf("{\"io\": \"%s\", \"checksums\": %s, \"bytes\": %lu, \"spill_gbps\": %.3f, "
              "\"stage_gbps\": %.3f, \"crc_gbps\": %.2f, \"crc_cpu_gbps\": %.2f, "
              "\"crc\": \"%s\"}\n",
              (*tier)->stats().io.c_str(), checksums != 0 ? "true" : "false",
              static_cast<unsigned long>(n * bytes), n * bytes / spill_s / 1e9,
              n * bytes / stage_s / 1e9, n * bytes / crc_s / 1e9,
              n * bytes / std::max(crc_cpu_s, 1e-9) / 1e9,
              offloadd::base::Crc32cHardware() ? "sse4.2" : "portable");
  free(pool);
  return 0;
}
