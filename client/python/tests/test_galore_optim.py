"""offloadd.galore.enable() with galore-torch's optimizers through the Transformers Trainer, against a
real daemon, compared with stock galore-torch on the same random-init Llama (galore_fixture.TINY,
14 GaLore matrices, rank 8, gap 5, 30 steps).

What the comparisons can be (printed as each test runs): the stock run is deterministic (a rerun is
bitwise equal). offloadd's exact SVD is LAPACK's sgesdd in the daemon, torch's is its own LAPACK:
the projectors agree to rounding, but the signs of singular vectors are arbitrary and the Adam
moments are kept across a refresh, so from the first update that uses the second refresh's
projector (the loss of step 7) the results depend on the signs. Hence: up to step 6 the losses
agree to 1e-5 relative; with the signs aligned to torch's (a test hook) to 1e-4 at every step and
the final parameters to 1e-4 relative; without, the difference stays within twice what flipping
the stock projector's signs at random does (plus that 1e-4: GaLoreAdafactor, with no first
moment, does not see signs at all).

Also: a Trainer checkpoint at step 15 resumed (weights_only=True) continues bitwise as the run that
was not interrupted, where stock galore-torch cannot resume at all; bad input and a daemon that
is down.
"""

import os
import shutil
import tempfile
import unittest
import warnings

import torch
from daemon_fixture import Daemon, DaemonTestCase

import galore_fixture as gf
import offloadd.galore as og
from offloadd import errors
from offloadd.galore import _optim as _galore_optim

STEPS = 30
SECOND_REFRESH_STEP = 6  # optimizer steps 1, 6, 11, ... refresh (state["step"] % 5 == 0)


def loss_values(losses):
    return [x.item() for x in losses]


def max_abs(a, b):
    return max(abs(x - y) for x, y in zip(loss_values(a), loss_values(b)))


class OneThread:
    """One intra-op thread for the class (other test modules set two at import; on a loaded
    2-core machine two threads per process made these runs 10-20 times slower)."""

    @classmethod
    def setUpClass(cls):
        cls._threads = torch.get_num_threads()
        torch.set_num_threads(1)
        super().setUpClass()

    @classmethod
    def tearDownClass(cls):
        super().tearDownClass()
        torch.set_num_threads(cls._threads)


