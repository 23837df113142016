"""Threads sharing one offload context (one Store) against a real daemon (shm backend).

Each thread runs forward under the shared context and then its own backward; the threads' saved
tensors interleave in the store's order, and a tensor several threads save at once (the shared
input batch) is one handle that several threads' backwards unpack at the same time. Every
backward must finish with the exact gradients of the run without offload, with the request ring
and without it.
"""

import os
import threading
import unittest
import warnings
from unittest import mock

import torch
from daemon_fixture import DaemonTestCase, InterruptingLock

import offloadd.torch as ot
from offloadd import errors
from offloadd.torch import _endpoint
from offloadd.torch._store import KEPT
from offloadd.torch._transport import Meta, ReloadOp, ShmTransport

torch.set_num_threads(1)

THREADS, ITERATIONS, LAYERS, N = 4, 150, 6, 256


def forward(x, w):
    for _ in range(LAYERS):
        x = torch.tanh(x @ w)
    return x.sum()


class SharedContextThreadsTest(DaemonTestCase):
    POOL_BYTES = "256MiB"

    def run_threads(self, ring, keep_last_n=0):
        with mock.patch.dict(os.environ, {"OFFLOADD_RING": "1" if ring else "0"}):
            _endpoint.reset_for_tests()
            g = torch.Generator().manual_seed(0)
            x = torch.randn(N, N, generator=g) / 16
            w = (torch.randn(N, N, generator=g) / 16).requires_grad_()
            reference = torch.autograd.grad(forward(x, w), w)[0]
            ctx = ot.offload_checkpoints(threshold_bytes=1 << 14, keep_last_n=keep_last_n,
                                         prefetch=2, socket_path=self.daemon.sock)
            failures, wrong, done = [], [], []

            def work():
                for _ in range(ITERATIONS):
                    try:
                        with ctx:
                            loss = forward(x, w)
                        grad = torch.autograd.grad(loss, w)[0]
                    except Exception as e:  # noqa: BLE001 -- counted, reported below
                        failures.append(repr(e))
                        continue
                    if not torch.equal(grad, reference):
                        wrong.append(1)
                    done.append(1)

            threads = [threading.Thread(target=work) for _ in range(THREADS)]
            for t in threads:
                t.start()
            for t in threads:
                t.join(300)
            self.assertFalse(any(t.is_alive() for t in threads))
            self.assertTrue(ot.synchronize())
            self.assertEqual(failures[:3], [])
            self.assertEqual((len(failures), len(wrong), len(done)),
                             (0, 0, THREADS * ITERATIONS))
            st = ctx.stats
            self.assertGreater(st.offloaded, 0)
            self.assertEqual((st.fallbacks, st.lost), (0, 0))
            self.assertEqual(ctx.store.live_handles(), 0)

    def test_backwards_of_threads_sharing_a_context_with_ring(self):
        self.run_threads(ring=True)

    def test_backwards_of_threads_sharing_a_context_without_ring(self):
        self.run_threads(ring=False)

    def test_backwards_of_threads_sharing_a_context_that_keeps_the_last_two(self):
        """The kept handles wait in one queue for the whole context: one thread's pack offloads
        another thread's kept handle, which that thread's backward may be unpacking (it read
        the handle's tensor after the offload took it: AttributeError on None)."""
        self.run_threads(ring=True, keep_last_n=2)

    def test_a_kept_handle_offloaded_while_its_unpack_runs_is_served_from_the_device(self):
        """The interleaving above made certain: the pack of another thread, which found the
        handle due before this unpack began, offloads it while the unpack runs."""
        g = torch.Generator().manual_seed(0)
        x = torch.randn(N, N, generator=g) / 16
        w = (torch.randn(N, N, generator=g) / 16).requires_grad_()
        reference = torch.autograd.grad(forward(x, w), w)[0]
        ctx = ot.offload_checkpoints(threshold_bytes=1 << 14, keep_last_n=1,
                                     socket_path=self.daemon.sock)
        store, calls = ctx.store, []
        prefetch_before = store._prefetch_before

        def offload_meanwhile(s):
            if not calls:  # the first unpack: the kept handle
                calls.append(s.state)
                store._offload(s)
            prefetch_before(s)
        with mock.patch.object(store, "_prefetch_before", side_effect=offload_meanwhile):
            with ctx:
                loss = forward(x, w)
            grad = torch.autograd.grad(loss, w)[0]
        self.assertEqual(calls, [KEPT])
        self.assertTrue(torch.equal(grad, reference))
        self.assertTrue(ot.synchronize())
        self.assertEqual((ctx.stats.fallbacks, ctx.stats.lost), (0, 0))


IDLE_WARNING = "offloadd: offload is on but"


