"""Prometheus config and alert rules: promtool check config / check rules / test rules.

Also checks that the alerts the issue asks for exist with the right thresholds, so a rule
deleted or loosened fails here and not only in production.
Run: /usr/bin/python3 -m unittest test_promtool (from tests/monitoring).
"""
import os
import shutil
import subprocess
import unittest

import yaml

import common

PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def promtool(*args, cwd=None):
    return subprocess.run([PROMTOOL] + list(args), capture_output=True, text=True, timeout=60,
                          cwd=cwd)


class PromtoolTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not os.access(PROMTOOL, os.X_OK):
            raise AssertionError("promtool not found: install Debian's prometheus package "
                                 "(deploy/install-deps.sh)")

    def test_check_config(self):
        r = promtool("check", "config", common.PROMETHEUS_YML)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("1 rule files found", r.stdout + r.stderr)

    def test_check_kubernetes_config(self):
        # Debian's promtool has no Kubernetes discovery: swap it for file discovery, which
        # leaves the relabelling, paths and rule files to check.
        doc = common.load_yaml(common.PROMETHEUS_K8S_YML)
        jobs = [j for j in doc["scrape_configs"] if "kubernetes_sd_configs" in j]
        self.assertTrue(jobs, "no job with kubernetes_sd_configs")
        for j in jobs:
            self.assertEqual(j["kubernetes_sd_configs"][0]["role"], "pod")
        tmp = common.short_tmpdir("ofmp")
        try:
            for j in jobs:
                del j["kubernetes_sd_configs"]
                j["file_sd_configs"] = [{"files": [os.path.join(tmp, "targets.json")]}]
            doc["rule_files"] = [os.path.join(os.path.dirname(common.PROMETHEUS_K8S_YML), f)
                                 for f in doc["rule_files"]]
            path = os.path.join(tmp, "k8s.yml")
            with open(path, "w") as f:
                yaml.safe_dump(doc, f)
            r = promtool("check", "config", path)
            self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        finally:
            shutil.rmtree(tmp)

    def test_check_rules(self):
        r = promtool("check", "rules", common.ALERTS_YML)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)

    def test_rule_unit_tests(self):
        r = promtool("test", "rules", os.path.basename(common.ALERTS_TEST_YML),
                     cwd=os.path.dirname(common.ALERTS_TEST_YML))
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SUCCESS", r.stdout + r.stderr)


class AlertContentTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        doc = common.load_yaml(common.ALERTS_YML)
        cls.rules = {r["alert"]: r for g in doc["groups"] for r in g["rules"] if "alert" in r}

    def rule(self, name):
        self.assertIn(name, self.rules, "alert %s missing" % name)
        return self.rules[name]

    def test_required_alerts(self):
        pool = self.rule("OffloaddPoolAbove90Percent")
        self.assertIn("offloadd_pool_used_bytes", pool["expr"])
        self.assertIn("offloadd_pool_capacity_bytes", pool["expr"])
        self.assertIn("> 0.9", pool["expr"])
        self.assertEqual(pool["for"], "5m")
        self.assertIn("offloadd_offloads_refused_total",
                      self.rule("OffloaddOffloadsRefused")["expr"])
        link = self.rule("OffloaddLinkSaturatedReloadsLate")["expr"]
        self.assertIn("offloadd_link_busy_seconds_total", link)
        self.assertIn("offloadd_reload_deadline_misses_total", link)
        crash = self.rule("OffloaddSessionsCrashing")["expr"]
        self.assertIn('offloadd_sessions_ended_total{cause="crashed"}', crash)

    def test_every_alert_has_severity_and_text(self):
        for name, r in self.rules.items():
            self.assertIn(r.get("labels", {}).get("severity"), ("warning", "critical"), name)
            self.assertTrue(r.get("annotations", {}).get("summary"), name)
            self.assertTrue(r.get("annotations", {}).get("description"), name)

    def test_only_daemon_metrics_and_up(self):
        for where, expr in common.rules_queries(common.load_yaml(common.ALERTS_YML)):
            for name in common.promql_metric_names(expr):
                self.assertTrue(name.startswith("offloadd_")
                                or name in common.PROMETHEUS_OWN_METRICS,
                                "%s uses %s" % (where, name))


if __name__ == "__main__":
    unittest.main()
