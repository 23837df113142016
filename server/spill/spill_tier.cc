#include "server/spill/spill_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "common/base/clock.h"
#include "glog/logging.h"
#include "server/base/crc32c.h"
#include "server/spill/chunk_checksums.h"

namespace offloadd::spill {
namespace {

uint64_t RoundUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

// An open file descriptor closed with the last transfer chunk that uses it.
struct File {
  explicit File(int f) : fd(f) {}
  ~File() {
    if (fd >= 0) close(fd);
  }
  // Gives up ownership: the descriptor is no longer closed here.
  int Release() { return std::exchange(fd, -1); }
  int fd;
};

struct AlignedBuffer {
  explicit AlignedBuffer(uint64_t bytes) {
    if (posix_memalign(&p, kDirectAlignment, std::max<uint64_t>(bytes, kDirectAlignment)) != 0) {
      p = nullptr;
    }
  }
  ~AlignedBuffer() { free(p); }
  void* p = nullptr;
};

absl::Status Errno(const std::string& what) {
  return absl::FailedPreconditionError(absl::StrFormat("%s: %s", what, strerror(errno)));
}

// A fresh file `name` in `dir_fd`: a stale file or link of that name is unlinked first, then the
// file is created with O_EXCL | O_NOFOLLOW (nothing is ever written through a planted link).
int CreateExclusive(int dir_fd, const std::string& name, int flags) {
  if (unlinkat(dir_fd, name.c_str(), 0) != 0 && errno != ENOENT) return -1;
  return openat(dir_fd, name.c_str(), flags | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
}

// OK for a directory owned by this process's effective uid and not writable by group or others.
absl::Status CheckOwnedDirectory(const std::string& directory, const struct stat& st) {
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("spill_directory %s is not a directory", directory));
  }
  const uid_t me = geteuid();
  if (st.st_uid != me || (st.st_mode & (S_IWGRP | S_IWOTH)) != 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "spill_directory %s is owned by uid %d with mode %04o: it must be the daemon's own "
        "(owner uid %d, not writable by group or others), since whoever can write it can replace "
        "or read the blocks spilled there: chown %d and chmod go-w it, or choose another",
        directory, st.st_uid, st.st_mode & 07777, me, me));
  }
  return absl::OkStatus();
}

// The spill file header: the first kHeaderBytes of a file (the rest zero), little-endian.
struct SpillHeader {
  char magic[8];        // "OFDSPIL1"
  uint32_t version;     // 1
  uint32_t flags;       // bit 0: data_crc was computed (SpillOptions::checksums)
  uint64_t block_id;
  uint64_t data_bytes;  // the extent's bytes data_crc covers
  uint32_t data_crc;    // CRC32C of block_id and data_bytes (8 bytes each), then the data
  uint32_t header_crc;  // CRC32C of the fields above
};
static_assert(sizeof(SpillHeader) == 40, "packed as written");
constexpr char kMagic[8] = {'O', 'F', 'D', 'S', 'P', 'I', 'L', '1'};

uint32_t HeaderCrc(const SpillHeader& h) { return base::Crc32c(&h, offsetof(SpillHeader, header_crc)); }

// The data CRC bound to the block's identity: CRC32C(block_id, data_bytes, data) from the
// data's own CRC.
uint32_t BoundCrc(uint64_t block_id, uint64_t data_bytes, uint32_t data_crc) {
  const uint64_t id[2] = {block_id, data_bytes};
  return base::Crc32cCombine(base::Crc32c(id, sizeof(id)), data_crc, data_bytes);
}

