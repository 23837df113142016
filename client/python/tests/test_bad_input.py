"""What a user gets wrong: a torch outside the supported range, and offload switched on while
nothing reaches the daemon (one warning per process that says why, and a counter). (A daemon that
dies during the step: test_fallback.DaemonStopsTest.)"""

import os
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch
from daemon_fixture import PY_ROOT, DaemonTestCase

import offloadd.torch as ot
import qwen3_fixture as q

torch.set_num_threads(2)


class TorchVersionTest(unittest.TestCase):
    def test_supported_versions_pass(self):
        for v in ("2.4.0", "2.15.0", "2.15.0+cu130", "2.16.0a0+git123"):
            ot._check_torch_version(v)

    def test_unsupported_versions_name_the_range(self):
        for v in ("1.13.0a0", "2.3.1", "3.0.0", "garbage"):
            with self.assertRaisesRegex(ImportError, r"torch >= 2\.4 and < 3\.0; this process "
                                        r"has torch " + v.replace(".", r"\.")):
                ot._check_torch_version(v)

    def test_import_without_torch_says_to_install_it(self):
        # No torch in this Python: a None in sys.modules makes `import torch` fail as a missing
        # module does.
        code = "import sys; sys.modules['torch'] = None; import offloadd.torch"
        env = dict(os.environ, PYTHONPATH=PY_ROOT)
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=60)
        self.assertNotEqual(r.returncode, 0)
        last = r.stderr.strip().splitlines()[-1]
        self.assertTrue(last.startswith("ImportError: offloadd.torch needs PyTorch"), r.stderr)
        self.assertIn("install torch >= 2.4 and < 3 (pip install 'offloadd[torch]'", last)
        self.assertNotIn("ModuleNotFoundError", r.stderr)

    def test_import_under_torch_1_13_fails_with_one_clear_error(self):
        with tempfile.TemporaryDirectory() as fake:
            os.mkdir(os.path.join(fake, "torch"))
            with open(os.path.join(fake, "torch", "__init__.py"), "w") as f:
                f.write("__version__ = '1.13.0a0'\n")
            env = dict(os.environ, PYTHONPATH=os.pathsep.join([fake, PY_ROOT]))
            r = subprocess.run([sys.executable, "-c", "import offloadd.torch"], env=env,
                               capture_output=True, text=True, timeout=60)
        self.assertNotEqual(r.returncode, 0)
        last = r.stderr.strip().splitlines()[-1]
        self.assertTrue(last.startswith("ImportError: offloadd.torch supports torch >= 2.4 and "
                                        "< 3.0; this process has torch 1.13.0a0"), r.stderr)


def offloadd_warnings(caught):
    return [w for w in caught if str(w.message).startswith("offloadd: offload is on but")]


class IdleStepTest(DaemonTestCase):
    def steps(self, ctx, n, seq=64):
        model = q.make_model(seed=0, max_seq=seq, **q.SMALL_CONFIG)
        q.set_checkpointing(model, "ckpt")
        ids = q.batch(q.SMALL_CONFIG["vocab_size"], 2, seq)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(n):
                model.zero_grad(set_to_none=True)
                with ctx:
                    out = model(input_ids=ids, labels=ids)
                out.loss.backward()
        return offloadd_warnings(caught)

    def test_everything_below_the_threshold_warns_once_and_counts_steps(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock)   # 1 MiB; layer input 128 KiB
        caught = self.steps(ctx, 3)
        self.assertEqual(len(caught), 1)
        msg = str(caught[0].message)
        self.assertIn("sent nothing to offloadd", msg)
        self.assertIn("below threshold_bytes=1048576", msg)
        self.assertIn("the largest small one was 262144 bytes", msg)   # logits 2 x 64 x 512 fp32
        # A step ends when the next one packs: 3 steps -> 2 counted so far; synchronize()
        # counts the last one (its backward ran), once.
        self.assertEqual(ctx.stats.idle_steps, 2)
        self.assertEqual(ot.idle_steps_total(), 2)
        ot.synchronize()
        ot.synchronize()
        self.assertEqual(ctx.stats.idle_steps, 3)
        self.assertEqual(ot.idle_steps_total(), 3)
        self.assertEqual(ctx.stats.offloaded, 0)
        self.steps(ctx, 1)  # the next step's pack does not count the last one again
        self.assertEqual(ctx.stats.idle_steps, 3)

    def test_a_one_step_run_warns_at_exit(self):
        import subprocess
        import sys
        from daemon_fixture import PY_ROOT
        code = ("import sys; sys.path[:0] = %r; import torch, offloadd.torch as ot; "
                "x = torch.randn(64, 64, requires_grad=True); "
                "ctx = ot.offload_checkpoints(socket_path=%r)\n"
                "with ctx:\n    y = (x * 2).sin().sum()\n"
                "y.backward(); print('idle', ctx.stats.idle_steps)"
                % ([PY_ROOT], self.daemon.sock))
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             timeout=120)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("idle 0", out.stdout)  # not counted before the process ends
        self.assertEqual(out.stderr.count("sent nothing to offloadd"), 1, out.stderr)

    def test_keep_last_n_keeping_everything_says_so(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=100 << 10,
                                     keep_last_n=64)
        caught = self.steps(ctx, 2)
        self.assertEqual(len(caught), 1)
        self.assertIn("keep_last_n=64", str(caught[0].message))

    def test_a_step_that_offloads_does_not_warn(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=100 << 10,
                                     keep_last_n=0)
        self.assertEqual(self.steps(ctx, 3), [])
        self.assertEqual(ctx.stats.idle_steps, 0)
        self.assertGreater(ctx.stats.offloaded, 0)


if __name__ == "__main__":
    unittest.main()
