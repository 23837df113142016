"""A real daemon under a small workload, scraped by a real Prometheus (Debian's), on loopback.

setUpClass starts build/bin/offloadd (shm backend, 64 MiB pool, metrics on a free port) and
/usr/bin/prometheus (1 s scrapes, the job of monitoring/prometheus/prometheus.yml pointed at the
daemon, monitoring/prometheus/alerts.yml loaded), then runs checkpoint_workload: 8 layers of
1 MiB for 3 steps = 24 offloads and 24 reloads of 1 MiB each. The tests then check:
  - Prometheus holds the expected series with the exact counts and bytes of that workload;
  - every metric name in the dashboard and the alert rules is in the daemon's own /metrics;
  - the issue's metric families exist, with their types and labels, and no pid/client label;
  - every dashboard query is valid PromQL for Prometheus, and every alert rule evaluates.
Bounded: the whole class takes < 60 s (each wait has a deadline); it always stops what it
started. Run: /usr/bin/python3 -m unittest test_live_scrape (from tests/monitoring).
"""
import json
import os
import shutil
import subprocess
import time
import unittest

import yaml

import common

PROMETHEUS = "/usr/bin/prometheus"
LAYERS, LAYER_BYTES, STEPS = 8, 1 << 20, 3
TRANSFERS = LAYERS * STEPS  # per direction
BYTES = TRANSFERS * LAYER_BYTES  # per direction
DEADLINE_S = 50  # for the whole class


# Families the README documents as appearing with their first event, which this workload (one
# C++ client, no errors, closed before the scrape) has none of: request errors (the first error),
# the clients' reports by GPU (a session open on the GPU, or its first report). Their names are
# checked against server/metrics/metrics.cc by test_readme_metrics instead.
APPEAR_WITH_THEIR_EVENT = {"offloadd_request_errors_total", "offloadd_client_fallbacks_total",
                           "offloadd_client_host_waits_total",
                           "offloadd_client_host_wait_seconds_total",
                           "offloadd_client_idle_steps_total"}


