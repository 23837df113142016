"""offloadd.galore with several processes against real daemons (gloo on CPU; workers are
galore_worker.py processes).

d. Two DDP ranks on one daemon: every (parameter, step) refresh computed once by the daemon and
   deduplicated for the other rank (the daemon's GetProjectorStats), parameters bitwise equal
   across the ranks after 30 steps, synchronous and asynchronous.
d2. Processes of one uid sharing parameter names with different gradients (2, then 4): every
   projector is the SVD of its own gradient, never zeros.
e. Two daemons as two nodes, two ranks each: parameters bitwise equal across the four ranks; each
   refresh is computed on one node only (parameter n on node n mod 2) and broadcast.
f. Asynchronous mode: every rank adopts each refresh at the same step; the final loss is printed
   beside synchronous mode's.
g. (multi-rank part) A rank whose galore-torch differs: every rank refuses, naming it.
"""

import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch
from daemon_fixture import Daemon

from test_fsdp2 import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "galore_worker.py")
MATRICES, REFRESHES = 14, 6  # 14 GaLore matrices, refreshed at steps 0, 5, ..., 25 of 30


def run_workers(args_per_process, timeout=900):
    procs = [subprocess.Popen([sys.executable, WORKER] + [str(a) for a in args],
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=HERE)
             for args in args_per_process]
    outputs = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=timeout)
            outputs.append((p.returncode, out))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for rc, out in outputs:
        if rc != 0:
            raise AssertionError("worker failed (%d):\n%s" % (rc, out[-4000:]))


class GaloreRanksTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemons = [Daemon("16MiB"), Daemon("16MiB")]

    @classmethod
    def tearDownClass(cls):
        for d in cls.daemons:
            d.stop()

    def ddp(self, world, daemons):
        port = free_port()
        sockets = ",".join(d.sock for d in daemons)
        out = tempfile.mkdtemp(prefix="ofd-galore-ddp-")
        run_workers([("ddp", r, world, port, sockets, out) for r in range(world)])
        results = []
        for r in range(world):
            with open(os.path.join(out, "rank%d.json" % r)) as f:
                results.append(json.load(f))
        params = {phase: [torch.load(os.path.join(out, "rank%d-%s.pt" % (r, phase)))
                          for r in range(world)] for phase in ("sync", "async")}
        return results, params

    def check_equal_across_ranks(self, params, phase):
        first = params[phase][0]
        for r, mine in enumerate(params[phase][1:], 1):
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(first, mine)),
                            "%s: rank %d's parameters differ from rank 0's" % (phase, r))

    def check_asynchronous_adoption(self, results):
        adopted = [r["async"]["adopted"] for r in results]
        self.assertTrue(all(a == adopted[0] for a in adopted), "ranks adopted at other steps")
        # The first refresh waits; later ones are adopted gap // 2 = 2 steps after their step.
        for steps in adopted[0].values():
            self.assertEqual(steps, [0, 7, 12, 17, 22, 27])
        print("\nasynchronous: every rank adopted refreshes at steps %s; final loss sync %.6f, "
              "async %.6f" % (list(adopted[0].values())[0], results[0]["sync"]["losses"][-1],
                              results[0]["async"]["losses"][-1]))

    def test_d_two_ranks_on_one_daemon_share_each_refresh(self):
        results, params = self.ddp(2, self.daemons[:1])
        for phase in ("sync", "async"):
            leader = results[0][phase]
            print("\n%s, 2 ranks on one daemon: computed %d, deduplicated %d, mismatched %d "
                  "(%d refreshes of %d matrices)" % (
                      phase, leader["computed"], leader["deduplicated"], leader["mismatched"],
                      REFRESHES, MATRICES))
            self.assertEqual(leader["computed"], MATRICES * REFRESHES)
            self.assertEqual(leader["deduplicated"], MATRICES * REFRESHES)
            self.assertEqual(leader["mismatched"], 0)
            self.assertFalse(leader["broadcasting"])
            self.assertEqual(results[0][phase]["job_id"], results[1][phase]["job_id"])
            self.assertEqual(sum(r[phase]["stats"]["deduplicated"] for r in results),
                             MATRICES * REFRESHES)
            self.check_equal_across_ranks(params, phase)
        self.check_asynchronous_adoption(results)
        # g: rank 1 reports galore-torch 0.9: both ranks refuse, naming rank 1.
        for r in results:
            self.assertIn("rank 1 has galore-torch '0.9', rank 0 has '1.0'", r["version"])

    def test_e_two_daemons_as_two_nodes_four_ranks(self):
        results, params = self.ddp(4, self.daemons)
        for phase in ("sync", "async"):
            node_a, node_b = results[0][phase], results[2][phase]
            print("\n%s, 4 ranks on 2 daemons: node A computed %d deduplicated %d, node B "
                  "computed %d deduplicated %d" % (phase, node_a["computed"],
                                                  node_a["deduplicated"], node_b["computed"],
                                                  node_b["deduplicated"]))
            self.assertTrue(node_a["broadcasting"])
            # Parameter n on node n mod 2: 7 matrices each, once per refresh, once per node.
            self.assertEqual(node_a["computed"], MATRICES // 2 * REFRESHES)
            self.assertEqual(node_b["computed"], MATRICES // 2 * REFRESHES)
            self.assertEqual(node_a["deduplicated"], MATRICES // 2 * REFRESHES)
            self.assertEqual(node_b["deduplicated"], MATRICES // 2 * REFRESHES)
            self.check_equal_across_ranks(params, phase)
        self.check_asynchronous_adoption(results)

    def same_key(self, processes):
        out = tempfile.mkdtemp(prefix="ofd-galore-key-")
        # Gradients seeded by the index: distinct for every process of every run.
        indices = [100 * processes + i for i in range(processes)]
        run_workers([("same-key", i, self.daemons[1].sock, out) for i in indices])
        checks = []
        for i in indices:
            with open(os.path.join(out, "same-key-%d.json" % i)) as f:
                checks += json.load(f)
        return checks

    def test_d2_same_parameter_ids_with_other_gradients_never_share(self):
        for processes in (2, 4):
            checks = self.same_key(processes)
            worst = max(c["sine"] for c in checks)
            print("\n%d processes sharing parameter names: %d projectors, %d zero, %d "
                  "deduplicated, %d content mismatches, max sin(angle to own SVD) %.1e" % (
                      processes, len(checks), sum(c["zero"] for c in checks),
                      sum(c["deduplicated"] for c in checks),
                      sum(c["mismatch"] for c in checks), worst))
            self.assertEqual(len(checks), processes * 3 * 4)
            self.assertFalse(any(c["zero"] for c in checks))
            self.assertFalse(any(c["deduplicated"] for c in checks))
            self.assertLess(worst, 1e-3)


if __name__ == "__main__":
    unittest.main()
