// ShmCopyEngine: the shared-memory backend (docs/ARCHITECTURE.md, "Copy backends").
//
// A client's "device memory" is a POSIX shared-memory object it created with shm_open and
// registers once by name; the daemon maps it MAP_SHARED (once per registration) and a chunk copy
// is a memcpy between that mapping and the pool. It runs the whole protocol, pool, scheduler and
// failure handling on any Linux machine; the bytes really move. Link rates are simulated by the
// scheduler's pacing, not here.
#ifndef OFFLOADD_SERVER_COPY_SHM_ENGINE_H_
#define OFFLOADD_SERVER_COPY_SHM_ENGINE_H_

#include <mutex>

#include "server/copy/copy_engine.h"

namespace offloadd::copy {

class ShmCopyEngine : public CopyEngine {
 public:
  // Installs the process-wide SIGBUS guard used by CopyChunk (once).
  ShmCopyEngine();
  std::string name() const override { return "shm"; }
  // Errors: INVALID_ARGUMENT for a CUDA handle, an empty or malformed name (must be "/name"
  // without further '/', < 255 bytes) or size 0; NOT_FOUND when no such object exists;
  // PERMISSION_DENIED when the daemon may not open it; OUT_OF_RANGE when size_bytes exceeds the
  // object's size.
  absl::StatusOr<std::shared_ptr<Region>> OpenRegion(const RegionSpec& spec) override;
  // Errors: OUT_OF_RANGE outside the mapping; DATA_LOSS when the client truncated its object
  // under the copy (the SIGBUS is caught; the daemon keeps serving).
  absl::Status CopyChunk(Direction direction, Region& region, uint64_t region_offset,
                         uint8_t* host, uint64_t bytes) override;
  // Mappings by the registering session's device id.
  std::map<std::string, HandleCounts> handle_counts() const override;

 private:
  struct Counts {
    std::mutex mu;
    std::map<std::string, HandleCounts> by_gpu;
  };
  std::shared_ptr<Counts> counts_ = std::make_shared<Counts>();
};

}  // namespace offloadd::copy

#endif  // OFFLOADD_SERVER_COPY_SHM_ENGINE_H_
