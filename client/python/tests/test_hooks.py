"""offload_checkpoints and save_on_cpu against a real daemon (shm backend, CPU tensors).

The tiny model: L=4 layers, batch 2, sequence 64, hidden 64, fp32 (one layer input = 32 KiB;
threshold 16 KiB). Assertions are on counts, shapes and bits: exactly the L layer inputs pass
through the daemon, and the loss and every parameter gradient are bitwise equal to the step
without offload and to the step with checkpointing alone.
"""

import gc
import os
import subprocess
import sys
import unittest
import warnings
import weakref
from unittest import mock

import torch
from daemon_fixture import (B, H, L, LAYER_BYTES, PY_ROOT, S, THRESHOLD, DaemonTestCase,
                            bitwise_equal, record_offloaded_shapes, run_step)

import offloadd.torch as ot
import tiny_lm
from offloadd.torch import _endpoint
from offloadd.torch._store import HostCopy, Kept, Saved
from offloadd._outcome import Outcome as Completion

torch.set_num_threads(2)


class OffloadCheckpointsTest(DaemonTestCase):
    def context(self, **kw):
        kw.setdefault("threshold_bytes", THRESHOLD)
        kw.setdefault("keep_last_n", 0)
        return ot.offload_checkpoints(socket_path=self.daemon.sock, **kw)

    def test_layer_inputs_pass_through_the_daemon_bitwise_equal(self):
        self.check_layer_inputs("hooks-reentrant", "reentrant")

    def test_non_reentrant_checkpoint_on_torch_2(self):
        self.check_layer_inputs("hooks", "checkpoint")

    def check_layer_inputs(self, mode, checkpoint_mode):
        plain = run_step("plain")
        ckpt = run_step(checkpoint_mode)
        self.assertTrue(bitwise_equal(plain, ckpt))
        ctx = self.context()
        shapes = record_offloaded_shapes(ctx)
        before = self.daemon.stats()
        out = run_step(mode, ctx)
        self.assertTrue(ot.synchronize())
        after = self.daemon.stats()
        self.assertEqual(shapes, [(B, S, H)] * L)
        self.assertEqual(after.offloads_total - before.offloads_total, L)
        self.assertEqual(after.offload_bytes_total - before.offload_bytes_total, L * LAYER_BYTES)
        self.assertEqual(after.reloads_total - before.reloads_total, L)
        st = ctx.stats
        self.assertEqual((st.offloaded, st.offloaded_bytes), (L, L * LAYER_BYTES))
        self.assertEqual((st.reloaded, st.reloaded_bytes), (L, L * LAYER_BYTES))
        self.assertEqual(st.prefetched_in_time + st.waited, L)
        self.assertEqual((st.fallbacks, st.kept, st.lost), (0, 0, 0))
        self.assertTrue(bitwise_equal(out, plain), "offload changed the loss or a gradient")
        self.assertTrue(bitwise_equal(out, ckpt))
        self.assertEqual(after.blocks, 0)
        self.assertEqual(ctx.store.live_handles(), 0)

    def test_offloaded_tensors_leave_the_process_until_backward(self):
        for mode in ("hooks-reentrant", "offloadd"):
            ctx = self.context(keep_last_n=1)
            data = tiny_lm.CharData()
            model = tiny_lm.make_model(data.vocab, L, H, 4)
            inputs, addresses = [], []  # weak references to every block's input, its bytes

            def note(module, args):
                inputs.append(weakref.ref(args[0]))
                addresses.append(args[0].data_ptr())
            for block in model.blocks:
                block.register_forward_pre_hook(note)
            idx, tgt = data.batch(B, S, torch.Generator().manual_seed(1))
            loss = model(idx, tgt, mode, ctx)
            self.assertTrue(ot.synchronize())
            gc.collect()
            # Nothing else (autograd graph, checkpoint closures) holds the offloaded inputs.
            self.assertEqual([r() is not None for r in inputs], [False] * (L - 1) + [True])
            handles = ctx.store.handles()
            self.assertEqual(len(handles), L)
            held = [h.tensor is not None or h.op is not None for h in handles]
            self.assertEqual(held, [False] * (L - 1) + [True], mode)  # only the newest is kept
            self.assertEqual(handles[-1].tensor.data_ptr(), addresses[-1])
            self.assertEqual(self.daemon.stats().blocks, L - 1)
            (ep,) = _endpoint.endpoints()
            self.assertEqual(ep.transport.arena.used_bytes, 0)  # staging slots freed too
            loss.backward()
            del loss, handles
            self.assertTrue(ot.synchronize())
            self.assertEqual(self.daemon.stats().blocks, 0)

    def test_an_offloaded_tensor_costs_its_offload_and_its_reload_and_no_release(self):
        ctx = self.context()
        ref = run_step("plain")
        run_step("hooks-reentrant", ctx)  # connects and registers the staging arena
        self.assertTrue(ot.synchronize())
        (ep,) = _endpoint.endpoints()
        kinds, release_after = [], []
        submit = ep.client._submit

        def counting(request, *args, **kwargs):
            kinds.append(request.WhichOneof("body"))
            if kinds[-1] == "reload":
                release_after.append(request.reload.release_after)
            return submit(request, *args, **kwargs)
        ring_submit = ep.client._submit_on_ring
        names = {0: "offload", 1: "reload", 2: "release"}  # the ring's submission kinds

        def counting_ring(kind, args, *op):  # the request ring (native core), when attached
            kinds.append(names[kind])
            if kinds[-1] == "reload":
                release_after.append(args[4])
            return ring_submit(kind, args, *op)
        ep.client._submit = counting
        ep.client._submit_on_ring = counting_ring
        self.assertTrue(ep.client.ring_active, ep.client.ring_error)  # through the native core
        on_ring = ep.client.counters.ring_answers_received
        out = run_step("hooks-reentrant", ctx)
        self.assertTrue(ot.synchronize())
        self.assertEqual(ep.client.counters.ring_answers_received - on_ring, 2 * L)
        self.assertEqual(ctx.store.live_handles(), 0)
        self.assertEqual((kinds.count("offload"), kinds.count("reload"), kinds.count("release")),
                         (L, L, 0))
        self.assertEqual(release_after, [True] * L)  # each reload frees its block
        self.assertEqual(self.daemon.stats().blocks, 0)
        self.assertTrue(bitwise_equal(out, ref))

    def test_a_step_looks_up_its_endpoint_and_asks_about_cuda_once(self):
        ctx = self.context(pin_memory=True)
        run_step("hooks-reentrant", ctx)
        from_store = []
        real = torch.cuda.is_available

        def is_available():
            if sys._getframe(1).f_code.co_filename.endswith("_store.py"):
                from_store.append(1)
            return real()
        with mock.patch.object(torch.cuda, "is_available", is_available), \
                mock.patch.object(_endpoint, "get", wraps=_endpoint.get) as get:
            run_step("hooks-reentrant", ctx)
            run_step("hooks-reentrant", ctx)
        self.assertEqual(ctx.stats.offloaded, 3 * L)
        self.assertEqual(len(from_store), 2)  # once per step, not once per pack
        self.assertEqual(get.call_count, 2)   # the step's first offload only

    def test_keep_last_n_keeps_the_newest_on_the_device(self):
        ref = run_step("plain")
        ctx = self.context(keep_last_n=1)
        out = run_step("hooks-reentrant", ctx)
        st = ctx.stats
        self.assertEqual((st.offloaded, st.kept, st.reloaded), (L - 1, 1, L - 1))
        self.assertTrue(bitwise_equal(out, ref))

    def test_backward_prefetches_in_reverse_order(self):
        ctx = self.context(prefetch=1)
        run_step("hooks-reentrant", ctx)
        # The first unpack (layer L) is urgent and prefetches L-1, whose unpack prefetches L-2...
        # so at most the first reload and any late prefetch wait.
        st = ctx.stats
        self.assertEqual(st.prefetched_in_time + st.waited, L)
        self.assertGreaterEqual(st.waited, 1)
        none = self.context(prefetch=0)
        run_step("hooks-reentrant", none)
        self.assertEqual((none.stats.prefetched_in_time, none.stats.waited), (0, L))

    def test_default_threshold_leaves_small_tensors(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock)  # 1 MiB > 32 KiB
        out = run_step("hooks-reentrant", ctx)
        self.assertEqual(ctx.stats.offloaded, 0)
        self.assertEqual(ctx.stats.skipped_small, L)
        self.assertTrue(bitwise_equal(out, run_step("plain")))

    def test_steps_in_a_row_reuse_one_context(self):
        ctx = self.context(keep_last_n=1)
        data = tiny_lm.CharData()
        model = tiny_lm.make_model(data.vocab, L, H, 4)
        ref_model = tiny_lm.make_model(data.vocab, L, H, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
        for step in range(3):
            a = run_step("hooks-reentrant", ctx, batch_seed=step, model=model)
            b = run_step("plain", batch_seed=step, model=ref_model)
            self.assertTrue(bitwise_equal(a, b), "step %d differs" % step)
            opt.step()
            ref_opt.step()
        self.assertEqual(ctx.stats.offloaded, 3 * (L - 1))


class EligibilityTest(DaemonTestCase):
    """What the pack hook leaves in place; driven with saved_tensors_hooks directly."""

    def store(self, **kw):
        return ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=1024,
                                      keep_last_n=0, **kw).store

    def assertLeftInPlace(self, st, t):
        """pack left ``t`` in place: a Kept holding it, which unpacks to ``t`` itself."""
        packed = st.pack(t)
        self.assertIsInstance(packed, Kept)
        self.assertIs(packed.tensor, t)
        self.assertIs(st.unpack(packed), t)

    def test_tensors_left_in_place_and_modified_in_place_raise_as_without_hooks(self):
        # torch skips its own saved-tensor version check once hooks are installed: a weight
        # updated in place before backward (an optimizer step) or a small saved tensor changed
        # in place gave wrong gradients silently.
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=1 << 20,
                                     keep_last_n=0)
        w = torch.nn.Parameter(torch.randn(8, 8))
        x = torch.randn(4, 8, requires_grad=True)
        with ctx:
            y = (x @ w).sum()  # saves x (a leaf) and w (a parameter), both left in place
        with torch.no_grad():
            w.add_(1.0)
        with self.assertRaisesRegex(RuntimeError, "modified by an inplace operation"):
            y.backward()
        a = torch.randn(4, 8, requires_grad=True)
        with ctx:
            b = a * 2
            c = (b * b).sum()  # saves b: below the threshold
        with torch.no_grad():
            b.mul_(3.0)
        with self.assertRaisesRegex(RuntimeError, "is at version 1; expected version 0"):
            c.backward()
        with ctx:  # unmodified: backward as without hooks
            c2 = (a * 2 * (a * 2)).sum()
        c2.backward()
        self.assertTrue(torch.equal(a.grad, 8 * a.detach()))

    def test_parameters_views_small_and_non_dense_stay(self):
        st = self.store()
        p = torch.nn.Parameter(torch.randn(64, 64))
        big = torch.randn(64, 64) + 0
        self.assertLeftInPlace(st, p)
        pt = p.t()
        self.assertLeftInPlace(st, pt)  # a view of a parameter
        small = torch.randn(8)
        self.assertLeftInPlace(st, small)
        leaf = torch.randn(64, 64, requires_grad=True)
        self.assertLeftInPlace(st, leaf)
        strided = torch.randn(64, 128)[:, ::2]
        self.assertLeftInPlace(st, strided)
        h1 = st.pack(big)
        self.assertIsInstance(h1, Saved)
        self.assertIs(st.pack(big), h1)  # the same tensor saved twice: one handle
        view = big[:32]
        self.assertLeftInPlace(st, view)  # a view of a tensor already offloaded
        s = st.stats
        self.assertEqual((s.skipped_params, s.skipped_leaves, s.skipped_small, s.skipped_other,
                          s.skipped_views), (2, 1, 1, 1, 1))
        self.assertTrue(torch.equal(st.unpack(h1), big))

    def test_the_dedup_table_is_bounded_and_emptied_per_step(self):
        """The table of a step's saved tensors (for de-duplication) holds an entry per saved
        tensor (and base) whose handle lives: a store whose steps never end (packs without
        backward) holds no more than its live handles' entries, a step's end empties it, and a
        new tensor at a dead one's address (id) is a tensor of its own."""
        st = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=1024,
                                    keep_last_n=1 << 20).store  # nothing offloaded
        kept = []
        with warnings.catch_warnings():  # its steps send nothing, by design
            warnings.simplefilter("ignore", RuntimeWarning)
            for i in range(5000):
                t = torch.empty(512)  # 2 KiB: above threshold_bytes
                h = st.pack(t)
                if i < 5:
                    kept.append((t, h))
        del t, h
        self.assertEqual(st.seen_entries(), 5)  # the dead handles' entries left with them
        self.assertEqual(st.live_handles(), 5)
        for t, h in kept:  # live entries stay: the same tensor, the same handle
            self.assertIs(st.pack(t), h)
        fresh = torch.empty(512)
        self.assertIsNot(st.pack(fresh), st.pack(torch.empty(512)))
        st.unpack(kept[0][1])
        new = st.pack(torch.empty(512))  # a pack after an unpack: the next step
        self.assertEqual(st.seen_entries(), 1)  # the new step's handle alone
        del new
        self.assertEqual(st.seen_entries(), 0)
        self.assertIsNot(st.pack(kept[0][0]), kept[0][1])  # an earlier step's handle: not reused

    def test_nested_tensors_saved_by_autograd_stay_in_place(self):
        """A nested tensor of the strided layout (NestedTensorImpl: no sizes, no strides) is not
        a dense tensor: forward and backward through the hooks work, the gradient is the one
        without hooks, and the nested tensors are left in place (skipped_other), none sent."""
        torch.manual_seed(0)
        parts = [torch.randn(64, 64), torch.randn(32, 64)]

        def grads(st):
            nt = torch.nested.nested_tensor(parts, requires_grad=True)
            z = nt * 2
            if st is None:
                y = z * z
            else:
                with torch.autograd.graph.saved_tensors_hooks(st.pack, st.unpack):
                    y = z * z
            y.backward(torch.nested.nested_tensor([torch.ones(64, 64), torch.ones(32, 64)]))
            return [g.clone() for g in nt.grad.unbind()]

        want = grads(None)
        st = self.store()
        got = grads(st)
        self.assertEqual(len(got), 2)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, want)))
        self.assertEqual((st.stats.skipped_other, st.stats.offloaded), (2, 0))

    def test_transposed_tensor_round_trips_with_its_strides(self):
        st = self.store()
        t = (torch.randn(96, 64) + 0).t()
        h = st.pack(t)
        self.assertIsInstance(h, Saved)
        back = st.unpack(h)
        self.assertEqual(back.stride(), t.stride())
        self.assertTrue(torch.equal(back, t))

    def test_dtypes_round_trip_bitwise(self):
        st = self.store()
        for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.bool, torch.float64):
            t = (torch.randn(32, 64) * 100).to(dtype)
            back = st.unpack(st.pack(t))
            self.assertEqual(back.dtype, dtype)
            self.assertTrue(torch.equal(back.view(-1), t.view(-1)), str(dtype))


