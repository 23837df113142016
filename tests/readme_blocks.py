#!/usr/bin/env python3
"""Runs the shell and Python blocks of README.md against a daemon this script starts.

Every fenced block whose language is sh, bash or python runs, in order, from the repository
root, unless the line just before its opening fence is an HTML comment starting
"<!-- not run here" (a block that installs into the system, needs a GPU, systemd or a cluster,
or is the make targets themselves). Environment of every block: OFFLOADD_SOCKET names the
daemon started here (shm backend, 256 MiB pool, no metrics endpoint), PYTHONPATH has
client/python, python blocks run on .venv/bin/python. A block fails when it exits non-zero or
runs past --timeout seconds; its output is printed then.

Usage: tests/readme_blocks.py [--readme README.md] [--bin build/bin] [--timeout 120]
Prints one line per block and ends with "N passed, N failed"; exit 1 when a block failed or
the daemon did not start.
"""
import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
RUN_LANGS = {"sh": "sh", "bash": "sh", "python": "python"}
SKIP = re.compile(r"^\s*<!--\s*not run here\b")


def blocks(text):
    """Yields (line number of the fence, language, code, skip reason or None)."""
    lines = text.split("\n")
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        start, lang = i, m.group(1)
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        skip = None
        if start > 0 and SKIP.match(lines[start - 1]):
            skip = lines[start - 1].strip()[4:].rstrip("->").strip()
        yield start + 1, lang, "\n".join(lines[start + 1:j]) + "\n", skip
        i = j + 1


def start_daemon(bin_dir, tmp):
    sock = os.path.join(tmp, "offloadd.sock")
    log = open(os.path.join(tmp, "offloadd.log"), "w")
    proc = subprocess.Popen([os.path.join(bin_dir, "offloadd"), "--socket_path=" + sock,
                             "--metrics_address=", "--pool_bytes=256MiB"],
                            stdout=log, stderr=subprocess.STDOUT, cwd=tmp)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            break
        r = subprocess.run([os.path.join(bin_dir, "offloadctl"), "--socket", sock, "health"],
                           capture_output=True, timeout=10)
        if r.returncode == 0:
            return proc, sock
        time.sleep(0.2)
    proc.kill()
    proc.wait()
    log.close()
    sys.stdout.write(open(os.path.join(tmp, "offloadd.log")).read())
    return None, sock


def run_block(lang, code, env, timeout):
    if RUN_LANGS[lang] == "python":
        argv = [os.path.join(REPO, ".venv", "bin", "python"), "-"]
    else:
        argv = ["bash", "-euo", "pipefail", "-s"]
    try:
        r = subprocess.run(argv, input=code, capture_output=True, text=True, cwd=REPO, env=env,
                           timeout=timeout)
        return r.returncode, r.stdout + r.stderr
    except subprocess.TimeoutExpired as e:
        out = (e.stdout or b"").decode(errors="replace") + (e.stderr or b"").decode(
            errors="replace")
        return 124, out + "\n(timed out after %d s)" % timeout


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--readme", default=os.path.join(REPO, "README.md"))
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--timeout", type=int, default=120)
    args = ap.parse_args()
    bin_dir = os.path.abspath(args.bin)
    text = open(args.readme).read()
    todo = [b for b in blocks(text) if b[1] in RUN_LANGS]
    tmp = tempfile.mkdtemp(prefix="ofrb")
    daemon, sock = start_daemon(bin_dir, tmp)
    if daemon is None:
        print("readme blocks: the daemon did not start (%s)" % bin_dir)
        print("0 passed, 1 failed")
        return 1
    env = dict(os.environ, OFFLOADD_SOCKET=sock, TMPDIR=tmp,
               PYTHONPATH=os.path.join(REPO, "client", "python"))
    passed = failed = 0
    try:
        for line, lang, code, skip in todo:
            name = "%s:%d (%s)" % (os.path.basename(args.readme), line, lang)
            if skip:
                print("%s: SKIPPED (%s)" % (name, skip))
                continue
            t0 = time.monotonic()
            rc, out = run_block(lang, code, env, args.timeout)
            if rc == 0:
                passed += 1
                print("%s: PASSED (%.1f s)" % (name, time.monotonic() - t0))
            else:
                failed += 1
                print("%s: FAILED (exit %d)\n%s" % (name, rc, out.rstrip()))
    finally:
        daemon.send_signal(signal.SIGTERM)
        try:
            daemon.wait(timeout=15)
        except subprocess.TimeoutExpired:
            daemon.kill()
            daemon.wait()
        shutil.rmtree(tmp, ignore_errors=True)
    print("%d passed, %d failed" % (passed, failed))
    return 1 if failed or not passed else 0


if __name__ == "__main__":
    sys.exit(main())
