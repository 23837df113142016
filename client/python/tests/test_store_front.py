"""offloadd._store_front (client/core/store_front_module.c): the hooks' per-tensor records and
the front of their pack, without a daemon. The store's behaviour through them is tested by
test_hooks, test_steps, test_threads and the others; these check the module's own rules: what
a record holds, which tensors are left in place and why, de-duplication by identity (not by
address), the step's order and waiting queue, and a record's death (once, out of every
table, also when the cycle collector frees it)."""

import gc
import itertools
import sys
import random
import threading
import unittest
import warnings
import weakref

import torch

from daemon_fixture import PY_ROOT  # noqa: F401 -- puts the package on sys.path

from offloadd import _native
from offloadd.torch import _transport

front_mod = _native.load_store_front()
KEPT, OFFLOADING, OFFLOADED, LOST = 0, 1, 2, 4


class DeathLog:
    """A stand-in store: records the calls a record's death makes."""

    def __init__(self):
        self.deaths = []

    def _on_death(self, *fields):
        self.deaths.append(fields)


def dense_span(t):
    """The reference rule the module's classification must match: True when ``t``'s elements
    fill exactly ``numel`` consecutive elements of memory (what a transport copies as one span)."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def new_front():
    return front_mod.Front(torch.Tensor, torch.nn.Parameter, torch.strided)


class RecordTest(unittest.TestCase):
    def test_a_record_holds_the_layout_meta_reads(self):
        t = torch.randn(3, 4, 5).transpose(0, 2)
        s = front_mod.Saved(DeathLog(), 7, t)
        m = _transport.Meta(t)
        self.assertEqual((s.shape, s.stride, s.dtype, s.device, s.numel, s.nbytes),
                         (m.shape, m.stride, m.dtype, m.device, m.numel, m.nbytes))
        self.assertIs(s.meta, s)
        self.assertIs(s.src(), t)
        self.assertIs(s.tensor, t)
        self.assertEqual((s.seq, s.offset, s.step, s.state, s.version), (7, 0, 0, KEPT, 0))
        self.assertIsNone(s.block_id)
        self.assertFalse(s.unpacked)
        s.block_id, s.state, s.unpacked = 12, OFFLOADED, True
        self.assertEqual((s.block_id, s.state, s.unpacked), (12, OFFLOADED, True))
        with self.assertRaises(TypeError):
            s.unpacked = 1  # a bool, as the store writes it
        with self.assertRaises(AttributeError):
            s.nbytes = 3

    def test_death_calls_the_store_once_with_the_fields(self):
        log = DeathLog()
        s = front_mod.Saved(log, 0, torch.zeros(4))
        s.offset, s.state, s.block_id, s.ep, s.reload = 3, OFFLOADED, 9, "ep", "rl"
        del s
        self.assertEqual(log.deaths, [(False, 3, OFFLOADED, "ep", None, "rl", 9, False)])
        quiet = front_mod.Saved(log, 1, torch.zeros(4))
        quiet.dead = True
        del quiet
        self.assertEqual(len(log.deaths), 1)

    def test_a_record_in_a_reference_cycle_dies_once_through_the_collector(self):
        log = DeathLog()
        s = front_mod.Saved(log, 0, torch.zeros(4))
        s.state, s.block_id, s.ep = OFFLOADED, 5, "ep"
        box = [s]
        s.result = box  # s -> box -> s
        del s, box
        gc.collect()
        self.assertEqual(log.deaths, [(False, 0, OFFLOADED, "ep", None, None, 5, False)])

    def test_seq_is_read_only(self):
        """The order finds a handle's slot by its number: a handle renumbered would die
        without leaving it."""
        s = front_mod.Saved(DeathLog(), 4, torch.zeros(4))
        with self.assertRaises(AttributeError):
            s.seq = 5
        self.assertEqual(s.seq, 4)

    def test_a_record_that_could_not_be_made_tells_the_store_nothing(self):
        class Broken:
            nbytes = 16

            @property
            def shape(self):
                raise ValueError("no shape")
        log = DeathLog()
        with self.assertRaisesRegex(ValueError, "no shape"):
            front_mod.Saved(log, 0, Broken())
        gc.collect()
        self.assertEqual(log.deaths, [])

    def test_a_dying_handle_is_out_of_the_tables_before_its_weak_references_call_back(self):
        """A weak reference's callback runs while the handle dies: packing the same tensor
        there, or looking the handle up, must not hand the dying handle out again."""
        front, store, t = new_front(), DeathLog(), torch.ones(1024)
        h = front.pack(t, 0, False, store, None)
        seq, seen = h.seq, []

        def callback(ref):
            seen.append((front.entry(seq), front.pack(t, 0, False, store, None),
                         front.handles()))
        ref = weakref.ref(h, callback)
        del h
        ((entry, again, handles),) = seen
        self.assertIsNone(entry)
        self.assertIsInstance(again, front_mod.Saved)
        self.assertEqual((again.seq, again.shape), (1, torch.Size([1024])))
        self.assertEqual(handles, [again])
        self.assertIsNone(ref())

    def test_the_usual_end_discards_the_offset_without_calling_the_store(self):
        """An unpacked handle with nothing to free ends in C: its offset leaves the store's
        _unused_offsets and _on_death is not called. Every other end calls it, with the
        fields: not unpacked, an offload in flight, a block left, or a store without a set."""
        class Store(DeathLog):
            def __init__(self):
                super().__init__()
                self._unused_offsets = {3, 5}

        def dies(store, unpacked=True, state=2, op=None, block_id=None):
            s = front_mod.Saved(store, 0, torch.zeros(4))
            s.offset, s.unpacked, s.state, s.op, s.block_id = 3, unpacked, state, op, block_id
            del s
            return store

        for state in (0, 2, 3, 4):  # KEPT, OFFLOADED (its block freed by the reload), ...
            with self.subTest(state=state):
                store = dies(Store(), state=state)
                self.assertEqual((store._unused_offsets, store.deaths), ({5}, []))
        op = object()
        cases = {"not unpacked": dict(unpacked=False), "in flight": dict(state=1, op=op),
                 "a block left": dict(state=2, block_id=7)}
        for name, fields in cases.items():
            with self.subTest(name):
                store = dies(Store(), **fields)
                self.assertEqual(store._unused_offsets, {3, 5})
                ((unpacked, offset, state, _, got_op, _, block_id, _),) = store.deaths
                self.assertEqual((unpacked, offset, state, block_id),
                                 (fields.get("unpacked", True), 3, fields.get("state", 2),
                                  fields.get("block_id")))
                self.assertIs(got_op, fields.get("op"))
        store = dies(DeathLog())  # no _unused_offsets: the store decides
        self.assertEqual(len(store.deaths), 1)
        store = DeathLog()
        store._unused_offsets = [3]  # not a set
        self.assertEqual(len(dies(store).deaths), 1)

    def test_what_death_raises_is_dropped(self):
        calls = []

        class Raising:
            def _on_death(self, *fields):
                calls.append(fields[1])
                raise RuntimeError("boom")
        s = front_mod.Saved(Raising(), 0, torch.zeros(4))
        s.offset = 6
        del s  # raises nothing here
        self.assertEqual(calls, [6])
        self.assertEqual(front_mod.Saved(DeathLog(), 2, torch.zeros(1)).seq, 2)


class PackTest(unittest.TestCase):
    def setUp(self):
        self.front, self.store, self.counts = new_front(), DeathLog(), object()

    def pack(self, t, threshold=16, pin=False):
        return self.front.pack(t, threshold, pin, self.store, self.counts)

    def test_categories_of_tensors_left_in_place(self):
        w = torch.nn.Parameter(torch.randn(64, 64))
        leaf = torch.randn(64, 64, requires_grad=True)
        marked = torch.randn(64, 64)
        marked._is_param = True
        self.assertEqual(self.pack(w), "params")
        self.assertEqual(self.pack(w[1:]), "params")  # a view of a parameter
        self.assertEqual(self.pack(marked), "params")
        self.assertEqual(self.pack(leaf), "leaves")
        self.assertEqual(self.pack(torch.randn(2)), "small")  # 8 bytes < 16
        self.assertEqual(self.pack(torch.randn(64, 64)[:, ::2]), "other")  # not dense
        self.assertEqual(self.pack(torch.randn(64, 64).to_sparse()), "other")
        self.assertEqual(self.pack(torch.randn(64, 64), threshold=1 << 20), "small")
        self.assertEqual(self.front.live(), 0)

    def test_the_same_tensor_shares_a_handle_and_its_views_stay(self):
        t = torch.randn(64, 64)
        s = self.pack(t)
        self.assertIsInstance(s, front_mod.Saved)
        self.assertIs(self.pack(t), s)
        self.assertEqual(self.pack(t[1:]), "views")  # a view of a saved tensor
        base = torch.randn(64, 64)
        v = self.pack(base[2:])
        self.assertEqual((v.shape, self.pack(base)), (torch.Size([62, 64]), "views"))
        self.assertEqual((self.front.live(), self.front.seen_entries()), (2, 3))

    def test_saved_again_after_an_in_place_change_gets_a_handle_of_its_own(self):
        t = torch.randn(64, 64)
        s = self.pack(t)
        t.add_(1)
        s2 = self.pack(t)
        self.assertIsNot(s2, s)
        self.assertEqual((s.modified, s2.version, s2.modified), (1, 1, None))

    def test_identity_not_address(self):
        """A handle whose tensor died (offloaded: the handle holds no tensor) matches no new
        tensor at the same address."""
        s = self.pack(torch.randn(64, 64))
        s.tensor = None
        tried = 0
        for _ in range(200):
            t = torch.randn(64, 64)
            tried += 1
            r = self.pack(t)
            self.assertIsNot(r, s)
        self.assertEqual(tried, 200)

    def test_a_new_step_never_reuses_an_earlier_handle(self):
        t = torch.randn(64, 64)
        s = self.pack(t)
        self.front.end_step()
        self.assertEqual(self.front.step_index, 1)
        s2 = self.pack(t)
        self.assertIsNot(s2, s)
        self.assertEqual((s2.step, s2.offset, s2.seq), (1, 0, 1))
        s2.state = LOST
        self.front.end_step()
        # a LOST handle of this step is not reused either
        s3 = self.pack(t)
        s3.state = LOST
        self.assertIsNot(self.pack(t), s3)

    def test_a_new_handle_carries_its_counts_and_pin_from_the_start(self):
        s = self.pack(torch.randn(64, 64), pin=True)
        self.assertIs(s.counts, self.counts)
        self.assertIs(s.pin, True)
        self.assertIs(self.pack(s.src()), s)  # the same handle: its counts stay

    def test_counts_given_as_floats_are_taken_as_the_comparisons_would(self):
        t = torch.randn(64, 64)  # 16384 bytes
        self.assertEqual(self.front.pack(t, 16384.5, False, self.store, None), "small")
        s = self.front.pack(t, 16384.0, False, self.store, None)
        self.assertIsInstance(s, front_mod.Saved)
        self.assertIsNone(self.front.pop_due(1.9))  # keep_last_n 1: nothing due
        self.assertEqual(self.front.pop_due(0.0), [s])
        self.assertEqual(self.front.pack(torch.randn(64, 64), float("inf"), False, self.store,
                                         None), "small")
        with self.assertRaisesRegex(ValueError, "NaN"):
            self.front.pop_due(float("nan"))
        with self.assertRaises(TypeError):
            self.front.pop_due("1")
        s.state = OFFLOADED
        later = self.pack(torch.randn(64, 64))
        self.assertEqual(self.front.prefetch_candidates(later.seq, None, 1.5, set()), [s])

    def test_dimensions_of_size_one_do_not_count_toward_the_limit(self):
        t = torch.randn([1] * 70 + [4096])
        self.assertIsInstance(self.pack(t), front_mod.Saved)

    def test_order_queue_and_due(self):
        ts = [torch.randn(64, 64) for _ in range(5)]
        hs = [self.pack(t) for t in ts]
        self.assertEqual([h.seq for h in hs], [0, 1, 2, 3, 4])
        self.assertEqual([h.offset for h in hs], [0, 1, 2, 3, 4])
        hs[1].unpacked = True  # in backward already: not offloaded
        hs[2].state = OFFLOADING
        self.assertEqual(self.front.pop_due(1), [hs[0], hs[3]])
        self.assertIsNone(self.front.pop_due(1))
        self.assertIs(self.front.entry(3), hs[3])
        self.assertIsNone(self.front.entry(9))
        del hs[0]
        self.assertIsNone(self.front.entry(0))
        self.assertEqual(self.front.handles(), hs)

    def test_prefetch_candidates_backward_and_forward(self):
        ts = [torch.randn(64, 64) for _ in range(6)]
        hs = [self.pack(t) for t in ts]
        for h in hs:
            h.state = OFFLOADED
        pick = self.front.prefetch_candidates
        self.assertEqual(pick(5, None, 2, set()), [hs[4], hs[3]])  # reverse order
        hs[4].reload = "sent"  # already reloading: counts, not picked again
        self.assertEqual(pick(5, None, 2, set()), [hs[3]])
        # position 3 left unused before: skipped, the scan goes on to 2
        self.assertEqual(pick(5, None, 2, {3}), [hs[2]])
        # forward: the previous unpack was the entry before (a compiled backward)
        hs[0].unpacked = hs[1].unpacked = True
        self.assertEqual(pick(1, 0, 1, set()), [hs[2]])
        self.assertEqual(pick(5, None, 0, set()), [])
        # not forward (the previous unpack was not the entry before, which still waits): back only
        self.assertEqual(pick(3, 4, 3, set()), [hs[2]])
        hs[2].unpacked = True  # nothing before waits: 3 starts a run, forward too
        self.assertEqual(pick(3, 4, 2, set()), [hs[5]])  # hs[4] reloading already

    def test_the_table_finds_every_live_entry_through_growth_and_deaths(self):
        """Thousands of entries (the table grows), random handles dying (their entries leave,
        the others move up their probe runs): every live tensor still finds its own handle."""
        rng = random.Random(3)
        ts = [torch.empty(8) for _ in range(3000)]
        hs = [self.pack(t, threshold=1) for t in ts]
        self.assertEqual(self.front.seen_entries(), 3000)
        for i in rng.sample(range(3000), 1700):
            hs[i] = None
        live = [i for i, h in enumerate(hs) if h is not None]
        self.assertEqual((self.front.seen_entries(), self.front.live()), (1300, 1300))
        for i in live:
            self.assertIs(self.pack(ts[i], threshold=1), hs[i])
        more = [self.pack(torch.empty(8), threshold=1) for _ in range(500)]
        self.assertEqual(self.front.seen_entries(), 1300 + 500)
        for i in live:
            self.assertIs(self.pack(ts[i], threshold=1), hs[i])

    def test_a_handle_only_a_garbage_cycle_holds_survives_the_collector_inside_a_call(self):
        """pop_due and prefetch_candidates allocate while they walk the tables; the cycle
        collector may run then. A handle found in a table is held first, so a handle that only
        a garbage cycle (and the tables) pointed at comes back whole, not freed under the
        call."""
        for call in ("pop_due", "prefetch_candidates"):
            front, store = new_front(), DeathLog()
            t = torch.ones(1024)
            h = front.pack(t, 0, False, store, None)
            other = front.pack(torch.ones(1024), 0, False, store, None)  # seq 1: the unpacked
            if call == "prefetch_candidates":
                h.state = other.state = OFFLOADED
            threshold, unused = gc.get_threshold(), {5}  # no allocation between enable and call
            gc.collect()  # what lives now is old: a young collection leaves it alone
            try:
                gc.disable()
                cycle = [h]  # young: collected by the young collection below, and h with it
                cycle.append(cycle)
                del h, t, cycle
                keep = [[] for _ in range(10)]  # gen0's count past the threshold below
                gc.set_threshold(1)
                gc.enable()
                got = front.pop_due(1) if call == "pop_due" else \
                    front.prefetch_candidates(1, None, 1, unused)
            finally:
                gc.set_threshold(*threshold)
                gc.enable()
            self.assertEqual(len(got), 1, call)
            self.assertEqual((got[0].seq, got[0].nbytes, got[0].shape),
                             (0, 4096, torch.Size([1024])), call)
            self.assertEqual(len(keep), 10)
            self.assertEqual(store.deaths, [], call)

    def test_forget_leaves_the_parents_handles_out(self):
        old = [self.pack(torch.randn(64, 64)) for _ in range(3)]
        self.front.forget()
        self.assertEqual((self.front.live(), self.front.seen_entries()), (0, 0))
        self.assertIsNone(self.front.pop_due(0))
        new = self.pack(torch.randn(64, 64))
        del old  # their deaths touch nothing of the new tables
        self.assertEqual(self.front.handles(), [new])
        self.assertIs(self.front.entry(new.seq), new)

    def test_dense_span_as_the_reference_rule_decides(self):
        """Every stride permutation and slicing of a small tensor: the module's rule is
        dense_span's (above)."""
        rng = random.Random(7)
        base = torch.randn(4, 3, 5, 2)
        cases = 0
        for perm in itertools.permutations(range(4)):
            for _ in range(6):
                t = base.permute(*perm)
                dim = rng.randrange(4)
                if rng.random() < 0.5 and t.shape[dim] > 1:
                    t = t.narrow(dim, 0, t.shape[dim] - 1)
                if rng.random() < 0.3:
                    t = t.contiguous()
                got = self.pack(t, threshold=1)
                if dense_span(t):
                    self.assertIsInstance(got, front_mod.Saved, (perm, t.shape, t.stride()))
                else:
                    self.assertEqual(got, "other", (perm, t.shape, t.stride()))
                self.front.end_step()
                cases += 1
        self.assertEqual(cases, 144)


