// The release of offloadd's daemon and tools (`offloadd --version`, `offloadctl --version`, the
// offloadd_build_info metric). The Python package (client/python/pyproject.toml and
// offloadd/__init__.py) carries the same string; server/version_test.sh checks they agree.
#ifndef OFFLOADD_COMMON_BASE_VERSION_H_
#define OFFLOADD_COMMON_BASE_VERSION_H_

namespace offloadd::base {

inline constexpr char kVersion[] = "0.2.0";

}  // namespace offloadd::base

#endif  // OFFLOADD_COMMON_BASE_VERSION_H_
