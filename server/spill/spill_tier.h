// SpillTier: the second tier below the pool — one file per spilled block in a local directory
// (NVMe), written from and read back into pool extents with O_DIRECT, through DiskIo (io_uring,
// or pread/pwrite where io_uring is unavailable; chosen at start-up and logged).
//
// The disk is a link of the scheduler: every spill (pool -> file) and stage-back (file -> pool)
// is a sched::Transfer on one LinkScheduler named "spill" (one queue for both directions, since
// a disk shares its bandwidth between reads and writes), cut into chunks of `chunk_bytes`,
// classes URGENT (a reload waits on it; Promote raises a queued PREFETCH stage-back to it) >
// PREFETCH (stage-back ahead of need) > SPILL (the
// scheduler's OFFLOAD class, with its minimum share `spill_min_share`), DRR over flows (the
// store passes the owning session; the transfer's owner_id is the block), paced at `bytes_per_second` so the queue forms where the
// priorities apply rather than inside the device.
//
// Layout and alignment: a block's file is a 4096-byte header, then its extent rounded up to 4096
// bytes. The header names the block (id, data bytes) and holds the CRC32C (base/crc32c.h,
// hardware-accelerated) of the block id and size followed by the data, and a CRC32C of itself.
// A spill computes the data's CRC chunk by chunk as it writes (pieces joined with
// Crc32cCombine), a stage-back piece by piece as it reads, on threads beside the link's I/O
// workers (chunk_checksums.h: a worker never leaves the disk idle while it checksums), and
// the transfer reports only when its last CRC is in; the stage-back answers DATA_LOSS for that block
// alone when the header is not valid (first 4 KiB overwritten), names another block or size (a
// file swapped or replaced), or the CRC differs from the header's or from the one this daemon
// recorded when it wrote the file (bytes changed on disk), or the header says the file has no
// data CRC (a daemon writes one into every file, so its header was rewritten): never wrong
// bytes with OK. Chunks
// are 4096-aligned in the file; a chunk whose pool bytes are 4096-aligned in memory and whole is
// moved directly between the extent and the file; otherwise (an extent not aligned in the
// arena, or the tail of an extent that is not a multiple of 4096) through an aligned bounce
// buffer of one chunk. With the spill tier on, the store sizes extents in multiples of 4096, so
// every extent of a pool that starts aligned (arenas are mmap'ed) is moved directly.
//
// Capacity: TryReserve/Remove account the bytes of files (the rounded extents); the store
// reserves before it spills, so "disk full" is known before any byte moves. A write that still
// fails (ENOSPC from the file system) reports RESOURCE_EXHAUSTED and the block stays in the pool.
//
// Failure: a stage-back of a file that was removed, truncated, damaged, swapped or replaced
// (under the daemon), or that is a symbolic link, gets DATA_LOSS naming the file; nothing else
// is affected.
//
// Ownership: the directory must be owned by the daemon's effective uid and not writable by
// group or others (FAILED_PRECONDITION at Create otherwise; CheckDirectory for
// --check-config), since whoever can write it can replace or read the blocks. Files are
// opened relative to a descriptor of the directory taken at Create, with O_NOFOLLOW; a spill
// file is created with O_EXCL (a stale file or link of that name is unlinked first).
//
// Durability: a spill reports OK only after the file's bytes are synced (fdatasync), so the
// store may then record the block as spilled in the shared pool and free its extent.
//
// Start-up (Create): the directory is created if missing and locked (flock on
// <directory>/offloadd.lock for the tier's life: a second daemon on the same directory is refused
// with FAILED_PRECONDITION instead of removing the first one's files); "*.spill" files of a previous daemon
// are kept until the store has adopted the blocks recorded as spilled (AdoptFile), then the
// rest are removed (RemoveFilesExcept; docs/spill.md); O_DIRECT support is probed (tmpfs before Linux 6.6 lacks it: FAILED_PRECONDITION); capacity 0 means 90%
// of the file system's free space; bytes_per_second 0 means measured (write, then read back,
// `measure_bytes` with O_DIRECT; the smaller rate).
//
// Thread-safety: every method is thread-safe. `done` callbacks run on the spill link's worker
// threads or, with checksums, the checksum threads (or inline in Spill/Stage when the transfer
// is refused), without locks of this class.
#ifndef OFFLOADD_SERVER_SPILL_SPILL_TIER_H_
#define OFFLOADD_SERVER_SPILL_SPILL_TIER_H_

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "server/pool/extent_allocator.h"
#include "server/sched/link_scheduler.h"
#include "server/spill/chunk_checksums.h"
#include "server/spill/disk_io.h"

