// ShmCopyEngine: the shared-memory backend (docs/ARCHITECTURE.md, "Copy backends").
//
// A client's "device memory" is a POSIX shared-memory object it created with shm_open and
// registers by name; a chunk copy is a memcpy between the daemon's mapping of it and the pool.
//
// Mappings: the daemon maps an object once (MAP_SHARED, no MAP_POPULATE: pages are faulted in
// by the copies that touch them), shared by every registration of that object (keyed by
// device and inode) whatever session made it; a registration larger than the current mapping
// maps the object again at the larger size (the smaller mapping goes with its last
// registration). A mapping is unmapped when its last registration is closed. Mappings and
// mapped bytes are charged to the object's owner (st_uid) and bounded per uid and in total
// (ShmMappingLimits): past a bound OpenRegion fails with RESOURCE_EXHAUSTED naming it, so no
// client can exhaust vm.max_map_count or the daemon's page tables. It runs the whole protocol,
// pool, scheduler and failure handling on any Linux machine; the bytes really move. Link rates are
// simulated by the scheduler's pacing, not here.
#ifndef OFFLOADD_SERVER_COPY_SHM_SHM_ENGINE_H_
#define OFFLOADD_SERVER_COPY_SHM_SHM_ENGINE_H_

#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <string>

#include "common/base/mutex.h"
#include "server/copy/blocking_copy_engine.h"
#include "server/copy/copy_engine.h"

namespace offloadd::copy {

// Bounds on the daemon's mappings of client objects (0 = no bound). Defaults keep the daemon
// far below vm.max_map_count (65530) and its page tables for mapped objects under ~0.5 GiB
// (8 bytes per 4 KiB page touched).
struct ShmMappingLimits {
  uint64_t max_mappings_total = 16384;
  uint64_t max_mappings_per_uid = 4096;
  uint64_t max_mapped_bytes_total = 256ull << 30;
  uint64_t max_mapped_bytes_per_uid = 64ull << 30;
};

struct ShmMappingStats {
  uint64_t mappings = 0, mapped_bytes = 0;  // live, all uids
};

// A BlockingCopyEngine: every chunk, posted or ordered, is a memcpy (BlockingCopyChunk) on the
// calling thread; transfers are not ordered against client GPU work (there is none).
class ShmCopyEngine : public BlockingCopyEngine {
 public:
  // Installs the process-wide SIGBUS guard used by BlockingCopyChunk (once).
  explicit ShmCopyEngine(ShmMappingLimits limits = {});
  std::string name() const override { return "shm"; }
  // Errors: INVALID_ARGUMENT for a CUDA handle, an empty or malformed name (must be "/name"
  // without further '/', < 255 bytes) or size 0; NOT_FOUND when no such object exists;
  // PERMISSION_DENIED when the daemon may not open it; OUT_OF_RANGE when size_bytes exceeds the
  // object's size; RESOURCE_EXHAUSTED past a ShmMappingLimits bound or when mmap fails.
  absl::StatusOr<std::shared_ptr<Region>> OpenRegion(const RegionSpec& spec) override;
  // Errors: OUT_OF_RANGE outside the mapping; DATA_LOSS when the client truncated its object
  // under the copy (the SIGBUS is caught; the daemon keeps serving).
  absl::Status BlockingCopyChunk(Direction direction, Region& region, uint64_t region_offset,
                                 uint8_t* host, uint64_t bytes) override;
  // Mappings by the registering session's device id.
  std::map<std::string, HandleCounts> handle_counts() const override;
  void ForgetDevice(const std::string& device_id) override;
  ShmMappingStats mapping_stats() const;

  struct Mappings;  // shm_engine.cc

 private:
  struct Counts {
    base::Mutex mu;
    std::map<std::string, HandleCounts> by_gpu GUARDED_BY(mu);
    // Devices a session without transient_device opened a region of (a subset of by_gpu's keys):
    // ForgetDevice keeps them.
    std::set<std::string> kept GUARDED_BY(mu);
  };
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
  std::shared_ptr<Mappings> mappings_;
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_SHM_SHM_ENGINE_H_
