// The one libstdc++ function newer than GCC 8's runtime that the core calls: GCC 11+ headers make
// std::allocator<T>::allocate call it for an impossible size, which would tie
// liboffloadd_core.so to libstdc++ >= GCC 11 (GLIBCXX_3.4.29). Defined here, it binds inside
// the library (offloadd_core.lds exports only the C ABI), so the library needs only what GCC 8's
// libstdc++ and glibc 2.27 provide: the manylinux_2_28 baseline of the Python wheel.
#include <new>

namespace std {
[[noreturn]] void __throw_bad_array_new_length() { throw std::bad_array_new_length(); }
}  // namespace std
