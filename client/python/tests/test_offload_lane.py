"""offloadd._store_front.OffloadLane (client/core/store_lane.c, store_offload.c,
store_reload.c): a handle's usual offload and reload in one C call each, without a daemon. Each
case builds the endpoint a lane reads (client, transport, device, IPC event pool, region table)
from small fakes, sends one handle through it and checks what it changed: the handle's fields,
the OffloadOp or ReloadOp, the submission's arguments, the events, the counts and the
done-callback -- or, when the lane must leave the work to the store's Python, that it changed
nothing. test_sim_gpu's SimRingAnswersTest runs lanes through the hooks against a daemon."""

import collections
import contextlib
import functools
import gc
import os
import signal
import sys
import threading
import unittest
import weakref

import torch

from daemon_fixture import PY_ROOT, held_by_another_thread  # noqa: F401 -- PY_ROOT: the package

from offloadd import _native, _outcome
from offloadd.client import ReloadAnswer, _RingOp
from offloadd.torch._transport import OffloadOp, ReloadOp

front_mod = _native.load_store_front()
KEPT, OFFLOADING, OFFLOADED = 0, 1, 2
URGENT, PREFETCH, BLOCK = 0, 1, 55
OFFSET, SEGMENT_BYTES, BUFFER, REGION = 256, 1 << 20, 41, 7



def _interrupt(signum, frame):
    raise KeyboardInterrupt("a signal while waiting")


@contextlib.contextmanager
def interrupted_after(seconds, every=0.0):
    """A KeyboardInterrupt raised by a signal handler ``seconds`` into the block (and again
    every ``every`` seconds after, when not 0)."""
    old = signal.signal(signal.SIGALRM, _interrupt)
    signal.setitimer(signal.ITIMER_REAL, seconds, every)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)

class Event:
    def __init__(self, n):
        self.handle = bytes([n]) * 64


class Info:
    def __init__(self, base, size, buffer_id):
        self.base, self.size, self.buffer_id = base, size, buffer_id


class Device:
    """The device methods a lane calls, logged; ``fail`` names one that raises ``error``."""

    simulated, checksums = False, False

    def __init__(self):
        self.calls, self.fail, self.error = [], None, None

    def _log(self, name, *args):
        self.calls.append((name,) + args)
        if self.fail == name:
            raise self.error

    def context(self, device):
        self._log("context", device)
        return contextlib.nullcontext()

    def adopt(self, t):
        self._log("adopt", t)
        return t

    def describe(self, ptr):
        self._log("describe", ptr)
        return Info(ptr - OFFSET, SEGMENT_BYTES, BUFFER)  # the span OFFSET bytes in

    def current_stream(self, device):
        self._log("current_stream", device)
        return "stream"

    def record(self, ev, stream):
        self._log("record", ev, stream)

    def reload_stream(self, device):
        self._log("reload_stream", device)
        return "reload stream"

    def empty_on(self, meta, stream):
        self._log("empty_on", meta, stream)
        return torch.empty(meta.shape, dtype=meta.dtype)

    def event_seq(self, ev):
        self._log("event_seq", ev)
        return 6

    def wait(self, stream, ev, seq):
        self._log("wait", stream, ev, seq)

    def record_stream(self, t, stream):
        self._log("record_stream", t, stream)


class Events:
    """IpcEventPool's fields: the free list and acquire, which makes a new event."""

    def __init__(self, n):
        self._free = [Event(i + 1) for i in range(n)]
        self.created = n

    def acquire(self):
        self.created += 1
        return Event(100 + self.created)


class Transport:
    def __init__(self, dev, events=2):
        self.dev, self.events = dev, Events(events)
        self._regions = collections.OrderedDict([(99, 3), (BUFFER, REGION), (100, 4)])
        self._abandoned, self.checked = [], []

    def _check_simulated(self, op, meta, stream):
        self.checked.append((op, meta, stream))


