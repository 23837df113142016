"""The hooks in C (offloadd._store_front.Hooks, client/core/store_hooks.c): what
offload_checkpoints and save_on_cpu give torch. The pack's usual path must leave exactly what
Store.pack leaves (the result, the step's counts, the statistics, the handles due offloaded),
and every other case must go to Store.pack with nothing but the pump done before; the
unpack's usual path (an offloaded handle of this process nobody reloads) claims the reload,
has Store._reload_claimed do it and lets the claim go, and every other case goes to the
store's Python after the same first lines.

The store's behaviour through the hook is tested by every suite that trains through a context
(test_hooks, test_steps, test_threads and the others); these check the hook's own rules."""

import functools
import gc
import threading
import unittest
import weakref
from unittest import mock

import torch

from daemon_fixture import (PY_ROOT, DaemonTestCase,  # noqa: F401 -- the package on sys.path
                            InterruptingLock)

import offloadd.torch as ot
from offloadd import _native, errors
from offloadd.torch import _store
from offloadd.torch._store import HostCopy, Kept, Saved

front_mod = _native.load_store_front()
KIB = 1 << 10


class Interrupt(BaseException):
    """What a signal handler raising (KeyboardInterrupt) looks like to the hooks."""


def within(seconds, fn, *args):
    """fn(*args) on a thread of its own; fails the test when it has not returned in time (a
    claim held forever makes an unpack wait forever)."""
    out = []
    worker = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise AssertionError("still waiting after %g s: a reload claim was never let go"
                             % seconds)
    return out[0]


def no_daemon_context(**kw):
    """A context whose store offloads nothing (keep_last_n past any step): no daemon needed."""
    kw.setdefault("threshold_bytes", 4 * KIB)
    kw.setdefault("keep_last_n", 1 << 30)
    return ot.offload_checkpoints(socket_path="/nonexistent/offloadd.sock", **kw)


def counting(obj, name):
    """Replaces obj.name by a wrapper counting its calls (an instance attribute, which the C
    hook's method look-up finds first); returns the list of the calls' arguments."""
    calls, real = [], getattr(obj, name)

    def wrapper(*args, **kwargs):
        calls.append(args)
        return real(*args, **kwargs)
    setattr(obj, name, wrapper)
    return calls


def tensors():
    """A step's worth of saved tensors of every kind the front tells apart."""
    big = torch.randn(64, 64)                       # 16 KiB: offloaded (eventually)
    return [big, torch.randn(8), torch.nn.Parameter(torch.randn(64, 64)), big[1:],
            torch.randn(64, 64, requires_grad=True), torch.randn(64, 128)[:, ::2],
            torch.randn(32, 64)]


class HookPairTest(unittest.TestCase):
    def test_contexts_give_torch_the_c_pack_hook(self):
        ctx = no_daemon_context()
        self.assertIsInstance(ctx.pack_hook.__self__, front_mod.Hooks)
        self.assertEqual(ctx.pack_hook.__name__, "pack")
        self.assertIs(ctx.unpack_hook.__self__, ctx.pack_hook.__self__)
        self.assertEqual(ctx.unpack_hook.__name__, "unpack")
        shared = ot.save_on_cpu(pin_memory=True)
        self.assertIsInstance(shared.pack_hook, functools.partial)
        self.assertEqual(shared.pack_hook.func.__name__, "pack_with")
        self.assertEqual(shared.pack_hook.args, (True, True))
        with mock.patch.object(_store, "_hooks_in_c", False):
            ctx = no_daemon_context()
            self.assertEqual(ctx.pack_hook, ctx.store.pack)
            pinned = ot.save_on_cpu(pin_memory=False)
            self.assertEqual(pinned.pack_hook.func, pinned.store._store.pack)
            self.assertEqual(pinned.pack_hook.keywords,
                             {"small_to_host": True, "pin_memory": False})

    def test_a_store_without_a_hook_pair_gives_its_own_methods(self):
        class Plain:
            stats = None

            def pack(self, t):
                return t

            def unpack(self, t):
                return t
        store = Plain()
        ctx = ot.offload_checkpoints(store=store)
        self.assertEqual((ctx.pack_hook, ctx.unpack_hook), (store.pack, store.unpack))


