#include "server/sched/link_scheduler.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/base/fake_clock.h"
#include "gtest/gtest.h"

namespace offloadd::sched {
namespace {

using base::FakeClock;

constexpr uint64_t kKiB = 1ull << 10;
constexpr uint64_t kMiB = 1ull << 20;

// A gate a copy can block on until the test opens it.
class Gate {
 public:
  void Open() {
    std::lock_guard<std::mutex> lock(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Wait() {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_ = false;
};

// Records, per transfer, every copied range and every done() status.
struct Recorder {
  std::mutex mu;
  std::map<int, std::vector<std::pair<uint64_t, uint64_t>>> ranges;
  std::map<int, std::vector<absl::Status>> done;
  std::vector<int> copy_order;  // transfer index of each copy call

  std::shared_ptr<Transfer> Make(int index, const std::string& gpu, TrafficClass cls,
                                 uint64_t bytes) {
    auto t = std::make_shared<Transfer>();
    t->gpu = gpu;
    t->cls = cls;
    t->bytes = bytes;
    t->copy_chunk = [this, index](uint64_t offset, uint64_t len) {
      std::lock_guard<std::mutex> lock(mu);
      ranges[index].push_back({offset, len});
      copy_order.push_back(index);
      return absl::OkStatus();
    };
    t->done = [this, index](absl::Status s) {
      std::lock_guard<std::mutex> lock(mu);
      done[index].push_back(std::move(s));
    };
    return t;
  }
};

LinkSchedulerOptions SmallChunks(uint32_t workers) {
  LinkSchedulerOptions o;
  o.link_name = "test-link";
  o.direction = "d2h";
  o.chunk_bytes = 64 * kKiB;
  o.quantum_bytes = 64 * kKiB;
  o.worker_threads = workers;
  o.inline_copy_max_bytes = 0;  // every copy on a worker (the inline path has its own tests)
  return o;
}

TEST(LinkSchedulerTest, EveryByteOfManyConcurrentTransfersIsCopiedExactlyOnce) {
  Recorder rec;
  LinkScheduler sched(SmallChunks(4));
  const std::vector<std::string> gpus = {"gpu0", "gpu1", "gpu2"};
  std::map<std::string, uint64_t> want_gpu;
  uint64_t want_class[kNumClasses] = {};
  std::vector<uint64_t> sizes;
  // Submit from three threads at once.
  std::vector<std::thread> submitters;
  std::mutex want_mu;
  for (int s = 0; s < 3; ++s) {
    submitters.emplace_back([&, s] {
      for (int i = 0; i < 40; ++i) {
        const int index = s * 100 + i;
        const uint64_t bytes =
            1 + (static_cast<uint64_t>(index) * 37 * kKiB + index) % (700 * kKiB);
        const TrafficClass cls = static_cast<TrafficClass>(i % kNumClasses);
        const std::string& gpu = gpus[(i + s) % gpus.size()];
        {
          std::lock_guard<std::mutex> lock(want_mu);
          want_gpu[gpu] += bytes;
          want_class[static_cast<int>(cls)] += bytes;
          sizes.push_back(bytes);
        }
        sched.Submit(rec.Make(index, gpu, cls, bytes));
      }
    });
  }
  for (std::thread& t : submitters) t.join();
  sched.Shutdown();

  ASSERT_EQ(rec.done.size(), 120u);
  uint64_t total = 0;
  for (auto& [index, statuses] : rec.done) {
    ASSERT_EQ(statuses.size(), 1u) << "transfer " << index;
    EXPECT_TRUE(statuses[0].ok()) << statuses[0];
    std::vector<std::pair<uint64_t, uint64_t>> r = rec.ranges[index];
    std::sort(r.begin(), r.end());
    uint64_t next = 0;
    for (auto [offset, len] : r) {
      ASSERT_EQ(offset, next) << "transfer " << index << ": gap or overlap";
      ASSERT_GT(len, 0u);
      ASSERT_LE(len, 64 * kKiB);
      next = offset + len;
    }
    total += next;
  }
  uint64_t want_total = 0;
  for (uint64_t b : sizes) want_total += b;
  EXPECT_EQ(total, want_total);
  const LinkSchedulerStats stats = sched.stats();
  EXPECT_EQ(stats.bytes, want_total);
  EXPECT_EQ(stats.gpu_bytes, want_gpu);
  for (int c = 0; c < kNumClasses; ++c) EXPECT_EQ(stats.class_bytes[c], want_class[c]);
  EXPECT_EQ(stats.queued_transfers, 0u);
  EXPECT_EQ(stats.chunks_in_flight, 0u);
}

// One multi-chunk transfer on an idle link with two workers, each copy held at a gate: both
// workers copy a chunk of it at once (the worker the Submit woke used to copy every chunk while
// the other slept).
TEST(LinkSchedulerTest, TwoWorkersCopyTwoChunksOfOneTransferAtOnce) {
  LinkScheduler sched(SmallChunks(2));
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // both workers wait for work
  std::mutex mu;
  std::condition_variable cv;
  int copying = 0, most_at_once = 0;
  bool open = false, done = false;
  auto t = std::make_shared<Transfer>();
  t->gpu = "gpu0";
  t->cls = TrafficClass::kOffload;
  t->bytes = 4 * 64 * kKiB;
  t->copy_chunk = [&](uint64_t, uint64_t) {
    std::unique_lock<std::mutex> lock(mu);
    most_at_once = std::max(most_at_once, ++copying);
    cv.notify_all();
    cv.wait(lock, [&] { return open; });
    --copying;
    return absl::OkStatus();
  };
  t->done = [&](absl::Status s) {
    EXPECT_TRUE(s.ok()) << s;
    std::lock_guard<std::mutex> lock(mu);
    done = true;
    cv.notify_all();
  };
  sched.Submit(t);
  std::unique_lock<std::mutex> lock(mu);
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return copying == 2; }))
      << copying << " chunk(s) copying";
  open = true;
  cv.notify_all();
  cv.wait(lock, [&] { return done; });
  EXPECT_EQ(most_at_once, 2);
  EXPECT_EQ(sched.stats().bytes, 4 * 64 * kKiB);
}

TEST(LinkSchedulerTest, FirstErrorWinsAndRemainingChunksAreSkipped) {
  LinkScheduler sched(SmallChunks(1));
  std::mutex mu;
  std::vector<uint64_t> offsets;
  std::vector<absl::Status> done;
  auto t = std::make_shared<Transfer>();
  t->gpu = "gpu0";
  t->bytes = 10 * 64 * kKiB;
  t->copy_chunk = [&](uint64_t offset, uint64_t) {
    std::lock_guard<std::mutex> lock(mu);
    offsets.push_back(offset);
    if (offset == 3 * 64 * kKiB) return absl::DataLossError("chunk 3 failed");
    if (offset == 4 * 64 * kKiB) return absl::InternalError("chunk 4 must not run");
    return absl::OkStatus();
  };
  t->done = [&](absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    done.push_back(std::move(s));
  };
  sched.Submit(t);
  sched.Shutdown();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].code(), absl::StatusCode::kDataLoss);
  EXPECT_EQ(done[0].message(), "chunk 3 failed");
  EXPECT_EQ(offsets.size(), 4u);
  EXPECT_EQ(sched.stats().bytes, 3 * 64 * kKiB);
}

