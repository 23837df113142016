// The native core through its C ABI, with a fake daemon on a thread serving the ring through a
// mapping of the core's memfd: fields as submitted, answers by id in any order, a full ring,
// waits that time out, a closed ring.
#include <sys/mman.h>

#include <atomic>
#include <cstring>
#include <thread>
#include <vector>

#include "client/core/offloadd_core.h"
#include "client/core/ring_core.h"
#include "common/ring_format.h"
#include "gtest/gtest.h"

namespace offloadd::client {
namespace {

using common::CompletionEntry;
using common::RingResult;
using common::SubmissionEntry;

// The daemon's side of the core's ring: its own mapping of the memfd.
class FakeDaemon {
 public:
  explicit FakeDaemon(offloadd_ring* ring) {
    const int fd = offloadd_ring_fd(ring);
    common::RingHeader header;
    void* head = mmap(nullptr, sizeof(common::RingControl), PROT_READ, MAP_SHARED, fd, 0);
    std::memcpy(&header, head, sizeof(header));
    munmap(head, sizeof(common::RingControl));
    if (!common::ParseRingHeader(header, header.total_bytes, &layout_, nullptr)) abort();
    base_ = mmap(nullptr, layout_.total_bytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    control_ = common::ControlOf(base_);
    take_ = {common::SubmissionSlots(base_, layout_), layout_.submission_entries,
             &control_->submission_tail, &control_->submission_head};
    answer_ = {common::CompletionSlots(base_, layout_), layout_.completion_entries,
               &control_->completion_tail, &control_->completion_head};
  }
  ~FakeDaemon() { munmap(base_, layout_.total_bytes); }
  bool Take(SubmissionEntry* e) {
    if (take_.TryPop(e) != RingResult::kOk) return false;
    control_->client_doorbell.Ring();
    return true;
  }
  void Answer(const CompletionEntry& c) {
    while (answer_.TryPush(c) == RingResult::kFull) std::this_thread::yield();
    control_->client_doorbell.Ring();
  }
  // The daemon's doorbell as the daemon's ring thread would wait on it.
  uint32_t ArmDoorbell() { return control_->daemon_doorbell.Arm(); }
  uint32_t Bell() const { return control_->daemon_doorbell.bell.load(); }
  // The daemon's thread polls the ring every `us` microseconds (0: it sleeps until rung).
  void SetPolling(uint32_t us) { control_->state.poll_microseconds.store(us); }
  void Close() {
    control_->state.closed.store(1);
    control_->client_doorbell.RingAlways();
  }

 private:
  common::RingLayout layout_;
  void* base_;
  common::RingControl* control_;
  common::RingConsumer<SubmissionEntry> take_;
  common::RingProducer<CompletionEntry> answer_;
};

struct Ring {
  Ring(uint32_t n = 8) : ring(offloadd_ring_create(n, n, nullptr, 0)) {}
  ~Ring() { offloadd_ring_destroy(ring); }
  offloadd_ring* ring;
};

TEST(RingCoreTest, SubmitsTheFieldsAndTakesTheAnswerById) {
  Ring r;
  ASSERT_NE(r.ring, nullptr);
  FakeDaemon daemon(r.ring);
  uint8_t event[64];
  for (int i = 0; i < 64; ++i) event[i] = static_cast<uint8_t>(i + 1);
  const uint64_t id = offloadd_ring_reload(r.ring, 0, 42, 3, 8192, 1, 1, 0.5, nullptr, event, -1);
  ASSERT_NE(id, 0u);
  EXPECT_NE(id & common::kRingRequestIdBit, 0u);
  SubmissionEntry e;
  ASSERT_TRUE(daemon.Take(&e));
  std::string why;
  EXPECT_TRUE(common::ValidateSubmission(e, &why)) << why;
  EXPECT_EQ(e.request_id, id);
  EXPECT_EQ(e.kind, static_cast<uint32_t>(common::SubmissionKind::kReload));
  EXPECT_EQ(e.tag, 42u);
  EXPECT_EQ(e.region_id, 3u);
  EXPECT_EQ(e.offset_bytes, 8192u);
  EXPECT_EQ(e.flags, common::kSubmitReleaseAfter);
  EXPECT_EQ(e.deadline_seconds, 0.5);
  EXPECT_EQ(e.done_event_bytes, 64);
  EXPECT_EQ(std::memcmp(e.done_event, event, 64), 0);
  EXPECT_EQ(e.ready_event_bytes, 0);

  offloadd_completion out;
  EXPECT_EQ(offloadd_ring_poll(r.ring, id, &out), OFFLOADD_PENDING);
  EXPECT_EQ(offloadd_ring_wait(r.ring, id, 0.01, &out), OFFLOADD_PENDING);
  CompletionEntry c = common::MakeCompletion(id, common::CompletionKind::kReloadDone, 0, "");
  c.block_id = 77;
  c.bytes = 4096;
  c.flags = common::kCompleteReleased;
  daemon.Answer(c);
  ASSERT_EQ(offloadd_ring_wait(r.ring, id, 5, &out), OFFLOADD_DONE);
  EXPECT_EQ(out.request_id, id);
  EXPECT_EQ(out.kind, 2u);
  EXPECT_EQ(out.block_id, 77u);
  EXPECT_EQ(out.bytes, 4096u);
  EXPECT_EQ(out.flags, 1u);
  EXPECT_EQ(offloadd_ring_poll(r.ring, id, &out), OFFLOADD_UNKNOWN);  // taken once
  EXPECT_EQ(offloadd_ring_pending(r.ring), 0u);
}

// Two threads submit 500 requests each through 8 slots (each waits for free slots) and wait
// for their own answers, which the daemon sends in reverse order of each batch.
TEST(RingCoreTest, ThreadsWaitForTheirOwnAnswersThroughAFullRing) {
  Ring r(8);
  FakeDaemon daemon(r.ring);
  std::atomic<bool> stop{false};
  std::thread server([&] {
    std::vector<SubmissionEntry> batch;
    while (!stop) {
      SubmissionEntry e;
      while (batch.size() < 8 && daemon.Take(&e)) batch.push_back(e);
      for (auto it = batch.rbegin(); it != batch.rend(); ++it) {
        CompletionEntry c =
            common::MakeCompletion(it->request_id, common::CompletionKind::kOffloadDone, 0, "");
        c.block_id = it->tag * 10;
        daemon.Answer(c);
      }
      batch.clear();
      std::this_thread::yield();
    }
  });
  std::atomic<int> wrong{0};
  auto client = [&](uint64_t first_tag) {
    std::vector<std::pair<uint64_t, uint64_t>> ids;
    for (uint64_t tag = first_tag; tag < first_tag + 500; ++tag) {
      ids.emplace_back(offloadd_ring_offload(r.ring, 1, 0, 4096, tag, nullptr, 0, 0, 0, 10), tag);
      if (ids.size() == 4) {  // answers are awaited in submission order, arrive in any
        for (auto [id, t] : ids) {
          offloadd_completion out;
          if (id == 0 || offloadd_ring_wait(r.ring, id, 10, &out) != OFFLOADD_DONE ||
              out.block_id != t * 10) {
            ++wrong;
          }
        }
        ids.clear();
      }
    }
  };
  std::thread a(client, 1), b(client, 100001);
  a.join();
  b.join();
  stop = true;
  server.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(offloadd_ring_pending(r.ring), 0u);
}

TEST(RingCoreTest, AClosedRingEndsWaitsAndRefusesSubmissions) {
  Ring r;
  FakeDaemon daemon(r.ring);
  const uint64_t id = offloadd_ring_release(r.ring, 5, 0, -1);
  ASSERT_NE(id, 0u);
  std::thread closer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    daemon.Close();
  });
  offloadd_completion out;
  EXPECT_EQ(offloadd_ring_wait(r.ring, id, -1, &out), OFFLOADD_CLOSED);  // hangs if not woken
  closer.join();
  EXPECT_EQ(offloadd_ring_closed(r.ring), 1);
  EXPECT_EQ(offloadd_ring_release(r.ring, 6, 0, -1), 0u);
}

TEST(RingCoreTest, AFullRingTimesOutAndBadSizesAreRefused) {
  Ring r(8);
  for (int i = 0; i < 8; ++i) ASSERT_NE(offloadd_ring_release(r.ring, 1, 0, 0), 0u);
  EXPECT_EQ(offloadd_ring_release(r.ring, 1, 0, 0.01), 0u);  // nobody takes: no slot frees
  char error[128];
  EXPECT_EQ(offloadd_ring_create(6, 8, error, sizeof(error)), nullptr);
  EXPECT_NE(std::string(error).find("powers of two"), std::string::npos);
}

// A full ring's refused submission leaves closed() 0 (no slot freed in time), a closed ring's
// leaves it 1: the two causes of a 0 request id are told apart.
TEST(RingCoreTest, AFullRingsRefusalIsNotAClose) {
  Ring r(8);
  FakeDaemon daemon(r.ring);
  for (int i = 0; i < 8; ++i) ASSERT_NE(offloadd_ring_release(r.ring, 1, 0, 0), 0u);
  EXPECT_EQ(offloadd_ring_release(r.ring, 1, 0, 0), 0u);
  EXPECT_EQ(offloadd_ring_closed(r.ring), 0);
  daemon.Close();
  EXPECT_EQ(offloadd_ring_release(r.ring, 1, 0, 0), 0u);
  EXPECT_EQ(offloadd_ring_closed(r.ring), 1);
}

// shutdown returns threads asleep with no deadline in drain, wait and a submission to a full
// ring (as if the daemon had closed it), refuses later calls, and the ring can then be
// destroyed: what a binding does before freeing a ring other threads use.
TEST(RingCoreTest, ShutdownReturnsEverySleeperAndRefusesLaterCalls) {
  Ring r(8);
  const uint64_t id = offloadd_ring_release(r.ring, 5, 0, -1);
  ASSERT_NE(id, 0u);
  for (int i = 0; i < 7; ++i) ASSERT_NE(offloadd_ring_release(r.ring, 1, 0, 0), 0u);
  std::atomic<int> drained{1}, waited{1};
  std::atomic<uint64_t> submitted{1};
  std::thread drainer([&] {
    offloadd_completion out[4];
    drained = offloadd_ring_drain(r.ring, out, 4, -1);
  });
  std::thread waiter([&] {
    offloadd_completion out;
    waited = offloadd_ring_wait(r.ring, id, -1, &out);
  });
  std::thread submitter([&] { submitted = offloadd_ring_release(r.ring, 2, 0, -1); });
  offloadd_ring_shutdown(r.ring);
  drainer.join();  // each join hangs if its sleeper were not returned
  waiter.join();
  submitter.join();
  EXPECT_EQ(drained.load(), OFFLOADD_CLOSED);
  EXPECT_EQ(waited.load(), OFFLOADD_CLOSED);
  EXPECT_EQ(submitted.load(), 0u);
  EXPECT_EQ(offloadd_ring_closed(r.ring), 1);
  EXPECT_EQ(offloadd_ring_release(r.ring, 3, 0, -1), 0u);
  offloadd_completion out;
  EXPECT_EQ(offloadd_ring_wait(r.ring, id, -1, &out), OFFLOADD_CLOSED);
}

// A thread asleep in WaitAny with no deadline returns once its cancel flag is set and the
// waiters are woken (how the C++ client stops its ring thread).
TEST(RingCoreTest, WaitAnyReturnsWhenCancelled) {
  std::string error;
  std::unique_ptr<RingCore> core = RingCore::Create(8, 8, &error);
  ASSERT_NE(core, nullptr) << error;
  std::atomic<bool> cancel{false};
  std::atomic<int> result{-1};
  std::thread waiter([&] {
    common::CompletionEntry c;
    result = static_cast<int>(core->WaitAny(-1, &c, &cancel));
  });
  cancel = true;
  core->WakeWaiters();
  waiter.join();  // hangs if the wake were lost
  EXPECT_EQ(result.load(), static_cast<int>(RingCore::WaitResult::kTimeout));
}

// drain takes every answer that arrived, of any ids, in one call (at most `max`), returns 0
// at once when none is there, sleeps for the first one, and reports a closed ring once empty;
// wake ends nothing by itself (the sleeper re-checks).
TEST(RingCoreTest, DrainTakesEveryAnswerOfAnyIdThenReportsTheClose) {
  Ring r;
  FakeDaemon daemon(r.ring);
  uint64_t ids[3];
  for (int i = 0; i < 3; ++i) ids[i] = offloadd_ring_release(r.ring, 10 + i, 0, -1);
  offloadd_completion out[4];
  EXPECT_EQ(offloadd_ring_drain(r.ring, out, 4, 0), 0);  // nothing answered yet
  SubmissionEntry e;
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(daemon.Take(&e));
  for (int i : {2, 0, 1}) {
    CompletionEntry c = common::MakeCompletion(ids[i], common::CompletionKind::kReleased, 0, "");
    c.block_id = 10 + i;
    daemon.Answer(c);
  }
  EXPECT_EQ(offloadd_ring_drain(r.ring, out, 2, 0), 2);  // at most max
  offloadd_completion rest;
  EXPECT_EQ(offloadd_ring_drain(r.ring, &rest, 1, 0), 1);
  uint64_t seen = 0;
  for (const offloadd_completion& c : {out[0], out[1], rest}) {
    EXPECT_EQ(c.kind, 3u);
    EXPECT_EQ(c.request_id, ids[c.block_id - 10]);
    seen |= 1u << (c.block_id - 10);
  }
  EXPECT_EQ(seen, 7u);
  EXPECT_EQ(offloadd_ring_pending(r.ring), 0u);

  const uint64_t late = offloadd_ring_release(r.ring, 20, 0, -1);
  std::thread answerer([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    offloadd_ring_wake(r.ring);  // a wake alone: the drain sleeps on
    SubmissionEntry taken;
    while (!daemon.Take(&taken)) std::this_thread::yield();
    daemon.Answer(common::MakeCompletion(late, common::CompletionKind::kReleased, 0, ""));
  });
  EXPECT_EQ(offloadd_ring_drain(r.ring, out, 4, -1), 1);  // hangs if the answer's ring is lost
  EXPECT_EQ(out[0].request_id, late);
  answerer.join();
  daemon.Close();
  EXPECT_EQ(offloadd_ring_drain(r.ring, out, 4, -1), OFFLOADD_CLOSED);
}

// Taking answers wakes the daemon's ring thread only after a full completion ring (the daemon
// may then hold answers it could not push); a drain of fewer wakes nobody.
TEST(RingCoreTest, OnlyADrainOfAFullCompletionRingRingsTheDaemon) {
  Ring r(8);
  FakeDaemon daemon(r.ring);
  uint64_t ids[8];
  for (int i = 0; i < 8; ++i) ids[i] = offloadd_ring_release(r.ring, 1 + i, 0, -1);
  SubmissionEntry e;
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(daemon.Take(&e));
  daemon.ArmDoorbell();  // the daemon's thread is (about to be) asleep
  const uint32_t bell = daemon.Bell();
  for (int i = 0; i < 3; ++i) {
    daemon.Answer(common::MakeCompletion(ids[i], common::CompletionKind::kReleased, 0, ""));
  }
  offloadd_completion out[8];
  EXPECT_EQ(offloadd_ring_drain(r.ring, out, 8, 0), 3);
  EXPECT_EQ(daemon.Bell(), bell);  // three slots freed: no wake
  for (int i = 3; i < 8; ++i) {
    daemon.Answer(common::MakeCompletion(ids[i], common::CompletionKind::kReleased, 0, ""));
  }
  EXPECT_EQ(offloadd_ring_drain(r.ring, out, 8, 0), 5);
  EXPECT_EQ(daemon.Bell(), bell);
  const uint64_t more[8] = {offloadd_ring_release(r.ring, 20, 0, -1),
                            offloadd_ring_release(r.ring, 21, 0, -1),
                            offloadd_ring_release(r.ring, 22, 0, -1),
                            offloadd_ring_release(r.ring, 23, 0, -1),
                            offloadd_ring_release(r.ring, 24, 0, -1),
                            offloadd_ring_release(r.ring, 25, 0, -1),
                            offloadd_ring_release(r.ring, 26, 0, -1),
                            offloadd_ring_release(r.ring, 27, 0, -1)};
  for (int i = 0; i < 8; ++i) ASSERT_TRUE(daemon.Take(&e));
  const uint32_t before_full = daemon.Bell();  // submissions rang it
  for (uint64_t id : more) {
    daemon.Answer(common::MakeCompletion(id, common::CompletionKind::kReleased, 0, ""));
  }
  EXPECT_EQ(offloadd_ring_drain(r.ring, out, 8, 0), 8);  // the ring was full
  EXPECT_EQ(daemon.Bell(), before_full + 1);
}

// While the daemon polls, the submissions nobody waits for at once go unrung; an urgent reload
// rings, and so does a stopped poll.
TEST(RingCoreTest, DefersTheWakeUpOfSubmissionsNobodyWaitsForWhileTheDaemonPolls) {
  Ring r;
  FakeDaemon daemon(r.ring);
  daemon.ArmDoorbell();  // the daemon's thread is about to sleep: a ring would wake it
  daemon.SetPolling(500);
  const uint32_t bell = daemon.Bell();
  ASSERT_NE(offloadd_ring_offload(r.ring, 3, 0, 4096, 7, nullptr, 0, 0, 0, -1), 0u);
  ASSERT_NE(offloadd_ring_reload(r.ring, 0, 7, 3, 0, 2, 1, 0, nullptr, nullptr, -1), 0u);
  ASSERT_NE(offloadd_ring_release(r.ring, 0, 8, -1), 0u);
  EXPECT_EQ(daemon.Bell(), bell);  // three submissions, no wake-up
  ASSERT_NE(offloadd_ring_reload(r.ring, 0, 9, 3, 0, 1, 1, 0, nullptr, nullptr, -1), 0u);
  EXPECT_EQ(daemon.Bell(), bell + 1);  // urgent: rung at once
  daemon.SetPolling(0);  // the daemon stopped polling: every submission rings again
  ASSERT_NE(offloadd_ring_offload(r.ring, 3, 4096, 4096, 10, nullptr, 0, 0, 0, -1), 0u);
  EXPECT_EQ(daemon.Bell(), bell + 2);
  SubmissionEntry e;
  int taken = 0;
  while (daemon.Take(&e)) ++taken;
  EXPECT_EQ(taken, 5);  // every submission is on the ring, rung or not
}

// A thread about to sleep for an answer rings first when a submission went unrung, once.
TEST(RingCoreTest, AWaitRingsForAnUnrungSubmissionBeforeItSleeps) {
  Ring r;
  FakeDaemon daemon(r.ring);
  daemon.ArmDoorbell();
  daemon.SetPolling(500);
  const uint32_t bell = daemon.Bell();
  const uint64_t id = offloadd_ring_offload(r.ring, 3, 0, 4096, 7, nullptr, 0, 0, 0, -1);
  ASSERT_NE(id, 0u);
  EXPECT_EQ(daemon.Bell(), bell);
  offloadd_completion out;
  EXPECT_EQ(offloadd_ring_poll(r.ring, id, &out), OFFLOADD_PENDING);
  EXPECT_EQ(daemon.Bell(), bell);  // a poll does not sleep: no ring
  EXPECT_EQ(offloadd_ring_wait(r.ring, id, 0.01, &out), OFFLOADD_PENDING);
  EXPECT_EQ(daemon.Bell(), bell + 1);
  EXPECT_EQ(offloadd_ring_wait(r.ring, id, 0.01, &out), OFFLOADD_PENDING);
  EXPECT_EQ(daemon.Bell(), bell + 1);  // rung once for it, not on every wait
}

}  // namespace
}  // namespace offloadd::client
