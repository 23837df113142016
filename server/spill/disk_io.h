// DiskIo: positioned reads and writes of whole buffers on a file opened with O_DIRECT.
//
// Two implementations behind one interface, chosen once at start-up (MakeDiskIo):
//  - io_uring (liburing): a buffer is cut into pieces of kPieceBytes submitted together (up to
//    kQueueDepth in flight), so one call keeps several requests queued at the device. Each
//    call takes a ring of its own from a small pool (a new ring when all are in use: one per
//    concurrent caller at most), so calls from several threads never wait for each other; a
//    call that finds none free and cannot make one (no descriptor left, locked-memory limits)
//    runs as posix does.
//  - posix: pread / pwrite loops, for kernels or sandboxes where io_uring_queue_init fails
//    (seccomp filters, io_uring_disabled sysctl).
// O_DIRECT rules the caller must follow: `buf`, `len` and `offset` multiples of kDirectAlignment
// (4096 covers every logical block size in use); DiskIo does not check or bounce.
//
// Errors: a short read (the file ends before offset + len: it was truncated) is DATA_LOSS; a
// failed write with ENOSPC or EDQUOT is RESOURCE_EXHAUSTED; ENOENT / EBADF-like errors keep
// their errno in the message as INTERNAL. Thread-safe.
#ifndef OFFLOADD_SERVER_SPILL_DISK_IO_H_
#define OFFLOADD_SERVER_SPILL_DISK_IO_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace offloadd::spill {

inline constexpr uint64_t kDirectAlignment = 4096;

class DiskIo {
 public:
  // Told that bytes [start, start + len) of a Read's buffer (offsets into `buf`) are read, on
  // the thread that called Read, before Read returns. io_uring calls it per piece as each one
  // completes, in any order, while later pieces are still in flight at the device, so work on
  // the bytes (the stage-back's CRC32C) overlaps the rest of the read; posix calls it once,
  // for the whole buffer. It must not call into this DiskIo. Not called for bytes of a Read
  // that fails.
  using PieceRead = std::function<void(uint64_t start, uint64_t len)>;

  virtual ~DiskIo() = default;
  // Writes [buf, buf + len) at `offset` of `fd`.
  virtual absl::Status Write(int fd, const void* buf, uint64_t len, uint64_t offset) = 0;
  // Reads `len` bytes at `offset` of `fd` into `buf`; `on_piece` (may be null) as above.
  virtual absl::Status Read(int fd, void* buf, uint64_t len, uint64_t offset,
                            const PieceRead* on_piece) = 0;
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
