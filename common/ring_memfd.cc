#include "common/ring_memfd.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace offloadd::common {

bool CreateRingMemfd(uint32_t submission_entries, uint32_t completion_entries, RingMemfd* out,
                     std::string* error) {
  RingLayout layout;
  if (!MakeRingLayout(submission_entries, completion_entries, &layout, error)) return false;
  const int fd = memfd_create("offloadd-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) {
    *error = std::string("memfd_create for the request ring failed: ") + strerror(errno);
    return false;
  }
  const char* step = nullptr;
  void* base = MAP_FAILED;
  if (ftruncate(fd, static_cast<off_t>(layout.total_bytes)) != 0) {
    step = "sizing";
  } else if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    step = "sealing";
  } else if ((base = mmap(nullptr, layout.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd,
                          0)) == MAP_FAILED) {
    step = "mapping";
  }
  if (step != nullptr) {
    *error = std::string(step) + " the request ring's memfd failed: " + strerror(errno);
    close(fd);
    return false;
  }
  InitRing(base, layout);
  out->fd = fd;
  out->base = base;
  out->layout = layout;
  return true;
}

void DestroyRingMemfd(RingMemfd* ring) {
  if (ring->base != nullptr) munmap(ring->base, ring->layout.total_bytes);
  if (ring->fd >= 0) close(ring->fd);
  ring->base = nullptr;
  ring->fd = -1;
}

}  // namespace offloadd::common