TEST(LinkSchedulerTest, FailingChunksOnManyWorkersGiveOneDoneWithAnError) {
  Recorder rec;
  LinkScheduler sched(SmallChunks(4));
  std::atomic<int> copies{0};
  auto bad = std::make_shared<Transfer>();
  bad->gpu = "gpu0";
  bad->bytes = 100 * 64 * kKiB;
  bad->copy_chunk = [&](uint64_t, uint64_t) {
    ++copies;
    return absl::UnavailableError("device lost");
  };
  std::vector<absl::Status> done;
  std::mutex mu;
  bad->done = [&](absl::Status s) {
    std::lock_guard<std::mutex> lock(mu);
    done.push_back(std::move(s));
  };
  sched.Submit(bad);
  sched.Submit(rec.Make(1, "gpu1", TrafficClass::kOffload, 300 * kKiB));
  sched.Shutdown();
  ASSERT_EQ(done.size(), 1u);
  EXPECT_EQ(done[0].code(), absl::StatusCode::kUnavailable);
  EXPECT_LE(copies.load(), 4);  // at most one chunk per worker ran after the first failure
  ASSERT_EQ(rec.done[1].size(), 1u);
  EXPECT_TRUE(rec.done[1][0].ok());
  EXPECT_EQ(sched.stats().bytes, 300 * kKiB);
}

TEST(LinkSchedulerTest, ShutdownDrainsQueuedAndInFlightWork) {
  Recorder rec;
  LinkScheduler sched(SmallChunks(1));
  Gate gate;
  auto blocker = rec.Make(0, "gpu0", TrafficClass::kOffload, 64 * kKiB);
  auto record = blocker->copy_chunk;
  blocker->copy_chunk = [&gate, record](uint64_t offset, uint64_t len) {
    gate.Wait();
    return record(offset, len);
  };
  sched.Submit(blocker);
  for (int i = 1; i <= 20; ++i)
    sched.Submit(rec.Make(i, "gpu1", TrafficClass::kPrefetch, 100 * kKiB));
  std::thread stopper([&] { sched.Shutdown(); });
  // Probe until Submit is refused: then Shutdown has begun while work is still queued.
  int probes_accepted = 0;
  for (int i = 1000;; ++i) {
    auto probe = rec.Make(i, "gpu2", TrafficClass::kUrgent, 1);
    sched.Submit(probe);
    std::lock_guard<std::mutex> lock(rec.mu);
    if (!rec.done[i].empty() && rec.done[i][0].code() == absl::StatusCode::kUnavailable) {
      rec.done.erase(i);
      break;
    }
    ++probes_accepted;
  }
  gate.Open();
  stopper.join();
  EXPECT_EQ(rec.done.size(), 21u + probes_accepted);
  for (auto& [index, statuses] : rec.done) {
    ASSERT_EQ(statuses.size(), 1u);
    EXPECT_TRUE(statuses[0].ok()) << "transfer " << index << ": " << statuses[0];
  }
  EXPECT_EQ(sched.stats().bytes, 64 * kKiB + 20 * 100 * kKiB + probes_accepted);
}

// Stands in for what a transfer's callbacks capture in the daemon (the Session, the Region):
// its destructor records whether the scheduler's mutex was held when the last reference died.
struct LastReferenceProbe {
  const LinkScheduler* sched = nullptr;
  std::mutex* mu = nullptr;
  std::condition_variable* cv = nullptr;
  int* destroyed = nullptr;
  int* destroyed_under_lock = nullptr;
  ~LastReferenceProbe() {
    const bool held = sched->MutexHeldForTesting();
    std::lock_guard<std::mutex> lock(*mu);
    ++*destroyed;
    if (held) ++*destroyed_under_lock;
    cv->notify_all();
  }
};

// Makes probes for one scheduler and counts their deaths.
struct ProbeTally {
  explicit ProbeTally(const LinkScheduler* s) : sched(s) {}
  std::shared_ptr<LastReferenceProbe> Make() {
    auto p = std::make_shared<LastReferenceProbe>();
    p->sched = sched;
    p->mu = &mu;
    p->cv = &cv;
    p->destroyed = &destroyed;
    p->destroyed_under_lock = &destroyed_under_lock;
    return p;
  }
  // Waits until `n` probes have died; returns how many of all died under the scheduler's lock.
  int WaitForDestroyed(int n) {
    std::unique_lock<std::mutex> lock(mu);
    cv.wait(lock, [&] { return destroyed == n; });
    return destroyed_under_lock;
  }

  const LinkScheduler* sched;
  std::mutex mu;
  std::condition_variable cv;
  int destroyed = 0, destroyed_under_lock = 0;
};

TEST(LinkSchedulerTest, FinishedTransfersAreDroppedWithoutTheSchedulerLock) {
  // One worker, and the test thread stays away from the scheduler while transfers finish, so
  // nobody but the worker could hold its mutex when a probe dies.
  LinkScheduler sched(SmallChunks(1));
  ProbeTally probes(&sched);
  Gate gate;
  // 0: completes in 3 chunks; the probe is held by `done`, as a Session is.
  auto ok = std::make_shared<Transfer>();
  ok->gpu = "gpu0";
  ok->bytes = 3 * 64 * kKiB;
  ok->copy_chunk = [&gate](uint64_t, uint64_t) {
    gate.Wait();
    return absl::OkStatus();
  };
  ok->done = [p = probes.Make()](absl::Status) {};
  // 1: fails at its second chunk (the rest are cancelled); the probe is in both callbacks.
  auto failing = std::make_shared<Transfer>();
  failing->gpu = "gpu1";
  failing->bytes = 4 * 64 * kKiB;
  auto p1 = probes.Make();
  failing->copy_chunk = [p1](uint64_t offset, uint64_t) {
    return offset == 0 ? absl::OkStatus() : absl::DataLossError("client memory went away");
  };
  failing->done = [p1](absl::Status) {};
  p1.reset();
  // 2: no done callback at all; the probe is held by copy_chunk, as a Region is.
  auto silent = std::make_shared<Transfer>();
  silent->gpu = "gpu2";
  silent->bytes = 2 * 64 * kKiB;
  silent->copy_chunk = [p = probes.Make()](uint64_t, uint64_t) { return absl::OkStatus(); };
  sched.Submit(std::move(ok));
  sched.Submit(std::move(failing));
  sched.Submit(std::move(silent));
  gate.Open();
  EXPECT_EQ(probes.WaitForDestroyed(3), 0);
  sched.Shutdown();
  EXPECT_EQ(sched.stats().bytes, (3 + 1 + 2) * 64 * kKiB);
}