class StoreThreadsTest(unittest.TestCase):
    def test_threads_packing_into_one_store_never_offload_a_handle_half_filed(self):
        """Threads share a store (keep_last_n=0: each pack offloads what is due, possibly
        another thread's handle): a handle is filed with its step's counts already set, so
        another thread's offload of it finds them (it raised AttributeError on None)."""
        import offloadd.torch as ot
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            ctx = ot.offload_checkpoints(threshold_bytes=1, keep_last_n=0, prefetch=0,
                                         socket_path="/nonexistent/offloadd.sock",
                                         retry_seconds=1e9)
            failures, switch = [], sys.getswitchinterval()
            sys.setswitchinterval(1e-6)

            def work():
                w = torch.randn(64, requires_grad=True)
                try:
                    for _ in range(1500):
                        with ctx:
                            y = (w * 2).exp().sum()
                        y.backward()
                except Exception as e:  # noqa: BLE001 -- counted below
                    failures.append(repr(e))
            threads = [threading.Thread(target=work) for _ in range(4)]
            try:
                for th in threads:
                    th.start()
                for th in threads:
                    th.join()
            finally:
                sys.setswitchinterval(switch)
        self.assertEqual(failures, [])
        self.assertEqual(ctx.stats.fallbacks, 4 * 1500)  # exp's output, one a step


if __name__ == "__main__":
    unittest.main()