// Writes then reads back `bytes` with O_DIRECT; the smaller rate in bytes/s.
absl::StatusOr<double> MeasureBandwidth(DiskIo& io, int dir_fd, const std::string& name,
                                        uint64_t bytes) {
  bytes = RoundUp(std::max<uint64_t>(bytes, 1 << 20), kDirectAlignment);
  int fd = CreateExclusive(dir_fd, name, O_RDWR | O_DIRECT);
  if (fd < 0) return Errno("cannot open " + name + " with O_DIRECT");
  File file(fd);
  unlinkat(dir_fd, name.c_str(), 0);
  AlignedBuffer buf(bytes);
  if (buf.p == nullptr) return absl::ResourceExhaustedError("no memory for the measurement");
  memset(buf.p, 0x5a, bytes);
  double t0 = base::SteadyNowSeconds();
  if (absl::Status st = io.Write(fd, buf.p, bytes, 0); !st.ok()) return st;
  if (fdatasync(fd) != 0) return Errno("fdatasync of " + name);
  double t1 = base::SteadyNowSeconds();
  if (absl::Status st = io.Read(fd, buf.p, bytes, 0, nullptr); !st.ok()) return st;
  double t2 = base::SteadyNowSeconds();
  const double write_rate = bytes / std::max(t1 - t0, 1e-6);
  const double read_rate = bytes / std::max(t2 - t1, 1e-6);
  return std::min(write_rate, read_rate);
}

}  // namespace

bool SpillTier::DirectIoSupported(const std::string& directory) {
  if (mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) return false;
  const std::string probe = directory + "/direct_probe.tmp";
  const int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return false;
  close(fd);
  unlink(probe.c_str());
  return true;
}

uint64_t SpillTier::FileBytes(uint64_t extent_bytes) {
  return kHeaderBytes + DataBytes(extent_bytes);
}

uint64_t SpillTier::DataBytes(uint64_t extent_bytes) {
  return RoundUp(extent_bytes, kDirectAlignment);
}

absl::Status SpillTier::CheckDirectory(const std::string& directory) {
  struct stat st;
  if (lstat(directory.c_str(), &st) != 0 && errno == ENOENT) return absl::OkStatus();
  if (stat(directory.c_str(), &st) != 0) return Errno("cannot stat spill_directory " + directory);
  if (absl::Status owned = CheckOwnedDirectory(directory, st); !owned.ok()) return owned;
  const int fd = open(directory.c_str(), O_RDWR | O_TMPFILE | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0 && errno == EINVAL) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the file system of spill_directory %s does not support O_DIRECT (tmpfs?): put it on a "
        "local disk (ext4, xfs)",
        directory));
  }
  if (fd >= 0) close(fd);
  bool held = false;
  return ProbeLockFile(directory, &held);
}

absl::Status SpillTier::ProbeLockFile(const std::string& directory, bool* held) {
  *held = false;
  const std::string path = directory + "/offloadd.lock";
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) {
    return errno == ENOENT ? absl::OkStatus() : Errno("cannot stat the lock file " + path);
  }
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "the spill directory's lock file %s is not a regular file (a link, directory or fifo): "
        "start-up cannot lock it; remove it (offloadd creates it)",
        path));
  }
  // As start-up opens it, without creating it; O_NONBLOCK so nothing waits on the open.
  const int fd = open(path.c_str(), O_RDWR | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) {
    return Errno("start-up cannot open the lock file " + path +
                 " (make it the daemon user's, mode 0600, or remove it)");
  }
  File lock(fd);
  // A shared lock is refused only while a daemon holds its exclusive one; released at close.
  *held = flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK;
  return absl::OkStatus();
}

std::string SpillTier::DirectoryNote(const std::string& directory) {
  struct stat st;
  if (lstat(directory.c_str(), &st) != 0 && errno == ENOENT) {
    return absl::StrFormat("spill_directory %s does not exist yet: start-up creates it (mode "
                           "0700, owned by the daemon's user)",
                           directory);
  }
  bool held = false;
  if (!ProbeLockFile(directory, &held).ok() || !held) return "";  // CheckDirectory says why
  return absl::StrFormat("spill_directory %s is in use by a running offloadd (it holds %s/"
                         "offloadd.lock): a daemon started with this configuration now is "
                         "refused until that one stops",
                         directory, directory);
}

