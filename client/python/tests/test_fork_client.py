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
        self.assertGreater(hooks["child_offloaded"], hooks["parent_offloaded"])
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
