// Creating a ring object (client side): a memfd sized for the layout, sealed against shrinking
// and growing (so the daemon that maps it can never touch a vanished page), mapped and
// initialised (common::InitRing).
#ifndef OFFLOADD_COMMON_RING_MEMFD_H_
#define OFFLOADD_COMMON_RING_MEMFD_H_

#include <string>

#include "common/ring_format.h"

namespace offloadd::common {

struct RingMemfd {
  int fd = -1;           // kept open while the ring is in use: Hello names it (RingOffer.fd)
  void* base = nullptr;  // the mapping, layout.total_bytes long
  RingLayout layout;
};

// False (and *error, a sentence) when memfd_create, sizing, sealing or mmap fails.
bool CreateRingMemfd(uint32_t submission_entries, uint32_t completion_entries, RingMemfd* out,
                     std::string* error);
// Unmaps and closes (fd -1, base nullptr afterwards). Safe on an empty RingMemfd.
void DestroyRingMemfd(RingMemfd* ring);

}  // namespace offloadd::common

#endif  // OFFLOADD_COMMON_RING_MEMFD_H_
