"""Fallback: an unreachable, stopped or full daemon never costs a step its gradients.

Tensors the daemon cannot take are kept in-process (counted as fallbacks), with one warning per
process; ``strict=True`` raises instead. A daemon that stops while holding a step's tensors loses
them: that backward raises OffloaddError DATA_LOSS (torch 2.x re-raises a hook's exception from
backward() as the same object), and the following steps fall back and complete.
"""

import gc
import os
import time
import unittest
import warnings

import torch
from daemon_fixture import (L, THRESHOLD, Daemon, DaemonTestCase, bitwise_equal, run_step)

import offloadd.torch as ot
import tiny_lm
from offloadd import errors
from offloadd.client import Client
from offloadd.shm import ShmRegion
from offloadd.torch import _endpoint

torch.set_num_threads(2)


def offloadd_warnings(caught):
    return [w for w in caught if issubclass(w.category, RuntimeWarning) and
            "offloadd" in str(w.message)]


class UnreachableTest(unittest.TestCase):
    SOCK = "/tmp/offloadd-absent-%d.sock" % os.getpid()

    def setUp(self):
        _endpoint.reset_for_tests()

    def test_steps_complete_in_process_with_one_warning(self):
        ctx = ot.offload_checkpoints(socket_path=self.SOCK, threshold_bytes=THRESHOLD,
                                     keep_last_n=0)
        ref = run_step("plain")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            outs = [run_step("offloadd", ctx), run_step("hooks-reentrant", ctx)]
        for out in outs:
            self.assertTrue(bitwise_equal(out, ref))
        self.assertEqual(len(offloadd_warnings(caught)), 1)
        self.assertIn("unreachable", str(offloadd_warnings(caught)[0].message))
        self.assertEqual((ctx.stats.fallbacks, ctx.stats.offloaded), (2 * L, 0))
        self.assertEqual(ot.fallbacks_total(), 2 * L)

    def test_strict_raises(self):
        ctx = ot.offload_checkpoints(socket_path=self.SOCK, threshold_bytes=THRESHOLD,
                                     strict=True)
        with self.assertRaises(errors.OffloaddError) as e:
            run_step("offloadd", ctx)
        self.assertEqual(e.exception.code, errors.UNAVAILABLE)
        self.assertIn("strict", str(e.exception))


class DaemonStopsTest(unittest.TestCase):
    def setUp(self):
        _endpoint.reset_for_tests()
        self.daemon = Daemon("16MiB")

    def tearDown(self):
        _endpoint.reset_for_tests()
        self.daemon.stop()

    def test_stopped_between_steps(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                     keep_last_n=0)
        data = tiny_lm.CharData()
        model, ref_model = (tiny_lm.make_model(data.vocab, L, 64, 4) for _ in range(2))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for step in range(4):
                if step == 2:
                    self.daemon.stop()
                out = run_step("offloadd", ctx, batch_seed=step, model=model)
                ref = run_step("plain", batch_seed=step, model=ref_model)
                self.assertTrue(bitwise_equal(out, ref), "step %d" % step)
        self.assertEqual(len(offloadd_warnings(caught)), 1)
        self.assertEqual((ctx.stats.offloaded, ctx.stats.fallbacks), (2 * L, 2 * L))
        self.assertEqual(ctx.stats.lost, 0)

    def test_stopped_during_forward_loses_what_it_held(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                     keep_last_n=0)
        data = tiny_lm.CharData()
        model = tiny_lm.make_model(data.vocab, L, 64, 4)
        daemon = self.daemon

        def stop_daemon(module, inputs):
            ot.synchronize()  # the inputs of blocks 0..2 are in the pool now
            daemon.stop()
        handle = model.blocks[2].register_forward_pre_hook(stop_daemon)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with self.assertRaises(errors.OffloaddError) as e:  # from backward(), as raised
                run_step("offloadd", ctx, model=model)
            self.assertEqual(e.exception.code, errors.DATA_LOSS)
            self.assertIn("DATA_LOSS", str(e.exception))
            self.assertIn("no longer has it", str(e.exception))
            handle.remove()
            out = run_step("offloadd", ctx, model=model)  # the next step falls back
        self.assertTrue(bitwise_equal(out, run_step("plain")))
        self.assertEqual(len(offloadd_warnings(caught)), 1)
        # Block 2's input was packed (and offloaded) before its forward pre-hook ran; block 3's
        # fell back; backward lost block 2's input and stopped there.
        self.assertEqual(ctx.stats.offloaded, 3)
        self.assertEqual(ctx.stats.lost, 1)
        self.assertEqual(ctx.stats.fallbacks, 1 + L)


