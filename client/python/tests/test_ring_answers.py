"""offloadd._store_front.take_answers (client/core/store_answers.c): the request ring's usual
answers applied in C, and offloadd._ring_fast.submit (client/core/ring_fast_module.c): the
usual submission in one C call, without a daemon. Each case hands it answers in the drain's
shape and checks what it took and what it left to the Python path: the op's record and state,
the client's confirmed blocks, the handle's fields, the transport's free events, the
statistics, and that a callback it replaces never ran. test_hooks' RingAnswersInCTest runs it
through the hooks against a daemon. PumpTest and PumpFallbackTest: offloadd._store_front.pump
(client/core/store_pump.c), Client.pump(0.0) in one C call, against a daemon and fakes."""

import os
import signal
import threading
import time
import unittest
from unittest import mock
import weakref

import torch

from daemon_fixture import PY_ROOT, DaemonTestCase, held_by_another_thread  # noqa: F401
from test_offload_lane import interrupted_after

from offloadd import _native, client as client_mod
from offloadd.client import (Client, Counters, OffloadAnswer, ReleaseAnswer, ReloadAnswer,
                             _RingOp)
from offloadd.shm import ShmRegion
from offloadd.torch._stats import OffloadStats
from offloadd.torch._transport import OffloadOp

front_mod = _native.load_store_front()
take = client_mod._take_answers
OFFLOADING, OFFLOADED = 1, 2


def answer(rid, kind, block=0, nbytes=0, code=0, flags=0, queued=0.25, copy=0.5, message=""):
    """A drain tuple (offloadd._ring_fast.drain)."""
    return (rid, kind, code, block, nbytes, queued, copy, flags, message)


class FakeStore:
    """What a handle's store offers take_answers: its lock and statistics (and a death log)."""

    def __init__(self):
        self._lock = threading.RLock()
        self.stats = OffloadStats("t")
        self.deaths = []

    def _on_death(self, *fields):
        self.deaths.append(fields)


