"""Link calibration through the daemon (docs/link-calibration.md), on cuda-sim (SIMULATED).

The model: 4 GPUs, 2 per switch, 20 GB/s per GPU and direction, 30 GB/s per switch, so the
daemon's topology has the links sim-switch0 and sim-switch1 with no configured capacity. At
start-up the daemon must measure each GPU alone within 5 % of 20 GB/s and each switch's GPUs
together within 5 % of 30 GB/s, pace the links at that, report it in GetStats and in the
metrics; CalibrateLinks (and `offloadctl calibrate-links`) must measure again on demand; a
configured capacity must win; `link_calibration: false` must leave the links unpaced until
asked; the shm backend must refuse with FAILED_PRECONDITION.
"""
import os
import subprocess
import tempfile
import time
import unittest
import urllib.request

import grpc

from daemon_fixture import Daemon, daemon_bin, free_port, pb, pb_grpc

MODEL = ('backend: "cuda-sim"\n'
         "cuda_sim { gpus: 4 gpus_per_switch: 2 engine_bytes_per_second: 20GB "
         "switch_bytes_per_second: 30GB }\n")
GPU, SWITCH = 20e9, 30e9


def sim_uuid(i):
    return "GPU-51300000-0000-0000-0000-%012d" % i



def write_config(text):
    f = tempfile.NamedTemporaryFile("w", prefix="offloadd-cal-", suffix=".conf", delete=False)
    f.write(text)
    f.close()
    return f.name


def call(daemon, method, request, timeout=30):
    with grpc.insecure_channel("unix:" + daemon.sock) as channel:
        return getattr(pb_grpc.OffloadStub(channel), method)(request, timeout=timeout)


def links_by_name(stats):
    return {l.name: l for l in stats.links}


