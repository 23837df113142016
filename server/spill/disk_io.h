// DiskIo: positioned reads and writes of whole buffers on a file opened with O_DIRECT.
//
// Two implementations behind one interface, chosen once at start-up (MakeDiskIo):
//  - io_uring (liburing): a buffer is cut into pieces of kPieceBytes submitted together (up to
//    kQueueDepth in flight), so one call keeps several requests queued at the device.
//  - posix: pread / pwrite loops, for kernels or sandboxes where io_uring_queue_init fails
//    (seccomp filters, io_uring_disabled sysctl).
// O_DIRECT rules the caller must follow: `buf`, `len` and `offset` multiples of kDirectAlignment
// (4096 covers every logical block size in use); DiskIo does not check or bounce.
//
// Errors: a short read (the file ends before offset + len: it was truncated) is DATA_LOSS; a
// failed write with ENOSPC or EDQUOT is RESOURCE_EXHAUSTED; ENOENT / EBADF-like errors keep
// their errno in the message as INTERNAL. Thread-safe: the io_uring ring is used under a mutex
// (one call at a time, each with several pieces in flight).
#ifndef OFFLOADD_SERVER_SPILL_DISK_IO_H_
#define OFFLOADD_SERVER_SPILL_DISK_IO_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace offloadd::spill {

inline constexpr uint64_t kDirectAlignment = 4096;

class DiskIo {
 public:
  virtual ~DiskIo() = default;
  // Writes [buf, buf + len) at `offset` of `fd`.
  virtual absl::Status Write(int fd, const void* buf, uint64_t len, uint64_t offset) = 0;
  // Reads `len` bytes at `offset` of `fd` into `buf`.
  virtual absl::Status Read(int fd, void* buf, uint64_t len, uint64_t offset) = 0;
  // "io_uring" or "posix".
  virtual const char* name() const = 0;
};

// prefer_io_uring: try io_uring first; when its set-up fails (the reason goes to `why_not`),
// or when false, the posix implementation. Never null.
std::unique_ptr<DiskIo> MakeDiskIo(bool prefer_io_uring, std::string* why_not);

// The posix implementation (pread / pwrite), for tests of both paths.
std::unique_ptr<DiskIo> MakePosixDiskIo();

}  // namespace offloadd::spill

#endif  // OFFLOADD_SERVER_SPILL_DISK_IO_H_
