// grpc_pingpong (issue 16 part 4): a bare gRPC bidirectional-stream ping-pong over a Unix socket,
// the reference for the daemon's small-request latency. `make bench` runs it next to
// `offloadctl bench` (whose 4 KiB offload + reload round trip is two requests) so the ratio is
// measured in one run on one machine.
//
// The process forks before touching gRPC: the child serves offloadd.bench.PingPong with the
// callback API (a ServerBidiReactor echoing each message, as the daemon's session reactor
// answers requests); the parent opens one stream and times `requests` sequential round trips of a
// `payload_bytes` message, two ways:
//  - direct: the calling thread writes and then reads the stream itself (gRPC's floor);
//  - threaded: like the offloadd client library (client/offloadd_client.cc), the caller hands the
//    request to a writer thread and waits on a future that a reader thread fulfils: two thread
//    hand-offs more per round trip, so the difference is what they cost on this machine.
// The two are interleaved in blocks of 100 so machine load hits both alike.
//
// Flags (--name=value): socket (default: a fresh path under /tmp), requests 4000, warmup 200,
// payload_bytes 64. Prints one line per way: "<way>: p50 <us> us, p99 <us> us".
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
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "bench/pingpong/pingpong.grpc.pb.h"
#include "grpcpp/grpcpp.h"

namespace offloadd::bench {
namespace {

class EchoReactor : public grpc::ServerBidiReactor<Ping, Ping> {
 public:
  EchoReactor() { StartRead(&msg_); }
  void OnReadDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartWrite(&msg_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) return Finish(grpc::Status::OK);
    StartRead(&msg_);
  }
  void OnDone() override { delete this; }

 private:
  Ping msg_;
};

class EchoService final : public PingPong::CallbackService {
  grpc::ServerBidiReactor<Ping, Ping>* Echo(grpc::CallbackServerContext*) override {
    return new EchoReactor();
  }
};

[[noreturn]] void Serve(const std::string& path) {
  EchoService service;
  grpc::ServerBuilder builder;
  builder.AddListeningPort("unix:" + path, grpc::InsecureServerCredentials());
  builder.RegisterService(&service);
  std::unique_ptr<grpc::Server> server = builder.BuildAndStart();
  if (server == nullptr) {
    std::fprintf(stderr, "grpc_pingpong: cannot serve on unix:%s\n", path.c_str());
    _exit(2);
  }
  server->Wait();
  _exit(0);
}

double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

using Stream = grpc::ClientReaderWriter<Ping, Ping>;

// The offloadd client's shape: a writer thread and a reader thread around one stream.
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

int Run(const std::string& path, int requests, int warmup, size_t payload_bytes) {
  auto channel = grpc::CreateChannel("unix:" + path, grpc::InsecureChannelCredentials());
  if (!channel->WaitForConnected(std::chrono::system_clock::now() + std::chrono::seconds(10))) {
    std::fprintf(stderr, "grpc_pingpong: no server on unix:%s\n", path.c_str());
    return 2;
  }
  auto stub = PingPong::NewStub(channel);
  grpc::ClientContext direct_ctx, threaded_ctx;
  std::unique_ptr<Stream> direct = stub->Echo(&direct_ctx);
  std::unique_ptr<Stream> threaded_stream = stub->Echo(&threaded_ctx);
  Ping p, in;
  p.set_payload(std::string(payload_bytes, 'x'));
  std::vector<double> d_lat, t_lat;
  {
    ThreadedClient threaded(threaded_stream.get());
    for (int block = 0; block * 100 < warmup + requests; ++block) {
      for (int i = 0; i < 100; ++i) {
        p.set_seq(block * 100 + i);
        const double t0 = Now();
        if (!direct->Write(p) || !direct->Read(&in)) return 2;
        if (block * 100 >= warmup) d_lat.push_back(Now() - t0);
      }
      for (int i = 0; i < 100; ++i) {
        const double t0 = Now();
        if (!threaded.RoundTrip(p)) return 2;
        if (block * 100 >= warmup) t_lat.push_back(Now() - t0);
      }
    }
  }
  direct->WritesDone();
  (void)direct->Finish();
  (void)threaded_stream->Finish();
  std::printf("bare gRPC bidi ping-pong over a Unix socket, %zu B messages, %zu round trips each:\n",
              payload_bytes, d_lat.size());
  std::printf("direct: p50 %.1f us, p99 %.1f us\n", Percentile(d_lat, 0.5) * 1e6,
              Percentile(d_lat, 0.99) * 1e6);
  std::printf("threaded (writer + reader thread, like the offloadd client): p50 %.1f us, p99 %.1f us\n",
              Percentile(t_lat, 0.5) * 1e6, Percentile(t_lat, 0.99) * 1e6);
  return 0;
}

}  // namespace
}  // namespace offloadd::bench

int main(int argc, char** argv) {
  std::string path;
  int requests = 4000, warmup = 200;
  uint64_t payload = 64;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    std::string name = a.substr(0, eq), v = eq == std::string::npos ? "" : a.substr(eq + 1);
    bool ok = true;
    if (name == "--socket") path = v;
    else if (name == "--requests") ok = absl::SimpleAtoi(v, &requests);
    else if (name == "--warmup") ok = absl::SimpleAtoi(v, &warmup);
    else if (name == "--payload_bytes") ok = absl::SimpleAtoi(v, &payload);
    else ok = false;
    if (!ok) {
      std::fprintf(stderr, "grpc_pingpong: bad argument '%s' (flags: --socket=PATH "
                           "--requests=N --warmup=N --payload_bytes=N)\n", a.c_str());
      return 2;
    }
  }
  if (path.empty()) path = "/tmp/ofd-pingpong-" + std::to_string(getpid()) + ".sock";
  unlink(path.c_str());
  const pid_t child = fork();
  if (child < 0) return 2;
  if (child == 0) offloadd::bench::Serve(path);
  struct stat st {};
  for (int i = 0; i < 200 && stat(path.c_str(), &st) != 0; ++i) usleep(20000);
  const int rc = offloadd::bench::Run(path, requests, warmup, payload);
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  unlink(path.c_str());
  return rc;
}
