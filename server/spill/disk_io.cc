#include "server/spill/disk_io.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>
#include <vector>

#include "absl/strings/str_format.h"
#include "common/base/mutex.h"

namespace offloadd::spill {
namespace {

constexpr uint64_t kPieceBytes = 1ull << 20;  // 1 MiB per request
constexpr unsigned kQueueDepth = 8;

absl::Status IoError(bool write, int err, uint64_t len, uint64_t offset) {
  if (write && (err == ENOSPC || err == EDQUOT)) {
    return absl::ResourceExhaustedError(absl::StrFormat(
        "the spill directory's file system is full (%s) writing %d bytes at %d", strerror(err),
        len, offset));
  }
  return absl::InternalError(absl::StrFormat("spill %s of %d bytes at %d failed: %s",
                                             write ? "write" : "read", len, offset,
                                             strerror(err)));
}

absl::Status ShortRead(uint64_t got, uint64_t len, uint64_t offset) {
  return absl::DataLossError(absl::StrFormat(
      "spill file ends early: read %d of %d bytes at %d (truncated under the daemon?)", got, len,
      offset));
}

class PosixDiskIo : public DiskIo {
 public:
  absl::Status Write(int fd, const void* buf, uint64_t len, uint64_t offset) override {
    const char* p = static_cast<const char*>(buf);
    uint64_t done = 0;
    while (done < len) {
      ssize_t n = pwrite(fd, p + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError(true, errno, len, offset);
      if (n == 0) return IoError(true, ENOSPC, len, offset);
      done += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }
  absl::Status Read(int fd, void* buf, uint64_t len, uint64_t offset,
                    const PieceRead* on_piece) override {
    char* p = static_cast<char*>(buf);
    uint64_t done = 0;
    while (done < len) {
      ssize_t n = pread(fd, p + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError(false, errno, len, offset);
      if (n == 0) return ShortRead(done, len, offset);
      done += static_cast<uint64_t>(n);
    }
    if (on_piece != nullptr && *on_piece) (*on_piece)(0, len);
    return absl::OkStatus();
  }
  const char* name() const override { return "posix"; }
};

// One io_uring instance (kQueueDepth entries), used by one call at a time.
struct Ring {
  io_uring ring{};
  bool initialized = false;
  ~Ring() {
    if (initialized) io_uring_queue_exit(&ring);
  }
};

class UringDiskIo : public DiskIo {
 public:
  // Returns 0 or -errno from io_uring_queue_init (the first ring of the pool).
  int Init() EXCLUDES(mu_) {
    int rc = 0;
    std::unique_ptr<Ring> ring = NewRing(&rc);
    if (ring != nullptr) Put(std::move(ring));
    return rc;
  }

  absl::Status Write(int fd, const void* buf, uint64_t len, uint64_t offset) override {
    return Run(true, fd, const_cast<void*>(buf), len, offset, nullptr);
  }
  absl::Status Read(int fd, void* buf, uint64_t len, uint64_t offset,
                    const PieceRead* on_piece) override {
    return Run(false, fd, buf, len, offset, on_piece != nullptr && *on_piece ? on_piece : nullptr);
  }
  const char* name() const override { return "io_uring"; }

 private:
  static std::unique_ptr<Ring> NewRing(int* rc) {
    auto ring = std::make_unique<Ring>();
    *rc = io_uring_queue_init(kQueueDepth, &ring->ring, 0);
    ring->initialized = *rc == 0;
    return ring->initialized ? std::move(ring) : nullptr;
  }
  // A ring of the pool, or a new one when every ring is in use (so each concurrent caller, a
  // spill link worker, ends up with its own and nobody waits for another's pieces or callback).
  std::unique_ptr<Ring> Take(int* rc) EXCLUDES(mu_) {
    {
      base::MutexLock lock(mu_);
      if (!free_.empty()) {
        std::unique_ptr<Ring> ring = std::move(free_.back());
        free_.pop_back();
        return ring;
      }
    }
    return NewRing(rc);
  }
  void Put(std::unique_ptr<Ring> ring) EXCLUDES(mu_) {
    base::MutexLock lock(mu_);
    free_.push_back(std::move(ring));
  }

  absl::Status Run(bool write, int fd, void* buf, uint64_t len, uint64_t offset,
                   const PieceRead* on_piece) {
    int rc = 0;
    std::unique_ptr<Ring> ring = Take(&rc);
    if (ring == nullptr) {
      // No ring free and no new one (out of descriptors, or locked-memory limits on older
      // kernels): this call goes through pread / pwrite rather than fail a stage-back.
      PosixDiskIo posix;
      return write ? posix.Write(fd, buf, len, offset) : posix.Read(fd, buf, len, offset, on_piece);
    }
    bool broken = false;
    absl::Status status = RunOn(&ring->ring, write, fd, buf, len, offset, on_piece, &broken);
    if (!broken) {
      Put(std::move(ring));
    } else {
      // Its completions can no longer be learned and pieces may still land in their buffers:
      // neither reused nor torn down (one ring and its descriptor, on a path never seen).
      ring.release();
    }
    return status;
  }

  // Submits pieces of [0, len) keeping up to kQueueDepth in flight; a short piece is finished
  // with the posix path (rare: signals, end of file), which also reports a truncated file.
  // A read piece, once whole, goes to `on_piece` (null for none) while the others fly.
  // Sets *broken when the ring cannot be used again.
  static absl::Status RunOn(io_uring* ring, bool write, int fd, void* buf, uint64_t len,
                            uint64_t offset, const PieceRead* on_piece, bool* broken) {
    char* p = static_cast<char*>(buf);
    uint64_t next = 0;
    unsigned in_flight = 0;
    absl::Status status;
    while (next < len || in_flight > 0) {
      while (next < len && in_flight < kQueueDepth && status.ok()) {
        io_uring_sqe* sqe = io_uring_get_sqe(ring);
        if (sqe == nullptr) break;
        const uint64_t n = std::min(kPieceBytes, len - next);
        if (write) {
          io_uring_prep_write(sqe, fd, p + next, static_cast<unsigned>(n), offset + next);
        } else {
          io_uring_prep_read(sqe, fd, p + next, static_cast<unsigned>(n), offset + next);
        }
        io_uring_sqe_set_data64(sqe, next);  // the piece's start
        next += n;
        ++in_flight;
      }
      if (!status.ok() && in_flight == 0) break;
      if (!status.ok()) next = len;  // stop submitting; drain
      int rc = io_uring_submit(ring);
      if (rc < 0 && rc != -EINTR && rc != -EBUSY) {
        if (status.ok()) status = IoError(write, -rc, len, offset);
      }
      io_uring_cqe* cqe = nullptr;
      rc = io_uring_wait_cqe(ring, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        if (status.ok()) status = IoError(write, -rc, len, offset);
        *broken = true;
        break;  // cannot learn completions: give up on the ring (pieces keep their buffers)
      }
      const uint64_t start = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(ring, cqe);
      --in_flight;
      if (!status.ok()) continue;
      const uint64_t want = std::min(kPieceBytes, len - start);
      if (res < 0) {
        status = IoError(write, -res, want, offset + start);
      } else if (static_cast<uint64_t>(res) < want) {
        PosixDiskIo rest;
        const uint64_t got = static_cast<uint64_t>(res);
        status = write ? rest.Write(fd, p + start + got, want - got, offset + start + got)
                       : rest.Read(fd, p + start + got, want - got, offset + start + got,
                                   nullptr);
      }
      if (status.ok() && on_piece != nullptr) (*on_piece)(start, want);
    }
    return status;
  }

  base::Mutex mu_;
  std::vector<std::unique_ptr<Ring>> free_ GUARDED_BY(mu_);
};

}  // namespace

std::unique_ptr<DiskIo> MakePosixDiskIo() { return std::make_unique<PosixDiskIo>(); }

std::unique_ptr<DiskIo> MakeDiskIo(bool prefer_io_uring, std::string* why_not) {
  if (prefer_io_uring) {
    auto uring = std::make_unique<UringDiskIo>();
    const int rc = uring->Init();
    if (rc == 0) return uring;
    if (why_not != nullptr) {
      *why_not = absl::StrFormat("io_uring_queue_init failed: %s", strerror(-rc));
    }
  } else if (why_not != nullptr) {
    *why_not = "io_uring not requested (spill_io_uring: false)";
  }
  return MakePosixDiskIo();
}

}  // namespace offloadd::spill
