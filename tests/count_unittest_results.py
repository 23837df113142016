#!/usr/bin/env python3
"""Sums Python unittest results from a log: every "Ran N tests" line and its status line.

Usage: count_unittest_results.py LOG -> prints "PASSED FAILED" (skipped tests count as neither).
"""
import re
import sys


def main():
    passed = failed = 0
    try:
        text = open(sys.argv[1]).read()
    except OSError:
        print(0, 1)
        return 0
    for m in re.finditer(r"^Ran (\d+) tests? in [\d.]+s\s*\n\s*\n?(OK|FAILED)([^\n]*)", text, re.M):
        total = int(m.group(1))
        detail = m.group(3)
        bad = sum(int(x) for x in re.findall(r"(?:failures|errors)=(\d+)", detail))
        skipped = sum(int(x) for x in re.findall(r"skipped=(\d+)", detail))
        passed += total - bad - skipped
        failed += bad
    print(passed, failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
