#include "server/projector/gpu_uuid.h"

#include <cctype>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"

namespace offloadd::projector {

std::string NormalizeGpuUuid(absl::string_view id) {
  const absl::string_view trimmed = absl::StripAsciiWhitespace(id);
  absl::string_view rest = trimmed;
  std::string prefix = "GPU-";
  if (absl::StartsWithIgnoreCase(rest, "GPU-")) {
    rest.remove_prefix(4);
  } else if (absl::StartsWithIgnoreCase(rest, "MIG-")) {
    rest.remove_prefix(4);
    prefix = "MIG-";
  }
  std::string hex;
  for (char c : rest) {
    if (c == '-') continue;
    if (!std::isxdigit(static_cast<unsigned char>(c))) return std::string(trimmed);
    hex.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  }
  if (hex.size() != 32) return std::string(trimmed);
  return prefix + hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" +
         hex.substr(16, 4) + "-" + hex.substr(20);
}

}  // namespace offloadd::projector
