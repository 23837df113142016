"""torch 2.x checkpointing modes, torch.compile and variable sequence length through offloadd.

All on a small random Qwen3 (qwen3_fixture.SMALL_CONFIG: 4 layers, hidden 256; each layer input
(2, s, 256) fp32) against a real daemon, compared bit for bit with no checkpointing:
  * torch's non-reentrant checkpoint (Transformers' default) inside one ``offload_checkpoints``
    around the forward: the outer hook sees the L layer inputs; reloads equal offloads.
  * ``offloadd.torch.checkpoint`` as the model's checkpoint function; reentrant checkpointing.
  * torch.compile (aot_eager) of the checkpointed model with offload on: gradients bitwise equal
    to the compiled model without offload; reloads equal offloads; URGENT reloads only at the
    start of each backward node that unpacks in forward order (see README, torch.compile).
  * sequence lengths 512, 2048, 1024, 2048 over four steps through Transformers' offload path:
    the daemon's pool high-water mark within 1.1x the largest step's checkpoint bytes, and no
    staging memory registered after the first step at the largest length.
"""

import functools
import unittest

import torch
from daemon_fixture import Daemon, DaemonTestCase

import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q

torch.set_num_threads(2)

CFG = q.SMALL_CONFIG
L, HID, B = CFG["num_hidden_layers"], CFG["hidden_size"], 2


def layer_bytes(seq):
    return B * seq * HID * 4


class ModesTest(DaemonTestCase):
    SEQ = 512
    POOL_BYTES = "128MiB"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = q.make_model(seed=0, max_seq=cls.SEQ, **CFG)
        cls.ids = q.batch(CFG["vocab_size"], B, cls.SEQ)
        q.set_checkpointing(cls.model, "none")
        cls.plain = q.step(cls.model, cls.ids)

    def context(self, **kw):
        kw.setdefault("keep_last_n", 0)
        kw.setdefault("threshold_bytes", layer_bytes(self.SEQ))
        return ot.offload_checkpoints(socket_path=self.daemon.sock, **kw)

    def hooked_step(self, ctx):
        self.model.zero_grad(set_to_none=True)
        with q.spy_on_store(ctx.store, ctx) as seen:
            with ctx:
                out = self.model(input_ids=self.ids, labels=self.ids)
        out.loss.backward()
        res = (out.loss.detach().clone(), [p.grad.detach().clone() for p in self.model.parameters()])
        self.assertTrue(ot.synchronize())
        return res, seen

    def check(self, res, ctx, seen):
        layer_input = ((B, self.SEQ, HID), torch.float32)
        # The L layer inputs, plus tensors of the same shape saved outside the checkpointed
        # layers (the final norm's input and output, the LM head's input).
        self.assertGreaterEqual(seen.count(layer_input), L, "the outer hook must see the L "
                                "layer inputs")
        s = ctx.stats
        self.assertGreaterEqual(s.offloaded, L)
        self.assertEqual(s.reloaded, s.offloaded, "a tensor unpacked twice was fetched twice")
        self.assertEqual((s.fallbacks, s.lost), (0, 0))
        self.assertTrue(q.bitwise_equal(res, self.plain))
        self.assertEqual(self.daemon.stats().blocks, 0)

    def test_non_reentrant_torch_checkpoint_inside_offload_checkpoints(self):
        q.set_checkpointing(self.model, "ckpt")
        ctx = self.context()
        res, seen = self.hooked_step(ctx)
        self.check(res, ctx, seen)

    def test_reentrant_torch_checkpoint_inside_offload_checkpoints(self):
        q.set_checkpointing(self.model, "reentrant")
        ctx = self.context()
        res, seen = self.hooked_step(ctx)
        self.check(res, ctx, seen)

    def test_offloadd_checkpoint_as_the_models_checkpoint_function(self):
        ctx = self.context()
        self.model._set_gradient_checkpointing(
            enable=True, gradient_checkpointing_func=functools.partial(ot.checkpoint, context=ctx))
        try:
            with q.spy_on_store(ctx.store, ctx) as seen:
                res = q.step(self.model, self.ids)
            self.assertTrue(ot.synchronize())
        finally:
            q.set_checkpointing(self.model, "none")
        self.assertEqual(seen, [((B, self.SEQ, HID), torch.float32)] * L)
        self.assertEqual((ctx.stats.offloaded, ctx.stats.reloaded, ctx.stats.urgent), (L, L, 1))
        self.assertTrue(q.bitwise_equal(res, self.plain))