class Client:
    """The client fields a lane reads, and a _submit_fast that files what it was given."""

    def __init__(self):
        self._dead, self._closing, self.submitted, self.take = None, False, [], True
        self._submit_fast = self.submit
        self.reloads = []  # Client.reload's calls (when the ring did not take a reload)

    def submit(self, client, kind, args, op, target):
        self.submitted.append((client, kind, args, op, target))
        if not self.take:
            return None
        if op is None:
            return _RingOp(client, "offload", args, target)
        op.args = args
        return op

    def reload_outcome(self):
        return _RingOp(self, "reload", None)

    def reload(self, *args, **kwargs):
        self.reloads.append((args, kwargs))
        return kwargs["into"]


class Endpoint:
    def __init__(self, dev=None, events=2):
        self.client, self.transport = Client(), Transport(dev or Device(), events)
        self.pid, self.socket_path, self.key = os.getpid(), "/run/offloadd.sock", "cuda:0"


class Store:
    def __init__(self):
        self._lock, self._stall_left, self.done = threading.RLock(), 5.0, []

    def _offload_done(self, wref, ep, op, future):
        self.done.append((wref, ep, op, future))


class Counts:
    def __init__(self, counted=False):
        self.counted, self.sent = counted, 0


class LaneCase(unittest.TestCase):
    def setUp(self):
        self.ep, self.store, self.full = Endpoint(), Store(), {}
        self.dev, self.free = self.ep.transport.dev, self.ep.transport.events._free
        self.t = torch.arange(1024, dtype=torch.float32)
        self.s = front_mod.Saved(self.store, 3, self.t)
        self.s.counts, self.step = Counts(), Counts()

    def lane(self):
        return front_mod.OffloadLane(self.ep, self.full, OffloadOp, ReloadOp, functools.partial)

    def offload(self):
        return self.lane().offload(self.s, self.step)

    def assertUnchanged(self, free_before=2):
        self.assertEqual((self.s.state, self.s.op, self.s.ep), (KEPT, None, None))
        self.assertIs(self.s.tensor, self.t)
        self.assertEqual(len(self.free), free_before)
        self.assertEqual((self.s.counts.sent, self.step.sent), (0, 0))
        self.assertEqual(self.store.done, [])