class DroppedGraphTest(DaemonTestCase):
    """A graph dropped without backward (an evaluation under the context with grad on, a step
    that raised before backward) frees what its handles held. A tensor saved by the node that
    produced it (exp's output) used to be held by its handle, whose saved variable its grad_fn
    holds: a cycle through torch's graph that Python's collector cannot see, so the tensor,
    fallen back or left in place as small, lived forever. One waiting for keep_last_n lives
    until later packs offload it."""

    def dropped(self, ctx, size):
        x = torch.randn(size, requires_grad=True)
        outputs = []
        for _ in range(6):
            with ctx:
                y = (x * 2).exp()  # exp saves its own output
            outputs.append(weakref.ref(y))
            del y
        gc.collect()
        return sum(r() is not None for r in outputs)

    def test_kept_fallen_back_and_small_tensors_of_a_dropped_graph_are_freed(self):
        kept = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=1024,
                                      keep_last_n=4)
        self.assertEqual(self.dropped(kept, 1 << 14), 4)  # the newest 4 wait, held
        for _ in range(4):  # later packs offload them: their tensors go
            kept.store.pack(torch.randn(1 << 14))
        self.assertTrue(ot.synchronize())
        gc.collect()
        self.assertEqual(kept.store.live_handles(), 0)
        self.assertTrue(ot.synchronize())
        self.assertEqual(self.daemon.stats().blocks, 0)  # the dead handles' blocks released
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            fallback = ot.offload_checkpoints(
                socket_path=self.daemon.sock + ".none", threshold_bytes=1024,
                keep_last_n=0, retry_seconds=1e9)
            self.assertEqual(self.dropped(fallback, 1 << 14), 0)
            self.assertEqual(fallback.stats.fallbacks, 6)
            small = ot.offload_checkpoints(socket_path=self.daemon.sock,
                                           threshold_bytes=1 << 20)
            self.assertEqual(self.dropped(small, 1 << 10), 0)
            self.assertEqual(small.stats.skipped_small, 6)
        self.assertEqual(fallback.store.live_handles(), 0)

    def test_a_kept_output_still_gives_exact_gradients_first_and_second_order(self):
        def grads(ctx):
            torch.manual_seed(0)
            x = torch.randn(1 << 14, requires_grad=True, dtype=torch.float64)
            with ctx:
                y = x.exp().tanh().sigmoid()  # each saves its output
                g, = torch.autograd.grad(y.sum(), x, create_graph=True)
                gg, = torch.autograd.grad(g.sum(), x)
            return g.detach(), gg
        plain = grads(torch.autograd.graph.saved_tensors_hooks(lambda t: t, lambda t: t))
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=1024,
                                     keep_last_n=8)
        got = grads(ctx)
        self.assertTrue(torch.equal(got[0], plain[0]) and torch.equal(got[1], plain[1]))
        self.assertGreater(ctx.stats.kept, 0)