class GaloreTrainerTest(OneThread, DaemonTestCase):
    """Tests a and b: Trainer ``optim="galore_*"`` with offloadd vs stock."""

    POOL_BYTES = "16MiB"
    stock = {}

    def run_ours(self, optim, align=False, **options):
        routing = og.enable(socket_path=self.daemon.sock, **options)
        if align:
            og._TEST_HOOKS["adopted"] = gf.align_to_torch_svd
        try:
            losses, model = gf.train(optim, STEPS)
        finally:
            og._TEST_HOOKS.clear()
            og.disable()
        return losses, model, routing

    def stock_run(self, optim):
        if optim not in self.stock:
            self.stock[optim] = gf.train(optim, STEPS)
        return self.stock[optim]

    def check_optim(self, optim):
        stock, stock_model = self.stock_run(optim)
        rerun, _ = gf.train(optim, STEPS)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(stock, rerun)),
                        "stock galore-torch is not deterministic here")
        ours, _, routing = self.run_ours(optim)
        self.assertEqual(len(ours), STEPS)
        # Every GaLore matrix's projector came from the daemon, refreshed every 5 steps.
        self.assertEqual(routing.stats.projectors, 14)
        self.assertEqual(routing.stats.refreshes_adopted, 14 * (STEPS // 5))
        self.assertEqual(routing.stats.local_fallbacks, 0)
        steps = [p.adopted_steps for p in routing.projectors()]
        self.assertEqual(steps, [list(range(0, STEPS, 5))] * 14)
        rel = [gf.relative(a, b) for a, b in zip(loss_values(ours), loss_values(stock))]
        print("\n%s: offloadd synchronous exact vs stock, relative loss difference per step: %s"
              % (optim, " ".join("%.1e" % r for r in rel)))
        self.assertLessEqual(max(rel[:SECOND_REFRESH_STEP]), 1e-5, rel)

        aligned, aligned_model, _ = self.run_ours(optim, align=True)
        diff = [abs(a - b) for a, b in zip(loss_values(aligned), loss_values(stock))]
        params = max(((a - b).norm() / b.norm()).item() for a, b in
                     zip(aligned_model.parameters(), stock_model.parameters()))
        print("%s: signs aligned to torch's: max |loss difference| %.2e, max relative parameter "
              "difference %.2e" % (optim, max(diff), params))
        self.assertLessEqual(max(diff), 1e-4, diff)
        self.assertLessEqual(params, 1e-4)

        with gf.stock_sign_flips(seed=1):
            flipped, _ = gf.train(optim, STEPS)
        flips, unaligned = max_abs(flipped, stock), max_abs(ours, stock)
        print("%s: max |loss difference| unaligned %.2e, stock with random sign flips %.2e" %
              (optim, unaligned, flips))
        # Adafactor without a first moment is sign-invariant (flips change nothing): there the
        # rounding bound of the aligned runs is what is left.
        self.assertLessEqual(unaligned, 2 * flips + 1e-4)
        return routing

    def test_a_galore_adamw(self):
        self.check_optim("galore_adamw")

    def test_b_galore_adamw_layerwise(self):
        routing = self.check_optim("galore_adamw_layerwise")
        ids = [p.parameter_id for p in routing.projectors()]
        self.assertIn("model.layers.0.self_attn.q_proj.weight", ids)  # named by the Trainer

    def test_b_galore_adafactor(self):
        self.check_optim("galore_adafactor")

    def test_adamw_8bit_projectors_come_from_the_daemon(self):
        # GaLoreAdamW8bit's step calls torch.cuda.synchronize(): it cannot run on a CPU. Its
        # projectors are made by the same pre-hook; the first step fails only at that call.
        import galore_torch
        routing = og.enable(socket_path=self.daemon.sock)
        try:
            model = gf.make_model()
            opt = galore_torch.GaLoreAdamW8bit(gf.galore_groups(model), lr=1e-3)
            model(input_ids=gf.dataset(1)[0]["input_ids"][None],
                  labels=gf.dataset(1)[0]["input_ids"][None]).loss.backward()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                try:
                    opt.step()
                except (RuntimeError, AssertionError) as e:  # no CUDA here
                    self.assertRegex(str(e).lower(), "cuda|nvidia")
            made = [s["projector"] for s in opt.state.values() if "projector" in s]
            self.assertEqual(len(made), 14)
            self.assertTrue(all(isinstance(p, og.ServiceProjector) for p in made))
        finally:
            og.disable()


class GaloreCheckpointTest(OneThread, DaemonTestCase):
    """Test c: save at step 15, resume, steps 16-30 as the uninterrupted run."""

    POOL_BYTES = "16MiB"

    def check_resume(self, **options):
        og.enable(socket_path=self.daemon.sock, **options)  # each run its own job
        try:
            whole, whole_model = gf.train("galore_adamw", STEPS)
            out = tempfile.mkdtemp(prefix="ofd-galore-ckpt-")
            try:
                og.enable(socket_path=self.daemon.sock, **options)
                first, _ = gf.train("galore_adamw", 15, save_steps=15, output_dir=out)
                og.enable(socket_path=self.daemon.sock, **options)  # a new run: a new job
                rest, rest_model = gf.train("galore_adamw", STEPS, save_steps=1000,
                                            resume_from=os.path.join(out, "checkpoint-15"),
                                            output_dir=out)
            finally:
                shutil.rmtree(out, ignore_errors=True)
        finally:
            og.disable()
        self.assertEqual(len(rest), STEPS - 15)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(first, whole[:15])))
        diffs = [abs(a - b) for a, b in zip(loss_values(rest), loss_values(whole[15:]))]
        print("\nresume at 15 %s: max |loss difference| steps 16-30 %.1e" % (options, max(diffs)))
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(rest, whole[15:])), diffs)
        self.assertTrue(all(torch.equal(a, b) for a, b in
                            zip(rest_model.parameters(), whole_model.parameters())))

    def test_c_resume_synchronous(self):
        self.check_resume()

    def test_c_resume_asynchronous_with_a_refresh_pending_at_the_save(self):
        # gap 5, k = 5: the refresh submitted at optimizer step 11 (state step 10) is adopted at
        # step 16, so it is pending when the Trainer saves after step 15.
        self.check_resume(asynchronous=True, adopt_after_steps=5)

    def test_c_stock_galore_torch_cannot_resume(self):
        out = tempfile.mkdtemp(prefix="ofd-galore-stock-")
        try:
            gf.train("galore_adamw", 15, save_steps=15, output_dir=out)
            with self.assertRaises(Exception) as cm:
                gf.train("galore_adamw", STEPS, resume_from=os.path.join(out, "checkpoint-15"),
                         output_dir=out)
        finally:
            shutil.rmtree(out, ignore_errors=True)
        print("\nstock galore-torch resume: %s" % str(cm.exception).splitlines()[0][:120])
        self.assertIn("Weights only load failed", str(cm.exception))

    def test_optimizer_state_dict_round_trip_with_weights_only(self):
        import io
        import galore_torch
        og.enable(socket_path=self.daemon.sock, asynchronous=True, adopt_after_steps=2)
        try:
            model = gf.make_model()
            opt = galore_torch.GaLoreAdamW(gf.galore_groups(model, gap=2), lr=1e-3,
                                           no_deprecation_warning=True)
            batch = gf.dataset(1)[0]["input_ids"][None]
            for _ in range(3):  # refreshes at 0 (waited) and 2 (pending until 4)
                opt.zero_grad()
                model(input_ids=batch, labels=batch).loss.backward()
                opt.step()
            buf = io.BytesIO()
            torch.save(opt.state_dict(), buf)
            buf.seek(0)
            loaded = torch.load(buf, weights_only=True)
            live = [s["projector"] for s in opt.state.values() if "projector" in s]
            self.assertTrue(all(isinstance(p, og.ServiceProjector) for p in live))
            self.assertTrue(all(p.pending_adopt_step == 4 for p in live))
            model2 = gf.make_model()
            opt2 = galore_torch.GaLoreAdamW(gf.galore_groups(model2, gap=2), lr=1e-3,
                                            no_deprecation_warning=True)
            opt2.load_state_dict(loaded)
            model2.load_state_dict(model.state_dict())
            for m, o in ((model, opt), (model2, opt2)):
                o.zero_grad()
                m(input_ids=batch, labels=batch).loss.backward()
                o.step()
            restored = [s["projector"] for s in opt2.state.values() if "projector" in s]
            self.assertEqual([p.parameter_id for p in restored], [p.parameter_id for p in live])
            for a, b in zip(live, restored):
                self.assertTrue(torch.equal(a.ortho_matrix, b.ortho_matrix))
                self.assertEqual(b.pending_adopt_step, 4)
            self.assertTrue(all(torch.equal(a, b) for a, b in
                                zip(model.parameters(), model2.parameters())))
        finally:
            og.disable()