class CompileTest(DaemonTestCase):
    SEQ = 512
    POOL_BYTES = "128MiB"

    def test_compiled_checkpointed_model_with_offload(self):
        model = q.make_model(seed=0, max_seq=self.SEQ, **CFG)
        q.set_checkpointing(model, "ckpt")
        ids = q.batch(CFG["vocab_size"], B, self.SEQ)
        compiled = torch.compile(model, backend="aot_eager")
        ref = q.step(compiled, ids)
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, keep_last_n=0,
                                     threshold_bytes=layer_bytes(self.SEQ))
        for _ in range(2):   # the second step runs the cached compiled graph
            ctx.stats.reset()
            model.zero_grad(set_to_none=True)
            with ctx:
                out = compiled(input_ids=ids, labels=ids)
            out.loss.backward()
            res = (out.loss.detach().clone(), [p.grad.detach().clone() for p in model.parameters()])
            self.assertTrue(ot.synchronize())
            s = ctx.stats
            self.assertTrue(q.bitwise_equal(res, ref), "offload changed a compiled gradient")
            self.assertGreaterEqual(s.offloaded, L)
            self.assertEqual(s.reloaded, s.offloaded)
            self.assertEqual((s.fallbacks, s.lost), (0, 0))
            # One URGENT reload per backward node that starts a forward-order run (the loss
            # graph and the compiled body); every other reload was prefetched.
            self.assertLessEqual(s.urgent, 2, s.summary())
        self.assertEqual(self.daemon.stats().blocks, 0)


class VariableSequenceTest(unittest.TestCase):
    SEQS = (512, 2048, 1024, 2048)

    def test_pool_high_water_and_no_new_host_memory_after_the_first_long_step(self):
        daemon = Daemon("128MiB")
        ot._endpoint.reset_for_tests()
        try:
            model = q.make_model(seed=0, max_seq=max(self.SEQS), **CFG)
            q.set_checkpointing(model, "offload")
            ctx = otf.enable(keep_last_n=0, socket_path=daemon.sock)
            staging = []
            for seq in self.SEQS:
                ids = q.batch(CFG["vocab_size"], B, seq)
                with_offload = q.step(model, ids)
                self.assertTrue(ot.synchronize())
                q.set_checkpointing(model, "ckpt")
                self.assertTrue(q.bitwise_equal(with_offload, q.step(model, ids)))
                q.set_checkpointing(model, "offload")
                (ep,) = ot._endpoint.endpoints()
                staging.append((ep.transport.arena.regions, ep.transport.arena.capacity_bytes))
            stats = daemon.stats()
        finally:
            otf.disable()
            ot._endpoint.reset_for_tests()
            daemon.stop()
        largest = L * layer_bytes(max(self.SEQS))
        self.assertEqual(ctx.stats.offloaded, L * len(self.SEQS))
        self.assertEqual(stats.blocks, 0)
        self.assertGreaterEqual(stats.pool_peak_used_bytes, largest)
        self.assertLessEqual(stats.pool_peak_used_bytes, 1.1 * largest)
        first_long = self.SEQS.index(max(self.SEQS))
        self.assertEqual(staging[first_long:], [staging[first_long]] * (len(self.SEQS) - first_long),
                         "staging memory was registered after the first longest step")


if __name__ == "__main__":
    unittest.main()