TEST(LinkSchedulerTest, SubmitAfterShutdownIsUnavailable) {
  Recorder rec;
  LinkScheduler sched(SmallChunks(2));
  sched.Shutdown();
  sched.Shutdown();  // idempotent
  sched.Submit(rec.Make(7, "gpu0", TrafficClass::kUrgent, 10));
  ASSERT_EQ(rec.done[7].size(), 1u);
  EXPECT_EQ(rec.done[7][0].code(), absl::StatusCode::kUnavailable);
  EXPECT_TRUE(rec.ranges[7].empty());
}

TEST(LinkSchedulerTest, InvalidTransfersFailAtOnce) {
  Recorder rec;
  LinkScheduler sched(SmallChunks(1));
  sched.Submit(rec.Make(1, "gpu0", TrafficClass::kUrgent, 0));
  auto no_copy = rec.Make(2, "gpu0", TrafficClass::kUrgent, 10);
  no_copy->copy_chunk = nullptr;
  sched.Submit(no_copy);
  ASSERT_EQ(rec.done[1].size(), 1u);
  EXPECT_EQ(rec.done[1][0].code(), absl::StatusCode::kInvalidArgument);
  ASSERT_EQ(rec.done[2].size(), 1u);
  EXPECT_EQ(rec.done[2][0].code(), absl::StatusCode::kInvalidArgument);
}

TEST(LinkSchedulerTest, UrgentReloadOvertakesQueuedOffloadChunks) {
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.offload_min_share = 0;
  LinkScheduler sched(o);
  Gate gate;
  auto offload = rec.Make(0, "gpu0", TrafficClass::kOffload, 5 * 64 * kKiB);
  auto record = offload->copy_chunk;
  offload->copy_chunk = [&gate, record](uint64_t offset, uint64_t len) {
    if (offset == 0) gate.Wait();
    return record(offset, len);
  };
  sched.Submit(offload);
  // Wait until the first offload chunk is in flight, then queue the reload behind it.
  while (sched.stats().chunks_in_flight == 0) std::this_thread::yield();
  sched.Submit(rec.Make(1, "gpu1", TrafficClass::kUrgent, 2 * 64 * kKiB));
  gate.Open();
  sched.Shutdown();
  EXPECT_EQ(rec.copy_order, (std::vector<int>{0, 1, 1, 0, 0, 0, 0}));
}

// An asynchronous engine the test completes by hand: records every posted chunk and how many of
// each GPU are outstanding.
class ManualAsyncEngine {
 public:
  struct Post {
    int transfer;
    std::string gpu;
    uint64_t offset, len;
    std::function<void(absl::Status)> done;
  };
  void Attach(Transfer& t, int index) {
    t.copy_chunk = nullptr;
    t.post_chunk = [this, index, gpu = t.gpu](uint64_t offset, uint64_t len,
                                              std::function<void(absl::Status)> done) {
      std::lock_guard<std::mutex> lock(mu_);
      posts_.push_back(Post{index, gpu, offset, len, std::move(done)});
      max_outstanding_[gpu] = std::max(max_outstanding_[gpu], ++outstanding_[gpu]);
      cv_.notify_all();
    };
  }
  void WaitForPosts(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return posts_.size() >= n; });
  }
  // Completes post `i` (in posting order) with `status`.
  void Complete(size_t i, absl::Status status = absl::OkStatus()) {
    std::function<void(absl::Status)> done;
    {
      std::lock_guard<std::mutex> lock(mu_);
      done = std::move(posts_.at(i).done);
      --outstanding_[posts_[i].gpu];
    }
    done(std::move(status));
  }
  Post post(size_t i) {
    std::lock_guard<std::mutex> lock(mu_);
    return posts_.at(i);
  }
  size_t posts() {
    std::lock_guard<std::mutex> lock(mu_);
    return posts_.size();
  }
  int max_outstanding(const std::string& gpu) {
    std::lock_guard<std::mutex> lock(mu_);
    return max_outstanding_[gpu];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Post> posts_;
  std::map<std::string, int> outstanding_, max_outstanding_;
};

// Chunks are posted without a worker per chunk, up to the per-GPU limit; bytes count
// at completion; a completion frees a slot of its GPU.
TEST(LinkSchedulerTest, AsyncChunksArePostedUpToThePerGpuLimitAndCountedAtCompletion) {
  Recorder rec;
  ManualAsyncEngine engine;
  LinkSchedulerOptions o = SmallChunks(1);  // one worker, yet several chunks in flight
  o.max_chunks_in_flight_per_gpu = 2;
  LinkScheduler sched(o);
  auto a = rec.Make(0, "gpu0", TrafficClass::kOffload, 4 * 64 * kKiB);
  auto b = rec.Make(1, "gpu1", TrafficClass::kOffload, 4 * 64 * kKiB);
  engine.Attach(*a, 0);
  engine.Attach(*b, 1);
  sched.Submit(a);
  sched.Submit(b);
  engine.WaitForPosts(4);  // two per GPU, none completed
  EXPECT_EQ(sched.stats().chunks_in_flight, 4u);
  EXPECT_EQ(sched.stats().bytes, 0u);
  for (size_t done = 0; done < 8; ++done) {
    engine.WaitForPosts(std::min<size_t>(8, done + 4));
    engine.Complete(done);
  }
  sched.Shutdown();
  EXPECT_EQ(engine.posts(), 8u);
  EXPECT_EQ(engine.max_outstanding("gpu0"), 2);
  EXPECT_EQ(engine.max_outstanding("gpu1"), 2);
  EXPECT_EQ(sched.stats().bytes, 8 * 64 * kKiB);
  EXPECT_EQ(sched.stats().gpu_bytes.at("gpu0"), 4 * 64 * kKiB);
  ASSERT_EQ(rec.done[0].size(), 1u);
  ASSERT_EQ(rec.done[1].size(), 1u);
  EXPECT_TRUE(rec.done[0][0].ok());
  EXPECT_TRUE(rec.done[1][0].ok());
  EXPECT_EQ(sched.stats().chunks_in_flight, 0u);
}

