#include "server/rpc/ring_translate.h"

namespace offloadd::rpc {

namespace {
std::string EventBytes(const uint8_t* bytes, uint8_t length) {
  return std::string(reinterpret_cast<const char*>(bytes), length);
}
}  // namespace

session::Request FromRing(const common::SubmissionEntry& e) {
  session::Request r;
  r.request_id = e.request_id;
  r.region_id = e.region_id;
  r.offset = e.offset_bytes;
  r.tag = e.tag;
  switch (static_cast<common::SubmissionKind>(e.kind)) {
    case common::SubmissionKind::kOffload:
      r.kind = session::RequestKind::kOffload;
      r.bytes = e.size_bytes;
      r.ready_event = EventBytes(e.ready_event, e.ready_event_bytes);
      if ((e.flags & common::kSubmitOrdering) != 0) {
        r.order.valid = true;
        r.order.step = e.order_step;
        r.order.position = e.order_position;
      }
      break;
    case common::SubmissionKind::kReload:
      r.kind = session::RequestKind::kReload;
      r.block_id = e.block_id;
      r.priority = static_cast<int>(e.priority);
      r.release_after = (e.flags & common::kSubmitReleaseAfter) != 0;
      r.timeout_seconds = e.deadline_seconds;
      r.ready_event = EventBytes(e.ready_event, e.ready_event_bytes);
      r.done_event = EventBytes(e.done_event, e.done_event_bytes);
      break;
    case common::SubmissionKind::kRelease:
      r.kind = session::RequestKind::kRelease;
      r.block_id = e.block_id;
      break;
    default:
      r.kind = session::RequestKind::kUnknown;
  }
  return r;
}

common::CompletionEntry ToRing(const session::Completion& c) {
  using common::CompletionKind;
  switch (c.kind) {
    case session::CompletionKind::kOffloadDone: {
      common::CompletionEntry e = common::MakeCompletion(c.request_id, CompletionKind::kOffloadDone,
                                                         0, "");
      e.block_id = c.id;
      e.bytes = c.bytes;
      e.queued_seconds = c.queued_seconds;
      e.copy_seconds = c.copy_seconds;
      return e;
    }
    case session::CompletionKind::kReloadDone: {
      common::CompletionEntry e = common::MakeCompletion(c.request_id, CompletionKind::kReloadDone,
                                                         0, "");
      e.block_id = c.id;
      e.bytes = c.bytes;
      e.copy_seconds = c.copy_seconds;
      e.flags = (c.released ? common::kCompleteReleased : 0) |
                (c.done_event_recorded ? common::kCompleteDoneEventRecorded : 0);
      return e;
    }
    case session::CompletionKind::kReleased: {
      common::CompletionEntry e = common::MakeCompletion(c.request_id, CompletionKind::kReleased,
                                                         0, "");
      e.block_id = c.id;
      return e;
    }
    case session::CompletionKind::kError:
      return common::MakeCompletion(c.request_id, CompletionKind::kError,
                                    static_cast<int32_t>(c.status.code()),
                                    std::string(c.status.message()));
    default:
      return common::MakeCompletion(c.request_id, CompletionKind::kError,
                                    static_cast<int32_t>(absl::StatusCode::kInternal),
                                    "the daemon answered a ring request with a completion the "
                                    "ring does not carry: report this as a daemon bug");
  }
}

}  // namespace offloadd::rpc
