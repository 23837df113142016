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
// --paired_rounds=N measures the CRC's stage-back cost alone, in one process: two tiers on
// DIR/off and DIR/on (checksums off and on) hold the same blocks, and each round stages all of
// them back from both, back to back, the order swapped every round (off-on, on-off, ...), so a
// disk whose rate drifts costs both sides alike. Prints {"paired_rounds": N,
// "stage_on_over_off_median": ..., "stage_on_over_off_summed": ..., ...} (median of the rounds'
// ratios; total bytes over total seconds on each side).
//
//   spill_bench --dir=DIR [--blocks=8 --block_bytes=67108864 --chunk_bytes=8388608
//                          --io_threads=2 --posix=0 --checksums=1 --paired_rounds=0]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <future>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/numbers.h"
#include "common/base/clock.h"
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

struct BenchArgs {
  std::string dir;
  uint64_t blocks = 8, bytes = 64 << 20, chunk_bytes = 8 << 20, io_threads = 2;
  bool posix = false, checksums = true;
};

absl::StatusOr<std::unique_ptr<offloadd::spill::SpillTier>> MakeTier(const BenchArgs& a,
                                                                      const std::string& dir,
                                                                      bool checksums,
                                                                      uint8_t* pool) {
  offloadd::spill::SpillOptions o;
  o.directory = dir;
  o.capacity_bytes = a.blocks * offloadd::spill::SpillTier::FileBytes(a.bytes);
  o.checksums = checksums;
  o.bytes_per_second = -1;  // unpaced: measure the path, not the pacing
  o.io_uring = !a.posix;
  o.chunk_bytes = a.chunk_bytes;
  o.io_threads = static_cast<uint32_t>(a.io_threads);
  return offloadd::spill::SpillTier::Create(o, pool, a.blocks * a.bytes);
}

// Seconds to spill (write) or stage back (read) every block through `tier`; -1 on error.
double MoveAll(offloadd::spill::SpillTier& tier, const BenchArgs& a, bool spill) {
  return RunAll(static_cast<int>(a.blocks), [&](int i, offloadd::spill::SpillTier::Done done) {
    const offloadd::pool::Extent e{i * a.bytes, a.bytes};
    if (spill) {
      tier.TryReserve(a.bytes);
      tier.Spill(i + 1, e, "bench", std::move(done));
    } else {
      tier.Stage(i + 1, e, offloadd::spill::DiskClass::kPrefetch, "bench", std::move(done));
    }
  });
}