class SentTest(LaneCase):
    def test_the_handle_leaves_as_store_offload_leaves_it(self):
        ev = self.free[-1]
        self.assertIs(self.offload(), True)
        s, client = self.s, self.ep.client
        self.assertEqual(s.state, OFFLOADING)
        self.assertIsNone(s.tensor)
        self.assertIs(s.ep, self.ep)
        self.assertEqual(s.sent_version, self.t._version)
        self.assertEqual(len(self.free), 1)
        op = s.op
        self.assertIsInstance(op, OffloadOp)
        self.assertIs(op.tensor, self.t)
        self.assertIs(op.event, ev)
        self.assertIsNone(op.slot)
        self.assertIsNone(op.orphan_reload)
        ((c, kind, args, given, target),) = client.submitted
        self.assertIs(c, client)
        self.assertEqual(kind, 0)
        self.assertEqual(args, (REGION, OFFSET, 4096, ev.handle, (s.step, s.offset)))
        self.assertIsNone(given)
        self.assertIs(target[0](), s)
        self.assertIs(target[1], self.free)
        self.assertIs(op.future.target, target)
        self.assertEqual(self.dev.calls[-1], ("record", ev, "stream"))
        self.assertEqual(self.s.counts.sent, 1)
        self.assertEqual(self.step.sent, 0)
        self.assertEqual(list(self.ep.transport._regions), [99, 100, BUFFER])  # used last

    def test_the_done_callback_is_the_stores_with_the_handle_endpoint_and_op(self):
        self.assertTrue(self.offload())
        ring_op = self.s.op.future
        ring_op.set_result("answer")
        ((wref, ep, op, future),) = self.store.done
        self.assertIs(wref(), self.s)
        self.assertIs(ep, self.ep)
        self.assertIs(op, self.s.op)
        self.assertIs(future, ring_op)

    def test_the_callback_is_added_in_c_to_a_ring_op(self):
        """A _RingOp gets the store's callback as Outcome.add_done_callback adds it: the one
        entry of a new list; a list there already gets it appended; an op complete already
        runs it at once (and keeps no list)."""
        self.assertTrue(self.offload())
        self.assertEqual(len(self.s.op.future._callbacks), 1)
        self.assertEqual(self.store.done, [])
        for before, done in (([print], False), (None, True)):
            with self.subTest(done=done):
                self.setUp()
                ring_op = _RingOp(self.ep.client, "offload", None)
                ring_op._callbacks = list(before) if before else None
                if done:
                    ring_op.set_result("answered before the callback")
                self.ep.client._submit_fast = lambda *args: ring_op
                self.assertTrue(self.offload())
                if done:
                    self.assertIsNone(ring_op._callbacks)
                    ((_, _, _, future),) = self.store.done
                    self.assertIs(future, ring_op)
                else:
                    self.assertEqual(len(ring_op._callbacks), 2)
                    self.assertIs(ring_op._callbacks[0], print)
                    self.assertEqual(self.store.done, [])
                    ring_op.set_result("answer")
                    self.assertEqual(len(self.store.done), 1)

    def test_an_interrupt_awaiting_the_outcome_lock_propagates_after_the_callback(self):
        """Another thread holds Outcome's lock while the lane adds the store's callback and a
        signal handler raises: the callback is added once the lock is free, then the
        interrupt propagates (the request went out: nothing is sent again)."""
        for every in (0.0, 0.05):  # one interrupt, then one every 50 ms while it waits
            with self.subTest(every=every):
                self.setUp()
                lock = _outcome.Outcome._lock
                lock.acquire()
                releaser = threading.Timer(0.3, lock.release)
                releaser.start()
                try:
                    with self.assertRaises(KeyboardInterrupt), interrupted_after(0.1, every):
                        self.offload()
                finally:
                    releaser.join()
                self.assertEqual(len(self.ep.client.submitted), 1)
                ring_op = self.s.op.future
                self.assertEqual(len(ring_op._callbacks), 1)
                ring_op.set_result("answer")
                self.assertEqual(len(self.store.done), 1)

    def test_a_forked_child_finds_the_outcome_lock_free(self):
        """A thread held Outcome's lock at the fork: the child's lane still adds callbacks."""
        lock = _outcome.Outcome._lock
        with held_by_another_thread(lock):
            pid = os.fork()
            if pid == 0:
                code = 1
                try:
                    code = 0 if lock.acquire(timeout=5) else 2
                finally:
                    os._exit(code)
            _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)

    def test_an_op_of_another_class_gets_its_own_add_done_callback(self):
        added = []

        class Op:
            def add_done_callback(self, fn):
                added.append(fn)
        self.ep.client._submit_fast = lambda *args: Op()
        self.assertTrue(self.offload())
        self.assertEqual(len(added), 1)
        self.assertTrue(callable(added[0]))

    def test_a_counted_step_counts_in_the_packing_threads_step(self):
        self.s.counts = Counts(counted=True)
        self.assertTrue(self.offload())
        self.assertEqual((self.s.counts.sent, self.step.sent), (0, 1))

    def test_a_checksumming_simulated_device_notes_the_sources_checksum(self):
        self.dev.simulated = self.dev.checksums = True
        self.dev.checksum = lambda t: ("sum", t.numel())
        self.assertTrue(self.offload())
        self.assertEqual(self.s.checksum, ("sum", 1024))

    def test_two_handles_take_the_two_free_events_the_third_a_new_one(self):
        lane = self.lane()
        others = [front_mod.Saved(self.store, 4 + i, self.t) for i in range(2)]
        for o in others:
            o.counts = Counts()
        free = list(self.free)
        self.assertTrue(lane.offload(self.s, self.step))
        self.assertTrue(lane.offload(others[0], self.step))
        self.assertTrue(lane.offload(others[1], self.step))
        self.assertEqual([self.s.op.event, others[0].op.event], free[::-1])
        self.assertEqual(others[1].op.event.handle, bytes([103]) * 64)  # the pool's third
        self.assertEqual((self.free, self.ep.transport.events.created), ([], 3))


