#include "server/spill/chunk_checksums.h"

#include "server/base/crc32c.h"

namespace offloadd::spill {

void ChunkChecksums::Compute(uint64_t offset, const uint8_t* data, uint64_t bytes) {
  if (workers_ == nullptr) {
    Add(offset, bytes, base::Crc32c(data, bytes));
    return;
  }
  {
    base::MutexLock lock(mu_);
    ++pending_;
  }
  workers_->Post([self = shared_from_this(), offset, data, bytes] {
    const uint32_t crc = base::Crc32c(data, bytes);
    std::function<void()> then;
    {
      base::MutexLock lock(self->mu_);
      self->pieces_[offset] = {bytes, crc};
      if (--self->pending_ == 0) then = std::move(self->then_);
    }
    if (then) then();
  });
}

void ChunkChecksums::WhenSettled(std::function<void()> then) {
  {
    base::MutexLock lock(mu_);
    if (pending_ > 0) {
      then_ = std::move(then);
      return;
    }
  }
  then();
}

bool ChunkChecksums::Joined(uint64_t total, uint32_t* crc) {
  base::MutexLock lock(mu_);
  uint64_t at = 0;
  uint32_t c = 0;
  for (const auto& [offset, piece] : pieces_) {
    if (offset != at) return false;
    c = base::Crc32cCombine(c, piece.second, piece.first);
    at += piece.first;
  }
  *crc = c;
  return at == total;
}

void ChunkChecksums::Add(uint64_t offset, uint64_t bytes, uint32_t crc) {
  base::MutexLock lock(mu_);
  pieces_[offset] = {bytes, crc};
}

}  // namespace offloadd::spill
