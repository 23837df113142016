"""Non-root on both sides, end to end: the daemon as uid 10001 with the shipped ConfigMap (as the
image and DaemonSet run it), training processes as other uids (nonroot_e2e.py has the set-up).

A member of the socket's group (uid 10002, group 2000) finds the daemon at the default socket
path without configuring one, its Transformers hooks offload every layer input (strict: a
fallback would raise) with a result bitwise equal to plain checkpointing, and a GaLore projector
refresh matches torch.linalg.svd's: its staging objects are 0660 in group 2000, which the daemon
can open. A user in no group gets, within 1 s, one error naming the socket's directory, its
group and the remedy, one warning from the hooks, and `offloadctl health` says the same.
Needs root (setpriv, a private mount namespace); skipped otherwise.
Run: tests/python/run.sh -k non_root
"""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

from daemon_fixture import daemon_bin

HERE = os.path.dirname(os.path.abspath(__file__))


def ctl_bin():
    """offloadctl beside the daemon binary (build/bin), else where Bazel leaves it."""
    near = os.path.join(os.path.dirname(daemon_bin()), "offloadctl")
    if os.access(near, os.X_OK):
        return near
    repo = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
    for p in ("bazel-bin/client/cli/offloadctl", "build/bin/offloadctl"):
        if os.access(os.path.join(repo, p), os.X_OK):
            return os.path.join(repo, p)
    raise RuntimeError("offloadctl not found: make build")


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv") and shutil.which("unshare"),
                     "needs root, setpriv and unshare to act as other uids")
class NonRootEndToEndTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.work = tempfile.mkdtemp(prefix="ofd-nonroot-", dir="/tmp")
        os.chmod(cls.work, 0o755)
        # Binaries the other uids can run (bazel-bin lies under root's home).
        for name, src in (("offloadd", daemon_bin()), ("offloadctl", ctl_bin())):
            shutil.copy(src, os.path.join(cls.work, name))
        r = subprocess.run(["unshare", "--mount", "--propagation", "private", sys.executable,
                            os.path.join(HERE, "nonroot_e2e.py"), cls.work,
                            os.path.join(cls.work, "offloadd"),
                            os.path.join(cls.work, "offloadctl")],
                           capture_output=True, text=True, timeout=900)
        if r.returncode != 0 or not r.stdout.strip():
            raise AssertionError("nonroot_e2e.py failed (%d):\n%s\n%s"
                                 % (r.returncode, r.stdout[-3000:], r.stderr[-3000:]))
        cls.r = json.loads(r.stdout.strip().splitlines()[-1])

    @classmethod
    def tearDownClass(cls):
        shutil.rmtree(cls.work, ignore_errors=True)

    def test_daemon_serves_as_uid_10001_with_the_shipped_socket_group(self):
        self.assertEqual(self.r["socket"], {"uid": 10001, "gid": 2000, "mode": 0o660},
                         self.r["daemon_log"])
        self.assertEqual(self.r["daemon_rc"], 0, self.r["daemon_log"])
        with open("/proc/self/mountinfo") as f:
            shm = [l.split(" - ", 1)[1] for l in f if l.split()[4] == "/dev/shm"]
        if shm and "huge=" not in shm[-1].split()[2]:
            # The ConfigMap asks for huge pages, which this /dev/shm (huge=never) cannot give.
            self.assertIn("pool_huge_pages is set, but the shared pool", self.r["daemon_log"])

    def test_member_hooks_and_galore_reach_the_daemon(self):
        m = self.r["member"]
        self.assertEqual(m["rc"], 0, m["stderr"] + self.r["daemon_log"])
        self.assertEqual(m["socket"], "/run/offloadd/offloadd.sock", "not the default path")
        self.assertEqual(m["daemon_uid"], 10001)
        self.assertEqual((m["shm_mode"], m["shm_gid"]), (0o660, 2000))
        self.assertEqual(m["offloaded"], 2, "both layer inputs go to the daemon")
        self.assertEqual(m["reloaded"], 2)
        self.assertEqual(m["fallbacks"], 0)
        self.assertTrue(m["bitwise_equal"])
        self.assertLess(m["galore_max_error"], 1e-3)
        self.assertEqual(self.r["member_health"]["stdout"], "SERVING\n",
                         self.r["member_health"])

    def test_outsider_gets_one_clear_error_within_a_second(self):
        o = self.r["outsider"]
        self.assertEqual(o["rc"], 0, o["stderr"])
        self.assertEqual(o["error"], "SocketPermissionDenied")
        self.assertEqual(o["code"], "PERMISSION_DENIED")
        self.assertLess(o["seconds"], 1.0)
        for words in ("/run/offloadd/offloadd.sock", "its directory /run/offloadd",
                      "gid 2000", "uid 10003", "do not restart it", "usermod -aG 2000",
                      "supplementalGroups"):
            self.assertIn(words, o["message"])
        self.assertNotIn("stale", o["message"])
        # The hooks keep the tensors in the process and say so once, with the same reason.
        self.assertTrue(o["hooks_bitwise_equal"])
        self.assertEqual(len(o["warnings"]), 1, o["warnings"])
        self.assertIn("its directory /run/offloadd", o["warnings"][0])
        self.assertLess(o["hooks_seconds"], 60)
        h = self.r["outsider_health"]
        self.assertEqual(h["rc"], 1)
        self.assertLess(h["seconds"], 1.0)
        self.assertIn("its directory /run/offloadd (group gid 2000, mode 0750)", h["stderr"])
        self.assertNotIn("failed to connect to all addresses", h["stderr"])


if __name__ == "__main__":
    unittest.main()


@unittest.skipUnless(os.geteuid() == 0 and shutil.which("setpriv"),
                     "needs root and setpriv to run offloadctl as another uid")
class SocketNotAdmittingTest(unittest.TestCase):
    """offloadctl run by a user whom the socket file itself does not admit (its directory is
    searchable; the socket is 0660 in a group the user is not in): exit 1 with the socket, its
    group and the remedy, not gRPC's bare connect failure."""

    def test_offloadctl_names_the_socket_its_group_and_the_remedy(self):
        from daemon_fixture import Daemon
        work = tempfile.mkdtemp(prefix="ofd-admit-", dir="/tmp")
        os.chmod(work, 0o755)
        daemon = Daemon("64MiB", (), sock=os.path.join(work, "d.sock"))
        try:
            ctl = os.path.join(work, "offloadctl")
            shutil.copy(ctl_bin(), ctl)  # bazel-bin may lie under root's private home
            os.chmod(ctl, 0o755)
            r = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups",
                                ctl, "--socket", daemon.sock, "stats"],
                               capture_output=True, text=True, timeout=30)
        finally:
            daemon.stop()
            shutil.rmtree(work, ignore_errors=True)
        self.assertEqual(r.returncode, 1, r.stderr)
        self.assertIn("cannot reach unix:%s: permission denied: the socket %s (group root"
                      % (daemon.sock, daemon.sock), r.stderr)
        self.assertIn("groupadd offloadd", r.stderr)
        self.assertNotIn("failed to connect", r.stderr)
