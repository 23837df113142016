"""torchtitan-style activation checkpointing with offload through offloadd, against a real daemon.

torchtitan (0.3.0, ``torchtitan/distributed/activation_checkpoint.py``) applies its AC config
per transformer block: for each child of ``model.layers`` it registers the block again wrapped
in torch's ``checkpoint_wrapper`` (mode "full": ``preserve_rng_state=True,
determinism_check="default", early_stop=False, debug=False``; mode "selective": the same with
``context_fn`` = ``create_selective_checkpoint_contexts(policy)``). It has no offload switch; the
README's recipe adds one: wrap each checkpointed block once more in torch's ``offload_wrapper``
and call ``offloadd.torch.enable()``. ``apply_ac`` below does exactly that to a random tiny
Qwen3's decoder (3 layers, hidden 256; batch 2 x 256 tokens, CPU).

Full AC: each block's input, 2 x 256 x 256 fp32 = 512 KiB, is offloaded (the threshold is just
above the rotary tables, 1 x 256 x 64 fp32 = 64 KiB each, which stay): between forward and
backward the daemon's GetStats counts 3 offloads (1.5 MiB) and holds 3 blocks; after backward,
3 reloads and no block held; loss and gradients bitwise those of full AC without offload.

Selective AC runs on a model of plain residual MLP blocks under ``layers`` (4 blocks, input
1024 x 256 fp32 = 1 MiB): selective checkpointing of a Transformers decoder layer fails in torch
2.15.0 without any offload ("aten.slice.Tensor ... not found in storage" at recompute). The ops
the policy saves stay in SAC's own cache, outside saved-tensor hooks, so only the block inputs
reach offloadd: 4 offloads and 4 reloads; gradients bitwise those of selective AC alone.
"""

import functools

import torch
from daemon_fixture import DaemonTestCase
from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as cw
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

import offloadd.torch as ot
import qwen3_fixture as q

CONFIG = dict(q.SMALL_CONFIG, num_hidden_layers=3)
BATCH, SEQ = 2, 256
BLOCK_INPUT_BYTES = BATCH * SEQ * CONFIG["hidden_size"] * 4   # 512 KiB
THRESHOLD_BYTES = 64 * 1024 + 1   # the rotary tables (cos, sin: 64 KiB each) stay in place


def _save_matmuls(ctx, func, *args, **kwargs):
    """A selective policy: keep matmul outputs, recompute the rest (torchtitan's saves matmuls,
    attention and reductions, recomputing every second matmul)."""
    if func in (torch.ops.aten.mm.default, torch.ops.aten.addmm.default,
                torch.ops.aten.bmm.default):
        return CheckpointPolicy.MUST_SAVE
    return CheckpointPolicy.PREFER_RECOMPUTE


def apply_ac(decoder, mode, offload):
    """torchtitan's ActivationCheckpointing.apply on ``decoder.layers`` ("full" or
    "selective"), each block also in ``offload_wrapper`` when ``offload``."""
    layers = decoder.get_submodule("layers")
    for layer_id, block in layers.named_children():
        kwargs = dict(preserve_rng_state=True, determinism_check="default", early_stop=False,
                      debug=False)
        if mode == "selective":
            kwargs["context_fn"] = functools.partial(create_selective_checkpoint_contexts,
                                                     _save_matmuls)
        block = cw.checkpoint_wrapper(block, **kwargs)
        if offload:
            block = cw.offload_wrapper(block)
        layers.register_module(layer_id, block)


