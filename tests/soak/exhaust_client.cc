// exhaust_client: one attacker of the resource-exhaustion test (tests/soak/exhaust.py, issue
// 13). Each mode pushes one bound of the daemon as hard as it can for --seconds, then prints
// "key value" counters and exits 0 (1 when the daemon answered something it must not).
//   connections  open raw connections (no HTTP/2) up to --count and hold them; counts kept /
//                refused (a kept one gets the server's HTTP/2 SETTINGS)
//   mappings     sessions that register one shm object (4 KiB, and a sparse 256 MiB one) over
//                and over: past the session's region cap or a mapping bound the daemon must
//                answer RESOURCE_EXHAUSTED, nothing else
//   badmsg       sessions that send a message with invalid UTF-8: each must end INVALID_ARGUMENT
//   hugebatch    sessions sending 20000 requests in one message and never reading
//   refresh      Projector Submits of a [100000, 100000] gradient: each must be OUT_OF_RANGE
// --uid U: setgid/setuid to U first (needs root; prints setuid_failed 1 and exits 0 otherwise).
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "client/shm_region.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/grpcpp.h"
#include "proto/offload.grpc.pb.h"
#include "proto/projector.grpc.pb.h"

namespace {

using namespace offloadd;
using Clock = std::chrono::steady_clock;

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  }
  return def;
}

std::map<std::string, uint64_t> counters;
bool bad = false;

void Connections(const std::string& socket, int count, Clock::time_point end) {
  std::vector<int> held;
  for (int i = 0; i < count && Clock::now() < end; ++i) {
    int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::strncpy(addr.sun_path, socket.c_str(), sizeof(addr.sun_path) - 1);
    if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      counters["connect_failed"]++;
      close(fd);
      continue;
    }
    timeval tv{2, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
    char buf[64];
    if (read(fd, buf, sizeof(buf)) > 0) {
      counters["kept"]++;
      held.push_back(fd);
    } else {
      counters["refused"]++;
      close(fd);
    }
  }
  std::this_thread::sleep_until(end);
  for (int fd : held) close(fd);
}

// One session: Hello, then `n` registrations of `region`; counts the answers by kind.
void RegisterMany(v1::Offload::Stub* stub, const client::ShmRegion& region, int n) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(20));
  auto stream = stub->Session(&ctx);
  v1::ClientMessage m;
  m.add_requests()->mutable_hello()->set_device_id("exhaust");
  for (int i = 0; i < n; ++i) {
    v1::Request* r = m.add_requests();
    r->set_request_id(i + 1);
    r->mutable_register_region()->mutable_handle()->set_shm_name(region.name());
    r->mutable_register_region()->mutable_handle()->set_size_bytes(region.size_bytes());
  }
  if (!stream->Write(m)) return;
  int answered = 0;
  v1::ServerMessage reply;
  while (answered < n + 1 && stream->Read(&reply)) {
    for (const auto& r : reply.responses()) {
      ++answered;
      if (r.has_region_registered()) {
        counters["registered"]++;
      } else if (r.has_error() && r.error().code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
        counters["exhausted"]++;
      } else if (!r.has_hello()) {
        counters["unexpected"]++;
        bad = true;
      }
    }
  }
  stream->WritesDone();
  stream->Finish();
}

void Mappings(v1::Offload::Stub* stub, Clock::time_point end) {
  auto small = client::ShmRegion::Create(4096);
  auto big = client::ShmRegion::Create(256ull << 20);  // sparse: never written
  if (!small.ok() || !big.ok()) {
    bad = true;
    return;
  }
  while (Clock::now() < end) {
    RegisterMany(stub, *small, 4200);  // past the 4096 regions of a session
    RegisterMany(stub, *big, 4200);
    counters["sessions"] += 2;
  }
}

