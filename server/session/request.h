// The session protocol's plain request and completion types (rpc/ translates protobuf messages
// to Request and Completion back; Session and its operations, ops.h, use them). Sizes are
// bytes, times seconds; the rules each field is checked against are in session.h.
#ifndef OFFLOADD_SERVER_SESSION_REQUEST_H_
#define OFFLOADD_SERVER_SESSION_REQUEST_H_

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "server/copy/copy_engine.h"
#include "server/store/block_store.h"

namespace offloadd::session {

enum class RequestKind {
  kUnknown,
  kHello,
  kRegisterRegion,
  kUnregisterRegion,
  kOffload,
  kReload,
  kRelease,
  kClientReport
};

// Wire values of offloadd.v1.Priority; anything else is rejected.
inline constexpr int kPriorityUrgent = 1;
inline constexpr int kPriorityPrefetch = 2;

// What a client did without the daemon (ClientReport in proto/offload.proto): cumulative counts
// of the client process on the session's device; seconds for the waits.
struct ClientCounters {
  uint64_t fallbacks_total = 0;   // saved tensors kept in the process
  uint64_t host_waits_total = 0;  // times the training thread blocked on the daemon
  double host_wait_seconds_total = 0;
  uint64_t idle_steps_total = 0;  // steps that saved tensors but sent none
};

struct Request {
  uint64_t request_id = 0;
  RequestKind kind = RequestKind::kUnknown;
  // kHello
  std::string client_name, device_id;
  uint32_t pid = 0;
  std::string resume_token;  // empty: a new session
  bool transient_device = false;  // Hello: remove the link at the last session's end (proto)
  // kRegisterRegion
  copy::RegionSpec region;
  // kOffload / kReload / kUnregisterRegion / kRelease
  uint64_t region_id = 0, offset = 0, bytes = 0, block_id = 0;
  // CUDA IPC events (the event protocol, docs/ARCHITECTURE.md): kOffload / kReload: no chunk
  // is issued before it completed; kReload: recorded right after the last chunk is issued.
  std::string ready_event;
  std::string done_event;
  int priority = 0;
  bool release_after = false;
  double timeout_seconds = 0;  // relative: seconds from now (the wire's deadline_seconds); 0 = none
  // kOffload: a client-chosen name for the new block (0 = none). kReload / kRelease with
  // block_id 0: the block named so; such a request waits if the offload is not yet admitted.
  uint64_t tag = 0;
  // kOffload: where the block falls in the client's reload order (spill tier policy).
  store::OrderHint order;
  // kClientReport
  ClientCounters report;
};

enum class CompletionKind {
  kError,
  kHello,
  kRegionRegistered,
  kRegionUnregistered,
  kOffloadDone,
  kReloadDone,
  kReleased,
  kClientReportAck
};

struct Completion {
  uint64_t request_id = 0;
  CompletionKind kind = CompletionKind::kError;
  absl::Status status;  // set when kind == kError
  uint64_t id = 0;      // session id / region id / block id
  uint64_t bytes = 0;
  double queued_seconds = 0, copy_seconds = 0;
  bool released = false;
  // kReloadDone: the done event was recorded after the last chunk (sent before the copy
  // completes); false: the copy has completed.
  bool done_event_recorded = false;
  // kHello
  std::string backend, link;
  uint64_t pool_capacity_bytes = 0, session_quota_bytes = 0, chunk_bytes = 0;
  std::string resume_token;
  uint64_t blocks_resumed = 0;
  double resume_grace_seconds = 0;          // 0: the pool does not outlive the daemon
  std::vector<uint64_t> resumed_block_ids;  // resume only
};

}  // namespace offloadd::session

#endif  // OFFLOADD_SERVER_SESSION_REQUEST_H_
