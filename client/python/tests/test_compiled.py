"""torch.compile with offloadd enabled: no graph break of offloadd's own, the same numbers.

A random Qwen3 (qwen3_fixture.SMALL_CONFIG: 4 layers, hidden 256; batch 2 x sequence 256, fp32,
so each checkpointed layer input is 2 x 256 x 256 x 4 = 524,288 bytes) with Transformers'
checkpointing, compiled whole with ``torch.compile(model, backend=...)``, one forward+backward:

* checkpointing alone (``activation_checkpointing_enable()``) against checkpointing with offload
  through offloadd (``offloadd.transformers.enable()`` + ``offload=True``): the graph breaks
  Dynamo counts (``torch._dynamo.utils.counters["graph_break"]``) with offloadd are at most those
  of checkpointing alone, and none names a lock or saved_tensors_hooks (offloadd's contexts step
  aside while Dynamo traces);
* the loss and every gradient: with backend "aot_eager" (the eager kernels) bitwise equal to
  checkpointing alone compiled alike, and, with only the attention and MLP compiled, to the
  uncompiled run; whole-model compiled checkpointing itself (with or without offloadd) differs
  from uncompiled checkpointing in the last bits of some gradients (~3e-8, also with backend
  "eager"), so that comparison is to 1e-4 relative. With "inductor" (fused kernels, not bitwise
  reproducible from one compilation to the next) everything is compared to tolerance;
* what reaches the daemon, from its own GetStats: with the whole model compiled, the layer calls
  run inside the compiled graph, where the contexts step aside: 0 offloads. With each decoder
  layer compiled on its own (``layer.compile()``), Transformers' offload context is entered in
  eager code around the compiled layer, so the 4 layer inputs go to the daemon and come back.

The test prints the counts (run with ``-s`` to see them). Inductor runs only when it can compile
on this host (a C++ compiler); each backend takes ~10-60 s on 2 cores.
"""

import shutil
import unittest
import warnings

import torch
from daemon_fixture import DaemonTestCase

import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q

torch.set_num_threads(2)

BATCH, SEQ = 2, 256
LAYERS = q.SMALL_CONFIG["num_hidden_layers"]
LAYER_BYTES = BATCH * SEQ * q.SMALL_CONFIG["hidden_size"] * 4   # 524,288
THRESHOLD_BYTES = 256 << 10   # below the layer input


def graph_breaks(fn):
    """Runs fn() from a fresh Dynamo state; returns (fn's result, {break reason: count})."""
    import torch._dynamo
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    result = fn()
    return result, dict(counters["graph_break"])


def _seed_model(cls):
    """The small random Qwen3 with checkpointing, its batch and its uncompiled step."""
    cls.model = q.make_model(seed=0, max_seq=SEQ, **q.SMALL_CONFIG)
    cls.ids = q.batch(q.SMALL_CONFIG["vocab_size"], BATCH, SEQ)
    q.set_checkpointing(cls.model, "ckpt")
    cls.eager = q.step(cls.model, cls.ids)


