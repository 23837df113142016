"""offloadd.torch.checkpoint: the layer input goes through the daemon, results stay bitwise equal.

Same tiny model as test_hooks (L=4, b=2, s=64, h=64, fp32, threshold 16 KiB). These tests compare
it with torch's checkpoint (both modes) and with no checkpointing, including RNG replay (dropout) and kwargs.
"""

import unittest

import torch
import torch.nn.functional as F
from daemon_fixture import (B, H, L, LAYER_BYTES, S, THRESHOLD, DaemonTestCase, bitwise_equal,
                            record_offloaded_shapes, run_step)

import offloadd.torch as ot

torch.set_num_threads(2)


class CheckpointTest(DaemonTestCase):
    def context(self, **kw):
        kw.setdefault("keep_last_n", 0)
        return ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                      **kw)

    def test_layer_inputs_pass_through_the_daemon_bitwise_equal(self):
        plain, ckpt = run_step("plain"), run_step("checkpoint")
        self.assertTrue(bitwise_equal(plain, ckpt))
        ctx = self.context()
        shapes = record_offloaded_shapes(ctx)
        before = self.daemon.stats()
        out = run_step("offloadd", ctx)
        self.assertTrue(ot.synchronize())
        after = self.daemon.stats()
        self.assertEqual(shapes, [(B, S, H)] * L)
        self.assertEqual(after.offloads_total - before.offloads_total, L)
        self.assertEqual(after.offload_bytes_total - before.offload_bytes_total, L * LAYER_BYTES)
        self.assertEqual(ctx.stats.offloaded, L)
        self.assertEqual(ctx.stats.reloaded, L)
        self.assertTrue(bitwise_equal(out, plain), "offload changed the loss or a gradient")
        self.assertTrue(bitwise_equal(out, ckpt))
        self.assertEqual(after.blocks, 0)
        self.assertEqual(ctx.store.live_handles(), 0)

    def test_reentrant_flag_uses_torch_reentrant_checkpoint_in_the_context(self):
        ctx = self.context()
        data = __import__("tiny_lm").CharData()
        model = __import__("tiny_lm").make_model(data.vocab, L, H, 4)
        idx, tgt = data.batch(B, S, torch.Generator().manual_seed(1))
        x = model.embed(idx)
        for block in model.blocks:
            x = ot.checkpoint(block, x, use_reentrant=True, context=ctx)
        logits = model.head(model.norm(x))
        F.cross_entropy(logits.view(-1, logits.shape[-1]), tgt.reshape(-1)).backward()
        out = (None, [p.grad for p in model.parameters()])
        ref = run_step("plain")
        self.assertEqual(ctx.stats.offloaded, L)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(out[1], ref[1])))

    def test_default_keep_last_n_keeps_the_last_input(self):
        ctx = self.context(keep_last_n=1)
        out = run_step("offloadd", ctx)
        self.assertEqual((ctx.stats.offloaded, ctx.stats.kept), (L - 1, 1))
        self.assertTrue(bitwise_equal(out, run_step("plain")))

    def test_rng_state_is_replayed_for_dropout(self):
        torch.manual_seed(3)
        lin = torch.nn.Linear(64, 64)
        x0 = torch.randn(8, 128, 64)

        def layer(x, scale=1.0):
            return F.dropout(lin(x), p=0.3, training=True) * scale + x

        def run(fn):
            lin.zero_grad()
            x = x0.clone().requires_grad_()
            torch.manual_seed(7)
            y = fn(layer, x * 1.0)
            y = fn(layer, y)
            y.square().sum().backward()
            return y.detach(), [x.grad.clone(), lin.weight.grad.clone()]

        ref = run(lambda f, x: f(x, scale=2.0))
        ctx = self.context()
        out = run(lambda f, x: ot.checkpoint(f, x, scale=2.0, context=ctx))
        self.assertEqual(ctx.stats.offloaded, 2)
        self.assertTrue(torch.equal(out[0], ref[0]))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(out[1], ref[1])))

    def test_autograd_grad_and_non_tensor_args(self):
        ctx = self.context()
        w = torch.nn.Parameter(torch.randn(64, 64))

        def layer(x, k, tag):
            assert tag == "t"
            return (x @ w).tanh() * k

        x = torch.randn(16, 64, 64, requires_grad=True)
        h = x * 1.0
        y = ot.checkpoint(layer, h, 3, "t", context=ctx).sum()
        gx, gw = torch.autograd.grad(y, (x, w))
        y2 = layer(x * 1.0, 3, "t").sum()
        rx, rw = torch.autograd.grad(y2, (x, w))
        self.assertEqual(ctx.stats.offloaded, 1)
        self.assertTrue(torch.equal(gx, rx) and torch.equal(gw, rw))


if __name__ == "__main__":
    unittest.main()
