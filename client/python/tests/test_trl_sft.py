"""TRL's SFTTrainer with checkpoint offload through offloadd, against a real daemon.

The path the README's training-stacks table recommends for TRL: ``SFTConfig`` with the Trainer
arguments it inherits, ``activation_checkpointing=True, activation_checkpointing_kwargs=
{"offload": True}``, TRL's own ``activation_offloading`` left off, and
``offloadd.transformers.enable()`` before the trainer is built. A random tiny Qwen3 (2 layers,
hidden 256) on CPU, an already tokenized data set (TRL skips its own tokenization), 2 optimizer
steps of batch 2 x 128 tokens: each layer's input, 2 x 128 x 256 fp32 = 256 KiB, is offloaded
(threshold 64 KiB), so the daemon's GetStats counts 2 offloads of 256 KiB and 2 reloads per
step, 4 of each in all, and holds nothing afterwards. The logged losses and the trained
parameters are bitwise those of the same SFTTrainer run with checkpointing and no offload.
"""

import contextlib
import importlib.util
import io
import tempfile
import unittest
import warnings

import torch
from daemon_fixture import DaemonTestCase

import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q

CONFIG = dict(q.SMALL_CONFIG, num_hidden_layers=2)
STEPS, BATCH, SEQ = 2, 2, 128
LAYER_INPUT_BYTES = BATCH * SEQ * CONFIG["hidden_size"] * 4   # 256 KiB
THRESHOLD_BYTES = 64 * 1024   # above the rotary tables (1 x 128 x 64 fp32 = 32 KiB)


def tokenizer():
    """A word-level tokenizer over "t0".."t511" (no hub): SFTTrainer wants a processing class
    with a pad token even for tokenized data."""
    import transformers
    from tokenizers import Tokenizer, models
    vocab = {"t%d" % i: i for i in range(CONFIG["vocab_size"])}
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer(models.WordLevel(vocab, unk_token="t1")),
        pad_token="t0", unk_token="t1", eos_token="t2")


def sft(offload):
    """SFTTrainer.train for STEPS steps; returns (logged losses, trained parameters)."""
    import datasets
    import trl
    ids = q.batch(CONFIG["vocab_size"], BATCH * STEPS, SEQ, seed=5)
    data = datasets.Dataset.from_dict({"input_ids": [row.tolist() for row in ids]})
    model = q.make_model(seed=0, max_seq=SEQ, **CONFIG)
    with tempfile.TemporaryDirectory() as out:
        args = trl.SFTConfig(
            output_dir=out, max_steps=STEPS, per_device_train_batch_size=BATCH,
            learning_rate=1e-3, use_cpu=True, report_to=[], save_strategy="no", logging_steps=1,
            dataloader_num_workers=0, seed=0, disable_tqdm=True, max_length=SEQ,
            activation_checkpointing=True,
            activation_checkpointing_kwargs={"offload": True} if offload else None)
        assert not args.activation_offloading   # TRL's own offload stays off
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            trainer = trl.SFTTrainer(model=model, args=args, train_dataset=data,
                                     processing_class=tokenizer())
            trainer.train()
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    return losses, [p.detach().clone() for p in model.parameters()]


@unittest.skipUnless(importlib.util.find_spec("trl") and importlib.util.find_spec("datasets"),
                     "trl is not installed (client/python/requirements.lock pins it)")
class SftTrainerTest(DaemonTestCase):
    POOL_BYTES = "64MiB"

    def tearDown(self):
        otf.disable()
        ot.disable()

    def test_sft_trainer_checkpoint_offload_reaches_the_daemon_with_equal_losses(self):
        ot.disable()
        plain_losses, plain_params = sft(offload=False)
        self.assertEqual(len(plain_losses), STEPS)
        ot._endpoint.reset_for_tests()
        ctx = otf.enable(keep_last_n=0, threshold_bytes=THRESHOLD_BYTES,
                         socket_path=self.daemon.sock)
        ctx.stats.reset()
        before = self.daemon.stats()
        losses, params = sft(offload=True)
        self.assertTrue(ot.synchronize())
        after = self.daemon.stats()
        n = CONFIG["num_hidden_layers"] * STEPS
        self.assertEqual(after.offloads_total - before.offloads_total, n)
        self.assertEqual(after.offload_bytes_total - before.offload_bytes_total,
                         n * LAYER_INPUT_BYTES)
        self.assertEqual(after.reloads_total - before.reloads_total, n)
        self.assertEqual(after.blocks, 0)
        s = ctx.stats.snapshot()
        self.assertEqual((s.offloaded, s.reloaded, s.fallbacks), (n, n, 0))
        self.assertEqual(losses, plain_losses)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(params, plain_params)),
                        "parameters trained with offload differ from those without")


if __name__ == "__main__":
    unittest.main()