class InterruptedClaimTest(DaemonTestCase):
    """An interrupt raised as the store's lock is let go, after the unpack claimed a handle's
    reload there, lets the claim go with it: the next unpack reloads the tensor instead of
    waiting forever for a reload no thread is finishing."""

    def test_the_claim_goes_with_the_interrupt(self):
        ctx = ot.offload_checkpoints(threshold_bytes=1 << 12, keep_last_n=0, prefetch=0,
                                     socket_path=self.daemon.sock)
        store, t = ctx.store, torch.arange(4096.0)
        with ctx:
            s = store.pack(t)
        self.assertTrue(ot.synchronize(10.0))
        _endpoint.hooks_pump()
        self.assertEqual(s.state, 2)  # OFFLOADED
        real = store._lock
        store._lock = InterruptingLock(real, "release", lambda: s.reloading)
        try:
            with self.assertRaises(KeyboardInterrupt):
                store.unpack(s)
        finally:
            store._lock = real
        self.assertFalse(s.reloading)
        self.assertTrue(torch.equal(store.unpack(s), t))


class ThreadStepsIdleTest(DaemonTestCase):
    """Idle steps when threads share one context: each thread's step is judged on its own (it
    ends when that thread packs after its backward began), so one thread's backward does not cut
    another thread's step into fragments that look idle."""

    def setUp(self):
        super().setUp()
        _endpoint.reset_for_tests()
        # 64 KiB layer inputs go to the daemon at once; 64-byte ones stay below the threshold.
        self.ctx = ot.offload_checkpoints(threshold_bytes=1 << 14, keep_last_n=0,
                                          socket_path=self.daemon.sock)
        self.w = torch.randn(128, 128, requires_grad=True)
        # A leaf of its own for the small tensors: torch deadlocks when one thread slices a
        # leaf (the GIL held, waiting for the leaf's autograd lock) while another, in an op on
        # the same leaf under saved-tensor hooks, holds that lock and waits for the GIL.
        self.w_small = torch.randn(4, 4, requires_grad=True)
        self.errors = []

    def big(self):
        return (self.w + 0).sin().sum()   # saves a 64 KiB non-leaf: offloaded

    def small(self):
        return (self.w_small + 0).sin().sum()   # saves a 64-byte tensor: left in place

    def run_threads(self, *targets):
        def guarded(target):
            try:
                target()
            except Exception as e:  # noqa: BLE001 -- reported by the test
                self.errors.append(repr(e))

        threads = [threading.Thread(target=guarded, args=(t,)) for t in targets]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        self.assertFalse(any(t.is_alive() for t in threads))
        self.assertEqual(self.errors, [])

    def test_a_pack_after_another_threads_backward_does_not_split_an_idle_step_off(self):
        """Thread B packs a small tensor after thread A's backward began, then A's next step
        packs after B's backward: both of B's packs are one step, which sent a tensor."""
        ctx = self.ctx
        b_sent, a_backward, b_backward = threading.Event(), threading.Event(), threading.Event()

        def thread_a():
            with ctx:
                loss = self.big()
            self.assertTrue(b_sent.wait(30))
            loss.backward()
            a_backward.set()
            self.assertTrue(b_backward.wait(30))
            with ctx:  # A's next step
                loss = self.big()
            loss.backward()

        def thread_b():
            with ctx:
                loss = self.big()
                b_sent.set()
                self.assertTrue(a_backward.wait(30))
                loss = loss + self.small()   # B's forward goes on after A's backward
            loss.backward()
            b_backward.set()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.run_threads(thread_a, thread_b)
            self.assertTrue(ot.synchronize())
        self.assertEqual(ctx.stats.offloaded, 3)
        self.assertEqual((ctx.stats.idle_steps, ot.idle_steps_total()), (0, 0))
        self.assertEqual([str(w.message) for w in caught
                          if str(w.message).startswith(IDLE_WARNING)], [])

    def test_an_idle_step_of_one_thread_is_counted_while_another_thread_sends(self):
        """Thread B's step saves only small tensors while thread A's step offloads: B's step is
        idle (counted once, at synchronize, after B ended), A's is not."""
        ctx = self.ctx
        b_packed, a_backward = threading.Event(), threading.Event()

        def thread_a():
            with ctx:
                loss = self.big()
            self.assertTrue(b_packed.wait(30))
            loss.backward()
            a_backward.set()

        def thread_b():
            with ctx:
                loss = self.small()
            b_packed.set()
            self.assertTrue(a_backward.wait(30))
            loss.backward()

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            self.run_threads(thread_a, thread_b)
            self.assertTrue(ot.synchronize())
            self.assertTrue(ot.synchronize())  # the last steps are counted once
        self.assertEqual((ctx.stats.idle_steps, ot.idle_steps_total()), (1, 1))
        idle = [str(w.message) for w in caught if str(w.message).startswith(IDLE_WARNING)]
        self.assertEqual(len(idle), 1, idle)
        self.assertIn("sent nothing to offloadd: all 1 saved tensors were left in place "
                      "(1 small)", idle[0])

    def test_idle_steps_whose_backward_runs_on_another_thread_end_at_the_next_pack(self):
        """Forward on this thread, backward on a thread that packs nothing into the context (as
        autograd runs a CUDA backward on its device threads): each step ends at the next step's
        first pack, as when one thread runs both."""
        ctx = self.ctx
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                with ctx:
                    loss = self.small()
                self.run_threads(loss.backward)
            self.assertEqual(ctx.stats.idle_steps, 2)
            self.assertTrue(ot.synchronize())
            self.assertTrue(ot.synchronize())
        self.assertEqual((ctx.stats.idle_steps, ot.idle_steps_total()), (3, 3))
        idle = [w for w in caught if str(w.message).startswith(IDLE_WARNING)]
        self.assertEqual(len(idle), 1)


