"""DeepSpeed activation checkpointing with ``cpu_checkpointing``, against a real daemon.

deepspeed_ckpt_worker.py runs one gloo rank on CPU (DeepSpeed's distributed state stays in that
process): a random 3-layer Qwen3 whose layers use ``deepspeed.checkpointing.checkpoint``, one
step each with ``cpu_checkpointing`` off and on after ``offloadd.deepspeed.enable()``. Each
checkpoint's input is 2 x 256 x 256 fp32 = 512 KiB.

* Off: the daemon counts nothing.
* On, through offloadd: between forward and backward the daemon counts 3 offloads (1.5 MiB) and
  holds 3 blocks; after backward 3 reloads and none held; offloadd's context counts 3 offloaded,
  3 reloaded, no fallback; loss and gradients bitwise those with ``cpu_checkpointing`` off.
* DeepSpeed's shared-memory all-reduce op is not built (checkpointing never uses it).
* DeepSpeed's engine lookup while enabled: offloadd's engine; with ``partition_activations``
  none and one warning (DeepSpeed copies the partitions itself); ``disable()`` restores it.
"""

import importlib.util
import json
import os
import subprocess
import sys
import unittest

from daemon_fixture import PY_ROOT, DaemonTestCase

LAYERS, INPUT_BYTES = 3, 2 * 256 * 256 * 4


@unittest.skipUnless(importlib.util.find_spec("deepspeed"), "deepspeed is not installed")
class DeepSpeedCpuCheckpointingTest(DaemonTestCase):
    POOL_BYTES = "64MiB"

    def test_cpu_checkpointing_reaches_the_daemon_through_offloadd_only(self):
        here = os.path.dirname(os.path.abspath(__file__))
        before = self.daemon.stats()
        r = subprocess.run(
            [sys.executable, os.path.join(here, "deepspeed_ckpt_worker.py"), self.daemon.sock],
            env=dict(os.environ, PYTHONPATH=PY_ROOT + os.pathsep + here), cwd=here,
            capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        result = json.loads(r.stdout.strip().splitlines()[-1])
        # DeepSpeed's shared-memory all-reduce op (a JIT C++ build, minutes on a fresh machine)
        # is left unbuilt: checkpointing never uses it.
        self.assertIs(result["shm_op_built"], False)
        self.assertEqual(result["plain"], {"during": [0, 0, 0], "after": [0, 0]})
        routed = result["offloadd"]
        self.assertEqual(routed["during"], [LAYERS, LAYERS * INPUT_BYTES, LAYERS])
        self.assertEqual(routed["after"], [LAYERS, 0])
        self.assertEqual(routed["stats"], [LAYERS, LAYERS, 0])
        self.assertTrue(routed["equal"], "cpu_checkpointing through offloadd changed the loss "
                                         "or the gradients")
        lookup = result["lookup"]
        self.assertEqual((lookup["on"], lookup["partitioned"], lookup["off"], lookup["restored"]),
                         ("offloadd.deepspeed", True, True, True))
        self.assertEqual(len(lookup["warnings"]), 1, lookup["warnings"])
        self.assertIn("partition_activations", lookup["warnings"][0])
        after = self.daemon.stats()
        self.assertEqual(after.offloads_total - before.offloads_total, LAYERS)
        self.assertEqual(after.reloads_total - before.reloads_total, LAYERS)


if __name__ == "__main__":
    unittest.main()
