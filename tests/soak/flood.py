#!/usr/bin/python3
"""Flood test: many client processes send requests to one offloadd as fast as they can; the
daemon's memory must stay bounded, back-pressure must show (RESOURCE_EXHAUSTED answers to the
clients that read, a stalled stream for those that do not), and when the clients are gone the
pool, sessions and daemon are as before.

    flood.py --bin DIR [--clients 16] [--seconds 6] [--max_requests_in_flight 1024]
             [--max_rss_growth_mib 160] [--json]

DIR holds offloadd, offloadctl and flood_client. Half the clients read their answers, half never
do. The daemon's VmRSS is read from /proc every 0.1 s; growth is measured from the idle daemon
(pool pre-faulted) to the peak. Exit 0 when every check holds, 1 otherwise.
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import leftover_regions


def rss_bytes(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def threads(pid):
    return len(os.listdir("/proc/%d/task" % pid))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--clients", type=int, default=16)
    ap.add_argument("--seconds", type=float, default=6)
    ap.add_argument("--max_requests_in_flight", type=int, default=1024)
    ap.add_argument("--max_rss_growth_mib", type=float, default=160)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ofd-flood-", dir="/tmp")
    sock = os.path.join(tmp, "d.sock")
    daemon = subprocess.Popen(
        [os.path.join(a.bin, "offloadd"), "--socket_path=" + sock, "--pool_bytes=64MiB",
         "--metrics_address=", "--chunk_bytes=1MiB",
         "--max_requests_in_flight=%d" % a.max_requests_in_flight],
        stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "daemon.log"), "w"), text=True)
    problems = []
    try:
        line = daemon.stdout.readline()
        if "ready" not in line:
            print(open(os.path.join(tmp, "daemon.log")).read())
            raise SystemExit("daemon did not start")
        time.sleep(0.5)
        base_rss, base_threads = rss_bytes(daemon.pid), threads(daemon.pid)
        clients = []
        for i in range(a.clients):
            clients.append(subprocess.Popen(
                [os.path.join(a.bin, "flood_client"), "--socket=" + sock,
                 "--seconds=%g" % a.seconds, "--read=%d" % (i % 2 == 0),
                 "--device=gpu%d" % (i % 4)],
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
        peak_rss, peak_threads = base_rss, base_threads
        while any(c.poll() is None for c in clients):
            peak_rss = max(peak_rss, rss_bytes(daemon.pid))
            peak_threads = max(peak_threads, threads(daemon.pid))
            time.sleep(0.1)
        totals = {"sent": 0, "ok": 0, "exhausted": 0, "other": 0}
        stalled = 0
        for i, c in enumerate(clients):
            out = c.stdout.read().split()
            kv = dict(zip(out[::2], out[1::2]))
            if c.returncode != 0 or "sent" not in kv:
                problems.append("client %d failed: %s" % (i, " ".join(out)))
                continue
            for k in totals:
                totals[k] += int(kv[k])
            if i % 2 == 1 and kv["write_blocked"] == "1":
                stalled += 1
        # The pool, sessions and blocks return to what they were.
        deadline = time.time() + 15
        while True:
            r = subprocess.run([os.path.join(a.bin, "offloadctl"), "--socket", sock, "sessions",
                                "--json"], capture_output=True, text=True)
            s = json.loads(r.stdout) if r.returncode == 0 else {}
            if r.returncode == 0 and not s.get("sessions") and int(s["pool_used_bytes"]) == 0:
                break
            if time.time() > deadline:
                problems.append("pool/sessions not back to idle: %s %s" % (r.stdout, r.stderr))
                break
            time.sleep(0.2)
        health = subprocess.run([os.path.join(a.bin, "offloadctl"), "--socket", sock, "health"],
                                capture_output=True, text=True)
        after_rss = rss_bytes(daemon.pid)
        growth = (peak_rss - base_rss) / 2**20
        result = {
            "clients": a.clients, "seconds": a.seconds,
            "max_requests_in_flight": a.max_requests_in_flight,
            "requests_sent": totals["sent"], "answered_ok": totals["ok"],
            "answered_resource_exhausted": totals["exhausted"], "answered_other": totals["other"],
            "non_reading_clients_stalled": stalled, "non_reading_clients": a.clients // 2,
            "rss_idle_mib": round(base_rss / 2**20, 1), "rss_peak_mib": round(peak_rss / 2**20, 1),
            "rss_after_mib": round(after_rss / 2**20, 1), "rss_growth_mib": round(growth, 1),
            "threads_idle": base_threads, "threads_peak": peak_threads,
        }
        if growth > a.max_rss_growth_mib:
            problems.append("daemon RSS grew %.1f MiB > %.1f" % (growth, a.max_rss_growth_mib))
        if a.max_requests_in_flight > 0 and totals["exhausted"] == 0:
            problems.append("no RESOURCE_EXHAUSTED answer: the in-flight limit never engaged")
        if stalled < a.clients // 2:
            problems.append("%d of %d non-reading clients were never held back"
                            % (a.clients // 2 - stalled, a.clients // 2))
        if health.returncode != 0:
            problems.append("daemon unhealthy after the flood: " + health.stdout + health.stderr)
        daemon.send_signal(signal.SIGTERM)
        if daemon.wait(timeout=30) != 0:
            problems.append("daemon exit status %d" % daemon.returncode)
    finally:
        if daemon.poll() is None:
            daemon.kill()
            daemon.wait()
        for c in locals().get("clients", []):
            if c.poll() is None:
                c.kill()
                c.wait()
        leftover_regions.remove_dead()  # of clients that died without unlinking their region
    result["problems"] = problems
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print("%-30s %s" % (k, v))
    print("flood: %s" % ("PASSED" if not problems else "FAILED"))
    if not problems:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print("logs in", tmp)
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
