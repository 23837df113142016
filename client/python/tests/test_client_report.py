"""Clients report what they did without the daemon: fallbacks, host waits and idle steps reach
the daemon's session stats (GetStats, ``offloadctl sessions``) and its audit log; a report that
goes down within a session is refused with INVALID_ARGUMENT.
"""

import unittest
import warnings

import torch
from daemon_fixture import L, THRESHOLD, DaemonTestCase, bitwise_equal, run_step

import offloadd.torch as ot
from offloadd import errors
from offloadd.client import Client
from offloadd.torch import _endpoint, _stats

torch.set_num_threads(2)


def sessions_named(daemon, needle):
    return [s for s in daemon.stats().sessions if needle in s.client_name]


class ReportProtocolTest(DaemonTestCase):
    def test_latest_report_is_kept_and_a_lower_one_refused(self):
        with Client(self.daemon.sock, "reporter", "cpu") as c:
            c.report(fallbacks_total=3, host_waits_total=2, host_wait_seconds_total=0.5,
                     idle_steps_total=1).result(10)
            c.report(fallbacks_total=4, host_waits_total=2, host_wait_seconds_total=0.75,
                     idle_steps_total=1).result(10)
            with self.assertRaises(errors.OffloaddError) as e:
                c.report(fallbacks_total=1).result(10)
            self.assertEqual(e.exception.code, errors.INVALID_ARGUMENT)
            self.assertIn("fallbacks_total went down from 4 to 1", str(e.exception))
            with self.assertRaises(errors.OffloaddError) as e:
                c.report(fallbacks_total=4, host_waits_total=2,
                         host_wait_seconds_total=float("nan"), idle_steps_total=1).result(10)
            self.assertEqual(e.exception.code, errors.INVALID_ARGUMENT)
            (s,) = sessions_named(self.daemon, "reporter")
            r = s.client_report
            self.assertEqual((r.fallbacks_total, r.host_waits_total, r.idle_steps_total),
                             (4, 2, 1))
            self.assertAlmostEqual(r.host_wait_seconds_total, 0.75)
            # The session keeps serving after the refusals.
            self.assertEqual(c.get_stats().backend, "shm")

    def test_open_and_close_are_in_the_audit_log(self):
        with Client(self.daemon.sock, "audited", "cpu") as c:
            sid = c.hello.session_id
        with open(self.daemon.log.name) as f:
            log = f.read()
        self.assertIn('audit: session_open session=%d client="audited" device="cpu"' % sid, log)
        self.assertIn("audit: session_close session=%d cause=closed blocks=0 bytes=0" % sid, log)


class FallbacksReachTheDaemonTest(DaemonTestCase):
    """A session quota of 80 KiB admits two 32 KiB layer inputs; the others are refused after
    0.2 s and fall back: the daemon learns how many from the client's report."""

    POOL_BYTES = "1MiB"
    EXTRA = ("--session_quota_bytes", "80KiB", "--admission_deadline_seconds", "0.2")

    def test_fallbacks_and_host_waits_are_reported_per_session(self):
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                     keep_last_n=0)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            out = run_step("offloadd", ctx)
        self.assertTrue(bitwise_equal(out, run_step("plain")))
        self.assertGreaterEqual(ctx.stats.fallbacks, 1)
        self.assertTrue(ot.synchronize())
        totals = _stats.device_totals("cpu")
        self.assertEqual(totals["fallbacks_total"], ctx.stats.fallbacks)
        self.assertEqual(totals["host_waits_total"], ctx.stats.host_waits)
        (s,) = sessions_named(self.daemon, "cpu")
        self.assertEqual(s.client_report.fallbacks_total, ctx.stats.fallbacks)
        self.assertEqual(s.client_report.host_waits_total, ctx.stats.host_waits)
        self.assertAlmostEqual(s.client_report.host_wait_seconds_total,
                               ctx.stats.host_wait_seconds, places=6)

    def test_idle_steps_are_reported(self):
        # keep_last_n above the step's layer inputs: nothing is sent, every step is idle.
        ctx = ot.offload_checkpoints(socket_path=self.daemon.sock, threshold_bytes=THRESHOLD,
                                     keep_last_n=L + 1)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for step in range(3):
                run_step("offloadd", ctx, batch_seed=step)
        # The idle steps sent nothing, so no session exists yet: open one and report.
        ep, why = _endpoint.get(self.daemon.sock, torch.device("cpu"))
        self.assertIsNotNone(ep, why)
        self.assertTrue(ot.synchronize())
        self.assertEqual(ctx.stats.idle_steps, 3)
        (s,) = sessions_named(self.daemon, "cpu")
        self.assertEqual(s.client_report.idle_steps_total, 3)


class WaitsOfManyThreadsTest(DaemonTestCase):
    """Threads that wait at once sum to more host-wait seconds than the session has lived; the
    daemon refuses a report past the session's age, so the client sends at most the age (the
    rest once the session is old enough) and the report's counts still arrive."""

    def test_seconds_past_the_session_age_do_not_lose_the_report(self):
        ep, why = _endpoint.get(self.daemon.sock, torch.device("cpu"))
        self.assertIsNotNone(ep, why)
        # Eight threads waited 5 s each: 40 s, in a session a moment old.
        _stats.count_for_device("cpu", fallbacks=2, host_waits=8, host_wait_seconds=40.0)
        self.assertTrue(ot.synchronize())
        (s,) = sessions_named(self.daemon, "cpu")
        r = s.client_report
        self.assertEqual((r.fallbacks_total, r.host_waits_total), (2, 8))
        self.assertGreater(r.host_wait_seconds_total, 0.0)
        self.assertLess(r.host_wait_seconds_total, 30.0)
        self.assertEqual(ep.reported["host_wait_seconds_total"], r.host_wait_seconds_total)
        # The withheld seconds follow in later reports, which the daemon accepts too.
        _stats.count_for_device("cpu", fallbacks=1)
        self.assertTrue(ot.synchronize())
        (s,) = sessions_named(self.daemon, "cpu")
        self.assertEqual(s.client_report.fallbacks_total, 3)
        self.assertGreaterEqual(s.client_report.host_wait_seconds_total,
                                r.host_wait_seconds_total)


if __name__ == "__main__":
    unittest.main()
