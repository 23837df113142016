// ring_request_bench: the request ring's round trip against its floor and against gRPC, measured
// side by side in one process, interleaved in blocks of 100, so machine load hits all alike.
//
// Kinds (each prints p50 / p99 in microseconds over `requests` round trips):
//  - futex ping-pong: a forked child and this process bounce a counter through shared memory,
//    each sleeping on a doorbell (common/futex.h) until the other rings: two futex wakes and two
//    sleeps per round trip, nothing else — the floor of a ring round trip whose daemon sleeps.
//  - ring offload (core): one 4 KiB offload through the native core (client/core/ring_core.h)
//    on a ring the daemon at --socket attached: submit, the daemon's ring thread takes it, the
//    session copies 4 KiB into the pool, the answer comes back on the completion ring, the
//    caller wakes from its futex wait. The block is released (untimed) before the next.
//  - client offload (ring): the same through offloadd::Client with its ring (a Reply completed
//    by the client's ring thread).
//  - client offload (stream): the same through offloadd::Client with use_ring false: the gRPC
//    Session stream, as before the ring.
// Ratios: each offload's p50 against the futex ping-pong's and the stream's.
// Flags (--name=value): socket (offloadd's; required), requests 2000, warmup 200, pingpong_cpu
// -1 (>= 0: pin the ping-pong's forked child to that CPU, e.g. the daemon's, so the floor
// crosses the same cores as the ring's round trip; a child left unpinned inherits this
// process's affinity).
#include <sched.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "client/core/ring_core.h"
#include "client/offloadd_client.h"
#include "client/shm_region.h"
#include "common/futex.h"
#include "grpcpp/grpcpp.h"
#include "proto/offload.grpc.pb.h"

namespace offloadd::bench {
namespace {

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

struct Flags {
  std::string socket;
  int requests = 2000;
  int warmup = 200;
  int pingpong_cpu = -1;
};

Flags ParseFlags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](const char* name) -> const char* {
      const std::string prefix = std::string("--") + name + "=";
      return a.rfind(prefix, 0) == 0 ? argv[i] + prefix.size() : nullptr;
    };
    if (const char* v = value("socket")) f.socket = v;
    if (const char* v = value("requests")) f.requests = std::atoi(v);
    if (const char* v = value("warmup")) f.warmup = std::atoi(v);
    if (const char* v = value("pingpong_cpu")) f.pingpong_cpu = std::atoi(v);
  }
  return f;
}

// Two doorbells and two counters in memory shared with a forked child.
struct PingPongShared {
  common::Doorbell to_child, to_parent;
  std::atomic<uint32_t> ping{0}, pong{0};
  std::atomic<uint32_t> stop{0};
};

void Await(common::Doorbell& bell, std::atomic<uint32_t>& word, uint32_t want,
           const std::atomic<uint32_t>* stop) {
  while (word.load() != want && (stop == nullptr || stop->load() == 0)) {
    const uint32_t seen = bell.Arm();
    if (word.load() != want && (stop == nullptr || stop->load() == 0)) bell.Sleep(seen, 1.0);
    bell.Disarm();
  }
}

class FutexPingPong {
 public:
  explicit FutexPingPong(int child_cpu) {
    void* p = mmap(nullptr, sizeof(PingPongShared), PROT_READ | PROT_WRITE,
                   MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    shared_ = new (p) PingPongShared();
    child_ = fork();
    if (child_ == 0) {
      if (child_cpu >= 0) {
        cpu_set_t set;
        CPU_ZERO(&set);
        CPU_SET(child_cpu, &set);
        sched_setaffinity(0, sizeof(set), &set);
      }
      for (uint32_t n = 1;; ++n) {
        Await(shared_->to_child, shared_->ping, n, &shared_->stop);
        if (shared_->stop.load() != 0) _exit(0);
        shared_->pong.store(n);
        shared_->to_parent.Ring();
      }
    }
  }
  ~FutexPingPong() {
    shared_->stop.store(1);
    shared_->to_child.RingAlways();
    waitpid(child_, nullptr, 0);
  }
  void RoundTrip() {
    ++n_;
    shared_->ping.store(n_);
    shared_->to_child.Ring();
    Await(shared_->to_parent, shared_->pong, n_, nullptr);
  }

 private:
  PingPongShared* shared_;
  pid_t child_;
  uint32_t n_ = 0;
};

// A session whose per-tensor requests go through the native core: Hello and the region on a
// raw gRPC stream.
class CoreSession {
 public:
  CoreSession(const std::string& socket, const client::ShmRegion& region) {
    std::string error;
    core_ = client::RingCore::Create(64, 64, &error);
    channel_ = grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials());
    stub_ = v1::Offload::NewStub(channel_);
    stream_ = stub_->Session(&ctx_);
    v1::ClientMessage m;
    v1::Request* hello = m.add_requests();
    hello->set_request_id(1);
    hello->mutable_hello()->set_device_id("ring-bench");
    hello->mutable_hello()->set_pid(getpid());
    hello->mutable_hello()->set_transient_device(true);
    hello->mutable_hello()->mutable_ring()->set_fd(core_->fd());
    v1::Request* reg = m.add_requests();
    reg->set_request_id(2);
    reg->mutable_register_region()->mutable_handle()->set_shm_name(region.name());
    reg->mutable_register_region()->mutable_handle()->set_size_bytes(region.size_bytes());
    stream_->Write(m);
    v1::ServerMessage reply;
    while (region_ == 0 && stream_->Read(&reply)) {
      for (const v1::Response& r : reply.responses()) {
        if (r.has_hello() && !r.hello().ring_attached()) {
          std::fprintf(stderr, "ring refused: %s\n", r.hello().ring_error().c_str());
          std::exit(1);
        }
        if (r.has_region_registered()) region_ = r.region_registered().region_id();
        if (r.has_error()) {
          std::fprintf(stderr, "session: %s\n", r.error().message().c_str());
          std::exit(1);
        }
      }
    }
  }
  ~CoreSession() {
    stream_->WritesDone();
    stream_->Finish();
  }
  // One timed 4 KiB offload; its block released untimed.
  double Offload() {
    common::CompletionEntry c;
    const double t0 = Now();
    const uint64_t id = core_->Offload(region_, 0, 4096, 0, nullptr, false, 0, 0);
    core_->Wait(id, -1, &c);
    const double seconds = Now() - t0;
    if (c.kind != static_cast<uint32_t>(common::CompletionKind::kOffloadDone)) {
      std::fprintf(stderr, "offload failed: %.*s\n", int(c.message_bytes), c.message);
      std::exit(1);
    }
    core_->Wait(core_->Release(c.block_id, 0), -1, &c);
    return seconds;
  }

