"""Several training steps in a row: no growth of pool use or of process memory.

An elementwise net with big activations and little compute (L=4 checkpointed layers on
(8, 256, 256) fp32 inputs) sends 8 MiB per step through the daemon (keep_last_n=0), so a leak
of the offloaded tensors, of staging slots or of handles would add up to 8 MiB per step.
Checked after every step (after ot.synchronize(), so releases have landed):
the daemon holds 0 blocks and 0 pool bytes and its peak stays at the first step's; the staging
arena has 0 bytes in use and no new regions; no handle survives the step; and the process RSS
(VmRSS) median of the last steps exceeds that of the steps after warm-up by less than two
steps' worth (a leak would put ~4 steps' worth between them), and
the bytes of live torch tensors (gc) are the same after every step from the second on. The tiny
transformer gets the exact checks for a few steps too.
"""

import gc
import statistics
import unittest
import warnings

import torch
from daemon_fixture import L as TINY_L
from daemon_fixture import THRESHOLD, DaemonTestCase, rss_bytes, run_step

import offloadd.torch as ot
import tiny_lm
from offloadd.torch import _endpoint

torch.set_num_threads(2)
# The elementwise net: big activations, little compute.
L, B, S, H = 4, 8, 256, 256
LAYER_BYTES = B * S * H * 4          # 2 MiB
STEP_BYTES = L * LAYER_BYTES         # 8 MiB through the daemon per step
STEPS = 12
WARMUP = 4                           # steps before RSS is compared (staging pages, allocator)


class ElementwiseNet(torch.nn.Module):
    """L layers x -> x + tanh(x * w_i), w_i of shape (h,); each layer checkpointed."""

    def __init__(self):
        super().__init__()
        self.w = torch.nn.ParameterList(torch.nn.Parameter(torch.rand(H) + 0.5)
                                        for _ in range(L))

    def forward(self, x, mode, ctx):
        for w in self.w:
            layer = lambda x, w=w: x + torch.tanh(x * w)  # noqa: E731
            if mode == "offloadd":
                x = ot.checkpoint(layer, x, context=ctx)
            else:
                with ctx:
                    x = torch.utils.checkpoint.checkpoint(layer, x, use_reentrant=True)
        return x.square().mean()


def live_tensor_bytes():
    gc.collect()
    with warnings.catch_warnings():  # isinstance() pokes deprecated torch.distributed objects
        warnings.simplefilter("ignore")
        return sum(_tensor_bytes(o) for o in gc.get_objects())


def _tensor_bytes(o):
    """Bytes of a real (dense, concrete) tensor; 0 for anything else, including the fake and
    symbolic-shaped tensors a torch.compile'd test earlier in this process may leave for the
    collector (their sizes are SymInts, which neither hash nor add up)."""
    try:
        if not isinstance(o, torch.Tensor) or o.is_meta:
            return 0
        n = o.numel()
        return n * o.element_size() if type(n) is int else 0
    except Exception:  # a half-built or foreign object in gc's list
        return 0


class SteadyStateTest(DaemonTestCase):
    POOL_BYTES = "64MiB"

    def check_step(self, ctx, capacity):
        self.assertTrue(ot.synchronize())
        stats = self.daemon.stats()
        self.assertEqual((stats.blocks, stats.pool_used_bytes), (0, 0))
        (ep,) = _endpoint.endpoints()
        self.assertEqual(ep.transport.arena.used_bytes, 0)
        if capacity is not None:
            self.assertEqual(ep.transport.arena.capacity_bytes, capacity)
        self.assertEqual(ctx.store.live_handles(), 0)
        # A handle's de-duplication entries leave the table with it: none once none lives.
        self.assertEqual(ctx.store.seen_entries(), 0)
        return stats.pool_peak_used_bytes, ep.transport.arena.capacity_bytes

    def run_steps(self, mode):
        net = ElementwiseNet()
        opt = torch.optim.SGD(net.parameters(), lr=0.01)
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, keep_last_n=0)
        x0 = torch.randn(B, S, H, requires_grad=True)  # layer inputs: x0 * 1.0 onwards
        rss, peaks, capacity, tensors = [], [], None, []
        for step in range(STEPS):
            opt.zero_grad()
            x0.grad = None
            net(x0 * 1.0, mode, ctx).backward()
            opt.step()
            peak, capacity = self.check_step(ctx, capacity)
            peaks.append(peak)
            tensors.append(live_tensor_bytes())
            rss.append(rss_bytes())
        self.assertEqual(ctx.stats.offloaded, STEPS * L)
        self.assertEqual(ctx.stats.offloaded_bytes, STEPS * STEP_BYTES)
        self.assertEqual(len(set(peaks[1:])), 1, "pool peak grew: %s" % peaks)
        self.assertEqual(len(set(tensors[1:])), 1, "live tensor bytes changed: %s" % tensors)
        half = (STEPS - WARMUP) // 2
        early = statistics.median(rss[WARMUP:WARMUP + half])
        late = statistics.median(rss[WARMUP + half:])
        # A leak of one step's tensors would put ~half * STEP_BYTES between the medians; the
        # allocator's noise here is a few MiB.
        self.assertLess(late - early, 2 * STEP_BYTES,
                        "RSS grew from %d to %d KiB over %d steps: %s"
                        % (early // 1024, late // 1024, STEPS, [r // 1024 for r in rss]))

    def test_offloadd_checkpoint_steps(self):
        self.run_steps("offloadd")

    def test_hooks_around_reentrant_checkpoint_steps(self):
        self.run_steps("hooks-reentrant")

    def test_tiny_transformer_steps(self):
        data = tiny_lm.CharData()
        model = tiny_lm.make_model(data.vocab, TINY_L, 64, 4)
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD)
        capacity, tensors = None, []
        for step in range(4):
            run_step("offloadd", ctx, batch_seed=step, model=model)
            _, capacity = self.check_step(ctx, capacity)
            tensors.append(live_tensor_bytes())
        self.assertEqual(len(set(tensors[1:])), 1, "live tensor bytes changed: %s" % tensors)


if __name__ == "__main__":
    unittest.main()
