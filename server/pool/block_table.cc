#include "server/pool/block_table.h"

#include <openssl/sha.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <map>
#include <thread>
#include <utility>

#include "server/base/crc32c.h"
#include "server/pool/extent_allocator.h"

namespace offloadd::pool {
namespace {

constexpr uint64_t kChecksumOffset = 56;
constexpr uint16_t kFlagDataCrc = 1;
constexpr size_t kCheckThreads = 8;

uint64_t Checksum(const uint8_t* record) {
  uint8_t digest[SHA256_DIGEST_LENGTH];
  SHA256(record, kChecksumOffset, digest);
  uint64_t sum;
  std::memcpy(&sum, digest, sizeof(sum));
  return sum;
}

template <typename T>
T Load(const uint8_t* p, uint64_t offset) {
  T v;
  std::memcpy(&v, p + offset, sizeof(v));
  return v;
}

template <typename T>
void Store(uint8_t* p, uint64_t offset, T v) {
  std::memcpy(p + offset, &v, sizeof(v));
}

bool AllZero(const uint8_t* p) {
  for (uint64_t i = 0; i < kRecordBytes; ++i) {
    if (p[i] != 0) return false;
  }
  return true;
}

}  // namespace

ResumeKey ResumeKeyOf(absl::string_view resume_token) {
  uint8_t digest[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const uint8_t*>(resume_token.data()), resume_token.size(), digest);
  ResumeKey key;
  std::memcpy(key.data(), digest, key.size());
  return key;
}

const char* DropReasonName(DropReason reason) {
  switch (reason) {
    case DropReason::kChecksum: return "checksum";
    case DropReason::kVersion: return "version";
    case DropReason::kBounds: return "bounds";
    case DropReason::kOverlap: return "overlap";
    case DropReason::kDuplicate: return "duplicate_id";
    case DropReason::kData: return "data_checksum";
  }
  return "unknown";
}

uint64_t AdoptionReport::dropped_total() const {
  uint64_t n = 0;
  for (uint64_t d : dropped) n += d;
  return n;
}

BlockTable::BlockTable(uint8_t* records, uint64_t slots, uint64_t data_bytes)
    : records_(records), slots_(slots), data_bytes_(data_bytes) {}

void BlockTable::Write(const StoredBlock& b) {
  uint8_t* p = records_ + uint64_t{b.slot} * kRecordBytes;
  uint8_t body[kRecordBytes] = {};
  Store<uint64_t>(body, 0, b.block_id);
  std::memcpy(body + 8, b.resume_key.data(), b.resume_key.size());
  Store<uint64_t>(body, 32, b.bytes);
  Store<uint32_t>(body, 40, b.owner_uid);
  Store<uint64_t>(body, 24, b.spilled ? 0 : b.extent_offset);
  Store<uint16_t>(body, 44, b.spilled ? kRecordSpilled : kRecordStored);
  Store<uint16_t>(body, 46, kLayoutVersion);
  if (b.has_data_crc32c) {
    Store<uint32_t>(body, 48, b.data_crc32c);
    Store<uint16_t>(body, 52, kFlagDataCrc);
  }
  Store<uint64_t>(body, kChecksumOffset, Checksum(body));
  // Body first, checksum last: a crash in between leaves a record that fails its checksum.
  std::memcpy(p, body, kChecksumOffset);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memcpy(p + kChecksumOffset, body + kChecksumOffset, 8);
}

void BlockTable::Clear(uint32_t slot) {
  uint8_t* p = records_ + uint64_t{slot} * kRecordBytes;
  std::memset(p + kChecksumOffset, 0, 8);
  std::atomic_signal_fence(std::memory_order_seq_cst);
  std::memset(p, 0, kChecksumOffset);
}

void BlockTable::Drop(uint32_t slot, DropReason why, AdoptionReport* report) {
  ++report->dropped[static_cast<int>(why)];
  const uint8_t* record = records_ + uint64_t{slot} * kRecordBytes;
  const uint64_t id = Load<uint64_t>(record, 0);
  if (id != 0) {
    DroppedBlock d{id, why, {}};
    std::memcpy(d.resume_key.data(), record + 8, d.resume_key.size());
    report->dropped_blocks.push_back(d);
  }
  Clear(slot);
}

std::optional<StoredBlock> BlockTable::ReadRecord(uint32_t slot, AdoptionReport* report) {
  const uint8_t* p = records_ + uint64_t{slot} * kRecordBytes;
  if (Load<uint64_t>(p, kChecksumOffset) != Checksum(p)) {
    Drop(slot, DropReason::kChecksum, report);
    return std::nullopt;
  }
  const uint16_t state = Load<uint16_t>(p, 44);
  const uint16_t flags = Load<uint16_t>(p, 52);
  const bool has_crc = (flags & kFlagDataCrc) != 0;
  if ((state != kRecordStored && state != kRecordSpilled) ||
      Load<uint16_t>(p, 46) != kLayoutVersion || (flags & ~kFlagDataCrc) != 0 ||
      Load<uint16_t>(p, 54) != 0 || (!has_crc && Load<uint32_t>(p, 48) != 0)) {
    Drop(slot, DropReason::kVersion, report);
    return std::nullopt;
  }
  StoredBlock b;
  b.slot = slot;
  b.block_id = Load<uint64_t>(p, 0);
  std::memcpy(b.resume_key.data(), p + 8, b.resume_key.size());
  b.extent_offset = Load<uint64_t>(p, 24);
  b.bytes = Load<uint64_t>(p, 32);
  b.owner_uid = Load<uint32_t>(p, 40);
  b.spilled = state == kRecordSpilled;
  b.has_data_crc32c = has_crc;
  b.data_crc32c = Load<uint32_t>(p, 48);
  if (b.spilled) {
    if (b.block_id == 0 || b.bytes == 0 || b.bytes > data_bytes_ || b.extent_offset != 0) {
      Drop(slot, DropReason::kBounds, report);
      return std::nullopt;
    }
    return b;
  }
  if (b.block_id == 0 || b.bytes == 0 || b.bytes > data_bytes_ ||
      b.extent_offset % kGranuleBytes != 0 || b.extent_offset > data_bytes_ ||
      ExtentAllocator::RoundUp(b.bytes) > data_bytes_ - b.extent_offset) {
    Drop(slot, DropReason::kBounds, report);
    return std::nullopt;
  }
  return b;
}

std::vector<StoredBlock> BlockTable::DropDuplicates(std::vector<StoredBlock> valid,
                                                    AdoptionReport* report) {
  // Every record naming a duplicated id is dropped (which one is right is unknown).
  std::map<uint64_t, int> id_count;
  for (const StoredBlock& b : valid) ++id_count[b.block_id];
  std::vector<StoredBlock> unique;
  for (const StoredBlock& b : valid) {
    if (id_count[b.block_id] > 1) {
      Drop(b.slot, DropReason::kDuplicate, report);
    } else {
      unique.push_back(b);
    }
  }
  return unique;
}

void BlockTable::DropOverlaps(std::vector<StoredBlock> unique, AdoptionReport* report) {
  // Sweep by offset; every record of an overlapping group is dropped.
  std::vector<StoredBlock> spilled;
  unique.erase(std::remove_if(unique.begin(), unique.end(),
                              [&spilled](const StoredBlock& b) {
                                if (b.spilled) spilled.push_back(b);
                                return b.spilled;
                              }),
               unique.end());
  std::sort(unique.begin(), unique.end(), [](const StoredBlock& a, const StoredBlock& b) {
    return a.extent_offset < b.extent_offset;
  });
  std::vector<bool> overlapped(unique.size(), false);
  uint64_t group_end = 0;
  size_t group_start = 0;
  for (size_t i = 0; i < unique.size(); ++i) {
    const uint64_t end = unique[i].extent_offset + ExtentAllocator::RoundUp(unique[i].bytes);
    if (i > 0 && unique[i].extent_offset < group_end) {
      for (size_t j = group_start; j <= i; ++j) overlapped[j] = true;
      group_end = std::max(group_end, end);
    } else {
      group_start = i;
      group_end = end;
    }
  }
  for (size_t i = 0; i < unique.size(); ++i) {
    if (overlapped[i]) {
      Drop(unique[i].slot, DropReason::kOverlap, report);
    } else {
      report->blocks.push_back(unique[i]);
    }
  }
  report->blocks.insert(report->blocks.end(), spilled.begin(), spilled.end());
}

void BlockTable::DropDataMismatches(const uint8_t* data, AdoptionReport* report) {
  const std::vector<StoredBlock>& blocks = report->blocks;
  // One CRC32C pass over every checked block, on up to kCheckThreads threads (block i on thread
  // i % n): a restart of a large pool is bound by this pass, not by the records.
  std::vector<uint8_t> matches(blocks.size(), 1);
  const size_t n = std::min<size_t>(
      {kCheckThreads, std::max(1u, std::thread::hardware_concurrency()), blocks.size()});
  std::vector<std::thread> threads;
  for (size_t t = 0; t < n; ++t) {
    threads.emplace_back([&blocks, &matches, data, t, n] {
      for (size_t i = t; i < blocks.size(); i += n) {
        const StoredBlock& b = blocks[i];
        if (b.spilled || !b.has_data_crc32c) continue;
        matches[i] = base::Crc32c(data + b.extent_offset, b.bytes) == b.data_crc32c;
      }
    });
  }
  for (std::thread& t : threads) t.join();
  std::vector<StoredBlock> kept;
  kept.reserve(blocks.size());
  for (size_t i = 0; i < blocks.size(); ++i) {
    const StoredBlock& b = blocks[i];
    if (!matches[i]) {
      Drop(b.slot, DropReason::kData, report);
      continue;
    }
    if (!b.spilled) ++(b.has_data_crc32c ? report->data_verified_blocks
                                          : report->data_unchecked_blocks);
    kept.push_back(b);
  }
  report->blocks = std::move(kept);
}

AdoptionReport BlockTable::Adopt(const uint8_t* data) {
  AdoptionReport report;
  std::vector<StoredBlock> valid;
  for (uint64_t slot = 0; slot < slots_; ++slot) {
    if (AllZero(records_ + slot * kRecordBytes)) continue;
    if (auto b = ReadRecord(static_cast<uint32_t>(slot), &report)) valid.push_back(*b);
  }
  DropOverlaps(DropDuplicates(std::move(valid), &report), &report);
  // After the overlap check: a verified block's extent lies inside the arena and is its own.
  if (data != nullptr) DropDataMismatches(data, &report);
  return report;
}

}  // namespace offloadd::pool
