"""The package as Python users install it: a wheel built from client/python carries the
generated protocol stubs, the torch and transformers integrations and the native core
(liboffloadd_core.so beside _native.py), the torch hooks' records module (_store_front.abi3.so)
and, when it is built, the ring's extension module (_ring_fast.abi3.so), is tagged
cp310-abi3-manylinux_2_N_<arch>, and declares
grpcio and protobuf (the versions the stubs check at import) as dependencies. The wheel installed
into a second environment runs the hook tests in tests/python/wheel_suite.sh."""

import glob
import importlib.util
import os
import re
import subprocess
import sys
import tempfile
import unittest
import zipfile

from daemon_fixture import PY_ROOT


def _setup_module():
    spec = importlib.util.spec_from_file_location("offloadd_setup", os.path.join(PY_ROOT,
                                                                                 "setup.py"))
    module = importlib.util.module_from_spec(spec)
    argv, sys.argv = sys.argv, ["setup.py", "--name"]  # setup() prints the name and returns
    try:
        spec.loader.exec_module(module)
    finally:
        sys.argv = argv
    return module


class WheelTest(unittest.TestCase):
    def test_wheel_has_stubs_and_dependencies(self):
        with tempfile.TemporaryDirectory() as out:
            r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
                                "--no-build-isolation", "-w", out, PY_ROOT],
                               capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            (wheel,) = [f for f in os.listdir(out) if f.endswith(".whl")]
            with zipfile.ZipFile(os.path.join(out, wheel)) as z:
                names = set(z.namelist())
                meta = z.read(next(n for n in names if n.endswith("/METADATA"))).decode()
                info = z.read(next(n for n in names if n.endswith("/WHEEL"))).decode()
        self.assertRegex(wheel, r"^offloadd-[0-9.]+-cp310-abi3-manylinux_2_\d+_x86_64\.whl$")
        self.assertIn("offloadd/_store_front.abi3.so", names)
        if _setup_module().find_fast() is not None:
            self.assertIn("offloadd/_ring_fast.abi3.so", names)
        else:
            self.assertNotIn("offloadd/_ring_fast.abi3.so", names)
        self.assertIn("Root-Is-Purelib: false", info)
        for module in ("offloadd/liboffloadd_core.so", "offloadd/_native.py","offloadd/v1/offload_pb2.py", "offloadd/v1/offload_pb2_grpc.py",
                       "offloadd/v1/projector_pb2.py", "offloadd/v1/projector_pb2_grpc.py",
                       "offloadd/torch/_store.py", "offloadd/transformers.py",
                       "offloadd/galore/__init__.py", "offloadd/galore/_optim.py",
                       "offloadd/deepspeed.py", "offloadd/_devices.py",
                       "offloadd/testing/sim_gpu.py"):
            self.assertIn(module, names)
        requires = [ln.split(":", 1)[1].strip() for ln in meta.splitlines()
                    if ln.startswith("Requires-Dist:")]
        self.assertIn("grpcio>=1.85.1", requires)
        self.assertIn("protobuf<8,>=7.35.1", requires)
        self.assertIn('torch<3,>=2.4; extra == "torch"', requires)
        self.assertIn('transformers>=5.17; extra == "transformers"', requires)
        self.assertIn('accelerate>=1.1.0; extra == "transformers"', requires)
        self.assertIn('galore-torch==1.0; extra == "galore"', requires)
        self.assertIn('bitsandbytes==0.50.2; extra == "galore"', requires)
        self.assertIn('deepspeed==0.19.8; extra == "deepspeed"', requires)


class OldProtobufTest(unittest.TestCase):
    def test_a_protobuf_too_old_for_the_stubs_is_named_with_what_to_install(self):
        """Debian's python3-protobuf (4.21, no runtime_version module), as a
        --system-site-packages environment sees it: importing the stubs says which protobuf it
        found, where, and the pip command, instead of a bare ImportError."""
        system = "/usr/lib/python3/dist-packages/google/protobuf"
        if not os.path.isdir(system) or os.path.exists(os.path.join(system,
                                                                    "runtime_version.py")):
            self.skipTest("no Debian python3-protobuf older than the stubs at " + system)
        r = subprocess.run(["/usr/bin/python3", "-c", "import offloadd.v1"],
                           capture_output=True, text=True, timeout=60,
                           env=dict(os.environ, PYTHONPATH=PY_ROOT))
        self.assertNotEqual(r.returncode, 0)
        last = r.stderr.strip().splitlines()[-1]
        self.assertRegex(last, r"^ImportError: offloadd: its protocol stubs need protobuf "
                               r">=7\.35\.1,<8, but this environment imports protobuf 4\.")
        self.assertIn("from %s (Debian's python3-protobuf" % system, last)
        self.assertIn("run pip install 'protobuf>=7.35.1,<8' in it", last)


class CorePlatformTagTest(unittest.TestCase):
    """setup.py's core_platform_tag: the tag follows the core's glibc needs, and a library that
    links anything beyond glibc, libstdc++ and libgcc_s is refused."""

    def test_core_tag_is_its_newest_glibc(self):
        setup = _setup_module()
        core = setup.find_core()
        dump = subprocess.run(["objdump", "-T", core], capture_output=True, text=True,
                              check=True).stdout
        newest = max(int(m) for m in re.findall(r"\(GLIBC_2\.(\d+)", dump))
        self.assertEqual(setup.core_platform_tag(core), "manylinux_2_%d_x86_64" % max(newest, 17))
        self.assertNotRegex(dump, r"GLIBCXX_3\.4\.(2[6-9]|[3-9]\d)")

    def test_library_linking_others_is_refused(self):
        setup = _setup_module()
        (libssl,) = glob.glob("/usr/lib/x86_64-linux-gnu/libssl.so.3")[:1] or [None]
        if libssl is None:
            self.skipTest("no /usr/lib/x86_64-linux-gnu/libssl.so.3 to try")
        with self.assertRaisesRegex(RuntimeError, r"links libcrypto\.so\.3"):
            setup.core_platform_tag(libssl)

    def test_extension_module_needs_glibc_alone(self):
        setup = _setup_module()
        fast = setup.find_fast()
        if fast is None:
            self.skipTest("the extension module is not built (bazel build "
                          "//client/core:ring_fast.so)")
        for ext in (fast, setup.find_store_front()):
            needed = re.findall(r"NEEDED\s+(\S+)", subprocess.run(
                ["objdump", "-p", ext], capture_output=True, text=True, check=True).stdout)
            self.assertEqual(needed, ["libc.so.6"], ext)
            self.assertRegex(setup.core_platform_tag(ext, glibc_only=True),
                             r"^manylinux_2_\d+_x86_64$")
        # The core needs libstdc++: as an extension module it would be refused.
        with self.assertRaisesRegex(RuntimeError, r"links libstdc\+\+\.so\.6.*only glibc"):
            setup.core_platform_tag(setup.find_core(), glibc_only=True)


if __name__ == "__main__":
    unittest.main()
