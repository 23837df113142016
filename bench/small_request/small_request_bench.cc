// small_request_bench: one small daemon request against a bare gRPC round trip,
// measured side by side in one process, interleaved, so machine load hits both alike.
//
// The process forks before touching gRPC: the child serves offloadd.bench.PingPong
// (pingpong.proto) on its own Unix socket with the callback API (a ServerBidiReactor echoing each
// message, as the daemon's session reactor answers requests). The parent then repeats, in blocks
// of 100 each:
//  - direct ping-pong: the calling thread writes a `payload_bytes` message and reads the echo
//    (gRPC's floor on this machine);
//  - threaded ping-pong: the same through a writer and a reader thread (a synchronous-API
//    client's shape; the offloadd client runs its stream on gRPC's callback API instead): two
//    thread hand-offs more per round trip;
//  - hand-off ping-pong: direct on the client, but the server starts each write from a worker
//    thread it wakes per message (the daemon's shape: a copy worker completes the request);
//  - with --socket (a running offloadd): a 4 KiB offload, then a 4 KiB URGENT reload with
//    release, each timed alone (each the client's only request: its caller writes it and reads
//    the answer, counted on the last line), with the daemon's own copy_seconds from the reply
//    (admission or ready -> the link scheduler's done callback: the copy, inline on the gRPC
//    thread for a small transfer on an idle link); the rest of the round trip is the client,
//    gRPC both ways and the session.
// Prints p50/p99 per kind and the ratio of one request's p50 to the direct ping-pong p50
// (the target: <= 1.5).
//
// Flags (--name=value): socket (offloadd's; empty = ping-pong only), cuda_sim 0 (1: the daemon
// runs --backend=cuda-sim; register a simulated allocation on its GPU 0), requests 2000 (per kind),
// warmup 200, payload_bytes 64, bare_server_cpu -1 (>= 0: pin the forked bare server to that CPU,
// so that it can sit where the daemon is pinned: which cores the client and the server share
// decides the round trip on a small machine, see BENCHMARKS.md), use_ring 1 (0: the client
// offers no request ring, so offloads and reloads travel on the Session stream).
#include <sched.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "bench/small_request/pingpong.grpc.pb.h"
#include "client/offloadd_client.h"
#include "client/shm_region.h"
#include "common/base/clock.h"
#include "grpcpp/grpcpp.h"
#include "server/copy/cuda/cuda_api_sim.h"

namespace offloadd::bench {
namespace {

using base::SteadyNowSeconds;

// Echoes each message; with `hand_off`, the write is started from a worker thread woken through
// a condition variable (as the daemon's link scheduler wakes a copy worker).
class EchoReactor : public grpc::ServerBidiReactor<Ping, Ping> {
 public:
  explicit EchoReactor(bool hand_off) {
    if (hand_off) worker_ = std::thread([this] { WorkerLoop(); });
    StartRead(&msg_);
  }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    if (!worker_.joinable()) return StartWrite(&msg_);
    {
      std::lock_guard<std::mutex> lock(mu_);
      pending_ = true;
    }
    cv_.notify_one();
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartRead(&msg_);
  }
  void OnDone() override {
    if (worker_.joinable()) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        stop_ = true;
      }
      cv_.notify_one();
      worker_.join();
    }
    delete this;
  }

 private:
  void WorkerLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || pending_; });
      if (stop_) return;
      pending_ = false;
      lock.unlock();
      StartWrite(&msg_);
      lock.lock();
    }
  }

  Ping msg_;
  std::thread worker_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool pending_ = false, stop_ = false;
};

class EchoService final : public PingPong::CallbackService {
  grpc::ServerBidiReactor<Ping, Ping>* Echo(grpc::CallbackServerContext*) override {
    return new EchoReactor(false);
  }
  grpc::ServerBidiReactor<Ping, Ping>* EchoHandOff(grpc::CallbackServerContext*) override {
    return new EchoReactor(true);
  }
};

[[noreturn]] void Serve(const std::string& path) {
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "small_request_bench: cannot serve on unix:%s\n", path.c_str());
    _exit(2);
  }
  server->Wait();
  _exit(0);
}

using Stream = grpc::ClientReaderWriter<Ping, Ping>;

