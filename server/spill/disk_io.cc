#include "server/spill/disk_io.h"

#include <liburing.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"
#include "server/base/mutex.h"

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
  absl::Status Read(int fd, void* buf, uint64_t len, uint64_t offset) override {
    char* p = static_cast<char*>(buf);
    uint64_t done = 0;
    while (done < len) {
      ssize_t n = pread(fd, p + done, len - done, static_cast<off_t>(offset + done));
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) return IoError(false, errno, len, offset);
      if (n == 0) return ShortRead(done, len, offset);
      done += static_cast<uint64_t>(n);
    }
    return absl::OkStatus();
  }
  const char* name() const override { return "posix"; }
};

class UringDiskIo : public DiskIo {
 public:
  ~UringDiskIo() override {
    if (initialized_) io_uring_queue_exit(&ring_);
  }
  // Returns 0 or -errno from io_uring_queue_init.
  int Init() EXCLUDES(mu_) {
    base::MutexLock lock(mu_);  // before the reader is shared; keeps the analysis exact
    const int rc = io_uring_queue_init(kQueueDepth, &ring_, 0);
    initialized_ = rc == 0;
    return rc;
  }

  absl::Status Write(int fd, const void* buf, uint64_t len, uint64_t offset) override {
    return Run(true, fd, const_cast<void*>(buf), len, offset);
  }
  absl::Status Read(int fd, void* buf, uint64_t len, uint64_t offset) override {
    return Run(false, fd, buf, len, offset);
  }
  const char* name() const override { return "io_uring"; }

 private:
  // Submits pieces of [0, len) keeping up to kQueueDepth in flight; a short piece is finished
  // with the posix path (rare: signals, end of file), which also reports a truncated file.
  absl::Status Run(bool write, int fd, void* buf, uint64_t len, uint64_t offset) EXCLUDES(mu_) {
    base::MutexLock lock(mu_);
    char* p = static_cast<char*>(buf);
    uint64_t next = 0;
    unsigned in_flight = 0;
    absl::Status status;
    while (next < len || in_flight > 0) {
      while (next < len && in_flight < kQueueDepth && status.ok()) {
        io_uring_sqe* sqe = io_uring_get_sqe(&ring_);
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
      int rc = io_uring_submit(&ring_);
      if (rc < 0 && rc != -EINTR && rc != -EBUSY) {
        if (status.ok()) status = IoError(write, -rc, len, offset);
      }
      io_uring_cqe* cqe = nullptr;
      rc = io_uring_wait_cqe(&ring_, &cqe);
      if (rc == -EINTR) continue;
      if (rc < 0) {
        if (status.ok()) status = IoError(write, -rc, len, offset);
        break;  // cannot learn completions: give up on the ring (pieces keep their buffers)
      }
      const uint64_t start = io_uring_cqe_get_data64(cqe);
      const int res = cqe->res;
      io_uring_cqe_seen(&ring_, cqe);
      --in_flight;
      if (!status.ok()) continue;
      const uint64_t want = std::min(kPieceBytes, len - start);
      if (res < 0) {
        status = IoError(write, -res, want, offset + start);
      } else if (static_cast<uint64_t>(res) < want) {
        PosixDiskIo rest;
        const uint64_t got = static_cast<uint64_t>(res);
        status = write ? rest.Write(fd, p + start + got, want - got, offset + start + got)
                       : rest.Read(fd, p + start + got, want - got, offset + start + got);
      }
    }
    return status;
  }

  base::Mutex mu_;
  io_uring ring_ GUARDED_BY(mu_){};
  bool initialized_ = false;
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
