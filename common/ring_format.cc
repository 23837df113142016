#include "common/ring_format.h"

#include <cmath>
#include <cstring>
#include <new>

namespace offloadd::common {
namespace {

bool PowerOfTwoInRange(uint32_t n) {
  return n >= kMinRingEntries && n <= kMaxRingEntries && (n & (n - 1)) == 0;
}

bool Fail(std::string* error, std::string why) {
  if (error != nullptr) *error = std::move(why);
  return false;
}

bool AllZero(const uint8_t* bytes, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    if (bytes[i] != 0) return false;
  }
  return true;
}

// Fields the kind does not use must be zero (a client bug shows instead of being ignored).
bool UnusedFieldsZero(const SubmissionEntry& e, SubmissionKind kind) {
  const bool copy = kind != SubmissionKind::kRelease;
  if (!copy && (e.region_id != 0 || e.offset_bytes != 0 || e.ready_event_bytes != 0)) {
    return false;
  }
  if (kind != SubmissionKind::kOffload &&
      (e.size_bytes != 0 || e.order_step != 0 || e.order_position != 0)) {
    return false;
  }
  if (kind != SubmissionKind::kReload &&
      (e.priority != 0 || e.deadline_seconds != 0 || e.done_event_bytes != 0)) {
    return false;
  }
  if (kind == SubmissionKind::kOffload && e.block_id != 0) return false;
  if (e.ready_event_bytes == 0 && !AllZero(e.ready_event, kRingEventBytes)) return false;
  if (e.done_event_bytes == 0 && !AllZero(e.done_event, kRingEventBytes)) return false;
  return true;
}

}  // namespace

bool MakeRingLayout(uint32_t submission_entries, uint32_t completion_entries, RingLayout* out,
                    std::string* error) {
  if (!PowerOfTwoInRange(submission_entries) || !PowerOfTwoInRange(completion_entries)) {
    return Fail(error, "ring entry counts must be powers of two from " +
                           std::to_string(kMinRingEntries) + " to " +
                           std::to_string(kMaxRingEntries) + " (got " +
                           std::to_string(submission_entries) + " submissions, " +
                           std::to_string(completion_entries) + " completions)");
  }
  out->submission_entries = submission_entries;
  out->completion_entries = completion_entries;
  out->submission_offset = sizeof(RingControl);
  out->completion_offset =
      out->submission_offset + uint64_t{submission_entries} * sizeof(SubmissionEntry);
  out->total_bytes =
      out->completion_offset + uint64_t{completion_entries} * sizeof(CompletionEntry);
  return true;
}

void InitRing(void* base, const RingLayout& layout) {
  RingHeader& h = (new (base) RingControl())->header;  // zeroed indices and doorbells
  h.magic = kRingMagic;
  h.version = kRingVersion;
  h.control_bytes = sizeof(RingControl);
  h.submission_entries = layout.submission_entries;
  h.completion_entries = layout.completion_entries;
  h.submission_entry_bytes = sizeof(SubmissionEntry);
  h.completion_entry_bytes = sizeof(CompletionEntry);
  h.submission_offset = layout.submission_offset;
  h.completion_offset = layout.completion_offset;
  h.total_bytes = layout.total_bytes;
}

