"""A frozen daemon (SIGSTOP) costs a training step a bounded time, never an unbounded hang.

The hooks' ``unresponsive_seconds`` (20 by default; small here) bounds every wait for a daemon
that answers nothing (docs/failure-modes.md):
  * frozen between forward and backward, past the bound: backward raises DaemonUnresponsive
    (DEADLINE_EXCEEDED, saying the daemon is unresponsive, not that it lost anything) after
    about the bound; the next step keeps its tensors in process and is bitwise equal to the
    run without offload; the daemon, once resumed, frees the abandoned session's blocks;
  * frozen during forward, before any offload was confirmed: the step's tensors come back from
    the client's copies (bitwise equal), after about one bound in backward;
  * frozen with the staging arena full: forward's packs wait about one bound in all, then the
    step keeps the rest in process with one warning;
  * frozen and resumed within the bound (before backward, or during forward): only time is
    lost -- bitwise equal, 0 fallbacks, 0 lost.

Run: tests/python/run.sh -k frozen.
"""

import os
import signal
import threading
import time
import unittest
import warnings

import torch
from daemon_fixture import THRESHOLD, Daemon, bitwise_equal, run_step

import qwen3_fixture as q

import offloadd.torch as ot
from offloadd import errors
from offloadd.torch import _endpoint

torch.set_num_threads(2)
BOUND = 2.0      # unresponsive_seconds of the tests that freeze past it
SLACK = 6.0      # a loaded 2-core machine: how much later than the bound an outcome may come
LAYERS, SEQ = 12, 512   # 12 layer inputs of 2 x 512 x 64 x 4 = 256 KiB


def offloadd_warnings(caught):
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and
            "offloadd" in str(w.message)]


