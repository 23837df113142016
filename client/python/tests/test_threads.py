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
from unittest import mock

import torch
from daemon_fixture import DaemonTestCase

import offloadd.torch as ot
from offloadd import errors
from offloadd.torch import _endpoint
from offloadd.torch._transport import Meta, ReloadOp, ShmTransport

torch.set_num_threads(1)

THREADS, ITERATIONS, LAYERS, N = 4, 150, 6, 256


def forward(x, w):
    for _ in range(LAYERS):
        x = torch.tanh(x @ w)
    return x.sum()


class SharedContextThreadsTest(DaemonTestCase):
    POOL_BYTES = "256MiB"

    def run_threads(self, ring):
        with mock.patch.dict(os.environ, {"OFFLOADD_RING": "1" if ring else "0"}):
            _endpoint.reset_for_tests()
            g = torch.Generator().manual_seed(0)
            x = torch.randn(N, N, generator=g) / 16
            w = (torch.randn(N, N, generator=g) / 16).requires_grad_()
            reference = torch.autograd.grad(forward(x, w), w)[0]
            ctx = ot.offload_checkpoints(threshold_bytes=1 << 14, keep_last_n=0, prefetch=2,
                                         socket_path=self.daemon.sock)
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
        store._lock = threading.Lock()
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