class DeclinedTest(LaneCase):
    """Python's path decides, and finds everything as it was."""

    def test_a_tensor_modified_since_its_pack(self):
        self.t.add_(1)
        self.assertIs(self.offload(), False)
        self.assertUnchanged()

    def test_an_empty_pool_makes_an_event_and_a_failed_send_keeps_it(self):
        self.free.clear()
        self.ep.client.take = False
        self.assertFalse(self.offload())
        self.assertUnchanged(free_before=1)  # made (acquire), then given back to the list
        self.assertEqual(self.ep.transport.events.created, 3)

    def test_a_segment_not_registered_yet(self):
        del self.ep.transport._regions[BUFFER]
        self.assertFalse(self.offload())
        self.assertUnchanged()

    def test_a_span_past_its_segment(self):
        self.dev.describe = lambda ptr: Info(ptr - OFFSET, OFFSET + 4095, BUFFER)
        self.assertFalse(self.offload())
        self.assertUnchanged()

    def test_a_refused_for_room_back_off_of_this_endpoint(self):
        self.full[(os.getpid(), "/run/offloadd.sock", "cuda:0")] = (1e9, "pool full")
        self.assertFalse(self.offload())
        self.assertUnchanged()

    def test_another_endpoints_back_off_is_not_this_ones(self):
        self.full[(os.getpid(), "/run/other.sock", "cuda:0")] = (0.0, "expired long ago")
        self.assertTrue(self.offload())

    def test_a_handle_without_counts(self):
        self.s.counts = None
        self.assertFalse(self.offload())
        del self.s.counts
        self.assertFalse(self.offload())
        self.s.counts = Counts()
        self.assertUnchanged()

    def test_the_steps_stall_budget_spent(self):
        self.store._stall_left = 0.0
        self.assertFalse(self.offload())
        self.assertUnchanged()

    def test_a_dead_or_closing_client(self):
        self.ep.client._closing = True
        self.assertFalse(self.offload())
        self.ep.client._closing, self.ep.client._dead = False, RuntimeError("gone")
        self.assertFalse(self.offload())
        self.assertUnchanged()

    def test_destinations_waiting_to_be_let_go(self):
        self.ep.transport._abandoned.append(object())
        self.assertFalse(self.offload())
        self.assertUnchanged()

    def test_no_ring_submission(self):
        self.ep.client._submit_fast = None
        self.assertFalse(self.offload())
        self.assertUnchanged()

    def test_the_ring_declines_and_the_event_goes_back(self):
        self.ep.client.take = False
        self.assertFalse(self.offload())
        self.assertUnchanged()
        self.assertEqual(len(self.ep.client.submitted), 1)

    def test_a_device_call_that_raises_an_exception(self):
        for name in ("context", "adopt", "describe", "current_stream", "record"):
            with self.subTest(name):
                self.dev.fail, self.dev.error = name, RuntimeError("device says no")
                self.assertFalse(self.offload())
                self.assertUnchanged()

    def test_a_handle_that_is_not_kept(self):
        self.s.state = OFFLOADING
        self.assertFalse(self.offload())
        self.s.state = KEPT
        self.assertUnchanged()

    def test_another_process(self):
        lane = self.lane()
        pid = os.fork()
        if pid == 0:  # the child: its copy of the lane is its parent's
            code = 0
            try:
                code = 0 if lane.offload(self.s, self.step) is False else 1
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        self.assertEqual(os.waitstatus_to_exitcode(status), 0)
        self.assertTrue(lane.offload(self.s, self.step))  # the parent's own still works


