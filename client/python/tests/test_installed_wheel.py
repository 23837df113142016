"""The offloadd these tests import is the wheel installed in this Python, not the source tree:
run by tests/python/wheel_suite.sh (OFFLOADD_TEST_INSTALLED=1) in its second environment, next
to the hook tests; skipped in the source-tree run. OFFLOADD_EXPECT_TORCH names the torch version
that environment's lock pins, OFFLOADD_WHEEL the wheel file installed."""

import importlib.metadata
import json
import os
import re
import subprocess
import sys
import unittest

from daemon_fixture import REPO


@unittest.skipUnless(os.environ.get("OFFLOADD_TEST_INSTALLED") == "1",
                     "checks the installed wheel: tests/python/wheel_suite.sh runs it")
class InstalledWheelTest(unittest.TestCase):
    def assert_in_environment(self, path):
        path = os.path.realpath(path)
        self.assertTrue(path.startswith(os.path.realpath(sys.prefix) + os.sep),
                        "%s is outside this environment %s" % (path, sys.prefix))
        self.assertFalse(path.startswith(os.path.realpath(REPO) + os.sep),
                         "%s is in the source tree" % path)

    def test_package_and_stubs_come_from_the_environment(self):
        import offloadd
        import offloadd.torch
        from offloadd.v1 import offload_pb2
        for module in (offloadd, offloadd.torch, offload_pb2):
            self.assert_in_environment(module.__file__)

    def test_native_core_loads_from_beside_native_py(self):
        from offloadd import _native
        self.assertNotIn("OFFLOADD_CORE_LIB", os.environ)
        lib = _native.load()
        here = os.path.dirname(os.path.realpath(_native.__file__))
        self.assertEqual(os.path.realpath(lib._name), os.path.join(here, "liboffloadd_core.so"))
        self.assert_in_environment(lib._name)
        ring = _native.NativeRing(entries=8)
        try:
            self.assertGreaterEqual(ring.fd, 0)
            self.assertEqual(ring.pending, 0)
        finally:
            ring.close()

    def test_the_ring_uses_the_extension_module_from_beside_native_py(self):
        from offloadd import _native
        fast = _native.load_ring_fast()
        self.assertIsNotNone(fast, _native.ring_fast_error)
        here = os.path.dirname(os.path.realpath(_native.__file__))
        self.assertEqual(os.path.realpath(fast.__file__), os.path.join(here, "_ring_fast.abi3.so"))
        ring = _native.NativeRing(entries=8)
        try:
            self.assertEqual(ring.binding, "c-extension")
        finally:
            ring.close()

    def test_the_hooks_records_come_from_beside_native_py(self):
        from offloadd import _native
        from offloadd.torch import _store
        front = _native.load_store_front()
        here = os.path.dirname(os.path.realpath(_native.__file__))
        self.assertEqual(os.path.realpath(front.__file__),
                         os.path.join(here, "_store_front.abi3.so"))
        self.assertIs(_store.Saved, front.Saved)

    def test_installed_distribution_lists_the_core_and_the_extension(self):
        dist = importlib.metadata.distribution("offloadd")
        files = {str(f) for f in dist.files}
        self.assertIn("offloadd/liboffloadd_core.so", files)
        self.assertIn("offloadd/_ring_fast.abi3.so", files)
        self.assertIn("offloadd/_store_front.abi3.so", files)
        self.assertIn("offloadd/v1/offload_pb2.py", files)
        wheel = dist.read_text("WHEEL")
        self.assertRegex(wheel, r"Tag: cp310-abi3-manylinux_2_\d+_x86_64")

    def test_auditwheel_finds_the_platform_tag_the_wheel_claims(self):
        wheel = os.environ.get("OFFLOADD_WHEEL")
        if not wheel:
            self.skipTest("OFFLOADD_WHEEL not set")
        auditwheel = os.path.join(os.path.dirname(sys.executable), "auditwheel")
        r = subprocess.run([auditwheel, "show", "--json", wheel], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        report = json.loads(r.stdout)
        claimed = re.search(r"-cp310-abi3-(.+)\.whl$", os.path.basename(wheel)).group(1)
        self.assertEqual(report["overall_tag"], claimed)
        self.assertEqual(report["external_libs"], {})  # nothing beyond what manylinux allows

    def test_torch_is_the_locked_release(self):
        import torch
        want = os.environ.get("OFFLOADD_EXPECT_TORCH")
        if not want:
            self.skipTest("OFFLOADD_EXPECT_TORCH not set")
        self.assertEqual(torch.__version__.split("+")[0], want)


if __name__ == "__main__":
    unittest.main()
