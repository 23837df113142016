#!/usr/bin/env python3
"""Counts test cases in the JUnit XML files Bazel wrote for the given test targets.

Usage: count_bazel_results.py TARGETS_FILE TESTLOGS_DIR  -> prints "PASSED FAILED".
A target without a test.xml (it did not run, or crashed before writing one) counts as one
failed case; a test case with a <failure> or <error> child counts as failed.
"""
import os
import sys
import xml.etree.ElementTree as ET


def main():
    targets_file, testlogs = sys.argv[1], sys.argv[2]
    passed = failed = 0
    for line in open(targets_file):
        target = line.strip()
        if not target.startswith("//"):
            continue
        pkg, _, name = target[2:].partition(":")
        xml_path = os.path.join(testlogs, pkg, name, "test.xml")
        try:
            root = ET.parse(xml_path).getroot()
        except (OSError, ET.ParseError):
            print(f"no results for {target}", file=sys.stderr)
            failed += 1
            continue
        cases = list(root.iter("testcase"))
        if not cases:
            failed += 1
            continue
        for case in cases:
            if case.find("failure") is not None or case.find("error") is not None:
                failed += 1
            elif case.get("status") == "notrun" or case.find("skipped") is not None:
                continue
            else:
                passed += 1
    print(passed, failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