class Offloading:
    """A handle with its offload in flight, as Store._offload leaves it: the op, its OffloadOp
    (source tensor and event), a callback and the target."""

    def __init__(self, nbytes=4096):
        self.nbytes = nbytes
        self.store = FakeStore()
        self.source = torch.zeros(nbytes // 4)
        self.s = front_mod.Saved(self.store, 1, self.source)
        self.op = _RingOp(None, "offload", (1, 0, nbytes, None, None))
        self.event, self.free = object(), []
        self.op.target = (weakref.ref(self.s), self.free)
        self.offload = OffloadOp(self.op, tensor=self.source, event=self.event)
        self.s.state, self.s.op, self.s.tensor = OFFLOADING, self.offload, None
        self.s.sent_version = self.source._version
        self.called = []
        self.op.add_done_callback(self.called.append)

    def take(self, rid=5, block=77):
        ops, confirmed = {rid: self.op}, set()
        left = take([answer(rid, _native.OFFLOAD_DONE, block, self.nbytes)], ops, confirmed)
        return left, ops, confirmed


class PlainAnswersTest(unittest.TestCase):
    def test_a_reload_answer_completes_its_op_as_the_python_path_would(self):
        op = _RingOp(None, "reload", (9, 1, 0, 0, True, 0.0, None, None))
        ops, confirmed = {3: op}, {9, 10}
        flags = _native.FLAG_RELEASED | _native.FLAG_DONE_EVENT_RECORDED
        left = take([answer(3, _native.RELOAD_DONE, 9, 4096, flags=flags)], ops, confirmed)
        self.assertEqual(left, [])
        self.assertEqual(ops, {})
        self.assertEqual(confirmed, {10})  # released: no longer the client's
        self.assertTrue(op.done())
        self.assertEqual(op.result(0), ReloadAnswer(9, 4096, True, 0.5, True))

    def test_an_offload_without_target_and_a_release(self):
        off = _RingOp(None, "offload", (1, 0, 64, None, None))
        rel = _RingOp(None, "release", (12,))
        ops, confirmed = {1: off, 2: rel}, {12}
        left = take([answer(1, _native.OFFLOAD_DONE, 40, 64),
                     answer(2, _native.RELEASED, 0)], ops, confirmed)
        self.assertEqual(left, [])
        self.assertEqual(confirmed, {40})
        self.assertEqual(off.result(0), OffloadAnswer(40, 64, 0.25, 0.5))
        self.assertEqual(rel.result(0), ReleaseAnswer(12))  # the block the release named

    def test_what_is_left_to_python_stays_in_order_and_untouched(self):
        ok = _RingOp(None, "release", (1,))
        waited = _RingOp(None, "release", (2,))
        waited._event = threading.Event()  # a thread waits on it: its wake-up is Python's
        called = []
        with_callback = _RingOp(None, "reload", (3, 1, 0, 0, False, 0.0, None, None))
        with_callback.add_done_callback(called.append)
        mismatch = _RingOp(None, "reload", (4, 1, 0, 0, False, 0.0, None, None))
        failed = _RingOp(None, "release", (5,))
        ops = {1: ok, 2: waited, 3: with_callback, 4: mismatch, 5: failed}
        answers = [answer(1, _native.RELEASED), answer(2, _native.RELEASED),
                   answer(3, _native.RELOAD_DONE, 3), answer(4, _native.OFFLOAD_DONE, 4),
                   answer(5, _native.ERROR, code=5, message="NOT_FOUND"),
                   answer(6, _native.RELEASED)]  # no op: unknown, or moved to the stream
        left = take(answers, ops, set())
        self.assertEqual(left, answers[1:])
        self.assertEqual(sorted(ops), [2, 3, 4, 5])
        self.assertTrue(ok.done())
        for op in (waited, with_callback, mismatch, failed):
            self.assertFalse(op.done())
        self.assertEqual(called, [])

    def test_an_op_done_already_is_left(self):
        op = _RingOp(None, "release", (1,))
        op.set_exception(RuntimeError("failed by the session's end"))
        ops = {1: op}
        self.assertEqual(len(take([answer(1, _native.RELEASED)], ops, set())), 1)
        self.assertIsInstance(op.exception(0), RuntimeError)

    def test_binding_other_classes_is_refused(self):
        with self.assertRaises(RuntimeError):
            front_mod.bind_answers((_native.OFFLOAD_DONE, _native.RELOAD_DONE, _native.RELEASED),
                                   (_native.FLAG_RELEASED, _native.FLAG_DONE_EVENT_RECORDED),
                                   (OffloadAnswer, OffloadAnswer, ReleaseAnswer),
                                   client_mod._outcome.Outcome._lock, _RingOp)
        with self.assertRaises(TypeError):
            take([], {}, [])


class OffloadTargetTest(unittest.TestCase):
    def test_the_handle_takes_its_block_and_the_transport_its_event(self):
        h = Offloading(nbytes=4096)
        left, ops, confirmed = h.take(block=77)
        self.assertEqual(left, [])
        self.assertEqual((ops, confirmed), ({}, {77}))
        self.assertEqual((h.s.state, h.s.block_id, h.s.op), (OFFLOADED, 77, None))
        self.assertEqual(h.free, [h.event])  # back to the pool's free list
        self.assertEqual((h.offload.event, h.offload.tensor), (None, None))
        self.assertEqual((h.store.stats.offloaded, h.store.stats.offloaded_bytes), (1, 4096))
        self.assertEqual(h.called, [])  # the callback is replaced, never run
        self.assertEqual(h.op.result(0), OffloadAnswer(77, 4096, 0.25, 0.5))
        h.s.dead = True

    def assert_left(self, h):
        left, ops, confirmed = h.take()
        self.assertEqual(len(left), 1)
        self.assertEqual((len(ops), confirmed), (1, set()))
        self.assertEqual((h.s.state, h.s.block_id), (OFFLOADING, None))
        self.assertEqual((h.free, h.offload.event), ([], h.event))
        self.assertEqual(h.store.stats.offloaded, 0)
        self.assertFalse(h.op.done())
        h.s.dead = True

    def test_a_reload_waiting_for_the_answer_leaves_it_to_python(self):
        h = Offloading()
        h.s.reload = object()
        self.assert_left(h)

    def test_a_handle_used_from_the_device_leaves_it_to_python(self):
        h = Offloading()
        h.s.served = True
        self.assert_left(h)

    def test_a_source_modified_in_place_leaves_it_to_python(self):
        h = Offloading()
        h.source.add_(1)  # its version moved since it was sent: Python notes it
        self.assert_left(h)

    def test_a_store_lock_held_by_another_thread_leaves_it_to_python(self):
        h = Offloading()
        with held_by_another_thread(h.store._lock):
            self.assert_left(h)

    def test_the_outcome_lock_held_leaves_it_to_python(self):
        h = Offloading()
        with client_mod._outcome.Outcome._lock:
            self.assert_left(h)

    def test_a_dead_handle_leaves_it_to_python(self):
        h = Offloading()
        h.s.dead = True
        h.s = None  # the weak reference dies with it: _offload_orphaned frees the block
        left, ops, _ = h.take()
        self.assertEqual((len(left), len(ops)), (1, 1))
        self.assertFalse(h.op.done())

    def test_a_second_callback_leaves_it_to_python(self):
        h = Offloading()
        h.op.add_done_callback(h.called.append)  # someone else waits for this answer too
        self.assert_left(h)
        self.assertEqual(h.called, [])

    def test_a_target_that_is_no_weak_reference_leaves_it_to_python(self):
        h = Offloading()
        h.op.target = (h.s, h.free)
        self.assert_left(h)

    def test_an_op_of_another_class_is_left_to_python(self):
        class Op(_RingOp):
            __slots__ = ()
        op = Op(None, "release", (1,))
        ops = {1: op}
        self.assertEqual(len(take([answer(1, _native.RELEASED)], ops, set())), 1)
        self.assertFalse(op.done())

    def test_the_batch_is_read_once_whatever_runs_meanwhile(self):
        answers = [answer(1, _native.RELEASED), answer(2, _native.RELEASED)]

        class Clears(str):  # an op kind whose comparison empties the caller's list
            def __eq__(self, other):
                answers.clear()
                return str.__eq__(self, other)
            __hash__ = str.__hash__
        first = _RingOp(None, Clears("release"), (1,))
        second = _RingOp(None, "release", (2,))
        left = take(answers, {1: first, 2: second}, set())
        self.assertEqual(left, [])
        self.assertTrue(first.done() and second.done())

    def test_another_offload_of_the_handle_leaves_it_to_python(self):
        h = Offloading()
        h.s.op = OffloadOp(_RingOp(None, "offload", (1, 0, 1, None, None)))
        self.assert_left(h)


class FakeClient:
    """What submit reads of a Client, around a real NativeRing no daemon serves (it takes
    submissions until its slots are full)."""

    def __init__(self):
        self._owner_pid = os.getpid()
        self._lock = threading.Lock()
        self._ring = _native.NativeRing(8)
        self._dead, self._closing, self._lost = None, False, set()
        self._daemon_region = {3: 30}
        self._ring_ops = {}
        self.counters = Counters()


@unittest.skipIf(_native.load_ring_fast() is None, "offloadd._ring_fast is not built")
class SubmitTest(unittest.TestCase):
    def setUp(self):
        self.fast = _native.load_ring_fast()
        self.fast.bind_client(_RingOp)
        self.c = FakeClient()
        self.ring = self.c._ring
        self.addCleanup(self.ring.close)

    def submit(self, kind, args, op=None, target=None):
        return self.fast.submit(self.c, kind, args, op, target)

    def test_a_new_op_is_submitted_and_filed_as_ring_submit_files_it(self):
        target = (None, [])
        op = self.submit(0, (3, 64, 4096, bytes(64), (2, 5)), target=target)
        self.assertIsInstance(op, _RingOp)
        self.assertEqual((op.kind, op.args, op.target, op.client), (
            "offload", (3, 64, 4096, bytes(64), (2, 5)), target, self.c))
        self.assertGreater(op.request_id, 0)
        self.assertEqual(self.c._ring_ops, {op.request_id: op})
        self.assertEqual(self.c.counters.ring_requests_sent, 1)
        self.assertEqual(self.c._ring.pending, 1)
        self.assertFalse(op.done())
        self.assertFalse(self.c._lock.locked())
        op.set_result(1)  # an outcome as any other: completes, runs callbacks
        self.assertEqual(op.result(0), 1)

    def test_a_given_op_gets_its_args_and_a_release_and_a_reload_go_too(self):
        into = _RingOp(self.c, "reload", None)
        args = (7, 3, 0, 1, True, 0.0, bytes(64), bytes(64))
        self.assertIs(self.submit(1, args, into), into)
        self.assertEqual(into.args, args)
        rel = self.submit(2, (7,))
        self.assertEqual(rel.kind, "release")
        self.assertEqual(sorted(self.c._ring_ops), sorted([into.request_id, rel.request_id]))
        self.assertEqual((self.c.counters.ring_requests_sent, self.c._ring.pending), (2, 2))

    def assert_declined(self, kind=2, args=(7,)):
        self.assertIsNone(self.submit(kind, args))
        self.assertEqual((self.c._ring_ops, self.ring.pending), ({}, 0))
        self.assertEqual(self.c.counters.ring_requests_sent, 0)

    def test_python_decides_for_a_refusal_no_ring_or_a_held_lock(self):
        self.c._dead = RuntimeError("session failed")
        self.assert_declined()
        self.c._dead, self.c._closing = None, True
        self.assert_declined()
        self.c._closing, self.c._lost = False, {9}
        self.assert_declined()
        self.c._lost = set()
        with self.c._lock:
            self.assert_declined()
        ring, self.c._ring = self.c._ring, None
        self.assert_declined()
        self.c._ring = ring
        self.c._owner_pid = os.getpid() + 1  # a forked child: _check_process speaks
        self.assert_declined()

    def test_a_full_ring_is_left_to_python_which_waits(self):
        for _ in range(8):
            self.assertIsNotNone(self.submit(2, (1,)))
        self.assertIsNone(self.submit(2, (1,)))
        self.assertEqual(len(self.c._ring_ops), 8)

    def test_arguments_of_other_types_are_left_to_python_with_the_lock_let_go(self):
        self.assert_declined(0, (3, 0, 64, b"short", None))  # the ring's ValueError is Python's
        self.assert_declined(0, (3, 0, 64, None, [1, 2]))  # an ordering as a list
        self.assert_declined(1, (7, 3, 0, 1, 1.0, 0.0, None, None))  # a float flag
        self.assertFalse(self.c._lock.locked())
        with self.assertRaises(TypeError):
            self.submit(1, (1,))  # not a reload's args at all: a caller's bug

    def test_another_op_class_is_refused(self):
        with self.assertRaises(RuntimeError):
            self.fast.bind_client(OffloadAnswer)


class PumpTest(DaemonTestCase):
    def answered_offloads(self, n):
        """A client with ``n`` offloads on its ring, all answered by the daemon (not taken)."""
        c = Client(self.daemon.sock, "t", "cpu")
        self.addCleanup(c.close)
        self.assertTrue(c.ring_active, c.ring_error)
        region = ShmRegion(1 << 20)
        self.addCleanup(region.close)
        rid = c.register_shm(region.name, region.size_bytes)
        ops = [c.offload(rid, (i % 64) * 4096, 4096) for i in range(n)]
        deadline = time.monotonic() + 30
        while self.daemon.stats().blocks < n and time.monotonic() < deadline:
            time.sleep(0.02)
        time.sleep(0.2)  # the last answers written to the ring after the blocks were stored
        return c, ops

    def release_all(self, c, ops):
        for op in ops:
            c.release(op.result(0).block_id)
        self.assertTrue(c.drain(10))

    def test_one_pump_takes_every_answer_the_ring_holds(self):
        """More answers than one drain batch, most of them taken in C: the pump goes on until
        the ring is empty (it once stopped after the first batch whenever C took any)."""
        n = 3 * _native.DRAIN_BATCH + 8
        c, ops = self.answered_offloads(n)
        self.assertEqual(c.pump(0.0), n)
        self.assertEqual((sum(op.done() for op in ops), len(c._ring_ops)), (n, 0))
        self.release_all(c, ops)

    def test_the_c_pump_takes_them_as_client_pump_does(self):
        """offloadd._store_front.pump: every batch, the counts, the daemon heard, the blocks
        confirmed; with take None every answer goes through the Python path, with the same
        result."""
        for taker in (take, None):
            with self.subTest(take=taker):
                n = 2 * _native.DRAIN_BATCH + 3
                c, ops = self.answered_offloads(n)
                heard, received = c._last_heard, c.counters.ring_answers_received
                self.assertEqual(front_mod.pump(c, _native.DRAIN_BATCH, taker), n)
                self.assertEqual((sum(op.done() for op in ops), len(c._ring_ops)), (n, 0))
                self.assertEqual(c.counters.ring_answers_received, received + n)
                self.assertGreater(c._last_heard, heard)
                self.assertEqual(c._confirmed, {op.result(0).block_id for op in ops})
                self.assertEqual(front_mod.pump(c, _native.DRAIN_BATCH, taker), 0)  # empty
                self.release_all(c, ops)


    def test_an_interrupt_waiting_for_the_lock_is_raised_after_the_answers_are_applied(self):
        """The drained answers are off the ring: a KeyboardInterrupt while the pump waits for
        the client's lock (held by another thread) must not drop them, or their requests never
        complete. Both pumps: the C one and Client.pump."""
        pumps = (("c", lambda c: front_mod.pump(c, _native.DRAIN_BATCH, take)),
                 ("python", lambda c: c.pump(0.0)))
        for name, pump in pumps:
            with self.subTest(pump=name):
                c, ops = self.answered_offloads(5)
                held = threading.Event()

                def hold():
                    with c._lock:
                        held.set()
                        time.sleep(0.4)
                holder = threading.Thread(target=hold)
                holder.start()
                held.wait(10)
                with self.assertRaises(KeyboardInterrupt):
                    with interrupted_after(0.05):
                        pump(c)
                holder.join(10)
                self.assertEqual((sum(op.done() for op in ops), len(c._ring_ops)), (5, 0))
                self.assertEqual(c.counters.ring_answers_received, 5)
                self.release_all(c, ops)


    def test_an_interrupt_as_the_answers_are_applied_or_completed_drops_none(self):
        """A KeyboardInterrupt at the start of the Python steps that apply a drained batch
        (Client._ring_outcomes_locked) or complete its ops (_RingOp._finish): both pumps call
        the step once more, apply and complete every answer, then raise the interrupt."""
        pumps = (("c", lambda c: front_mod.pump(c, _native.DRAIN_BATCH, None)),
                 ("python", lambda c: c.pump(0.0)))
        steps = ((Client, "_ring_outcomes_locked"), (client_mod._RingOp, "_finish"))
        for (name, pump), (cls, step) in [(p, st) for p in pumps for st in steps]:
            with self.subTest(pump=name, step=step), \
                    mock.patch.object(client_mod, "_take_answers", None):
                c, ops = self.answered_offloads(5)
                real, armed = getattr(cls, step), [True]

                def interrupted_once(*args, real=real, armed=armed):
                    if armed:
                        armed.clear()
                        raise KeyboardInterrupt("a signal handler raised")
                    return real(*args)
                with mock.patch.object(cls, step, interrupted_once):
                    with self.assertRaises(KeyboardInterrupt):
                        pump(c)
                self.assertEqual((sum(op.done() for op in ops), len(c._ring_ops)), (5, 0))
                self.assertEqual([op.exception(0) for op in ops], [None] * 5)
                self.release_all(c, ops)


class InterruptedDrainTest(DaemonTestCase):
    """A signal that comes while a pump sleeps in the ring's drain: its handler runs inside the
    drain once the answers are taken (offloadd._ring_fast.drain), and when it raises the answers
    stay with the ring for the next drain instead of being lost with the interrupted call."""

    POOL_BYTES = "4MiB"

    def test_a_signal_during_the_drains_sleep_leaves_the_answers_to_the_next_drain(self):
        c = Client(self.daemon.sock, "t", "cpu")
        self.addCleanup(c.close)
        self.assertTrue(c.ring_active, c.ring_error)
        if c._ring_native.binding != "c-extension":
            self.skipTest("the ctypes binding carries no answers over (offloadd._ring_fast "
                          "did not load: %s)" % _native.ring_fast_error)
        region = ShmRegion(8 << 20)
        self.addCleanup(region.close)
        rid = c.register_shm(region.name, region.size_bytes)
        block = c.wait(c.offload(rid, 0, 4 << 20), timeout=10).block_id
        waiting = c.offload(rid, 4 << 20, 4 << 20)  # the pool is full: it waits for room
        main = threading.get_ident()

        def signal_then_room():
            time.sleep(0.3)
            signal.pthread_kill(main, signal.SIGALRM)  # while the main thread sleeps
            time.sleep(0.3)
            c.release(block)  # room: the waiting offload is stored and answered
        old = signal.signal(signal.SIGALRM, _raise_interrupt)
        try:
            other = threading.Thread(target=signal_then_room)
            other.start()
            with self.assertRaises(KeyboardInterrupt):
                c.pump(10.0)
            other.join(10)
        finally:
            signal.signal(signal.SIGALRM, old)
        self.assertFalse(waiting.done())  # taken off the ring, not yet applied
        self.assertGreaterEqual(len(c._ring_native._carry), 1)
        deadline = time.monotonic() + 10
        while not waiting.done() and time.monotonic() < deadline:
            c.pump(0.5)
        self.assertIsNone(waiting.exception(0))
        self.assertEqual(c._ring_native._carry, [])
        c.release(waiting.result(0).block_id)
        self.assertTrue(c.drain(10))


def _raise_interrupt(signum, frame):
    raise KeyboardInterrupt("a signal handler raised")


class PumpFallbackTest(unittest.TestCase):
    """The C pump hands whatever is not its usual case to Client.pump, and an idle client
    costs it nothing."""

    class Fake:
        def __init__(self, ring=None, ops=None, owner=None):
            self._ring_native, self._ring_ops = ring, ops if ops is not None else {}
            self._owner_pid = os.getpid() if owner is None else owner
            self.pumped = 0

        def pump(self):
            self.pumped += 1
            return 42

    class Ring:
        def __init__(self, fast=None, released=False):
            self._fast, self._released, self._ring = fast, released, 1

    def pump(self, client):
        return front_mod.pump(client, _native.DRAIN_BATCH, take)

    def test_idle(self):
        for c in (self.Fake(), self.Fake(self.Ring(fast=_native.load_ring_fast()))):
            self.assertEqual(self.pump(c), 0)
            self.assertEqual(c.pumped, 0)

    def test_python_decides(self):
        fast, ops = _native.load_ring_fast(), {1: object()}
        cases = {"another process": self.Fake(self.Ring(fast), ops, owner=os.getpid() + 1),
                 "the ctypes binding": self.Fake(self.Ring(None), ops),
                 "a ring closed by close()": self.Fake(self.Ring(fast, released=True), ops)}
        for name, c in cases.items():
            with self.subTest(name):
                self.assertEqual(self.pump(c), 42)
                self.assertEqual(c.pumped, 1)

    def test_arguments_of_other_types(self):
        with self.assertRaises(TypeError):
            front_mod.pump(self.Fake(), "64", take)
        with self.assertRaises(TypeError):
            front_mod.pump(self.Fake(), 64)


class PumpAllTest(unittest.TestCase):
    """offloadd._store_front.pump_all: the hooks' pump of every endpoint in one call."""

    Fake = PumpFallbackTest.Fake

    class Endpoint:
        def __init__(self, client, pid=None):
            self.client, self.pid = client, os.getpid() if pid is None else pid

    class Module:
        _take_answers = take

    def test_only_this_process_endpoints_are_pumped(self):
        """Each endpoint of this process is pumped once (here through Client.pump, the
        ctypes-binding case), one inherited through fork is left alone; None is returned."""
        mine = [self.Fake(PumpFallbackTest.Ring(None), {1: object()}) for _ in range(3)]
        theirs = mine.pop()
        eps = {"a": self.Endpoint(mine[0]), "b": self.Endpoint(theirs, os.getpid() + 1),
               "c": self.Endpoint(mine[1])}
        self.assertIsNone(front_mod.pump_all(eps, _native.DRAIN_BATCH, self.Module))
        self.assertEqual([c.pumped for c in mine] + [theirs.pumped], [1, 1, 0])

    def test_the_endpoints_are_taken_before_any_pump(self):
        """A pump that changes the dict (a completion dropping an endpoint) neither breaks the
        loop nor skips the endpoints that were there when it began."""
        eps = {}

        class Dropping(self.Fake):
            def pump(inner):
                eps.clear()
                return super().pump()
        clients = [Dropping(PumpFallbackTest.Ring(None), {1: object()}) for _ in range(3)]
        eps.update((i, self.Endpoint(c)) for i, c in enumerate(clients))
        front_mod.pump_all(eps, _native.DRAIN_BATCH, self.Module)
        self.assertEqual([c.pumped for c in clients], [1, 1, 1])

    def test_an_error_propagates_and_the_rest_waits(self):
        class Failing(self.Fake):
            def pump(inner):
                raise ValueError("pump failed")
        later = self.Fake(PumpFallbackTest.Ring(None), {1: object()})
        eps = {1: self.Endpoint(Failing(PumpFallbackTest.Ring(None), {1: object()})),
               2: self.Endpoint(later)}
        with self.assertRaisesRegex(ValueError, "pump failed"):
            front_mod.pump_all(eps, _native.DRAIN_BATCH, self.Module)
        self.assertEqual(later.pumped, 0)

    def test_the_take_function_is_read_at_each_call(self):
        """client_module._take_answers is looked up per call (a benchmark switches it off)."""
        class NoTake:
            pass
        with self.assertRaises(AttributeError):
            front_mod.pump_all({}, _native.DRAIN_BATCH, NoTake)

    def test_arguments_of_other_types(self):
        for args in (([], 64, self.Module), ({}, "64", self.Module), ({}, 64)):
            with self.subTest(args=args), self.assertRaises(TypeError):
                front_mod.pump_all(*args)

    def test_the_hooks_call_it(self):
        """The torch hooks' pump is pump_all bound to the endpoints' table, without a Python
        frame of its own."""
        from offloadd.torch import _endpoint, _store
        self.assertIs(_store._pump, _endpoint.hooks_pump)
        self.assertIs(_endpoint.hooks_pump.func, front_mod.pump_all)
        self.assertEqual(_endpoint.hooks_pump.args,
                         (_endpoint._endpoints, _native.DRAIN_BATCH, client_mod))


if __name__ == "__main__":
    unittest.main()
