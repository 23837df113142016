"""The CLIs say which backend runs: ``offloadd --help`` lists cuda-sim among the backends of the
build, ``offloadctl topo`` / ``stats`` on a cuda-sim daemon say "backend cuda-sim" (its copies
are a timing model), not "cuda", and ``offloadctl bench`` (the shm data path) refuses it saying
what to run instead.

Run: tests/python/run.sh -k cli_backends.
"""

import os
import subprocess
import unittest

from daemon_fixture import REPO, Daemon, daemon_bin


def offloadctl_bin():
    """offloadctl beside the daemon binary the tests use (build/bin, or Bazel's tree)."""
    here = os.path.dirname(daemon_bin())
    for path in (os.path.join(here, "offloadctl"),
                 os.path.join(here, "..", "client", "cli", "offloadctl"),
                 os.path.join(REPO, "bazel-bin", "client", "cli", "offloadctl"),
                 os.path.join(REPO, "build", "bin", "offloadctl")):
        if os.access(path, os.X_OK):
            return path
    return None


class BackendNamesTest(unittest.TestCase):
    def test_help_lists_cuda_sim(self):
        out = subprocess.run([daemon_bin(), "--help"], capture_output=True, text=True,
                             timeout=30).stdout
        line = [l for l in out.splitlines() if l.startswith("Backends in this build:")]
        self.assertEqual(len(line), 1, out)
        self.assertIn("cuda-sim", line[0])
        self.assertIn("shm", line[0])

    def test_topo_and_stats_of_a_cuda_sim_daemon_say_cuda_sim(self):
        ctl = offloadctl_bin()
        if ctl is None:
            self.skipTest("offloadctl not built (bazel build //client/cli:offloadctl)")
        d = Daemon("16MiB", ("--backend", "cuda-sim"))
        try:
            for cmd in ("topo", "stats"):
                out = subprocess.run([ctl, "--socket", d.sock, cmd], capture_output=True,
                                     text=True, timeout=30)
                self.assertEqual(out.returncode, 0, out.stderr)
                self.assertIn("backend cuda-sim", out.stdout, cmd)
            out = subprocess.run([ctl, "--socket", d.sock, "bench"], capture_output=True,
                                 text=True, timeout=60)
            self.assertEqual(out.returncode, 1, out.stdout + out.stderr)
            self.assertIn("runs backend cuda-sim", out.stderr)
            self.assertIn("copy_sim_bench", out.stderr)  # what to run instead
        finally:
            d.stop()


if __name__ == "__main__":
    unittest.main()