// Takes the directory's lock file (flock, held until the daemon exits; the kernel drops it when a
// daemon dies): a second daemon on the same directory would take the first one's spill files for
// leftovers and remove them. Returns the lock's descriptor.
static absl::StatusOr<int> LockSpillDirectory(const std::string& directory, int dir_fd) {
  const std::string path = directory + "/offloadd.lock";
  const int fd = openat(dir_fd, "offloadd.lock", O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot create the lock file " + path);
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    close(fd);
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "spill_directory %s is in use by another offloadd (it holds %s): give each daemon its "
          "own spill_directory, or stop the other one first",
          directory, path));
    }
    errno = err;
    return Errno("cannot lock " + path);
  }
  return fd;
}

// Opens `directory` (created 0700 if missing) and checks that it is the daemon's own.
static absl::StatusOr<int> OpenSpillDirectory(const std::string& directory) {
  if (mkdir(directory.c_str(), 0700) != 0 && errno != EEXIST) {
    return Errno("cannot create spill_directory " + directory);
  }
  const int fd = open(directory.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return Errno("cannot open spill_directory " + directory);
  File dir(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("cannot stat spill_directory " + directory);
  if (absl::Status owned = CheckOwnedDirectory(directory, st); !owned.ok()) return owned;
  const int probe = CreateExclusive(fd, "probe.tmp", O_RDWR | O_DIRECT);
  if (probe < 0) {
    if (errno == EINVAL) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the file system of spill_directory %s does not support O_DIRECT (tmpfs?): put it on "
          "a local disk (ext4, xfs)",
          directory));
    }
    return Errno("cannot write in spill_directory " + directory);
  }
  close(probe);
  unlinkat(fd, "probe.tmp", 0);
  return dir.Release();
}

absl::StatusOr<std::unique_ptr<SpillTier>> SpillTier::Create(const SpillOptions& options,
                                                            uint8_t* pool_base,
                                                            uint64_t pool_bytes) {
  if (options.directory.empty()) {
    return absl::InvalidArgumentError("spill_directory is empty: name a directory on local NVMe");
  }
  absl::StatusOr<int> dir_fd = OpenSpillDirectory(options.directory);
  if (!dir_fd.ok()) return dir_fd.status();
  File dir(*dir_fd);  // closed if start-up fails below
  absl::StatusOr<int> lock_fd = LockSpillDirectory(options.directory, dir.fd);
  if (!lock_fd.ok()) return lock_fd.status();
  File lock(*lock_fd);  // closed (unlocked) if start-up fails below

  std::string why_not;
  std::unique_ptr<DiskIo> io = MakeDiskIo(options.io_uring, &why_not);
  if (std::string(io->name()) != "io_uring") {
    LOG(WARNING) << "spill: using pread/pwrite with O_DIRECT (" << why_not << ")";
  }
  SpillOptions o = options;
  o.chunk_bytes = RoundUp(std::max<uint64_t>(o.chunk_bytes, kDirectAlignment), kDirectAlignment);
  if (o.capacity_bytes == 0) {
    struct statvfs vfs;
    if (fstatvfs(dir.fd, &vfs) != 0) return Errno("statvfs " + o.directory);
    o.capacity_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize / 10 * 9;
  }
  bool measured = false;
  if (o.bytes_per_second == 0) {
    auto rate = MeasureBandwidth(*io, dir.fd, "measure.tmp", o.measure_bytes);
    if (!rate.ok()) return rate.status();
    o.bytes_per_second = *rate;
    measured = true;
  }
  std::unique_ptr<SpillTier> tier(new SpillTier(o, std::move(io), pool_base, pool_bytes));
  tier->measured_ = measured;
  tier->lock_fd_ = lock.Release();
  tier->dir_fd_ = dir.Release();
  LOG(INFO) << "spill tier: " << o.directory << ", " << o.capacity_bytes << " bytes, "
            << tier->io_->name() << " + O_DIRECT, "
            << (o.bytes_per_second < 0 ? std::string("unpaced")
                                       : absl::StrFormat("paced at %.3f GB/s%s",
                                                         o.bytes_per_second / 1e9,
                                                         measured ? " (measured)" : ""))
            << (o.checksums ? absl::StrFormat(", CRC32C (%s)", base::Crc32cHardware()
                                                                   ? "SSE4.2"
                                                                   : "portable")
                            : std::string(", no checksums"));
  return tier;
}