class ReloadCase(LaneCase):
    """A handle OFFLOADED to this lane's endpoint, with its block."""

    def setUp(self):
        super().setUp()
        self.s.state, self.s.ep, self.s.block_id, self.s.tensor = OFFLOADED, self.ep, BLOCK, None

    def assertNotReloaded(self):
        self.assertIsNone(self.s.reload)
        self.assertEqual((self.s.state, self.s.block_id), (OFFLOADED, BLOCK))
        self.assertEqual(len(self.free), 2)
        self.assertEqual(self.ep.client.submitted, [])


class ReloadTest(ReloadCase):
    def test_an_offloaded_handle_is_reloaded_as_start_reload_leaves_it(self):
        ready, done = self.free[1], self.free[0]
        rl = self.lane().reload(self.s, PREFETCH)
        self.assertIs(self.s.reload, rl)
        self.assertEqual((rl.region_id, rl.offset, rl.priority), (REGION, OFFSET, PREFETCH))
        self.assertEqual((rl.sent, rl.release_after, rl.done_seq), (True, True, 7))
        self.assertIs(rl.ready_event, ready)
        self.assertIs(rl.done_event, done)
        self.assertEqual(rl.dest.shape, self.t.shape)
        self.assertIsNone(rl.slot)
        self.assertEqual(self.free, [])
        ((client, kind, args, op, target),) = self.ep.client.submitted
        self.assertEqual((kind, target), (1, None))
        self.assertIs(op, rl.done)
        self.assertEqual(args, (BLOCK, REGION, OFFSET, PREFETCH, True, 0.0, ready.handle,
                                done.handle))
        names = [c[0] for c in self.dev.calls]
        self.assertEqual(names, ["context", "reload_stream", "empty_on", "describe", "record",
                                 "event_seq"])
        self.assertEqual(self.dev.calls[4], ("record", ready, "reload stream"))
        self.assertIs(self.dev.calls[2][1], self.s)  # the handle is its own meta

    def test_the_reload_outcome_is_client_reload_outcomes(self):
        """The outcome, made in C, has every field Client.reload_outcome's _RingOp has (the
        fake client's method is not called)."""
        self.ep.client.reload_outcome = None  # a call would fail
        rl = self.lane().reload(self.s, PREFETCH)
        self.ep.client.submitted[0][3].args = None  # what submission set; the rest as made
        expected = _RingOp(self.ep.client, "reload", None)
        self.assertIs(type(rl.done), _RingOp)
        fields = ("_done", "_value", "_exc", "_callbacks", "_event", "client", "kind", "args",
                  "request_id", "target")
        self.assertEqual([getattr(rl.done, f) for f in fields],
                         [getattr(expected, f) for f in fields])

    def test_a_reload_the_ring_does_not_take_goes_through_client_reload(self):
        self.ep.client.take = False
        rl = self.lane().reload(self.s, URGENT)
        ((args, kwargs),) = self.ep.client.reloads
        self.assertEqual(args, (BLOCK, REGION, OFFSET, URGENT))
        self.assertEqual(kwargs, {"release_after": True, "ready_event": rl.ready_event.handle,
                                  "done_event": rl.done_event.handle, "into": rl.done})
        self.assertIs(self.s.reload, rl)

    def test_what_sending_raises_propagates_and_the_handle_keeps_the_reload(self):
        def broken(*args):
            raise RuntimeError("ring broke")
        self.ep.client._submit_fast = broken
        with self.assertRaises(RuntimeError):
            self.lane().reload(self.s, URGENT)
        self.assertTrue(self.s.reload.sent)

    def test_python_decides_for_handles_not_offloaded_or_a_lane_not_ready(self):
        other = Endpoint()
        cases = {"offloading": ("state", OFFLOADING), "no block": ("block_id", None),
                 "reloading": ("reload", object()), "another endpoint": ("ep", other)}
        for name, (field, value) in cases.items():
            with self.subTest(name):
                old = getattr(self.s, field)
                setattr(self.s, field, value)
                self.assertIsNone(self.lane().reload(self.s, URGENT))
                setattr(self.s, field, old)
                self.assertNotReloaded()
        self.ep.client._closing = True
        self.assertIsNone(self.lane().reload(self.s, URGENT))
        self.ep.client._closing = False
        self.ep.transport._abandoned.append(object())
        self.assertIsNone(self.lane().reload(self.s, URGENT))
        self.assertNotReloaded()

    def test_a_destination_outside_the_registered_segments_or_a_device_error(self):
        del self.ep.transport._regions[BUFFER]
        self.assertIsNone(self.lane().reload(self.s, URGENT))
        self.assertNotReloaded()
        self.ep.transport._regions[BUFFER] = REGION
        for name in ("context", "reload_stream", "empty_on", "record"):
            with self.subTest(name):
                self.dev.fail, self.dev.error = name, RuntimeError("device says no")
                self.assertIsNone(self.lane().reload(self.s, URGENT))
                self.assertNotReloaded()

    def test_an_interrupt_propagates_with_the_events_back(self):
        self.dev.fail, self.dev.error = "record", KeyboardInterrupt()
        with self.assertRaises(KeyboardInterrupt):
            self.lane().reload(self.s, URGENT)
        self.assertNotReloaded()


