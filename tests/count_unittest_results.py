#!/usr/bin/env python3
"""Sums test results from a log: Python unittest's "Ran N tests" + status lines, and pytest's
final summary line ("3 passed, 1 failed, 2 skipped in 4.2s"; errors count as failed).

Usage: count_unittest_results.py LOG -> prints "PASSED FAILED" (skipped tests count as neither;
a log with neither kind of summary counts as one failure).
"""
import re
import sys


def unittest_counts(text):
    passed = failed = 0
    found = False
    for m in re.finditer(r"^Ran (\d+) tests? in [\d.]+s\s*\n\s*\n?(OK|FAILED)([^\n]*)", text, re.M):
        found = True
        total = int(m.group(1))
        detail = m.group(3)
        bad = sum(int(x) for x in re.findall(r"(?:failures|errors)=(\d+)", detail))
        skipped = sum(int(x) for x in re.findall(r"skipped=(\d+)", detail))
        passed += total - bad - skipped
        failed += bad
    return found, passed, failed


def pytest_counts(text):
    passed = failed = 0
    found = False
    for m in re.finditer(r"^=*\s*(\d+ (?:subtests )?\w+(?:, \d+ (?:subtests )?\w+)*) in "
                         r"[\d.]+s", text, re.M):
        found = True
        for n, sub, what in re.findall(r"(\d+) (subtests )?(\w+)", m.group(1)):
            if sub:
                continue  # subtests are parts of tests already counted
            if what == "passed":
                passed += int(n)
            elif what in ("failed", "error", "errors"):
                failed += int(n)
    return found, passed, failed


def main():
    try:
        text = open(sys.argv[1]).read()
    except OSError:
        print(0, 1)
        return 0
    u_found, u_pass, u_fail = unittest_counts(text)
    p_found, p_pass, p_fail = pytest_counts(text)
    if not (u_found or p_found):
        print(0, 1)
        return 0
    print(u_pass + p_pass, u_fail + p_fail)
    return 0


if __name__ == "__main__":
    sys.exit(main())
