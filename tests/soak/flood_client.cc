// flood_client: one client process sending requests to offloadd as fast as it can, on a raw
// Session stream (no client-library queueing or flow control), for tests/soak/flood.py.
//
//   flood_client --socket=S --seconds=T [--batch=N] [--read=1|0] [--device=D]
//
// After Hello and one shm region (1 MiB), it writes ClientMessages of `batch` requests each:
// tagged 4 KiB offloads, reloads of those tags with release_after, and a few requests that are
// wrong on purpose (unknown region). With --read=1 a reader thread counts the answers by code;
// with --read=0 it never reads them (the daemon must then stop reading this stream rather than
// queue answers without bound). After T seconds the stream is cancelled (a
// non-reading client: once it has been held back, at most 3 T). Prints
//   sent <requests written> ok <n> exhausted <n> other <n> write_blocked <0|1>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <thread>

#include "client/shm_region.h"
#include "grpcpp/grpcpp.h"
#include "proto/offload.grpc.pb.h"

namespace {

std::string Flag(int argc, char** argv, const std::string& name, const std::string& def) {
  const std::string prefix = "--" + name + "=";
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a.rfind(prefix, 0) == 0) return a.substr(prefix.size());
  }
  return def;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace offloadd;
  const std::string socket = Flag(argc, argv, "socket", "");
  const double seconds = std::atof(Flag(argc, argv, "seconds", "5").c_str());
  const int batch = std::atoi(Flag(argc, argv, "batch", "512").c_str());
  const bool read = Flag(argc, argv, "read", "1") == "1";
  const std::string device = Flag(argc, argv, "device", "flood");

  auto region = client::ShmRegion::Create(1 << 20);
  if (!region.ok()) {
    std::cerr << region.status() << "\n";
    return 1;
  }
  auto stub = v1::Offload::NewStub(
      grpc::CreateChannel("unix:" + socket, grpc::InsecureChannelCredentials()));
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  v1::ClientMessage m;
  v1::Request* r = m.add_requests();
  r->set_request_id(1);
  r->mutable_hello()->set_client_name("flood");
  r->mutable_hello()->set_device_id(device);
  r = m.add_requests();
  r->set_request_id(2);
  r->mutable_register_region()->mutable_handle()->set_shm_name(region->name());
  r->mutable_register_region()->mutable_handle()->set_size_bytes(region->size_bytes());
  v1::ServerMessage reply;
  if (!stream->Write(m)) return 1;
  int answered = 0;
  while (answered < 2 && stream->Read(&reply)) answered += reply.responses_size();
  if (answered < 2) {
    std::cerr << "no hello reply\n";
    return 1;
  }

  std::atomic<uint64_t> ok{0}, exhausted{0}, other{0};
  std::thread reader;
  if (read) {
    reader = std::thread([&] {
      v1::ServerMessage in;
      while (stream->Read(&in)) {
        for (const auto& resp : in.responses()) {
          if (!resp.has_error()) {
            ok++;
          } else if (resp.error().code() == grpc::StatusCode::RESOURCE_EXHAUSTED) {
            exhausted++;
          } else {
            other++;
          }
        }
      }
    });
  }
  std::atomic<bool> writing{true};
  std::atomic<uint64_t> sent{0};
  std::atomic<bool> write_blocked{false};
  // Cancels the stream at the end even if a Write() is blocked by flow control. A client that
  // does not read keeps writing past T (up to 3 T) until it has been held back once, so a loaded
  // machine that schedules it late still shows whether flow control engages.
  std::thread timer([&] {
    const auto start = std::chrono::steady_clock::now();
    const auto end = start + std::chrono::duration<double>(seconds);
    const auto latest = start + std::chrono::duration<double>(read ? seconds : 3 * seconds);
    uint64_t last = 0;
    for (auto t = start; t < end || (!write_blocked && t < latest);
         t = std::chrono::steady_clock::now()) {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      uint64_t now = sent.load();
      if (now == last) write_blocked = true;  // no progress for 0.5 s: the daemon holds us
      last = now;
    }
    writing = false;
    ctx.TryCancel();
  });
  uint64_t id = 3, tag = 1;
  while (writing) {
    v1::ClientMessage out;
    for (int i = 0; i < batch; ++i) {
      v1::Request* q = out.add_requests();
      q->set_request_id(id++);
      switch (i % 4) {
        case 0:
        case 1: {
          auto* o = q->mutable_offload();
          o->set_region_id(1);
          o->set_offset((tag % 256) * 4096);
          o->set_bytes(4096);
          o->set_tag(tag);
          break;
        }
        case 2: {
          auto* l = q->mutable_reload();
          l->set_tag(tag - 1);
          l->set_region_id(1);
          l->set_priority(v1::URGENT);
          l->set_release_after(true);
          break;
        }
        default: {
          auto* o = q->mutable_offload();  // unknown region: NOT_FOUND
          o->set_region_id(99);
          o->set_bytes(1);
          break;
        }
      }
      if (i % 4 != 2) ++tag;
    }
    if (!stream->Write(out)) break;
    sent += batch;
  }
  timer.join();
  if (reader.joinable()) reader.join();
  stream->Finish();
  std::printf("sent %llu ok %llu exhausted %llu other %llu write_blocked %d\n",
              static_cast<unsigned long long>(sent.load()),
              static_cast<unsigned long long>(ok.load()),
              static_cast<unsigned long long>(exhausted.load()),
              static_cast<unsigned long long>(other.load()), write_blocked.load() ? 1 : 0);
  return 0;
}