class _Compiled:
    """The runs and checks of one backend (BACKEND); mixed into a DaemonTestCase per backend."""
    POOL_BYTES = "64MiB"
    BACKEND = None

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        _seed_model(cls)
        whole = lambda: torch.compile(cls.model, backend=cls.BACKEND)   # noqa: E731
        cls.ckpt, cls.ckpt_breaks, _, _ = cls.run_compiled(whole, offloadd=False)
        cls.offloadd, cls.offloadd_breaks, cls.whole_delta, cls.whole_ctx = \
            cls.run_compiled(whole, offloadd=True)
        cls.ckpt_regions, cls.ckpt_regions_breaks, _, _ = \
            cls.run_compiled(cls.compile_layers, offloadd=False)
        cls.regional, cls.regional_breaks, cls.layer_delta, cls.layer_ctx = \
            cls.run_compiled(cls.compile_layers, offloadd=True)
        print("\n[%s] graph breaks, whole model compiled: checkpointing alone %d, with offloadd "
              "%d; regions compiled: %d and %d. Offloads reaching the daemon: whole model "
              "compiled %d, regions compiled %d (reloads %d)"
              % (cls.BACKEND, sum(cls.ckpt_breaks.values()), sum(cls.offloadd_breaks.values()),
                 sum(cls.ckpt_regions_breaks.values()), sum(cls.regional_breaks.values()),
                 cls.whole_delta[0], cls.layer_delta[0], cls.layer_delta[1]))

    @classmethod
    def compile_layers(cls):
        """The model with each decoder layer's attention and MLP compiled in place (regional
        compilation): the checkpointed layer call, and the offload context around it, stay
        eager. (Compiling the layer itself would compile Transformers' checkpointing wrapper,
        which wraps the layer's forward, with it.)"""
        for module in cls.regions():
            module.compile(backend=cls.BACKEND)
        return cls.model

    @classmethod
    def regions(cls):
        return [m for layer in cls.model.model.layers for m in (layer.self_attn, layer.mlp)]

    @classmethod
    def run_compiled(cls, compile_fn, offloadd):
        """One compiled step, checkpointing alone or with offload through offloadd: (result,
        breaks, (offloads, reloads) the daemon counted, the context's stats or None)."""
        ot._endpoint.reset_for_tests()
        ctx = None
        if offloadd:
            ctx = otf.enable(keep_last_n=0, threshold_bytes=THRESHOLD_BYTES, strict=True,
                             socket_path=cls.daemon.sock, trainer_callback=False)
            ctx.stats.reset()
        before = cls.daemon.stats()
        try:
            q.set_checkpointing(cls.model, "offload" if offloadd else "ckpt")
            compiled = compile_fn()
            result, breaks = graph_breaks(lambda: q.step(compiled, cls.ids))
            assert ot.synchronize(), "offloads or releases did not complete"
            after = cls.daemon.stats()
        finally:
            otf.disable()
            q.set_checkpointing(cls.model, "ckpt")
            for module in cls.regions():   # undo compile_layers (a no-op otherwise)
                module._compiled_call_impl = None
        delta = (after.offloads_total - before.offloads_total,
                 after.reloads_total - before.reloads_total)
        return result, breaks, delta, ctx and ctx.stats.snapshot()

    def test_offloadd_breaks_the_graph_no_more_often_than_checkpointing(self):
        self.assertLessEqual(sum(self.offloadd_breaks.values()), sum(self.ckpt_breaks.values()),
                             "breaks with offloadd: %s\nwithout: %s"
                             % (self.offloadd_breaks, self.ckpt_breaks))

    def test_no_break_names_a_lock_or_saved_tensors_hooks(self):
        for reason in self.offloadd_breaks:
            with self.subTest(reason=reason[:80]):
                self.assertNotIn("lock", reason)
                self.assertNotIn("saved_tensors_hooks", reason)

    def test_whole_model_compiled_offloads_nothing_and_falls_back_nowhere(self):
        # The layer calls run inside the compiled graph, where the contexts step aside.
        self.assertEqual(self.whole_delta, (0, 0))
        s = self.whole_ctx
        self.assertEqual((s.offloaded, s.reloaded, s.fallbacks), (0, 0, 0))

    def test_each_layer_compiled_offloads_the_4_layer_inputs_through_the_daemon(self):
        self.assertEqual(self.layer_delta, (LAYERS, LAYERS))
        s = self.layer_ctx
        self.assertEqual((s.offloaded, s.reloaded, s.fallbacks, s.lost),
                         (LAYERS, LAYERS, 0, 0))
        self.assertEqual(LAYER_BYTES, 524288)


    def test_loss_and_gradients_close_to_the_uncompiled_run(self):
        # Compiled checkpointing itself differs from eager checkpointing in the last bits of
        # some gradients (~3e-8 here, also with backend "eager": Dynamo's checkpoint operator
        # orders the backward differently), with or without offloadd.
        for name in ("ckpt", "offloadd", "ckpt_regions", "regional"):
            run = getattr(self, name)
            with self.subTest(run=name):
                torch.testing.assert_close(run[0], self.eager[0], rtol=1e-5, atol=1e-6)
                for got, want in zip(run[1], self.eager[1]):
                    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-5)


