// RegionCache: client regions the projector service has opened, so repeated refreshes that name
// the same handle do not map it again (a shm open stats and maps the object, a CUDA IPC open costs
// ~ms and may happen only once per handle and process).
//
// Routing by handle kind: shm names open through `shm_engine`, CUDA IPC handles through
// `cuda_engine` (the daemon's cuda CopyEngine); a kind without an engine is refused with
// FAILED_PRECONDITION saying which backend it needs.
//
// Keys are the handle bytes (never an address: docs/ARCHITECTURE.md, a freed and reallocated
// allocation gets a new handle), the declared size and the device id. A shm entry is also tied to
// the object's inode (/dev/shm/<name>): each Open stats the name, and a name that is gone or now
// names another object drops the entry (NOT_FOUND, or a fresh open) — so a client must keep its shm
// name linked while refreshes naming it may run. Bounded: at most max_entries, least recently used
// closed first, and entries idle for idle_seconds closed on the next Open. A closed entry's
// mapping lives on while a refresh still holds it (shared_ptr).
//
// Thread-safe.
#ifndef OFFLOADD_SERVER_PROJECTOR_REGION_CACHE_H_
#define OFFLOADD_SERVER_PROJECTOR_REGION_CACHE_H_

#include <cstddef>
#include <cstdint>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/statusor.h"
#include "common/base/mutex.h"
#include "server/copy/copy_engine.h"

namespace offloadd::projector {

struct RegionCacheOptions {
  size_t max_entries = 16;
  double idle_seconds = 60.0;
  std::function<double()> now_seconds;  // monotonic clock; default steady_clock
};

class RegionCache {
 public:
  struct Opened {
    std::shared_ptr<copy::Region> region;
    copy::CopyEngine* engine = nullptr;  // the engine that opened it: use it for CopyChunk
    int64_t owner_uid = -1;              // shm: the object's owner (st_uid); CUDA: -1
  };

  RegionCache(copy::CopyEngine* shm_engine, copy::CopyEngine* cuda_engine,
              RegionCacheOptions options = {});

  // Errors: the engine's OpenRegion errors (NOT_FOUND for a missing shm object, OUT_OF_RANGE
  // when size_bytes exceeds the real object, FAILED_PRECONDITION for CUDA handle failures),
  // FAILED_PRECONDITION when no engine here opens that kind of handle.
  absl::StatusOr<Opened> Open(const copy::RegionSpec& spec);

  void Clear();
  size_t size() const;
  uint64_t opens_total() const;  // engine opens (cache misses) since construction

 private:
  struct Entry {
    std::string key;
    uint64_t inode = 0;  // shm only
    int64_t owner_uid = -1;
    Opened opened;
    double last_used = 0;
  };
  double Now() const;

  copy::CopyEngine* shm_engine_;
  copy::CopyEngine* cuda_engine_;
  RegionCacheOptions options_;
  mutable base::Mutex mu_;
  std::list<Entry> entries_ GUARDED_BY(mu_);  // most recently used first
  uint64_t opens_total_ GUARDED_BY(mu_) = 0;
};

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_REGION_CACHE_H_
