#include "server/host_check.h"

#include <dlfcn.h>
#include <linux/capability.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "server/metrics/metrics.h"
#include "server/pool/arena.h"
#include "server/spill/spill_tier.h"

namespace offloadd {
namespace {

constexpr size_t kMaxSocketPathBytes = sizeof(sockaddr_un::sun_path) - 1;  // 107

std::string Dirname(const std::string& path) {
  const size_t slash = path.rfind('/');
  if (slash == std::string::npos) return ".";
  return slash == 0 ? "/" : path.substr(0, slash);
}

// The socket's directory, or the nearest parent that exists when it is still to be created:
// the daemon creates the missing part (mkdir -p), so that parent must be writable.
absl::Status CheckSocketDirectory(const std::string& dir) {
  std::string existing = dir;
  struct stat st;
  while (stat(existing.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::PermissionDeniedError(
          absl::StrFormat("socket directory %s cannot be reached: %s; choose another socket_path",
                          existing, std::strerror(errno)));
    }
    existing = Dirname(existing);
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a directory, so socket directory %s cannot be created; choose another "
        "socket_path",
        existing, dir));
  }
  if (access(existing.c_str(), W_OK | X_OK) != 0) {
    const int err = errno;
    if (existing == dir) {
      return absl::PermissionDeniedError(absl::StrFormat(
          "socket directory %s is not writable by this user (%s): run as its owner or choose "
          "another socket_path",
          dir, std::strerror(err)));
    }
    return absl::PermissionDeniedError(absl::StrFormat(
        "cannot create socket directory %s: %s is not writable by this user (%s); create it or "
        "choose another socket_path",
        dir, existing, std::strerror(err)));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status CheckSocketPath(const std::string& socket_path) {
  if (socket_path.empty() || socket_path.size() > kMaxSocketPathBytes) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "socket path %s is %d bytes; Unix socket paths are limited to %d: choose a shorter "
        "socket_path",
        socket_path, socket_path.size(), kMaxSocketPathBytes));
  }
  if (absl::Status st = CheckSocketDirectory(Dirname(socket_path)); !st.ok()) return st;
  struct stat st;
  if (lstat(socket_path.c_str(), &st) != 0) return absl::OkStatus();  // nothing there yet
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s exists and is not a socket: remove it or choose another socket_path", socket_path));
  }
  const int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return absl::OkStatus();  // cannot probe; the daemon's own probe decides
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::strncpy(addr.sun_path, socket_path.c_str(), sizeof(addr.sun_path) - 1);
  const int rc = connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  close(fd);
  if (rc == 0) {
    return absl::AlreadyExistsError(absl::StrFormat(
        "another offloadd is already listening on %s: stop it first, or start this one with "
        "--socket_path set to another path",
        socket_path));
  }
  return absl::OkStatus();  // a stale socket: the daemon removes it
}

absl::Status ProbeCudaDriver() {
  void* lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
  if (lib == nullptr) {
    return absl::FailedPreconditionError(absl::StrCat(
        "backend \"cuda\" needs the NVIDIA driver, but its library does not load (", dlerror(),
        "): install the driver on the node, or in a container run with the NVIDIA runtime "
        "(runtimeClassName: nvidia, NVIDIA_DRIVER_CAPABILITIES=compute,utility); or use backend: "
        "\"shm\""));
  }
  using InitFn = int (*)(unsigned int);
  using CountFn = int (*)(int*);
  using NameFn = int (*)(int, const char**);
  auto init = reinterpret_cast<InitFn>(dlsym(lib, "cuInit"));
  auto count = reinterpret_cast<CountFn>(dlsym(lib, "cuDeviceGetCount"));
  auto name = reinterpret_cast<NameFn>(dlsym(lib, "cuGetErrorName"));
  absl::Status status;
  if (init == nullptr || count == nullptr) {
    status = absl::FailedPreconditionError(
        "libcuda.so.1 loads but lacks cuInit/cuDeviceGetCount: reinstall the NVIDIA driver");
  } else if (int rc = init(0); rc != 0) {
    const char* text = nullptr;
    if (name == nullptr || name(rc, &text) != 0) text = nullptr;
    status = absl::FailedPreconditionError(absl::StrFormat(
        "backend \"cuda\": the CUDA driver does not initialise (cuInit: %s, error %d): check "
        "nvidia-smi and that /dev/nvidia* are present (in a container: the NVIDIA runtime)",
        text != nullptr ? text : "unknown error", rc));
  } else if (int gpus = 0; count(&gpus) != 0 || gpus == 0) {
    status = absl::FailedPreconditionError(
        "backend \"cuda\": the CUDA driver sees no GPU (NVIDIA_VISIBLE_DEVICES, device cgroup)");
  }
  dlclose(lib);
  return status;
}