// An URGENT chunk is posted at once even when its GPU is at its limit (the engine serves it
// ahead of the chunks queued there); it holds a slot like any other, so the offload waits for
// two completions; an error fails its transfer once.
TEST(LinkSchedulerTest, AsyncUrgentChunkIsPostedAtOnceEvenAtItsGpusLimit) {
  Recorder rec;
  ManualAsyncEngine engine;
  LinkSchedulerOptions o = SmallChunks(2);
  o.offload_min_share = 0;
  o.max_chunks_in_flight_per_gpu = 2;
  LinkScheduler sched(o);
  auto offload = rec.Make(0, "gpu0", TrafficClass::kOffload, 6 * 64 * kKiB);
  engine.Attach(*offload, 0);
  sched.Submit(offload);
  engine.WaitForPosts(2);
  auto urgent = rec.Make(1, "gpu0", TrafficClass::kUrgent, 64 * kKiB);
  engine.Attach(*urgent, 1);
  sched.Submit(urgent);
  engine.WaitForPosts(3);
  EXPECT_EQ(engine.post(2).transfer, 1);  // the urgent chunk, with gpu0 at its limit
  EXPECT_EQ(engine.max_outstanding("gpu0"), 3);
  engine.Complete(0);  // 2 posted (offload, urgent): still at the limit
  EXPECT_EQ(engine.posts(), 3u);
  engine.Complete(2);
  engine.WaitForPosts(4);  // the slot goes back to the offload
  EXPECT_EQ(engine.post(3).transfer, 0);
  engine.Complete(1, absl::InternalError("copy engine fault"));
  engine.Complete(3);
  sched.Shutdown();
  ASSERT_EQ(rec.done[1].size(), 1u);
  EXPECT_TRUE(rec.done[1][0].ok());
  ASSERT_EQ(rec.done[0].size(), 1u);
  EXPECT_EQ(rec.done[0][0].code(), absl::StatusCode::kInternal);
  EXPECT_EQ(engine.posts(), 4u);  // the failed offload's remaining chunks were skipped
}

// A transfer whose posted chunks wait for its producer (the engine says so) holds none of its
// GPU's slots: a ready transfer of another owner on the same GPU and class, queued behind it, is
// posted and completes while the producer still runs; the waiting transfer's queued chunks are
// not posted meanwhile, and once its producer is done it goes on from where it was.
TEST(LinkSchedulerTest, ATransferWaitingForItsProducerHoldsNoSlotOfItsGpu) {
  Recorder rec;
  ManualAsyncEngine engine;
  LinkSchedulerOptions o = SmallChunks(2);
  o.max_chunks_in_flight_per_gpu = 2;
  LinkScheduler sched(o);
  auto waiting = rec.Make(0, "gpu0", TrafficClass::kOffload, 4 * 64 * kKiB);
  waiting->owner_id = 1;
  engine.Attach(*waiting, 0);
  sched.Submit(waiting);
  engine.WaitForPosts(2);  // gpu0 at its limit with the waiting transfer's chunks
  auto ready = rec.Make(1, "gpu0", TrafficClass::kOffload, 64 * kKiB);
  ready->owner_id = 2;
  engine.Attach(*ready, 1);
  sched.Submit(ready);
  EXPECT_EQ(engine.posts(), 2u);  // behind the limit, as before the engine's word
  EXPECT_TRUE(sched.SetWaitingForProducer(waiting.get(), true));
  EXPECT_FALSE(sched.SetWaitingForProducer(waiting.get(), true));  // no change
  engine.WaitForPosts(3);
  EXPECT_EQ(engine.post(2).transfer, 1);
  EXPECT_EQ(sched.stats().chunks_waiting_for_producer, 2u);
  engine.Complete(2);
  for (;;) {  // the ready transfer's done runs on a worker
    {
      std::lock_guard<std::mutex> lock(rec.mu);
      if (!rec.done[1].empty()) break;
    }
    std::this_thread::yield();
  }
  EXPECT_EQ(engine.posts(), 3u);  // the waiting transfer's last two chunks stay queued
  EXPECT_EQ(sched.stats().producer_waits, 1u);
  // The producer is done: its posted chunks hold their slots again, and its queued ones follow
  // as they free up.
  EXPECT_TRUE(sched.SetWaitingForProducer(waiting.get(), false));
  EXPECT_EQ(sched.stats().chunks_waiting_for_producer, 0u);
  engine.Complete(0);
  engine.WaitForPosts(4);
  EXPECT_EQ(engine.post(3).transfer, 0);
  EXPECT_EQ(engine.post(3).offset, 2 * 64 * kKiB);
  engine.Complete(1);
  engine.WaitForPosts(5);
  engine.Complete(3);
  engine.Complete(4);
  sched.Shutdown();
  EXPECT_FALSE(sched.SetWaitingForProducer(waiting.get(), true));  // finished
  EXPECT_EQ(engine.posts(), 5u);
  EXPECT_EQ(engine.max_outstanding("gpu0"), 3);
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.done[0].size(), 1u);
  EXPECT_TRUE(rec.done[0][0].ok());
  ASSERT_EQ(rec.done[1].size(), 1u);
  EXPECT_TRUE(rec.done[1][0].ok());
  EXPECT_EQ(sched.stats().gpu_bytes.at("gpu0"), 5 * 64 * kKiB);
}

// Many transfers waiting at once hold no slot between them, and a waiting transfer cancelled
// (its session ended) is dropped with its queued chunks.
TEST(LinkSchedulerTest, ManyWaitingTransfersLeaveTheirGpuToAReadyOne) {
  Recorder rec;
  ManualAsyncEngine engine;
  LinkSchedulerOptions o = SmallChunks(1);
  o.max_chunks_in_flight_per_gpu = 2;
  LinkScheduler sched(o);
  std::vector<std::shared_ptr<Transfer>> waiting;
  for (int i = 0; i < 4; ++i) {
    auto t = rec.Make(i, "gpu0", TrafficClass::kOffload, 3 * 64 * kKiB);
    t->owner_id = 10 + i;
    engine.Attach(*t, i);
    sched.Submit(t);
    engine.WaitForPosts(2 * (i + 1));  // each fills the two slots, then is seen waiting
    EXPECT_TRUE(sched.SetWaitingForProducer(t.get(), true));
    waiting.push_back(t);
  }
  auto ready = rec.Make(9, "gpu0", TrafficClass::kOffload, 2 * 64 * kKiB);
  engine.Attach(*ready, 9);
  sched.Submit(ready);
  engine.WaitForPosts(10);
  EXPECT_EQ(engine.post(8).transfer, 9);
  EXPECT_EQ(engine.post(9).transfer, 9);
  EXPECT_EQ(sched.stats().chunks_waiting_for_producer, 8u);
  engine.Complete(8);
  engine.Complete(9);
  EXPECT_EQ(sched.CancelOwner(10, absl::CancelledError("session ended")), 1u);
  for (size_t i = 0; i < 8; ++i) engine.Complete(i, absl::CancelledError("producer gone"));
  sched.Shutdown();
  EXPECT_EQ(engine.posts(), 10u);
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.done[9].size(), 1u);
  EXPECT_TRUE(rec.done[9][0].ok());
  for (int i = 0; i < 4; ++i) {
    ASSERT_EQ(rec.done[i].size(), 1u) << i;
    EXPECT_EQ(rec.done[i][0].code(), absl::StatusCode::kCancelled);
  }
  EXPECT_EQ(sched.stats().chunks_waiting_for_producer, 0u);
}