SpillTier::SpillTier(const SpillOptions& options, std::unique_ptr<DiskIo> io,
                     uint8_t* pool_base, uint64_t pool_bytes)
    : options_(options), io_(std::move(io)), pool_base_(pool_base), pool_bytes_(pool_bytes) {
  sched::LinkSchedulerOptions l;
  l.link_name = "spill";
  l.direction = "both";
  l.chunk_bytes = options_.chunk_bytes;
  l.quantum_bytes = options_.chunk_bytes;
  l.worker_threads = std::max<uint32_t>(options_.io_threads, 1);
  l.bytes_per_second = std::max(options_.bytes_per_second, 0.0);
  l.offload_min_share = options_.spill_min_share;
  link_ = std::make_unique<sched::LinkScheduler>(l);
  if (options_.checksums) checksum_ = std::make_unique<base::WorkerThreads>(static_cast<int>(l.worker_threads));
}

SpillTier::~SpillTier() {
  Shutdown();
  if (lock_fd_ >= 0) close(lock_fd_);
  if (dir_fd_ >= 0) close(dir_fd_);
}

void SpillTier::Shutdown() {
  link_->Shutdown();      // every chunk read or written; their checksums may still be queued
  if (checksum_ != nullptr) checksum_->Shutdown();  // computes them, finishes the transfers
}

std::string SpillTier::FileName(uint64_t block_id) const {
  return absl::StrFormat("%016x.spill", block_id);
}

std::string SpillTier::FilePath(uint64_t block_id) const {
  return options_.directory + "/" + FileName(block_id);
}

bool SpillTier::TryReserve(uint64_t extent_bytes) {
  base::MutexLock lock(mu_);
  const uint64_t bytes = FileBytes(extent_bytes);
  if (used_bytes_ + bytes > options_.capacity_bytes) return false;
  used_bytes_ += bytes;
  ++files_;
  return true;
}

void SpillTier::Promote(uint64_t block_id) {
  {
    base::MutexLock lock(mu_);
    promoted_.insert(block_id);  // for a Stage not yet on the link
  }
  if (link_->PromoteOwner(block_id, sched::TrafficClass::kUrgent) > 0) {
    base::MutexLock lock(mu_);
    promoted_.erase(block_id);
  }
}

namespace {
// Reads and checks the header of an open spill file: DATA_LOSS naming `path` unless it is a
// valid header of `block_id` with `data_bytes` of data.
absl::StatusOr<SpillHeader> ReadHeader(DiskIo& io, int fd, const std::string& path,
                                       uint64_t block_id, uint64_t data_bytes) {
  AlignedBuffer buf(SpillTier::kHeaderBytes);
  if (buf.p == nullptr) return absl::ResourceExhaustedError("no memory for a spill header");
  absl::Status read = io.Read(fd, buf.p, SpillTier::kHeaderBytes, 0, nullptr);
  if (!read.ok()) return read;
  SpillHeader h;
  memcpy(&h, buf.p, sizeof(h));
  if (memcmp(h.magic, kMagic, sizeof(kMagic)) != 0 || h.version != 1 || h.header_crc != HeaderCrc(h)) {
    return absl::DataLossError(absl::StrFormat(
        "spill file %s has no valid header (magic, version or header CRC32C wrong: its first "
        "4 KiB were overwritten, or it is not a spill file): the block's bytes are lost",
        path));
  }
  if (h.block_id != block_id || h.data_bytes != data_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "spill file %s holds block %016x of %d bytes, not block %016x of %d: it was swapped or "
        "replaced under the daemon; the block's bytes are lost",
        path, h.block_id, h.data_bytes, block_id, data_bytes));
  }
  return h;
}

