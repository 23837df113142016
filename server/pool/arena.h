// Arena: the daemon's host-RAM pool, mapped once at start-up and never grown or remapped.
//
// One anonymous private mapping of `size_bytes`, pre-faulted (MAP_POPULATE, then a write to every
// page) so copies never run into untouched pages (~2 GB/s instead of ~10 GB/s,
// docs/ARCHITECTURE.md), optionally mlock'ed and optionally backed by transparent huge pages (then
// the mapping starts on a 2 MiB boundary and is advised MADV_HUGEPAGE before any page is touched).
// After Create() nothing in the request path maps, allocates host memory or pins: extents are
// carved out by ExtentAllocator.
//
// NUMA placement: with `numa_nodes` set, the pool is split into one slice per
// node (ArenaSlices: equal parts, 2 MiB-aligned) and each slice is bound to its node with
// mbind(MPOL_BIND) before its pages are touched, so the prefault allocates them there. A shared
// pool's pages may exist already (posix_fallocate, or a previous daemon's): they are faulted in
// first and moved (MPOL_MF_MOVE), and the binding also governs pages allocated later. Which
// slice a block goes to is SlicedExtentAllocator's business (sliced_allocator.h); the arena only
// lays the slices out and binds them.
//
// Checks made before mapping, so a misconfigured node fails at start-up with a sentence saying
// what to change rather than being OOM-killed or failing later in cudaHostRegister:
//  - size vs MemAvailable from /proc/meminfo (CheckMemAvailable);
//  - with mlock: size vs RLIMIT_MEMLOCK (CheckMemlockLimit), skipped when the process holds
//    CAP_IPC_LOCK, which the kernel exempts from the limit (root normally holds it; a container's
//    root may not).
#ifndef OFFLOADD_SERVER_POOL_ARENA_H_
#define OFFLOADD_SERVER_POOL_ARENA_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/pool/block_table.h"

namespace offloadd::pool {

struct ArenaOptions {
  uint64_t size_bytes = 0;  // > 0; rounded up to the page size (4 KiB)
  bool mlock = false;       // lock the pages; fails early if RLIMIT_MEMLOCK is too low
  bool huge_pages = false;  // madvise(MADV_HUGEPAGE); a hint, never an error
  bool prefault = true;     // touch every page now
  // Non-empty: the arena is the named POSIX shared-memory object "/<shm_name>" (shm_open; a file
  // in /dev/shm) holding a metadata area (block_table.h) before the data, so it and the blocks
  // recorded in it outlive the process. Empty: an anonymous private mapping, gone with the
  // process.
  std::string shm_name;
  // Non-empty: one slice per node, in this order, bound to it (see above). Each must be a node
  // this process may allocate on (numa_all_nodes_ptr: online, with memory, in its cpuset), none
  // twice. Empty: one
  // slice, no binding (the kernel's default policy: pages land where they are first touched).
  std::vector<int> numa_nodes;
};

// A part of the arena bound to one NUMA node; offsets are from Arena::base().
struct ArenaSlice {
  int numa_node = -1;  // -1: not bound (no numa_nodes given)
  uint64_t offset_bytes = 0;
  uint64_t size_bytes = 0;
};

// The slices Create() makes of `size_bytes` for `numa_nodes`: equal parts rounded down to 2 MiB
// (to the 4 KiB page when a part is under 2 MiB), the last taking the remainder; one unbound
// slice of everything when `numa_nodes` is empty. Slices with 0 bytes are possible only when
// size_bytes < nodes x 4 KiB.
std::vector<ArenaSlice> ArenaSlices(uint64_t size_bytes, const std::vector<int>& numa_nodes);

// Layout of a shared pool object: a 4 KiB header, the block records, then the data area at
// SharedDataOffset (a multiple of 2 MiB). One record slot per 16 KiB of pool, at least 4096.
uint64_t SharedRecordSlots(uint64_t size_bytes);
uint64_t SharedDataOffset(uint64_t size_bytes);

// What is at /dev/shm/<shm_name> before a daemon starts on it (offloadd --check-config): a
// restarted daemon adopts that object, so its memory is in use already and is not allocated
// again. Never creates, changes or locks anything.
struct SharedPoolObject {
  bool exists = false;
  uint64_t size_bytes = 0;      // the object's size (header, records and data)
  uint64_t resident_bytes = 0;  // bytes of memory it holds now (st_blocks x 512)
  // OK, or the FAILED_PRECONDITION start-up would fail with for it, in the same words: another
  // owner or a group/other mode, or a size other than `pool_bytes` asks for (the advice names the
  // way that keeps its blocks first). FAILED_PRECONDITION too when it cannot be looked at.
  absl::Status usable;
};
SharedPoolObject InspectSharedPool(const std::string& shm_name, uint64_t pool_bytes);

// Whether a shared pool in /dev/shm gets huge pages when advised MADV_HUGEPAGE, from
// /proc/self/mountinfo text and /sys/kernel/mm/transparent_hugepage/shmem_enabled text (the
// kernel's rules, Documentation/admin-guide/mm/transhuge.rst "Hugepages in tmpfs/shmem"): yes
// when shmem_enabled is "force", or the last mount on /dev/shm has huge=always, within_size or
// advise and shmem_enabled is not "deny". Else FAILED_PRECONDITION saying what /dev/shm has and
// how to change it (mount option huge=within_size, or pool_huge_pages: false).
absl::Status ShmHugePagesFor(absl::string_view mountinfo, absl::string_view shmem_enabled);
// ShmHugePagesFor on this host's files; UNAVAILABLE when /proc/self/mountinfo cannot be read.
absl::Status ShmHugePages();

class Arena {
 public:
  // Errors: INVALID_ARGUMENT for size 0 or bad numa_nodes (CheckNumaNodes; FAILED_PRECONDITION
  // without kernel NUMA support), FAILED_PRECONDITION when mbind refuses a slice; RESOURCE_EXHAUSTED when the size exceeds MemAvailable
  // or mmap fails (message names the size and how much RAM is available); FAILED_PRECONDITION
  // when mlock is asked for and RLIMIT_MEMLOCK is below the size, or mlock itself is refused
  // (message says how to raise it: LimitMEMLOCK=infinity in systemd, `ulimit -l`, or the pod's
  // securityContext / container ulimits); RESOURCE_EXHAUSTED when mlock fails for lack of memory.
  // Nothing stays mapped after an error.
  // With shm_name, the object is created when missing and adopted when it exists (the caller
  // reads block_table()->Adopt()). Policy for an object that does not match (docs/failure-modes.md):
  // refuse to start, FAILED_PRECONDITION, naming the object's and the config's size and
  // layout and how to proceed (set pool_bytes back, or remove the object, losing its blocks) —
  // never re-initialise a pool that may hold confirmed blocks. Also FAILED_PRECONDITION when
  // another process holds the object (flock) or it is not an offloadd pool; RESOURCE_EXHAUSTED
  // when /dev/shm has no room for it.
  static absl::StatusOr<std::unique_ptr<Arena>> Create(const ArenaOptions& options);
  ~Arena();  // munmap (which also unlocks)
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  uint8_t* base() const { return base_; }
  uint64_t size_bytes() const { return size_bytes_; }
  bool locked() const { return locked_; }
  // The shared pool's block records; null for an anonymous arena.
  BlockTable* block_table() const { return table_.get(); }
  // Whether the shared object existed (a previous daemon's pool) rather than being created.
  bool adopted() const { return adopted_; }
  // NUMA node holding the arena's first page (get_mempolicy(MPOL_F_NODE | MPOL_F_ADDR)); -1 when
  // the kernel cannot tell (no NUMA support), never confused with node 0. Without numa_nodes
  // the pages of a multi-socket host may span nodes; with them this is the first slice's node
  // (slices() has each).
  int numa_node() const;
  // The slices (ArenaOptions::numa_nodes), covering [0, size_bytes()) in order.
  const std::vector<ArenaSlice>& slices() const { return slices_; }