class TorchtitanAcTest(DaemonTestCase):
    POOL_BYTES = "64MiB"

    def setUp(self):
        super().setUp()
        ot.disable()
        self.ids = q.batch(CONFIG["vocab_size"], BATCH, SEQ, seed=7)

    def tearDown(self):
        ot.disable()

    def model(self, mode, offload):
        model = q.make_model(seed=0, max_seq=SEQ, **CONFIG)
        apply_ac(model.model, mode, offload)
        return model

    def check_mode(self, mode):
        reference = q.step(self.model(mode, offload=False), self.ids)
        model = self.model(mode, offload=True)
        self.assertEqual(sum(isinstance(m, cw.OffloadWrapper) for m in model.modules()),
                         CONFIG["num_hidden_layers"])
        ctx = ot.enable(keep_last_n=0, threshold_bytes=THRESHOLD_BYTES,
                        socket_path=self.daemon.sock)
        ctx.stats.reset()
        before = self.daemon.stats()
        seen = {}

        def between():
            self.assertTrue(ot.synchronize())
            d = self.daemon.stats()
            seen["during"] = (d.offloads_total - before.offloads_total,
                              d.offload_bytes_total - before.offload_bytes_total,
                              d.blocks - before.blocks)
        result = q.step(model, self.ids, between)
        self.assertTrue(ot.synchronize())
        after = self.daemon.stats()
        n = CONFIG["num_hidden_layers"]
        self.assertEqual(seen["during"], (n, n * BLOCK_INPUT_BYTES, n))
        self.assertEqual((after.reloads_total - before.reloads_total, after.blocks), (n, 0))
        s = ctx.stats.snapshot()
        self.assertEqual((s.offloaded, s.reloaded, s.fallbacks), (n, n, 0))
        self.assertTrue(q.bitwise_equal(result, reference),
                        "%s AC with offload differs from %s AC alone" % (mode, mode))

    def test_full_ac_blocks_in_offload_wrapper_reach_the_daemon(self):
        self.check_mode("full")

    def test_selective_ac_blocks_in_offload_wrapper_reach_the_daemon(self):
        x = torch.randn(MLP_ROWS, MLP_WIDTH, generator=torch.Generator().manual_seed(3))
        reference = run_mlp(mlp_model("selective", offload=False), x)
        ctx = ot.enable(keep_last_n=0, socket_path=self.daemon.sock)
        ctx.stats.reset()
        before = self.daemon.stats()
        seen = {}

        def between():
            self.assertTrue(ot.synchronize())
            d = self.daemon.stats()
            seen["during"] = (d.offloads_total - before.offloads_total,
                              d.offload_bytes_total - before.offload_bytes_total)
        grads = run_mlp(mlp_model("selective", offload=True), x, between)
        self.assertTrue(ot.synchronize())
        after = self.daemon.stats()
        n = MLP_BLOCKS
        self.assertEqual(seen["during"], (n, n * MLP_ROWS * MLP_WIDTH * 4))
        self.assertEqual((after.reloads_total - before.reloads_total, after.blocks), (n, 0))
        s = ctx.stats.snapshot()
        self.assertEqual((s.offloaded, s.reloaded, s.fallbacks), (n, n, 0))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(grads, reference)),
                        "selective AC with offload differs from selective AC alone")


MLP_BLOCKS, MLP_ROWS, MLP_WIDTH = 4, 1024, 256


class _Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(MLP_WIDTH, 2 * MLP_WIDTH)
        self.down = torch.nn.Linear(2 * MLP_WIDTH, MLP_WIDTH)

    def forward(self, h):
        return h + self.down(torch.nn.functional.gelu(self.up(h)))


class _Stack(torch.nn.Module):
    """torchtitan's model shape where AC applies: transformer blocks under ``layers``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.layers = torch.nn.ModuleDict({str(i): _Block() for i in range(MLP_BLOCKS)})

    def forward(self, x):
        h = x * 1.0   # the first block's input is no leaf, as an embedding's output
        for block in self.layers.values():
            h = block(h)
        return h


def mlp_model(mode, offload):
    model = _Stack()
    apply_ac(model, mode, offload)
    return model


def run_mlp(model, x, between=None):
    """Forward, ``between()``, backward; returns the parameters' gradients."""
    out = model(x.requires_grad_(False))
    if between is not None:
        between()
    out.square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]
