// Reading a small input file (a config, a model's config.json) with a size bound, so that a
// path naming /dev/zero, a FIFO with no writer or a huge file is refused with a sentence
// instead of filling memory or blocking start-up.
#ifndef OFFLOADD_COMMON_BASE_BOUNDED_FILE_H_
#define OFFLOADD_COMMON_BASE_BOUNDED_FILE_H_

#include <cstddef>
#include <string>

#include "absl/status/statusor.h"

namespace offloadd::base {

// The whole content of the regular file at `path`, at most `max_bytes` bytes. The file is opened
// non-blocking (a FIFO without a writer does not block the open) and checked with fstat on the
// opened descriptor before anything is read; the null device (/dev/null) reads as empty. `what`
// names the input in messages ("config file", "--hf-config file"). Errors, each a sentence
// naming `what` and `path`:
//  - NOT_FOUND (no such file, or another open error) or PERMISSION_DENIED, with strerror's text;
//  - FAILED_PRECONDITION for a directory, FIFO, socket or device (not a regular file);
//  - OUT_OF_RANGE when the file holds more than `max_bytes` bytes (read stops at max_bytes + 1);
//  - DATA_LOSS for a read error.
absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, size_t max_bytes,
                                            const std::string& what);

}  // namespace offloadd::base

#endif  // OFFLOADD_COMMON_BASE_BOUNDED_FILE_H_