namespace offloadd::spill {

struct SpillOptions {
  std::string directory;  // "" = no spill tier
  uint64_t capacity_bytes = 0;  // 0 = 90% of the file system's free space at start-up
  // Disk link pacing in bytes/s; 0 = measured at start-up; < 0 = unpaced (not measured).
  double bytes_per_second = 0;
  bool io_uring = true;  // false: pread/pwrite
  uint64_t chunk_bytes = 8ull << 20;  // rounded up to 4096
  uint32_t io_threads = 2;  // spill link workers (chunks in flight)
  double spill_min_share = 0.2;  // of the disk's bytes for spills while reloads also wait
  uint64_t measure_bytes = 64ull << 20;
  // CRC32C of every block's data, verified at stage-back (the header is written either way).
  // Off only for the benchmark that measures its cost (bench/spill_bench).
  bool checksums = true;
};

enum class DiskClass { kUrgent, kPrefetch, kSpill };

struct SpillStats {
  std::string io;  // "io_uring" / "posix"
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;  // reserved for files (rounded extents)
  uint64_t files = 0;
  uint64_t spill_bytes_total = 0;  // written by successful spills
  uint64_t stage_bytes_total = 0;  // read by successful stage-backs
  double bytes_per_second = 0;
  bool bytes_per_second_measured = false;
  sched::LinkSchedulerStats link;
};

class SpillTier {
 public:
  using Done = std::function<void(absl::Status)>;

  // `pool_base`: the arena's first byte (extents are offsets from it), `pool_bytes` its size.
  // Errors: INVALID_ARGUMENT for an empty directory; FAILED_PRECONDITION when the directory
  // cannot be created or written, or its file system refuses O_DIRECT (the message says which).
  static absl::StatusOr<std::unique_ptr<SpillTier>> Create(const SpillOptions& options,
                                                           uint8_t* pool_base,
                                                           uint64_t pool_bytes);
  ~SpillTier();  // Shutdown()

  // Whether files in `directory` (created if missing) open with O_DIRECT; false on tmpfs. Tests
  // skip where it is false.
  static bool DirectIoSupported(const std::string& directory);
  // --check-config: OK when `directory` is missing (Create makes it, mode 0700) or is a
  // directory owned by this process's effective uid, not writable by group or others, whose
  // file system takes O_DIRECT, and whose lock file (if any) start-up can open and lock; else
  // FAILED_PRECONDITION saying what to change. Writes nothing.
  static absl::Status CheckDirectory(const std::string& directory);
  // --check-config's note on a directory CheckDirectory accepts, "" when none: that it does not
  // exist yet (start-up creates it), or that a running offloadd holds its lock (a daemon
  // started now on it is refused until that one stops). Writes nothing.
  static std::string DirectoryNote(const std::string& directory);

  static constexpr uint64_t kHeaderBytes = 4096;
  // Bytes a block of extent `extent_bytes` takes on disk: the header, then the extent rounded
  // up to 4096.
  static uint64_t FileBytes(uint64_t extent_bytes);
  // The extent rounded up to 4096: what a block's data takes in its file (the store sizes
  // extents so with the tier on).
  static uint64_t DataBytes(uint64_t extent_bytes);
  // Reserves FileBytes(extent_bytes) of capacity; false when it does not fit (disk full).
  bool TryReserve(uint64_t extent_bytes) EXCLUDES(mu_);
  // Writes `extent` of the pool to the block's file (class SPILL); `done` gets OK, or the error
  // (RESOURCE_EXHAUSTED when the file system is full; UNAVAILABLE after Shutdown). On error the
  // file may exist partially: call Remove.
  void Spill(uint64_t block_id, pool::Extent extent, const std::string& flow, Done done);
  // Reads the block's file into `extent` of the pool (class URGENT or PREFETCH). DATA_LOSS when
  // the file is missing or shorter than the block.
  void Stage(uint64_t block_id, pool::Extent extent, DiskClass cls, const std::string& flow,
             Done done);
  // Raises the block's stage-back to URGENT: a PREFETCH read still queued on the disk link
  // goes before every queued PREFETCH and SPILL transfer (a reload now waits on it); one whose
  // Stage call has not reached the link yet is submitted URGENT. Chunks already being read are
  // not affected. Call only while a stage-back of the block is under way.
  void Promote(uint64_t block_id) EXCLUDES(mu_);
  // Takes over the file a previous daemon wrote for the block (adoption): its capacity is
  // counted as reserved whatever the result, so Remove returns it. DATA_LOSS (naming the file)
  // when the file is missing, shorter than FileBytes(extent_bytes), not a regular file of the
  // daemon's uid (a link), or its header is not valid or names another block or size; its
  // data is checked at stage-back against the header's CRC.
  absl::Status AdoptFile(uint64_t block_id, uint64_t extent_bytes) EXCLUDES(mu_);
  // Unlinks every "*.spill" file in the directory whose block id is not in `keep` (files of a
  // previous daemon no record names); returns how many.
  int RemoveFilesExcept(const std::unordered_set<uint64_t>& keep);
  // Unlinks the block's file (if any) and returns FileBytes(extent_bytes) of capacity.
  void Remove(uint64_t block_id, uint64_t extent_bytes) EXCLUDES(mu_);
  // Finishes queued transfers and stops the link's workers. Idempotent; not from a `done`.
  void Shutdown();

