// SimCudaApi on a ManualSimClock: host costs per call, event completion at the modelled copy end,
// checked pointers, and the real cuda engine running on it.
#include "server/copy/cuda/cuda_api_sim.h"

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

#include "gtest/gtest.h"
#include "server/copy/cuda/cuda_device_worker.h"
#include "server/copy/cuda/cuda_engine.h"

namespace offloadd::copy {
namespace {

constexpr double kEps = 1e-9;
constexpr uint64_t kMs = 1000000;  // bytes per ms at 1 GB/s

SimCudaOptions Opts() {
  SimCudaOptions o;
  o.model.gpus = 2;
  o.model.gpus_per_switch = 2;
  o.model.engine_bytes_per_second = 1e9;
  o.memcpy_host_seconds = 5e-6;
  o.event_record_host_seconds = 1e-6;
  o.event_query_host_seconds = 2e-6;
  return o;
}

TEST(SimCudaApiTest, DevicesSayTheyAreSimulated) {
  ManualSimClock clock;
  SimCudaApi api(Opts(), &clock);
  auto devs = api.ListDevices();
  ASSERT_TRUE(devs.ok());
  ASSERT_EQ(devs->size(), 2u);
  EXPECT_EQ((*devs)[1].uuid, "GPU-51300000-0000-0000-0000-000000000001");
  EXPECT_EQ(NormalizeGpuUuid((*devs)[1].uuid), (*devs)[1].uuid);
  EXPECT_NE((*devs)[0].name.find("SIMULATED: bytes move only for a simulated client GPU"),
            std::string::npos)
      << (*devs)[0].name;
}

TEST(SimCudaApiTest, EventCompletesWhenTheModelledCopyEndsAndCallsCostHostTime) {
  ManualSimClock clock(100);
  SimCudaApi api(Opts(), &clock);
  std::string h = api.AddAllocation(0, 10 * kMs);
  ASSERT_TRUE(api.SetDevice(0).ok());
  void* dev = *api.IpcOpenMemHandle(h);
  EXPECT_EQ(*api.AllocationSize(dev), 10 * kMs);
  void* stream = *api.CreateStream();
  void* event = *api.CreateEvent();
  std::vector<uint8_t> host(16);  // never written: the sim moves no bytes
  ASSERT_TRUE(api.MemcpyAsync(host.data(), dev, 3 * kMs, Direction::kDeviceToHost, stream).ok());
  EXPECT_NEAR(clock.NowSeconds(), 100.000005, kEps);  // the memcpy's host cost
  ASSERT_TRUE(api.EventRecord(event, stream).ok());
  EXPECT_NEAR(clock.NowSeconds(), 100.000006, kEps);
  EXPECT_FALSE(*api.EventQuery(event));  // at 100.000008
  clock.Advance(0.002994);               // to 100.003002; the copy ends at 100.003005
  EXPECT_FALSE(*api.EventQuery(event));  // at 100.003004 (the query's own 2 us first)
  EXPECT_TRUE(*api.EventQuery(event));   // at 100.003006
  // Queued after the memcpy's host cost: 100.000005 + 3 ms.
  EXPECT_NEAR(api.EventCompletionSeconds(event), 100.003005, kEps);
  SimCallCounts c = api.call_counts();
  EXPECT_EQ(c.memcpys, 1u);
  EXPECT_EQ(c.memcpy_bytes, 3 * kMs);
  EXPECT_EQ(c.event_records, 1u);
  EXPECT_EQ(c.event_queries, 3u);
  EXPECT_NEAR(c.host_seconds, 5e-6 + 1e-6 + 3 * 2e-6, kEps);
  EXPECT_EQ(api.engine_stats(0, Direction::kDeviceToHost).bytes_done, 3 * kMs);
  EXPECT_TRUE(host == std::vector<uint8_t>(16));
}

TEST(SimCudaApiTest, ACopyToHostMemoryOnAnotherNodePaysTheCrossNodeFactor) {
  ManualSimClock clock(0);
  SimCudaOptions o = Opts();
  o.memcpy_host_seconds = 0;
  o.model.gpus_per_numa_node = 1;  // GPU 0 on node 0, GPU 1 on node 1
  o.model.cross_node_rate_factor = 0.5;
  std::vector<uint8_t> node0(16), node1(16);
  o.host_numa_node = [&](const void* host) {
    return host == node0.data() ? 0 : host == node1.data() ? 1 : -1;
  };
  SimCudaApi api(o, &clock);
  std::string h = api.AddAllocation(0, 10 * kMs);
  ASSERT_TRUE(api.SetDevice(0).ok());
  void* dev = *api.IpcOpenMemHandle(h);
  void* local_stream = *api.CreateStream();
  void* cross_stream = *api.CreateStream();
  void* local = *api.CreateEvent();
  void* cross = *api.CreateEvent();
  ASSERT_TRUE(api.MemcpyAsync(node0.data(), dev, kMs, Direction::kDeviceToHost, local_stream).ok());
  ASSERT_TRUE(api.EventRecord(local, local_stream).ok());
  ASSERT_TRUE(api.MemcpyAsync(node1.data(), dev, kMs, Direction::kDeviceToHost, cross_stream).ok());
  ASSERT_TRUE(api.EventRecord(cross, cross_stream).ok());
  clock.Advance(1);
  ASSERT_TRUE(*api.EventQuery(local));
  ASSERT_TRUE(*api.EventQuery(cross));
  // One engine, in queue order: 1 ms local, then 2 ms at half rate.
  EXPECT_NEAR(api.EventCompletionSeconds(local), 0.001, kEps);
  EXPECT_NEAR(api.EventCompletionSeconds(cross), 0.003, kEps);
  EXPECT_EQ(api.engine_stats(0, Direction::kDeviceToHost).cross_node_copies, 1u);
}

TEST(SimCudaApiTest, AStreamKeepsItsOrderAndWaitsOnEvents) {
  ManualSimClock clock;
  SimCudaOptions o = Opts();
  o.memcpy_host_seconds = o.event_record_host_seconds = o.event_query_host_seconds = 0;
  SimCudaApi api(o, &clock);
  std::string h = api.AddAllocation(0, 10 * kMs);
  ASSERT_TRUE(api.SetDevice(0).ok());
  void* dev = *api.IpcOpenMemHandle(h);
  void* s1 = *api.CreateStream();
  void* s2 = *api.CreateStream();
  void* e1 = *api.CreateEvent();
  void* e2 = *api.CreateEvent();
  uint8_t host[1];
  // s1: D2H 2 ms. s2 waits for it, then H2D 1 ms: done at 3 ms although its engine was idle.
  ASSERT_TRUE(api.MemcpyAsync(host, dev, 2 * kMs, Direction::kDeviceToHost, s1).ok());
  ASSERT_TRUE(api.EventRecord(e1, s1).ok());
  ASSERT_TRUE(api.StreamWaitEvent(s2, e1).ok());
  ASSERT_TRUE(api.MemcpyAsync(dev, host, kMs, Direction::kHostToDevice, s2).ok());
  ASSERT_TRUE(api.EventRecord(e2, s2).ok());
  clock.Advance(1);
  EXPECT_TRUE(*api.EventQuery(e2));
  EXPECT_NEAR(api.EventCompletionSeconds(e1), 0.002, kEps);
  EXPECT_NEAR(api.EventCompletionSeconds(e2), 0.003, kEps);
  // An event recorded on an idle stream is complete at once.
  void* s3 = *api.CreateStream();
  void* e3 = *api.CreateEvent();
  ASSERT_TRUE(api.EventRecord(e3, s3).ok());
  EXPECT_TRUE(*api.EventQuery(e3));
}

TEST(SimCudaApiTest, CopiesOutsideAnAllocationOrOnAnotherDeviceFail) {
  ManualSimClock clock;
  SimCudaApi api(Opts(), &clock);
  std::string h = api.AddAllocation(0, kMs);
  ASSERT_TRUE(api.SetDevice(0).ok());
  void* dev = *api.IpcOpenMemHandle(h);
  void* s0 = *api.CreateStream();
  ASSERT_TRUE(api.SetDevice(1).ok());
  void* s1 = *api.CreateStream();
  uint8_t host[1];
  uint8_t* d = static_cast<uint8_t*>(dev);
  EXPECT_TRUE(api.MemcpyAsync(host, d + kMs - 10, 10, Direction::kDeviceToHost, s0).ok());
  absl::Status past = api.MemcpyAsync(host, d + kMs - 10, 11, Direction::kDeviceToHost, s0);
  EXPECT_EQ(past.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(past.message().find("outside every allocation"), std::string::npos);
  EXPECT_FALSE(api.MemcpyAsync(host, d, 1, Direction::kDeviceToHost, s1).ok());  // wrong GPU
  EXPECT_FALSE(api.MemcpyAsync(host, d - 1, 1, Direction::kDeviceToHost, s0).ok());
  EXPECT_FALSE(api.MemcpyAsync(nullptr, d, 1, Direction::kDeviceToHost, s0).ok());
  EXPECT_EQ(api.call_counts().memcpys, 1u);
  // Opening a handle again returns the same address and counts a reference, as the driver
  // does (the mapping goes with the last close); an unknown handle fails.
  ASSERT_TRUE(api.SetDevice(0).ok());
  auto again = api.IpcOpenMemHandle(h);
  ASSERT_TRUE(again.ok());
  EXPECT_EQ(*again, dev);
  EXPECT_TRUE(api.IpcCloseMemHandle(dev).ok());
  EXPECT_FALSE(api.IpcOpenMemHandle(std::string(64, 'x')).ok());
  // A client's SimMemHandle opens on the current device with the size it names.
  auto sim = api.IpcOpenMemHandle(SimMemHandle(12345, 7));
  ASSERT_TRUE(sim.ok()) << sim.status();
  EXPECT_EQ(*api.AllocationSize(*sim), 12345u);
  EXPECT_TRUE(api.IpcCloseMemHandle(dev).ok());
  EXPECT_FALSE(api.IpcCloseMemHandle(dev).ok());
}

// The real cuda engine on the simulator: each CopyChunk returns once its event completes in the
// model; the clock moves only by the calls' host costs (the worker's polls), so this is exact.
TEST(SimCudaApiTest, CudaCopyEngineRunsOnTheSimulator) {
  ManualSimClock clock;
  SimCudaOptions o = Opts();
  o.event_query_host_seconds = 20e-6;
  SimCudaApi api(o, &clock);
  {
    CudaCopyEngine engine(api.Borrow());
    std::string h = api.AddAllocation(1, 8 * kMs);
    RegionSpec spec;
    spec.cuda_ipc_handle = h;
    spec.size_bytes = 8 * kMs;
    spec.device_id = SimCudaApi::DeviceUuid(1);
    auto region = engine.OpenRegion(spec);
    ASSERT_TRUE(region.ok()) << region.status();
    std::vector<uint8_t> host(16);
    const double t0 = clock.NowSeconds();
    ASSERT_TRUE(
        engine.CopyChunk(Direction::kDeviceToHost, **region, kMs, host.data(), 2 * kMs).ok());
    // At least the copy's 2 ms and its memcpy cost passed; the worker polls every 20 us.
    EXPECT_GE(clock.NowSeconds() - t0, 0.002 + 5e-6);
    EXPECT_LT(clock.NowSeconds() - t0, 0.002 + 5e-6 + 1e-6 + 2 * 20e-6 + kEps);
    ASSERT_TRUE(engine.CopyChunk(Direction::kHostToDevice, **region, 0, host.data(), kMs).ok());
    absl::Status outside =
        engine.CopyChunk(Direction::kHostToDevice, **region, 7 * kMs, host.data(), 2 * kMs);
    EXPECT_EQ(outside.code(), absl::StatusCode::kOutOfRange);
    EXPECT_EQ(engine.stats().chunks_total, 2u);
  }
  EXPECT_EQ(api.engine_stats(1, Direction::kDeviceToHost).bytes_done, 2 * kMs);
  EXPECT_EQ(api.engine_stats(1, Direction::kHostToDevice).bytes_done, kMs);
  EXPECT_EQ(api.engine_stats(0, Direction::kDeviceToHost).bytes_done, 0u);
  EXPECT_EQ(api.call_counts().memcpys, 2u);
}

// Without a switch limit each GPU is its own shard (own model and lock): copies on two GPUs run
// side by side, a stream may wait on another GPU's event only once it is complete, and handles
// that name no stream or event fail as in CUDA. With a switch limit the GPUs behind one switch
// share a shard, so the limit and cross-GPU waits stay modelled.
TEST(SimCudaApiTest, GpusWithoutASwitchLimitAreSeparateShards) {
  ManualSimClock clock;
  SimCudaOptions o = Opts();
  o.memcpy_host_seconds = o.event_record_host_seconds = o.event_query_host_seconds = 0;
  SimCudaApi api(o, &clock);
  uint8_t host[1];
  std::vector<void*> dev(2), stream(2), event(2);
  for (int g = 0; g < 2; ++g) {
    std::string h = api.AddAllocation(g, 10 * kMs);
    ASSERT_TRUE(api.SetDevice(g).ok());
    dev[g] = *api.IpcOpenMemHandle(h);
    stream[g] = *api.CreateStream();
    event[g] = *api.CreateEvent();
  }
  ASSERT_TRUE(api.MemcpyAsync(host, dev[0], 2 * kMs, Direction::kDeviceToHost, stream[0]).ok());
  ASSERT_TRUE(api.EventRecord(event[0], stream[0]).ok());
  // GPU 0's copy is pending: GPU 1's stream cannot wait on it (another shard's model).
  absl::Status wait = api.StreamWaitEvent(stream[1], event[0]);
  EXPECT_EQ(wait.code(), absl::StatusCode::kFailedPrecondition) << wait;
  EXPECT_NE(wait.message().find("another shard"), std::string::npos) << wait;
  // Recording GPU 0's event on GPU 1's stream fails as CUDA does across devices.
  EXPECT_EQ(api.EventRecord(event[0], stream[1]).code(), absl::StatusCode::kFailedPrecondition);
  // A copy on GPU 1 is not held behind GPU 0's and ends on its own engine's time.
  ASSERT_TRUE(api.MemcpyAsync(host, dev[1], kMs, Direction::kDeviceToHost, stream[1]).ok());
  ASSERT_TRUE(api.EventRecord(event[1], stream[1]).ok());
  clock.Advance(1);
  EXPECT_TRUE(*api.EventQuery(event[0]));
  EXPECT_TRUE(*api.EventQuery(event[1]));
  EXPECT_NEAR(api.EventCompletionSeconds(event[0]), 0.002, kEps);
  EXPECT_NEAR(api.EventCompletionSeconds(event[1]), 0.001, kEps);
  // Complete now: waiting on it costs GPU 1 nothing.
  EXPECT_TRUE(api.StreamWaitEvent(stream[1], event[0]).ok());
  EXPECT_EQ(api.engine_stats(0, Direction::kDeviceToHost).bytes_done, 2 * kMs);
  EXPECT_EQ(api.engine_stats(1, Direction::kDeviceToHost).bytes_done, kMs);
  EXPECT_EQ(api.call_counts().memcpys, 2u);
  // Not handles of this api.
  int not_a_handle = 0;
  EXPECT_FALSE(api.EventQuery(&not_a_handle).ok());
  EXPECT_FALSE(api.MemcpyAsync(host, dev[0], 1, Direction::kDeviceToHost, nullptr).ok());
  api.DestroyEvent(event[1]);
  EXPECT_FALSE(api.EventQuery(event[1]).ok());

  // Behind one limited switch both GPUs share one shard: the wait holds GPU 1's copy.
  o.model.switch_bytes_per_second = 2e9;
  SimCudaApi coupled(o, &clock);
  std::vector<void*> cdev(2), cstream(2);
  for (int g = 0; g < 2; ++g) {
    std::string h = coupled.AddAllocation(g, 10 * kMs);
    ASSERT_TRUE(coupled.SetDevice(g).ok());
    cdev[g] = *coupled.IpcOpenMemHandle(h);
    cstream[g] = *coupled.CreateStream();
  }
  void* e0 = *coupled.CreateEvent();  // (created with GPU 1 current: same shard)
  void* e1 = *coupled.CreateEvent();
  ASSERT_TRUE(coupled.MemcpyAsync(host, cdev[0], 2 * kMs, Direction::kDeviceToHost, cstream[0]).ok());
  ASSERT_TRUE(coupled.EventRecord(e0, cstream[0]).ok());
  ASSERT_TRUE(coupled.StreamWaitEvent(cstream[1], e0).ok());
  ASSERT_TRUE(coupled.MemcpyAsync(cdev[1], host, kMs, Direction::kHostToDevice, cstream[1]).ok());
  ASSERT_TRUE(coupled.EventRecord(e1, cstream[1]).ok());
  clock.Advance(1);
  EXPECT_TRUE(*coupled.EventQuery(e1));
  EXPECT_NEAR(coupled.EventCompletionSeconds(e1) - coupled.EventCompletionSeconds(e0), 0.001,
              kEps);
}

// The asynchronous engine before it has learned a copy rate (copies under 256 KiB
// teach none) keeps querying what is still issued after a completion. The clock moves only by
// the worker's calls, so a worker that went to sleep instead would never see the second copy
// end (this hung before the fix: the re-prediction divided by the unknown rate).
TEST(SimCudaApiTest, AsyncEngineWithoutALearnedRateQueriesUntilEveryCopyCompletes) {
  ManualSimClock clock;
  SimCudaApi api(Opts(), &clock);
  CudaEngineOptions eo;
  eo.asynchronous = true;
  eo.assumed_bytes_per_second = 0;  // no rate at all until one is learned
  CudaCopyEngine engine(api.Borrow(), eo);
  std::string h = api.AddAllocation(0, kMs);
  RegionSpec spec;
  spec.cuda_ipc_handle = h;
  spec.size_bytes = kMs;
  spec.device_id = SimCudaApi::DeviceUuid(0);
  auto region = engine.OpenRegion(spec);
  ASSERT_TRUE(region.ok()) << region.status();
  std::vector<uint8_t> host(16);
  std::mutex mu;
  std::condition_variable cv;
  int done = 0;
  auto on_done = [&](absl::Status st) {
    EXPECT_TRUE(st.ok()) << st;
    std::lock_guard<std::mutex> lock(mu);
    ++done;
    cv.notify_all();
  };
  // 4 us and then 100 us of copy at 1 GB/s: the second is still running when the first ends.
  engine.PostChunk(Direction::kDeviceToHost, **region, 0, host.data(), 4096,
                   ChunkUrgency::kNormal, on_done);
  engine.PostChunk(Direction::kDeviceToHost, **region, 4096, host.data(), 100000,
                   ChunkUrgency::kNormal, on_done);
  std::unique_lock<std::mutex> lock(mu);
  // A bound on a hang, not a speed check: the copies take ~0.1 ms of simulated time.
  EXPECT_TRUE(cv.wait_for(lock, std::chrono::seconds(20), [&] { return done == 2; }));
  EXPECT_EQ(api.engine_stats(0, Direction::kDeviceToHost).bytes_done, 4096u + 100000u);
}

// A lane that learned its rate while the engine was shared (H2D at a quarter of its rate while
// D2H ran) relearns the full rate once D2H stops. It stayed at the shared rate before: each copy
// ended before its prediction, the next was issued late (the margin tops out at 1 ms, less than
// the misprediction of a 32 MiB copy), the engine idled between copies, and without back-to-back
// copies no window formed to correct it (0.40 of the engine's rate, every copy a dry run). On
// the real clock; the bounds below are on a hang, not a speed check.
TEST(SimCudaApiTest, ARateLearnedUnderContentionRecoversWhenItEnds) {
  SimCudaOptions o;
  o.model.gpus = 1;
  o.model.engine_bytes_per_second = 55e9;
  o.model.h2d_share_while_d2h_busy = 0.25;
  SimCudaApi api(o);
  const uint64_t chunk = 32ull << 20;
  std::string h = api.AddAllocation(0, chunk);
  DeviceWorkerOptions wo;
  wo.assumed_bytes_per_second = 0;  // a rate above 0 is a learned one
  DeviceWorker worker(&api, (*api.ListDevices())[0], wo);
  ASSERT_TRUE(worker.Start().ok());
  void* dev = nullptr;
  ASSERT_TRUE(worker.Run([&] {
    auto d = api.IpcOpenMemHandle(h);
    dev = d.ok() ? *d : nullptr;
    return d.status();
  }).ok());
  std::atomic<bool> d2h_on{true}, stop{false};
  std::atomic<int> errors{0};
  uint8_t host[1];
  std::function<void(Direction)> post = [&](Direction d) {
    worker.IssueAsync(
        d, chunk, /*urgent=*/false,
        [&, d](void* s) {
          return d == Direction::kDeviceToHost ? api.MemcpyAsync(host, dev, chunk, d, s)
                                               : api.MemcpyAsync(dev, host, chunk, d, s);
        },
        [&, d](absl::Status st) {
          if (!st.ok()) ++errors;
          if (!stop && (d == Direction::kHostToDevice || d2h_on)) post(d);
        });
  };
  for (int i = 0; i < 4; ++i) {
    post(Direction::kDeviceToHost);
    post(Direction::kHostToDevice);
  }
  auto h2d_rate = [&] { return worker.lane_stats(Direction::kHostToDevice).bytes_per_second; };
  auto wait_for = [&](const std::function<bool()>& cond) {
    for (int i = 0; i < 2000 && !cond(); ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return cond();
  };
  EXPECT_TRUE(wait_for([&] { return h2d_rate() > 0; }));
  // Learned while shared: a quarter of 55 GB/s; the bound leaves room for D2H gaps on a loaded
  // host, and stays below the 0.6 the recovery must reach.
  EXPECT_LT(h2d_rate(), 0.5 * 55e9);
  d2h_on = false;
  EXPECT_TRUE(wait_for([&] { return h2d_rate() > 0.6 * 55e9; })) << h2d_rate();
  stop = true;
  worker.Stop();
  EXPECT_EQ(errors.load(), 0);
}

// A lane that has seen only copies the host issues slower than the engine moves them (4 KiB:
// ~6 us of driver calls, 0.07 us of copy) runs dry on most completions whatever rate it plans
// with. Doubling its assumed rate on those drove it to the 4 TB/s ceiling, and the first large
// copies then went out 16 at once (max_issued_per_direction): an urgent 64 MiB reload waited
// 20 ms instead of ~2. Only a lane that held a copy back by its rate doubles it now.
TEST(SimCudaApiTest, HostBoundTinyCopiesDoNotInflateTheAssumedRate) {
  SimCudaOptions o;
  o.model.gpus = 1;
  o.model.engine_bytes_per_second = 55e9;
  SimCudaApi api(o);
  std::string h = api.AddAllocation(0, 1 << 20);
  DeviceWorkerOptions wo;
  wo.assumed_bytes_per_second = 25e9;
  DeviceWorker worker(&api, (*api.ListDevices())[0], wo);
  ASSERT_TRUE(worker.Start().ok());
  void* dev = nullptr;
  ASSERT_TRUE(worker.Run([&] {
    auto d = api.IpcOpenMemHandle(h);
    dev = d.ok() ? *d : nullptr;
    return d.status();
  }).ok());
  uint8_t host[1];
  const Direction d = Direction::kHostToDevice;
  std::atomic<int> pending{0}, errors{0};
  // Rounds of 4 tiny copies until the lane has run dry 20 times (bounded: a hang, not a speed).
  for (int round = 0; round < 200000 && worker.lane_stats(d).dry_runs < 20; ++round) {
    for (int i = 0; i < 4; ++i) {
      ++pending;
      worker.IssueAsync(
          d, 4096, /*urgent=*/false, [&](void* s) { return api.MemcpyAsync(dev, host, 4096, d, s); },
          [&](absl::Status st) {
            if (!st.ok()) ++errors;
            --pending;
          });
    }
    while (pending > 0) std::this_thread::yield();
  }
  DeviceWorker::LaneStats ls = worker.lane_stats(d);
  EXPECT_GE(ls.dry_runs, 20u);
  EXPECT_LT(ls.bytes_per_second, 2 * 55e9) << "dry runs " << ls.dry_runs;
  worker.Stop();
  EXPECT_EQ(errors.load(), 0);
}

// A sim of `gpus` GPUs at 1 GB/s, 2 per switch (limited at `switch_bytes_per_second` when > 0),
// with no host costs.
SimCudaOptions ShardOpts(int gpus, double switch_bytes_per_second = 0) {
  SimCudaOptions o;
  o.model.gpus = gpus;
  o.model.gpus_per_switch = 2;
  o.model.switch_bytes_per_second = switch_bytes_per_second;
  o.model.engine_bytes_per_second = 1e9;
  o.memcpy_host_seconds = o.event_record_host_seconds = o.event_query_host_seconds = 0;
  return o;
}

// Shard-encoded handles: another api's (more shards), null, garbage, a stream passed as an
// event, destroyed ones: every call fails or is a no-op, none crashes.
TEST(SimCudaApiTest, HandlesOfAnotherApiNullGarbageOrDestroyedFailWithoutCrashing) {
  ManualSimClock clock;
  SimCudaApi a(ShardOpts(4), &clock), b(ShardOpts(1), &clock);
  ASSERT_TRUE(a.SetDevice(3).ok());
  void* s3 = *a.CreateStream();
  void* e3 = *a.CreateEvent();
  uint8_t host[1];
  // a's GPU 3 handles in b (1 shard): not b's
  EXPECT_FALSE(b.EventQuery(e3).ok());
  EXPECT_FALSE(b.EventRecord(e3, s3).ok());
  EXPECT_FALSE(b.StreamWaitEvent(s3, e3).ok());
  EXPECT_FALSE(b.MemcpyAsync(host, host, 1, Direction::kDeviceToHost, s3).ok());
  b.DestroyStream(s3);
  b.DestroyEvent(e3);
  EXPECT_EQ(b.EventCompletionSeconds(e3), -1);
  for (uintptr_t v : {uintptr_t{0}, ~uintptr_t{0}, uintptr_t{1} << 40, (uintptr_t{5} << 40) | 7,
                      uintptr_t{0xdeadbeef}, reinterpret_cast<uintptr_t>(&clock)}) {
    void* h = reinterpret_cast<void*>(v);
    EXPECT_FALSE(a.EventQuery(h).ok()) << v;
    EXPECT_FALSE(a.EventRecord(h, s3).ok()) << v;
    EXPECT_FALSE(a.EventRecord(e3, h).ok()) << v;
    EXPECT_FALSE(a.StreamWaitEvent(h, e3).ok()) << v;
    EXPECT_FALSE(a.StreamWaitEvent(s3, h).ok()) << v;
    a.DestroyStream(h);
    a.DestroyEvent(h);
    EXPECT_EQ(a.EventCompletionSeconds(h), -1);
  }
  // stream used as event and vice versa
  EXPECT_FALSE(a.EventQuery(s3).ok());
  EXPECT_FALSE(a.EventRecord(s3, e3).ok());
  a.DestroyStream(s3);
  EXPECT_FALSE(a.EventRecord(e3, s3).ok());
  EXPECT_TRUE(*a.EventQuery(e3));  // never recorded: complete
  a.DestroyEvent(e3);
  a.DestroyEvent(e3);  // twice
  EXPECT_FALSE(a.EventQuery(e3).ok());
}

// 5 GPUs, 2 per limited switch: shards {0,1}, {2,3}, {4}; waits inside a shard work, across fail,
// and the last GPU alone runs at its engine's rate.
TEST(SimCudaApiTest, FiveGpusTwoPerSwitchMakeThreeShardsWithTheLimitInsideEach) {
  ManualSimClock clock;
  SimCudaApi api(ShardOpts(5, 1.5e9), &clock);  // shards {0,1},{2,3},{4}
  uint8_t host[1];
  std::vector<void*> s(5), e(5), d(5);
  for (int g = 0; g < 5; ++g) {
    std::string h = api.AddAllocation(g, 10 * kMs);
    ASSERT_TRUE(api.SetDevice(g).ok());
    d[g] = *api.IpcOpenMemHandle(h);
    s[g] = *api.CreateStream();
    e[g] = *api.CreateEvent();
    ASSERT_TRUE(api.MemcpyAsync(host, d[g], kMs, Direction::kDeviceToHost, s[g]).ok());
    ASSERT_TRUE(api.EventRecord(e[g], s[g]).ok());
  }
  EXPECT_TRUE(api.StreamWaitEvent(s[1], e[0]).ok());
  EXPECT_FALSE(api.StreamWaitEvent(s[2], e[1]).ok());
  EXPECT_FALSE(api.StreamWaitEvent(s[4], e[3]).ok());
  clock.Advance(1);
  // pairs share 1.5 GB/s: each 1 MB copy at 0.75 GB/s -> 1.333 ms; GPU 4 alone: 1 ms
  EXPECT_NEAR(api.EventCompletionSeconds(e[0]), 1e-3 / 0.75, 1e-9);
  EXPECT_NEAR(api.EventCompletionSeconds(e[2]), 1e-3 / 0.75, 1e-9);
  EXPECT_NEAR(api.EventCompletionSeconds(e[4]), 1e-3, 1e-9);
}

// 16 threads on 8 GPUs (with and without a switch limit) copy, record, query, wait on other
// GPUs' events, open and close IPC handles at once: no lost copy, no deadlock (and, under
// --config=tsan, no race).
TEST(SimCudaApiTest, ManyThreadsOnManyGpusAtOnce) {
  SimCudaOptions o = ShardOpts(8);
  o.model.engine_bytes_per_second = 1e12;
  for (double sw : {0.0, 4e12}) {
    o.model.switch_bytes_per_second = sw;
    o.memcpy_host_seconds = 1e-7;
    SimCudaApi api(o);
    std::vector<void*> streams(8), events(8);
    std::atomic<int> ready{0};
    std::vector<std::thread> ts;
    std::atomic<uint64_t> fails{0};
    for (int t = 0; t < 16; ++t) {
      ts.emplace_back([&, t] {
        const int g = t % 8;
        std::string h = api.AddAllocation(g, 1 << 30);
        EXPECT_TRUE(api.SetDevice(g).ok());
        void* s = *api.CreateStream();
        void* e = *api.CreateEvent();
        if (t < 8) {
          streams[g] = s;
          events[g] = e;
        }
        ++ready;
        while (ready < 16) std::this_thread::yield();
        uint8_t host[1];
        for (int i = 0; i < 3000; ++i) {
          if (i % 100 == 0) {
            auto dev = api.IpcOpenMemHandle(h);
            if (!dev.ok()) { ++fails; continue; }
            for (int k = 0; k < 50; ++k) {
              if (!api.MemcpyAsync(host, *dev, 4096, Direction::kDeviceToHost, s).ok()) ++fails;
              if (!api.EventRecord(e, s).ok()) ++fails;
              (void)api.EventQuery(e);
              (void)api.StreamWaitEvent(s, events[(g + k) % 8]);
              (void)api.EventQuery(events[(g + 3) % 8]);
              (void)api.EventCompletionSeconds(e);
            }
            (void)api.engine_stats((g + 1) % 8, Direction::kHostToDevice);
            (void)api.call_counts();
            void* ie = *api.IpcOpenEventHandle(std::string(64, 'a' + t));
            (void)api.StreamWaitEvent(s, ie);
            api.DestroyEvent(ie);
            EXPECT_TRUE(api.IpcCloseMemHandle(*dev).ok());
          }
        }
      });
    }
    for (auto& t : ts) t.join();
    EXPECT_EQ(fails.load(), 0u);
    EXPECT_EQ(api.call_counts().memcpys, 16u * 30 * 50);
  }
}

}  // namespace
}  // namespace offloadd::copy
