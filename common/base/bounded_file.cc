#include "common/base/bounded_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "absl/strings/str_format.h"

namespace offloadd::base {
namespace {

const char* KindOf(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

absl::Status OpenError(const std::string& path, const std::string& what, int err) {
  const std::string message = absl::StrFormat(
      "cannot read %s %s: %s; %s", what, path, std::strerror(err),
      err == EACCES ? "make it readable by this user" : "check the path");
  if (err == EACCES || err == EPERM) return absl::PermissionDeniedError(message);
  return absl::NotFoundError(message);
}

// Reads at most `limit` bytes of `fd` into `out`; false (errno set) on a read error.
bool ReadUpTo(int fd, size_t limit, std::string* out) {
  char buf[65536];
  while (out->size() < limit) {
    const size_t want = std::min(sizeof(buf), limit - out->size());
    const ssize_t n = read(fd, buf, want);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    if (n == 0) break;
    out->append(buf, static_cast<size_t>(n));
  }
  return true;
}

}  // namespace

absl::StatusOr<std::string> ReadBoundedFile(const std::string& path, size_t max_bytes,
                                            const std::string& what) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) return OpenError(path, what, errno);
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return OpenError(path, what, err);
  }
  if (S_ISCHR(st.st_mode) && major(st.st_rdev) == 1 && minor(st.st_rdev) == 3) {
    close(fd);
    return std::string();  // /dev/null: empty, as `--check-config /dev/null` means
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return absl::FailedPreconditionError(absl::StrFormat(
        "cannot read %s %s: it is %s; give a regular file", what, path, KindOf(st.st_mode)));
  }
  std::string text;
  const bool ok = ReadUpTo(fd, max_bytes + 1, &text);
  const int err = errno;
  close(fd);
  if (!ok) {
    return absl::DataLossError(
        absl::StrFormat("cannot read %s %s: %s", what, path, std::strerror(err)));
  }
  if (text.size() > max_bytes) {
    return absl::OutOfRangeError(absl::StrFormat(
        "%s %s is larger than %d bytes, the most this input may hold; give the right file",
        what, path, max_bytes));
  }
  return text;
}

}  // namespace offloadd::base