// Small requests: a one-chunk transfer of at most inline_copy_max_bytes on an idle
// unpaced link is copied, and its done run, on the submitting thread before Submit returns;
// with chunks queued it waits its turn on a worker like any other.
TEST(LinkSchedulerTest, ASmallTransferOnAnIdleLinkIsCopiedOnTheSubmittingThread) {
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.inline_copy_max_bytes = 4 * kKiB;
  LinkScheduler sched(o);
  std::thread::id copied_on;
  auto small = rec.Make(0, "gpu0", TrafficClass::kOffload, 4 * kKiB);
  auto record = small->copy_chunk;
  small->copy_chunk = [&copied_on, record](uint64_t offset, uint64_t len) {
    copied_on = std::this_thread::get_id();
    return record(offset, len);
  };
  sched.Submit(small);
  {
    std::lock_guard<std::mutex> lock(rec.mu);
    ASSERT_EQ(rec.done[0].size(), 1u);  // done before Submit returned
    EXPECT_TRUE(rec.done[0][0].ok());
  }
  EXPECT_EQ(copied_on, std::this_thread::get_id());
  EXPECT_EQ(sched.stats().bytes, 4 * kKiB);
  EXPECT_EQ(sched.stats().started_transfers[static_cast<int>(TrafficClass::kOffload)], 1u);

  // A worker blocked in the first of two chunks: the second is queued, so the small one waits.
  Gate gate;
  auto big = rec.Make(1, "gpu0", TrafficClass::kOffload, 2 * 64 * kKiB);
  auto record_big = big->copy_chunk;
  std::atomic<bool> big_started{false};
  big->copy_chunk = [&](uint64_t offset, uint64_t len) {
    big_started = true;
    gate.Wait();
    return record_big(offset, len);
  };
  sched.Submit(big);
  while (!big_started.load()) std::this_thread::yield();
  sched.Submit(rec.Make(2, "gpu0", TrafficClass::kOffload, 4 * kKiB));
  {
    std::lock_guard<std::mutex> lock(rec.mu);
    EXPECT_EQ(rec.done.count(2), 0u);
  }
  gate.Open();
  sched.Shutdown();
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.done[2].size(), 1u);
  EXPECT_TRUE(rec.done[2][0].ok());
  EXPECT_EQ(sched.stats().bytes, (4 + 128 + 4) * kKiB);
}

// A small transfer copied on the submitting thread wakes no worker: on a loaded node each
// needless wake-up is a thread switch in the request's path (two per request).
TEST(LinkSchedulerTest, ASmallTransferCopiedOnTheSubmittingThreadWakesNoWorker) {
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(2);
  o.inline_copy_max_bytes = 4 * kKiB;
  LinkScheduler sched(o);
  for (int i = 0; i < 50; ++i) {
    sched.Submit(rec.Make(i, "gpu0", TrafficClass::kOffload, 4 * kKiB));
  }
  {
    std::lock_guard<std::mutex> lock(rec.mu);
    for (int i = 0; i < 50; ++i) ASSERT_EQ(rec.done[i].size(), 1u) << i;  // each copied inline
  }
  EXPECT_EQ(sched.stats().bytes, 50 * 4 * kKiB);
  EXPECT_EQ(sched.stats().worker_wakeups, 0u);
  // A transfer too large to copy inline still goes to a worker.
  sched.Submit(rec.Make(50, "gpu0", TrafficClass::kOffload, 2 * 64 * kKiB));
  sched.Shutdown();
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.done[50].size(), 1u);
  EXPECT_TRUE(rec.done[50][0].ok());
}

// A Submit from inside an inline done (an admission it let in) is queued for a worker, not
// copied recursively on the same stack.
TEST(LinkSchedulerTest, ASubmitFromAnInlineDoneGoesToAWorker) {
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.inline_copy_max_bytes = 4 * kKiB;
  LinkScheduler sched(o);
  std::thread::id submitter = std::this_thread::get_id(), follow_up_copied_on;
  auto first = rec.Make(0, "gpu0", TrafficClass::kOffload, 4 * kKiB);
  auto follow_up = rec.Make(1, "gpu0", TrafficClass::kOffload, 4 * kKiB);
  auto record = follow_up->copy_chunk;
  follow_up->copy_chunk = [&, record](uint64_t offset, uint64_t len) {
    follow_up_copied_on = std::this_thread::get_id();
    return record(offset, len);
  };
  auto record_done = first->done;
  first->done = [&, record_done](absl::Status st) {
    record_done(st);
    sched.Submit(follow_up);
  };
  sched.Submit(first);
  sched.Shutdown();
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.done[1].size(), 1u);
  EXPECT_NE(follow_up_copied_on, submitter);
}

TEST(LinkSchedulerTest, DoneMaySubmitFollowUpWork) {
  Recorder rec;
  LinkScheduler sched(SmallChunks(2));
  auto first = rec.Make(1, "gpu0", TrafficClass::kOffload, 200 * kKiB);
  auto record_done = first->done;
  first->done = [&, record_done](absl::Status s) {
    record_done(s);
    sched.Submit(rec.Make(2, "gpu0", TrafficClass::kOffload, 100 * kKiB));
  };
  sched.Submit(first);
  // Wait for the follow-up before shutting down, so it is not refused.
  for (;;) {
    {
      std::lock_guard<std::mutex> lock(rec.mu);
      if (rec.done.count(2)) break;
    }
    std::this_thread::yield();
  }
  sched.Shutdown();
  ASSERT_EQ(rec.done[2].size(), 1u);
  EXPECT_TRUE(rec.done[2][0].ok());
  EXPECT_EQ(sched.stats().bytes, 300 * kKiB);
}

TEST(LinkSchedulerTest, PacingOneWorkerTakesExactlyBytesOverRate) {
  FakeClock clock;
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.chunk_bytes = 1 * kMiB;
  o.bytes_per_second = 1e9;
  LinkScheduler sched(o, &clock);
  const uint64_t sizes[] = {20 * kMiB, 3 * kMiB + 5, 7 * kMiB};
  uint64_t total = 0;
  for (int i = 0; i < 3; ++i) {
    sched.Submit(rec.Make(i, "gpu" + std::to_string(i), TrafficClass::kOffload, sizes[i]));
    total += sizes[i];
  }
  sched.Shutdown();
  const double want = static_cast<double>(total) / 1e9;
  EXPECT_NEAR(clock.NowSeconds(), want, 1e-9);
  const LinkSchedulerStats stats = sched.stats();
  EXPECT_EQ(stats.bytes, total);
  EXPECT_NEAR(stats.busy_seconds, want, 1e-9);
}