 private:
  std::unique_ptr<client::RingCore> core_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<v1::Offload::Stub> stub_;
  grpc::ClientContext ctx_;
  std::unique_ptr<grpc::ClientReaderWriter<v1::ClientMessage, v1::ServerMessage>> stream_;
  uint64_t region_ = 0;
};

std::unique_ptr<client::Client> ConnectClient(const std::string& socket, bool use_ring) {
  client::ClientOptions o;
  o.socket_path = socket;
  o.client_name = use_ring ? "ring-bench ring" : "ring-bench stream";
  o.device_id = "ring-bench";
  o.transient_device = true;
  o.use_ring = use_ring;
  auto c = client::Client::Connect(o);
  if (!c.ok()) {
    std::fprintf(stderr, "connect: %s\n", c.status().ToString().c_str());
    std::exit(1);
  }
  if ((*c)->ring_attached() != use_ring) {
    std::fprintf(stderr, "ring %s: %s\n", use_ring ? "refused" : "attached",
                 (*c)->ring_error().c_str());
    std::exit(1);
  }
  return *std::move(c);
}

double ClientOffload(client::Client& c, uint64_t region) {
  const double t0 = Now();
  auto done = c.Offload(region, 0, 4096).get();
  const double seconds = Now() - t0;
  if (!done.ok()) {
    std::fprintf(stderr, "offload: %s\n", done.status().ToString().c_str());
    std::exit(1);
  }
  (void)c.Release(done->block_id).get();
  return seconds;
}

struct Kind {
  const char* name;
  std::function<double()> run;
  std::vector<double> samples;
};

double Percentile(std::vector<double> v, double q) {
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

int Main(int argc, char** argv) {
  const Flags flags = ParseFlags(argc, argv);
  if (flags.socket.empty()) {
    std::fprintf(stderr, "usage: ring_request_bench --socket=PATH [--requests=N] [--warmup=N]\n");
    return 2;
  }
  FutexPingPong pingpong(flags.pingpong_cpu);  // forks before any gRPC thread exists
  auto region = client::ShmRegion::Create(1 << 20);
  if (!region.ok()) return 1;
  CoreSession core(flags.socket, *region);
  std::unique_ptr<client::Client> ring_client = ConnectClient(flags.socket, true);
  std::unique_ptr<client::Client> stream_client = ConnectClient(flags.socket, false);
  const uint64_t ring_region = *ring_client->RegisterShmRegion(*region);
  const uint64_t stream_region = *stream_client->RegisterShmRegion(*region);
  std::vector<Kind> kinds = {
      {"futex ping-pong", [&] {
         const double t0 = Now();
         pingpong.RoundTrip();
         return Now() - t0;
       }},
      {"ring offload (core)", [&] { return core.Offload(); }},
      {"client offload (ring)", [&] { return ClientOffload(*ring_client, ring_region); }},
      {"client offload (stream)", [&] { return ClientOffload(*stream_client, stream_region); }},
  };
  for (Kind& k : kinds) {
    for (int i = 0; i < flags.warmup; ++i) k.run();
  }
  for (int done = 0; done < flags.requests; done += 100) {
    for (Kind& k : kinds) {
      for (int i = 0; i < 100; ++i) k.samples.push_back(k.run());
    }
  }
  std::printf("ring_request_bench: %d round trips per kind, interleaved in blocks of 100\n",
              flags.requests);
  for (const Kind& k : kinds) {
    std::printf("  %-26s p50 %7.1f us  p99 %7.1f us\n", k.name, Percentile(k.samples, 0.5) * 1e6,
                Percentile(k.samples, 0.99) * 1e6);
  }
  const double futex = Percentile(kinds[0].samples, 0.5);
  const double stream = Percentile(kinds[3].samples, 0.5);
  for (size_t i = 1; i < 3; ++i) {
    const double p50 = Percentile(kinds[i].samples, 0.5);
    std::printf("  %-26s %.2fx the futex ping-pong, %.2fx the stream's offload\n", kinds[i].name,
                p50 / futex, p50 / stream);
  }
  return 0;
}

}  // namespace
}  // namespace offloadd::bench

int main(int argc, char** argv) { return offloadd::bench::Main(argc, argv); }
