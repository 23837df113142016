// NormalizeGpuUuid: one spelling for a GPU's UUID, so device ids from different sources compare
// equal. Clients send cuDeviceGetUuid formatted "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"; nvidia-smi
// prints the same in lower case; users and other tools write upper case, drop the dashes or the
// "GPU-" prefix. All of these become "GPU-" + 8-4-4-4-12 lower-case hex digits. A MIG device
// ("MIG-..." followed by a UUID) keeps its prefix and gets the same treatment of the rest. Anything
// else (not 32 hex digits after an optional prefix) is returned trimmed of surrounding white space
// and otherwise unchanged, so it still compares equal to itself and to nothing else.
#ifndef OFFLOADD_SERVER_PROJECTOR_GPU_UUID_H_
#define OFFLOADD_SERVER_PROJECTOR_GPU_UUID_H_

#include <string>

#include "absl/strings/string_view.h"

namespace offloadd::projector {

std::string NormalizeGpuUuid(absl::string_view id);

}  // namespace offloadd::projector

#endif  // OFFLOADD_SERVER_PROJECTOR_GPU_UUID_H_