class UsualPathTest(unittest.TestCase):
    def test_the_usual_pack_does_not_call_store_pack(self):
        ctx = no_daemon_context()
        calls = counting(ctx.store, "pack")
        xs = [torch.randn(64, 64) for _ in range(5)]
        first = ctx.pack_hook(xs[0])  # this thread's first pack opens its step: Python's
        self.assertEqual(len(calls), 1)
        handles = [first] + [ctx.pack_hook(x) for x in xs[1:]]
        self.assertEqual(len(calls), 1)  # the other four in C alone
        self.assertEqual([type(h) for h in handles], [Saved] * 5)
        self.assertEqual([h.seq for h in handles], list(range(handles[0].seq,
                                                              handles[0].seq + 5)))
        self.assertTrue(all(h.tensor is x for h, x in zip(handles, xs)))
        step = ctx.store._thread.step
        self.assertEqual((step.packs, step.eligible, step.device), (5, 5, torch.device("cpu")))
        ctx.unpack_hook(handles[-1])  # backward began: the next pack ends the step in Python
        ctx.pack_hook(torch.randn(64, 64))
        self.assertEqual(len(calls), 2)
        ctx.pack_hook(torch.randn(64, 64))
        self.assertEqual(len(calls), 2)

    def run_both(self, pack_of):
        """The same tensors packed through the C hook and through Store.pack, each into a
        store of its own: (results described, step counts, statistics) of each."""
        torch.manual_seed(0)
        xs = tensors()
        out = []
        for use_c in (True, False):
            ctx = no_daemon_context(_small_to_host=True)
            pack = pack_of(ctx) if use_c else ctx.store.pack
            got = []
            for x in xs:
                r = pack(x)
                got.append((type(r).__name__, getattr(r, "nbytes", None),
                            r.tensor is x if isinstance(r, (Saved, Kept)) else None,
                            getattr(r, "own", None)))
            step = ctx.store._thread.step
            counts = (step.packs, step.eligible, dict(step.categories), step.largest_bytes,
                      step.device)
            out.append((got, counts, ctx.stats.as_dict()))
        return out

    def test_c_and_python_packs_leave_the_same_results_counts_and_statistics(self):
        c, py = self.run_both(lambda ctx: ctx.pack_hook)
        self.assertEqual(c, py)
        kinds = [g[0] for g in c[0]]
        # a handle; the small one, the parameter, the leaf that requires grad and the non-dense
        # one left in place; a dense view of a tensor not offloaded (yet) a handle of its own
        self.assertEqual(kinds, ["Saved", "Kept", "Kept", "Saved", "Kept", "Kept", "Saved"])
        self.assertEqual(c[1][:3], (7, 3, {"small": 1, "params": 1, "leaves": 1, "other": 1}))

    def test_pack_with_overrides_the_policy_as_store_pack_does(self):
        c, py = self.run_both(
            lambda ctx: functools.partial(ctx.pack_hook.__self__.pack_with, False, False))
        self.assertEqual(c, py)


