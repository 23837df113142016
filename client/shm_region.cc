#include "client/shm_region.h"

#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cstring>
#include <limits>
#include <random>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace offloadd {
namespace client {
namespace {

constexpr size_t kMaxShmNameBytes = 255;  // NAME_MAX for a /dev/shm entry

std::string ErrnoText(int err) { return absl::StrCat(std::strerror(err), " (errno ", err, ")"); }

// Maps errno of a failed syscall to a status whose message names the call and the object.
absl::Status SyscallError(int err, absl::string_view call, absl::string_view name) {
  std::string msg = absl::StrCat(call, "(\"", name, "\") failed: ", ErrnoText(err));
  if (call == "mmap" && err == ENOMEM) {
    return absl::ResourceExhaustedError(
        absl::StrCat(msg, "; not enough address space or memory to map the region"));
  }
  switch (err) {
    case ENOENT:
      return absl::NotFoundError(
          absl::StrCat(msg, "; no shared-memory object of that name exists in /dev/shm"));
    case EACCES:
    case EPERM:
      return absl::PermissionDeniedError(
          absl::StrCat(msg, "; check the object's owner and mode (ls -l /dev/shm)"));
    case ENOSPC:
    case ENOMEM:
    case EFBIG:
      return absl::ResourceExhaustedError(absl::StrCat(
          msg,
          "; /dev/shm is too small: free space there or enlarge it (mount -o "
          "remount,size=... /dev/shm, or docker --shm-size / an emptyDir medium: Memory)"));
    default:
      return absl::InternalError(msg);
  }
}

std::string UniqueName() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("/offloadd-%d-%d-%016x", static_cast<int>(getpid()),
                         counter.fetch_add(1, std::memory_order_relaxed), rng());
}

}  // namespace

absl::StatusOr<ShmRegion> ShmRegion::Create(uint64_t size_bytes, const ShmRegionOptions& options) {
  if (size_bytes == 0) {
    return absl::InvalidArgumentError("ShmRegion::Create: size_bytes must be > 0");
  }
  if (size_bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max())) {
    return absl::InvalidArgumentError(
        absl::StrCat("ShmRegion::Create: size_bytes ", size_bytes, " exceeds off_t"));
  }
  std::string name;
  int fd = -1;
  // O_EXCL guarantees we never adopt someone else's object; retry on the (unlikely) collision.
  for (int attempt = 0; attempt < 8 && fd < 0; ++attempt) {
    name = UniqueName();
    fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, options.mode);
    if (fd < 0 && errno != EEXIST) return SyscallError(errno, "shm_open", name);
  }
  if (fd < 0) return SyscallError(EEXIST, "shm_open", name);

  auto fail = [&](int err, absl::string_view call) {
    close(fd);
    shm_unlink(name.c_str());
    return SyscallError(err, call, name);
  };
  if (ftruncate(fd, static_cast<off_t>(size_bytes)) != 0) return fail(errno, "ftruncate");
  if (options.reserve) {
    // posix_fallocate returns the error number instead of setting errno.
    int err = posix_fallocate(fd, 0, static_cast<off_t>(size_bytes));
    if (err != 0 && err != EOPNOTSUPP && err != EINVAL) return fail(err, "posix_fallocate");
  }
  void* data = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (data == MAP_FAILED) return fail(errno, "mmap");
  close(fd);  // the mapping keeps the object alive
  return ShmRegion(std::move(name), data, size_bytes, /*owner=*/true);
}

absl::StatusOr<ShmRegion> ShmRegion::Open(absl::string_view name) {
  if (name.size() < 2 || name[0] != '/' || name.find('/', 1) != absl::string_view::npos ||
      name.size() > kMaxShmNameBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        "ShmRegion::Open: \"", name,
        "\" is not a POSIX shared-memory name: it must start with '/' and contain no other '/'"));
  }
  std::string n(name);
  int fd = shm_open(n.c_str(), O_RDWR | O_CLOEXEC, 0);
  if (fd < 0) return SyscallError(errno, "shm_open", n);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return SyscallError(err, "fstat", n);
  }
  if (st.st_size <= 0) {
    close(fd);
    return absl::FailedPreconditionError(
        absl::StrCat("ShmRegion::Open(\"", n, "\"): the object has size 0 (not yet sized?)"));
  }
  uint64_t size_bytes = static_cast<uint64_t>(st.st_size);
  void* data = mmap(nullptr, size_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  int err = errno;
  close(fd);
  if (data == MAP_FAILED) return SyscallError(err, "mmap", n);
  return ShmRegion(std::move(n), data, size_bytes, /*owner=*/false);
}

ShmRegion::ShmRegion(ShmRegion&& other) noexcept
    : name_(std::move(other.name_)),
      data_(std::exchange(other.data_, nullptr)),
      size_bytes_(std::exchange(other.size_bytes_, 0)),
      owner_(std::exchange(other.owner_, false)) {
  other.name_.clear();
}

ShmRegion& ShmRegion::operator=(ShmRegion&& other) noexcept {
  if (this != &other) {
    Reset();
    name_ = std::move(other.name_);
    other.name_.clear();
    data_ = std::exchange(other.data_, nullptr);
    size_bytes_ = std::exchange(other.size_bytes_, 0);
    owner_ = std::exchange(other.owner_, false);
  }
  return *this;
}

ShmRegion::~ShmRegion() { Reset(); }

void ShmRegion::Reset() {
  if (data_ != nullptr) munmap(data_, size_bytes_);
  if (owner_ && !name_.empty()) shm_unlink(name_.c_str());
  data_ = nullptr;
  size_bytes_ = 0;
  owner_ = false;
  name_.clear();
}

}  // namespace client
}  // namespace offloadd