TEST(LinkSchedulerTest, PacingWithManyWorkersNeverExceedsTheRateInAggregate) {
  FakeClock clock;
  LinkSchedulerOptions o = SmallChunks(4);
  o.chunk_bytes = 1 * kMiB;
  o.bytes_per_second = 2e9;
  LinkScheduler sched(o, &clock);
  std::mutex mu;
  uint64_t started_bytes = 0;
  int violations = 0;
  uint64_t total = 0;
  for (int i = 0; i < 12; ++i) {
    auto t = std::make_shared<Transfer>();
    t->gpu = "gpu" + std::to_string(i % 4);
    t->cls = static_cast<TrafficClass>(i % kNumClasses);
    t->bytes = (i + 1) * kMiB + 1234 * i;
    total += t->bytes;
    t->copy_chunk = [&](uint64_t, uint64_t len) {
      // A chunk is handed out only once the link has moved every earlier chunk at the rate
      // (virtual time), so the bytes started before this one are at most rate x now, plus
      // one chunk that another worker may have picked after this one but copied first.
      std::lock_guard<std::mutex> lock(mu);
      if (static_cast<double>(started_bytes) > 2e9 * clock.NowSeconds() + 1.0 * kMiB + 1) {
        ++violations;
      }
      started_bytes += len;
      return absl::OkStatus();
    };
    sched.Submit(t);
  }
  sched.Shutdown();
  EXPECT_EQ(violations, 0);
  EXPECT_EQ(sched.stats().bytes, total);
  // The link was never idle in virtual time, so it ends exactly at bytes / rate.
  EXPECT_NEAR(clock.NowSeconds(), static_cast<double>(total) / 2e9, 1e-9);
}

TEST(LinkSchedulerTest, QueueWaitIsSubmitToFirstChunkStartPerClass) {
  FakeClock clock;
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.chunk_bytes = 1 * kMiB;
  o.bytes_per_second = 1e9;
  o.offload_min_share = 0;
  std::mutex mu;
  std::vector<std::pair<TrafficClass, double>> reported;
  o.on_queue_wait = [&](TrafficClass c, double s) {
    std::lock_guard<std::mutex> lock(mu);
    reported.push_back({c, s});
  };
  LinkScheduler sched(o, &clock);
  // Hold the first chunk until everything is queued, so every Submit happens at time 0.
  Gate gate;
  auto first = rec.Make(0, "gpu0", TrafficClass::kOffload, 2 * kMiB);
  auto record = first->copy_chunk;
  first->copy_chunk = [&gate, record](uint64_t offset, uint64_t len) {
    if (offset == 0) gate.Wait();
    return record(offset, len);
  };
  sched.Submit(first);
  while (sched.stats().chunks_in_flight == 0) std::this_thread::yield();
  sched.Submit(rec.Make(1, "gpu0", TrafficClass::kOffload, 2 * kMiB));
  sched.Submit(rec.Make(2, "gpu1", TrafficClass::kPrefetch, 3 * kMiB));
  sched.Submit(rec.Make(3, "gpu1", TrafficClass::kUrgent, 1 * kMiB));
  gate.Open();
  sched.Shutdown();
  // Chunk order: 0 (in flight), 3 (urgent), 2 2 2 (prefetch), 0, 1 1 (offload).
  EXPECT_EQ(rec.copy_order, (std::vector<int>{0, 3, 2, 2, 2, 0, 1, 1}));
  const double chunk = static_cast<double>(kMiB) / 1e9;
  const LinkSchedulerStats s = sched.stats();
  const int u = static_cast<int>(TrafficClass::kUrgent);
  const int p = static_cast<int>(TrafficClass::kPrefetch);
  const int f = static_cast<int>(TrafficClass::kOffload);
  EXPECT_EQ(s.started_transfers[u], 1u);
  EXPECT_EQ(s.started_transfers[p], 1u);
  EXPECT_EQ(s.started_transfers[f], 2u);
  EXPECT_NEAR(s.queue_wait_seconds_sum[u], 1 * chunk, 1e-12);
  EXPECT_NEAR(s.queue_wait_seconds_sum[p], 2 * chunk, 1e-12);
  EXPECT_NEAR(s.queue_wait_seconds_sum[f], 0 + 6 * chunk, 1e-12);
  EXPECT_NEAR(s.queue_wait_seconds_max[f], 6 * chunk, 1e-12);
  std::lock_guard<std::mutex> lock(mu);
  ASSERT_EQ(reported.size(), 4u);
  EXPECT_EQ(reported[1].first, TrafficClass::kUrgent);
  EXPECT_NEAR(reported[1].second, chunk, 1e-12);
}

