#include "server/copy/shm_engine.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <functional>

#include "absl/strings/str_format.h"

namespace offloadd::copy {
namespace {

class ShmRegion : public Region {
 public:
  using Release = std::function<void()>;
  ShmRegion(uint8_t* data, uint64_t size, Release release)
      : data_(data), size_(size), release_(std::move(release)) {}
  ~ShmRegion() override {
    munmap(data_, size_);
    release_();
  }
  uint64_t size_bytes() const override { return size_; }
  uint8_t* data() const { return data_; }

 private:
  uint8_t* data_;
  uint64_t size_;
  Release release_;
};

}  // namespace

absl::StatusOr<std::shared_ptr<Region>> ShmCopyEngine::OpenRegion(const RegionSpec& spec) {
  if (!spec.cuda_ipc_handle.empty()) {
    return absl::InvalidArgumentError(
        "this daemon runs the shm backend and cannot open CUDA IPC handles: register a "
        "shared-memory region (shm_name), or start offloadd with backend: \"cuda\"");
  }
  const std::string& name = spec.shm_name;
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() >= 255) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shared-memory region name '%s' is malformed: use \"/name\" (one leading slash, no other "
        "slash, under 255 bytes) as passed to shm_open",
        name));
  }
  if (spec.size_bytes == 0) {
    return absl::InvalidArgumentError("region size_bytes is 0: register a non-empty region");
  }
  int fd = shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) {
    int err = errno;
    if (err == ENOENT) {
      return absl::NotFoundError(absl::StrFormat(
          "shared-memory region '%s' does not exist: create it with shm_open before registering "
          "it (the client library's ShmRegion does)",
          name));
    }
    if (err == EACCES) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "the daemon may not open shared-memory region '%s': create it with mode 0660 and the "
          "daemon's group",
          name));
    }
    return absl::InternalError(absl::StrFormat("shm_open('%s'): %s", name, strerror(err)));
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return absl::InternalError(absl::StrFormat("fstat('%s'): %s", name, strerror(err)));
  }
  if (static_cast<uint64_t>(st.st_size) < spec.size_bytes) {
    close(fd);
    return absl::OutOfRangeError(absl::StrFormat(
        "region '%s' is registered as %d bytes but the shared-memory object has only %d: "
        "register its real size",
        name, spec.size_bytes, static_cast<uint64_t>(st.st_size)));
  }
  // MAP_POPULATE: map every page now, so copies do not take page faults in the daemon.
  void* p = mmap(nullptr, spec.size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  int err = errno;
  close(fd);
  if (p == MAP_FAILED) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("mmap of region '%s' (%d bytes): %s", name, spec.size_bytes,
                        strerror(err)));
  }
  {
    std::lock_guard<std::mutex> lock(counts_->mu);
    HandleCounts& c = counts_->by_gpu[spec.device_id];
    ++c.opens_total;
    ++c.open;
  }
  auto release = [counts = counts_, gpu = spec.device_id] {
    std::lock_guard<std::mutex> lock(counts->mu);
    --counts->by_gpu[gpu].open;
  };
  return std::shared_ptr<Region>(
      new ShmRegion(static_cast<uint8_t*>(p), spec.size_bytes, std::move(release)));
}

std::map<std::string, HandleCounts> ShmCopyEngine::handle_counts() const {
  std::lock_guard<std::mutex> lock(counts_->mu);
  return counts_->by_gpu;
}

absl::Status ShmCopyEngine::CopyChunk(Direction direction, Region& region, uint64_t region_offset,
                                      uint8_t* host, uint64_t bytes) {
  auto& shm = static_cast<ShmRegion&>(region);
  if (region_offset > shm.size_bytes() || bytes > shm.size_bytes() - region_offset) {
    return absl::OutOfRangeError("chunk outside the region");
  }
  uint8_t* dev = shm.data() + region_offset;
  if (direction == Direction::kDeviceToHost) {
    std::memcpy(host, dev, bytes);
  } else {
    std::memcpy(dev, host, bytes);
  }
  return absl::OkStatus();
}

}  // namespace offloadd::copy
