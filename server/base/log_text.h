// Client-supplied text (a parameter id, a device id, a status message that quotes one) as it
// may appear in a daemon log line.
#ifndef OFFLOADD_SERVER_BASE_LOG_TEXT_H_
#define OFFLOADD_SERVER_BASE_LOG_TEXT_H_

#include <cstddef>
#include <string>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace offloadd::base {

// `text` C-escaped (absl::CEscape: a newline becomes the two characters \n, quotes and
// non-printable bytes are escaped), so no client string can end a log line and start one of
// its own (a forged "audit: " record); longer than `max_bytes`, its first `max_bytes` bytes
// escaped and "...[<N>B]" with its length, so one string cannot push the rest of a line past
// glog's line limit.
inline std::string LogText(absl::string_view text, size_t max_bytes = 256) {
  if (text.size() <= max_bytes) return absl::CEscape(text);
  return absl::StrCat(absl::CEscape(text.substr(0, max_bytes)), "...[", text.size(), "B]");
}

}  // namespace offloadd::base

#endif  // OFFLOADD_SERVER_BASE_LOG_TEXT_H_
