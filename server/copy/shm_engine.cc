#include "server/copy/shm_engine.h"

#include <fcntl.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <functional>

#include "absl/strings/escaping.h"
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

// A client may truncate its shared-memory object while the daemon copies from or to it; touching
// the vanished pages raises SIGBUS. Copies run under a per-thread guard: the handler jumps back
// out of the copy, which then fails instead of killing the daemon. SIGBUS outside a guarded
// copy keeps its default action.
// volatile + signal fences: the compiler must not drop or move the stores around memcpy.
thread_local sigjmp_buf* volatile t_copy_guard = nullptr;

void OnSigbus(int sig, siginfo_t* info, void* ctx) {
  (void)info;
  (void)ctx;
  if (t_copy_guard != nullptr) siglongjmp(*t_copy_guard, 1);
  signal(sig, SIG_DFL);
  raise(sig);
}

void InstallSigbusGuard() {
  static const bool installed = [] {
    struct sigaction sa {};
    sa.sa_sigaction = OnSigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
    return sigaction(SIGBUS, &sa, nullptr) == 0;
  }();
  (void)installed;
}

bool GuardedCopy(uint8_t* dst, const uint8_t* src, uint64_t bytes) {
  sigjmp_buf jump;
  if (sigsetjmp(jump, /*savemask=*/1) != 0) {
    t_copy_guard = nullptr;
    return false;
  }
  t_copy_guard = &jump;
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(dst, src, bytes);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  t_copy_guard = nullptr;
  return true;
}

}  // namespace

ShmCopyEngine::ShmCopyEngine() { InstallSigbusGuard(); }

absl::StatusOr<std::shared_ptr<Region>> ShmCopyEngine::OpenRegion(const RegionSpec& spec) {
  if (!spec.cuda_ipc_handle.empty()) {
    return absl::InvalidArgumentError(
        "this daemon runs the shm backend and cannot open CUDA IPC handles: register a "
        "shared-memory region (shm_name), or start offloadd with backend: \"cuda\"");
  }
  const std::string& name = spec.shm_name;
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != std::string::npos ||
      name.size() >= 255 || name.find('\0') != std::string::npos || name == "/." ||
      name == "/..") {
    return absl::InvalidArgumentError(absl::StrFormat(
        "shared-memory region name '%s' is malformed: use \"/name\" (one leading slash, no other "
        "slash or NUL, not . or .., under 255 bytes) as passed to shm_open",
        absl::CHexEscape(name.substr(0, 64))));
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
    if (err == EINVAL || err == ELOOP || err == EISDIR || err == ENAMETOOLONG) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "'%s' is not a shared-memory object the daemon can open (%s): register an object "
          "created with shm_open",
          name, strerror(err)));
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
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::InvalidArgumentError(absl::StrFormat(
        "'%s' is not a regular shared-memory object: register an object created with shm_open",
        name));
  }
  // MAP_POPULATE maps every page now, so copies take no page faults in the daemon — but only
  // when the object's pages exist already: populating a sparse object would allocate its memory
  // on the client's behalf, on the RPC thread.
  const bool resident = static_cast<uint64_t>(st.st_blocks) * 512 >= spec.size_bytes;
  void* p = mmap(nullptr, spec.size_bytes, PROT_READ | PROT_WRITE,
                 MAP_SHARED | (resident ? MAP_POPULATE : 0), fd, 0);
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
  const bool ok = direction == Direction::kDeviceToHost ? GuardedCopy(host, dev, bytes)
                                                        : GuardedCopy(dev, host, bytes);
  if (!ok) {
    return absl::DataLossError(
        "the client's shared-memory region shrank under the copy (SIGBUS): keep registered "
        "regions at their registered size until they are unregistered");
  }
  return absl::OkStatus();
}

}  // namespace offloadd::copy