class UnusualCasesTest(unittest.TestCase):
    def test_a_kept_error_goes_to_store_pack_which_raises_it(self):
        ctx = no_daemon_context()
        ctx.pack_hook(torch.randn(64, 64))
        calls = counting(ctx.store, "pack")
        ctx.store._async_error = errors.OffloaddError(errors.RESOURCE_EXHAUSTED, "pool full")
        with self.assertRaisesRegex(errors.OffloaddError, "pool full"):
            ctx.pack_hook(torch.randn(64, 64))
        self.assertEqual(len(calls), 1)
        self.assertIsNone(ctx.store._async_error)  # raised once
        ctx.pack_hook(torch.randn(64, 64))
        self.assertEqual(len(calls), 1)

    def test_pinning_not_known_yet_goes_to_store_pack(self):
        ctx = no_daemon_context(pin_memory=True)
        ctx.store._can_pin = None
        ctx.pack_hook(torch.randn(64, 64))  # opens the step (Python), and asks about CUDA
        self.assertIsNotNone(ctx.store._can_pin)
        calls = counting(ctx.store, "pack")
        ctx.pack_hook(torch.randn(64, 64))
        self.assertEqual(len(calls), 0)
        ctx.store._can_pin = None
        ctx.pack_hook(torch.randn(64, 64))
        self.assertEqual(len(calls), 1)

    def test_another_threads_unpacks_end_the_step_in_python(self):
        ctx = no_daemon_context()
        ctx.pack_hook(torch.randn(64, 64))
        calls = counting(ctx.store, "pack")
        ctx.store._foreign_unpacks += 1  # what an unpack on a thread that packs nothing does
        ctx.pack_hook(torch.randn(64, 64))
        self.assertEqual(len(calls), 1)

    def test_what_the_pump_or_the_front_raises_propagates(self):
        ctx = no_daemon_context()
        ctx.pack_hook(torch.randn(64, 64))

        def broken():
            raise RuntimeError("the pump broke")
        with mock.patch.object(_store, "_pump", broken):
            with self.assertRaisesRegex(RuntimeError, "the pump broke"):
                ctx.pack_hook(torch.randn(64, 64))
        with self.assertRaises(AttributeError) as from_python:
            ctx.store.pack(object())  # not a tensor: the front's reads of it raise
        with self.assertRaises(AttributeError) as from_c:
            ctx.pack_hook(object())
        self.assertEqual(str(from_c.exception), str(from_python.exception))
        self.assertEqual(type(ctx.pack_hook(torch.randn(64, 64))), Saved)  # serving still


class DueHandlesTest(DaemonTestCase):
    def test_each_due_handle_is_offloaded_once(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=4 * KIB,
                                     keep_last_n=1)
        offloads = counting(ctx.store, "_offload")
        xs = [torch.randn(64, 64) for _ in range(4)]
        handles = [ctx.pack_hook(x) for x in xs]
        self.assertTrue(ot.synchronize())
        # no lane for the shm backend's endpoint: every due handle through Store._offload
        self.assertEqual([h.seq for (h,) in offloads], [h.seq for h in handles[:3]])
        self.assertEqual([h.state for h in handles], [_store.OFFLOADED] * 3 + [_store.KEPT])
        self.assertEqual(ctx.stats.offloaded, 3)
        self.assertTrue(all(torch.equal(ctx.unpack_hook(h), x)
                            for h, x in zip(reversed(handles), reversed(xs))))


