// A single-producer / single-consumer ring of fixed-size POD entries whose slots and indices
// may lie in memory the other side (another process, possibly hostile) can write.
//
// Indices are free-running uint32 counts (slot = index & (capacity - 1), capacity a power of
// two <= 2^30): the producer owns `tail` (entries published), the consumer owns `head`
// (entries taken). Each side keeps its own index in private memory and only stores it to the
// shared word, never reads it back, so the other side can corrupt only the index it owns;
// every read of the other side's index is checked (0 <= tail - head <= capacity, and it never
// moves backwards) and a violation is reported as kCorrupt, after which the caller stops using
// the ring. An entry is copied out of / into its slot once (memcpy): the consumer validates
// its private copy and never reads the slot again.
//
// Ordering: the producer writes the slot, then stores tail (sequentially consistent, which
// also orders it before a later Doorbell::Ring, futex.h); the consumer loads tail (seq_cst,
// acquire at least), then copies the slot, then stores head, which frees the slot.
#ifndef OFFLOADD_COMMON_SPSC_RING_H_
#define OFFLOADD_COMMON_SPSC_RING_H_

#include <atomic>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace offloadd::common {

static_assert(sizeof(std::atomic<uint32_t>) == 4 && std::atomic<uint32_t>::is_always_lock_free,
              "ring indices are plain 32-bit words shared between processes");

enum class RingResult {
  kOk,
  kEmpty,    // TryPop: nothing published
  kFull,     // TryPush: every slot holds an entry the consumer has not taken
  kCorrupt,  // the other side's index is impossible: stop using the ring
};

// An index on a cache line of its own (no false sharing between the two sides' writes).
struct alignas(64) RingIndex {
  std::atomic<uint32_t> value{0};
};
static_assert(sizeof(RingIndex) == 64, "one index per cache line");

template <typename Entry>
class RingProducer {
  static_assert(std::is_trivially_copyable_v<Entry>, "ring entries are POD");

 public:
  RingProducer() = default;
  // `slots`: capacity entries (a power of two); `tail` is ours, `head` the consumer's. Starts
  // at the tail stored now (0 for a new ring).
  RingProducer(Entry* slots, uint32_t capacity, RingIndex* tail, const RingIndex* head)
      : slots_(slots), mask_(capacity - 1), tail_word_(tail), head_word_(head),
        tail_(tail->value.load(std::memory_order_relaxed)), head_(tail_) {}

  RingResult TryPush(const Entry& entry) {
    if (RingResult r = Refresh(); r != RingResult::kOk) return r;
    if (tail_ - head_ > mask_) return RingResult::kFull;
    std::memcpy(static_cast<void*>(&slots_[tail_ & mask_]), &entry, sizeof(Entry));
    ++tail_;
    tail_word_->value.store(tail_, std::memory_order_seq_cst);
    return RingResult::kOk;
  }
  // Slots free now (0 when full or corrupt).
  uint32_t Free() {
    if (Refresh() != RingResult::kOk) return 0;
    return mask_ + 1 - (tail_ - head_);
  }
  // Whether the consumer's head is impossible now (TryPush would return kCorrupt).
  bool Corrupt() { return Refresh() == RingResult::kCorrupt; }
  uint32_t tail() const { return tail_; }

 private:
  // Reads the consumer's head; corrupt when it passed our tail or went backwards.
  RingResult Refresh() {
    const uint32_t head = head_word_->value.load(std::memory_order_seq_cst);
    if (tail_ - head > mask_ + 1 || head - head_ > tail_ - head_) return RingResult::kCorrupt;
    head_ = head;
    return RingResult::kOk;
  }

  Entry* slots_ = nullptr;
  uint32_t mask_ = 0;
  RingIndex* tail_word_ = nullptr;
  const RingIndex* head_word_ = nullptr;
  uint32_t tail_ = 0;  // private: never read back from tail_word_
  uint32_t head_ = 0;  // the consumer's head as last checked
};

template <typename Entry>
class RingConsumer {
  static_assert(std::is_trivially_copyable_v<Entry>, "ring entries are POD");

 public:
  RingConsumer() = default;
  RingConsumer(const Entry* slots, uint32_t capacity, const RingIndex* tail, RingIndex* head)
      : slots_(slots), mask_(capacity - 1), tail_word_(tail), head_word_(head),
        head_(head->value.load(std::memory_order_relaxed)), tail_(head_) {}

  // Copies the oldest entry into *out (once) and frees its slot.
  RingResult TryPop(Entry* out) {
    if (RingResult r = Available(); r != RingResult::kOk) return r;
    std::memcpy(static_cast<void*>(out), &slots_[head_ & mask_], sizeof(Entry));
    ++head_;
    head_word_->value.store(head_, std::memory_order_seq_cst);
    return RingResult::kOk;
  }
  // kOk when an entry waits, kEmpty, or kCorrupt.
  RingResult Available() {
    if (tail_ != head_) return RingResult::kOk;
    const uint32_t tail = tail_word_->value.load(std::memory_order_seq_cst);
    // The producer's tail may only move forward, by at most the free slots.
    if (tail - head_ > mask_ + 1) return RingResult::kCorrupt;
    tail_ = tail;
    return tail_ == head_ ? RingResult::kEmpty : RingResult::kOk;
  }
  uint32_t head() const { return head_; }

 private:
  const Entry* slots_ = nullptr;
  uint32_t mask_ = 0;
  const RingIndex* tail_word_ = nullptr;
  RingIndex* head_word_ = nullptr;
  uint32_t head_ = 0;  // private: never read back from head_word_
  uint32_t tail_ = 0;  // the producer's tail as last checked
};

}  // namespace offloadd::common

#endif  // OFFLOADD_COMMON_SPSC_RING_H_
