#include "server/spill/spill_tier.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <utility>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "glog/logging.h"
#include "server/base/clock.h"

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

// Writes then reads back `bytes` with O_DIRECT; the smaller rate in bytes/s.
absl::StatusOr<double> MeasureBandwidth(DiskIo& io, const std::string& path, uint64_t bytes) {
  bytes = RoundUp(std::max<uint64_t>(bytes, 1 << 20), kDirectAlignment);
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) return Errno("cannot open " + path + " with O_DIRECT");
  File file(fd);
  unlink(path.c_str());
  AlignedBuffer buf(bytes);
  if (buf.p == nullptr) return absl::ResourceExhaustedError("no memory for the measurement");
  memset(buf.p, 0x5a, bytes);
  double t0 = base::SteadyNowSeconds();
  if (absl::Status st = io.Write(fd, buf.p, bytes, 0); !st.ok()) return st;
  if (fdatasync(fd) != 0) return Errno("fdatasync of " + path);
  double t1 = base::SteadyNowSeconds();
  if (absl::Status st = io.Read(fd, buf.p, bytes, 0); !st.ok()) return st;
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
  return RoundUp(extent_bytes, kDirectAlignment);
}

// Takes the directory's lock file (flock, held until the daemon exits; the kernel drops it when a
// daemon dies): a second daemon on the same directory would take the first one's spill files for
// leftovers and remove them. Returns the lock's descriptor.
static absl::StatusOr<int> LockSpillDirectory(const std::string& directory) {
  const std::string path = directory + "/offloadd.lock";
  const int fd = open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
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

absl::StatusOr<std::unique_ptr<SpillTier>> SpillTier::Create(const SpillOptions& options,
                                                            uint8_t* pool_base,
                                                            uint64_t pool_bytes) {
  if (options.directory.empty()) {
    return absl::InvalidArgumentError("spill_directory is empty: name a directory on local NVMe");
  }
  if (mkdir(options.directory.c_str(), 0700) != 0 && errno != EEXIST) {
    return Errno("cannot create spill_directory " + options.directory);
  }
  absl::StatusOr<int> lock_fd = LockSpillDirectory(options.directory);
  if (!lock_fd.ok()) return lock_fd.status();
  File lock(*lock_fd);  // closed (unlocked) if start-up fails below
  const std::string probe = options.directory + "/probe.tmp";
  int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_TRUNC | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    if (errno == EINVAL) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "the file system of spill_directory %s does not support O_DIRECT (tmpfs?): put it on "
          "a local disk (ext4, xfs)",
          options.directory));
    }
    return Errno("cannot write in spill_directory " + options.directory);
  }
  close(fd);
  unlink(probe.c_str());

  std::string why_not;
  std::unique_ptr<DiskIo> io = MakeDiskIo(options.io_uring, &why_not);
  if (std::string(io->name()) != "io_uring") {
    LOG(WARNING) << "spill: using pread/pwrite with O_DIRECT (" << why_not << ")";
  }
  SpillOptions o = options;
  o.chunk_bytes = RoundUp(std::max<uint64_t>(o.chunk_bytes, kDirectAlignment), kDirectAlignment);
  if (o.capacity_bytes == 0) {
    struct statvfs vfs;
    if (statvfs(o.directory.c_str(), &vfs) != 0) return Errno("statvfs " + o.directory);
    o.capacity_bytes = static_cast<uint64_t>(vfs.f_bavail) * vfs.f_frsize / 10 * 9;
  }
  bool measured = false;
  if (o.bytes_per_second == 0) {
    auto rate = MeasureBandwidth(*io, o.directory + "/measure.tmp", o.measure_bytes);
    if (!rate.ok()) return rate.status();
    o.bytes_per_second = *rate;
    measured = true;
  }
  std::unique_ptr<SpillTier> tier(new SpillTier(o, std::move(io), pool_base, pool_bytes));
  tier->measured_ = measured;
  tier->lock_fd_ = lock.Release();
  LOG(INFO) << "spill tier: " << o.directory << ", " << o.capacity_bytes << " bytes, "
            << tier->io_->name() << " + O_DIRECT, "
            << (o.bytes_per_second < 0 ? std::string("unpaced")
                                       : absl::StrFormat("paced at %.3f GB/s%s",
                                                         o.bytes_per_second / 1e9,
                                                         measured ? " (measured)" : ""));
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
}

SpillTier::~SpillTier() {
  Shutdown();
  if (lock_fd_ >= 0) close(lock_fd_);
}

void SpillTier::Shutdown() { link_->Shutdown(); }