class UnpackTest(DaemonTestCase):
    def offloaded(self, n=3):
        """A context, n tensors and their handles, offloaded (the daemon's blocks)."""
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=4 * KIB,
                                     keep_last_n=0, prefetch=0)
        xs = [torch.randn(64, 64) for _ in range(n)]
        handles = [ctx.pack_hook(x) for x in xs]
        self.assertTrue(ot.synchronize())
        self.assertEqual([h.state for h in handles], [_store.OFFLOADED] * n)
        return ctx, xs, handles

    def test_the_usual_unpack_claims_reloads_and_lets_the_claim_go(self):
        ctx, xs, handles = self.offloaded()
        rest = counting(ctx.store, "_unpack_saved")
        claimed = counting(ctx.store, "_reload_claimed")
        got = [ctx.unpack_hook(h) for h in reversed(handles)]
        self.assertEqual(len(rest), 0)
        self.assertEqual([h.seq for (h,) in claimed], [h.seq for h in reversed(handles)])
        self.assertTrue(all(torch.equal(t, x) for t, x in zip(got, reversed(xs))))
        self.assertEqual([(h.unpacked, h.reloading) for h in handles], [(True, False)] * 3)
        self.assertIs(ctx.unpack_hook(handles[0]), got[-1])  # its result, not a second reload
        self.assertEqual(len(claimed), 3)
        self.assertTrue(ctx.store._unpacking)
        self.assertTrue(ctx.store._thread.step.unpacked)
        self.assertEqual((ctx.stats.reloaded, ctx.stats.waited + ctx.stats.prefetched_in_time),
                         (3, 3))

    def test_what_pack_left_in_place_and_other_states_go_to_python(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=4 * KIB,
                                     keep_last_n=1 << 30)
        left, rest = counting(ctx.store, "_unpack_left"), counting(ctx.store, "_unpack_saved")
        small, big = torch.randn(4), torch.randn(64, 64)
        kept, handle = ctx.pack_hook(small), ctx.pack_hook(big)
        self.assertIs(ctx.unpack_hook(handle), big)  # KEPT on the device: Python's
        self.assertIs(ctx.unpack_hook(kept), small)
        self.assertEqual((len(left), len(rest)), (1, 1))
        self.assertEqual(ctx.stats.kept, 1)

    def test_unpacks_of_a_thread_that_packs_nothing_count_once_each(self):
        ctx, xs, handles = self.offloaded()
        before = ctx.store._foreign_unpacks
        worker = threading.Thread(target=lambda: [ctx.unpack_hook(h) for h in handles[1:]])
        worker.start()
        worker.join()
        self.assertEqual(ctx.store._foreign_unpacks, before + 2)

    def test_a_failed_reload_lets_the_claim_go_and_raises(self):
        ctx, xs, handles = self.offloaded()

        def broken(s):
            raise RuntimeError("the reload broke")
        ctx.store._reload_claimed = broken
        with self.assertRaisesRegex(RuntimeError, "the reload broke"):
            ctx.unpack_hook(handles[-1])
        self.assertEqual((handles[-1].unpacked, handles[-1].reloading), (True, False))
        del ctx.store._reload_claimed
        self.assertTrue(torch.equal(ctx.unpack_hook(handles[-1]), xs[-1]))  # again: served

    def test_waiters_are_woken_when_the_claim_goes(self):
        ctx, xs, handles = self.offloaded()
        real, woken = ctx.store._reload_claimed, []

        def waited_for(s):  # what a second thread's _claim marks while it waits
            s.reloading = _store._WAITED
            return real(s)

        class Condition:
            def notify_all(self):
                woken.append(ctx.store._lock._is_owned())  # under the store's lock
        ctx.store._reload_claimed, ctx.store._reloaded = waited_for, Condition()
        self.assertTrue(torch.equal(ctx.unpack_hook(handles[-1]), xs[-1]))
        self.assertEqual(woken, [True])
        self.assertEqual(handles[-1].reloading, False)

    def both_unpacks(self):
        """(name, unpack hook) of the C hooks and of the store's Python, each for a context of
        its own with one offloaded handle: yields (name, ctx, handle, tensor)."""
        for name in ("C", "Python"):
            ctx, xs, handles = self.offloaded(1)
            unpack = ctx.unpack_hook if name == "C" else ctx.store.unpack
            yield name, ctx, unpack, handles[0], xs[0]

    def test_an_error_in_letting_the_claim_go_replaces_the_reloads_as_a_finally_does(self):
        for name, ctx, unpack, handle, x in self.both_unpacks():
            with self.subTest(name):
                real = ctx.store._reload_claimed

                def broken(s):
                    s.reloading = _store._WAITED  # a waiter to wake
                    raise ValueError("the reload broke")

                class Condition:
                    def notify_all(self):
                        raise Interrupt("interrupted while waking the waiters")
                ctx.store._reload_claimed, ctx.store._reloaded = broken, Condition()
                with self.assertRaises(Interrupt) as raised:
                    unpack(handle)
                self.assertIsInstance(raised.exception.__context__, ValueError)
                self.assertEqual(handle.reloading, False)  # the claim went all the same
                ctx.store._reload_claimed = real
                self.assertTrue(torch.equal(unpack(handle), x))

    def test_an_interrupted_wait_for_the_lock_still_lets_the_claim_go(self):
        for name, ctx, unpack, handle, x in self.both_unpacks():
            with self.subTest(name):
                armed = []
                lock = InterruptingLock(ctx.store._lock, "acquire", lambda: armed,
                                        error=Interrupt)
                real = ctx.store._reload_claimed

                def broken(s):
                    armed.append(1)  # the next wait for the lock, letting the claim go
                    raise ValueError("the reload broke")
                ctx.store._reload_claimed, ctx.store._lock = broken, lock
                with self.assertRaises(Interrupt) as raised:
                    unpack(handle)
                self.assertIsInstance(raised.exception.__context__, ValueError)
                self.assertEqual((lock.interrupts, handle.reloading), (1, False))
                ctx.store._reload_claimed = real
                self.assertTrue(torch.equal(within(10.0, unpack, handle), x))

    def test_a_handle_that_became_a_fallback_is_unpacked_again_by_python(self):
        ctx, xs, handles = self.offloaded()
        real, unpacks = ctx.store._reload_claimed, counting(ctx.store, "unpack")
        answers = [_store._AGAIN]
        ctx.store._reload_claimed = lambda s: answers.pop() if answers else real(s)
        self.assertTrue(torch.equal(ctx.unpack_hook(handles[-1]), xs[-1]))
        self.assertEqual(len(unpacks), 1)