class FreedReloadTest(unittest.TestCase):
    def test_finishing_a_reload_whose_slot_was_freed_is_a_clear_error(self):
        """A reload another thread already finished or abandoned: FAILED_PRECONDITION, not an
        AttributeError from inside the staging arena."""
        transport = ShmTransport.__new__(ShmTransport)
        transport._lock, transport.client, transport.arena = threading.Lock(), None, mock.Mock()
        op = ReloadOp(slot=mock.Mock())
        op.done.set_result(object())
        transport.release_dest(op)
        self.assertEqual(transport.arena.free.call_count, 1)
        with self.assertRaises(errors.OffloaddError) as raised:
            transport.finish_reload(op, Meta(torch.zeros(4)))
        self.assertEqual(raised.exception.code, errors.FAILED_PRECONDITION)
        self.assertIn("already freed", str(raised.exception))
        self.assertEqual(transport.arena.free.call_count, 1)  # freed once, not twice


class StalePrefetchTest(unittest.TestCase):
    def test_a_prefetch_of_a_handle_another_thread_already_reloaded_sends_nothing(self):
        """A prefetch chosen before another thread's unpack reloaded the handle (the daemon freed
        the block: block_id None): no reload of block None reaches the client; the staging slot
        prepared for it is given back."""
        from offloadd.torch import _store
        store = _store.Store.__new__(_store.Store)
        store._lock, store._lanes = threading.Lock(), {}
        s = _store.Saved(store, 0, torch.zeros(4))
        s.state, s.block_id = _store.OFFLOADED, None
        s.ep = mock.Mock(pid=os.getpid())
        rl = mock.Mock()
        s.ep.transport.prepare_reload.return_value = rl
        self.assertIsNone(store._start_reload(s, _store.PREFETCH))
        s.ep.transport.send_reload.assert_not_called()
        s.ep.transport.abandon_reload.assert_called_once_with(rl)
        self.assertIsNone(s.reload)
        s.block_id = 7  # offloaded and not reloaded yet: sent with its block id
        self.assertIs(store._start_reload(s, _store.PREFETCH), rl)
        s.ep.transport.send_reload.assert_called_once_with(rl, 7, _store.PREFETCH,
                                                           release_after=True)
        s.dead = True  # keep Saved.__del__ quiet
        s.state = _store.KEPT


if __name__ == "__main__":
    unittest.main()


class GiveUpHasOneOwnerTest(unittest.TestCase):
    """Two threads on one context both find the daemon frozen and both give its session up:
    the second call returns only after the first has turned every offload in flight into a
    fallback and closed the staging memory; before, it returned at once, found its own tensor
    still in flight and raised it lost (or the first's copies failed on closed staging)."""

    class _FakeEndpoint:
        def __init__(self, log, inside, proceed):
            self.giving_up = None
            self.log = log
            test = self

            class _Client:
                def abandon(self, failure):
                    log.append("fail_all begins")
                    _endpoint.abandon(test, failure)  # a callback giving up again: no wait
                    inside.set()
                    proceed.wait(10)
                    log.append("fail_all ends")

            class _Transport:
                def close(self):
                    log.append("staging closed")

            self.client, self.transport = _Client(), _Transport()

    def test_a_second_give_up_waits_for_the_first(self):
        log, inside, proceed = [], threading.Event(), threading.Event()
        ep = self._FakeEndpoint(log, inside, proceed)
        failure = errors.DaemonUnresponsive("frozen")
        first = threading.Thread(target=_endpoint.abandon, args=(ep, failure, 0.0))
        first.start()
        self.assertTrue(inside.wait(10))

        def second():
            _endpoint.abandon(ep, failure, 0.0)
            log.append("second returned")
        other = threading.Thread(target=second)
        other.start()
        other.join(0.3)
        self.assertTrue(other.is_alive(), "the second give-up returned before the first ended")
        proceed.set()
        first.join(10)
        other.join(10)
        self.assertEqual(log, ["fail_all begins", "fail_all ends", "staging closed",
                               "second returned"])
        _endpoint.abandon(ep, failure, 0.0)  # after it: returns at once, does nothing again
        self.assertEqual(log.count("staging closed"), 1)