class PoolFullTest(DaemonTestCase):
    """A session quota of 80 KiB admits two 32 KiB layer inputs; the others wait 0.2 s for
    space, are refused with RESOURCE_EXHAUSTED and stay in-process."""

    POOL_BYTES = "1MiB"
    EXTRA = ("--session_quota_bytes", "80KiB", "--admission_deadline_seconds", "0.2")

    def test_refused_tensors_fall_back_with_right_gradients(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                     keep_last_n=0)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            out = run_step("offloadd", ctx)
        self.assertTrue(bitwise_equal(out, run_step("plain")))
        st = ctx.stats
        self.assertEqual(st.offloaded + st.fallbacks, L)
        self.assertGreaterEqual(st.fallbacks, 1)
        self.assertGreaterEqual(st.offloaded, 1)
        self.assertEqual(len(offloadd_warnings(caught)), 1)
        self.assertIn("RESOURCE_EXHAUSTED", str(offloadd_warnings(caught)[0].message))
        self.assertTrue(ot.synchronize())
        self.assertEqual(self.daemon.stats().blocks, 0)

    def test_strict_raises_at_the_next_hook(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                     keep_last_n=0, strict=True)
        with self.assertRaises(errors.OffloaddError) as e:  # as raised, pack or unpack
            run_step("offloadd", ctx)
        self.assertEqual(e.exception.code, errors.RESOURCE_EXHAUSTED)
        self.assertIn("RESOURCE_EXHAUSTED", str(e.exception))
        self.assertIn("strict=True", str(e.exception))
        # While the refusal's back-off lasts, the next step raises without asking the daemon,
        # with the refusal's own code.
        with self.assertRaises(errors.OffloaddError) as e:
            run_step("offloadd", ctx)
        self.assertEqual(e.exception.code, errors.RESOURCE_EXHAUSTED)
        self.assertIn("no offloads to it for", str(e.exception))


    def test_a_refused_strict_step_frees_its_blocks_without_the_cycle_collector(self):
        # The refusal raised at the next hook kept the step's graph, and through it the blocks
        # the daemon took, in a reference cycle until Python's collector ran: a loop that
        # catches the error found the pool full step after step.
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                     keep_last_n=0, strict=True)
        gc.disable()
        try:
            code = None
            try:
                run_step("offloadd", ctx)
            except errors.OffloaddError as e:
                code = e.code
            self.assertEqual(code, errors.RESOURCE_EXHAUSTED)
            self.assertTrue(ot.synchronize())
            self.assertEqual(ctx.store.live_handles(), 0)
            self.assertEqual(self.daemon.stats().blocks, 0)
        finally:
            gc.enable()


class PoolHeldFullTest(DaemonTestCase):
    """Another session holds the whole pool: the first step's offloads wait the admission
    deadline and are refused; for retry_seconds afterwards the hooks send the daemon no offload
    (each falls back at once, with the refusal as the reason); once the back-off is over and the
    pool has room, offloads go to the daemon again."""

    POOL_BYTES = "1MiB"
    EXTRA = ("--admission_deadline_seconds", "0.2")
    RETRY_SECONDS = 5.0

    def hold_the_pool(self):
        holder = Client(self.daemon.sock, "holder", "cpu")
        region = ShmRegion(64 << 10)
        rid = holder.register_shm(region.name, region.size_bytes)
        region.unlink()
        for _ in range(64):
            try:
                holder.offload(rid, 0, 64 << 10).result(10)
            except errors.OffloaddError as e:
                self.assertEqual(e.code, errors.RESOURCE_EXHAUSTED)
                return holder, region
        self.fail("a 1 MiB pool took 64 blocks of 64 KiB")

    def test_refusals_back_off_then_offloads_resume(self):
        holder, region = self.hold_the_pool()
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                     keep_last_n=0, retry_seconds=self.RETRY_SECONDS)
        plain = run_step("plain")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.assertTrue(bitwise_equal(run_step("offloadd", ctx), plain))
            refused_at = time.monotonic()
            self.assertEqual((ctx.stats.offloaded, ctx.stats.fallbacks), (0, L))
            self.assertIn("RESOURCE_EXHAUSTED", str(offloadd_warnings(caught)[0].message))
            [ep] = _endpoint.endpoints()
            sent, inner = [], ep.transport.start_offload
            ep.transport.start_offload = lambda *a, **k: sent.append(1) or inner(*a, **k)
            errors_before = self.daemon.stats().errors_total
            for _ in range(3):  # within the back-off: no offload reaches the daemon
                self.assertTrue(bitwise_equal(run_step("offloadd", ctx), plain))
            self.assertLess(time.monotonic() - refused_at, self.RETRY_SECONDS)
            self.assertEqual(sent, [])
            self.assertEqual(self.daemon.stats().errors_total, errors_before)
            self.assertEqual((ctx.stats.offloaded, ctx.stats.fallbacks), (0, 4 * L))
        self.assertEqual(len(offloadd_warnings(caught)), 1)
        holder.close()
        region.close()
        time.sleep(max(refused_at + self.RETRY_SECONDS - time.monotonic(), 0.0) + 0.2)
        self.assertTrue(bitwise_equal(run_step("offloadd", ctx), plain))
        self.assertEqual(len(sent), L)
        self.assertEqual((ctx.stats.offloaded, ctx.stats.fallbacks), (L, 4 * L))
        self.assertTrue(ot.synchronize())
        self.assertEqual(self.daemon.stats().blocks, 0)


if __name__ == "__main__":
    unittest.main()