TEST(LinkSchedulerTest, TransfersFinishingAfterTheirDeadlineAreCountedPerGpu) {
  FakeClock clock;
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.chunk_bytes = 1 * kMiB;
  o.bytes_per_second = 1e9;
  LinkScheduler sched(o, &clock);
  const double chunk = static_cast<double>(kMiB) / 1e9;
  Gate gate;
  auto first = rec.Make(0, "gpu0", TrafficClass::kOffload, 1 * kMiB);
  auto record = first->copy_chunk;
  first->copy_chunk = [&gate, record](uint64_t offset, uint64_t len) {
    gate.Wait();
    return record(offset, len);
  };
  sched.Submit(first);
  while (sched.stats().chunks_in_flight == 0) std::this_thread::yield();
  auto late = rec.Make(1, "gpu0", TrafficClass::kUrgent, 1 * kMiB);
  late->deadline_at_seconds = 1.5 * chunk;  // runs from 1 to 2 chunk-times: missed
  auto early = rec.Make(2, "gpu1", TrafficClass::kUrgent, 1 * kMiB);
  early->deadline_at_seconds = 10 * chunk;  // runs from 2 to 3: met
  sched.Submit(late);
  sched.Submit(early);
  gate.Open();
  sched.Shutdown();
  EXPECT_EQ(rec.copy_order, (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(sched.stats().gpu_deadline_misses, (std::map<std::string, uint64_t>{{"gpu0", 1}}));
}

TEST(LinkSchedulerTest, PacedLinkCatchesUpAfterALateWorkerWhileBacklogged) {
  FakeClock clock;
  LinkSchedulerOptions o = SmallChunks(1);
  o.chunk_bytes = 1 * kMiB;
  o.bytes_per_second = 1e9;
  LinkScheduler sched(o, &clock);
  const double chunk = static_cast<double>(kMiB) / 1e9;
  Gate gate;
  std::atomic<bool> first_started{false};
  auto t = std::make_shared<Transfer>();
  t->gpu = "gpu0";
  t->bytes = 5 * kMiB;
  t->copy_chunk = [&](uint64_t offset, uint64_t) {
    if (offset == 0) {
      first_started = true;
      gate.Wait();
    }
    return absl::OkStatus();
  };
  sched.Submit(t);
  while (!first_started) std::this_thread::yield();
  // The worker is held (descheduled, say) until 3 chunk-times; the link had work queued all
  // along, so chunks 2..5 start at 1, 2, 3, 4 chunk-times, not at 3, 4, 5, 6.
  clock.Advance(3 * chunk);
  gate.Open();
  sched.Shutdown();
  EXPECT_NEAR(clock.NowSeconds(), 5 * chunk, 1e-12);
  EXPECT_EQ(sched.stats().bytes, 5 * kMiB);
}

TEST(LinkSchedulerTest, PacedLinkRestartsWhenWorkArrivesAfterAnIdleGap) {
  FakeClock clock;
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.chunk_bytes = 1 * kMiB;
  o.bytes_per_second = 1e9;
  LinkScheduler sched(o, &clock);
  const double chunk = static_cast<double>(kMiB) / 1e9;
  sched.Submit(rec.Make(0, "gpu0", TrafficClass::kOffload, 1 * kMiB));
  while (sched.stats().bytes < 1 * kMiB) std::this_thread::yield();
  EXPECT_NEAR(clock.NowSeconds(), chunk, 1e-12);
  clock.Advance(10 * chunk);  // idle: no credit is banked
  sched.Submit(rec.Make(1, "gpu0", TrafficClass::kOffload, 2 * kMiB));
  sched.Shutdown();
  EXPECT_NEAR(clock.NowSeconds(), 13 * chunk, 1e-12);
}

// A capacity set at run time (a link calibrated after it was made) paces from the next chunk:
// an unpaced link copies at once, then 1 GB/s, then 2 GB/s.
TEST(LinkSchedulerTest, SetBytesPerSecondPacesTheNextChunks) {
  FakeClock clock;
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.chunk_bytes = 1 * kMiB;
  LinkScheduler sched(o, &clock);
  EXPECT_EQ(sched.bytes_per_second(), 0);
  sched.Submit(rec.Make(0, "gpu0", TrafficClass::kOffload, 4 * kMiB));
  while (sched.stats().bytes < 4 * kMiB) std::this_thread::yield();
  EXPECT_EQ(clock.NowSeconds(), 0);  // unpaced: no time passes on the fake clock
  sched.SetBytesPerSecond(1e9);
  EXPECT_EQ(sched.bytes_per_second(), 1e9);
  EXPECT_EQ(sched.options().bytes_per_second, 0);  // as made
  const double chunk = static_cast<double>(kMiB) / 1e9;
  sched.Submit(rec.Make(1, "gpu0", TrafficClass::kOffload, 3 * kMiB));
  while (sched.stats().bytes < 7 * kMiB) std::this_thread::yield();
  while (clock.NowSeconds() < 3 * chunk - 1e-12) std::this_thread::yield();
  EXPECT_NEAR(clock.NowSeconds(), 3 * chunk, 1e-12);
  sched.SetBytesPerSecond(2e9);
  sched.Submit(rec.Make(2, "gpu0", TrafficClass::kOffload, 2 * kMiB));
  sched.Shutdown();
  EXPECT_NEAR(clock.NowSeconds(), 3 * chunk + chunk, 1e-12);  // 2 MiB at 2 GB/s
  EXPECT_EQ(sched.stats().bytes, 9 * kMiB);
}

// A PREFETCH read a reload now waits on is promoted to URGENT: it goes before the PREFETCH and
// OFFLOAD transfers queued ahead of it (the spill tier's stage-back).
TEST(LinkSchedulerTest, PromoteOwnerLetsAQueuedPrefetchOvertakeQueuedTransfers) {
  Recorder rec;
  LinkSchedulerOptions o = SmallChunks(1);
  o.offload_min_share = 0;
  LinkScheduler sched(o);
  Gate blocker_may_finish;
  std::atomic<bool> blocker_started{false};
  auto blocker = rec.Make(0, "gpu0", TrafficClass::kOffload, 64 * kKiB);
  auto copy = blocker->copy_chunk;
  blocker->copy_chunk = [&, copy](uint64_t offset, uint64_t len) {
    blocker_started = true;
    blocker_may_finish.Wait();
    return copy(offset, len);
  };
  sched.Submit(blocker);
  while (!blocker_started) std::this_thread::yield();
  sched.Submit(rec.Make(1, "gpu1", TrafficClass::kPrefetch, 2 * 64 * kKiB));
  sched.Submit(rec.Make(2, "gpu2", TrafficClass::kOffload, 2 * 64 * kKiB));
  sched.Submit(rec.Make(3, "gpu3", TrafficClass::kPrefetch, 2 * 64 * kKiB));
  auto promoted = rec.Make(4, "gpu1", TrafficClass::kPrefetch, 2 * 64 * kKiB);
  promoted->owner_id = 42;
  sched.Submit(promoted);
  EXPECT_EQ(sched.PromoteOwner(42, TrafficClass::kUrgent), 1u);
  EXPECT_EQ(sched.PromoteOwner(42, TrafficClass::kUrgent), 0u);  // already URGENT
  EXPECT_EQ(sched.PromoteOwner(0, TrafficClass::kUrgent), 0u);
  blocker_may_finish.Open();
  sched.Shutdown();
  std::lock_guard<std::mutex> lock(rec.mu);
  EXPECT_EQ(rec.copy_order, (std::vector<int>{0, 4, 4, 1, 3, 1, 3, 2, 2}));
  for (int i = 0; i <= 4; ++i) {
    ASSERT_EQ(rec.done[i].size(), 1u) << i;
    EXPECT_TRUE(rec.done[i][0].ok()) << i;
  }
  const LinkSchedulerStats st = sched.stats();
  EXPECT_EQ(st.class_bytes[static_cast<int>(TrafficClass::kUrgent)], 2 * 64 * kKiB);
  EXPECT_EQ(st.started_transfers[static_cast<int>(TrafficClass::kUrgent)], 1u);
}

}  // namespace
}  // namespace offloadd::sched