// The --paired_rounds mode (see the top of this file). Returns the exit status.
int PairedRounds(const BenchArgs& a, int rounds, uint8_t* pool) {
  std::unique_ptr<offloadd::spill::SpillTier> tiers[2];
  for (int c = 0; c < 2; ++c) {
    auto t = MakeTier(a, a.dir + (c ? "/on" : "/off"), c == 1, pool);
    if (!t.ok()) {
      std::fprintf(stderr, "spill_bench: %s\n", t.status().ToString().c_str());
      return 1;
    }
    tiers[c] = *std::move(t);
    if (MoveAll(*tiers[c], a, true) < 0) return 1;
  }
  const std::vector<uint8_t> copy(pool, pool + a.blocks * a.bytes);
  std::vector<double> ratios;
  double total[2] = {0, 0};
  for (int r = 0; r < rounds; ++r) {
    double s[2];
    for (int k = 0; k < 2; ++k) {
      const int c = (r % 2 == 0) ? k : 1 - k;
      memset(pool, 0, a.blocks * a.bytes);
      s[c] = MoveAll(*tiers[c], a, false);
      if (s[c] < 0 || memcmp(pool, copy.data(), copy.size()) != 0) {
        std::fprintf(stderr, "spill_bench: %s\n", s[c] < 0 ? "I/O failed" : "bytes differ");
        return 1;
      }
      total[c] += s[c];
    }
    ratios.push_back(s[0] / s[1]);  // throughput on / off
  }
  for (int c = 0; c < 2; ++c) {
    for (uint64_t i = 0; i < a.blocks; ++i) tiers[c]->Remove(i + 1, a.bytes);
  }
  std::sort(ratios.begin(), ratios.end());
  const size_t m = ratios.size();
  const double median = m % 2 ? ratios[m / 2] : (ratios[m / 2 - 1] + ratios[m / 2]) / 2;
  const double gb = static_cast<double>(rounds * a.blocks * a.bytes) / 1e9;
  std::printf("{\"paired_rounds\": %d, \"bytes_per_round\": %lu, \"stage_off_gbps\": %.3f, "
              "\"stage_on_gbps\": %.3f, \"stage_on_over_off_summed\": %.3f, "
              "\"stage_on_over_off_median\": %.3f, \"round_min\": %.3f, \"round_max\": %.3f}\n",
              rounds, static_cast<unsigned long>(a.blocks * a.bytes), gb / total[0],
              gb / total[1], total[0] / total[1], median, ratios.front(), ratios.back());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  double blocks = 8, block_bytes = 64 << 20, chunk_bytes = 8 << 20, io_threads = 2, posix = 0,
         checksums = 1, paired_rounds = 0;
  BenchArgs a;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    const size_t eq = arg.find('=');
    const std::string k = arg.substr(0, eq);
    const std::string v = eq == std::string::npos ? "" : arg.substr(eq + 1);
    double* num = k == "--blocks" ? &blocks : k == "--block_bytes" ? &block_bytes
                : k == "--chunk_bytes" ? &chunk_bytes : k == "--io_threads" ? &io_threads
                : k == "--posix" ? &posix : k == "--checksums" ? &checksums
                : k == "--paired_rounds" ? &paired_rounds : nullptr;
    if (k == "--dir") a.dir = v;
    else if (num == nullptr || !absl::SimpleAtod(v, num)) {
      std::fprintf(stderr, "usage: spill_bench --dir=DIR [--blocks=8 --block_bytes=B "
                           "--chunk_bytes=B --io_threads=2 --posix=0 --checksums=1 "
                           "--paired_rounds=0]\n");
      return 2;
    }
  }
  if (a.dir.empty()) return 2;
  a.blocks = static_cast<uint64_t>(blocks);
  a.bytes = static_cast<uint64_t>(block_bytes) / 4096 * 4096;
  a.chunk_bytes = static_cast<uint64_t>(chunk_bytes);
  a.io_threads = static_cast<uint64_t>(io_threads);
  a.posix = posix != 0;
  a.checksums = checksums != 0;
  const uint64_t total = a.blocks * a.bytes;
  uint8_t* pool = nullptr;
  if (posix_memalign(reinterpret_cast<void**>(&pool), 4096, total) != 0) return 1;
  for (uint64_t i = 0; i < total; i += 8) {
    const uint64_t v = i * 0x9E3779B97F4A7C15ull;
    memcpy(pool + i, &v, 8);
  }
  if (paired_rounds > 0) {
    const int rc = PairedRounds(a, static_cast<int>(paired_rounds), pool);
    free(pool);
    return rc;
  }
  auto tier = MakeTier(a, a.dir, a.checksums, pool);
  if (!tier.ok()) {
    std::fprintf(stderr, "spill_bench: %s\n", tier.status().ToString().c_str());
    return 1;
  }
  const double spill_s = MoveAll(**tier, a, true);
  std::vector<uint8_t> copy(pool, pool + total);
  memset(pool, 0, total);
  const double stage_s = MoveAll(**tier, a, false);
  const bool same = memcmp(pool, copy.data(), total) == 0;
  for (uint64_t i = 0; i < a.blocks; ++i) (*tier)->Remove(i + 1, a.bytes);
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
  volatile uint32_t crc = offloadd::base::Crc32c(pool, total);
  (void)crc;
  const double crc_s = offloadd::base::SteadyNowSeconds() - c0;
  const double crc_cpu_s = thread_cpu() - cpu0;
  std::printf("{\"io\": \"%s\", \"checksums\": %s, \"bytes\": %lu, \"spill_gbps\": %.3f, "
              "\"stage_gbps\": %.3f, \"crc_gbps\": %.2f, \"crc_cpu_gbps\": %.2f, "
              "\"crc\": \"%s\"}\n",
              (*tier)->stats().io.c_str(), a.checksums ? "true" : "false",
              static_cast<unsigned long>(total), total / spill_s / 1e9, total / stage_s / 1e9,
              total / crc_s / 1e9, total / std::max(crc_cpu_s, 1e-9) / 1e9,
              offloadd::base::Crc32cHardware() ? "sse4.2" : "portable");
  free(pool);
  return 0;
}