 private:
  Arena(uint8_t* base, uint64_t size_bytes, bool locked)
      : base_(base), size_bytes_(size_bytes), locked_(locked) {}
  static absl::StatusOr<std::unique_ptr<Arena>> CreateShared(const ArenaOptions& options,
                                                             uint64_t bytes);
  uint8_t* base_;
  uint64_t size_bytes_;
  bool locked_;
  // Shared pool: the whole mapping (header, records, data), its fd (holding the flock).
  uint8_t* map_base_ = nullptr;
  uint64_t map_bytes_ = 0;
  int fd_ = -1;
  bool adopted_ = false;
  std::unique_ptr<BlockTable> table_;
  std::vector<ArenaSlice> slices_;
};

// The checks Create() makes, exposed so they can be tested without the resource they check.

// OK when `bytes` may be locked under an RLIMIT_MEMLOCK soft limit of `limit_bytes`
// (RLIM_INFINITY for none) or when `privileged`; else FAILED_PRECONDITION naming both numbers
// and the ways to raise the limit.
absl::Status CheckMemlockLimit(uint64_t bytes, uint64_t limit_bytes, bool privileged);

// OK when every node in `numa_nodes` is one the kernel has memory on and none is listed twice;
// INVALID_ARGUMENT naming the node and the nodes there are; FAILED_PRECONDITION when the kernel
// has no NUMA support (numa_available() < 0) and nodes were asked for.
absl::Status CheckNumaNodes(const std::vector<int>& numa_nodes);

// OK when bytes <= available_bytes; else RESOURCE_EXHAUSTED naming both numbers.
absl::Status CheckMemAvailable(uint64_t bytes, uint64_t available_bytes);

// Parses the "MemAvailable:  <n> kB" line of /proc/meminfo text into bytes.
// Errors: NOT_FOUND when the line is missing (kernels before 3.14), INVALID_ARGUMENT when the
// value does not parse.
absl::StatusOr<uint64_t> ParseMemAvailableBytes(absl::string_view meminfo);

// Reads /proc/meminfo. Errors: UNAVAILABLE when it cannot be read, else as above.
absl::StatusOr<uint64_t> ReadMemAvailableBytes();

// Whether this process is exempt from RLIMIT_MEMLOCK: CAP_IPC_LOCK in its effective capability
// set (CapEff in /proc/self/status, bit 14; see mlock(2)). Falls back to euid == 0 when
// /proc/self/status cannot be read.
bool MemlockPrivileged();

}  // namespace offloadd::pool

#endif  // OFFLOADD_SERVER_POOL_ARENA_H_
