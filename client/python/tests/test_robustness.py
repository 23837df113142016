"""What an adversarial pass over the torch client found (each test failed before its fix):
a saved tensor modified in place after saving, prefetches of tensors backward never uses, a
prefetch waiting for staging room, processes forked with an endpoint open, an offload's answer
whose handling raised part way (the unpack waiting on it hung); and a daemon that left the socket
directories it created behind (clients' default socket path follows /run/offloadd)."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import warnings
from unittest import mock

import torch
from daemon_fixture import THRESHOLD, Daemon, DaemonTestCase

import offloadd.torch as ot
from offloadd import errors
from offloadd._outcome import Outcome
from offloadd.torch import _endpoint, _store
from offloadd.torch._stats import OffloadStats
from offloadd.torch._transport import Meta, ShmTransport

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

    def test_modified_after_saving_then_dropped_raises(self):
        # The caller drops the tensor after modifying it: only the handle saw it. Kept in
        # process (keep_last_n), offloaded once due with the changed bytes, or kept as a
        # fallback (no daemon): each raises at unpack instead of giving a wrong gradient.
        cases = (("kept", dict(keep_last_n=5), self.daemon.sock, False),
                 ("offloaded when due", dict(keep_last_n=1), self.daemon.sock, True),
                 ("fallback", dict(keep_last_n=1), self.daemon.sock + ".none", False))
        for name, kw, sock, sent in cases:
            with self.subTest(name):
                ctx = ot.offload_checkpoints(socket_path=sock, threshold_bytes=THRESHOLD,
                                             connect_timeout_seconds=0.5, **kw)
                w = torch.randn(1 << 14, requires_grad=True)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    with ctx:
                        x = torch.randn(1 << 14)
                        y = x * w           # saves x
                        x.add_(1.0)         # modified in place after it was saved
                        del x
                        z = (y * 2.0).exp() # saves a second tensor: x is due at keep_last_n=1
                    ot.synchronize()
                    self.assertEqual(ctx.stats.offloaded > 0, sent)
                    with self.assertRaisesRegex(RuntimeError,
                                                "modified by an inplace operation.*version 1"):
                        z.sum().backward()

    def test_saved_again_after_an_in_place_change_gets_a_handle_of_its_own(self):
        # x saved at version 0 by a node backward never runs (a metric), changed in place, saved
        # again at version 1: plain torch is fine, and the second node must get the changed bytes.
        for keep in (0, 1, 3):
            with self.subTest(keep_last_n=keep):
                w = torch.randn(256, 256, requires_grad=True)
                inp = torch.randn(64, 256)

                def run(ctx):
                    w.grad = None
                    with ctx:
                        x = inp @ w
                        aux = x.sin()   # saves x at version 0; never backwarded
                        x.mul_(2.0)
                        y = x.cos()     # saves x at version 1
                    y.sum().backward()
                    del aux
                    return w.grad.clone()

                expected = run(contextlib.nullcontext())
                got = run(ot.offload_checkpoints(socket_path=self.daemon.sock, keep_last_n=keep,
                                                 threshold_bytes=THRESHOLD))
                self.assertTrue(torch.equal(got, expected))

    def test_the_earlier_save_of_a_tensor_changed_in_place_raises_as_in_torch(self):
        # relu saves its output h; dropout changes h in place; matmul saves h again. Plain torch
        # raises in relu's backward; the hooks must raise too, never hand relu's backward (or
        # matmul's) the other version's bytes.
        for keep in (0, 1, 3):
            with self.subTest(keep_last_n=keep):
                w1 = torch.randn(128, 128, requires_grad=True)
                w2 = torch.randn(128, 128, requires_grad=True)
                with ot.offload_checkpoints(socket_path=self.daemon.sock, keep_last_n=keep,
                                            threshold_bytes=THRESHOLD):
                    h = torch.relu(torch.randn(64, 128) @ w1)
                    torch.nn.functional.dropout(h, 0.5, training=True, inplace=True)
                    out = h @ w2
                    del h
                with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
                    out.sum().backward()

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


def _raising_once(cls, name, exc):
    """Patches ``cls.name`` so that its first call raises a copy of ``exc`` (a fresh object:
    none keeps the frames it was raised through, and their saved tensors, alive); later calls
    run it."""
    real, calls = getattr(cls, name), []

    def once(*args, **kwargs):
        calls.append(1)
        if len(calls) == 1:
            raise type(exc)(*exc.args)
        return real(*args, **kwargs)
    patch = mock.patch.object(cls, name, once)
    patch.exc = exc
    return patch


class OffloadAnswerRaisesTest(DaemonTestCase):
    """The store handles an offload's answer in a callback of its outcome, which swallows what
    the callback raises. When that handling raised part way (a statistics hook, the transport),
    an unpack already waiting on the reload attached to that offload waited for the
    unresponsive bound (20 s) and then gave the session up. Now it gets its tensor, or a
    DATA_LOSS error when no copy is left, at once, and no block stays in the daemon."""

    WAIT_SECONDS = 5.0  # a correctness bound, far below the 20 s the unpack hung for

    def unpack_while_offloading(self, ring, inject, refused=False):
        """Packs a tensor whose offload's answer the test holds; unpacks it on a thread (its
        reload attaches to the offload); hands the answer (or, ``refused``, a refusal) to the
        store under ``inject``. Returns (tensor, what the unpack returned or raised)."""
        with mock.patch.dict(os.environ, {"OFFLOADD_RING": "1" if ring else "0"}):
            _endpoint.reset_for_tests()
            _store._callback_warned[0] = False
            ctx = ot.offload_checkpoints(threshold_bytes=1 << 10, keep_last_n=0, prefetch=0,
                                         socket_path=self.daemon.sock)
            store, held, real = ctx.store, [], ShmTransport.start_offload

            def start_offload(tr, *args, **kwargs):  # the store sees a stand-in outcome
                op = real(tr, *args, **kwargs)
                held.append((tr.client, op.future))
                op.future = Outcome()
                return op

            t = torch.randn(64, 1024)
            with mock.patch.object(ShmTransport, "start_offload", start_offload):
                s = store.pack(t)
            (client, answer), = held
            stored = client.wait(answer, timeout=10)  # the block is in the daemon now
            got = []

            def unpack():
                try:
                    got.append(store.unpack(s))
                except Exception as e:  # noqa: BLE001 -- checked by the test
                    got.append(e.with_traceback(None))

            th = threading.Thread(target=unpack)
            th.start()
            deadline = time.monotonic() + 10
            while s.reload is None and th.is_alive() and time.monotonic() < deadline:
                time.sleep(0.001)
            self.assertIsNotNone(s.reload, "the unpack did not attach its reload")
            outcome = s.op.future
            with warnings.catch_warnings(record=True) as caught, inject:
                warnings.simplefilter("always")
                if refused:
                    outcome.set_exception(errors.OffloaddError(
                        errors.RESOURCE_EXHAUSTED, "the pool is full (injected)"))
                else:
                    outcome.set_result(stored)
            th.join(self.WAIT_SECONDS)
            self.assertFalse(th.is_alive(), "the unpack still waits for a reload never sent")
            said = "offloadd: handling the daemon's answer to an offload raised %r" % (
                inject.exc,)
            self.assertEqual([str(w.message).startswith(said) for w in caught], [True])
            if refused:  # the daemon stored the block this refusal stands in for
                client.wait(client.release(stored.block_id), timeout=10)
            del s
            self.assertTrue(ot.synchronize())
            self.assertEqual(self.daemon.stats().blocks, 0)
            self.assertEqual(store.live_handles(), 0)
            return t, got[0]

    def test_an_unpack_waiting_on_the_reload_gets_its_tensor_at_once(self):
        steps = {
            "a statistics hook": (OffloadStats, "add_offloaded"),
            "freeing the staging slot": (ShmTransport, "finish_offload"),
            "sending the reload": (ShmTransport, "send_reload"),
        }
        for ring in (True, False):
            for step, (cls, name) in steps.items():
                with self.subTest(ring=ring, raises=step):
                    inject = _raising_once(cls, name, RuntimeError("injected"))
                    t, got = self.unpack_while_offloading(ring, inject)
                    self.assertIsInstance(got, torch.Tensor, got)
                    self.assertTrue(torch.equal(got, t))

    def test_a_refusal_whose_copy_cannot_be_kept_fails_the_waiting_unpack_with_data_loss(self):
        for ring in (True, False):
            with self.subTest(ring=ring):
                inject = _raising_once(ShmTransport, "rescue", MemoryError("injected"))
                _, got = self.unpack_while_offloading(ring, inject, refused=True)
                self.assertIsInstance(got, errors.OffloaddError, got)
                self.assertEqual(got.code, errors.DATA_LOSS)
                self.assertIn("no copy of the tensor could be kept", str(got))


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
