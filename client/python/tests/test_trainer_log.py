"""offloadd's figures in the Transformers Trainer's logs, against the daemon's own counts.

LogTest: ``offloadd.transformers.enable()`` and a Trainer (random tiny Qwen3, CPU, 4 layers,
checkpoint offload, logging every step, 4 steps). What a reporting integration would receive
(a callback after the default ones sees the same ``logs`` dict TensorBoard's and W&B's do)
carries every offloadd key at each step: 4 tensors and 4 MiB offloaded, 4 reloads (in time +
waited), no fallback; summed over the steps they equal the daemon's GetStats offload and reload
counts and bytes; ``state.log_history`` holds them; one "offloadd: training summary" line on
stderr with the same totals. ``enable(trainer_callback=False)``: no offloadd key.

GaloreLogTest: the same with ``offloadd.galore.enable()`` and ``optim="galore_adamw"`` (14
GaLore matrices, refreshes at optimizer steps 1 and 6): the logged refreshes computed sum to 28,
the daemon's GetProjectorStats computed_total difference, at the steps they happened.
"""

import contextlib
import io
import tempfile
import warnings

import torch
from daemon_fixture import DaemonTestCase

import galore_fixture as gf
import offloadd.galore as og
import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q

OFFLOAD_KEYS = ("offloadd/offloaded", "offloadd/offloaded_gib", "offloadd/reloads_in_time",
                "offloadd/reloads_waited", "offloadd/host_wait_seconds", "offloadd/fallbacks")
GALORE_KEYS = ("offloadd/galore_refreshes_computed", "offloadd/galore_refreshes_deduplicated",
               "offloadd/galore_kept_stale", "offloadd/galore_local_fallbacks")


def run_trainer(model, data, steps, batch, **extra):
    """Trainer.train with logging every step; returns (the logs dicts a reporting callback
    received at each training log, state.log_history, stderr text)."""
    import transformers
    received = []

    class Reporter(transformers.TrainerCallback):   # where TensorBoard / W&B would be
        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "loss" in logs:
                received.append(dict(logs))
    err = io.StringIO()
    with tempfile.TemporaryDirectory() as out:
        args = transformers.TrainingArguments(
            output_dir=out, max_steps=steps, per_device_train_batch_size=batch,
            learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no",
            logging_strategy="steps", logging_steps=1, dataloader_num_workers=0, seed=0,
            disable_tqdm=True, **extra)
        with warnings.catch_warnings(), contextlib.redirect_stderr(err):
            warnings.simplefilter("ignore")
            trainer = transformers.Trainer(model=model, args=args, train_dataset=data,
                                           callbacks=[Reporter])
            trainer.train()
    return received, trainer.state.log_history, err.getvalue()


