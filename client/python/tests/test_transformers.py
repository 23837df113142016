"""The real stack: Hugging Face Transformers' checkpoint offload through offloadd, bit-exact.

SeedExperimentTest reproduces the reference study's CPU experiment (qwen3_fixture.SEED_CONFIG:
random Qwen3, 8 layers, batch 2 x sequence 2048, fp32) with Transformers' own switch,
``activation_checkpointing_enable(offload=True)``, and ``offloadd.transformers.enable()``
swapping ``transformers.modeling_utils.save_on_cpu`` for ``offloadd.torch.save_on_cpu``
(keep_last_n=0). It asserts, from the hook and from the daemon's own GetStats: the 8 layer inputs
of shape (2, 2048, 512) reach the hook and nothing else; all 8 (67,108,864 bytes) are stored in
the daemon between forward and backward; backward reloads 8; loss and every gradient bitwise
equal to no checkpointing, checkpointing, and checkpointing with torch's own save_on_cpu; the
pool back to its baseline; 0 fallbacks. One step per mode (~30-50 s each on 2 cores).

TrainerTest runs ``transformers.Trainer`` with ``gradient_checkpointing_kwargs={"offload":
True}`` for 5 steps with offloadd enabled by one line, against the same run without offload:
losses step by step and the final parameters bitwise equal.
"""

import tempfile
import unittest
import warnings

import torch
from daemon_fixture import DaemonTestCase

import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q

torch.set_num_threads(2)

LAYER_INPUT = ((q.SEED_BATCH, q.SEED_SEQ, q.SEED_CONFIG["hidden_size"]), torch.float32)
LAYER_BYTES = q.SEED_BATCH * q.SEED_SEQ * q.SEED_CONFIG["hidden_size"] * 4   # 8,388,608
LAYERS = q.SEED_CONFIG["num_hidden_layers"]


class SeedExperimentTest(DaemonTestCase):
    POOL_BYTES = "256MiB"

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = q.make_model(seed=0, max_seq=q.SEED_SEQ, **q.SEED_CONFIG)
        cls.ids = q.batch(q.SEED_CONFIG["vocab_size"], q.SEED_BATCH, q.SEED_SEQ)
        cls.results = {}
        for mode in ("none", "ckpt"):
            q.set_checkpointing(cls.model, mode)
            cls.results[mode] = q.step(cls.model, cls.ids)
        q.set_checkpointing(cls.model, "offload")
        with q.torch_save_on_cpu_without_pinning():
            cls.results["torch_save_on_cpu"] = q.step(cls.model, cls.ids)
        cls.run_offloadd()

    @classmethod
    def run_offloadd(cls):
        ot._endpoint.reset_for_tests()
        ctx = otf.enable(keep_last_n=0, socket_path=cls.daemon.sock)
        cls.baseline = cls.daemon.stats()
        cls.during = None

        def between():
            assert ot.synchronize(), "offloads did not complete"
            cls.during = cls.daemon.stats()
        try:
            with q.spy_on_store(ctx.store) as seen:
                cls.results["offloadd"] = q.step(cls.model, cls.ids, between)
            assert ot.synchronize(), "releases did not complete"
            cls.after = cls.daemon.stats()
        finally:
            otf.disable()
        cls.seen, cls.ctx_stats = seen, ctx.stats.snapshot()

    def test_loss_is_the_reference_study_figure(self):
        self.assertEqual(self.results["none"][0].item(), q.SEED_LOSS)

    def test_exactly_the_8_layer_inputs_reach_the_hook(self):
        self.assertEqual(self.seen, [LAYER_INPUT] * LAYERS)

    def test_all_8_are_stored_in_the_daemon_between_forward_and_backward(self):
        d, b = self.during, self.baseline
        self.assertEqual(d.blocks - b.blocks, LAYERS)
        self.assertEqual(d.pool_used_bytes - b.pool_used_bytes, LAYERS * LAYER_BYTES)
        self.assertEqual(LAYERS * LAYER_BYTES, 67108864)
        self.assertEqual(d.offloads_total - b.offloads_total, LAYERS)
        self.assertEqual(d.offload_bytes_total - b.offload_bytes_total, 67108864)

    def test_backward_reloads_8_and_the_pool_returns_to_baseline(self):
        a, b = self.after, self.baseline
        self.assertEqual(a.reloads_total - b.reloads_total, LAYERS)
        self.assertEqual(a.reload_bytes_total - b.reload_bytes_total, 67108864)
        self.assertEqual((a.blocks, a.pool_used_bytes), (b.blocks, b.pool_used_bytes))
        s = self.ctx_stats
        self.assertEqual((s.offloaded, s.reloaded, s.fallbacks, s.lost, s.kept),
                         (LAYERS, LAYERS, 0, 0, 0))

    def test_loss_and_gradients_bitwise_equal_in_all_modes(self):
        ref = self.results["offloadd"]
        for mode in ("none", "ckpt", "torch_save_on_cpu"):
            with self.subTest(mode=mode):
                self.assertTrue(q.bitwise_equal(ref, self.results[mode]),
                                "offloadd differs from %s" % mode)

    def test_torch_save_on_cpu_with_pinning_raises_without_an_accelerator(self):
        # The reference study's first sharp edge, on the pinned torch: the reason the comparison
        # above turns pinning off for torch's save_on_cpu, and offloadd's needs no such change.
        if torch.cuda.is_available():
            self.skipTest("an accelerator is present: torch's save_on_cpu can pin here")
        # torch 2.14.1+cpu (the study) says "pin_memory=True requires a CUDA or other accelerator
        # backend"; the CUDA build of 2.15.0 pinned here says "Found no NVIDIA driver".
        with self.assertRaisesRegex(RuntimeError, "pin_memory|NVIDIA driver|accelerator"):
            with torch.autograd.graph.save_on_cpu(pin_memory=True, device_type="cpu"):
                x = torch.ones(4, requires_grad=True)
                (x * x).sum()