  std::string FilePath(uint64_t block_id) const;
  SpillStats stats() const EXCLUDES(mu_);

 private:
  // The directory's lock file as start-up will use it: OK when missing, or a regular file this
  // process can open read-write (then *held says whether a running daemon holds its lock);
  // FAILED_PRECONDITION for a link, directory or fifo, or one it cannot open. Opens without
  // creating, never blocks.
  static absl::Status ProbeLockFile(const std::string& directory, bool* held);
  SpillTier(const SpillOptions& options, std::unique_ptr<DiskIo> io, uint8_t* pool_base,
            uint64_t pool_bytes);
  void Submit(bool write, uint64_t block_id, pool::Extent extent, sched::TrafficClass cls,
              const std::string& flow, Done done);
  // Moves [o, o + len) of a block's file, `len` and `o` multiples of 4096.
  absl::StatusOr<int> OpenSpillFile(bool write, uint64_t block_id, uint64_t file_bytes);
  absl::StatusOr<int> OpenForRead(uint64_t block_id, uint64_t file_bytes);
  // Moves [o, o + len) of a block's data (file offset kHeaderBytes + o); with `sums`, records
  // the CRC32C of the chunk's bytes in the pool.
  absl::Status MoveChunk(bool write, int fd, pool::Extent extent, uint64_t o, uint64_t len,
                         ChunkChecksums* sums);
  // The stage-back's per-piece check for a chunk at `o` read into `buf` (`in_pool` of its
  // bytes are the block's): adds each piece's CRC32C to `sums`. Null without checksums.
  static DiskIo::PieceRead ReadChecker(const uint8_t* buf, uint64_t o, uint64_t in_pool,
                                       ChunkChecksums* sums);
  // After the last chunk: writes the header (spill) or reads and checks it and the data's
  // CRC (stage-back).
  absl::Status FinishWrite(int fd, uint64_t block_id, pool::Extent extent,
                           ChunkChecksums* sums) EXCLUDES(mu_);
  absl::Status FinishRead(int fd, uint64_t block_id, pool::Extent extent, ChunkChecksums* sums)
      EXCLUDES(mu_);
  // FinishWrite (then fdatasync) or FinishRead, and the byte counters on OK.
  absl::Status Finish(bool write, int fd, uint64_t block_id, pool::Extent extent,
                      ChunkChecksums* sums);
  std::string FileName(uint64_t block_id) const;

  SpillOptions options_;
  std::unique_ptr<DiskIo> io_;
  uint8_t* const pool_base_;
  const uint64_t pool_bytes_;
  bool measured_ = false;  // set by Create before the tier is shared
  // The directory's offloadd.lock, flock'ed for the tier's life (set by Create before the tier
  // is shared, closed by the destructor).
  int lock_fd_ = -1;
  // The directory, opened at Create; every file is opened relative to it.
  int dir_fd_ = -1;
  mutable base::Mutex mu_;
  // The data CRC of each file this tier wrote or adopted (checked against the header's).
  std::unordered_map<uint64_t, uint32_t> crcs_ GUARDED_BY(mu_);
  uint64_t used_bytes_ GUARDED_BY(mu_) = 0;
  uint64_t files_ GUARDED_BY(mu_) = 0;
  // Promote came before the stage reached the link
  std::unordered_set<uint64_t> promoted_ GUARDED_BY(mu_);
  std::atomic<uint64_t> spill_bytes_total_{0}, stage_bytes_total_{0};
  std::unique_ptr<sched::LinkScheduler> link_;
  // Computes the CRC32Cs of the link's chunks beside its I/O (chunk_checksums.h): one thread
  // per link worker; null without checksums.
  std::unique_ptr<base::WorkerThreads> checksum_;
};

}  // namespace offloadd::spill

#endif  // OFFLOADD_SERVER_SPILL_SPILL_TIER_H_