class SaveOnCpuTest(DaemonTestCase):
    """The drop-in for torch.autograd.graph.save_on_cpu, used the way Transformers uses it."""

    def setUp(self):
        super().setUp()
        os.environ["OFFLOADD_SOCKET"] = self.daemon.sock
        ot.default_context(threshold_bytes=THRESHOLD, keep_last_n=0)

    def tearDown(self):
        del os.environ["OFFLOADD_SOCKET"]
        ot.default_context(name="default")  # back to defaults for other tests

    def test_signature_matches_torch(self):
        import inspect
        ours = inspect.signature(ot.save_on_cpu.__init__).parameters
        self.assertEqual(list(ours)[1:3], ["pin_memory", "device_type"])
        self.assertIsInstance(ot.save_on_cpu(), torch.autograd.graph.saved_tensors_hooks)

    def test_transformers_style_wrapping_is_bitwise_equal(self):
        # transformers.modeling_utils (>= 5.17): checkpoint_func wraps every checkpoint call in
        # a new save_on_cpu(pin_memory=True, device_type=...) -- swapped here for ours.
        def checkpoint_func(function, *args, **kwargs):
            with ot.save_on_cpu(pin_memory=True, device_type="cpu"):
                return torch.utils.checkpoint.checkpoint(function, *args, **kwargs)

        data = tiny_lm.CharData()
        model = tiny_lm.make_model(data.vocab, L, H, 4)
        idx, tgt = data.batch(B, S, torch.Generator().manual_seed(1))
        x = model.embed(idx)
        reentrant = False
        for block in model.blocks:
            x = checkpoint_func(block, x, use_reentrant=reentrant)
        logits = model.head(model.norm(x))
        loss = torch.nn.functional.cross_entropy(logits.view(-1, logits.shape[-1]),
                                                 tgt.reshape(-1))
        loss.backward()
        out = (loss.detach(), [p.grad.clone() for p in model.parameters()])
        self.assertTrue(bitwise_equal(out, run_step("plain")))
        self.assertEqual(ot.save_on_cpu.stats().offloaded, L)
        self.assertEqual(ot.save_on_cpu.stats().reloaded, L)

    def test_small_cpu_tensors_stay_in_place(self):
        t = torch.randn(4)
        ctx = ot.save_on_cpu()
        packed = ctx.pack_hook(t)
        self.assertIsInstance(packed, Kept)
        self.assertIs(packed.tensor, t)
        self.assertIs(ctx.unpack_hook(packed), t)


