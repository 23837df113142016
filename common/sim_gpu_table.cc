#include "common/sim_gpu_table.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <random>

#include "absl/strings/str_format.h"

namespace offloadd::common {
namespace {

constexpr uint64_t kHeaderBytes = 4096;
constexpr uint64_t kEventSlotBytes = sizeof(SimEventSlot);
constexpr uint64_t kSegmentSlotBytes = sizeof(SimSegmentSlot);

uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }

std::string Handle(const char magic[8], uint32_t pid, uint32_t slot, uint64_t generation,
                   uint64_t instance) {
  std::string h(64, '\0');
  std::memcpy(h.data(), magic, 8);
  std::memcpy(h.data() + 8, &pid, 4);
  std::memcpy(h.data() + 12, &slot, 4);
  std::memcpy(h.data() + 16, &generation, 8);
  std::memcpy(h.data() + 24, &instance, 8);
  return h;
}

bool Parse(absl::string_view h, const char magic[8], uint32_t* pid, uint32_t* slot,
           uint64_t* generation, uint64_t* instance) {
  if (h.size() != 64 || std::memcmp(h.data(), magic, 8) != 0) return false;
  std::memcpy(pid, h.data() + 8, 4);
  std::memcpy(slot, h.data() + 12, 4);
  std::memcpy(generation, h.data() + 16, 8);
  std::memcpy(instance, h.data() + 24, 8);
  return true;
}

}  // namespace

bool ParseSimMemHandle(absl::string_view handle, SimMemRef* out) {
  return Parse(handle, kSimMemMagic, &out->pid, &out->slot, &out->generation, &out->instance);
}

bool ParseSimEventHandle(absl::string_view handle, SimEventRef* out) {
  uint64_t unused;
  return Parse(handle, kSimEventMagic, &out->pid, &out->slot, &unused, &out->instance);
}

std::string MakeSimMemHandle(const SimMemRef& ref) {
  return Handle(kSimMemMagic, ref.pid, ref.slot, ref.generation, ref.instance);
}

std::string MakeSimEventHandle(const SimEventRef& ref) {
  return Handle(kSimEventMagic, ref.pid, ref.slot, 0, ref.instance);
}

std::string SimTableName(uint32_t pid) { return absl::StrFormat("/ofd-simgpu-%d", pid); }

int64_t SimNowNanoseconds() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

bool SimGpuTable::ReadLayout() {
  const SimTableHeader& h = *header_;
  if (std::memcmp(h.magic, kSimTableMagic, 8) != 0 || h.version != kSimTableVersion) return false;
  Layout l;  // each field read once; everything below uses these copies
  l.devices = h.devices;
  l.event_slots = h.event_slots;
  l.segment_slots = h.segment_slots;
  l.device_bytes = h.device_bytes;
  l.events_offset = h.events_offset;
  l.segments_offset = h.segments_offset;
  l.memory_offset = h.memory_offset;
  l.instance = h.instance;
  // Every bound in 128 bits: no client value can wrap a sum past the object's size.
  using u128 = unsigned __int128;
  const u128 events_end = u128{l.events_offset} + u128{l.event_slots} * kEventSlotBytes;
  const u128 segments_end =
      u128{l.segments_offset} + u128{l.segment_slots} * kSegmentSlotBytes;
  const u128 memory_end = u128{l.memory_offset} + u128{l.devices} * u128{l.device_bytes};
  if (l.events_offset < kHeaderBytes || l.events_offset % 8 != 0 ||
      l.segments_offset % 8 != 0 || events_end > l.segments_offset ||
      segments_end > l.memory_offset || memory_end > size_) {
    return false;
  }
  layout_ = l;
  return true;
}

absl::StatusOr<std::shared_ptr<SimGpuTable>> SimGpuTable::Adopt(std::string name, uint8_t* base,
                                                               uint64_t size_bytes,
                                                               uint32_t owner_uid,
                                                               std::function<void()> before_unmap) {
  std::shared_ptr<SimGpuTable> t(new SimGpuTable());
  t->name_ = std::move(name);
  t->base_ = base;
  t->size_ = size_bytes;
  t->header_ = reinterpret_cast<SimTableHeader*>(base);
  t->owner_uid_ = owner_uid;
  t->before_unmap_ = std::move(before_unmap);
  if (size_bytes < kHeaderBytes || !t->ReadLayout()) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s is not a simulated GPU table of version %d (or is damaged)", t->name_,
        kSimTableVersion));
  }
  return t;
}