// DATA_LOSS unless `fd` is a regular file of this process's uid holding at least `bytes`.
absl::Status CheckSpillFile(int fd, const std::string& path, uint64_t bytes, const char* when) {
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("cannot stat spill file " + path);
  if (!S_ISREG(st.st_mode) || st.st_uid != geteuid()) {
    return absl::DataLossError(absl::StrFormat(
        "spill file %s is not a regular file of the daemon's uid (owner %d, mode %o) %s: the "
        "block's bytes are lost",
        path, st.st_uid, st.st_mode, when));
  }
  if (static_cast<uint64_t>(st.st_size) < bytes) {
    return absl::DataLossError(absl::StrFormat(
        "spill file %s held %d of %d bytes %s (truncated): the block's bytes are lost", path,
        static_cast<int64_t>(st.st_size), bytes, when));
  }
  return absl::OkStatus();
}
}  // namespace

// Opens the block's file for reading: DATA_LOSS naming it when it is missing, a symbolic link
// (O_NOFOLLOW: ELOOP), not the daemon's regular file, or shorter than `file_bytes`.
absl::StatusOr<int> SpillTier::OpenForRead(uint64_t block_id, uint64_t file_bytes) {
  const std::string path = FilePath(block_id);
  const int fd =
      openat(dir_fd_, FileName(block_id).c_str(), O_RDONLY | O_NOFOLLOW | O_DIRECT | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    if (err == ENOENT) {
      return absl::DataLossError(absl::StrFormat(
          "spill file %s was removed under the daemon: the block's bytes are lost", path));
    }
    if (err == ELOOP) {
      return absl::DataLossError(absl::StrFormat(
          "spill file %s is a symbolic link, not the daemon's file (not followed): the block's "
          "bytes are lost",
          path));
    }
    return absl::InternalError(
        absl::StrFormat("cannot open spill file %s: %s", path, strerror(err)));
  }
  File file(fd);
  if (absl::Status ok = CheckSpillFile(fd, path, file_bytes, "under the daemon"); !ok.ok()) {
    return ok;
  }
  return file.Release();
}

absl::Status SpillTier::AdoptFile(uint64_t block_id, uint64_t extent_bytes) {
  const uint64_t file_bytes = FileBytes(extent_bytes);
  {
    base::MutexLock lock(mu_);
    used_bytes_ += file_bytes;
    ++files_;
  }
  absl::StatusOr<int> fd = OpenForRead(block_id, file_bytes);
  if (!fd.ok()) {
    return absl::DataLossError(
        absl::StrCat(fd.status().message(), " (found when offloadd restarted)"));
  }
  File file(*fd);
  absl::StatusOr<SpillHeader> h = ReadHeader(*io_, file.fd, FilePath(block_id), block_id,
                                             extent_bytes);
  if (!h.ok()) return absl::DataLossError(h.status().message());
  if (h->flags & 1) {
    base::MutexLock lock(mu_);
    crcs_[block_id] = h->data_crc;
  }
  return absl::OkStatus();
}

int SpillTier::RemoveFilesExcept(const std::unordered_set<uint64_t>& keep) {
  const int fd = dup(dir_fd_);
  DIR* d = fd < 0 ? nullptr : fdopendir(fd);
  if (d == nullptr) {
    if (fd >= 0) close(fd);
    return 0;
  }
  rewinddir(d);
  int n = 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (!absl::EndsWith(name, ".spill")) continue;
    uint64_t id = 0;
    const bool named = name.size() == 16 + 6 &&
                       absl::SimpleHexAtoi(absl::string_view(name).substr(0, 16), &id) &&
                       keep.count(id) != 0;
    if (!named && unlinkat(dir_fd_, name.c_str(), 0) == 0) ++n;
  }
  closedir(d);
  if (n > 0) {
    LOG(WARNING) << "spill: removed " << n << " spill files in " << options_.directory
                 << " that no record of the shared pool names (a previous daemon's)";
  }
  return n;
}

