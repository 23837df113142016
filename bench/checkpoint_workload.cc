// checkpoint_workload: one simulated training process ("a GPU") running an activation-checkpoint
// offload schedule against offloadd on the shm backend, with every byte checked.
//
// Schedule per step (docs/ARCHITECTURE.md, "The workload"): forward writes one checkpoint of
// layer_bytes (b x s x h x 2 bytes in bf16) per layer 1..L into "device memory" and offloads it;
// backward reloads L..1, prefetching layer k-1 (PREFETCH) while layer k "computes", and reloads
// urgently what was not prefetched. Device memory is a ring of `slots` checkpoint buffers, so a
// slot is reused only after its offload completed — the memory saving offload exists for.
// Checkpoint contents are pseudo-random per (seed, step, layer); each reload is compared word by
// word with the regenerated pattern.
//
// With --cuda_sim=1 the daemon runs --backend=cuda-sim: the "device memory" is a
// simulated allocation registered with SimMemHandle, no bytes move and none are written or
// checked (so the client's CPU does not limit the modelled rates), and the JSON says
// "simulated": true — its rates are those of the timing model.
//
// Prints one JSON object on stdout (for the demo driver and tests) and exits 0 when every reload
// was intact and no request failed, 1 otherwise, 2 for usage errors.
#include <sys/mman.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_replace.h"
#include "client/offloadd_client.h"
#include "common/base/clock.h"
#include "server/copy/cuda/cuda_api_sim.h"

namespace {

using offloadd::base::SteadyNowSeconds;
using offloadd::client::Client;
using offloadd::client::Priority;

uint64_t Mix(uint64_t x) {  // splitmix64 finaliser
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Fills / checks `bytes` (multiple of 8) with a xorshift stream seeded by (seed, step, layer).
void Fill(uint8_t* p, uint64_t bytes, uint64_t key) {
  uint64_t s = Mix(key) | 1;
  auto* w = reinterpret_cast<uint64_t*>(p);
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    w[i] = s;
  }
}
bool Check(const uint8_t* p, uint64_t bytes, uint64_t key) {
  uint64_t s = Mix(key) | 1;
  auto* w = reinterpret_cast<const uint64_t*>(p);
  for (uint64_t i = 0; i < bytes / 8; ++i) {
    s ^= s << 13;
    s ^= s >> 7;
    s ^= s << 17;
    if (w[i] != s) return false;
  }
  return true;
}

struct Args {
  std::string socket, name = "workload", device = "gpu0";
  uint64_t layers = 16, layer_bytes = 8ull << 20, steps = 3, seed = 1, slots = 2;
  double forward_seconds = 0.002;  // simulated compute per layer forward
  double hold_seconds = 0;         // after the first forward, hold the blocks this long
  double run_seconds = 0;          // > 0: stop after the step that ends past this (steps = max)
  bool prefetch = true;
  bool cuda_sim = false;  // daemon on --backend=cuda-sim: simulated memory, nothing checked
  bool ordering = true;  // send (step, layer) as the offload's ordering hint
};

bool ParseArgs(int argc, char** argv, Args* a) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    size_t eq = arg.find('=');
    if (arg.rfind("--", 0) != 0 || eq == std::string::npos) return false;
    std::string k = arg.substr(2, eq - 2), v = arg.substr(eq + 1);
    double d = 0;
    bool num = absl::SimpleAtod(v, &d);
    if (k == "socket") a->socket = v;
    else if (k == "name") a->name = v;
    else if (k == "device") a->device = v;
    else if (k == "layers" && num) a->layers = static_cast<uint64_t>(d);
    else if (k == "layer_bytes" && num) a->layer_bytes = static_cast<uint64_t>(d) / 8 * 8;
    else if (k == "steps" && num) a->steps = static_cast<uint64_t>(d);
    else if (k == "seed" && num) a->seed = static_cast<uint64_t>(d);
    else if (k == "slots" && num) a->slots = static_cast<uint64_t>(d);
    else if (k == "forward_seconds" && num) a->forward_seconds = d;
    else if (k == "hold_seconds" && num) a->hold_seconds = d;
    else if (k == "run_seconds" && num) a->run_seconds = d;
    else if (k == "prefetch") a->prefetch = v != "0" && v != "false";
    else if (k == "cuda_sim") a->cuda_sim = v != "0" && v != "false";
    else if (k == "ordering") a->ordering = v != "0" && v != "false";
    else return false;
  }
  return a->layers > 0 && a->layer_bytes > 0 && a->slots >= 2;
}