class GaloreBadInputTest(OneThread, unittest.TestCase):
    """Test g: a daemon down at a refresh, NaN in a gradient, an untested galore-torch."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("16MiB")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def steps(self, opt, model, n, batch=None):
        batch = batch if batch is not None else gf.dataset(1)[0]["input_ids"][None]
        for _ in range(n):
            opt.zero_grad()
            model(input_ids=batch, labels=batch).loss.backward()
            opt.step()

    def optimizer(self, model, gap=2):
        import galore_torch
        return galore_torch.GaLoreAdamW(gf.galore_groups(model, gap=gap), lr=1e-3,
                                        no_deprecation_warning=True)

    def test_g_daemon_down_synchronous_falls_back_or_raises(self):
        down = Daemon("16MiB")
        routing = og.enable(socket_path=down.sock, timeout_seconds=5)
        try:
            model = gf.make_model()
            opt = self.optimizer(model)
            self.steps(opt, model, 2)  # refresh at 0 through the daemon
            down.stop()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.steps(opt, model, 2)  # refresh at 2: no daemon
            self.assertEqual(routing.stats.local_fallbacks, 14)
            # Only the refreshes of step 0 reached a daemon: those of step 2 are not counted.
            self.assertEqual(routing.stats.refreshes_submitted, 14)
            self.assertEqual(routing.stats.computed, 14)
            self.assertEqual(sum("computed in this process" in str(w.message) for w in caught), 14)
            og.enable(socket_path=down.sock, timeout_seconds=5, fallback="error")
            model2 = gf.make_model()
            with self.assertRaises(errors.DaemonUnavailable) as cm:
                self.steps(self.optimizer(model2), model2, 1)
            self.assertIn("GaLore projector refresh of galore.0.32x32 at step 0",
                          str(cm.exception))  # no names given: the first parameter's ordinal
        finally:
            og.disable()
            down.stop()

    def test_g_daemon_down_asynchronous_keeps_the_projector(self):
        down = Daemon("16MiB")
        routing = og.enable(socket_path=down.sock, timeout_seconds=5, asynchronous=True,
                            adopt_after_steps=1)
        try:
            model = gf.make_model()
            opt = self.optimizer(model)
            self.steps(opt, model, 1)  # the first refresh waits: from the daemon
            before = [p.ortho_matrix.clone() for p in routing.projectors()]
            down.stop()
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                self.steps(opt, model, 5)  # refreshes at 2 and 4 fail, found at 3 and 5: kept
            self.assertEqual(routing.stats.kept_stale, 28)
            self.assertEqual(routing.stats.refreshes_submitted, 14)  # step 0's, not 2's and 4's
            self.assertEqual(routing.stats.local_fallbacks, 0)
            after = [p.ortho_matrix for p in routing.projectors()]
            self.assertTrue(all(torch.equal(a, b) for a, b in zip(before, after)))
        finally:
            og.disable()
            down.stop()

    def test_g_nan_gradient_is_one_error_naming_the_parameter(self):
        og.enable(socket_path=self.daemon.sock)
        try:
            model = gf.make_model()
            og.name_parameters(model)
            opt = self.optimizer(model)
            batch = gf.dataset(1)[0]["input_ids"][None]
            model(input_ids=batch, labels=batch).loss.backward()
            w = model.model.layers[1].mlp.up_proj.weight
            w.grad[3, 7] = float("nan")
            with self.assertRaises(errors.OffloaddError) as cm:
                opt.step()
            e = cm.exception
            self.assertEqual(e.code, errors.INVALID_ARGUMENT)
            self.assertIn("model.layers.1.mlp.up_proj.weight", e.message)
            self.assertIn("row", e.message)
            print("\nNaN gradient: %s" % e)
        finally:
            og.disable()

    def test_g_untested_galore_torch_version_is_refused(self):
        real = _galore_optim.installed_galore_version
        _galore_optim.installed_galore_version = lambda: "0.9"
        try:
            with self.assertRaises(RuntimeError) as cm:
                og.enable(socket_path=self.daemon.sock)
            self.assertIn("galore-torch 1.0; this process has 0.9", str(cm.exception))
            og.enable(socket_path=self.daemon.sock, check_version=False)  # accepted on request
        finally:
            _galore_optim.installed_galore_version = real
            og.disable()

    def test_proj_type_full_stays_with_galore_torch(self):
        import galore_torch
        og.enable(socket_path=self.daemon.sock)
        try:
            model = gf.make_model()
            groups = gf.galore_groups(model)
            groups[1]["proj_type"] = "full"
            opt = galore_torch.GaLoreAdamW(groups, lr=1e-3, no_deprecation_warning=True)
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                self.steps(opt, model, 1)
            made = [s["projector"] for s in opt.state.values() if "projector" in s]
            self.assertTrue(made and not any(isinstance(p, og.ServiceProjector) for p in made))
            self.assertTrue(any("'full'" in str(w.message) for w in caught))
        finally:
            og.disable()


if __name__ == "__main__":
    unittest.main()