class FinishTest(ReloadCase):
    def reloaded(self, recorded=True):
        lane = self.lane()
        rl = lane.reload(self.s, PREFETCH)
        rl.done.set_result(ReloadAnswer(BLOCK, 4096, True, 0.5, recorded))
        self.dev.calls.clear()
        return lane, rl

    def test_an_answered_reload_orders_the_stream_and_gives_the_events_back(self):
        lane, rl = self.reloaded()
        self.assertIs(lane.finish(rl, self.s), rl.dest)
        self.assertEqual(self.dev.calls, [
            ("current_stream", self.s.device), ("wait", "stream", rl.done_event, 7),
            ("record_stream", rl.dest, "stream")])
        self.assertEqual(self.free, [rl.ready_event, rl.done_event])
        self.assertEqual(self.ep.transport.checked, [])

    def test_no_wait_when_the_daemon_recorded_no_done_event(self):
        lane, rl = self.reloaded(recorded=False)
        self.assertIs(lane.finish(rl, self.s), rl.dest)
        self.assertEqual([c[0] for c in self.dev.calls], ["current_stream", "record_stream"])

    def test_a_checking_simulated_device_checks_the_bytes(self):
        self.dev.simulated = self.dev.checksums = True
        self.dev.checksum = lambda t: 0
        lane, rl = self.reloaded()
        self.assertIs(lane.finish(rl, self.s), rl.dest)
        self.assertEqual(self.ep.transport.checked, [(rl, self.s, "stream")])

    def test_python_waits_or_fails_an_unanswered_or_failed_reload(self):
        lane = self.lane()
        rl = lane.reload(self.s, PREFETCH)
        self.dev.calls.clear()
        self.assertIsNone(lane.finish(rl, self.s))  # not answered: Python waits
        rl.done.set_exception(RuntimeError("refused"))
        self.assertIsNone(lane.finish(rl, self.s))
        other = front_mod.Saved(self.store, 9, self.t)
        self.assertIsNone(lane.finish(rl, other))  # another endpoint's (none) handle
        self.assertEqual((self.dev.calls, self.free), ([], []))

    def test_what_a_device_call_raises_propagates(self):
        lane, rl = self.reloaded()
        self.dev.fail, self.dev.error = "wait", RuntimeError("device says no")
        with self.assertRaises(RuntimeError):
            lane.finish(rl, self.s)
        self.assertEqual(self.free, [])  # kept, as finish_reload keeps them

    def test_arguments_of_other_types(self):
        lane, rl = self.reloaded()
        for args in ((object(), self.s), (rl, object()), (rl,)):
            with self.subTest(args=args), self.assertRaises(TypeError):
                lane.finish(*args)
        with self.assertRaises(TypeError):
            lane.reload(self.s, "urgent")


