"""What an adversarial pass over the torch client found (each test failed before its fix):
a saved tensor modified in place after saving, prefetches of tensors backward never uses, a
prefetch waiting for staging room, processes forked with an endpoint open; and a daemon that left
the socket directories it created behind (clients' default socket path follows /run/offloadd)."""

import json
import os
import shutil
import subprocess
import sys
import tempfile
import unittest

import torch
from daemon_fixture import THRESHOLD, Daemon, DaemonTestCase

import offloadd.torch as ot
from offloadd.torch._transport import Meta

torch.set_num_threads(2)


class InPlaceTest(DaemonTestCase):
    def test_modified_after_saving_raises_like_torch(self):
        for keep in (0, 5):
            with self.subTest(keep_last_n=keep):
                ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, keep_last_n=keep,
                                             threshold_bytes=THRESHOLD)
                w = torch.randn(128, 128, requires_grad=True)
                with ctx:
                    x = torch.randn(64, 128) * 1.0
                    y = (x @ w).sin()   # saves x (for w's grad) and x @ w
                    x.add_(1.0)         # modifies a saved tensor
                with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
                    y.sum().backward()

    def test_unmodified_tensors_still_pass(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, keep_last_n=0,
                                     threshold_bytes=THRESHOLD)
        w = torch.randn(128, 128, requires_grad=True)
        with ctx:
            x = torch.randn(64, 128) * 1.0
            y = (x @ w).relu_()         # in place on the op's own output before it is saved
        y.sum().backward()
        self.assertEqual(ctx.stats.lost, 0)
        self.assertGreater(ctx.stats.offloaded, 0)


class UnusedBranchTest(DaemonTestCase):
    def test_a_branch_backward_never_reaches_is_not_prefetched_after_the_first_step(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, keep_last_n=0,
                                     threshold_bytes=THRESHOLD)
        lin = [torch.nn.Linear(128, 128) for _ in range(8)]
        for step in range(3):
            ctx.stats.reset()
            aux = []
            before = self.daemon.stats()
            with ctx:
                x = torch.randn(64, 128)
                for layer in lin:
                    x = torch.tanh(layer(x))
                    aux.append(x.exp())     # saved (exp saves its output), never backwarded
            x.sum().backward()
            del aux
            self.assertTrue(ot.synchronize())
            after = self.daemon.stats()
            s = ctx.stats
            self.assertEqual(after.reloads_total - before.reloads_total,
                             s.reloaded + s.prefetched_unused)
            self.assertEqual((s.offloaded, s.reloaded), (17, 9))   # x0, 8 tanh, 8 exp outputs
            self.assertEqual(after.blocks, 0)
            if step > 0:   # learned from the first step: the unused positions are skipped
                self.assertEqual(s.prefetched_unused, 0, s.summary())
                self.assertEqual(s.urgent, 1, s.summary())


class PrefetchNeverWaitsTest(DaemonTestCase):
    def test_a_prefetch_does_not_wait_for_staging_room(self):
        from offloadd.torch import _endpoint
        saved = _endpoint.STAGING_MAX_BYTES
        _endpoint.STAGING_MAX_BYTES = 64 << 20
        try:
            ep, reason = _endpoint.get(self.daemon.sock, torch.device("cpu"))
        finally:
            _endpoint.STAGING_MAX_BYTES = saved
        self.assertIsNotNone(ep, reason)
        tr = ep.transport
        meta = Meta(torch.empty(tr.arena.max_bytes // 4 + 1, dtype=torch.uint8))
        held = []
        try:
            for _ in range(3):          # three of these fit in max_bytes, a fourth does not
                held.append(tr.prepare_reload(meta))
            with self.assertRaises(TimeoutError):
                tr.prepare_reload(meta, wait=False)
        finally:
            for op in held:
                tr.release_dest(op)


class ForkTest(DaemonTestCase):
    def test_forked_children_exit_and_release_their_blocks(self):
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run([sys.executable, os.path.join(here, "fork_worker.py"),
                            self.daemon.sock], capture_output=True, text=True, timeout=300,
                           cwd=here)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        out = json.loads(r.stdout.strip().splitlines()[-1])
        self.assertEqual(out, {"parent_ok": True, "fork_exit_code": 0, "fork_released": True,
                               "mp_released": True, "mp_exit_code": 0})
        self.assertEqual(self.daemon.stats().blocks, 0)


if __name__ == "__main__":
    unittest.main()


class SocketDirectoryTest(unittest.TestCase):
    def test_directories_the_daemon_created_go_at_its_stop_and_others_stay(self):
        base = tempfile.mkdtemp(prefix="ofd-dir-")
        self.addCleanup(shutil.rmtree, base, True)
        made = os.path.join(base, "a")
        sock = os.path.join(made, "b", "s.sock")
        Daemon(sock=sock).stop()
        self.assertFalse(os.path.exists(made))  # both levels it made are gone
        self.assertTrue(os.path.isdir(base))    # it existed before: stays
        d = Daemon(sock=sock)
        keep = os.path.join(made, "keep")
        open(keep, "w").close()  # someone else uses the outer one meanwhile
        d.stop()
        self.assertFalse(os.path.exists(os.path.join(made, "b")))
        self.assertTrue(os.path.exists(keep))
