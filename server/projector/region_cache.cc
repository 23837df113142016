#include "server/projector/region_cache.h"

#include <sys/stat.h>

#include <utility>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "common/base/clock.h"
#include "common/base/mutex.h"

namespace offloadd::projector {
namespace {

std::string KeyOf(const copy::RegionSpec& spec) {
  return absl::StrCat(spec.shm_name.empty() ? "cuda:" : "shm:",
                      spec.shm_name.empty() ? spec.cuda_ipc_handle : spec.shm_name, "|",
                      spec.size_bytes, "|", spec.device_id);
}

// Inode and owner of /dev/shm/<name> (where Linux keeps shm_open objects); inode 0 when absent.
struct ShmId {
  uint64_t inode = 0;
  int64_t owner_uid = -1;
};
ShmId ShmIdentity(const std::string& name) {
  struct stat st;
  if (stat(("/dev/shm" + name).c_str(), &st) != 0) return {};
  return {static_cast<uint64_t>(st.st_ino), static_cast<int64_t>(st.st_uid)};
}

}  // namespace

RegionCache::RegionCache(copy::CopyEngine* shm_engine, copy::CopyEngine* cuda_engine,
                         RegionCacheOptions options)
    : shm_engine_(shm_engine), cuda_engine_(cuda_engine), options_(std::move(options)) {}

double RegionCache::Now() const {
  if (options_.now_seconds) return options_.now_seconds();
  return base::SteadyNowSeconds();
}

absl::StatusOr<RegionCache::Opened> RegionCache::Open(const copy::RegionSpec& spec) {
  const bool shm = !spec.shm_name.empty();
  copy::CopyEngine* engine = shm ? shm_engine_ : cuda_engine_;
  if (engine == nullptr) {
    return absl::FailedPreconditionError(
        shm ? "this daemon cannot open shm regions for projector refreshes"
            : "this daemon runs without the cuda backend, so it cannot open CUDA IPC handles: "
              "start it with backend \"cuda\" on the GPU node, or stage G and P in shared "
              "memory");
  }
  const std::string key = KeyOf(spec);
  const ShmId id = shm ? ShmIdentity(spec.shm_name) : ShmId{};
  const uint64_t inode = id.inode;
  base::MutexLock lock(mu_);
  const double now = Now();
  // Close idle entries (a client that stopped refreshing should not keep its memory mapped).
  for (auto it = entries_.begin(); it != entries_.end();) {
    if (now - it->last_used > options_.idle_seconds) {
      it = entries_.erase(it);
    } else {
      ++it;
    }
  }
  for (auto it = entries_.begin(); it != entries_.end(); ++it) {
    if (it->key != key) continue;
    if (shm &&
        (it->inode != inode ||
         it->owner_uid != id.owner_uid)) {  // gone or replaced: never serve the old object's memory
      entries_.erase(it);
      break;
    }
    it->last_used = now;
    entries_.splice(entries_.begin(), entries_, it);
    return entries_.front().opened;
  }
  if (shm && inode == 0) {
    return absl::NotFoundError(
        absl::StrCat("shared-memory object ", spec.shm_name,
                     " does not exist: keep it linked until its refreshes have finished"));
  }
  absl::StatusOr<std::shared_ptr<copy::Region>> region = engine->OpenRegion(spec);
  if (!region.ok()) return region.status();
  ++opens_total_;
  entries_.push_front(
      Entry{key, inode, id.owner_uid, Opened{*std::move(region), engine, id.owner_uid}, now});
  while (entries_.size() > options_.max_entries) entries_.pop_back();
  return entries_.front().opened;
}

void RegionCache::Clear() {
  base::MutexLock lock(mu_);
  entries_.clear();
}

size_t RegionCache::size() const {
  base::MutexLock lock(mu_);
  return entries_.size();
}

uint64_t RegionCache::opens_total() const {
  base::MutexLock lock(mu_);
  return opens_total_;
}

}  // namespace offloadd::projector
