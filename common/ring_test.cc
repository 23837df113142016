// The SPSC ring and its doorbell: order, wrap-around, full and empty, corrupt indices, and a
// producer and consumer on two threads sleeping on the doorbells.
#include <chrono>
#include <cstdint>
#include <thread>
#include <vector>

#include "common/futex.h"
#include "common/spsc_ring.h"
#include "gtest/gtest.h"

namespace offloadd::common {
namespace {

struct Entry {
  uint64_t value;
  uint64_t check;
};

struct Ring {
  explicit Ring(uint32_t capacity) : slots(capacity) {}
  std::vector<Entry> slots;
  RingIndex tail, head;
  RingProducer<Entry> producer() { return {slots.data(), uint32_t(slots.size()), &tail, &head}; }
  RingConsumer<Entry> consumer() { return {slots.data(), uint32_t(slots.size()), &tail, &head}; }
};

TEST(SpscRingTest, EmptyThenFullThenWrapsInOrder) {
  Ring ring(8);
  auto p = ring.producer();
  auto c = ring.consumer();
  Entry out{};
  EXPECT_EQ(c.TryPop(&out), RingResult::kEmpty);
  uint64_t pushed = 0, popped = 0;
  for (int round = 0; round < 5; ++round) {  // 5 x 8 entries through 8 slots: wraps 4 times
    for (int i = 0; i < 8; ++i) {
      ASSERT_EQ(p.TryPush({pushed, ~pushed}), RingResult::kOk);
      ++pushed;
    }
    EXPECT_EQ(p.TryPush({99, 99}), RingResult::kFull);
    EXPECT_EQ(p.Free(), 0u);
    for (int i = 0; i < 8; ++i) {
      ASSERT_EQ(c.TryPop(&out), RingResult::kOk);
      EXPECT_EQ(out.value, popped);
      EXPECT_EQ(out.check, ~popped);
      ++popped;
    }
    EXPECT_EQ(c.TryPop(&out), RingResult::kEmpty);
    EXPECT_EQ(p.Free(), 8u);
  }
  EXPECT_EQ(ring.tail.value.load(), 40u);
  EXPECT_EQ(ring.head.value.load(), 40u);
}

TEST(SpscRingTest, IndicesWrapAroundUint32) {
  Ring ring(8);
  ring.tail.value = 0xfffffffcu;  // both sides start near the top of the index range
  ring.head.value = 0xfffffffcu;
  auto p = ring.producer();
  auto c = ring.consumer();
  Entry out{};
  for (uint64_t i = 0; i < 20; ++i) {
    ASSERT_EQ(p.TryPush({i, 0}), RingResult::kOk);
    ASSERT_EQ(c.TryPop(&out), RingResult::kOk);
    EXPECT_EQ(out.value, i);
  }
  EXPECT_EQ(ring.tail.value.load(), 0xfffffffcu + 20u);  // wrapped past 2^32
}

TEST(SpscRingTest, ConsumerReportsATailBeyondCapacityAsCorrupt) {
  Ring ring(8);
  auto c = ring.consumer();
  Entry out{};
  ring.tail.value = 9;  // 9 published into 8 slots: impossible
  EXPECT_EQ(c.TryPop(&out), RingResult::kCorrupt);
  ring.tail.value = 0xffffffffu;  // behind the head
  EXPECT_EQ(c.TryPop(&out), RingResult::kCorrupt);
  ring.tail.value = 8;  // exactly full is fine
  EXPECT_EQ(c.TryPop(&out), RingResult::kOk);
}

TEST(SpscRingTest, ProducerReportsAHeadPastTheTailOrBackwardsAsCorrupt) {
  Ring ring(8);
  auto p = ring.producer();
  ASSERT_EQ(p.TryPush({1, 1}), RingResult::kOk);
  ASSERT_EQ(p.TryPush({2, 2}), RingResult::kOk);
  ring.head.value = 3;  // took more than was published
  EXPECT_EQ(p.TryPush({3, 3}), RingResult::kCorrupt);
  ring.head.value = 1;
  EXPECT_EQ(p.TryPush({3, 3}), RingResult::kOk);
  ring.head.value = 0;  // went backwards
  EXPECT_EQ(p.TryPush({4, 4}), RingResult::kCorrupt);
  EXPECT_EQ(p.Free(), 0u);
}

TEST(SpscRingTest, TakesEachEntryOnceIntoAPrivateCopy) {
  Ring ring(8);
  auto p = ring.producer();
  auto c = ring.consumer();
  ASSERT_EQ(p.TryPush({7, 7}), RingResult::kOk);
  Entry out{};
  ASSERT_EQ(c.TryPop(&out), RingResult::kOk);
  ring.slots[0] = {666, 666};  // the producer scribbles on the slot afterwards
  EXPECT_EQ(out.value, 7u);
  EXPECT_EQ(c.TryPop(&out), RingResult::kEmpty);
}

// A million entries through 16 slots, both sides sleeping on doorbells whenever they cannot
// go on: every entry arrives once, in order (a lost wake-up would hang the test).
TEST(SpscRingTest, TwoThreadsWithDoorbellsPassEveryEntryInOrder) {
  Ring ring(16);
  Doorbell consumer_bell, producer_bell;
  constexpr uint64_t kCount = 1000000;
  std::thread producer([&] {
    auto p = ring.producer();
    for (uint64_t i = 0; i < kCount; ++i) {
      for (;;) {
        RingResult r = p.TryPush({i, i * 3});
        ASSERT_NE(r, RingResult::kCorrupt);
        if (r == RingResult::kOk) break;
        const uint32_t seen = producer_bell.Arm();
        if (p.Free() == 0) producer_bell.Sleep(seen, -1);
        producer_bell.Disarm();
      }
      consumer_bell.Ring();
    }
  });
  auto c = ring.consumer();
  uint64_t sum_errors = 0;
  for (uint64_t i = 0; i < kCount; ++i) {
    Entry out{};
    for (;;) {
      RingResult r = c.TryPop(&out);
      ASSERT_NE(r, RingResult::kCorrupt);
      if (r == RingResult::kOk) break;
      const uint32_t seen = consumer_bell.Arm();
      if (c.Available() == RingResult::kEmpty) consumer_bell.Sleep(seen, -1);
      consumer_bell.Disarm();
    }
    producer_bell.Ring();
    if (out.value != i || out.check != i * 3) ++sum_errors;
  }
  producer.join();
  EXPECT_EQ(sum_errors, 0u);
}

TEST(FutexTest, WaitReturnsAtOnceWhenTheWordDiffers) {
  std::atomic<uint32_t> word{5};
  FutexWait(&word, 4, -1);  // would hang if it slept
  FutexWait(&word, 5, 0.001);  // times out
  EXPECT_EQ(FutexWake(&word, 1), 0);
}

// A wait with a huge timeout (a caller's "no deadline" as 1e300 seconds) sleeps until woken,
// instead of failing at once on an unrepresentable timespec.
TEST(FutexTest, AHugeTimeoutSleepsUntilWoken) {
  for (const double timeout : {1e300, 1e12, -1.0}) {
    std::atomic<uint32_t> word{0};
    std::atomic<int> returned{0};
    std::thread waiter([&] {
      while (word.load() == 0) {
        FutexWait(&word, 0, timeout);
        returned.fetch_add(1);
      }
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    EXPECT_EQ(returned.load(), 0) << "timeout " << timeout;  // a failing wait returns at once
    word.store(1);
    FutexWake(&word, 1);
    waiter.join();
  }
}

}  // namespace
}  // namespace offloadd::common