class AotEagerTest(_Compiled, DaemonTestCase):
    BACKEND = "aot_eager"

    def test_offloadd_bitwise_equal_to_checkpointing_compiled_alike(self):
        self.assertTrue(q.bitwise_equal(self.offloadd, self.ckpt), "whole model")
        self.assertTrue(q.bitwise_equal(self.regional, self.ckpt_regions), "regions")

    def test_regions_compiled_with_offloadd_bitwise_equal_to_the_uncompiled_run(self):
        # aot_eager runs the eager kernels; the checkpointed call itself stays eager here.
        self.assertTrue(q.bitwise_equal(self.regional, self.eager))


@unittest.skipUnless(shutil.which("g++") or shutil.which("c++"),
                     "inductor needs a C++ compiler on this host")
class InductorTest(_Compiled, DaemonTestCase):
    """Inductor's fused kernels are not bitwise reproducible from one compilation to the next
    here (two compilations of checkpointing alone differ by up to ~2e-9 in some gradients), so
    it is held to tolerance, against the uncompiled run and against checkpointing alone."""
    BACKEND = "inductor"

    def test_offloadd_equal_to_checkpointing_compiled_alike_within_float_tolerance(self):
        for got, want in ((self.offloadd, self.ckpt), (self.regional, self.ckpt_regions)):
            torch.testing.assert_close(got[0], want[0])
            for g, w in zip(got[1], want[1]):
                torch.testing.assert_close(g, w)


class CompiledBackendTest(DaemonTestCase):
    """offloadd.torch.compiled.backend: the whole model compiled, offload inside the graph.

    torch's compiled offload pass picks the saved forward tensors of at least THRESHOLD_BYTES;
    offloadd's ops send them to the daemon in forward and bring them back in backward. Against
    checkpointing alone compiled with aot_eager: the same graph breaks, loss and gradients
    bitwise equal, every offload reloaded and the pool back to its baseline."""

    POOL_BYTES = "64MiB"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        import offloadd.torch.compiled as oc
        _seed_model(cls)
        cls.ckpt, cls.ckpt_breaks = graph_breaks(
            lambda: q.step(torch.compile(cls.model, backend="aot_eager"), cls.ids))
        ot._endpoint.reset_for_tests()
        ctx = ot.offload_checkpoints(keep_last_n=0, threshold_bytes=THRESHOLD_BYTES, strict=True,
                                     socket_path=cls.daemon.sock)
        cls.backend = oc.backend(threshold_bytes=THRESHOLD_BYTES, context=ctx)
        cls.before = cls.daemon.stats()
        with q.spy_on_store(ctx.store, ctx) as seen:
            cls.offloadd, cls.offloadd_breaks = graph_breaks(
                lambda: q.step(torch.compile(cls.model, backend=cls.backend), cls.ids))
        cls.seen = seen
        assert ot.synchronize(), "offloads or releases did not complete"
        cls.after = cls.daemon.stats()
        cls.ctx_stats = ctx.stats.snapshot()
        cls.pending = oc.release_pending()
        print("\n[offloadd.torch.compiled] graph breaks %d (checkpointing alone %d); per graph "
              "(offloads, reloads) inserted %s; offloads reaching the daemon %d, reloads %d; "
              "packed %s; reloads prefetched in time %d, waited for %d"
              % (sum(cls.offloadd_breaks.values()), sum(cls.ckpt_breaks.values()),
                 cls.backend.graphs, cls.after.offloads_total - cls.before.offloads_total,
                 cls.after.reloads_total - cls.before.reloads_total, cls.seen,
                 cls.ctx_stats.prefetched_in_time, cls.ctx_stats.waited))

    def test_the_same_graph_breaks_as_checkpointing_alone(self):
        self.assertEqual(sum(self.offloadd_breaks.values()), sum(self.ckpt_breaks.values()))

    def test_loss_and_gradients_bitwise_equal_to_checkpointing_compiled_alike(self):
        self.assertTrue(q.bitwise_equal(self.offloadd, self.ckpt))

    def test_the_layer_inputs_go_to_the_daemon_and_come_back(self):
        inserted = sum(f for f, _ in self.backend.graphs)
        self.assertEqual(inserted, sum(b for _, b in self.backend.graphs))
        offloads = self.after.offloads_total - self.before.offloads_total
        self.assertGreaterEqual(offloads, LAYERS)   # each checkpointed layer's input at least
        self.assertEqual(offloads, inserted)
        self.assertEqual(self.after.reloads_total - self.before.reloads_total, offloads)
        s = self.ctx_stats
        self.assertEqual((s.offloaded, s.reloaded, s.fallbacks, s.lost), (offloads, offloads, 0, 0))
        self.assertEqual((self.after.blocks, self.after.pool_used_bytes),
                         (self.before.blocks, self.before.pool_used_bytes))
        self.assertEqual(self.pending, 0)
        layer_input = ((BATCH, SEQ, q.SMALL_CONFIG["hidden_size"]), torch.float32)
        self.assertGreaterEqual(self.seen.count(layer_input), LAYERS, self.seen)