class FrozenDaemonTest(unittest.TestCase):
    def setUp(self):
        _endpoint.reset_for_tests()
        self.daemon = Daemon("64MiB")
        self.frozen = False
        self.staging = (_endpoint.STAGING_GROW_BYTES, _endpoint.STAGING_MAX_BYTES)

    def tearDown(self):
        self.thaw()
        _endpoint.STAGING_GROW_BYTES, _endpoint.STAGING_MAX_BYTES = self.staging
        _endpoint.reset_for_tests()
        self.daemon.stop()

    def freeze(self):
        os.kill(self.daemon.proc.pid, signal.SIGSTOP)
        self.frozen = True

    def thaw(self):
        if self.frozen:
            os.kill(self.daemon.proc.pid, signal.SIGCONT)
            self.frozen = False

    def thaw_after(self, seconds):
        timer = threading.Timer(seconds, self.thaw)
        timer.start()
        return timer

    def context(self, bound, **kw):
        return ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                      keep_last_n=0, unresponsive_seconds=bound, **kw)

    def step(self, ctx, **kw):
        return run_step("offloadd", ctx, layers=LAYERS, s=SEQ, **kw)

    def reference(self):
        return run_step("plain", layers=LAYERS, s=SEQ)

    def wait_blocks(self, n, seconds=15.0):
        deadline = time.monotonic() + seconds
        while self.daemon.stats().blocks != n and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.daemon.stats().blocks

    def test_frozen_between_forward_and_backward_raises_after_the_bound(self):
        ctx = self.context(BOUND)
        model_step = {}

        def forward_then_freeze():
            import tiny_lm
            data = tiny_lm.CharData()
            model = tiny_lm.make_model(data.vocab, LAYERS, 64, 4)
            idx, tgt = data.batch(2, SEQ, torch.Generator().manual_seed(1))
            loss = model(idx, tgt, "offloadd", ctx)
            self.assertTrue(ot.synchronize())
            self.assertEqual(self.daemon.stats().blocks, LAYERS)
            model_step["loss"] = loss
        forward_then_freeze()
        self.freeze()
        t0 = time.monotonic()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = message = None
            try:  # the first unpack waits: the bound passes before any backward compute
                model_step.pop("loss").backward()
            except errors.OffloaddError as e:
                code, message = e.code, str(e)
            took = time.monotonic() - t0
        self.assertEqual(code, errors.DEADLINE_EXCEEDED, message)
        self.assertIn("unresponsive", message)
        self.assertNotIn("no longer has it", message)
        self.assertGreaterEqual(took, BOUND - 0.1)
        self.assertLess(took, BOUND + SLACK)
        self.thaw()
        # The abandoned session's blocks are freed once the daemon runs again.
        self.assertEqual(self.wait_blocks(0), 0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = self.step(ctx)  # within retry_seconds: kept in process
        self.assertTrue(bitwise_equal(out, self.reference()))
        self.assertEqual(len(offloadd_warnings(caught)), 1)

    def test_frozen_during_forward_comes_back_from_the_clients_copies(self):
        ctx = self.context(BOUND)
        t0 = time.monotonic()
        self.step(ctx)  # connects and registers the staging arena
        normal = time.monotonic() - t0
        self.assertTrue(ot.synchronize())
        before = ctx.stats.snapshot()
        self.freeze()
        t0 = time.monotonic()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = self.step(ctx)
        took = time.monotonic() - t0
        self.assertTrue(bitwise_equal(out, self.reference()))
        d = ctx.stats.snapshot() - before
        self.assertEqual((d.offloaded, d.fallbacks, d.lost), (0, LAYERS, 0))
        (warned,) = offloadd_warnings(caught)
        # Said as what happened: the daemon stopped answering, not that it refused anything.
        self.assertIn("offloadd: the offloadd daemon stopped answering before it confirmed a "
                      "tensor's offload (DEADLINE_EXCEEDED: ", str(warned.message))
        self.assertNotIn("refused", str(warned.message))
        self.assertLess(took, normal + BOUND + SLACK)

    def test_packs_stall_one_bound_per_step_when_staging_is_full(self):
        _endpoint.STAGING_GROW_BYTES = _endpoint.STAGING_MAX_BYTES = 1 << 20  # 4 layer inputs
        ctx = self.context(BOUND)
        def timed_step(**kw):
            times = {}

            def wrap(inner):
                def pack(t, *a, **k):
                    times.setdefault("first", time.monotonic())
                    r = inner(t, *a, **k)
                    times["last"] = time.monotonic()
                    return r
                return pack
            undo = q.wrap_packs(ctx.store, wrap, ctx)
            try:
                out = self.step(ctx, **kw)
            finally:
                undo()
            return out, times["last"] - times["first"]
        normal = timed_step()[1]  # also registers the staging arena
        self.assertTrue(ot.synchronize())
        self.freeze()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out, forward = timed_step()
        self.assertGreaterEqual(forward, BOUND - 0.1)
        self.assertLess(forward, normal + BOUND + SLACK)
        self.assertTrue(bitwise_equal(out, self.reference()))
        self.assertEqual(len(offloadd_warnings(caught)), 1)

    def test_resumed_within_the_bound_before_backward_is_exact(self):
        ctx = self.context(30.0)
        before = ctx.stats.snapshot()
        import tiny_lm
        data = tiny_lm.CharData()
        model = tiny_lm.make_model(data.vocab, LAYERS, 64, 4)
        model.zero_grad(set_to_none=True)
        idx, tgt = data.batch(2, SEQ, torch.Generator().manual_seed(1))
        loss = model(idx, tgt, "offloadd", ctx)
        self.assertTrue(ot.synchronize())
        self.freeze()
        timer = self.thaw_after(1.5)
        t0 = time.monotonic()
        loss.backward()
        took = time.monotonic() - t0
        timer.join()
        out = (loss.detach(), [p.grad.detach().clone() for p in model.parameters()])
        self.assertTrue(bitwise_equal(out, self.reference()))
        self.assertGreaterEqual(took, 1.0)
        d = ctx.stats.snapshot() - before
        self.assertEqual((d.offloaded, d.reloaded, d.fallbacks, d.lost),
                         (LAYERS, LAYERS, 0, 0))

    def test_resumed_within_the_bound_during_forward_is_exact(self):
        ctx = self.context(30.0)
        self.step(ctx)
        self.assertTrue(ot.synchronize())
        before = ctx.stats.snapshot()
        packs, timers = [0], []

        def wrap(inner):
            def pack(t, *a, **k):
                r = inner(t, *a, **k)
                packs[0] += 1
                if packs[0] == LAYERS // 2:
                    self.freeze()
                    timers.append(self.thaw_after(1.5))
                return r
            return pack
        undo = q.wrap_packs(ctx.store, wrap, ctx)
        try:
            out = self.step(ctx)
        finally:
            undo()
        for t in timers:
            t.join()
        self.assertTrue(bitwise_equal(out, self.reference()))
        d = ctx.stats.snapshot() - before
        self.assertEqual((d.offloaded, d.reloaded, d.fallbacks, d.lost),
                         (LAYERS, LAYERS, 0, 0))


if __name__ == "__main__":
    unittest.main()


class KeepaliveTest(unittest.TestCase):
    """HTTP/2 keepalive on both sides of the session stream."""

    def setUp(self):
        self.daemon = None
        self.procs = []

    def tearDown(self):
        for p in self.procs:
            try:
                os.kill(p.pid, signal.SIGCONT)
            except OSError:
                pass
            p.kill()
            p.wait()
        if self.daemon is not None:
            os.kill(self.daemon.proc.pid, signal.SIGCONT)
            self.daemon.stop()

    def test_fast_client_pings_are_accepted(self):
        from offloadd.client import Client
        self.daemon = Daemon("16MiB")
        c = Client(self.daemon.sock, keepalive_time_seconds=0.2, keepalive_timeout_seconds=5)
        try:
            time.sleep(3.0)  # ~15 pings without data: a strict server would send GOAWAY
            self.assertTrue(c.alive)
            self.assertEqual(c.release(12345).exception(timeout=10).code, errors.NOT_FOUND)
            self.assertTrue(c.alive)
        finally:
            c.close()

    def test_the_client_drops_a_frozen_daemons_connection(self):
        from offloadd.client import Client
        self.daemon = Daemon("16MiB")
        c = Client(self.daemon.sock, keepalive_time_seconds=0.5, keepalive_timeout_seconds=1.0)
        try:
            os.kill(self.daemon.proc.pid, signal.SIGSTOP)
            deadline = time.monotonic() + 20
            while c.alive and time.monotonic() < deadline:
                time.sleep(0.1)
            self.assertFalse(c.alive, "the stream to a frozen daemon stayed up")
        finally:
            os.kill(self.daemon.proc.pid, signal.SIGCONT)
            c.close(timeout=1.0)

    def test_the_daemon_ends_the_session_of_a_frozen_client(self):
        import subprocess
        import sys
        self.daemon = Daemon("16MiB", ("--keepalive_time_seconds", "0.5",
                                       "--keepalive_timeout_seconds", "1"))
        code = ("import sys, time; sys.path.insert(0, %r); from offloadd.client import Client; "
                "c = Client(%r); print('ready', flush=True); time.sleep(120)"
                % (os.path.join(os.path.dirname(__file__), "..", ""), self.daemon.sock))
        p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        self.assertEqual(p.stdout.readline().strip(), "ready")
        self.assertEqual(self.daemon.stats().sessions_open, 1)
        os.kill(p.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 20
        while self.daemon.stats().sessions_open != 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        self.assertEqual(self.daemon.stats().sessions_open, 0)