namespace offloadd::sched {
namespace {

// A closed session's queued transfers are dropped at once (no chunk of them is copied, done
// gets the cancel status); a chunk being copied finishes and its transfer's done follows it;
// other owners' transfers are untouched.
TEST(LinkSchedulerCancelTest, CancelOwnerDropsQueuedChunksAndWaitsForRunningOnes) {
  Recorder rec;
  LinkScheduler sched(SmallChunks(1));
  Gate first_chunk_may_finish;
  std::atomic<bool> first_chunk_started{false};
  auto blocker = rec.Make(0, "gpu0", TrafficClass::kOffload, 4 * 64 * kKiB);
  blocker->owner_id = 7;
  auto copy = blocker->copy_chunk;
  blocker->copy_chunk = [&, copy](uint64_t offset, uint64_t len) {
    first_chunk_started = true;
    first_chunk_may_finish.Wait();
    return copy(offset, len);
  };
  sched.Submit(blocker);
  while (!first_chunk_started) std::this_thread::yield();
  for (int i = 1; i <= 3; ++i) {
    auto t = rec.Make(i, "gpu0", TrafficClass::kOffload, 2 * 64 * kKiB);
    t->owner_id = i == 3 ? 8 : 7;  // transfer 3 belongs to another owner
    sched.Submit(t);
  }
  EXPECT_EQ(sched.CancelOwner(7, absl::CancelledError("session ended")), 3u);
  {
    std::lock_guard<std::mutex> lock(rec.mu);
    EXPECT_EQ(rec.done[1].size(), 1u);  // queued only: done at once
    EXPECT_EQ(rec.done[2].size(), 1u);
    EXPECT_EQ(rec.done[0].size(), 0u);  // its first chunk is still being copied
  }
  first_chunk_may_finish.Open();
  sched.Shutdown();
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.done[0].size(), 1u);
  EXPECT_EQ(rec.done[0][0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(rec.done[1][0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(rec.ranges[0].size(), 1u);  // only the chunk that was running
  EXPECT_EQ(rec.ranges.count(1), 0u);
  EXPECT_EQ(rec.ranges.count(2), 0u);
  EXPECT_EQ(rec.ranges[3].size(), 2u);  // the other owner's transfer is whole
  ASSERT_EQ(rec.done[3].size(), 1u);
  EXPECT_TRUE(rec.done[3][0].ok());
}

// Asynchronous copies with cancellation: CancelOwner drops an owner's chunks not yet posted
// (a transfer with none posted gets done at once), chunks already posted complete first and
// their transfer's done follows the last of them, exactly once; other owners keep going.
TEST(LinkSchedulerCancelTest, CancelOwnerDropsUnpostedAsyncChunksAndWaitsForPostedOnes) {
  Recorder rec;
  ManualAsyncEngine engine;
  LinkSchedulerOptions o = SmallChunks(1);
  o.max_chunks_in_flight_per_gpu = 2;
  LinkScheduler sched(o);
  auto posted = rec.Make(0, "gpu0", TrafficClass::kOffload, 4 * 64 * kKiB);
  posted->owner_id = 7;
  engine.Attach(*posted, 0);
  sched.Submit(posted);
  engine.WaitForPosts(2);  // gpu0 at its limit: chunks 3 and 4 stay queued
  auto other = rec.Make(1, "gpu1", TrafficClass::kOffload, 2 * 64 * kKiB);
  other->owner_id = 8;
  engine.Attach(*other, 1);
  sched.Submit(other);
  engine.WaitForPosts(4);
  auto queued = rec.Make(2, "gpu0", TrafficClass::kPrefetch, 2 * 64 * kKiB);
  queued->owner_id = 7;
  engine.Attach(*queued, 2);
  sched.Submit(queued);
  EXPECT_EQ(sched.CancelOwner(7, absl::CancelledError("session ended")), 2u);
  {
    std::lock_guard<std::mutex> lock(rec.mu);
    ASSERT_EQ(rec.done[2].size(), 1u);  // nothing of it posted: done at once
    EXPECT_EQ(rec.done[2][0].code(), absl::StatusCode::kCancelled);
    EXPECT_EQ(rec.done[0].size(), 0u);  // two of its chunks are posted
  }
  for (size_t i = 0; i < 4; ++i) engine.Complete(i);
  sched.Shutdown();
  EXPECT_EQ(engine.posts(), 4u);  // nothing posted after the cancel
  for (size_t i = 0; i < 4; ++i) EXPECT_NE(engine.post(i).transfer, 2);
  std::lock_guard<std::mutex> lock(rec.mu);
  ASSERT_EQ(rec.done[0].size(), 1u);
  EXPECT_EQ(rec.done[0][0].code(), absl::StatusCode::kCancelled);
  EXPECT_EQ(rec.done[2].size(), 1u);
  ASSERT_EQ(rec.done[1].size(), 1u);
  EXPECT_TRUE(rec.done[1][0].ok());
  EXPECT_EQ(sched.stats().gpu_bytes.at("gpu0"), 2 * 64 * kKiB);  // the two posted chunks
  EXPECT_EQ(sched.stats().gpu_bytes.at("gpu1"), 2 * 64 * kKiB);
  EXPECT_EQ(sched.stats().chunks_in_flight, 0u);
}

// The async path drops a finished transfer (and what its callbacks hold) outside the lock too,
// whether the engine completes a chunk inline in post_chunk or later on its own thread.
TEST(LinkSchedulerTest, FinishedAsyncTransfersAreDroppedWithoutTheSchedulerLock) {
  LinkScheduler sched(SmallChunks(1));
  ProbeTally probes(&sched);
  std::vector<std::thread> engine_threads;
  std::mutex threads_mu;
  auto inline_done = std::make_shared<Transfer>();
  inline_done->gpu = "gpu0";
  inline_done->bytes = 3 * 64 * kKiB;
  inline_done->post_chunk = [p = probes.Make()](uint64_t, uint64_t,
                                                std::function<void(absl::Status)> chunk_done) {
    chunk_done(absl::OkStatus());
  };
  inline_done->done = [p = probes.Make()](absl::Status) {};
  auto threaded = std::make_shared<Transfer>();
  threaded->gpu = "gpu1";
  threaded->bytes = 2 * 64 * kKiB;
  threaded->post_chunk = [&](uint64_t offset, uint64_t,
                             std::function<void(absl::Status)> chunk_done) {
    std::lock_guard<std::mutex> lock(threads_mu);
    engine_threads.emplace_back([offset, chunk_done = std::move(chunk_done)] {
      chunk_done(offset == 0 ? absl::OkStatus() : absl::DataLossError("client memory went away"));
    });
  };
  threaded->done = [p = probes.Make()](absl::Status) {};
  sched.Submit(std::move(inline_done));
  sched.Submit(std::move(threaded));
  EXPECT_EQ(probes.WaitForDestroyed(3), 0);
  sched.Shutdown();
  for (std::thread& t : engine_threads) t.join();
  EXPECT_EQ(sched.stats().bytes, (3 + 1) * 64 * kKiB);
}

}  // namespace
}  // namespace offloadd::sched
