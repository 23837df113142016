"""Two training processes at once against one daemon, each bit-exact.

Both workers (train_worker.py) open their sessions first; the test checks that the daemon has
two sessions open, then lets both train 4 steps at the same time (through offloadd.torch.checkpoint
and the hooks, alternately) and checks each against its own run without offload, bit for bit.
"""

import json
import os
import subprocess
import sys
import unittest

from daemon_fixture import L, DaemonTestCase


class TwoProcessesTest(DaemonTestCase):
    STEPS = 4

    def test_two_training_processes_at_once(self):
        here = os.path.dirname(os.path.abspath(__file__))
        procs = [subprocess.Popen([sys.executable, os.path.join(here, "train_worker.py"),
                                   self.daemon.sock, str(seed), str(self.STEPS)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, text=True, cwd=here)
                 for seed in (1, 2)]
        try:
            for p in procs:
                self.assertEqual(p.stdout.readline().strip(), "connected")
            self.assertEqual(self.daemon.stats().sessions_open, 2)
            for p in procs:
                p.stdin.write("go\n")
                p.stdin.flush()
            results = []
            for p in procs:
                out, err = p.communicate(timeout=300)
                self.assertEqual(p.returncode, 0, err)
                results.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.communicate()
        for r in results:
            self.assertTrue(r["ok"], r)
            self.assertEqual((r["offloaded"], r["fallbacks"]), (self.STEPS * L, 0))
        self.assertNotEqual(results[0]["losses"], results[1]["losses"])
        self.assertEqual(self.daemon.stats().blocks, 0)


if __name__ == "__main__":
    unittest.main()
