#!/usr/bin/env python3
"""Every relative link in the repository's Markdown files resolves: the file or folder exists,
and a #anchor names a heading of the target (GitHub's anchor rule) or an explicit <a name=>.

Usage: tests/md_links.py [FILE.md ...] (default: every *.md git tracks or would add).
Prints each broken link as "file:line: target: why" and ends with "N passed, N failed" (one per
file); exit 1 when a link is broken.
"""
import os
import re
import subprocess
import sys

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
LINK = re.compile(r"(?<!!)\[[^\]]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)")


def slug(heading):
    text = re.sub(r"`|\*\*|\*|<[^>]+>", "", heading.strip()).lower()
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def strip_code(lines):
    fence = False
    for n, line in enumerate(lines, 1):
        if line.lstrip().startswith("```"):
            fence = not fence
            continue
        if not fence:
            yield n, re.sub(r"`[^`]*`", "", line)


def anchors(path, cache={}):
    if path not in cache:
        seen, out = {}, set()
        lines = open(path, encoding="utf-8").read().split("\n")
        for _, line in strip_code(lines):
            m = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
            if m:
                s = slug(m.group(1))
                k = seen.get(s, 0)
                out.add(s if k == 0 else "%s-%d" % (s, k))
                seen[s] = k + 1
            out.update(re.findall(r"<a (?:name|id)=\"([^\"]+)\"", line))
        # headings inside code spans count with their code text
        for line in lines:
            m = re.match(r"#{1,6}\s+(.*?)\s*$", line)
            if m:
                out.add(slug(m.group(1)))
        cache[path] = out
    return cache[path]


def check(path):
    problems = []
    lines = open(path, encoding="utf-8").read().split("\n")
    kept = dict(strip_code(lines))
    text = "\n".join(kept.get(n, "") for n in range(1, len(lines) + 1))
    for m in LINK.finditer(text):
        target = m.group(1)
        n = text.count("\n", 0, m.start()) + 1
        if re.match(r"[a-z][a-z0-9+.-]*:", target):
            continue  # http:, https:, mailto:, file:
        file_part, _, anchor = target.partition("#")
        dest = os.path.normpath(os.path.join(os.path.dirname(path), file_part)) \
            if file_part else path
        if not os.path.exists(dest):
            problems.append("%s:%d: %s: no such file" % (path, n, target))
            continue
        if anchor and dest.endswith(".md") and anchor not in anchors(dest):
            problems.append("%s:%d: %s: no heading with anchor #%s in %s"
                            % (path, n, target, anchor, os.path.relpath(dest, REPO)))
    return problems


def main(argv):
    os.chdir(REPO)
    files = argv or subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.md"],
        capture_output=True, text=True, check=True).stdout.split()
    passed = failed = 0
    for f in files:
        if not os.path.exists(f):
            continue
        problems = check(f)
        for p in problems:
            print(p)
        if problems:
            failed += 1
        else:
            passed += 1
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
