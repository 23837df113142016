"""offloadd.torch.enable(): each of torch's own offload entry points reaches the daemon.

* torch.distributed's ``offload_wrapper`` (around ``checkpoint_wrapper``, as accelerate's FSDP2
  activation offload applies it): 4 blocks, each block's input (2048 x 256 fp32, 2 MiB) offloaded;
  the daemon's GetStats counts 4 offloads (8 MiB) between forward and backward, 4 reloads after,
  and the gradients are bitwise those of checkpointing alone.
* ``torch.autograd.graph.save_on_cpu`` looked up at call time: the same counts.
* torch's class bound under another name before enable(): one RuntimeWarning naming the caller
  (function, file and line), once for that line; offloadd's own contexts never warn; disable()
  puts every name and torch's class back.
* accelerate (when installed): ``Accelerator`` with FSDP2 ``activation_checkpointing`` and
  ``activation_checkpointing_offload`` on one gloo rank (accelerate_fsdp2_worker.py), a random
  Qwen3: the daemon counts one offload and one reload per decoder layer.
"""

import importlib.util
import json
import os
import subprocess
import sys
import unittest
import warnings

import torch
from daemon_fixture import PY_ROOT, DaemonTestCase
from torch.distributed.algorithms._checkpoint import checkpoint_wrapper as cw

import offloadd.torch as ot
import qwen3_fixture as q

BLOCKS, ROWS, WIDTH = 4, 2048, 256
BLOCK_INPUT_BYTES = ROWS * WIDTH * 4   # 2 MiB: above offloadd's 1 MiB threshold
TORCH_SAVE_ON_CPU = torch.autograd.graph.save_on_cpu   # torch's class, bound before enable()


def blocks(seed=0):
    torch.manual_seed(seed)
    return torch.nn.ModuleList(
        torch.nn.Sequential(torch.nn.Linear(WIDTH, WIDTH), torch.nn.GELU())
        for _ in range(BLOCKS))


def run(layers, x, between=None):
    """Forward through ``layers`` (x @ 1 first, so the first block's input is no leaf), then
    backward; returns the parameters' gradients."""
    for p in layers.parameters():
        p.grad = None
    h = x * 1.0
    for layer in layers:
        h = layer(h)
    if between is not None:
        between()
    h.square().mean().backward()
    return [p.grad.clone() for p in layers.parameters()]