class BackendThresholdTest(unittest.TestCase):
    """A context whose threshold_bytes is above the backend's would refuse offloads the backend
    inserts: backend() warns, naming both; equal or lower thresholds are silent."""

    def backend_warnings(self, context_bytes, backend_bytes):
        import offloadd.torch.compiled as oc
        ctx = ot.offload_checkpoints(threshold_bytes=context_bytes,
                                     socket_path="/tmp/offloadd-unused.sock")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            oc.backend(threshold_bytes=backend_bytes, context=ctx)
        return [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]

    def test_a_context_threshold_above_the_backends_warns(self):
        msgs = self.backend_warnings(1 << 20, 256 << 10)
        self.assertEqual(len(msgs), 1, msgs)
        self.assertIn("backend(threshold_bytes=262144): the context's threshold_bytes=1048576 "
                      "is larger", msgs[0])

    def test_equal_or_lower_context_thresholds_are_silent(self):
        self.assertEqual(self.backend_warnings(256 << 10, 256 << 10), [])
        self.assertEqual(self.backend_warnings(0, 256 << 10), [])


class ReloadedOnceTest(unittest.TestCase):
    """A compiled graph's offloaded activations are reloaded once: a second backward over the
    same graph (retain_graph=True) and a backward after release_pending() raise RuntimeError
    with a sentence saying which, not a KeyError."""

    def setUp(self):
        import torch._functorch.config as fc
        import offloadd.torch.compiled as oc
        if not hasattr(fc, "enable_activation_offloading"):
            self.skipTest("torch < 2.10 has no compiled offload pass")
        self.oc = oc
        ctx = ot.offload_checkpoints(threshold_bytes=1024, keep_last_n=0,
                                     socket_path="/tmp/offloadd-absent-compiled.sock")
        self.backend = oc.backend(threshold_bytes=1024, context=ctx)
        torch._dynamo.reset()
        self.f = torch.compile(lambda x, w: torch.tanh(torch.tanh(x @ w) @ w).sum(),
                               backend=self.backend)
        self.x = torch.randn(64, 64, requires_grad=True)
        self.w = torch.randn(64, 64, requires_grad=True)

    def test_a_second_backward_says_retain_graph_is_not_supported(self):
        import torch._functorch.config as fc
        with fc.patch(donated_buffer=False), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = self.f(self.x, self.w)
            first = torch.autograd.grad(loss, (self.x, self.w), retain_graph=True)
            self.assertGreater(self.backend.graphs[0][1], 0, self.backend.graphs)
            with self.assertRaises(RuntimeError) as e:
                torch.autograd.grad(loss, (self.x, self.w))
        self.assertIn("already reloaded", str(e.exception))
        self.assertIn("retain_graph=True", str(e.exception))
        self.assertEqual(len(first), 2)

    def test_a_backward_after_release_pending_names_it(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            loss = self.f(self.x, self.w)
            self.assertGreater(self.oc.release_pending(), 0)
            with self.assertRaises(RuntimeError) as e:
                loss.backward()
        self.assertIn("release_pending() dropped it", str(e.exception))


if __name__ == "__main__":
    unittest.main()