class StatsAtExitTest(DaemonTestCase):
    def test_stats_are_logged_at_exit_when_asked(self):
        code = (
            "import sys, torch; sys.path[:0] = [%r, %r]\n"
            "import offloadd.torch as ot, daemon_fixture as d\n"
            "ctx = ot.offload_checkpoints(socket_path=%r, threshold_bytes=d.THRESHOLD, "
            "keep_last_n=0, name='demo', log_stats_at_exit=True)\n"
            "d.run_step('hooks-reentrant', ctx)\n"
            % (PY_ROOT, os.path.dirname(__file__), self.daemon.sock))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("offloadd[demo]: offloaded %d (0.1 MiB), reloaded %d" % (L, L), r.stderr)

    def test_the_line_at_exit_counts_the_last_idle_step(self):
        """Three steps that send nothing (every tensor below the threshold): the line logged at
        exit says 3 idle steps, the last one included."""
        code = (
            "import sys, warnings, torch; sys.path[:0] = [%r]\n"
            "warnings.simplefilter('ignore')\n"
            "import offloadd.torch as ot\n"
            "ctx = ot.offload_checkpoints(socket_path=%r, threshold_bytes=1 << 30, "
            "name='idle', log_stats_at_exit=True)\n"
            "w = torch.randn(64, 64, requires_grad=True)\n"
            "for _ in range(3):\n"
            "    with ctx:\n"
            "        y = (torch.randn(8, 64) @ w).relu()\n"
            "    y.sum().backward()\n"
            % (PY_ROOT, self.daemon.sock))
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        line = [l for l in r.stderr.splitlines() if l.startswith("offloadd[idle]")]
        self.assertEqual(len(line), 1, r.stderr)
        self.assertIn("idle steps 3", line[0])