class EntryPointTest(DaemonTestCase):
    POOL_BYTES = "64MiB"

    def setUp(self):
        ot.disable()   # as torch has them, whatever a test before this one left enabled
        ot._endpoint.reset_for_tests()
        self.x = torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(3),
                             requires_grad=True)
        plain = blocks()
        self.reference = run(torch.nn.ModuleList(cw.checkpoint_wrapper(b) for b in plain),
                             self.x)

    def tearDown(self):
        ot.disable()

    def offloaded_run(self, layers):
        """Runs ``layers`` with offloadd enabled; returns (grads, daemon counts during the step
        (offloads, bytes, blocks held), daemon counts after (reloads, blocks held))."""
        ctx = ot.enable(keep_last_n=0, socket_path=self.daemon.sock)
        ctx.stats.reset()
        before = self.daemon.stats()
        seen = {}

        def between():
            self.assertTrue(ot.synchronize())
            d = self.daemon.stats()
            seen["during"] = (d.offloads_total - before.offloads_total,
                              d.offload_bytes_total - before.offload_bytes_total,
                              d.blocks - before.blocks)
        grads = run(layers, self.x, between)
        self.assertTrue(ot.synchronize())
        a = self.daemon.stats()
        after = (a.reloads_total - before.reloads_total, a.blocks - before.blocks)
        return grads, seen["during"], after, ctx.stats.snapshot()

    def check(self, grads, during, after, stats):
        self.assertEqual(during, (BLOCKS, BLOCKS * BLOCK_INPUT_BYTES, BLOCKS))
        self.assertEqual(after, (BLOCKS, 0))
        self.assertEqual((stats.offloaded, stats.reloaded, stats.fallbacks), (BLOCKS, BLOCKS, 0))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(grads, self.reference)),
                        "offloaded gradients differ from checkpointing alone")

    def test_offload_wrapper_reaches_the_daemon(self):
        layers = torch.nn.ModuleList(cw.offload_wrapper(cw.checkpoint_wrapper(b))
                                     for b in blocks())
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)   # offloadd's contexts never warn
            self.check(*self.offloaded_run(layers))

    def test_torch_autograd_graph_save_on_cpu_reaches_the_daemon(self):
        class Offloaded(torch.nn.Module):   # looks the name up at call time, as users write it
            def __init__(self, inner):
                super().__init__()
                self.inner = inner

            def forward(self, h):
                with torch.autograd.graph.save_on_cpu(pin_memory=True):
                    return self.inner(h)
        layers = torch.nn.ModuleList(Offloaded(cw.checkpoint_wrapper(b)) for b in blocks())
        self.check(*self.offloaded_run(layers))

    def test_torch_class_bound_elsewhere_warns_once_naming_the_caller(self):
        ot.enable(socket_path=self.daemon.sock)

        def layer_with_its_own_binding(h):
            with TORCH_SAVE_ON_CPU(pin_memory=False):
                return (h * h).sum()
        x = torch.ones(4, requires_grad=True)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(3):
                layer_with_its_own_binding(x)
            with torch.autograd.graph.save_on_cpu():   # offloadd's now: no warning
                (x * x).sum()
        texts = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
        self.assertEqual(len(texts), 1, texts)
        self.assertIn("layer_with_its_own_binding", texts[0])
        line = layer_with_its_own_binding.__code__.co_firstlineno + 1   # its `with` line
        self.assertIn("test_torch_enable.py:%d" % line, texts[0])
        self.assertEqual((os.path.basename(caught[0].filename), caught[0].lineno),
                         ("test_torch_enable.py", line))   # the warning points at the caller

    def test_enable_swaps_and_disable_restores_every_name(self):
        self.assertIs(cw.save_on_cpu, TORCH_SAVE_ON_CPU)
        ot.enable()
        ot.enable()   # idempotent
        self.assertTrue(ot.enabled())
        self.assertIs(torch.autograd.graph.save_on_cpu, ot.save_on_cpu)
        self.assertIs(cw.save_on_cpu, ot.save_on_cpu)
        self.assertIn("offloadd", TORCH_SAVE_ON_CPU.__init__.__module__)   # the warning's
        ot.disable()
        self.assertFalse(ot.enabled())
        self.assertIs(torch.autograd.graph.save_on_cpu, TORCH_SAVE_ON_CPU)
        self.assertIs(cw.save_on_cpu, TORCH_SAVE_ON_CPU)
        self.assertNotIn("offloadd", TORCH_SAVE_ON_CPU.__init__.__module__)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)   # disabled: torch's class is quiet
            with TORCH_SAVE_ON_CPU(pin_memory=False):
                pass


@unittest.skipUnless(importlib.util.find_spec("accelerate"), "accelerate is not installed")
class AccelerateFsdp2Test(DaemonTestCase):
    """accelerate's FSDP2 activation checkpointing with offload, one gloo rank on CPU."""

    POOL_BYTES = "64MiB"

    def test_activation_checkpointing_offload_reaches_the_daemon(self):
        here = os.path.dirname(os.path.abspath(__file__))
        before = self.daemon.stats()
        r = subprocess.run(
            [sys.executable, os.path.join(here, "accelerate_fsdp2_worker.py"), self.daemon.sock],
            env=dict(os.environ, PYTHONPATH=PY_ROOT + os.pathsep + here), cwd=here,
            capture_output=True, text=True, timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        result = json.loads(r.stdout.strip().splitlines()[-1])
        after = self.daemon.stats()
        layers = q.SMALL_CONFIG["num_hidden_layers"]
        self.assertEqual(result["wrapped"], layers)   # accelerate applied offload_wrapper
        self.assertEqual(result["during"], [layers, layers])   # offloads, blocks held
        self.assertEqual(after.offloads_total - before.offloads_total, layers)
        self.assertEqual(after.reloads_total - before.reloads_total, layers)
        self.assertEqual(after.blocks, 0)
        self.assertEqual((result["offloaded"], result["reloaded"], result["fallbacks"]),
                         (layers, layers, 0))
        self.assertTrue(result["loss_equal"], "the offloaded loss differs from the plain one")
        self.assertEqual(result["warnings"], [])


if __name__ == "__main__":
    unittest.main()