// A synchronous-API client's shape: a writer thread and a reader thread around one stream.
class ThreadedClient {
 public:
  explicit ThreadedClient(Stream* stream) : stream_(stream) {
    writer_ = std::thread([this] { WriterLoop(); });
    reader_ = std::thread([this] { ReaderLoop(); });
  }
  ~ThreadedClient() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    writer_.join();
    stream_->WritesDone();
    reader_.join();
  }
  bool RoundTrip(const Ping& p) {
    std::future<bool> f;
    {
      std::lock_guard<std::mutex> lock(mu_);
      waiting_.emplace_back();
      f = waiting_.back().get_future();
      out_.push_back(p);
    }
    cv_.notify_all();
    return f.get();
  }

 private:
  void WriterLoop() {
    std::unique_lock<std::mutex> lock(mu_);
    for (;;) {
      cv_.wait(lock, [&] { return stop_ || !out_.empty(); });
      if (out_.empty()) return;
      Ping p = std::move(out_.front());
      out_.pop_front();
      lock.unlock();
      stream_->Write(p);
      lock.lock();
    }
  }
  void ReaderLoop() {
    Ping in;
    while (stream_->Read(&in)) {
      std::lock_guard<std::mutex> lock(mu_);
      if (waiting_.empty()) continue;
      waiting_.front().set_value(true);
      waiting_.pop_front();
    }
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : waiting_) w.set_value(false);
    waiting_.clear();
  }

  Stream* stream_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Ping> out_;
  std::deque<std::promise<bool>> waiting_;
  bool stop_ = false;
  std::thread writer_, reader_;
};

double Percentile(std::vector<double> v, double q) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  return v[std::min(v.size() - 1, static_cast<size_t>(q * v.size()))];
}

struct Samples {
  std::vector<double> direct, threaded, hand_off, offload, reload, offload_copy, reload_copy;
};

void Report(const char* what, const std::vector<double>& v, double bare_p50) {
  const double p50 = Percentile(v, 0.5) * 1e6;
  std::printf("%-58s p50 %7.1f us, p99 %7.1f us", what, p50, Percentile(v, 0.99) * 1e6);
  if (bare_p50 > 0) std::printf("  = %.2f x direct ping-pong", p50 / bare_p50);
  std::printf("\n");
}

int Run(const std::string& path, const std::string& daemon_socket, bool cuda_sim, bool use_ring,
        int requests, int warmup, size_t payload_bytes) {
  auto channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::fprintf(stderr, "small_request_bench: no ping-pong server on unix:%s\n", path.c_str());
    return 2;
  }
  std::unique_ptr<client::Client> daemon;
  std::optional<client::ShmRegion> shm;
  uint64_t region = 0;
  if (!daemon_socket.empty()) {
    client::ClientOptions o;
    o.socket_path = daemon_socket;
    o.client_name = "small_request_bench";
    o.use_ring = use_ring;
    o.device_id = cuda_sim ? copy::SimCudaApi::DeviceUuid(0) : "small_request_bench";
    auto c = client::Client::Connect(o);
    auto s = client::ShmRegion::Create(1 << 20);
    if (!c.ok() || !s.ok()) {
      std::fprintf(stderr, "small_request_bench: %s\n",
                   std::string((c.ok() ? s.status() : c.status()).message()).c_str());
      return 2;
    }
    daemon = *std::move(c);
    shm.emplace(*std::move(s));
    // A cuda-sim daemon: a simulated device allocation (no bytes move).
    auto r = cuda_sim ? daemon->RegisterRegion({copy::SimMemHandle(1 << 20, getpid()), "", 1 << 20})
                      : daemon->RegisterShmRegion(*shm);
    if (!r.ok()) {
      std::fprintf(stderr, "small_request_bench: %s\n", std::string(r.status().message()).c_str());
      return 2;
    }
    region = *r;
  }
  auto stub = PingPong::NewStub(channel);
  grpc::ClientContext direct_ctx, threaded_ctx, hand_off_ctx;
  std::unique_ptr<Stream> direct = stub->Echo(&direct_ctx);
  std::unique_ptr<Stream> hand_off = stub->EchoHandOff(&hand_off_ctx);
  std::unique_ptr<Stream> threaded_stream = stub->Echo(&threaded_ctx);
  Ping p, in;
  p.set_payload(std::string(payload_bytes, 'x'));
  Samples s;
  {
    ThreadedClient threaded(threaded_stream.get());
    for (int block = 0; block * 100 < warmup + requests; ++block) {
      const bool keep = block * 100 >= warmup;
      for (int i = 0; i < 100; ++i) {
        p.set_seq(block * 100 + i);
        const double t0 = SteadyNowSeconds();
        if (!direct->Write(p) || !direct->Read(&in)) return 2;
        if (keep) s.direct.push_back(SteadyNowSeconds() - t0);
      }
      for (int i = 0; i < 100; ++i) {
        const double t0 = SteadyNowSeconds();
        if (!threaded.RoundTrip(p)) return 2;
        if (keep) s.threaded.push_back(SteadyNowSeconds() - t0);
      }
      for (int i = 0; i < 100; ++i) {
        const double t0 = SteadyNowSeconds();
        if (!hand_off->Write(p) || !hand_off->Read(&in)) return 2;
        if (keep) s.hand_off.push_back(SteadyNowSeconds() - t0);
      }
      for (int i = 0; daemon != nullptr && i < 100; ++i) {
        const double t0 = SteadyNowSeconds();
        auto off = daemon->Offload(region, 0, 4096).get();
        const double t1 = SteadyNowSeconds();
        if (!off.ok()) return 2;
        auto rel = daemon->Reload(off->block_id, region, 0, client::Priority::kUrgent, true).get();
        const double t2 = SteadyNowSeconds();
        if (!rel.ok()) return 2;
        if (!keep) continue;
        s.offload.push_back(t1 - t0);
        s.reload.push_back(t2 - t1);
        s.offload_copy.push_back(off->copy_seconds);
        s.reload_copy.push_back(rel->copy_seconds);
      }
    }
  }
  direct->WritesDone();
  (void)direct->Finish();
  hand_off->WritesDone();
  (void)hand_off->Finish();
  (void)threaded_stream->Finish();
  client::ClientCounters counters;
  if (daemon != nullptr) {
    counters = daemon->counters();
    daemon->Close();
  }
  std::printf(
      "small requests, %zu of each kind interleaved in blocks of 100; ping-pong messages "
      "of %zu B over a Unix socket:\n",
      s.direct.size(), payload_bytes);
  const double bare = Percentile(s.direct, 0.5) * 1e6;
  Report("bare gRPC ping-pong, direct", s.direct, 0);
  Report("bare gRPC ping-pong, writer + reader thread", s.threaded, bare);
  Report("bare gRPC ping-pong, server writes from a woken thread", s.hand_off, bare);
  if (daemon == nullptr) return 0;
  Report("offloadd 4 KiB offload (one request)", s.offload, bare);
  Report("  of which daemon admission -> copied (copy_seconds)", s.offload_copy, 0);
  Report("offloadd 4 KiB URGENT reload + release (one request)", s.reload, bare);
  Report("  of which daemon ready -> copied (copy_seconds)", s.reload_copy, 0);
  // Whose thread started each write: the submitting caller's (no write was in flight) or the
  // previous write's OnWriteDone (gRPC's callback thread).
  std::printf("offloadd client: %llu of %llu messages written from the submitting caller\n",
              static_cast<unsigned long long>(counters.messages_sent_by_caller),
              static_cast<unsigned long long>(counters.messages_sent));
  return 0;
}

}  // namespace
}  // namespace offloadd::bench