absl::StatusOr<std::shared_ptr<SimGpuTable>> SimGpuTable::Create(uint32_t pid, uint32_t devices,
                                                                uint64_t device_bytes,
                                                                uint32_t event_slots,
                                                                uint32_t segment_slots) {
  const std::string name = SimTableName(pid);
  const uint64_t events_offset = kHeaderBytes;
  const uint64_t segments_offset = AlignUp(events_offset + event_slots * kEventSlotBytes, 4096);
  const uint64_t memory_offset =
      AlignUp(segments_offset + segment_slots * kSegmentSlotBytes, 2ull << 20);
  const uint64_t size = memory_offset + uint64_t{devices} * device_bytes;
  int fd = shm_open(name.c_str(), O_RDWR | O_CREAT | O_EXCL, 0600);
  if (fd < 0) {
    return absl::AlreadyExistsError(absl::StrFormat("shm_open %s: %s", name, strerror(errno)));
  }
  if (ftruncate(fd, static_cast<off_t>(size)) != 0) {
    const int e = errno;
    close(fd);
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrFormat("ftruncate %s: %s", name, strerror(e)));
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  close(fd);
  if (p == MAP_FAILED) {
    shm_unlink(name.c_str());
    return absl::ResourceExhaustedError(absl::StrFormat("mmap %s: %s", name, strerror(errno)));
  }
  auto* h = static_cast<SimTableHeader*>(p);
  std::memcpy(h->magic, kSimTableMagic, 8);
  h->version = kSimTableVersion;
  h->devices = devices;
  h->event_slots = event_slots;
  h->segment_slots = segment_slots;
  h->device_bytes = device_bytes;
  h->events_offset = events_offset;
  h->segments_offset = segments_offset;
  h->memory_offset = memory_offset;
  uint64_t instance = 0;  // random: a handle's instance is known only to who read the table
  std::random_device rd;
  while (instance == 0) instance = (uint64_t{rd()} << 32) | rd();
  h->instance = instance;
  std::shared_ptr<SimGpuTable> t(new SimGpuTable());
  t->name_ = name;
  t->base_ = static_cast<uint8_t*>(p);
  t->size_ = size;
  t->header_ = h;
  t->owner_ = true;
  t->owner_uid_ = geteuid();
  if (!t->ReadLayout()) abort();  // (what Create writes always fits)
  for (uint32_t i = 0; i < event_slots; ++i) t->event(i)->complete_at_ns = kSimNever;
  return t;
}

SimGpuTable::~SimGpuTable() {
  if (before_unmap_) before_unmap_();
  if (base_ != nullptr) munmap(base_, size_);
  if (owner_) shm_unlink(name_.c_str());
}

SimEventSlot* SimGpuTable::event(uint32_t slot) const {
  if (slot >= layout_.event_slots) return nullptr;
  return reinterpret_cast<SimEventSlot*>(base_ + layout_.events_offset +
                                         uint64_t{slot} * kEventSlotBytes);
}

SimSegmentSlot* SimGpuTable::segment(uint32_t slot) const {
  if (slot >= layout_.segment_slots) return nullptr;
  return reinterpret_cast<SimSegmentSlot*>(base_ + layout_.segments_offset +
                                           uint64_t{slot} * kSegmentSlotBytes);
}

bool SimGpuTable::Geometry(const SimSegmentSlot& s, SimSegmentGeometry* out) const {
  SimSegmentGeometry g;  // each field read once
  g.device = s.device;
  g.offset = s.offset;
  g.size_bytes = s.size;
  if (g.device >= layout_.devices || g.offset > layout_.device_bytes ||
      g.size_bytes > layout_.device_bytes - g.offset) {
    return false;
  }
  g.memory = base_ + layout_.memory_offset + uint64_t{g.device} * layout_.device_bytes + g.offset;
  *out = g;
  return true;
}

uint8_t* SimGpuTable::SegmentMemory(const SimSegmentSlot& s) const {
  SimSegmentGeometry g;
  return Geometry(s, &g) ? g.memory : nullptr;
}

void SimGpuTable::CountViolation(SimViolation v) const {
  header_->violations[static_cast<int>(v)].fetch_add(1);
}

uint64_t SimGpuTable::violations(SimViolation v) const {
  return header_->violations[static_cast<int>(v)].load();
}

}  // namespace offloadd::common
