"""The daemon's spill tier with the seed Qwen3 model.

The seed model (qwen3_fixture.SEED_CONFIG) checkpoints 8 layer inputs of 8 MiB a step; the
daemon's pool here is 16 MiB, a quarter of them, with a spill directory: forward spills the
earliest layers to disk (the ordering hint says they are reloaded last), backward stages them
back. Loss and every gradient must be bitwise equal to the run without offload, and the hooks
must send (step, position) with each offload.
"""

import os
import shutil
import tempfile
import unittest

import torch
from daemon_fixture import DaemonTestCase

import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q

torch.set_num_threads(2)

LAYERS = q.SEED_CONFIG["num_hidden_layers"]


def _direct_io_dir():
    """A fresh directory whose file system takes O_DIRECT (tmpfs does not), or None."""
    base = os.environ.get("OFFLOADD_SPILL_TEST_DIR") or tempfile.gettempdir()
    d = tempfile.mkdtemp(prefix="offloadd-spill-", dir=base)
    try:
        fd = os.open(os.path.join(d, "probe"), os.O_CREAT | os.O_WRONLY | os.O_DIRECT, 0o600)
        os.close(fd)
        os.unlink(os.path.join(d, "probe"))
        return d
    except OSError:
        shutil.rmtree(d, ignore_errors=True)
        return None


SPILL_DIR = _direct_io_dir()


def spill_files():
    return sorted(f for f in os.listdir(SPILL_DIR) if f.endswith(".spill"))


@unittest.skipIf(SPILL_DIR is None, "no directory with O_DIRECT (set OFFLOADD_SPILL_TEST_DIR)")
class SpillSeedModelTest(DaemonTestCase):
    POOL_BYTES = "16MiB"   # a quarter of the 64 MiB of checkpoints per step
    EXTRA = ("--spill_directory=%s" % SPILL_DIR, "--spill_bytes_per_second=-1",
             "--chunk_bytes=1MiB", "--admission_deadline_seconds=60")

    @classmethod
    def setUpClass(cls):
        super().setUpClass()
        cls.model = q.make_model(seed=0, max_seq=q.SEED_SEQ, **q.SEED_CONFIG)
        cls.ids = q.batch(q.SEED_CONFIG["vocab_size"], q.SEED_BATCH, q.SEED_SEQ)
        q.set_checkpointing(cls.model, "none")
        cls.reference = q.step(cls.model, cls.ids)
        q.set_checkpointing(cls.model, "offload")
        ot._endpoint.reset_for_tests()
        ctx = otf.enable(keep_last_n=0, socket_path=cls.daemon.sock)
        cls.hints, cls.on_disk, cls.results = [], [], []
        inner = ctx.store._offload

        def offload(s):
            cls.hints.append((s.step, s.offset))
            return inner(s)
        ctx.store._offload = offload

        def between():
            assert ot.synchronize(), "offloads did not complete"
            handles = ctx.store.handles()
            by_position = {h.offset: h.block_id for h in handles if h is not None}
            cls.on_disk.append((by_position, spill_files()))
        try:
            for _ in range(2):
                cls.results.append(q.step(cls.model, cls.ids, between))
            assert ot.synchronize(), "releases did not complete"
            cls.files_after = spill_files()
        finally:
            otf.disable()
            del ctx.store._offload
        cls.ctx_stats = ctx.stats.snapshot()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        shutil.rmtree(SPILL_DIR, ignore_errors=True)

    def test_loss_and_gradients_bitwise_equal_to_no_offload(self):
        for i, r in enumerate(self.results):
            with self.subTest(step=i):
                self.assertTrue(q.bitwise_equal(r, self.reference), "step %d differs" % i)

    def test_every_checkpoint_went_through_the_daemon(self):
        s = self.ctx_stats
        self.assertEqual((s.offloaded, s.reloaded, s.fallbacks, s.lost),
                         (2 * LAYERS, 2 * LAYERS, 0, 0))

    def test_hooks_send_step_and_position(self):
        self.assertEqual(self.hints, [(step, p) for step in (0, 1) for p in range(LAYERS)])

    def test_earliest_positions_were_on_disk_after_forward(self):
        # 16 MiB pool, high-water mark 90%: one 8 MiB block stays, the 7 reloaded last spill.
        for by_position, files in self.on_disk:
            expected = sorted("%016x.spill" % by_position[p] for p in range(LAYERS - 1))
            self.assertEqual(files, expected)

    def test_no_spill_file_is_left_after_backward(self):
        self.assertEqual(self.files_after, [])


if __name__ == "__main__":
    unittest.main()
