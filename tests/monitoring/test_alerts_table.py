"""The alerts table of docs/metrics-and-alerts.md matches monitoring/prometheus/alerts.yml.

Every rule of alerts.yml is one row of the table with its name, severity, `for` duration ("-"
when the rule has none) and summary (the page escapes "|" as "\\|" inside table cells), and the
table lists no alert that the file does not define.
"""
import os
import re
import unittest

import yaml

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
PAGE = os.path.join(ROOT, "docs", "metrics-and-alerts.md")
RULES = os.path.join(ROOT, "monitoring", "prometheus", "alerts.yml")


def rules_from_file():
    """{alert name: (severity, for, summary)} of every rule in alerts.yml."""
    with open(RULES) as f:
        doc = yaml.safe_load(f)
    out = {}
    for group in doc["groups"]:
        for rule in group["rules"]:
            if "alert" in rule:
                out[rule["alert"]] = (rule["labels"]["severity"], rule.get("for", "-"),
                                      rule["annotations"]["summary"])
    return out


def rows_from_page():
    """{alert name: (severity, for, summary)} of the page's alerts table."""
    out = {}
    for line in open(PAGE):
        m = re.match(r"^\| `(Offloadd[A-Za-z0-9]+)` \| (\w+) \| ([^ |]+) \| (.*) \|$",
                     line.rstrip("\n"))
        if m:
            out[m.group(1)] = (m.group(2), m.group(3), m.group(4).replace("\\|", "|"))
    return out


class AlertsTableTest(unittest.TestCase):
    def test_every_rule_is_one_row_with_its_severity_duration_and_summary(self):
        rules, rows = rules_from_file(), rows_from_page()
        self.assertGreaterEqual(len(rules), 10)
        self.assertEqual(sorted(set(rules) - set(rows)), [],
                         "alerts in alerts.yml missing from the table of " + PAGE)
        self.assertEqual(sorted(set(rows) - set(rules)), [],
                         "alerts in the table of %s that alerts.yml does not define" % PAGE)
        for name, rule in rules.items():
            self.assertEqual(rows[name], rule, "the row of %s differs from alerts.yml" % name)


if __name__ == "__main__":
    unittest.main()