bool RaiseIpcLockCapability() {
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (syscall(SYS_capget, &header, data) != 0) return false;
  const uint32_t bit = 1u << (CAP_IPC_LOCK % 32);
  __user_cap_data_struct& word = data[CAP_IPC_LOCK / 32];
  if ((word.effective & bit) != 0) return true;
  if ((word.permitted & bit) == 0) return false;
  word.effective |= bit;
  return syscall(SYS_capset, &header, data) == 0;
}

absl::Status CheckSpillDirectory(const std::string& directory) {
  struct stat st;
  std::string where = directory;  // the directory, or the parent it is to be created in
  if (stat(directory.c_str(), &st) != 0) {
    if (errno != ENOENT) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "spill_directory %s cannot be reached: %s", directory, std::strerror(errno)));
    }
    where = Dirname(directory);
    if (stat(where.c_str(), &st) != 0) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "spill_directory %s cannot be created: its parent %s does not exist (%s); create it",
          directory, where, std::strerror(errno)));
    }
  }
  if (!S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrFormat("spill_directory %s: %s is not a directory", directory, where));
  }
  if (access(where.c_str(), W_OK | X_OK) == 0) return absl::OkStatus();
  const int err = errno;
  if (err == EROFS) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "spill_directory %s is on a file system that is read-only for this process (%s): under "
        "the systemd unit (ProtectSystem=strict) use a directory under /var/lib/offloadd (the "
        "unit's StateDirectory) or add `ReadWritePaths=%s` to the unit (systemctl edit offloadd)",
        directory, std::strerror(err), where == directory ? directory : where));
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "spill_directory %s: this process may not create files in %s (%s): give it to the "
      "daemon's user, or choose another spill_directory",
      directory, where, std::strerror(err)));
}

HostFacts ReadHostFacts(const v1::DaemonConfig& config, bool cuda_in_build) {
  HostFacts f;
  f.mem_available_bytes = pool::ReadMemAvailableBytes();
  rlimit rl{};
  getrlimit(RLIMIT_MEMLOCK, &rl);
  f.memlock_limit_bytes = rl.rlim_cur;
  f.memlock_privileged = pool::MemlockPrivileged();
  if (config.backend() == "cuda") {
    f.cuda = cuda_in_build ? ProbeCudaDriver()
                           : absl::FailedPreconditionError(
                                 "backend \"cuda\" is not in this build (no CUDA toolkit at build "
                                 "time): rebuild on a machine with /usr/local/cuda, or use "
                                 "backend: \"shm\"");
  }
  if (!config.spill_directory().empty()) {
    f.spill_directory = CheckSpillDirectory(config.spill_directory());
  }
  if (!config.metrics_address().empty()) {
    f.metrics_address = metrics::CheckAddressFree(config.metrics_address());
  }
  if (!config.pool_shm_name().empty()) {
    f.shared_pool = pool::InspectSharedPool(config.pool_shm_name(), config.pool_bytes());
    if (config.pool_huge_pages()) f.shm_huge_pages = pool::ShmHugePages();
  }
  return f;
}