if __name__ == "__main__":
    unittest.main()


class StatsLineLabelTest(unittest.TestCase):
    """A context without a name logged as "offloadd[default]", the label of the shared default
    context: two unnamed contexts and the default one could not be told apart."""

    def test_a_context_without_a_name_is_not_labelled_default(self):
        import io
        lines = []
        for name in ("", "default", "layer 3"):
            out = io.StringIO()
            ot.OffloadStats(name).log(out)
            lines.append(out.getvalue().split(": offloaded 0 (0.0 MiB)")[0])
        self.assertEqual(lines, ["offloadd", "offloadd[default]", "offloadd[layer 3]"])
        unnamed = ot.offload_checkpoints(socket_path="/nonexistent/offloadd.sock")
        out = io.StringIO()
        unnamed.stats.log(out)
        self.assertTrue(out.getvalue().startswith("offloadd: offloaded 0"), out.getvalue())


class OffloadStatsCountsTest(unittest.TestCase):
    """The per-tensor counts live in C (offloadd._store_front.TensorCounts): added without a
    Python frame, each add seen whole by a snapshot taken on another thread."""

    MIB = 1 << 20

    def test_the_counts_add_up_and_copy_reset_and_subtract_as_fields(self):
        s = ot.OffloadStats("c")
        s.add_offloaded(3 * self.MIB)
        s.add_offloaded(self.MIB)
        s.add_reloaded(self.MIB, True, 0.0)
        s.add_reloaded(2 * self.MIB, False, 0.25)
        s.add(kept=2, kept_bytes=5, host_waits=1, host_wait_seconds=0.5)
        snap = s.snapshot()
        want = {"offloaded": 2, "offloaded_bytes": 4 * self.MIB, "reloaded": 2,
                "reloaded_bytes": 3 * self.MIB, "prefetched_in_time": 1,
                "prefetched_in_time_bytes": self.MIB, "waited": 1, "waited_bytes": 2 * self.MIB,
                "waited_seconds": 0.25, "kept": 2, "kept_bytes": 5, "host_waits": 1,
                "host_wait_seconds": 0.5}
        self.assertEqual({k: snap.as_dict()[k] for k in want}, want)
        self.assertEqual(list(snap.as_dict())[:4],
                         ["offloaded", "offloaded_bytes", "reloaded", "reloaded_bytes"])
        s.add_offloaded(7)
        diff = s.snapshot() - snap
        self.assertEqual((diff.offloaded, diff.offloaded_bytes, diff.reloaded, diff.kept),
                         (1, 7, 0, 0))
        s.reset()
        self.assertEqual(set(s.as_dict().values()), {0})
        self.assertEqual(snap.offloaded, 2)  # a snapshot is a copy

    def test_bad_arguments_raise_type_errors_and_count_nothing(self):
        s = ot.OffloadStats()
        for call in (lambda: s.add_offloaded("8"), lambda: s.add_offloaded(),
                     lambda: s.add_reloaded(8, True), lambda: s.add_reloaded(8, True, "1s")):
            with self.assertRaises(TypeError):
                call()
        self.assertEqual(set(s.as_dict().values()), {0})

    def test_an_add_past_64_bits_or_of_negative_bytes_raises_and_counts_nothing(self):
        s = ot.OffloadStats()
        s.add_offloaded(2 ** 62)
        with self.assertRaisesRegex(OverflowError, "reset"):
            s.add_offloaded(2 ** 62)
        s.add_reloaded(2 ** 62, True, 0.0)
        with self.assertRaises(OverflowError):  # reloaded_bytes fits, prefetched's does not
            s.add_reloaded(2 ** 62, True, 0.0)
        for call in (lambda: s.add_offloaded(-1), lambda: s.add_reloaded(-1, True, 0.0),
                     lambda: s.add_reloaded(1, False, float("nan")),
                     lambda: s.add_reloaded(1, False, -0.5)):
            with self.assertRaises(ValueError):
                call()
        d = s.as_dict()
        self.assertEqual((d["offloaded"], d["offloaded_bytes"], d["reloaded"],
                          d["reloaded_bytes"], d["prefetched_in_time"], d["waited"],
                          d["waited_seconds"]), (1, 2 ** 62, 1, 2 ** 62, 1, 0, 0.0))

    def test_copies_and_pickles_are_snapshots(self):
        import copy
        import pickle
        s = ot.OffloadStats("layers")
        s.add_offloaded(5)
        s.add_reloaded(5, False, 0.25)
        s.add(kept=3)
        for made in (copy.copy(s), copy.deepcopy(s), pickle.loads(pickle.dumps(s))):
            self.assertIsInstance(made, ot.OffloadStats)
            self.assertEqual((made.name, made.as_dict()), ("layers", s.as_dict()))
            made.add_offloaded(1)
            made.add(kept=1)
            self.assertEqual((s.offloaded, s.kept), (1, 3))  # not shared with the original

    def test_adds_on_threads_are_all_counted_and_seen_whole(self):
        import threading
        s, n, threads, torn = ot.OffloadStats(), 20000, 3, []
        stop = threading.Event()

        def add():
            for i in range(n):
                s.add_reloaded(4, i % 2 == 0, 0.5)
                s.add_offloaded(8)
                if i % 100 == 0:
                    s.add(kept=1)

        def look():
            while not stop.is_set():
                d = s.snapshot().as_dict()
                if (d["reloaded_bytes"] != 4 * d["reloaded"]
                        or d["offloaded_bytes"] != 8 * d["offloaded"]
                        or d["waited_seconds"] != 0.5 * d["waited"]):
                    torn.append(d)
        workers = [threading.Thread(target=add) for _ in range(threads)]
        watcher = threading.Thread(target=look)
        watcher.start()
        for w in workers:
            w.start()
        for w in workers:
            w.join()
        stop.set()
        watcher.join()
        d = s.as_dict()
        self.assertEqual((d["reloaded"], d["prefetched_in_time"], d["waited"], d["offloaded"],
                          d["offloaded_bytes"], d["kept"]),
                         (n * threads, n * threads // 2, n * threads // 2, n * threads,
                          8 * n * threads, threads * n // 100))
        self.assertEqual(torn[:1], [])


class CompletionTest(unittest.TestCase):
    """The reload completion the hooks use instead of a concurrent.futures.Future."""

    def test_outcome_callbacks_and_timeout(self):
        import concurrent.futures
        import threading
        c, seen = Completion(), []
        c.add_done_callback(lambda f: seen.append(("early", f.result())))
        with self.assertRaises(concurrent.futures.TimeoutError):
            c.result(0.01)
        self.assertFalse(c.done())
        threading.Timer(0.05, c.set_result, (7,)).start()
        self.assertEqual(c.result(10), 7)
        c.set_exception(RuntimeError("late"))  # a second outcome is ignored
        c.add_done_callback(lambda f: seen.append(("late", f.exception())))
        self.assertEqual(seen, [("early", 7), ("late", None)])
        failed = Completion()
        failed.set_exception(KeyError(3))
        self.assertIsInstance(failed.exception(0), KeyError)
        with self.assertRaises(KeyError):
            failed.result()
