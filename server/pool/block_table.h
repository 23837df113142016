// BlockTable: the metadata area of a shared pool (arena.h, ArenaOptions::shm_name) — one
// fixed-size record per stored block, so a daemon started after a crash or an upgrade can adopt
// the blocks its predecessor had confirmed to clients.
//
// Record (kRecordBytes = 64, host byte order, in the slot the store chose for the block):
//   0  u64 block_id            (never 0)
//   8  u8[16] resume_key       first 16 bytes of SHA-256 of the owning session's resume token
//  24  u64 extent_offset       from the arena base, multiple of kGranuleBytes; 0 when spilled
//  32  u64 bytes               requested size; the extent is RoundUp(bytes)
//  40  u32 owner_uid           kUnknownUid when the peer's uid was not known
//  44  u16 state               kRecordFree (0), kRecordStored (1: bytes in the extent) or
//                              kRecordSpilled (2: bytes in the block's spill file, no extent)
//  46  u16 layout_version      kLayoutVersion
//  48  u32 data_crc32c        CRC32C of the block's `bytes` data bytes (state 1 and 2), valid when
//                              flags bit 0 is set (pool_data_checksums); else 0
//  52  u16 flags               bit 0: data_crc32c is set; no other bit is used
//  54  u16 reserved            0
//  56  u64 checksum            first 8 bytes of SHA-256 of bytes 0..55
// A free slot is all zero bytes. Writing a record writes the body, then the checksum; a record
// torn by a crash mid-write fails its checksum and is dropped (never served), as is one whose
// bytes were overwritten at random. Clear() zeroes the checksum first, then the rest.
// A spilled record is written only after its spill file is complete and synced, before the
// block's extent is freed; until then the record names the extent (the pool copy is
// authoritative). Adding state 2 kept layout version 1: a version-1 table without spilled
// records reads as before. So did the data checksum (bytes 48..55, zero without it): a record
// carrying one is dropped as kVersion by a daemon built before it.
//
// Thread-safety: none; the store serialises calls under its lock.
#ifndef OFFLOADD_SERVER_POOL_BLOCK_TABLE_H_
#define OFFLOADD_SERVER_POOL_BLOCK_TABLE_H_

#include <array>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/strings/string_view.h"

namespace offloadd::pool {

inline constexpr uint64_t kRecordBytes = 64;
inline constexpr uint16_t kLayoutVersion = 1;
inline constexpr uint16_t kRecordFree = 0;
inline constexpr uint16_t kRecordStored = 1;
inline constexpr uint16_t kRecordSpilled = 2;
inline constexpr uint32_t kUnknownUid = 0xffffffffu;

// What identifies a session's blocks across a restart without storing its token.
using ResumeKey = std::array<uint8_t, 16>;
// SHA-256 of the token, first 16 bytes.
ResumeKey ResumeKeyOf(absl::string_view resume_token);

struct StoredBlock {
  uint32_t slot = 0;
  uint64_t block_id = 0;
  ResumeKey resume_key{};
  uint64_t extent_offset = 0;
  uint64_t bytes = 0;
  uint32_t owner_uid = kUnknownUid;
  // The block's bytes are in its spill file (extent_offset is 0 and names no extent).
  bool spilled = false;
  // CRC32C (base/crc32c.h) of the block's `bytes` data bytes, when the daemon that stored it ran
  // with pool_data_checksums; the same value wherever the bytes live (pool or spill file).
  bool has_data_crc32c = false;
  uint32_t data_crc32c = 0;
};

// Why adoption dropped a record (metric label values, DropReasonName).
enum class DropReason {
  kChecksum,   // torn write or random bytes
  kVersion,    // checksum fine but another layout version or state
  kBounds,     // zero id or size, unaligned, or past the pool's end
  kOverlap,    // its extent overlaps another record's (every overlapping record is dropped)
  kDuplicate,  // two records name the same block id (all of them are dropped)
  kData,       // its data in the pool fails the record's data_crc32c (Adopt with the data)
};
inline constexpr int kNumDropReasons = 6;
const char* DropReasonName(DropReason reason);

struct DroppedBlock {
  uint64_t block_id = 0;  // as the record says (a torn or overwritten record may lie about it)
  DropReason reason = DropReason::kChecksum;
  // The owning session's resume key as the record says (may be damaged too): only a session
  // resumed with this key is told the block was lost; any other gets NOT_FOUND.
  ResumeKey resume_key{};
};

struct AdoptionReport {
  // Valid records: those in the pool ordered by extent offset, then the spilled ones.
  std::vector<StoredBlock> blocks;
  // The non-zero block ids named by dropped records, so that a reload of one can be told the
  // block is lost (DATA_LOSS) rather than unknown.
  std::vector<DroppedBlock> dropped_blocks;
  std::array<uint64_t, kNumDropReasons> dropped{};  // by DropReason
  // Adopt with the data: pool blocks whose data matched their data_crc32c, and pool blocks
  // adopted unchecked because their record has none (stored without pool_data_checksums).
  uint64_t data_verified_blocks = 0;
  uint64_t data_unchecked_blocks = 0;
  uint64_t dropped_total() const;
};

class BlockTable {
 public:
  // `records` points to `slots` * kRecordBytes bytes (the shared pool's metadata area, or a test
  // buffer); `data_bytes` is the arena's size, for bounds checks. Not owned.
  BlockTable(uint8_t* records, uint64_t slots, uint64_t data_bytes);

  uint64_t slots() const { return slots_; }
  // Records `block` in slot block.slot (< slots()).
  void Write(const StoredBlock& block);
  // Frees a slot (all zero).
  void Clear(uint32_t slot);
  // Validates every non-zero slot: checksum, version and state, bounds, overlap, duplicate ids.
  // Dropped records are cleared, so the table then holds exactly the returned blocks.
  // With `data` (the arena's base, data_bytes long), also each pool block's bytes against its
  // record's data_crc32c (kData when they differ; one CRC32C pass over every such block on up
  // to 8 threads, about 1 s per 7 GiB and thread of the CPU time; spilled blocks are checked by
  // their spill file's CRC instead).
  AdoptionReport Adopt(const uint8_t* data = nullptr);

 private:
  // Adopt's steps. Drop clears `slot` and reports it (with its id and key when it has an id).
  void Drop(uint32_t slot, DropReason why, AdoptionReport* report);
  // The record in `slot` when its checksum, version and bounds hold; else dropped, nullopt.
  std::optional<StoredBlock> ReadRecord(uint32_t slot, AdoptionReport* report);
  // Drops every record whose id another record also names; returns the rest.
  std::vector<StoredBlock> DropDuplicates(std::vector<StoredBlock> valid, AdoptionReport* report);
  // Drops every record of a group whose extents overlap; the rest go to report->blocks.
  // Spilled records hold no extent and go to report->blocks as they are.
  void DropOverlaps(std::vector<StoredBlock> unique, AdoptionReport* report);
  // Drops the pool blocks of report->blocks whose data fails their data_crc32c.
  void DropDataMismatches(const uint8_t* data, AdoptionReport* report);

  uint8_t* const records_;
  const uint64_t slots_;
  const uint64_t data_bytes_;
};

}  // namespace offloadd::pool

#endif  // OFFLOADD_SERVER_POOL_BLOCK_TABLE_H_
