"""Build hook of the offloadd package (metadata lives in pyproject.toml).

build_py first regenerates the protocol stubs offloadd/v1/offload_pb2*.py with gen_proto.sh when
the repository's proto/ directory is next to this package (an in-tree build), so an installed
package always carries stubs that match the proto it was built from. Outside the repository the
stubs must already be present.

build_py also copies the native client core, liboffloadd_core.so, into the built package beside
_native.py (where offloadd._native.load() looks first): from $OFFLOADD_CORE_LIB, else where a
Bazel build of the repository leaves it (``bazel build //client/core:liboffloadd_core.so``), and,
when it is built, the extension module of the ring's hot calls as offloadd/_ring_fast.abi3.so:
from $OFFLOADD_RING_FAST_LIB, else the Bazel output (``bazel build //client/core:ring_fast.so``),
and the extension module of the torch hooks' records, which the package needs, as
offloadd/_store_front.abi3.so: from $OFFLOADD_STORE_FRONT_LIB, else the Bazel output
(``bazel build //client/core:store_front.so``).
The core is loaded with ctypes; the extensions are on CPython's stable ABI (3.10). The wheel is
``cp310-abi3-<platform>`` (one wheel for every CPython >= 3.10); the platform is
``manylinux_2_<N>_<arch>`` with N the newest glibc symbol version the core or an extension needs
(core_platform_tag below, which refuses a core that links anything but glibc, libstdc++ and
libgcc_s, or needs a libstdc++ newer than GCC 8's, and an extension that links anything but
glibc).
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
FAST = "ring_fast.so"
FAST_IN_PACKAGE = "_ring_fast.abi3.so"  # the name offloadd._native looks for beside itself
FAST_CANDIDATES = (
    os.path.join(REPO, "bazel-bin", "client", "core", FAST),
    os.path.join(REPO, "bazel-out", "k8-opt", "bin", "client", "core", FAST),
)
STORE_FRONT = "store_front.so"
STORE_FRONT_IN_PACKAGE = "_store_front.abi3.so"
STORE_FRONT_CANDIDATES = (
    os.path.join(REPO, "bazel-bin", "client", "core", STORE_FRONT),
    os.path.join(REPO, "bazel-out", "k8-opt", "bin", "client", "core", STORE_FRONT),
)
# What the extension module may load: glibc's own libraries (never libpython: the interpreter
# provides its symbols).
GLIBC_ONLY = re.compile(r"^(libc|libm|libdl|librt|libpthread)\.so\.\d+$"
                        r"|^ld-linux-x86-64\.so\.2$")
# What the core may load: glibc's own libraries, libstdc++ and libgcc_s (every distribution has
# them; manylinux allows them). Never libpython (ctypes needs no Python ABI) nor libtorch.
ALLOWED_NEEDED = re.compile(r"^(libc|libm|libdl|librt|libpthread|libgcc_s|libstdc\+\+)\.so\.\d+$"
                            r"|^ld-linux-x86-64\.so\.2$")
# The newest libstdc++ symbol versions of GCC 8's runtime, the oldest one on a distribution
# with glibc >= 2.27 (RHEL 8, Ubuntu 18.04 with its gcc-8 runtime, Debian 10).
MAX_VERSIONS = {"GLIBCXX": (3, 4, 25), "CXXABI": (1, 3, 11), "GCC": (8, 0, 0)}


def _find_required(env, candidates, name, target):
    """Path of the built file ``name`` the package needs: $``env``, else the first of
    ``candidates`` that exists; RuntimeError naming the places looked at and the Bazel
    ``target`` that builds it."""
    paths = [os.environ[env]] if os.environ.get(env) else list(candidates)
    for path in paths:
        if os.path.isfile(path):
            return path
    raise RuntimeError("offloadd: %s is not at %s: run 'bazel build %s' in the repository or "
                       "set %s to its path" % (name, " or ".join(paths), target, env))


def find_core():
    """Path of liboffloadd_core.so to package; RuntimeError naming the places looked at."""
    return _find_required("OFFLOADD_CORE_LIB", CORE_CANDIDATES, "the native core " + CORE,
                          "//client/core:liboffloadd_core.so")


def find_fast():
    """Path of the extension module to package, or None when it is not built. Raises
    RuntimeError when $OFFLOADD_RING_FAST_LIB names a file that is not there."""
    env = os.environ.get("OFFLOADD_RING_FAST_LIB")
    if env:
        if not os.path.isfile(env):
            raise RuntimeError("offloadd: OFFLOADD_RING_FAST_LIB=%s is not a file: build it with "
                               "'bazel build //client/core:ring_fast.so'" % env)
        return env
    for path in FAST_CANDIDATES:
        if os.path.isfile(path):
            return path
    return None


def find_store_front():
    """Path of the records' extension module to package; RuntimeError naming the places looked
    at (the package does not work without it)."""
    return _find_required("OFFLOADD_STORE_FRONT_LIB", STORE_FRONT_CANDIDATES,
                          "the extension module " + STORE_FRONT, "//client/core:store_front.so")


def _objdump(flag, path):
    return subprocess.run(["objdump", flag, path], check=True, capture_output=True,
                          text=True).stdout


def core_platform_tag(path, glibc_only=False):
    """``manylinux_2_<N>_<arch>`` for the core at ``path``: N is the newest GLIBC_2.N symbol
    version it imports. Raises RuntimeError when it needs a library outside ALLOWED_NEEDED or a
    libstdc++/libgcc symbol version newer than MAX_VERSIONS (objdump from binutils reads it).
    ``glibc_only``: for the extension module, which may need glibc's libraries alone."""
    needed = re.findall(r"^\s*NEEDED\s+(\S+)", _objdump("-p", path), re.M)
    allowed = GLIBC_ONLY if glibc_only else ALLOWED_NEEDED
    foreign = [n for n in needed if not allowed.match(n)]
    if foreign:
        raise RuntimeError("offloadd: %s links %s: the wheel's %s" % (
            path, ", ".join(foreign), "extension module may need only glibc" if glibc_only
            else "core may need only glibc, libstdc++ and libgcc_s"))
    versions = set(re.findall(r"\((GLIBC|GLIBCXX|CXXABI|GCC)_([0-9.]+)\)",
                              _objdump("-T", path)))
    if glibc_only and any(name != "GLIBC" for name, _ in versions):
        raise RuntimeError("offloadd: %s imports libstdc++ or libgcc symbols: the wheel's "
                           "extension module may need only glibc" % path)
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
        fast = find_fast()
        for path, name in ((fast, FAST_IN_PACKAGE), (find_store_front(), STORE_FRONT_IN_PACKAGE)):
            if path is not None:
                target = os.path.join(self.build_lib, "offloadd", name)
                shutil.copyfile(path, target)
                os.chmod(target, 0o755)


def _glibc_minor(tag):
    return int(re.match(r"manylinux_2_(\d+)_", tag).group(1))


class PlatformWheel(bdist_wheel):
    """A platform-specific wheel (it carries the core): ``cp310-abi3-<platform>`` (its extension
    modules are on CPython's stable ABI of 3.10: every CPython >= 3.10). The platform needs the
    newest glibc of its libraries."""

    def get_tag(self):
        tags = [core_platform_tag(find_core())]
        for ext in (find_fast(), find_store_front()):
            if ext is not None:
                tags.append(core_platform_tag(ext, glibc_only=True))
        return "cp310", "abi3", max(tags, key=_glibc_minor)


class CoreDistribution(Distribution):
    """Installs into platlib (Root-Is-Purelib: false), as a package with a native library must."""

    def has_ext_modules(self):
        return True


setup(distclass=CoreDistribution,
      cmdclass={"build_py": BuildPyWithStubs, "bdist_wheel": PlatformWheel})
