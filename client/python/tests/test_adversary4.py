"""Attacks on the Python client's request ring and resume paths: a NativeRing used from a
process forked after it was created, and a daemon that refuses the ring offered by a resume."""

import os
import subprocess
import sys
import textwrap
import unittest

from daemon_fixture import Daemon  # noqa: F401 (also puts the package on sys.path)
from offloadd import _native


def _run(script):
    """Runs ``script`` (after ``from offloadd import _native``) in a fresh interpreter: (exit
    code, output). A segfault is exit code -11."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(_native.__file__)))
    env = dict(os.environ)
    env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "")
    env["OFFLOADD_CORE_LIB"] = _native.load()._name
    done = subprocess.run([sys.executable, "-c", "from offloadd import _native\n"
                           + textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=60)
    return done.returncode, done.stdout + done.stderr


class ForkedNativeRingTest(unittest.TestCase):
    def test_a_forked_child_cannot_submit_into_its_parents_ring(self):
        """The ring's memory is a shared mapping: a child that submitted on its parent's ring
        would put a request the parent never made (with an id the parent's next request also
        gets) before the daemon, and take one of the parent's slots. In the child every call
        raises RingReleased; the parent's ring keeps all its slots."""
        rc, out = _run("""
            import gc, os
            ring = _native.NativeRing(8)
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    ring.offload(1, 0, 4096, timeout=0.0)
                    code = 3  # submitted into the parent's ring (4: and not closed)
                except _native.RingReleased:
                    pass
                if not ring.closed:
                    code = 4
                del ring
                gc.collect()  # frees the child's mapping only
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            print("child exit", os.waitstatus_to_exitcode(status))
            taken = 0
            try:
                for _ in range(8):
                    ring.offload(1, 0, 4096, timeout=0.0)
                    taken += 1
            except _native.RingFull:
                pass
            print("parent took", taken, "pending", ring.pending, "closed", ring.closed)
            """)
        self.assertEqual(rc, 0, out)
        self.assertIn("child exit 0", out)
        self.assertIn("parent took 8 pending 8 closed False", out)


if __name__ == "__main__":
    unittest.main()
