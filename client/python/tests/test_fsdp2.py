"""Two ranks with torch.distributed (gloo, CPU) and FSDP2 ``fully_shard``, each its own session
on one daemon: Transformers' checkpoint offload through offloadd gives every local gradient shard
bit for bit as without offload, and ``offloadctl sessions`` lists both ranks' sessions during the
step (between forward and backward). The ranks are fsdp2_worker.py processes.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

from daemon_fixture import REPO, DaemonTestCase, free_port

import qwen3_fixture as q

OFFLOADCTL = ("bazel-bin/client/cli/offloadctl", "build/bin/offloadctl",
              "bazel-out/k8-opt/bin/client/cli/offloadctl")


def offloadctl():
    for p in OFFLOADCTL:
        path = os.path.join(REPO, p)
        if os.access(path, os.X_OK):
            return path
    raise RuntimeError("offloadctl not built (bazel build //client/cli:offloadctl)")



class Fsdp2Test(DaemonTestCase):
    POOL_BYTES = "128MiB"
    WORLD = 2

    def test_two_fsdp2_ranks_bitwise_equal_with_both_sessions_listed(self):
        here = os.path.dirname(os.path.abspath(__file__))
        port = str(free_port())
        with tempfile.TemporaryDirectory(prefix="ofd-fsdp2-") as sync:
            procs = [subprocess.Popen(
                [sys.executable, os.path.join(here, "fsdp2_worker.py"), str(r), str(self.WORLD),
                 port, self.daemon.sock, sync], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                text=True, cwd=here) for r in range(self.WORLD)]
            try:
                sessions = self.sessions_during_the_step(procs, sync)
                results = []
                for p in procs:
                    out, err = p.communicate(timeout=300)
                    self.assertEqual(p.returncode, 0, err[-3000:])
                    results.append(json.loads(out.strip().splitlines()[-1]))
            finally:
                for p in procs:
                    if p.poll() is None:
                        p.kill()
                        p.communicate()
        layers = q.SMALL_CONFIG["num_hidden_layers"]
        for r in results:
            self.assertTrue(r["equal"], "rank %d: offload changed a gradient shard" % r["rank"])
            self.assertEqual((r["offloaded"], r["reloaded"], r["fallbacks"]), (layers, layers, 0))
        pids = {s["pid"] for s in sessions}
        self.assertEqual(pids, {r["pid"] for r in results}, sessions)
        self.assertEqual(self.daemon.stats().blocks, 0)

    def sessions_during_the_step(self, procs, sync):
        """Waits until every rank finished its offloaded forward, lists the daemon's sessions
        with offloadctl, then lets the ranks run backward."""
        import time
        deadline = time.monotonic() + 240
        while not all(os.path.exists(os.path.join(sync, "forward-%d" % r))
                      for r in range(self.WORLD)):
            for p in procs:
                if p.poll() is not None:
                    self.fail("a rank exited early: %s" % p.stderr.read()[-3000:])
            if time.monotonic() > deadline:
                self.fail("the ranks did not finish forward in time")
            time.sleep(0.1)
        out = subprocess.run([offloadctl(), "--socket", self.daemon.sock, "sessions", "--json"],
                             capture_output=True, text=True, timeout=30)
        open(os.path.join(sync, "go"), "w").close()
        self.assertEqual(out.returncode, 0, out.stderr)
        sessions = json.loads(out.stdout)
        sessions = sessions.get("sessions", sessions) if isinstance(sessions, dict) else sessions
        holding = [s for s in sessions if int(s.get("blocks", 0)) > 0]
        self.assertEqual(len(holding), self.WORLD, out.stdout)
        return holding


if __name__ == "__main__":
    unittest.main()
