"""A training step of the seed's random Qwen3 survives a daemon SIGKILLed and restarted on its
shared pool (pool_shm_name): between forward and backward, and in the middle of forward. The
torch hooks' client reconnects and resumes by itself; loss and every gradient are bitwise equal
to the run without offload, with 0 fallbacks and 0 lost (docs/failure-modes.md).

qwen3_fixture.SEED_CONFIG at batch 2 x sequence 2048, fp32, Transformers' checkpoint offload
through offloadd.transformers.enable (keep_last_n=0): 8 layer inputs of 8 MiB go to the daemon.
Three steps of ~30-50 s each on 2 cores.

Run: tests/python/run.sh -k torch_restart.
"""

import os
import time
import secrets
import threading
import unittest

import torch
from daemon_fixture import Daemon

import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q

torch.set_num_threads(2)
LAYERS = q.SEED_CONFIG["num_hidden_layers"]


class TorchRestartTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.model = q.make_model(seed=0, max_seq=q.SEED_SEQ, **q.SEED_CONFIG)
        cls.ids = q.batch(q.SEED_CONFIG["vocab_size"], q.SEED_BATCH, q.SEED_SEQ)
        q.set_checkpointing(cls.model, "none")
        cls.reference = q.step(cls.model, cls.ids)
        q.set_checkpointing(cls.model, "offload")

    def setUp(self):
        ot._endpoint.reset_for_tests()
        self.pool = "offloadd-py-torch-restart-%d-%s" % (os.getpid(), secrets.token_hex(4))
        self.extra = ("--pool_shm_name", self.pool, "--resume_grace_seconds", "60")
        self.daemons = [Daemon("256MiB", self.extra)]
        self.starter, self.release = None, threading.Event()

    def tearDown(self):
        otf.disable()
        ot._endpoint.reset_for_tests()
        for d in self.daemons:
            d.stop()
        self.release.set()
        if self.starter is not None:
            self.starter.join()
        try:
            os.unlink("/dev/shm/" + self.pool)
        except OSError:
            pass

    def restart(self, down_seconds=0.0):
        """SIGKILLs the daemon and starts another on the same socket and pool object: at once,
        on this thread, or ``down_seconds`` later from a thread that stays until tearDown (the
        daemon's PR_SET_PDEATHSIG follows the thread that started it), so that backward runs
        while the daemon is down."""
        first = self.daemons[-1]
        first.kill()
        if not down_seconds:
            self.daemons.append(Daemon("256MiB", self.extra, sock=first.sock))
            return

        def start_later():
            time.sleep(down_seconds)
            self.daemons.append(Daemon("256MiB", self.extra, sock=first.sock))
            self.release.wait()
        self.starter = threading.Thread(target=start_later)
        self.starter.start()

    def run_step(self, kill_after_packs=None, kill_between=False, down_seconds=0.0, **enable):
        ctx = otf.enable(keep_last_n=0, socket_path=self.daemons[0].sock, **enable)

        def between():
            if kill_between:
                self.assertTrue(ot.synchronize(), "offloads did not complete")
                self.assertEqual(self.daemons[-1].stats().blocks, LAYERS)
                self.restart(down_seconds)
        packs = [0]

        def wrap(inner):
            def pack(t, *a, **k):
                r = inner(t, *a, **k)
                packs[0] += 1
                if packs[0] == kill_after_packs:  # offloads of earlier layers are in flight
                    self.restart()
                return r
            return pack
        undo = q.wrap_packs(ctx.store, wrap)
        try:
            result = q.step(self.model, self.ids, between)
        finally:
            undo()
        self.assertTrue(ot.synchronize(), "releases did not complete")
        clients = [ep.client for ep in ot._endpoint.endpoints()]
        return result, ctx.store.stats.snapshot(), clients

    def check(self, result, stats, clients):
        self.assertTrue(q.bitwise_equal(result, self.reference),
                        "loss or gradients differ from the run without offload")
        self.assertEqual((stats.offloaded, stats.reloaded, stats.fallbacks, stats.lost),
                         (LAYERS, LAYERS, 0, 0))
        self.assertEqual(ot.fallbacks_total(), 0)
        self.assertEqual([c.counters.resumes for c in clients], [1])
        after = self.daemons[-1].stats()
        self.assertEqual((after.blocks, after.pool_used_bytes), (0, 0))

    def test_sigkill_between_forward_and_backward(self):
        self.check(*self.run_step(kill_between=True))
        self.assertEqual(len(self.daemons), 2)

    def test_a_restart_slower_than_unresponsive_seconds_is_not_taken_for_a_freeze(self):
        # A refusing socket says the daemon is down, not frozen; a connect attempt on it used
        # to wait out connect_timeout_seconds (5) while backward's silence bound (1.5) ran out.
        self.check(*self.run_step(kill_between=True, down_seconds=3.0,
                                  unresponsive_seconds=1.5))
        self.starter.join(0)  # started, and waiting for tearDown
        self.assertEqual(len(self.daemons), 2)

    def test_sigkill_in_the_middle_of_forward(self):
        self.check(*self.run_step(kill_after_packs=LAYERS // 2))
        self.assertEqual(len(self.daemons), 2)


if __name__ == "__main__":
    unittest.main()
