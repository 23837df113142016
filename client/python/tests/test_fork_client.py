"""A process forked after it opened an offloadd session (fork_client_worker.py, real daemon).

The child must not use its parent's session (stream, request ring, request ids): a direct
Client raises FAILED_PRECONDITION in the child, backward of a graph the parent offloaded raises
the same there, while offload in the child works through a session of its own; the parent's
reloads then still return its exact bytes. With the request ring and without it.
"""

import json
import os
import subprocess
import sys
import unittest

from daemon_fixture import PY_ROOT, DaemonTestCase

HERE = os.path.dirname(os.path.abspath(__file__))


class ForkedClientTest(DaemonTestCase):
    def run_worker(self, ring):
        env = dict(os.environ, OFFLOADD_RING="1" if ring else "0",
                   PYTHONPATH=os.pathsep.join([HERE, PY_ROOT, os.environ.get("PYTHONPATH", "")]))
        r = subprocess.run([sys.executable, os.path.join(HERE, "fork_client_worker.py"),
                            self.daemon.sock], env=env, capture_output=True, text=True,
                           timeout=240)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(out["client"], {"child_codes": ["FAILED_PRECONDITION"] * 4,
                                         "parent_exact": True})
        hooks = out["hooks"]
        self.assertEqual(hooks["child_code"], "FAILED_PRECONDITION")
        self.assertTrue(hooks["child_own_exact"])
        self.assertEqual(hooks["child_offloaded"], 5)  # its own step's; the parent's stay its
        self.assertTrue(hooks["own_first_exact"])
        self.assertEqual(hooks["own_first_offloaded"], 5)  # x and the four tanh outputs
        self.assertEqual(hooks["own_first_inherited_code"], "FAILED_PRECONDITION")
        self.assertTrue(hooks["parent_exact"])
        self.assertEqual(hooks["parent_reloaded"], hooks["parent_offloaded"])

    def test_forked_child_with_ring(self):
        self.run_worker(ring=True)

    def test_forked_child_without_ring(self):
        self.run_worker(ring=False)


if __name__ == "__main__":
    unittest.main()


class ForkedChildStateTest(unittest.TestCase):
    """What a forked child keeps of its parent's client state (no daemon: nothing to connect)."""

    def test_a_child_counts_and_reports_from_zero(self):
        """The child kept its parent's acked report totals as the base of its own session's
        first report (negative, refused: the daemon never counted the child's fallbacks) and
        its parent's statistics in every store."""
        import offloadd.torch as ot
        from offloadd.torch import _endpoint
        ctx = ot.offload_checkpoints(socket_path="/nonexistent/offloadd.sock", name="fork")
        ctx.stats.add(offloaded=3, fallbacks=2)
        _endpoint._acked[("/nonexistent/offloadd.sock", "cpu")] = {"fallbacks_total": 80}
        self.addCleanup(_endpoint._acked.clear)
        pid = os.fork()
        if pid == 0:  # the child: exit status 0 only when it starts from zero
            clean = not _endpoint._acked and ctx.stats.offloaded == 0 and \
                ctx.stats.fallbacks == 0
            os._exit(0 if clean else 1)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertEqual((ctx.stats.offloaded, ctx.stats.fallbacks), (3, 2))  # the parent's stay
