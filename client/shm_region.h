// ShmRegion: a POSIX shared-memory object mapped into this process. On the shm copy backend it is
// the client's "device memory": the client registers it with the daemon by name
// (RegionHandle.shm_name), the daemon maps the same object and memcpy's between it and the pool.
//
// Shapes and units: a region is a flat array of size_bytes() bytes (uint64), page-aligned at
// data(). Offsets sent with Offload/Reload are byte offsets into it.
//
// Ownership:
//   - Create() makes a new object (shm_open O_CREAT|O_EXCL, mode 0600 by default) with a unique
//     name "/offloadd-<pid>-<pid namespace inode>-<counter>-<random hex>", sizes it (ftruncate, then posix_fallocate so
//     a full /dev/shm is reported now rather than as SIGBUS on first touch), and maps it
//     MAP_SHARED read/write. The owner unmaps AND shm_unlink()s it in the destructor.
//   - Open(name) maps an existing object (its whole current size, from fstat) without owning it:
//     the destructor only unmaps. This is how a second process (the daemon) sees the bytes.
//   - A process killed before its destructors ran leaves its names behind (they are kept while
//     the region lives, for registering it again with a restarted daemon): the first Create()
//     of every process removes this uid's "/offloadd-<pid>-..." objects whose process is gone
//     (SweepStaleRegions; the Python client's staging arena does the same for its names). Only
//     names made in the sweeper's own PID namespace are candidates: /dev/shm is often shared
//     between containers or sandboxes whose pids overlap, and a pid from another namespace says
//     nothing about whether its process lives.
// Pages are not pre-faulted (first touch costs ~2 GB/s, docs/ARCHITECTURE.md); touch them if that
// matters. Move-only. Not thread-safe to move/destroy concurrently with use; reading/writing data()
// from several threads is as safe as any shared memory (no synchronisation is provided).
#ifndef OFFLOADD_CLIENT_SHM_REGION_H_
#define OFFLOADD_CLIENT_SHM_REGION_H_

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <utility>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace offloadd {
namespace client {

struct ShmRegionOptions {
  // Permission bits of the new object. 0600 suits a daemon running as root or as the same user;
  // use 0660 plus a shared group when the daemon runs as another unprivileged user.
  mode_t mode = 0600;
  // Reserve the pages in /dev/shm at creation (posix_fallocate). Disable only for sparse use.
  bool reserve = true;
};

class ShmRegion {
 public:
  // Creates, sizes and maps a new uniquely named object of `size_bytes` bytes (> 0).
  // Errors: INVALID_ARGUMENT size_bytes == 0;
  //         RESOURCE_EXHAUSTED /dev/shm has no room (ENOSPC/ENOMEM/EFBIG) or mmap ENOMEM;
  //         PERMISSION_DENIED shm_open EACCES/EPERM;
  //         INTERNAL any other syscall failure (message names the call, the name and errno text).
  static absl::StatusOr<ShmRegion> Create(uint64_t size_bytes,
                                          const ShmRegionOptions& options = {});

  // Maps an existing object read/write, non-owning. `name` must look like "/name" (leading
  // slash, no other slash, at most 255 bytes).
  // Errors: INVALID_ARGUMENT malformed name; NOT_FOUND no such object (ENOENT);
  //         PERMISSION_DENIED EACCES; FAILED_PRECONDITION the object has size 0;
  //         INTERNAL other failures.
  static absl::StatusOr<ShmRegion> Open(absl::string_view name);

  // Unlinks this uid's /dev/shm/offloadd-<pid>-<pidns>-<n>-<hex> objects made in this process's
  // PID namespace whose pid has no process (/proc/<pid> missing); returns how many. Create()
  // calls it once per process. Removes nothing when /proc/self/ns/pid is unreadable.
  static int SweepStaleRegions();

  ShmRegion(ShmRegion&& other) noexcept;
  ShmRegion& operator=(ShmRegion&& other) noexcept;
  ShmRegion(const ShmRegion&) = delete;
  ShmRegion& operator=(const ShmRegion&) = delete;
  ~ShmRegion();

  void* data() { return data_; }
  const void* data() const { return data_; }
  uint64_t size_bytes() const { return size_bytes_; }
  // The shm_open name, with its leading slash (what RegionHandle.shm_name carries).
  const std::string& name() const { return name_; }
  // True for Create()d regions: the destructor unlinks the name.
  bool owner() const { return owner_; }

 private:
  ShmRegion(std::string name, void* data, uint64_t size_bytes, bool owner)
      : name_(std::move(name)), data_(data), size_bytes_(size_bytes), owner_(owner) {}
  void Reset();

  std::string name_;
  void* data_ = nullptr;
  uint64_t size_bytes_ = 0;
  bool owner_ = false;
};

}  // namespace client
}  // namespace offloadd

#endif  // OFFLOADD_CLIENT_SHM_REGION_H_