void Compute(double seconds) {
  if (seconds > 0) std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  if (!ParseArgs(argc, argv, &a)) {
    std::fprintf(stderr,
                 "usage: checkpoint_workload --socket=PATH [--name=N --device=GPU --layers=L "
                 "--layer_bytes=B --steps=S --seed=K --slots=2 --forward_seconds=0.002 "
                 "--prefetch=1 --hold_seconds=0 --run_seconds=0 --cuda_sim=0 --ordering=1]\n");
    return 2;
  }
  offloadd::client::ClientOptions o;
  o.socket_path = a.socket;
  o.client_name = a.name;
  o.device_id = a.device;
  auto client = Client::Connect(o);
  if (!client.ok()) {
    std::fprintf(stderr, "checkpoint_workload: %s\n", client.status().ToString().c_str());
    return 1;
  }
  // shm: the daemon maps this object. cuda-sim: the daemon only models a device allocation, and
  // nothing stands in for it here (nothing moves its bytes, so none are written or checked).
  absl::StatusOr<offloadd::client::ShmRegion> region = absl::UnknownError("unset");
  absl::StatusOr<uint64_t> region_id = absl::UnknownError("unset");
  if (a.cuda_sim) {
    const uint64_t size = a.slots * a.layer_bytes;
    region_id = (*client)->RegisterRegion(
        {offloadd::copy::SimMemHandle(size, static_cast<uint64_t>(getpid())), "", size});
  } else {
    region = offloadd::client::ShmRegion::Create(a.slots * a.layer_bytes);
    if (!region.ok()) {
      std::fprintf(stderr, "checkpoint_workload: %s\n", region.status().ToString().c_str());
      return 1;
    }
    region_id = (*client)->RegisterShmRegion(*region);
  }
  if (!region_id.ok()) {
    std::fprintf(stderr, "checkpoint_workload: %s\n", region_id.status().ToString().c_str());
    return 1;
  }
  // The daemon has mapped the object: drop its name now, so a SIGKILLed workload leaves
  // nothing behind in /dev/shm (both mappings stay valid until unmapped).
  if (!a.cuda_sim) shm_unlink(region->name().c_str());
  auto* dev = a.cuda_sim ? nullptr : static_cast<uint8_t*>(region->data());
  auto slot_offset = [&](uint64_t layer) { return (layer % a.slots) * a.layer_bytes; };
  auto key = [&](uint64_t step, uint64_t layer) { return (a.seed << 40) ^ (step << 20) ^ layer; };

  uint64_t errors = 0, corrupted = 0, bytes_moved = 0, reloads_prefetched = 0, reloads_urgent = 0;
  double reload_wait_seconds = 0, offload_wait_seconds = 0, copy_seconds_sum = 0;
  std::string first_error;
  auto note_error = [&](const absl::Status& st) {
    ++errors;
    if (first_error.empty()) first_error = st.ToString();
  };
  const double t0 = SteadyNowSeconds();
  uint64_t steps_done = 0;
  for (uint64_t step = 0; step < a.steps; ++step, ++steps_done) {
    if (a.run_seconds > 0 && step > 0 && SteadyNowSeconds() - t0 >= a.run_seconds) break;
    // Forward: layers 0..L-1.
    std::vector<std::future<absl::StatusOr<offloadd::client::OffloadResult>>> offloads(a.layers);
    std::vector<uint64_t> blocks(a.layers, 0);
    auto finish_offload = [&](uint64_t layer) {
      double w0 = SteadyNowSeconds();
      auto r = offloads[layer].get();
      offload_wait_seconds += SteadyNowSeconds() - w0;
      if (!r.ok()) return note_error(r.status());
      blocks[layer] = r->block_id;
      bytes_moved += r->bytes;
      copy_seconds_sum += r->copy_seconds;
    };
    for (uint64_t layer = 0; layer < a.layers; ++layer) {
      if (layer >= a.slots) finish_offload(layer - a.slots);  // its slot is reused now
      Compute(a.forward_seconds);
      if (!a.cuda_sim) Fill(dev + slot_offset(layer), a.layer_bytes, key(step, layer));
      offloadd::client::OrderingHint order{a.ordering, step, layer};
      offloads[layer] =
          (*client)->Offload(*region_id, slot_offset(layer), a.layer_bytes, "", 0, order);
    }
    for (uint64_t layer = a.layers > a.slots ? a.layers - a.slots : 0; layer < a.layers; ++layer) {
      finish_offload(layer);
    }
    if (step == 0 && a.hold_seconds > 0) {
      std::printf("{\"holding_blocks\": %lu}\n", static_cast<unsigned long>(a.layers));
      std::fflush(stdout);
      // Hold, but stop early when the daemon goes away (its stream ends).
      const double until = SteadyNowSeconds() + a.hold_seconds;
      while (SteadyNowSeconds() < until && (*client)->stream_status().ok()) Compute(0.01);
    }
    // Backward: layers L-1..0; layer k's reload was prefetched while layer k+1 computed.
    std::deque<std::pair<uint64_t, std::future<absl::StatusOr<offloadd::client::ReloadResult>>>>
        inflight;
    auto issue = [&](uint64_t layer, Priority p) {
      if (blocks[layer] == 0) return false;
      inflight.emplace_back(layer, (*client)->Reload(blocks[layer], *region_id,
                                                     slot_offset(layer), p, /*release=*/true));
      return true;
    };
    for (int64_t layer = static_cast<int64_t>(a.layers) - 1; layer >= 0; --layer) {
      if (inflight.empty() || inflight.front().first != static_cast<uint64_t>(layer)) {
        if (!issue(layer, Priority::kUrgent)) continue;
        ++reloads_urgent;
      } else {
        ++reloads_prefetched;
      }
      if (a.prefetch && layer > 0) issue(layer - 1, Priority::kPrefetch);
      double w0 = SteadyNowSeconds();
      auto r = inflight.front().second.get();
      inflight.pop_front();
      reload_wait_seconds += SteadyNowSeconds() - w0;
      if (!r.ok()) {
        note_error(r.status());
        continue;
      }
      bytes_moved += r->bytes;
      if (!a.cuda_sim && !Check(dev + slot_offset(layer), a.layer_bytes, key(step, layer))) {
        ++corrupted;
      }
      Compute(2 * a.forward_seconds);  // recompute + backward of this layer
    }
  }
  const double elapsed = SteadyNowSeconds() - t0;
  auto stats = (*client)->counters();
  (*client)->Close();
  std::printf(
      "{\"name\": \"%s\", \"device\": \"%s\", \"link\": \"%s\", \"layers\": %lu, "
      "\"layer_bytes\": %lu, \"steps\": %lu, \"bytes_moved\": %lu, \"elapsed_seconds\": %.6f, "
      "\"gb_per_second\": %.4f, \"reload_wait_seconds\": %.6f, \"offload_wait_seconds\": %.6f, "
      "\"mean_offload_copy_seconds\": %.6f, \"reloads_prefetched\": %lu, "
      "\"reloads_urgent\": %lu, \"errors\": %lu, \"corrupted\": %lu, \"messages_sent\": %lu, "
      "\"simulated\": %s, \"first_error\": \"%s\"}\n",
      a.name.c_str(), a.device.c_str(), (*client)->link().c_str(),
      static_cast<unsigned long>(a.layers), static_cast<unsigned long>(a.layer_bytes),
      static_cast<unsigned long>(steps_done), static_cast<unsigned long>(bytes_moved), elapsed,
      bytes_moved / elapsed / 1e9, reload_wait_seconds, offload_wait_seconds,
      steps_done * a.layers > 0 ? copy_seconds_sum / (steps_done * a.layers) : 0.0,
      static_cast<unsigned long>(reloads_prefetched), static_cast<unsigned long>(reloads_urgent),
      static_cast<unsigned long>(errors), static_cast<unsigned long>(corrupted),
      static_cast<unsigned long>(stats.messages_sent), a.cuda_sim ? "true" : "false",
      absl::StrReplaceAll(first_error, {{"\"", "'"}, {"\\", "/"}}).c_str());
  return errors == 0 && corrupted == 0 ? 0 : 1;
}