void SpillTier::Remove(uint64_t block_id, uint64_t extent_bytes) {
  unlinkat(dir_fd_, FileName(block_id).c_str(), 0);
  base::MutexLock lock(mu_);
  promoted_.erase(block_id);
  crcs_.erase(block_id);
  used_bytes_ -= std::min(used_bytes_, FileBytes(extent_bytes));
  if (files_ > 0) --files_;
}

void SpillTier::Spill(uint64_t block_id, pool::Extent extent, const std::string& flow,
                      Done done) {
  Submit(true, block_id, extent, sched::TrafficClass::kOffload, flow, std::move(done));
}

void SpillTier::Stage(uint64_t block_id, pool::Extent extent, DiskClass cls,
                      const std::string& flow, Done done) {
  Submit(false, block_id, extent,
         cls == DiskClass::kUrgent ? sched::TrafficClass::kUrgent : sched::TrafficClass::kPrefetch,
         flow, std::move(done));
}

// Opens the block's spill file for writing (created anew with O_EXCL, fallocate'd to
// file_bytes) or reading (OpenForRead); returns the descriptor or the status the block's
// transfer finishes with (DATA_LOSS for a removed, truncated or linked file, RESOURCE_EXHAUSTED
// for a full file system).
absl::StatusOr<int> SpillTier::OpenSpillFile(bool write, uint64_t block_id, uint64_t file_bytes) {
  if (!write) return OpenForRead(block_id, file_bytes);
  const std::string path = FilePath(block_id);
  const int fd = CreateExclusive(dir_fd_, FileName(block_id), O_WRONLY | O_DIRECT);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrFormat("cannot create spill file %s: %s", path, strerror(errno)));
  }
  File file(fd);  // closes fd on every error below
  // Allocate the whole file first: O_DIRECT writes into allocated blocks run in parallel
  // (extending writes are serialised by the file system), and a full disk shows here.
  if (fallocate(fd, 0, 0, static_cast<off_t>(file_bytes)) != 0 && errno != EOPNOTSUPP) {
    const int err = errno;
    if (err == ENOSPC || err == EDQUOT) {
      return absl::ResourceExhaustedError(absl::StrFormat(
          "the spill directory's file system is full (%s) allocating %s", strerror(err), path));
    }
    return absl::InternalError(
        absl::StrFormat("cannot allocate spill file %s: %s", path, strerror(err)));
  }
  return file.Release();
}

absl::Status SpillTier::FinishWrite(int fd, uint64_t block_id, pool::Extent extent,
                                    ChunkChecksums* sums) {
  SpillHeader h{};
  memcpy(h.magic, kMagic, sizeof(kMagic));
  h.version = 1;
  h.block_id = block_id;
  h.data_bytes = extent.bytes;
  uint32_t crc = 0;
  if (sums != nullptr) {
    if (!sums->Joined(extent.bytes, &crc)) {
      return absl::InternalError("spill: the chunks' checksums do not cover the block");
    }
    h.flags = 1;
    h.data_crc = BoundCrc(block_id, extent.bytes, crc);
  }
  h.header_crc = HeaderCrc(h);
  AlignedBuffer buf(kHeaderBytes);
  if (buf.p == nullptr) return absl::ResourceExhaustedError("no memory for a spill header");
  memset(buf.p, 0, kHeaderBytes);
  memcpy(buf.p, &h, sizeof(h));
  if (absl::Status st = io_->Write(fd, buf.p, kHeaderBytes, 0); !st.ok()) return st;
  if (sums != nullptr) {
    base::MutexLock lock(mu_);
    crcs_[block_id] = h.data_crc;
  }
  return absl::OkStatus();
}

