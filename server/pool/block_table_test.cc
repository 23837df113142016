#include "server/pool/block_table.h"

#include <openssl/sha.h>

#include <cstring>
#include <random>
#include <set>
#include <vector>

#include "gtest/gtest.h"
#include "server/base/crc32c.h"

namespace offloadd::pool {
namespace {

constexpr uint64_t kSlots = 64;
constexpr uint64_t kDataBytes = 1 << 20;

StoredBlock Block(uint32_t slot, uint64_t id, uint64_t offset, uint64_t bytes) {
  StoredBlock b;
  b.slot = slot;
  b.block_id = id;
  b.resume_key = ResumeKeyOf("token-" + std::to_string(slot % 3));
  b.extent_offset = offset;
  b.bytes = bytes;
  b.owner_uid = 1000 + slot % 2;
  return b;
}

class BlockTableTest : public ::testing::Test {
 protected:
  std::vector<uint8_t> records_ = std::vector<uint8_t>(kSlots * kRecordBytes, 0);
  BlockTable table_{records_.data(), kSlots, kDataBytes};
  uint8_t* slot(uint32_t i) { return records_.data() + i * kRecordBytes; }
};

TEST_F(BlockTableTest, RoundTripsEveryField) {
  table_.Write(Block(3, 77, 4096, 1000));
  table_.Write(Block(9, 78, 0, 4096));
  AdoptionReport r = table_.Adopt();
  ASSERT_EQ(r.blocks.size(), 2u);
  EXPECT_EQ(r.dropped_total(), 0u);
  EXPECT_EQ(r.blocks[0].block_id, 78u);  // ordered by offset
  EXPECT_EQ(r.blocks[0].slot, 9u);
  const StoredBlock& b = r.blocks[1];
  EXPECT_EQ(b.slot, 3u);
  EXPECT_EQ(b.block_id, 77u);
  EXPECT_EQ(b.extent_offset, 4096u);
  EXPECT_EQ(b.bytes, 1000u);
  EXPECT_EQ(b.owner_uid, 1001u);
  EXPECT_EQ(b.resume_key, ResumeKeyOf("token-0"));
  EXPECT_NE(b.resume_key, ResumeKeyOf("token-1"));
}

TEST_F(BlockTableTest, ClearedSlotIsAllZeroAndNotAdopted) {
  table_.Write(Block(5, 1, 0, 256));
  table_.Clear(5);
  for (uint64_t i = 0; i < kRecordBytes; ++i) ASSERT_EQ(slot(5)[i], 0) << i;
  EXPECT_TRUE(table_.Adopt().blocks.empty());
}

TEST_F(BlockTableTest, TornWriteFailsChecksum) {
  // A crash after the body and before the checksum: the slot holds a body and a zero checksum.
  table_.Write(Block(2, 5, 0, 256));
  std::memset(slot(2) + 56, 0, 8);
  // A crash half-way through the body of a record overwriting an older one.
  table_.Write(Block(4, 6, 512, 256));
  std::vector<uint8_t> newer(kRecordBytes);
  std::vector<uint8_t> scratch(kRecordBytes * kSlots, 0);
  BlockTable other(scratch.data(), kSlots, kDataBytes);
  other.Write(Block(4, 7, 1024, 512));
  std::memcpy(slot(4), scratch.data() + 4 * kRecordBytes, 20);  // first 20 bytes of the new one
  AdoptionReport r = table_.Adopt();
  EXPECT_TRUE(r.blocks.empty());
  EXPECT_EQ(r.dropped[static_cast<int>(DropReason::kChecksum)], 2u);
  // Dropped records are cleared: a second adoption finds nothing.
  EXPECT_EQ(table_.Adopt().dropped_total(), 0u);
}

TEST_F(BlockTableTest, BoundsVersionDuplicateAndOverlapAreDropped) {
  table_.Write(Block(0, 1, kDataBytes - 256, 512));  // ends past the pool
  table_.Write(Block(1, 2, 100, 256));                // unaligned offset
  table_.Write(Block(2, 0, 0, 256));                  // id 0
  table_.Write(Block(3, 4, 8192, 4096));              // overlaps slot 4
  table_.Write(Block(4, 5, 12032, 256));
  table_.Write(Block(5, 6, 65536, 256));               // same id as slot 6
  table_.Write(Block(6, 6, 131072, 256));
  table_.Write(Block(7, 8, 262144, 300));              // the one good record
  AdoptionReport r = table_.Adopt();
  ASSERT_EQ(r.blocks.size(), 1u);
  EXPECT_EQ(r.blocks[0].block_id, 8u);
  EXPECT_EQ(r.dropped[static_cast<int>(DropReason::kBounds)], 3u);
  EXPECT_EQ(r.dropped[static_cast<int>(DropReason::kOverlap)], 2u);
  EXPECT_EQ(r.dropped[static_cast<int>(DropReason::kDuplicate)], 2u);
}

// pool_data_checksums: a record carries the CRC32C of its block's data. Adopt with the data
// keeps the blocks whose bytes match, drops (kData, reported with id and key) those whose bytes
// changed, adopts blocks recorded without a checksum unchecked, and leaves spilled blocks to
// their spill file's CRC; without the data nothing is checked.
TEST_F(BlockTableTest, DataChecksumKeepsMatchingBlocksAndDropsChangedOnes) {
  std::vector<uint8_t> data(kDataBytes);
  std::mt19937_64 rng(28);
  for (auto& byte : data) byte = static_cast<uint8_t>(rng());
  auto with_crc = [&data](StoredBlock b) {
    b.has_data_crc32c = true;
    b.data_crc32c = base::Crc32c(data.data() + b.extent_offset, b.bytes);
    return b;
  };
  table_.Write(with_crc(Block(0, 10, 0, 5000)));         // intact
  table_.Write(with_crc(Block(1, 11, 8192, 4096)));      // one bit flipped below
  table_.Write(with_crc(Block(2, 12, 16384, 70000)));    // first 4 KiB zeroed below
  table_.Write(Block(3, 13, 131072, 4096));              // stored without a checksum
  StoredBlock spilled = Block(4, 14, 0, 4096);
  spilled.spilled = true;
  spilled.has_data_crc32c = true;
  spilled.data_crc32c = 0x12345678;                      // its data is on disk, not here
  table_.Write(spilled);
  data[8192 + 4095] ^= 0x01;
  std::memset(data.data() + 16384, 0, 4096);
  AdoptionReport r = table_.Adopt(data.data());
  std::set<uint64_t> adopted;
  for (const StoredBlock& b : r.blocks) adopted.insert(b.block_id);
  EXPECT_EQ(adopted, (std::set<uint64_t>{10, 13, 14}));
  EXPECT_EQ(r.dropped[static_cast<int>(DropReason::kData)], 2u);
  EXPECT_EQ(r.data_verified_blocks, 1u);
  EXPECT_EQ(r.data_unchecked_blocks, 1u);
  std::set<uint64_t> dropped;
  for (const DroppedBlock& d : r.dropped_blocks) {
    dropped.insert(d.block_id);
    EXPECT_EQ(d.reason, DropReason::kData);
  }
  EXPECT_EQ(dropped, (std::set<uint64_t>{11, 12}));
  for (uint32_t s : {1u, 2u}) {
    for (uint64_t i = 0; i < kRecordBytes; ++i) ASSERT_EQ(slot(s)[i], 0) << "slot " << s;
  }
  for (const StoredBlock& b : r.blocks) {
    if (b.block_id == 10) {
      EXPECT_TRUE(b.has_data_crc32c);
    }
    if (b.block_id == 13) {
      EXPECT_FALSE(b.has_data_crc32c);
    }
    if (b.block_id == 14) {
      EXPECT_EQ(b.data_crc32c, 0x12345678u);
    }
  }
  EXPECT_STREQ(DropReasonName(DropReason::kData), "data_checksum");
}

TEST_F(BlockTableTest, DataChecksumsAreCheckedOnlyWithTheData) {
  std::vector<uint8_t> data(kDataBytes, 7);
  StoredBlock b = Block(0, 10, 0, 4096);
  b.has_data_crc32c = true;
  b.data_crc32c = base::Crc32c(data.data(), b.bytes) ^ 1;  // never matches
  table_.Write(b);
  AdoptionReport r = table_.Adopt();
  ASSERT_EQ(r.blocks.size(), 1u);
  EXPECT_EQ(r.blocks[0].data_crc32c, b.data_crc32c);
  EXPECT_EQ(r.data_verified_blocks + r.data_unchecked_blocks, 0u);
}

// Bytes 48..55 of a record: a flag bit nobody defined, or a CRC without its flag, is a record of
// another layout (kVersion), not a record to guess at.
TEST_F(BlockTableTest, UnknownFlagsOrAStrayCrcAreAnotherLayout) {
  StoredBlock b = Block(0, 10, 0, 4096);
  b.has_data_crc32c = true;
  b.data_crc32c = 99;
  table_.Write(b);
  table_.Write(Block(1, 11, 8192, 4096));
  slot(0)[52] |= 0x02;  // an undefined flag
  slot(1)[48] = 5;      // a CRC without the flag
  for (uint32_t s : {0u, 1u}) {  // re-seal both records so only the new fields are wrong
    uint8_t digest[32];
    SHA256(slot(s), 56, digest);
    std::memcpy(slot(s) + 56, digest, 8);
  }
  AdoptionReport r = table_.Adopt();
  EXPECT_TRUE(r.blocks.empty());
  EXPECT_EQ(r.dropped[static_cast<int>(DropReason::kVersion)], 2u);
}

// Fuzz: a table of valid, non-overlapping records, then random bytes written over random
// ranges of it. Every adopted record must be one that was written, with every field intact;
// nothing adopted may overlap. Deterministic seeds.
TEST_F(BlockTableTest, RandomCorruptionNeverAdoptsAWrongRecord) {
  for (uint32_t seed = 1; seed <= 200; ++seed) {
    std::mt19937_64 rng(seed);
    std::fill(records_.begin(), records_.end(), 0);
    std::vector<StoredBlock> written;
    for (uint32_t s = 0; s < kSlots; ++s) {
      if (rng() % 4 == 0) continue;
      StoredBlock b = Block(s, 1000 + s, uint64_t{s} * 16384, 1 + rng() % 16384);
      table_.Write(b);
      written.push_back(b);
    }
    const int hits = 1 + static_cast<int>(rng() % 8);
    std::set<uint32_t> touched;
    for (int h = 0; h < hits; ++h) {
      const uint64_t at = rng() % records_.size();
      const uint64_t len = 1 + rng() % (2 * kRecordBytes);
      for (uint64_t i = at; i < std::min<uint64_t>(at + len, records_.size()); ++i) {
        records_[i] = static_cast<uint8_t>(rng());
        touched.insert(static_cast<uint32_t>(i / kRecordBytes));
      }
    }
    AdoptionReport r = table_.Adopt();
    uint64_t last_end = 0;
    for (const StoredBlock& b : r.blocks) {
      ASSERT_LT(b.slot, kSlots);
      bool found = false;
      for (const StoredBlock& w : written) {
        if (w.slot != b.slot) continue;
        found = true;
        EXPECT_EQ(b.block_id, w.block_id) << "seed " << seed;
        EXPECT_EQ(b.extent_offset, w.extent_offset) << "seed " << seed;
        EXPECT_EQ(b.bytes, w.bytes) << "seed " << seed;
        EXPECT_EQ(b.owner_uid, w.owner_uid) << "seed " << seed;
        EXPECT_EQ(b.resume_key, w.resume_key) << "seed " << seed;
      }
      EXPECT_TRUE(found) << "seed " << seed << ": adopted slot " << b.slot << " never written";
      EXPECT_GE(b.extent_offset, last_end) << "seed " << seed;
      last_end = b.extent_offset + b.bytes;
    }
    // Untouched records all survive; touched ones are dropped unless the bytes written
    // happened to equal the old ones.
    uint64_t untouched = 0;
    for (const StoredBlock& w : written) untouched += touched.count(w.slot) == 0 ? 1 : 0;
    EXPECT_GE(r.blocks.size(), untouched) << "seed " << seed;
    EXPECT_GT(r.dropped[static_cast<int>(DropReason::kChecksum)], 0u) << "seed " << seed;
  }
}

}  // namespace
}  // namespace offloadd::pool
