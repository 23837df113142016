// Ring entries (common/ring_format.h) <-> the session's plain Request and Completion, the ring's
// counterpart of translate.h. Works on private copies only: a SubmissionEntry here was copied
// out of the ring once, and the Completion entry built here is copied into it once.
#ifndef OFFLOADD_SERVER_RPC_RING_TRANSLATE_H_
#define OFFLOADD_SERVER_RPC_RING_TRANSLATE_H_

#include <string>

#include "common/ring_format.h"
#include "server/session/request.h"

namespace offloadd::rpc {

// The request a validated submission (common::ValidateSubmission) describes. Event handles
// become strings of their stated length; the deadline becomes timeout_seconds.
session::Request FromRing(const common::SubmissionEntry& entry);
// The completion entry for a session completion of a ring request: OffloadDone, ReloadDone,
// Released, or an error (its code and message, truncated to fit). A completion kind the ring
// does not carry (the session answers ring requests with none of them) becomes INTERNAL.
common::CompletionEntry ToRing(const session::Completion& completion);

}  // namespace offloadd::rpc

#endif  // OFFLOADD_SERVER_RPC_RING_TRANSLATE_H_