std::string SpillTier::FilePath(uint64_t block_id) const {
  return absl::StrFormat("%s/%016x.spill", options_.directory, block_id);
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

absl::Status SpillTier::AdoptFile(uint64_t block_id, uint64_t extent_bytes) {
  const uint64_t file_bytes = FileBytes(extent_bytes);
  {
    base::MutexLock lock(mu_);
    used_bytes_ += file_bytes;
    ++files_;
  }
  const std::string path = FilePath(block_id);
  struct stat st;
  if (stat(path.c_str(), &st) != 0) {
    return absl::DataLossError(absl::StrFormat(
        "spill file %s was missing when offloadd restarted (%s): the block's bytes are lost",
        path, strerror(errno)));
  }
  if (static_cast<uint64_t>(st.st_size) < file_bytes) {
    return absl::DataLossError(absl::StrFormat(
        "spill file %s held %d of %d bytes when offloadd restarted (truncated): the block's "
        "bytes are lost",
        path, static_cast<int64_t>(st.st_size), file_bytes));
  }
  return absl::OkStatus();
}

int SpillTier::RemoveFilesExcept(const std::unordered_set<uint64_t>& keep) {
  DIR* d = opendir(options_.directory.c_str());
  if (d == nullptr) return 0;
  int n = 0;
  while (dirent* e = readdir(d)) {
    const std::string name = e->d_name;
    if (!absl::EndsWith(name, ".spill")) continue;
    uint64_t id = 0;
    const bool named = name.size() == 16 + 6 &&
                       absl::SimpleHexAtoi(absl::string_view(name).substr(0, 16), &id) &&
                       keep.count(id) != 0;
    if (!named && unlink((options_.directory + "/" + name).c_str()) == 0) ++n;
  }
  closedir(d);
  if (n > 0) {
    LOG(WARNING) << "spill: removed " << n << " spill files in " << options_.directory
                 << " that no record of the shared pool names (a previous daemon's)";
  }
  return n;
}

void SpillTier::Remove(uint64_t block_id, uint64_t extent_bytes) {
  unlink(FilePath(block_id).c_str());
  base::MutexLock lock(mu_);
  promoted_.erase(block_id);
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

// Opens the block's spill file for writing (created, truncated and fallocate'd to file_bytes) or
// reading (checked to hold file_bytes); returns the descriptor or the status the block's
// transfer finishes with (DATA_LOSS for a removed or truncated file, RESOURCE_EXHAUSTED for a
// full file system).
absl::StatusOr<int> SpillTier::OpenSpillFile(bool write, const std::string& path,
                                             uint64_t file_bytes) {
  const int flags = write ? (O_WRONLY | O_CREAT | O_TRUNC) : O_RDONLY;
  const int fd = open(path.c_str(), flags | O_DIRECT | O_CLOEXEC, 0600);
  if (fd < 0) {
    const int err = errno;
    if (!write && err == ENOENT) {
      return absl::DataLossError(absl::StrFormat(
          "spill file %s was removed under the daemon: the block's bytes are lost", path));
    }
    return absl::InternalError(
        absl::StrFormat("cannot open spill file %s: %s", path, strerror(err)));
  }
  File file(fd);  // closes fd on every error below
  if (write) {
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
  } else {
    struct stat st;
    if (fstat(fd, &st) == 0 && static_cast<uint64_t>(st.st_size) < file_bytes) {
      return absl::DataLossError(absl::StrFormat(
          "spill file %s holds %d of %d bytes (truncated under the daemon): the block's bytes "
          "are lost",
          path, static_cast<int64_t>(st.st_size), file_bytes));
    }
  }
  return file.Release();
}

void SpillTier::Submit(bool write, uint64_t block_id, pool::Extent extent,
                       sched::TrafficClass cls, const std::string& flow, Done done) {
  const std::string path = FilePath(block_id);
  const uint64_t file_bytes = FileBytes(extent.bytes);
  if (extent.bytes == 0 || extent.offset + extent.bytes > pool_bytes_) {
    done(absl::InvalidArgumentError(absl::StrFormat(
        "extent [%d, +%d) is outside the pool of %d bytes", extent.offset, extent.bytes,
        pool_bytes_)));
    return;
  }
  absl::StatusOr<int> fd = OpenSpillFile(write, path, file_bytes);
  if (!fd.ok()) {
    done(fd.status());
    return;
  }
  auto file = std::make_shared<File>(*fd);
  if (!write) {
    base::MutexLock lock(mu_);
    if (promoted_.erase(block_id) > 0) cls = sched::TrafficClass::kUrgent;
  }
  auto t = std::make_shared<sched::Transfer>();
  t->gpu = flow;
  t->cls = cls;
  t->owner_id = block_id;  // for Promote
  t->bytes = file_bytes;
  t->copy_chunk = [this, write, file, extent](uint64_t o, uint64_t len) {
    return MoveChunk(write, file->fd, extent, o, len);
  };
  t->done = [this, write, file, file_bytes, path, done = std::move(done)](absl::Status st) {
    // Synced before OK: the store records the block as spilled and frees its extent on OK.
    if (st.ok() && write && fdatasync(file->fd) != 0) {
      st = absl::InternalError(
          absl::StrFormat("cannot sync spill file %s: %s", path, strerror(errno)));
    }
    if (st.ok()) {
      (write ? spill_bytes_total_ : stage_bytes_total_) += file_bytes;
    } else if (st.code() == absl::StatusCode::kDataLoss) {
      st = absl::DataLossError(absl::StrFormat("%s: %s", path, st.message()));
    }
    done(st);
  };
  link_->Submit(std::move(t));
}

absl::Status SpillTier::MoveChunk(bool write, int fd, pool::Extent extent, uint64_t o,
                                  uint64_t len) {
  uint8_t* mem = pool_base_ + extent.offset + o;
  const uint64_t in_pool = o >= extent.bytes ? 0 : std::min(len, extent.bytes - o);
  const bool direct = in_pool == len && reinterpret_cast<uintptr_t>(mem) % kDirectAlignment == 0;
  if (direct) return write ? io_->Write(fd, mem, len, o) : io_->Read(fd, mem, len, o);
  AlignedBuffer bounce(len);
  if (bounce.p == nullptr) return absl::ResourceExhaustedError("no memory for a bounce buffer");
  if (write) {
    memcpy(bounce.p, mem, in_pool);
    memset(static_cast<uint8_t*>(bounce.p) + in_pool, 0, len - in_pool);
    return io_->Write(fd, bounce.p, len, o);
  }
  absl::Status st = io_->Read(fd, bounce.p, len, o);
  if (st.ok()) memcpy(mem, bounce.p, in_pool);
  return st;
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
