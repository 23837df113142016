// The CRC32Cs of a spill tier's transfers, computed off the spill link's I/O workers.
//
// Why not on the worker: the pieces of a chunk read with io_uring complete close together at
// the end of the chunk's read (the device serves them in parallel), so a worker that
// checksummed each piece as it landed still left the disk without its next chunk for most of
// the chunk's CRC time. Measured with `spill_bench --paired_rounds=20` (8 x 64 MiB, 8 MiB
// chunks, two workers, a virtual disk at 3.9 GB/s): the CRC on the worker cost 10-11 % of
// stage-back throughput, a do-nothing callback 2 %, a busy-wait as long as the CRC 15 %. So a
// worker hands the bytes to checksum threads (base::WorkerThreads) and goes on to its next
// chunk; the transfer's end waits for the last of its checksums (ChunkChecksums::WhenSettled)
// before it reports.
//
// Thread-safe.
#ifndef OFFLOADD_SERVER_SPILL_CHUNK_CHECKSUMS_H_
#define OFFLOADD_SERVER_SPILL_CHUNK_CHECKSUMS_H_

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <utility>

#include "common/base/mutex.h"
#include "server/base/worker_threads.h"

namespace offloadd::spill {

// The CRC32Cs of one transfer's byte ranges (chunks run on several workers and their pieces
// complete in any order), joined in offset order at the end with Crc32cCombine.
class ChunkChecksums : public std::enable_shared_from_this<ChunkChecksums> {
 public:
  // `workers` null: each CRC is computed on the thread that calls Compute.
  explicit ChunkChecksums(base::WorkerThreads* workers) : workers_(workers) {}

  // Queues the CRC32C of [data, data + bytes) as the transfer's bytes [offset, offset + bytes).
  // The bytes must stay as they are, and mapped, until WhenSettled's `then` runs. Hold the
  // object by std::shared_ptr (the queued job keeps it alive).
  void Compute(uint64_t offset, const uint8_t* data, uint64_t bytes) EXCLUDES(mu_);
  // Runs `then` once every CRC queued so far is computed: on this thread at once when none is
  // pending, else on the worker that computes the last one. Call once, after the transfer's
  // last Compute (a later Compute is not waited for).
  void WhenSettled(std::function<void()> then) EXCLUDES(mu_);
  // The CRC32C of [0, total) when the computed ranges tile it exactly; false otherwise (a
  // range missing or overlapping: a chunk failed, or a CRC is still pending).
  bool Joined(uint64_t total, uint32_t* crc) EXCLUDES(mu_);

 private:
  void Add(uint64_t offset, uint64_t bytes, uint32_t crc) EXCLUDES(mu_);

  base::WorkerThreads* const workers_;
  base::Mutex mu_;
  std::map<uint64_t, std::pair<uint64_t, uint32_t>> pieces_ GUARDED_BY(mu_);  // offset -> bytes, crc
  uint64_t pending_ GUARDED_BY(mu_) = 0;
  std::function<void()> then_ GUARDED_BY(mu_);
};

}  // namespace offloadd::spill

#endif  // OFFLOADD_SERVER_SPILL_CHUNK_CHECKSUMS_H_