bool ParseRingHeader(const RingHeader& copy, uint64_t object_bytes, RingLayout* out,
                     std::string* error) {
  if (copy.magic != kRingMagic) {
    return Fail(error, "the ring object does not start with the ring magic: create it with the "
                       "offloadd client library");
  }
  if (copy.version != kRingVersion) {
    return Fail(error, "the ring is version " + std::to_string(copy.version) +
                           " and this daemon speaks version " + std::to_string(kRingVersion) +
                           ": use a client library of the daemon's release");
  }
  RingLayout layout;
  if (!MakeRingLayout(copy.submission_entries, copy.completion_entries, &layout, error)) {
    return false;
  }
  if (copy.control_bytes != sizeof(RingControl) ||
      copy.submission_entry_bytes != sizeof(SubmissionEntry) ||
      copy.completion_entry_bytes != sizeof(CompletionEntry) ||
      copy.submission_offset != layout.submission_offset ||
      copy.completion_offset != layout.completion_offset ||
      copy.total_bytes != layout.total_bytes || copy.reserved != 0) {
    return Fail(error, "the ring header's sizes or offsets are not those of its entry counts: "
                       "create the ring with the offloadd client library");
  }
  if (object_bytes != layout.total_bytes) {
    return Fail(error, "the ring object is " + std::to_string(object_bytes) +
                           " bytes but its header describes " +
                           std::to_string(layout.total_bytes) + ": size it as the header says");
  }
  *out = layout;
  return true;
}

RingControl* ControlOf(void* base) { return static_cast<RingControl*>(base); }

SubmissionEntry* SubmissionSlots(void* base, const RingLayout& layout) {
  return reinterpret_cast<SubmissionEntry*>(static_cast<char*>(base) + layout.submission_offset);
}

CompletionEntry* CompletionSlots(void* base, const RingLayout& layout) {
  return reinterpret_cast<CompletionEntry*>(static_cast<char*>(base) + layout.completion_offset);
}

bool ValidateSubmission(const SubmissionEntry& e, std::string* error) {
  if (e.kind < static_cast<uint32_t>(SubmissionKind::kOffload) ||
      e.kind > static_cast<uint32_t>(SubmissionKind::kRelease)) {
    return Fail(error, "unknown ring submission kind " + std::to_string(e.kind) +
                           ": use 1 (offload), 2 (reload) or 3 (release)");
  }
  const auto kind = static_cast<SubmissionKind>(e.kind);
  if ((e.request_id & kRingRequestIdBit) == 0) {
    return Fail(error, "ring request ids have bit 63 set: set it on every request sent on "
                       "the ring");
  }
  if ((e.flags & ~kSubmitKnownFlags) != 0 ||
      ((e.flags & kSubmitReleaseAfter) != 0 && kind != SubmissionKind::kReload) ||
      ((e.flags & kSubmitOrdering) != 0 && kind != SubmissionKind::kOffload)) {
    return Fail(error, "ring submission flags " + std::to_string(e.flags) +
                           " name a flag unknown or not of this kind: release_after is for "
                           "reloads, ordering for offloads");
  }
  if ((e.ready_event_bytes != 0 && e.ready_event_bytes != kRingEventBytes) ||
      (e.done_event_bytes != 0 && e.done_event_bytes != kRingEventBytes)) {
    return Fail(error, "ring event handles are 0 or 64 bytes (cudaIpcEventHandle_t)");
  }
  if (!std::isfinite(e.deadline_seconds) || e.deadline_seconds < 0 ||
      e.deadline_seconds > 1e9) {
    return Fail(error, "a reload's deadline_seconds must be finite, from 0 to 1e9");
  }
  if (e.reserved0 != 0 || !AllZero(e.reserved, sizeof(e.reserved)) ||
      ((e.flags & kSubmitOrdering) == 0 && (e.order_step != 0 || e.order_position != 0)) ||
      !UnusedFieldsZero(e, kind)) {
    return Fail(error, "a ring submission sets fields its kind does not use or reserved bytes: "
                       "zero the entry before filling it");
  }
  return true;
}

CompletionEntry MakeCompletion(uint64_t request_id, CompletionKind kind, int32_t status_code,
                               const std::string& message) {
  CompletionEntry c;
  std::memset(&c, 0, sizeof(c));
  c.request_id = request_id;
  c.kind = static_cast<uint32_t>(kind);
  c.status_code = status_code;
  const size_t n = message.size() < kCompletionMessageBytes ? message.size()
                                                             : kCompletionMessageBytes;
  std::memcpy(c.message, message.data(), n);
  c.message_bytes = static_cast<uint32_t>(n);
  return c;
}

}  // namespace offloadd::common
