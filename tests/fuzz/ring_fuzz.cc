// Fuzzing of the request ring's descriptor parsing: everything the daemon reads from memory a
// client can write. The input is, in order: a ring header (64 bytes) and the object size the
// daemon would see (8 bytes), checked by ParseRingHeader; a submission tail (4 bytes) for a
// consumer over 8 slots; then 256-byte submission entries, copied into those slots, taken by
// the consumer (its index checks), validated (ValidateSubmission) and, when accepted,
// translated (rpc::FromRing) and answered (rpc::ToRing). Missing bytes read as zero. Built with
// libFuzzer by `make fuzz`; tests/fuzz:ring_fuzz_replay_test replays the corpus.
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "common/ring_format.h"
#include "common/spsc_ring.h"
#include "server/rpc/ring_translate.h"

namespace {

using offloadd::common::RingResult;
using offloadd::common::SubmissionEntry;

// Copies `n` bytes from the input at *offset (zeros past its end).
void Take(const uint8_t* data, size_t size, size_t* offset, void* out, size_t n) {
  std::memset(out, 0, n);
  if (*offset < size) std::memcpy(out, data + *offset, std::min(n, size - *offset));
  *offset += n;
}

void CheckHeader(const uint8_t* data, size_t size, size_t* offset) {
  offloadd::common::RingHeader header;
  uint64_t object_bytes = 0;
  Take(data, size, offset, &header, sizeof(header));
  Take(data, size, offset, &object_bytes, sizeof(object_bytes));
  offloadd::common::RingLayout layout;
  std::string error;
  if (offloadd::common::ParseRingHeader(header, object_bytes, &layout, &error)) {
    // An accepted header describes exactly the object, slots inside it.
    if (layout.total_bytes != object_bytes || layout.completion_offset > object_bytes) abort();
  } else if (error.empty()) {
    abort();  // every refusal says why
  }
}

void CheckEntry(const SubmissionEntry& entry) {
  std::string error;
  if (!offloadd::common::ValidateSubmission(entry, &error)) {
    if (error.empty()) abort();
    return;
  }
  const offloadd::session::Request r = offloadd::rpc::FromRing(entry);
  if (r.kind == offloadd::session::RequestKind::kUnknown) abort();
  if (r.ready_event.size() > offloadd::common::kRingEventBytes ||
      r.done_event.size() > offloadd::common::kRingEventBytes) {
    abort();
  }
  if (!std::isfinite(r.timeout_seconds) || r.timeout_seconds < 0) abort();
  offloadd::session::Completion c;
  c.request_id = r.request_id;
  c.kind = offloadd::session::CompletionKind::kError;
  c.status = absl::InvalidArgumentError(std::string(error.size() + 300, 'm'));
  const offloadd::common::CompletionEntry out = offloadd::rpc::ToRing(c);
  if (out.message_bytes > offloadd::common::kCompletionMessageBytes) abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  size_t offset = 0;
  CheckHeader(data, size, &offset);
  uint32_t tail = 0;
  Take(data, size, &offset, &tail, sizeof(tail));
  constexpr uint32_t kSlots = 8;
  SubmissionEntry slots[kSlots];
  for (SubmissionEntry& slot : slots) Take(data, size, &offset, &slot, sizeof(slot));
  offloadd::common::RingIndex tail_word, head_word;
  tail_word.value.store(tail);
  offloadd::common::RingConsumer<SubmissionEntry> consumer(slots, kSlots, &tail_word, &head_word);
  for (int i = 0; i < 2 * static_cast<int>(kSlots); ++i) {
    SubmissionEntry entry;
    const RingResult r = consumer.TryPop(&entry);
    if (r != RingResult::kOk) {
      // Only a tail within the slots is taken from.
      if (r == RingResult::kCorrupt && tail <= kSlots) abort();
      break;
    }
    if (tail > kSlots) abort();
    CheckEntry(entry);
  }
  return 0;
}