grpc::Status OneSession(v1::Offload::Stub* stub, const v1::ClientMessage& m, bool read) {
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(read ? 20 : 2));
  auto stream = stub->Session(&ctx);
  stream->Write(m);
  v1::ServerMessage reply;
  if (read) {
    while (stream->Read(&reply)) {
    }
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(1));
    ctx.TryCancel();
  }
  return stream->Finish();
}

void BadMessages(v1::Offload::Stub* stub, Clock::time_point end) {
  v1::ClientMessage m;
  m.add_requests()->mutable_hello()->set_device_id(std::string("gpu\xff\xfe", 5));
  while (Clock::now() < end) {
    grpc::Status st = OneSession(stub, m, true);
    counters[st.error_code() == grpc::StatusCode::INVALID_ARGUMENT ? "invalid_argument"
                                                                   : "unexpected"]++;
    bad = bad || st.error_code() != grpc::StatusCode::INVALID_ARGUMENT;
  }
}

void HugeBatches(v1::Offload::Stub* stub, Clock::time_point end) {
  v1::ClientMessage m;
  m.add_requests()->mutable_hello()->set_device_id("exhaust");
  for (int i = 0; i < 20000; ++i) m.add_requests()->set_request_id(i + 1);
  while (Clock::now() < end) {
    OneSession(stub, m, false);
    counters["batches"]++;
  }
}

void Refreshes(const std::string& socket, Clock::time_point end) {
  auto stub = v1::Projector::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  auto g = client::ShmRegion::Create(4096);
  if (!g.ok()) return;
  v1::RefreshRequest r;
  r.mutable_key()->set_parameter_id("huge");
  r.mutable_gradient_region()->set_shm_name(g->name());
  r.mutable_gradient_region()->set_size_bytes(40ull << 30);
  r.add_shape(100000);
  r.add_shape(100000);
  r.set_dtype(v1::DTYPE_FLOAT32);
  r.set_rank(128);
  r.set_side(v1::SIDE_STD);
  r.set_method(v1::METHOD_EXACT);
  for (int64_t step = 0; Clock::now() < end; ++step) {
    r.mutable_key()->set_step(step);
    grpc::ClientContext ctx;
    v1::SubmitReply reply;
    grpc::Status st = stub->Submit(&ctx, r, &reply);
    counters[st.error_code() == grpc::StatusCode::OUT_OF_RANGE ? "out_of_range" : "unexpected"]++;
    bad = bad || st.error_code() != grpc::StatusCode::OUT_OF_RANGE;
  }
}

}  // namespace

int main(int argc, char** argv) {
  // The badmsg mode serializes invalid UTF-8 on purpose: keep protobuf's per-message complaint
  // out of the output.
  google::protobuf::SetLogHandler(
      [](google::protobuf::LogLevel, const char*, int, const std::string&) {});
  const std::string mode = Flag(argc, argv, "mode", "");
  const std::string socket = Flag(argc, argv, "socket", "");
  const auto end =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                         std::atof(Flag(argc, argv, "seconds", "5").c_str())));
  const std::string uid = Flag(argc, argv, "uid", "");
  if (!uid.empty()) {
    const int u = std::atoi(uid.c_str());
    if (setgid(u) != 0 || setuid(u) != 0) {
      std::cout << "setuid_failed 1" << std::endl;
      return 0;
    }
  }
  auto stub = v1::Offload::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  if (mode == "connections") {
    Connections(socket, std::atoi(Flag(argc, argv, "count", "1000").c_str()), end);
  } else if (mode == "mappings") {
    Mappings(stub.get(), end);
  } else if (mode == "badmsg") {
    BadMessages(stub.get(), end);
  } else if (mode == "hugebatch") {
    HugeBatches(stub.get(), end);
  } else if (mode == "refresh") {
    Refreshes(socket, end);
  } else {
    std::cerr << "unknown --mode " << mode << "\n";
    return 2;
  }
  for (const auto& [k, v] : counters) std::cout << k << " " << v << "\n";
  return bad ? 1 : 0;
}
