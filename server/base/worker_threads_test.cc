#include "server/base/worker_threads.h"

#include <atomic>
#include <chrono>
#include <future>
#include <set>
#include <thread>
#include <vector>

#include "common/base/mutex.h"
#include "gtest/gtest.h"

namespace offloadd::base {
namespace {

TEST(WorkerThreads, OneThreadRunsTasksInTheOrderPosted) {
  WorkerThreads workers(1);
  Mutex mu;
  std::vector<int> order;
  for (int i = 0; i < 50; ++i) {
    workers.Post([&mu, &order, i] {
      MutexLock lock(mu);
      order.push_back(i);
    });
  }
  workers.Shutdown();
  ASSERT_EQ(order.size(), 50u);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(order[i], i);
}

TEST(WorkerThreads, TasksRunOnTheWorkersConcurrently) {
  WorkerThreads workers(3);
  // Three tasks that each wait for all three to have started: done only if three threads run
  // them at once.
  std::atomic<int> started{0};
  std::promise<void> all_started;
  std::shared_future<void> go = all_started.get_future().share();
  std::vector<std::future<std::thread::id>> ran_on;
  for (int i = 0; i < 3; ++i) {
    auto p = std::make_shared<std::promise<std::thread::id>>();
    ran_on.push_back(p->get_future());
    workers.Post([&, p] {
      if (++started == 3) all_started.set_value();
      go.wait();
      p->set_value(std::this_thread::get_id());
    });
  }
  std::set<std::thread::id> ids;
  for (auto& f : ran_on) ids.insert(f.get());
  EXPECT_EQ(ids.size(), 3u);
  EXPECT_EQ(ids.count(std::this_thread::get_id()), 0u);
}

TEST(WorkerThreads, ShutdownRunsEveryQueuedTaskAndLaterPostsRunInline) {
  WorkerThreads workers(2);
  std::atomic<int> ran{0};
  for (int i = 0; i < 100; ++i) workers.Post([&] { ++ran; });
  workers.Shutdown();
  EXPECT_EQ(ran.load(), 100);
  std::thread::id ran_on;
  workers.Post([&] { ran_on = std::this_thread::get_id(); });
  EXPECT_EQ(ran_on, std::this_thread::get_id());
  workers.Shutdown();  // idempotent
}

TEST(WorkerThreads, ShutdownsFromSeveralThreadsAllReturnAfterEveryTaskRan) {
  for (int round = 0; round < 20; ++round) {
    WorkerThreads workers(2);
    std::atomic<int> ran{0};
    for (int i = 0; i < 8; ++i) {
      workers.Post([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(2));
        ++ran;
      });
    }
    std::vector<std::thread> stoppers;
    std::atomic<int> returned{0};
    for (int i = 0; i < 3; ++i) {
      stoppers.emplace_back([&] {
        workers.Shutdown();
        EXPECT_EQ(ran.load(), 8);  // none returns before the queue is drained
        ++returned;
      });
    }
    for (std::thread& t : stoppers) t.join();  // hung before: two joins of one thread
    EXPECT_EQ(returned.load(), 3);
  }
}

TEST(WorkerThreads, TheDestructorRunsQueuedTasks) {
  std::atomic<int> ran{0};
  {
    WorkerThreads workers(1);
    std::promise<void> release;
    std::shared_future<void> released = release.get_future().share();
    workers.Post([released] { released.wait(); });  // holds the only thread
    for (int i = 0; i < 10; ++i) workers.Post([&] { ++ran; });
    EXPECT_EQ(ran.load(), 0);
    release.set_value();
  }
  EXPECT_EQ(ran.load(), 10);
}

}  // namespace
}  // namespace offloadd::base
