// For BlockStore tests: options and blocking wrappers around the store's callback API.
#ifndef OFFLOADD_SERVER_STORE_BLOCK_STORE_TEST_UTIL_H_
#define OFFLOADD_SERVER_STORE_BLOCK_STORE_TEST_UTIL_H_

#include <cstdint>
#include <future>
#include <utility>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/store/block_store.h"

namespace offloadd::store {

// `quota_bytes` per session (0 = none), admission deadline in seconds, admission queue limit.
inline BlockStoreOptions TestStoreOptions(uint64_t quota_bytes = 0, double deadline_seconds = 5.0,
                                          uint32_t queue_limit = 16) {
  BlockStoreOptions o;
  o.session_quota_bytes = quota_bytes;
  o.admission_deadline_seconds = deadline_seconds;
  o.admission_queue_limit = queue_limit;
  return o;
}

// Reserve, waiting for its callback (admission may queue; the deadline bounds the wait).
inline absl::StatusOr<BlockRef> ReserveNow(BlockStore& s, uint64_t session, uint64_t bytes,
                                           OrderHint hint = {}) {
  std::promise<absl::StatusOr<BlockRef>> p;
  auto f = p.get_future();
  s.Reserve(
      session, bytes, [&p](absl::StatusOr<BlockRef> r) { p.set_value(std::move(r)); }, hint);
  return f.get();
}

// BeginReload, waiting for its callback; BeginReload's own error when it refuses at once.
inline absl::StatusOr<BlockRef> ReloadNow(BlockStore& s, uint64_t session, uint64_t block_id) {
  std::promise<absl::StatusOr<BlockRef>> p;
  auto f = p.get_future();
  absl::Status st = s.BeginReload(session, block_id,
                                  [&p](absl::StatusOr<BlockRef> r) { p.set_value(std::move(r)); });
  if (!st.ok()) return st;
  return f.get();
}

}  // namespace offloadd::store

#endif  // OFFLOADD_SERVER_STORE_BLOCK_STORE_TEST_UTIL_H_
