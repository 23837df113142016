// Writes the seed corpus of session_fuzz: valid and deliberately wrong request sequences, one
// file each, in the harness's frame format (see session_fuzz.cc). A reload never writes client
// memory that a copy may be reading or writing at the same time (that would be a race the client
// made, which the TSan replay would rightly report). Usage:
//   bazel run //tests/fuzz:make_seeds -- $PWD/tests/fuzz/corpus
#include <cstdio>
#include <fstream>
#include <functional>
#include <string>
#include <vector>

#include "proto/offload.pb.h"

namespace {

using offloadd::v1::ClientMessage;
using offloadd::v1::Request;

struct Seed {
  std::vector<ClientMessage> frames;
  uint64_t next_id = 1;
  ClientMessage& Frame() {
    if (frames.empty()) frames.emplace_back();
    return frames.back();
  }
  void NewFrame() { frames.emplace_back(); }
  Request* Add() {
    Request* r = Frame().add_requests();
    r->set_request_id(next_id++);
    return r;
  }
  void Hello(uint32_t pid = 0) {
    auto* h = Add()->mutable_hello();
    h->set_client_name("seed");
    h->set_device_id("gpu0");
    h->set_pid(pid);
  }
  // Region ids are handed out from 1 in registration order.
  void Register(const std::string& which, uint64_t size) {
    auto* h = Add()->mutable_register_region()->mutable_handle();
    h->set_shm_name(which);
    h->set_size_bytes(size);
  }
  void Offload(uint64_t region, uint64_t offset, uint64_t bytes, uint64_t tag) {
    auto* o = Add()->mutable_offload();
    o->set_region_id(region);
    o->set_offset(offset);
    o->set_bytes(bytes);
    o->set_tag(tag);
  }
  void Reload(uint64_t tag, uint64_t region, uint64_t offset, int priority, bool release,
              double deadline = 0, uint64_t block = 0) {
    auto* r = Add()->mutable_reload();
    r->set_tag(tag);
    r->set_block_id(block);
    r->set_region_id(region);
    r->set_offset(offset);
    r->set_priority(static_cast<offloadd::v1::Priority>(priority));
    r->set_release_after(release);
    r->set_deadline_seconds(deadline);
  }
  void Release(uint64_t tag, uint64_t block = 0) {
    auto* r = Add()->mutable_release();
    r->set_tag(tag);
    r->set_block_id(block);
  }
  std::string Bytes() const {
    std::string out;
    for (const auto& f : frames) {
      std::string b = f.SerializeAsString();
      out.push_back(static_cast<char>(b.size() & 0xff));
      out.push_back(static_cast<char>(b.size() >> 8));
      out += b;
    }
    return out;
  }
};

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds DIR\n");
    return 2;
  }
  const uint64_t kBig = 1 << 20, kSmall = 64 << 10;
  std::vector<std::pair<std::string, std::function<void(Seed&)>>> seeds = {
      {"hello", [](Seed& s) { s.Hello(); }},
      {"offload_reload_release_after",
       [&](Seed& s) {
         s.Hello();
         s.Register("0", kBig);
         s.Offload(1, 0, 4096, 1);
         s.Reload(1, 1, 8192, 1, true);
       }},
      {"two_frames_tags",
       [&](Seed& s) {
         s.Hello();
         s.Register("1", kSmall);
         s.Offload(1, 0, kSmall / 4, 7);
         s.NewFrame();
         s.Reload(7, 1, kSmall / 4, 2, false, 0.5);
         s.Reload(7, 1, kSmall / 2, 1, false);
         s.Release(7);
       }},
      {"many_blocks_two_regions",
       [&](Seed& s) {
         s.Hello();
         s.Register("0", kBig);
         s.Register("1", kSmall);
         for (uint64_t t = 1; t <= 6; ++t) s.Offload(1 + t % 2, 0, 4096 * t, t);
         for (uint64_t t = 1; t <= 6; ++t) s.Reload(t, 1, kBig - 4096 * t, 1 + t % 2, t % 3 == 0);
         s.Add()->mutable_unregister_region()->set_region_id(2);
         for (uint64_t t = 1; t <= 6; ++t) s.Release(t);
       }},
      {"bad_inputs",
       [&](Seed& s) {
         s.Offload(1, 0, 10, 0);  // before hello
         s.Hello();
         s.Hello();  // twice
         s.Add();    // no body: unknown kind
         s.Register("0", kBig);
         s.Offload(1, 0, 0, 0);         // zero bytes
         s.Offload(1, kBig - 1, 2, 0);  // past the region
         s.Offload(1, ~0ull, 2, 0);     // offset overflow
         s.Offload(9, 0, 10, 0);        // unknown region
         s.Offload(1, 0, 3 << 20, 0);   // over the session quota
         s.Offload(1, 0, 100, 5);
         s.Offload(1, 0, 100, 5);                // tag in use
         s.Reload(5, 1, 0, 0, false);            // priority 0
         s.Reload(6, 1, 0, 1, false);            // unknown tag
         s.Reload(0, 1, 0, 1, false, 0, 12345);  // unknown block
         s.Reload(5, 1, kBig, 1, false);         // does not fit
         s.Release(0, 999);
         s.Release(5);
         s.Release(5);  // twice
         s.Add()->mutable_unregister_region()->set_region_id(1);
         s.Add()->mutable_unregister_region()->set_region_id(1);
       }},
      {"bad_regions",
       [&](Seed& s) {
         s.Hello();
         s.Register("/a/b", 10);
         s.Register("0", 0);
         s.Register("0", 4 << 20);  // larger than the object
         s.Register("/ofd-fuzz-does-not-exist", 10);
         auto* h = s.Add()->mutable_register_region()->mutable_handle();
         h->set_cuda_ipc_handle(std::string(64, 'x'));
         h->set_size_bytes(10);
       }},
      {"hello_wrong_pid",
       [](Seed& s) {
         s.Hello(1);
         s.Hello(0);
       }},
      {"pool_pressure",
       [&](Seed& s) {
         s.Hello();
         s.Register("0", kBig);
         // 2 MiB session quota: 2 of 6 wait for the first reloads to release their blocks.
         for (uint64_t t = 1; t <= 6; ++t) s.Offload(1, 0, kBig / 2, t);
         for (uint64_t t = 1; t <= 6; ++t) s.Reload(t, 1, kBig / 2, 1, true);
         s.NewFrame();
         for (uint64_t t = 10; t <= 50; ++t) s.Offload(1, 0, 4096, t);  // past the in-flight limit
       }},
  };
  for (auto& [name, fill] : seeds) {
    Seed s;
    fill(s);
    std::ofstream(std::string(argv[1]) + "/" + name, std::ios::binary) << s.Bytes();
  }
  std::printf("%zu seeds written to %s\n", seeds.size(), argv[1]);
  return 0;
}