class LiveScrapeTest(unittest.TestCase):
    daemon = prom = prom_log = tmp = None

    @classmethod
    def setUpClass(cls):
        cls.t0 = time.monotonic()
        if not os.access(PROMETHEUS, os.X_OK):
            raise AssertionError("%s not found: install Debian's prometheus package "
                                 "(deploy/install-deps.sh)" % PROMETHEUS)
        cls.tmp = common.short_tmpdir("ofml")
        try:
            cls._start()
        except BaseException:
            cls.tearDownClass()
            raise

    @classmethod
    def _start(cls):
        # free_port() races with other processes binding ports: retry on a lost race.
        for attempt in range(5):
            cls.metrics_port = common.free_port()
            cls.daemon = common.Daemon(cls.tmp, metrics_port=cls.metrics_port)
            try:
                cls.daemon.wait_ready()
                break
            except AssertionError:
                lost_race = "cannot serve metrics" in cls.daemon.log()
                cls.daemon.stop()
                if not lost_race or attempt == 4:
                    raise
        cls.metrics_url = "http://127.0.0.1:%d/metrics" % cls.metrics_port

        # Prometheus: the repo's offloadd job, aimed at this daemon, 1 s scrapes.
        repo_cfg = common.load_yaml(common.PROMETHEUS_YML)
        job = [j for j in repo_cfg["scrape_configs"] if j["job_name"] == "offloadd"][0]
        job["static_configs"] = [{"targets": ["127.0.0.1:%d" % cls.metrics_port]}]
        job["scrape_interval"] = "1s"
        cfg = {"global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
               "rule_files": [common.ALERTS_YML], "scrape_configs": [job]}
        cfg_path = os.path.join(cls.tmp, "prometheus.yml")
        with open(cfg_path, "w") as f:
            yaml.safe_dump(cfg, f)
        cls.prom_port = common.free_port()
        cls.prom_url = "http://127.0.0.1:%d" % cls.prom_port
        cls.prom_log = open(os.path.join(cls.tmp, "prometheus.log"), "w")
        cls.prom = subprocess.Popen(
            [PROMETHEUS, "--config.file=" + cfg_path,
             "--storage.tsdb.path=" + os.path.join(cls.tmp, "data"),
             "--web.listen-address=127.0.0.1:%d" % cls.prom_port, "--log.level=warn"],
            stdout=cls.prom_log, stderr=subprocess.STDOUT, cwd=cls.tmp)
        cls._wait("Prometheus ready", 20, lambda: common.http_get(cls.prom_url + "/-/ready"))

        r = subprocess.run(
            [common.binary("checkpoint_workload"), "--socket=" + cls.daemon.socket_path,
             "--device=gpu0", "--layers=%d" % LAYERS, "--layer_bytes=%d" % LAYER_BYTES,
             "--steps=%d" % STEPS], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise AssertionError("checkpoint_workload failed: %s %s" % (r.stdout, r.stderr))
        report = json.loads(r.stdout.strip().splitlines()[-1])
        if report["errors"] or report["corrupted"]:
            raise AssertionError("workload reported errors: %s" % report)

        # Synchronise: Prometheus has scraped the finished workload (link counters are
        # refreshed by the daemon's 1 s tick, so they arrive last).
        def caught_up():
            for q, want in (('sum(offloadd_transfers_total{status="ok"})', 2 * TRANSFERS),
                            ("sum(offloadd_link_bytes_total)", 2 * BYTES)):
                st, data = common.prometheus_query(cls.prom_url, q)
                if st != "success" or not data["result"]:
                    return False
                if float(data["result"][0]["value"][1]) < want:
                    return False
            return True

        cls._wait("Prometheus to scrape the workload's counters", 20, caught_up)
        cls.scrape = common.http_get(cls.metrics_url)

    @classmethod
    def _wait(cls, what, timeout, probe):
        deadline = min(time.monotonic() + timeout, cls.t0 + DEADLINE_S)
        last = None
        while time.monotonic() < deadline:
            try:
                if probe():
                    return
            except Exception as e:  # noqa: BLE001 (not up yet)
                last = e
            time.sleep(0.2)
        raise AssertionError("timed out waiting for %s (%s); prometheus log:\n%s"
                             % (what, last, cls._prom_log_tail()))

    @classmethod
    def _prom_log_tail(cls):
        try:
            return common.read_text(os.path.join(cls.tmp, "prometheus.log"))[-2000:]
        except OSError:
            return ""

    @classmethod
    def tearDownClass(cls):
        common.stop_process(cls.prom)
        if cls.prom_log:
            cls.prom_log.close()
        if cls.daemon:
            cls.daemon.stop()
        if cls.tmp:
            shutil.rmtree(cls.tmp, ignore_errors=True)

    # --- helpers ----------------------------------------------------------------------------
    def query(self, q):
        st, data = common.prometheus_query(self.prom_url, q)
        self.assertEqual(st, "success", "%s: %s" % (q, data))
        return data

    def scalar(self, q):
        res = self.query(q)["result"]
        return float(res[0]["value"][1]) if res else None

    def samples(self):
        return common.parse_exposition(self.scrape)

    # --- tests ------------------------------------------------------------------------------
    def test_prometheus_has_workload_series_with_values(self):
        expect = [  # (PromQL, check, description)
            ("offloadd_build_info", lambda v: v == 1, "== 1"),
            ("sum(offloadd_pool_capacity_bytes)", lambda v: v == 64 << 20, "== 64 MiB"),
            ("sum(offloadd_pool_peak_used_bytes)", lambda v: 0 < v <= 64 << 20, "in (0, 64 MiB]"),
            ('sum(offloadd_transfers_total{direction="d2h",gpu="gpu0",status="ok"})',
             lambda v: v == TRANSFERS, "== %d" % TRANSFERS),
            ('sum(offloadd_transfers_total{direction="h2d",gpu="gpu0",status="ok"})',
             lambda v: v == TRANSFERS, "== %d" % TRANSFERS),
            ('sum(offloadd_transfer_bytes_total{direction="d2h",gpu="gpu0",status="ok"})',
             lambda v: v == BYTES, "== %d" % BYTES),
            ('sum(offloadd_transfer_bytes_total{direction="h2d",gpu="gpu0",status="ok"})',
             lambda v: v == BYTES, "== %d" % BYTES),
            ("sum(offloadd_transfer_duration_seconds_count)", lambda v: v == 2 * TRANSFERS,
             "== %d" % (2 * TRANSFERS)),
            ("sum(offloadd_transfer_duration_seconds_sum)", lambda v: v > 0, "> 0"),
            ("sum(offloadd_transfer_size_bytes_sum)", lambda v: v == 2 * BYTES,
             "== %d" % (2 * BYTES)),
            ('sum(offloadd_link_bytes_total{link="gpu0"})', lambda v: v == 2 * BYTES,
             "== %d" % (2 * BYTES)),
            ('sum(offloadd_link_busy_seconds_total{link="gpu0"})', lambda v: v > 0, "> 0"),
            ('sum(offloadd_sessions_ended_total{cause="closed"})', lambda v: v >= 1, ">= 1"),
            ("sum(offloadd_sessions_open)", lambda v: v == 0, "== 0"),
            ("sum(offloadd_offloads_refused_total)", lambda v: v == 0, "== 0"),
            # Requested metrics: one queue-wait observation per transfer; the shm backend
            # counts each client region it maps as an IPC handle open.
            ("sum(offloadd_link_queue_wait_seconds_count)", lambda v: v == 2 * TRANSFERS,
             "== %d" % (2 * TRANSFERS)),
            ('sum(offloadd_ipc_handle_opens_total{gpu="gpu0"})', lambda v: v >= 1, ">= 1"),
            # The C++ client offers a request ring and sends its offloads and reloads on it.
            ('sum(offloadd_ring_offers_total{result="attached"})', lambda v: v >= 1, ">= 1"),
            ('sum(offloadd_ring_offers_total{result="refused"})', lambda v: v == 0, "== 0"),
            ("sum(offloadd_ring_requests_total)", lambda v: v >= 2 * TRANSFERS,
             ">= %d" % (2 * TRANSFERS)),
            # Its ring thread slept between the requests, ran until the client closed, and
            # left no answer waiting; the client wrote no malformed entry.
            ("sum(offloadd_ring_sleeps_total)", lambda v: v >= 1, ">= 1"),
            ("sum(offloadd_ring_threads)", lambda v: v == 0, "== 0"),
            ("sum(offloadd_ring_completions_waiting)", lambda v: v == 0, "== 0"),
            ("sum(offloadd_ring_malformed_entries_total)", lambda v: v == 0, "== 0"),
        ]
        bad = []
        for q, ok, want in expect:
            v = self.scalar(q)
            if v is None or not ok(v):
                bad.append("  %s = %s, want %s" % (q, "no series" if v is None else v, want))
        if bad:
            self.fail("Prometheus series wrong after the workload:\n" + "\n".join(bad))

    def test_dashboard_and_rule_metrics_exist_in_daemon_scrape(self):
        names = {s[0] for s in self.samples()[0]}
        uses = {}
        queries = common.dashboard_queries(common.load_dashboard())
        queries += common.rules_queries(common.load_yaml(common.ALERTS_YML))
        for where, expr in queries:
            for name in common.promql_metric_names(expr):
                uses.setdefault(name, []).append(where)
        self.assertIn("offloadd_transfers_total", uses)  # the extraction found names at all
        missing = sorted(n for n in uses
                         if n not in names and n not in common.PROMETHEUS_OWN_METRICS
                         and n not in APPEAR_WITH_THEIR_EVENT)
        if missing:
            self.fail("metrics used by the dashboard/rules but absent from the daemon's /metrics:\n"
                      + "\n".join("  %s  (%s)" % (n, "; ".join(sorted(set(uses[n]))))
                                   for n in missing))

    def test_issue_metric_families_types_and_labels(self):
        samples, types = self.samples()
        problems = []
        for family, kind, labels in common.ISSUE_METRICS:
            series = [s for s in samples
                      if s[0] == family or (kind == "histogram" and s[0] in (
                          family + "_bucket", family + "_sum", family + "_count"))]
            if not series:
                problems.append("  %s (%s, labels %s): missing" % (family, kind, ", ".join(labels)
                                                                    or "none"))
                continue
            if types.get(family) != kind:
                problems.append("  %s: type %s, want %s" % (family, types.get(family), kind))
            have = set().union(*(s[1].keys() for s in series))
            lack = [l for l in labels if l not in have]
            if lack:
                problems.append("  %s: no series carries label(s) %s" % (family, ", ".join(lack)))
        if problems:
            self.fail("required metric set incomplete:\n" + "\n".join(problems))

    def test_naming_rules(self):
        samples, types = self.samples()
        for name, labels, _ in samples:
            if not name.startswith("offloadd_"):
                continue
            self.assertFalse(FORBIDDEN & set(labels), "%s has label %s" % (name, labels))
            self.assertNotIn("percent", name)
        for family, kind in types.items():
            if family.startswith("offloadd_") and kind == "counter":
                self.assertTrue(family.endswith("_total"), family)

    def test_dashboard_queries_are_valid_promql(self):
        bad = []
        for where, expr in common.dashboard_queries(common.load_dashboard()):
            st, err = common.prometheus_query(self.prom_url, common.grafana_to_promql(expr))
            if st != "success":
                bad.append("  %s: %s -> %s" % (where, expr, err))
        if bad:
            self.fail("Prometheus rejects dashboard queries:\n" + "\n".join(bad))

    def test_alert_rules_load_and_evaluate(self):
        def rules():
            doc = json.loads(common.http_get(self.prom_url + "/api/v1/rules"))
            return [r for g in doc["data"]["groups"] for r in g["rules"]]

        want = {r["alert"] for g in common.load_yaml(common.ALERTS_YML)["groups"]
                for r in g["rules"]}
        deadline = time.monotonic() + 10
        got = rules()
        while time.monotonic() < deadline and any(r["health"] == "unknown" for r in got):
            time.sleep(0.2)
            got = rules()
        self.assertEqual({r["name"] for r in got}, want)
        for r in got:
            self.assertEqual(r["health"], "ok", "%s: %s" % (r["name"], r.get("lastError")))
        # Nothing is wrong with this daemon: no alert may be firing or pending once the rules
        # were evaluated over scraped data (an evaluation before the first scrape finds no
        # target at all: OffloaddNoTargets pending until the next one, later on a loaded host).
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(r["state"] != "inactive" for r in got):
            time.sleep(0.5)
            got = rules()
        self.assertEqual([r["name"] for r in got if r["state"] != "inactive"], [])


FORBIDDEN = common.FORBIDDEN_LABELS

if __name__ == "__main__":
    unittest.main()