class LogTest(DaemonTestCase):
    POOL_BYTES = "64MiB"
    STEPS, BATCH, SEQ = 4, 2, 512   # layer input 2 x 512 x 256 fp32 = 1 MiB
    LAYER_BYTES = 2 * 512 * 256 * 4

    def train(self):
        model = q.make_model(seed=0, max_seq=self.SEQ, **q.SMALL_CONFIG)
        ids = q.batch(q.SMALL_CONFIG["vocab_size"], self.BATCH * self.STEPS, self.SEQ, seed=5)
        data = [{"input_ids": row, "labels": row} for row in ids]
        return run_trainer(model, data, self.STEPS, self.BATCH, activation_checkpointing=True,
                           activation_checkpointing_kwargs={"offload": True})

    def test_each_training_log_carries_offloadds_figures_matching_the_daemon(self):
        ot._endpoint.reset_for_tests()
        otf.enable(keep_last_n=0, socket_path=self.daemon.sock)
        try:
            before = self.daemon.stats()
            received, history, err = self.train()
            self.assertTrue(ot.synchronize())
            after = self.daemon.stats()
        finally:
            otf.disable()
        layers = q.SMALL_CONFIG["num_hidden_layers"]
        self.assertEqual(len(received), self.STEPS)
        for logs in received:
            self.assertTrue(set(OFFLOAD_KEYS) <= set(logs), logs)
            self.assertEqual(logs["offloadd/offloaded"], layers)
            self.assertEqual(logs["offloadd/offloaded_gib"] * 2 ** 30, layers * self.LAYER_BYTES)
            self.assertEqual(logs["offloadd/reloads_in_time"] + logs["offloadd/reloads_waited"],
                             layers)
            self.assertEqual(logs["offloadd/fallbacks"], 0)
            self.assertGreaterEqual(logs["offloadd/host_wait_seconds"], 0.0)
            self.assertFalse(set(GALORE_KEYS) & set(logs))   # no GaLore routing here
        total = {k: sum(logs[k] for logs in received) for k in OFFLOAD_KEYS}
        self.assertEqual(total["offloadd/offloaded"], after.offloads_total - before.offloads_total)
        self.assertEqual(total["offloadd/offloaded_gib"] * 2 ** 30,
                         after.offload_bytes_total - before.offload_bytes_total)
        self.assertEqual(total["offloadd/reloads_in_time"] + total["offloadd/reloads_waited"],
                         after.reloads_total - before.reloads_total)
        logged = [h for h in history if "loss" in h]
        self.assertEqual([h["offloadd/offloaded"] for h in logged], [layers] * self.STEPS)
        lines = [ln for ln in err.splitlines() if ln.startswith("offloadd: training summary")]
        self.assertEqual(len(lines), 1, err[-2000:])
        n = self.STEPS * layers
        self.assertIn("offloaded %d tensors (%.3f GiB), reloaded %d (%d in time, %d waited)"
                      % (n, n * self.LAYER_BYTES / 2 ** 30, n, total["offloadd/reloads_in_time"],
                         total["offloadd/reloads_waited"]), lines[0])
        self.assertIn("fallbacks 0", lines[0])
        self.assertNotIn("Warning", lines[0])
        self.assertNotIn("activation checkpointing with offload", lines[0])

    def test_summary_warns_when_offload_was_never_requested(self):
        # The Trainer without activation_checkpointing_kwargs={"offload": True}: the hooks see
        # no saved tensor, and the summary says which setting is missing.
        ot._endpoint.reset_for_tests()
        otf.enable(keep_last_n=0, socket_path=self.daemon.sock)
        try:
            model = q.make_model(seed=0, max_seq=self.SEQ, **q.SMALL_CONFIG)
            ids = q.batch(q.SMALL_CONFIG["vocab_size"], self.BATCH * 2, self.SEQ, seed=5)
            data = [{"input_ids": row, "labels": row} for row in ids]
            received, _, err = run_trainer(model, data, 2, self.BATCH,
                                           activation_checkpointing=True)
        finally:
            otf.disable()
        self.assertEqual([logs["offloadd/offloaded"] for logs in received], [0, 0])
        lines = [ln for ln in err.splitlines() if ln.startswith("offloadd: training summary")]
        self.assertEqual(len(lines), 1, err[-2000:])
        self.assertIn("offloaded 0 tensors", lines[0])
        self.assertIn("Warning: offloadd saw no saved tensor during training, so nothing was "
                      "offloaded: turn on activation checkpointing with offload "
                      "(TrainingArguments(activation_checkpointing=True, "
                      "activation_checkpointing_kwargs={\"offload\": True})", lines[0])

    def test_opt_out_leaves_the_logs_alone(self):
        import transformers.trainer as tt
        ot._endpoint.reset_for_tests()
        otf.enable(trainer_callback=False, keep_last_n=0, socket_path=self.daemon.sock)
        try:
            self.assertEqual([c.__name__ for c in tt.DEFAULT_CALLBACKS], ["DefaultFlowCallback"])
            received, _, err = self.train()
        finally:
            otf.disable()
        self.assertEqual(len(received), self.STEPS)
        self.assertFalse(any(k.startswith("offloadd/") for logs in received for k in logs))
        self.assertNotIn("offloadd: training summary", err)

    def test_disable_removes_the_callback(self):
        import transformers.trainer as tt
        otf.enable()
        self.assertIn("OffloaddLogCallback", [c.__name__ for c in tt.DEFAULT_CALLBACKS])
        otf.disable()
        self.assertEqual([c.__name__ for c in tt.DEFAULT_CALLBACKS], ["DefaultFlowCallback"])


class GaloreLogTest(DaemonTestCase):
    POOL_BYTES = "16MiB"
    STEPS = 6   # GaLore refreshes at optimizer steps 1 and 6 (update_proj_gap 5)
    MATRICES = 14

    def test_galore_refreshes_in_the_logs_match_the_daemon(self):
        import transformers
        transformers.logging.set_verbosity_error()
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        otf.enable(socket_path=self.daemon.sock)
        routing = og.enable(socket_path=self.daemon.sock)
        try:
            before = routing.connection.stats().computed_total
            received, _, err = run_trainer(
                gf.make_model(0), gf.dataset(self.STEPS), self.STEPS, gf.BATCH,
                optim="galore_adamw", optim_target_modules=gf.TARGETS, optim_args=gf.OPTIM_ARGS,
                lr_scheduler_type="constant", max_grad_norm=0.0)
            computed = routing.connection.stats().computed_total - before
        finally:
            og.disable()
            otf.disable()
            torch.set_num_threads(threads)
        self.assertEqual(len(received), self.STEPS)
        for logs in received:
            self.assertTrue(set(GALORE_KEYS) | set(OFFLOAD_KEYS) <= set(logs), logs)
        per_step = [logs["offloadd/galore_refreshes_computed"] for logs in received]
        self.assertEqual(per_step, [self.MATRICES, 0, 0, 0, 0, self.MATRICES])
        self.assertEqual(sum(per_step), computed)
        for key in GALORE_KEYS[1:]:
            self.assertEqual([logs[key] for logs in received], [0] * self.STEPS, key)
        self.assertIn("GaLore refreshes: 28 computed by the daemon, 0 deduplicated, 0 kept "
                      "stale, 0 local fallbacks", err)


if __name__ == "__main__":
    import unittest
    unittest.main()