namespace {

// Check 4: the memory the pool still needs against MemAvailable.
absl::Status CheckPoolMemory(const v1::DaemonConfig& config, const HostFacts& facts) {
  if (!facts.mem_available_bytes.ok()) return absl::OkStatus();
  const uint64_t available = *facts.mem_available_bytes;
  const pool::SharedPoolObject& object = facts.shared_pool;
  if (!object.exists) return pool::CheckMemAvailable(config.pool_bytes(), available);
  const uint64_t resident = object.resident_bytes;
  const uint64_t need = config.pool_bytes() > resident ? config.pool_bytes() - resident : 0;
  if (need <= available) return absl::OkStatus();
  return absl::ResourceExhaustedError(absl::StrFormat(
      "the pool object /dev/shm/%s holds %d MiB of the pool's %d MiB already (a restart adopts "
      "it and its blocks), but the other %d MiB are more than MemAvailable, %d MiB "
      "(/proc/meminfo): free host memory. Keep pool_bytes and the object as they are: changing "
      "the size or removing the object loses its blocks",
      config.pool_shm_name(), resident >> 20, config.pool_bytes() >> 20, need >> 20,
      available >> 20));
}

}  // namespace

std::vector<absl::Status> HostProblems(const v1::DaemonConfig& config, const HostFacts& facts) {
  std::vector<absl::Status> problems;
  const bool cuda = config.backend() == "cuda";
  if (cuda && !facts.cuda.ok()) problems.push_back(facts.cuda);
  if (config.pool_mlock()) {
    absl::Status st = pool::CheckMemlockLimit(config.pool_bytes(), facts.memlock_limit_bytes,
                                              facts.memlock_privileged);
    if (!st.ok()) problems.push_back(st);
  }
  if (!facts.shared_pool.usable.ok()) problems.push_back(facts.shared_pool.usable);
  if (absl::Status st = CheckPoolMemory(config, facts); !st.ok()) problems.push_back(st);
  if (!facts.spill_directory.ok()) {
    problems.push_back(facts.spill_directory);
  } else if (!config.spill_directory().empty()) {
    absl::Status st = spill::SpillTier::CheckDirectory(config.spill_directory());
    if (!st.ok()) problems.push_back(st);
  }
  if (!facts.metrics_address.ok()) problems.push_back(facts.metrics_address);
  return problems;
}

std::vector<std::string> HostNotes(const v1::DaemonConfig& config, const HostFacts& facts) {
  std::vector<std::string> notes;
  if (config.pool_huge_pages() && !config.pool_shm_name().empty() && !facts.shm_huge_pages.ok()) {
    notes.emplace_back(facts.shm_huge_pages.message());
  }
  if (!config.spill_directory().empty() && facts.spill_directory.ok() &&
      spill::SpillTier::CheckDirectory(config.spill_directory()).ok()) {
    std::string note = spill::SpillTier::DirectoryNote(config.spill_directory());
    if (!note.empty()) notes.push_back(std::move(note));
  }
  return notes;
}

uint64_t FileDescriptorsNeeded(const v1::DaemonConfig& config) {
  if (config.max_connections_total() == 0) return 0;
  return uint64_t{config.max_connections_total()} + config.admin_reserved_connections() +
         config.max_sessions() + 256;
}

absl::Status RaiseFileLimit(const v1::DaemonConfig& config) {
  const uint64_t need = FileDescriptorsNeeded(config);
  rlimit rl{};
  if (need == 0 || getrlimit(RLIMIT_NOFILE, &rl) != 0) return absl::OkStatus();
  if (rl.rlim_cur != RLIM_INFINITY && rl.rlim_cur >= need) return absl::OkStatus();
  if (rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= need) {
    rlimit raised = rl;
    raised.rlim_cur = need;
    if (setrlimit(RLIMIT_NOFILE, &raised) == 0) return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrFormat(
      "RLIMIT_NOFILE allows %d open files (hard limit %d), but the configured bounds let "
      "clients make the daemon hold up to %d (max_connections_total %d + "
      "admin_reserved_connections %d + max_sessions %d + 256 of its own): raise the limit "
      "(LimitNOFILE=%d in the systemd unit, ulimit -n in a shell, --ulimit nofile in a "
      "container) or lower max_connections_total / max_sessions in the config",
      static_cast<uint64_t>(rl.rlim_cur), static_cast<uint64_t>(rl.rlim_max), need,
      config.max_connections_total(), config.admin_reserved_connections(), config.max_sessions(),
      need));
}

}  // namespace offloadd
