#include "client/shm_region.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"

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

// The inode of this process's PID namespace (/proc/self/ns/pid -> "pid:[4026531836]"), 0 when
// unreadable. Names carry it because /dev/shm is often shared across PID namespaces (containers,
// sandboxes): a pid is only meaningful inside its own namespace.
uint64_t PidNamespaceId() {
  static const uint64_t id = [] {
    char buf[64] = {};
    const ssize_t n = readlink("/proc/self/ns/pid", buf, sizeof(buf) - 1);
    absl::string_view v(buf, n > 0 ? static_cast<size_t>(n) : 0);
    uint64_t out = 0;
    if (!absl::ConsumePrefix(&v, "pid:[") || !absl::ConsumeSuffix(&v, "]") ||
        !absl::SimpleAtoi(v, &out)) {
      return uint64_t{0};
    }
    return out;
  }();
  return id;
}

std::string UniqueName() {
  static std::atomic<uint64_t> counter{0};
  thread_local std::mt19937_64 rng{std::random_device{}()};
  return absl::StrFormat("/offloadd-%d-%d-%d-%016x", static_cast<int>(getpid()), PidNamespaceId(),
                         counter.fetch_add(1, std::memory_order_relaxed), rng());
}

// For "offloadd-<pid>-<pidns>-<n>-<hex>": true with pid and pidns set; false for other names.
bool ParseRegionName(absl::string_view name, int* pid, uint64_t* pidns) {
  if (!absl::ConsumePrefix(&name, "offloadd-")) return false;
  const std::vector<absl::string_view> parts = absl::StrSplit(name, '-');
  return parts.size() == 4 && absl::SimpleAtoi(parts[0], pid) && *pid > 0 &&
         absl::SimpleAtoi(parts[1], pidns);
}

}  // namespace

int ShmRegion::SweepStaleRegions() {
  DIR* d = opendir("/dev/shm");
  if (d == nullptr) return 0;
  int removed = 0;
  const uid_t me = geteuid();
  const uint64_t my_pidns = PidNamespaceId();
  while (my_pidns != 0) {
    const dirent* e = readdir(d);
    if (e == nullptr) break;
    const absl::string_view name(e->d_name);
    int pid = 0;
    uint64_t pidns = 0;
    // Not a ShmRegion name, or made in another PID namespace (its pid means nothing here).
    if (!ParseRegionName(name, &pid, &pidns) || pidns != my_pidns) continue;
    const std::string proc = absl::StrCat("/proc/", pid);
    struct stat st;
    if (stat(proc.c_str(), &st) == 0) continue;  // its process lives
    const std::string path = absl::StrCat("/dev/shm/", name);
    if (stat(path.c_str(), &st) == 0 && st.st_uid == me &&
        shm_unlink(absl::StrCat("/", name).c_str()) == 0) {
      ++removed;
    }
  }
  closedir(d);
  return removed;
}

absl::StatusOr<ShmRegion> ShmRegion::Create(uint64_t size_bytes, const ShmRegionOptions& options) {
  static const int swept = SweepStaleRegions();  // once per process
  (void)swept;
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