absl::Status SpillTier::FinishRead(int fd, uint64_t block_id, pool::Extent extent,
                                   ChunkChecksums* sums) {
  const std::string path = FilePath(block_id);
  absl::StatusOr<SpillHeader> h = ReadHeader(*io_, fd, path, block_id, extent.bytes);
  if (!h.ok()) return h.status();
  if (sums == nullptr) return absl::OkStatus();
  std::optional<uint32_t> recorded;  // the CRC this tier wrote or adopted the file with
  {
    base::MutexLock lock(mu_);
    auto it = crcs_.find(block_id);
    if (it != crcs_.end()) recorded = it->second;
  }
  if ((h->flags & 1) == 0) {
    // A daemon always writes the data CRC, and the header's own CRC is no secret: a header
    // saying "no data CRC" was rewritten (while this daemon ran, or before it adopted the file).
    return absl::DataLossError(absl::StrFormat(
        "spill file %s says it carries no CRC32C of its data, but offloadd writes one into every "
        "spill file%s: its header was rewritten; the block's bytes are lost",
        path, recorded.has_value() ? absl::StrFormat(" (this one's was %08x)", *recorded) : ""));
  }
  uint32_t crc = 0;
  if (!sums->Joined(extent.bytes, &crc)) {
    return absl::InternalError("stage-back: the chunks' checksums do not cover the block");
  }
  const uint32_t read = BoundCrc(block_id, extent.bytes, crc);
  if (read != h->data_crc || recorded.value_or(h->data_crc) != h->data_crc) {
    return absl::DataLossError(absl::StrFormat(
        "spill file %s failed its CRC32C check (read back %08x, header %08x, written %08x): "
        "its bytes changed on disk (a stray writer, a misdirected write, bit rot) or it was "
        "replaced; the block's bytes are lost",
        path, read, h->data_crc, recorded.value_or(h->data_crc)));
  }
  return absl::OkStatus();
}

void SpillTier::Submit(bool write, uint64_t block_id, pool::Extent extent,
                       sched::TrafficClass cls, const std::string& flow, Done done) {
  const uint64_t file_bytes = FileBytes(extent.bytes);
  if (extent.bytes == 0 || extent.bytes > pool_bytes_ ||
      extent.offset > pool_bytes_ - extent.bytes) {  // no uint64 wrap-around
    done(absl::InvalidArgumentError(absl::StrFormat(
        "extent [%d, +%d) is outside the pool of %d bytes", extent.offset, extent.bytes,
        pool_bytes_)));
    return;
  }
  absl::StatusOr<int> fd = OpenSpillFile(write, block_id, file_bytes);
  if (!fd.ok()) {
    done(fd.status());
    return;
  }
  auto file = std::make_shared<File>(*fd);
  if (!write) {
    base::MutexLock lock(mu_);
    if (promoted_.erase(block_id) > 0) cls = sched::TrafficClass::kUrgent;
  }
  auto sums = options_.checksums ? std::make_shared<ChunkChecksums>(checksum_.get()) : nullptr;
  auto t = std::make_shared<sched::Transfer>();
  t->gpu = flow;
  t->cls = cls;
  t->owner_id = block_id;  // for Promote
  t->bytes = file_bytes - kHeaderBytes;
  t->copy_chunk = [this, write, file, extent, sums](uint64_t o, uint64_t len) {
    return MoveChunk(write, file->fd, extent, o, len, sums.get());
  };
  // The end of the transfer waits for its last checksums (computed off the link's workers)
  // before it reads the verdict and reports: until then the extent's bytes are still read.
  auto finish = [this, write, file, block_id, extent, sums,
                 done = std::move(done)](absl::Status st) {
    if (st.ok()) st = Finish(write, file->fd, block_id, extent, sums.get());
    if (!write) {  // a Promote that came after the link let go of the transfer
      base::MutexLock lock(mu_);
      promoted_.erase(block_id);
    }
    const std::string path = FilePath(block_id);
    if (st.code() == absl::StatusCode::kDataLoss && !absl::StrContains(st.message(), path)) {
      st = absl::DataLossError(absl::StrFormat("%s: %s", path, st.message()));
    }
    // For the operator's journal (the client gets the status): a lost block, a full or failing
    // disk. UNAVAILABLE is the shutdown's, not a fault.
    if (!st.ok() && st.code() != absl::StatusCode::kUnavailable) {
      LOG(WARNING) << "spill: " << (write ? "spill" : "stage-back") << " of block " << block_id
                   << " failed: " << st;
    }
    done(std::move(st));
  };
  // The status moves along, so no copy of it is left on the thread that finishes.
  t->done = [sums, finish = std::move(finish)](absl::Status st) {
    if (sums == nullptr) {
      finish(std::move(st));
    } else {
      sums->WhenSettled([finish, st = std::move(st)]() mutable { finish(std::move(st)); });
    }
  };
  link_->Submit(std::move(t));
}

