"""The README's metrics table lists exactly the metric families the daemon defines.

Reads the family names from server/metrics/metrics.cc (every Name("offloadd_...") call) and the
names in the README's "Metrics" table, and fails naming the ones that are missing on either side.
"""
import os
import re
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


class ReadmeMetricsTest(unittest.TestCase):
    def test_table_matches_code(self):
        code = open(os.path.join(ROOT, "server", "metrics", "metrics.cc")).read()
        defined = set(re.findall(r'"(offloadd_[a-z0-9_]+)"', code))
        readme = open(os.path.join(ROOT, "README.md")).read()
        section = readme[readme.index("## Metrics"):readme.index("## Protocol")]
        documented = set(re.findall(r"^\| `(offloadd_[a-z0-9_]+)`", section, re.M))
        self.assertGreater(len(defined), 20)
        self.assertEqual(sorted(defined - documented), [], "defined but not in the README table")
        self.assertEqual(sorted(documented - defined), [], "in the README table but not defined")


if __name__ == "__main__":
    unittest.main()
