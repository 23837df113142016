#!/usr/bin/env python3
"""Counts test cases in the JUnit XML files Bazel wrote for the given test targets.

Usage: count_bazel_results.py TARGETS_FILE TESTLOGS_DIR [FAILURES_FILE]
  -> prints "PASSED FAILED".
A target without a test.xml (it did not run, or crashed before writing one) counts as one
failed case; a test case with a <failure> or <error> child counts as failed. With
FAILURES_FILE, each failed case's name and the first lines of its assertion messages are written
there, so that the end of a long log still says what failed and why.
"""
import os
import sys
import xml.etree.ElementTree as ET

MESSAGE_LINES = 12  # per failed case


def failure_text(case):
    """The failure and error messages of one JUnit test case, at most MESSAGE_LINES lines."""
    lines = []
    for child in case:
        if child.tag in ("failure", "error"):
            text = child.get("message") or child.text or ""
            lines.extend(line for line in text.splitlines() if line.strip())
    more = len(lines) - MESSAGE_LINES
    lines = lines[:MESSAGE_LINES] + ([f"({more} more lines in the test log)"] if more > 0 else [])
    return "\n".join("    " + line for line in lines)


def count_target(target, testlogs, failures):
    """(passed, failed) for one target; appends what failed to `failures`."""
    pkg, _, name = target[2:].partition(":")
    xml_path = os.path.join(testlogs, pkg, name, "test.xml")
    try:
        root = ET.parse(xml_path).getroot()
    except (OSError, ET.ParseError):
        print(f"no results for {target}", file=sys.stderr)
        failures.append(f"{target}: no results (it did not run, or crashed before writing them)")
        return 0, 1
    cases = list(root.iter("testcase"))
    if not cases:
        failures.append(f"{target}: no test cases in {xml_path}")
        return 0, 1
    passed = failed = 0
    for case in cases:
        if case.find("failure") is not None or case.find("error") is not None:
            failed += 1
            failures.append(f"{target} {case.get('classname', '')}.{case.get('name', '')}\n"
                            + failure_text(case))
        elif case.get("status") == "notrun" or case.find("skipped") is not None:
            continue
        else:
            passed += 1
    return passed, failed


def main():
    targets_file, testlogs = sys.argv[1], sys.argv[2]
    passed = failed = 0
    failures = []
    for line in open(targets_file):
        target = line.strip()
        if target.startswith("//"):
            p, f = count_target(target, testlogs, failures)
            passed, failed = passed + p, failed + f
    if len(sys.argv) > 3:
        with open(sys.argv[3], "w") as out:
            out.write("".join(f + "\n" for f in failures))
    print(passed, failed)
    return 0


if __name__ == "__main__":
    sys.exit(main())