absl::Status SpillTier::Finish(bool write, int fd, uint64_t block_id, pool::Extent extent,
                               ChunkChecksums* sums) {
  absl::Status st = write ? FinishWrite(fd, block_id, extent, sums)
                          : FinishRead(fd, block_id, extent, sums);
  // Synced before OK: the store records the block as spilled and frees its extent on OK.
  if (st.ok() && write && fdatasync(fd) != 0) {
    st = absl::InternalError(absl::StrFormat("cannot sync spill file %s: %s",
                                             FilePath(block_id), strerror(errno)));
  }
  if (st.ok()) (write ? spill_bytes_total_ : stage_bytes_total_) += FileBytes(extent.bytes);
  return st;
}

absl::Status SpillTier::MoveChunk(bool write, int fd, pool::Extent extent, uint64_t o,
                                  uint64_t len, ChunkChecksums* sums) {
  uint8_t* mem = pool_base_ + extent.offset + o;
  const uint64_t in_pool = o >= extent.bytes ? 0 : std::min(len, extent.bytes - o);
  if (sums != nullptr && write && in_pool > 0) sums->Compute(o, mem, in_pool);  // beside the write
  const bool direct = in_pool == len && reinterpret_cast<uintptr_t>(mem) % kDirectAlignment == 0;
  const uint64_t at = kHeaderBytes + o;
  if (direct) {
    if (write) return io_->Write(fd, mem, len, at);
    const DiskIo::PieceRead check = ReadChecker(mem, o, in_pool, sums);
    return io_->Read(fd, mem, len, at, &check);
  }
  AlignedBuffer bounce(len);
  if (bounce.p == nullptr) return absl::ResourceExhaustedError("no memory for a bounce buffer");
  uint8_t* b = static_cast<uint8_t*>(bounce.p);
  if (write) {
    memcpy(b, mem, in_pool);
    memset(b + in_pool, 0, len - in_pool);
    return io_->Write(fd, b, len, at);
  }
  absl::Status st = io_->Read(fd, b, len, at, nullptr);
  if (!st.ok()) return st;
  memcpy(mem, b, in_pool);
  if (sums != nullptr && in_pool > 0) sums->Compute(o, mem, in_pool);  // the extent's copy
  return st;
}

DiskIo::PieceRead SpillTier::ReadChecker(const uint8_t* buf, uint64_t o, uint64_t in_pool,
                                         ChunkChecksums* sums) {
  if (sums == nullptr || in_pool == 0) return nullptr;
  // Each piece's CRC32C queued as it lands (the worker goes on with the chunk's other pieces,
  // then its next chunk); the padding past the block's end (the last chunk's tail) is not part
  // of the data's CRC.
  return [buf, o, in_pool, sums](uint64_t start, uint64_t n) {
    if (start >= in_pool) return;
    sums->Compute(o + start, buf + start, std::min(n, in_pool - start));
  };
}

SpillStats SpillTier::stats() const {
  SpillStats s;
  s.io = io_->name();
  s.capacity_bytes = options_.capacity_bytes;
  {
    base::MutexLock lock(mu_);
    s.used_bytes = used_bytes_;
    s.files = files_;
  }
  s.spill_bytes_total = spill_bytes_total_;
  s.stage_bytes_total = stage_bytes_total_;
  s.bytes_per_second = options_.bytes_per_second;
  s.bytes_per_second_measured = measured_;
  s.link = link_->stats();
  return s;
}

}  // namespace offloadd::spill