class HooksObjectTest(unittest.TestCase):
    def test_hooks_are_made_once_for_a_store_with_a_front(self):
        ctx = no_daemon_context()
        with self.assertRaises(AttributeError):
            front_mod.Hooks(object(), {})
        fake = mock.Mock(_front=object())
        with self.assertRaisesRegex(TypeError, "not a Front"):
            front_mod.Hooks(fake, {})
        with self.assertRaisesRegex(TypeError, "_AGAIN, _WAITED, PREFETCH and _RECOVERABLE"):
            front_mod.Hooks(ctx.store, {})  # not the store module's globals
        hooks = front_mod.Hooks(ctx.store, vars(_store))
        with self.assertRaisesRegex(TypeError, "made once"):
            hooks.__init__(ctx.store, vars(_store))
        with self.assertRaisesRegex(TypeError, "never made"):
            front_mod.Hooks.__new__(front_mod.Hooks).pack(torch.randn(64, 64))
        with self.assertRaisesRegex(TypeError, "pack_with"):
            hooks.pack_with(True, torch.randn(64, 64))
        with self.assertRaisesRegex(TypeError, "keyword"):
            front_mod.Hooks(ctx.store, vars(_store), extra=1)
        self.assertIn(front_mod.Hooks, gc.get_referents(hooks))  # a heap type's instance

    def test_hooks_in_a_reference_cycle_are_collected(self):
        ctx = no_daemon_context()
        store = ctx.store
        store.cycle = front_mod.Hooks(store, vars(_store))
        gone = weakref.ref(store)
        del ctx, store
        gc.collect()
        self.assertIsNone(gone())

    def test_a_hook_reads_the_stores_pump_at_every_call(self):
        ctx = no_daemon_context()
        pumps = []
        with mock.patch.object(_store, "_pump", lambda: pumps.append(1)):
            ctx.pack_hook(torch.randn(64, 64))
            ctx.pack_hook(torch.randn(64, 64))
        self.assertGreaterEqual(len(pumps), 2)  # the first pack's Python path pumps again


if __name__ == "__main__":
    unittest.main()