class RaisedTest(LaneCase):
    def test_a_submission_that_raises_propagates_and_is_not_sent_again(self):
        def broken(*args):
            raise MemoryError("filing the op")  # the ring may have taken the request
        self.ep.client._submit_fast = broken
        with self.assertRaises(MemoryError):
            self.offload()
        self.assertUnchanged()  # the event back, as start_offload gives it back

    def test_an_interrupt_while_another_thread_holds_the_store_lock_propagates(self):
        with held_by_another_thread(self.store._lock), interrupted_after(0.2), \
                self.assertRaises(KeyboardInterrupt):
            self.offload()  # sent, then waits for the lock: as `with self._lock` raises
        self.assertEqual(len(self.ep.client.submitted), 1)
        self.assertEqual(self.s.state, KEPT)  # not handed over, as on the Python path

    def test_the_tensor_taken_off_the_handle_by_a_device_call(self):
        def adopt(t):
            self.s.tensor = None  # code the device runs drops the handle's reference
            return t
        self.dev.adopt = adopt
        self.assertTrue(self.offload())  # the lane held the tensor: no crash
        self.assertIs(self.s.op.tensor, self.t)

    def test_an_interrupt_propagates_and_the_event_goes_back(self):
        self.dev.fail, self.dev.error = "record", KeyboardInterrupt()
        with self.assertRaises(KeyboardInterrupt):
            self.offload()
        self.assertUnchanged()

    def test_op_types_that_are_not_plain_record_classes(self):
        for bad in (memoryview, slice, type, dict, int):
            with self.subTest(bad=bad), self.assertRaises(TypeError):
                front_mod.OffloadLane(self.ep, self.full, bad, ReloadOp, functools.partial)
            with self.subTest(bad=bad), self.assertRaises(TypeError):
                front_mod.OffloadLane(self.ep, self.full, OffloadOp, bad, functools.partial)

    def test_an_init_that_runs_again_while_it_reads_the_endpoint(self):
        lane = front_mod.OffloadLane.__new__(front_mod.OffloadLane)
        inner = []

        plain = self.ep

        class Reentrant:
            transport, pid, socket_path, key = plain.transport, plain.pid, "/s", "cuda:0"

            @property
            def client(self):
                try:
                    lane.__init__(Endpoint(), {}, OffloadOp, ReloadOp, functools.partial)
                except TypeError as e:
                    inner.append(e)
                return plain.client
        lane.__init__(Reentrant(), self.full, OffloadOp, ReloadOp, functools.partial)
        self.assertEqual(len(inner), 1)  # made once: the inner call refused

    def test_arguments_of_other_shapes(self):
        lane = self.lane()
        with self.assertRaises(TypeError):
            lane.offload(object(), self.step)
        with self.assertRaises(TypeError):
            lane.offload(self.s)
        with self.assertRaises(TypeError):
            front_mod.OffloadLane(self.ep, [], OffloadOp, ReloadOp, functools.partial)
        with self.assertRaises(TypeError):
            lane.__init__(self.ep, self.full, OffloadOp, ReloadOp, functools.partial)  # made once
        with self.assertRaises(TypeError):
            front_mod.OffloadLane.__new__(front_mod.OffloadLane).offload(self.s, self.step)
        self.ep.transport._regions = [BUFFER]  # no CudaIpcTransport
        with self.assertRaises(TypeError):
            self.lane()
        self.assertUnchanged()

    def test_a_cycle_through_a_lane_is_collected(self):
        lane = self.lane()
        self.ep.lane = lane  # the endpoint holds its lane, which holds the endpoint
        wref = weakref.ref(self.ep)
        lane = self.ep = None
        gc.collect()
        self.assertIsNone(wref())

    def test_the_lane_keeps_no_handle_alive(self):
        lane = self.lane()
        self.assertTrue(lane.offload(self.s, self.step))
        wref = weakref.ref(self.s)
        self.s.op.future._callbacks = None  # the callback holds a weak reference only
        self.s = None
        self.assertIsNone(wref())


if __name__ == "__main__":
    unittest.main()
