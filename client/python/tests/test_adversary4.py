"""Attacks on what the Python client does with threads, forks and restarts: a NativeRing used
from a process forked after it was created, and the idle-step count of threads sharing one
context whose backwards run on other threads."""

import queue
import threading
import unittest
import warnings

import torch
from daemon_fixture import DaemonTestCase
from test_native import _run  # a script in a fresh interpreter

import offloadd.torch as ot
from offloadd import _native
from offloadd.client import Client, _RingOp


class ForkedNativeRingTest(unittest.TestCase):
    def test_a_forked_child_cannot_submit_into_its_parents_ring(self):
        """The ring's memory is a shared mapping: a child that submitted on its parent's ring
        would put a request the parent never made (with an id the parent's next request also
        gets) before the daemon, and take one of the parent's slots. In the child every call
        raises RingReleased; the parent's ring keeps all its slots."""
        rc, out = _run("""
            import gc, os
            ring = _native.NativeRing(8)
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    ring.offload(1, 0, 4096, timeout=0.0)
                    code = 3  # submitted into the parent's ring (4: and not closed)
                except _native.RingReleased:
                    pass
                if not ring.closed:
                    code = 4
                del ring
                gc.collect()  # frees the child's mapping only
                os._exit(code)
            _, status = os.waitpid(pid, 0)
            print("child exit", os.waitstatus_to_exitcode(status))
            taken = 0
            try:
                for _ in range(8):
                    ring.offload(1, 0, 4096, timeout=0.0)
                    taken += 1
            except _native.RingFull:
                pass
            print("parent took", taken, "pending", ring.pending, "closed", ring.closed)
            """)
        self.assertEqual(rc, 0, out)
        self.assertIn("child exit 0", out)
        self.assertIn("parent took 8 pending 8 closed False", out)


class _DrainingRing:
    """Stands in for a NativeRing whose drain() returns ``answers`` after running ``meanwhile``
    (what other threads did while this one slept in the drain, the GIL released)."""

    def __init__(self, meanwhile, answers):
        self.meanwhile, self.answers = meanwhile, answers

    def drain(self, timeout=0.0):
        self.meanwhile()
        answers, self.answers = self.answers, []
        return answers

    def wake(self):
        pass


class AnswersOfARetiredRingTest(DaemonTestCase):
    def test_an_old_rings_answer_taken_after_the_resume_does_not_complete_a_new_rings_request(
            self):
        """Every NativeRing numbers its requests from 1, so the ring the resume's Hello
        attached reuses the old ring's ids. A thread that was asleep in a drain of the old ring
        while the session resumed (pump() reads the ring once) and then takes an old answer
        must not complete the new ring's request of the same id with it (another block's id);
        the old request was moved to the stream and is answered there."""
        client = Client(self.daemon.sock, "adv4", ring=True)
        try:
            self.assertTrue(client.ring_active, client.ring_error)
            rid = (1 << 63) | 1
            old_op = _RingOp(client, "offload", (1, 0, 4096, None, None))
            new_op = _RingOp(client, "offload", (1, 0, 4096, None, None))
            new_ring = client._ring_native

            def resumed():  # the stream ended, its ops moved; the resume took a new ring
                with client._lock:
                    client._ring_ops.pop(rid)
                    client._ring_native = new_ring
                    client._ring_ops[rid] = new_op
            old_answer = (rid, _native.OFFLOAD_DONE, 0, 777, 4096, 0.0, 0.0, 0, "")
            with client._lock:
                client._ring_ops[rid] = old_op
                client._ring_native = _DrainingRing(resumed, [old_answer])
            client.pump(0.0)
            self.assertFalse(new_op.done(), new_op.done() and new_op.result())
            self.assertIs(client._ring_ops.get(rid), new_op)
            self.assertNotIn(777, client._confirmed)
            with client._lock:
                client._ring_ops.pop(rid, None)
        finally:
            client.close()


IDLE_WARNING = "offloadd: offload is on but"


class IdleStepsOfOtherThreadsTest(DaemonTestCase):
    """Steps whose backward runs on a thread other than the one that packed them."""

    def setUp(self):
        super().setUp()
        # 64-byte saved tensors stay below the threshold: every step here sends nothing.
        self.ctx = ot.offload_checkpoints(threshold_bytes=1 << 14, keep_last_n=0,
                                          socket_path=self.daemon.sock)
        self.w = torch.randn(4, 4, requires_grad=True)  # a 64-byte saved tensor: left in place

    def small(self):
        return (self.w + 0).sin().sum()

    def test_steps_of_a_thread_per_forward_are_counted_at_the_next_step(self):
        """Each step's forward on a new thread, its backward on this one (which packs nothing
        into the context): a step whose thread ended has no next pack of its own, so it ends
        at the next step's first pack (on another thread), as a single thread's would. Before,
        every such step stayed open until synchronize() (none counted or warned during the
        run, one record kept per step)."""
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(6):
                out = []
                forward = threading.Thread(target=lambda: out.append(self._packed()))
                forward.start()
                forward.join(30)
                out[0].backward()
            self.assertEqual(self.ctx.stats.idle_steps, 5)
            self.assertLessEqual(len(self.ctx.store._open_steps), 1)
            self.assertTrue(ot.synchronize())
            self.assertTrue(ot.synchronize())  # counted once
        self.assertEqual((self.ctx.stats.idle_steps, len(self.ctx.store._open_steps)), (6, 0))
        idle = [str(w.message) for w in caught if str(w.message).startswith(IDLE_WARNING)]
        self.assertEqual(len(idle), 1, idle)

    def _packed(self):
        with self.ctx:
            return self.small()

    # The step of this thread never ends: its backwards run on a worker that packed into the
    # context itself (so its unpacks are not a foreign thread's, and a small tensor's unpack
    # cannot tell whose step saved it). Every step merges into one that never counts, even at
    # synchronize(), so a configuration that sends nothing is never warned about. Not a small
    # fix: the unpack of a tensor left in place carries no mark of the step that packed it.
    @unittest.expectedFailure
    def test_idle_steps_whose_backward_runs_on_a_thread_that_packed_are_counted(self):
        jobs = queue.Queue()

        def worker():
            self._packed().backward()  # the worker's own step: it packs into the context too
            while True:
                job = jobs.get()
                if job is None:
                    return
                job[0].backward()
                job[1].set()

        with warnings.catch_warnings(record=True):
            warnings.simplefilter("always")
            backward_thread = threading.Thread(target=worker)
            backward_thread.start()
            for _ in range(4):
                finished = threading.Event()
                jobs.put((self._packed(), finished))
                self.assertTrue(finished.wait(30))
            jobs.put(None)
            backward_thread.join(30)
            self.assertTrue(ot.synchronize())
        self.assertGreaterEqual(self.ctx.stats.idle_steps, 4)


if __name__ == "__main__":
    unittest.main()