class CalibratedAtStartTest(unittest.TestCase):
    """A cuda-sim daemon with the default link_calibration: true."""

    @classmethod
    def setUpClass(cls):
        cls.conf = write_config(MODEL)
        cls.port = free_port()
        cls.started = time.time()
        cls.daemon = Daemon("64MiB", ["--config", cls.conf,
                                      "--metrics_address", "127.0.0.1:%d" % cls.port])
        cls.at_start = cls.daemon.stats()  # before any test calibrates again

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        os.unlink(cls.conf)

    def assertWithin5Percent(self, measured, modelled, what):
        self.assertLess(abs(measured - modelled), 0.05 * modelled,
                        "%s: %.2f GB/s measured, %.2f modelled" % (what, measured / 1e9,
                                                                 modelled / 1e9))

    def test_links_are_paced_at_what_their_gpus_moved_together(self):
        links = links_by_name(self.at_start)
        for name in ("sim-switch0", "sim-switch1"):
            link = links[name]
            self.assertWithin5Percent(link.d2h_capacity_bytes_per_second, SWITCH, name + " d2h")
            self.assertWithin5Percent(link.h2d_capacity_bytes_per_second, SWITCH, name + " h2d")
            self.assertTrue(link.d2h_capacity_calibrated and link.h2d_capacity_calibrated)
        self.assertEqual(list(links["sim-switch1"].gpus), [sim_uuid(2), sim_uuid(3)])

    def test_the_report_has_each_gpu_alone_and_the_gpus_together(self):
        cal = self.at_start.link_calibration
        self.assertGreaterEqual(cal.started_at_unix_seconds, self.started - 1)
        self.assertLessEqual(cal.seconds, cal.budget_seconds + 1)
        self.assertEqual(cal.budget_seconds, 5)
        self.assertEqual([l.name for l in cal.links], ["sim-switch0", "sim-switch1"])
        for link in cal.links:
            self.assertEqual(link.error, "")
            self.assertEqual(len(link.gpus), 2)
            for g in link.gpus:
                self.assertWithin5Percent(g.d2h_bytes_per_second, GPU, g.gpu + " alone d2h")
                self.assertWithin5Percent(g.h2d_bytes_per_second, GPU, g.gpu + " alone h2d")
            self.assertWithin5Percent(link.d2h_bytes_per_second, SWITCH, link.name + " together")
            self.assertEqual(link.paced_d2h_bytes_per_second, link.d2h_bytes_per_second)
            self.assertFalse(link.d2h_configured)

    def test_the_metrics_carry_the_figures_and_when(self):
        text = urllib.request.urlopen("http://127.0.0.1:%d/metrics" % self.port,
                                      timeout=10).read().decode()
        samples = {}
        for line in text.splitlines():
            if line.startswith("offloadd_") and "calibrat" in line.split("{")[0]:
                key, value = line.rsplit(" ", 1)
                samples[key] = float(value)
        key = 'offloadd_link_calibrated_bytes_per_second{direction="h2d",link="sim-switch1"}'
        self.assertWithin5Percent(samples[key], SWITCH, key)
        key = ('offloadd_gpu_calibrated_bytes_per_second{direction="d2h",gpu="%s",'
               'link="sim-switch0"}' % sim_uuid(1))
        self.assertWithin5Percent(samples[key], GPU, key)
        when = samples['offloadd_link_calibration_timestamp_seconds{link="sim-switch0"}']
        self.assertGreater(when, self.started - 1)
        self.assertLess(when, time.time() + 1)
        self.assertEqual(len([k for k in samples if k.startswith("offloadd_gpu_calibrated")]), 8)

    def test_calibrate_links_measures_again(self):
        before = self.daemon.stats().link_calibration.started_at_unix_seconds
        reply = call(self.daemon, "CalibrateLinks", pb.CalibrateLinksRequest(budget_seconds=2))
        self.assertEqual(reply.budget_seconds, 2)
        self.assertGreater(reply.started_at_unix_seconds, before)
        self.assertLess(reply.seconds, 3)
        self.assertEqual([l.error for l in reply.links], ["", ""])
        self.assertWithin5Percent(reply.links[1].h2d_bytes_per_second, SWITCH, "again")
        self.assertEqual(self.daemon.stats().link_calibration.started_at_unix_seconds,
                         reply.started_at_unix_seconds)

    def test_offloadctl_calibrate_links(self):
        ctl = os.path.join(os.path.dirname(daemon_bin()), "..", "client", "cli", "offloadctl")
        if not os.access(ctl, os.X_OK):
            ctl = os.path.join(os.path.dirname(daemon_bin()), "offloadctl")
        if not os.access(ctl, os.X_OK):
            self.skipTest("offloadctl is not built beside the daemon (%s)" % ctl)
        out = subprocess.run([ctl, "--socket", self.daemon.sock, "calibrate-links",
                              "--budget-seconds", "2"], capture_output=True, text=True,
                             timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("link sim-switch0", out.stdout)
        self.assertIn("2 GPU(s) together", out.stdout)
        self.assertIn("(measured)", out.stdout)
        bad = subprocess.run([ctl, "--socket", self.daemon.sock, "calibrate-links",
                              "--budget-seconds", "-3"], capture_output=True, text=True,
                             timeout=30)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("--budget-seconds", bad.stderr)

    def test_a_budget_outside_the_range_is_refused(self):
        for budget in (-1, 601):
            with self.assertRaises(grpc.RpcError) as e:
                call(self.daemon, "CalibrateLinks", pb.CalibrateLinksRequest(budget_seconds=budget))
            self.assertEqual(e.exception.code(), grpc.StatusCode.INVALID_ARGUMENT)
            self.assertIn("[0, 600]", e.exception.details())


class NotAtStartAndConfiguredWinsTest(unittest.TestCase):
    """link_calibration: false, and sim-switch0's d2h capacity configured."""

    @classmethod
    def setUpClass(cls):
        cls.conf = write_config(MODEL + 'links { name: "sim-switch0" d2h_bytes_per_second: 10GB }\n')
        cls.daemon = Daemon("64MiB", ["--config", cls.conf, "--link_calibration=false"])

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()
        os.unlink(cls.conf)

    def test_unpaced_until_asked_then_the_configured_capacity_wins(self):
        stats = self.daemon.stats()
        self.assertFalse(stats.HasField("link_calibration"))
        links = links_by_name(stats)
        self.assertEqual(links["sim-switch0"].d2h_capacity_bytes_per_second, 10e9)
        self.assertEqual(links["sim-switch0"].h2d_capacity_bytes_per_second, 0)
        self.assertEqual(links["sim-switch1"].d2h_capacity_bytes_per_second, 0)
        reply = call(self.daemon, "CalibrateLinks", pb.CalibrateLinksRequest(budget_seconds=2))
        self.assertTrue(reply.links[0].d2h_configured)
        self.assertEqual(reply.links[0].paced_d2h_bytes_per_second, 10e9)
        links = links_by_name(self.daemon.stats())
        self.assertEqual(links["sim-switch0"].d2h_capacity_bytes_per_second, 10e9)
        self.assertFalse(links["sim-switch0"].d2h_capacity_calibrated)
        self.assertTrue(links["sim-switch0"].h2d_capacity_calibrated)
        self.assertLess(abs(links["sim-switch0"].h2d_capacity_bytes_per_second - SWITCH),
                        0.05 * SWITCH)
        self.assertLess(abs(links["sim-switch1"].d2h_capacity_bytes_per_second - SWITCH),
                        0.05 * SWITCH)


CHILD_NOT_ADMIN = r"""
import os, sys, grpc
sys.path.insert(0, %r)
from daemon_fixture import pb, pb_grpc
os.setgroups([]); os.setgid(65534); os.setuid(65534)
with grpc.insecure_channel("unix:" + sys.argv[1]) as channel:
    try:
        pb_grpc.OffloadStub(channel).CalibrateLinks(pb.CalibrateLinksRequest(), timeout=10)
        print("answered")
    except grpc.RpcError as e:
        print(e.code().name, e.details())
"""


@unittest.skipUnless(os.geteuid() == 0, "needs root to run a client as another uid")
class OnlyAdminsCalibrateTest(unittest.TestCase):
    def test_another_uid_gets_permission_denied(self):
        import sys
        conf = write_config(MODEL)
        daemon = Daemon("64MiB", ["--config", conf, "--link_calibration=false",
                                  "--socket_mode", "0666"])
        try:
            here = os.path.dirname(os.path.abspath(__file__))
            out = subprocess.run([sys.executable, "-c", CHILD_NOT_ADMIN % here, daemon.sock],
                                 capture_output=True, text=True, timeout=60)
            self.assertIn("PERMISSION_DENIED", out.stdout, out.stderr)
            self.assertIn("uid 65534", out.stdout)
            self.assertFalse(daemon.stats().HasField("link_calibration"))  # nothing measured
        finally:
            daemon.stop()
            os.unlink(conf)


class ShmHasNothingToMeasureTest(unittest.TestCase):
    def test_refused_with_failed_precondition(self):
        daemon = Daemon("64MiB")
        try:
            with self.assertRaises(grpc.RpcError) as e:
                call(daemon, "CalibrateLinks", pb.CalibrateLinksRequest())
            self.assertEqual(e.exception.code(), grpc.StatusCode.FAILED_PRECONDITION)
            self.assertIn("cuda or cuda-sim", e.exception.details())
        finally:
            daemon.stop()


if __name__ == "__main__":
    unittest.main()
