"""docs/configuration.md names every top-level field of DaemonConfig (proto/config.proto).

The page calls itself the reference of every config field; this test fails naming the fields
the proto defines that the page does not mention in backticks, so a new field cannot ship
undocumented.
"""
import os
import re
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))


def daemon_config_fields():
    """Names of the fields declared directly in `message DaemonConfig { ... }`."""
    text = open(os.path.join(ROOT, "proto", "config.proto")).read()
    start = text.index("message DaemonConfig {")
    depth, fields = 0, []
    for line in text[start:].splitlines():
        code = line.split("//", 1)[0]
        if depth == 1:
            m = re.match(r"\s*(?:repeated\s+|optional\s+)?[\w.]+\s+(\w+)\s*=\s*\d+", code)
            if m:
                fields.append(m.group(1))
        depth += code.count("{") - code.count("}")
        if depth == 0 and fields:
            break
    return fields


class ConfigDocTest(unittest.TestCase):
    def test_every_daemon_config_field_is_on_the_page(self):
        fields = daemon_config_fields()
        self.assertGreater(len(fields), 40)
        self.assertIn("pool_bytes", fields)
        page = open(os.path.join(ROOT, "docs", "configuration.md")).read()
        missing = [f for f in fields if not re.search(r"`[^`\n]*\b%s\b[^`\n]*`" % f, page)]
        self.assertEqual(missing, [], "DaemonConfig fields not in docs/configuration.md")


if __name__ == "__main__":
    unittest.main()
