"""Build hook of the offloadd package (metadata lives in pyproject.toml).

build_py first regenerates the protocol stubs offloadd/v1/offload_pb2*.py with gen_proto.sh when
the repository's proto/ directory is next to this package (an in-tree build), so an installed
package always carries stubs that match the proto it was built from. Outside the repository the
stubs must already be present.

build_py also copies the native client core, liboffloadd_core.so, into the built package beside
_native.py (where offloadd._native.load() looks first): from $OFFLOADD_CORE_LIB, else where a
Bazel build of the repository leaves it (``bazel build //client/core:liboffloadd_core.so``). The
wheel is then ``py3-none-<platform>``: the core is loaded with ctypes, so one wheel serves every
CPython; the platform is ``manylinux_2_<N>_<arch>`` with N the newest glibc symbol version the
core needs (core_platform_tag below, which refuses a core that links anything but glibc,
libstdc++ and libgcc_s, or needs a libstdc++ newer than GCC 8's).
"""

import os
import platform
import re
import shutil
import subprocess
import sys

from setuptools import Distribution, setup
from setuptools.command.bdist_wheel import bdist_wheel
from setuptools.command.build_py import build_py

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.abspath(os.path.join(HERE, "..", ".."))
CORE = "liboffloadd_core.so"
CORE_CANDIDATES = (
    os.path.join(REPO, "bazel-bin", "client", "core", CORE),
    os.path.join(REPO, "bazel-out", "k8-opt", "bin", "client", "core", CORE),
)
# What the core may load: glibc's own libraries, libstdc++ and libgcc_s (every distribution has
# them; manylinux allows them). Never libpython (ctypes needs no Python ABI) nor libtorch.
ALLOWED_NEEDED = re.compile(r"^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so\.\d+$"
                            r"|^ld-linux-x86-64\.so\.2$")
# The newest libstdc++ symbol versions of GCC 8's runtime, the oldest one on a distribution
# with glibc >= 2.27 (RHEL 8, Ubuntu 18.04 with its gcc-8 runtime, Debian 10).
MAX_VERSIONS = {"GLIBCXX": (3, 4, 25), "CXXABI": (1, 3, 11), "GCC": (8, 0, 0)}


def find_core():
    """Path of liboffloadd_core.so to package; RuntimeError naming the places looked at."""
    env = os.environ.get("OFFLOADD_CORE_LIB")
    paths = [env] if env else list(CORE_CANDIDATES)
    for path in paths:
        if os.path.isfile(path):
            return path
    raise RuntimeError("offloadd: the native core %s is not at %s: run 'bazel build "
                       "//client/core:liboffloadd_core.so' in the repository or set "
                       "OFFLOADD_CORE_LIB to its path" % (CORE, " or ".join(paths)))


def _objdump(flag, path):
    return subprocess.run(["objdump", flag, path], check=True, capture_output=True,
                          text=True).stdout


def core_platform_tag(path):
    """``manylinux_2_<N>_<arch>`` for the core at ``path``: N is the newest GLIBC_2.N symbol
    version it imports. Raises RuntimeError when it needs a library outside ALLOWED_NEEDED or a
    libstdc++/libgcc symbol version newer than MAX_VERSIONS (objdump from binutils reads it)."""
    needed = re.findall(r"^\s*NEEDED\s+(\S+)", _objdump("-p", path), re.M)
    foreign = [n for n in needed if not ALLOWED_NEEDED.match(n)]
    if foreign:
        raise RuntimeError("offloadd: %s links %s: the wheel's core may need only glibc, "
                           "libstdc++ and libgcc_s" % (path, ", ".join(foreign)))
    versions = set(re.findall(r"\((GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)\)",
                              _objdump("-T", path)))
    glibc_minor = 0
    for name, number in versions:
        parts = tuple(int(x) for x in number.split("."))
        if name == "GLIBC":
            glibc_minor = max(glibc_minor, parts[1] if parts[0] == 2 and len(parts) > 1 else 0)
        elif parts > MAX_VERSIONS[name]:
            raise RuntimeError("offloadd: %s needs %s_%s, newer than GCC 8's runtime: the wheel "
                               "would not load on the distributions its tag names"
                               % (path, name, number))
    machine = platform.machine()
    return "manylinux_2_%d_%s" % (max(glibc_minor, 17), machine)


class BuildPyWithStubs(build_py):
    def run(self):
        script = os.path.join(HERE, "gen_proto.sh")
        proto = os.path.join(HERE, "..", "..", "proto", "offload.proto")
        stub = os.path.join(HERE, "offloadd", "v1", "offload_pb2.py")
        if os.path.exists(script) and os.path.exists(proto):
            env = dict(os.environ, PYTHON=os.environ.get("PYTHON", sys.executable))
            subprocess.check_call(["sh", script], env=env)
        elif not os.path.exists(stub):
            raise RuntimeError("offloadd: %s is missing and proto/offload.proto is not next to "
                               "this package: build from the offloadd repository" % stub)
        super().run()
        target = os.path.join(self.build_lib, "offloadd", CORE)
        shutil.copyfile(find_core(), target)
        os.chmod(target, 0o755)


class PlatformWheel(bdist_wheel):
    """A ``py3-none-<platform>`` wheel: platform-specific (it carries the core) but for every
    Python 3 (ctypes, no extension module)."""

    def get_tag(self):
        return "py3", "none", core_platform_tag(find_core())


class CoreDistribution(Distribution):
    """Installs into platlib (Root-Is-Purelib: false), as a package with a native library must."""

    def has_ext_modules(self):
        return True


setup(distclass=CoreDistribution,
      cmdclass={"build_py": BuildPyWithStubs, "bdist_wheel": PlatformWheel})