int main(int argc, char** argv) {
  std::string path, daemon_socket;
  bool cuda_sim = false, use_ring = true;
  int requests = 2000, warmup = 200;
  uint64_t payload = 64;
  int bare_server_cpu = -1;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string name = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    bool ok = true;
    if (name == "--socket")
      daemon_socket = v;
    else if (name == "--cuda_sim")
      cuda_sim = v == "1" || v == "true";
    else if (name == "--use_ring")
      use_ring = v == "1" || v == "true";
    else if (name == "--requests")
      ok = absl::SimpleAtoi(v, &requests);
    else if (name == "--warmup")
      ok = absl::SimpleAtoi(v, &warmup);
    else if (name == "--payload_bytes")
      ok = absl::SimpleAtoi(v, &payload);
    else if (name == "--bare_server_cpu")
      ok = absl::SimpleAtoi(v, &bare_server_cpu) && bare_server_cpu < CPU_SETSIZE;
    else
      ok = false;
    if (!ok) {
      std::fprintf(stderr,
                   "small_request_bench: bad argument '%s' (flags: --socket=PATH "
                   "--requests=N --warmup=N --payload_bytes=N --bare_server_cpu=N --use_ring=0|1)\n",
                   a.c_str());
      return 2;
    }
  }
  path = "/tmp/ofd-pingpong-" + std::to_string(getpid()) + ".sock";
  unlink(path.c_str());
  const pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) {
    if (bare_server_cpu >= 0) {
      cpu_set_t cpus;
      CPU_ZERO(&cpus);
      CPU_SET(bare_server_cpu, &cpus);
      if (sched_setaffinity(0, sizeof(cpus), &cpus) != 0) {
        std::perror("small_request_bench: sched_setaffinity(--bare_server_cpu)");
        _exit(2);
      }
    }
    offloadd::bench::Serve(path);
  }
  struct stat st {};
  for (int i = 0; i < 200 && stat(path.c_str(), &st) != 0; ++i) usleep(20000);
  const int rc = offloadd::bench::Run(path, daemon_socket, cuda_sim, use_ring, requests, warmup,
                                       payload);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  unlink(path.c_str());
  return rc;
}
