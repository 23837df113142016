"""The metrics table of docs/metrics-and-alerts.md lists exactly the metric families the daemon
defines.

Reads the family names from server/metrics/metrics.cc (every Name("offloadd_...") call) and the
names in that page's table, and fails naming the ones that are missing on either side.
"""
import os
import re
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class ReadmeMetricsTest(unittest.TestCase):
    def test_table_matches_code(self):
        code = open(os.path.join(ROOT, "server", "metrics", "metrics.cc")).read()
        defined = set(re.findall(r'"(offloadd_[a-z0-9_]+)"', code))
        page = open(os.path.join(ROOT, "docs", "metrics-and-alerts.md")).read()
        documented = set(re.findall(r"^\| `(offloadd_[a-z0-9_]+)`", page, re.M))
        self.assertGreater(len(defined), 20)
        page_name = "docs/metrics-and-alerts.md"
        self.assertEqual(sorted(defined - documented), [], "defined but not in " + page_name)
        self.assertEqual(sorted(documented - defined), [], "in %s but not defined" % page_name)


if __name__ == "__main__":
    unittest.main()