class TrainerTest(DaemonTestCase):
    """Trainer with gradient_checkpointing_kwargs={"offload": True}, 5 steps, losses equal."""

    POOL_BYTES = "128MiB"
    STEPS, BATCH, SEQ = 5, 2, 512   # layer input 2 x 512 x 256 fp32 = 1 MiB (the threshold)

    def train(self, offload, names="activation"):
        import transformers
        model = q.make_model(seed=0, max_seq=self.SEQ, **q.SMALL_CONFIG)
        ids = q.batch(q.SMALL_CONFIG["vocab_size"], self.BATCH * self.STEPS, self.SEQ, seed=5)
        data = [{"input_ids": row, "labels": row} for row in ids]
        losses = []

        class Recording(transformers.Trainer):
            def training_step(self, *a, **k):
                loss = super().training_step(*a, **k)
                losses.append(loss.detach().clone())
                return loss
        with tempfile.TemporaryDirectory() as out:
            # names: Transformers 5.24's activation_checkpointing(_kwargs), or the deprecated
            # gradient_checkpointing(_kwargs) the issue and older docs use.
            ckpt = {names + "_checkpointing": True,
                    names + "_checkpointing_kwargs": {"offload": True} if offload else None}
            args = transformers.TrainingArguments(
                output_dir=out, max_steps=self.STEPS, per_device_train_batch_size=self.BATCH,
                learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
                logging_strategy="no", dataloader_num_workers=0, seed=0, disable_tqdm=True,
                **ckpt)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", FutureWarning)
                Recording(model=model, args=args, train_dataset=data).train()
        return losses, [p.detach().clone() for p in model.parameters()]

    def test_five_steps_equal_to_the_run_without_offload(self):
        for names in ("gradient", "activation"):
            with self.subTest(arguments=names + "_checkpointing"):
                self.check_five_steps(names)

    def check_five_steps(self, names):
        plain_losses, plain_params = self.train(offload=False, names=names)
        ctx = otf.enable(keep_last_n=0, socket_path=self.daemon.sock)   # the one line
        ctx.stats.reset()
        try:
            before = self.daemon.stats()
            losses, params = self.train(offload=True, names=names)
            self.assertTrue(ot.synchronize())
            after = self.daemon.stats()
        finally:
            otf.disable()
        layers = q.SMALL_CONFIG["num_hidden_layers"]
        self.assertEqual(len(losses), self.STEPS)
        self.assertEqual([x.item() for x in losses], [x.item() for x in plain_losses])
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(losses, plain_losses)))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(params, plain_params)),
                        "parameters after 5 steps differ")
        self.assertEqual(after.offloads_total - before.offloads_total, self.STEPS * layers)
        self.assertEqual(after.reloads_total - before.reloads_total, self.STEPS * layers)
        self.assertEqual(after.blocks, 0)
        self.assertEqual((ctx.stats.fallbacks, ctx.stats.idle_steps), (0, 0))


class GpuCheckSmokeTest(DaemonTestCase):
    """tests/gpu/transformers_check.py (run on the GPU machine by tests/gpu/run.sh) on CPU with
    the small model, so the script cannot rot between GPU runs."""

    POOL_BYTES = "128MiB"

    def test_gpu_transformers_check_runs_on_cpu(self):
        import os
        import subprocess
        import sys
        from daemon_fixture import PY_ROOT, REPO
        here = os.path.dirname(os.path.abspath(__file__))
        r = subprocess.run(
            [sys.executable, os.path.join(REPO, "tests", "gpu", "transformers_check.py"),
             "--socket", self.daemon.sock, "--device", "cpu", "--config", "small",
             "--seqs", "512", "--trainer-steps", "2", "--timed-steps", "0",
             "--fixture-dir", here],
            env=dict(os.environ, PYTHONPATH=PY_ROOT), capture_output=True, text=True,
            timeout=600)
        self.assertEqual(r.returncode, 0, r.stdout[-3000:] + r.stderr[-3000:])
        passes = [ln for ln in r.stdout.splitlines() if ln.startswith("PASS")]
        self.assertNotIn("FAIL", r.stdout)
        self.assertEqual(len(passes), 5, r.stdout)   # counts, 2 bitwise, blocks, Trainer


class EnableTest(unittest.TestCase):
    def test_enable_swaps_and_disable_restores_the_name_transformers_calls(self):
        import transformers.modeling_utils as mu
        orig = mu.save_on_cpu
        self.assertIs(orig, torch.autograd.graph.save_on_cpu)
        otf.enable()
        try:
            self.assertIs(mu.save_on_cpu, ot.save_on_cpu)
            self.assertTrue(otf.enabled())
            otf.enable()   # idempotent: disable still restores torch's
        finally:
            otf.disable()
        self.assertIs(mu.save_on_cpu, orig)
        self.assertFalse(otf.enabled())


if __name__ == "__main__":
    unittest.main()
