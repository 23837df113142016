#!/usr/bin/python3
"""Resource-exhaustion test: attackers push every bound of one offloadd at once for
--seconds while a well-behaved client (soak_client: offloads and reloads random blocks and checks
every byte) runs beside them. The daemon must answer health checks throughout, the client must
finish with every block intact, and the daemon's RSS growth and page tables (VmPTE) must stay
under the stated ceilings.

    exhaust.py --bin DIR [--seconds 30] [--uid 65534] [--max_rss_growth_mib 256]
               [--max_page_tables_mib 64]

DIR holds offloadd, offloadctl, soak_client and exhaust_client. Attackers (exhaust_client
modes): connections (as --uid: held raw connections), mappings (as --uid - 1: one shm object
registered thousands of times, and a sparse 256 MiB one), badmsg, hugebatch, refresh. Without
the right to setuid (a sandbox) the attackers that need another uid are skipped and said so:
as the client's own uid they would, rightly, take its connection slots. Exit 0 when every check
holds.
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

CONFIG = """
pool_bytes: 268435456
chunk_bytes: 1048576
metrics_address: ""
socket_mode: 0666
max_connections_total: 1024
max_connections_per_uid: 256
admin_reserved_connections: 32
unused_connection_timeout_seconds: 5
"""


def status_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def run_attacker(a, tmp, sock, mode, uid=None, extra=()):
    cmd = [os.path.join(a.bin, "exhaust_client"), "--mode=" + mode, "--socket=" + sock,
           "--seconds=%g" % a.seconds] + list(extra)
    if uid is not None:
        cmd.append("--uid=%d" % uid)
    # Output to a file, not a pipe: a pipe nobody reads until the end would block a chatty one.
    out = open(os.path.join(tmp, mode + ".out"), "w+")
    p = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, text=True)
    p.out = out
    return p


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seconds", type=float, default=30)
    ap.add_argument("--uid", type=int, default=65534)
    ap.add_argument("--max_rss_growth_mib", type=float, default=256)
    ap.add_argument("--max_page_tables_mib", type=float, default=64)
    a = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ofd-exhaust-", dir="/tmp")
    os.chmod(tmp, 0o755)
    sock = os.path.join(tmp, "d.sock")
    conf = os.path.join(tmp, "offloadd.conf")
    with open(conf, "w") as f:
        f.write(CONFIG)
    daemon = subprocess.Popen(
        [os.path.join(a.bin, "offloadd"), "--config", conf, "--socket_path=" + sock],
        stdout=subprocess.PIPE, stderr=open(os.path.join(tmp, "daemon.log"), "w"), text=True)
    problems, notes = [], []
    try:
        if "ready" not in daemon.stdout.readline():
            print(open(os.path.join(tmp, "daemon.log")).read())
            raise SystemExit("daemon did not start")
        time.sleep(0.5)
        base_rss = status_kib(daemon.pid, "VmRSS")
        stats = os.path.join(tmp, "good.json")
        good = subprocess.Popen(
            [os.path.join(a.bin, "soak_client"), "--socket=" + sock, "--name=good", "--seed=7",
             "--max_block_bytes=4194304", "--max_blocks=16", "--stats=" + stats],
            stdout=subprocess.DEVNULL, stderr=open(stats + ".log", "w"))
        attackers = {
            "connections": run_attacker(a, tmp, sock, "connections", a.uid, ["--count=400"]),
            "mappings": run_attacker(a, tmp, sock, "mappings", a.uid - 1),
            "badmsg": run_attacker(a, tmp, sock, "badmsg"),
            "hugebatch": run_attacker(a, tmp, sock, "hugebatch"),
            "refresh": run_attacker(a, tmp, sock, "refresh"),
        }
        peak_rss = peak_pte = base_rss
        peak_pte = 0
        health_checks = health_failures = 0
        deadline = time.time() + a.seconds + 60
        while any(p.poll() is None for p in attackers.values()):
            if time.time() > deadline:
                for name, p in attackers.items():
                    if p.poll() is None:
                        problems.append("attacker %s did not finish: killed" % name)
                        p.kill()
                break
            r = subprocess.run([os.path.join(a.bin, "offloadctl"), "--socket", sock, "health"],
                               capture_output=True, text=True, timeout=30)
            health_checks += 1
            if r.returncode != 0:
                health_failures += 1
                if health_failures <= 3:
                    notes.append("health check failed: " + (r.stdout + r.stderr).strip()[:200])
            peak_rss = max(peak_rss, status_kib(daemon.pid, "VmRSS"))
            peak_pte = max(peak_pte, status_kib(daemon.pid, "VmPTE"))
            time.sleep(0.5)
        results = {}
        for name, p in attackers.items():
            p.out.seek(0)
            out = p.out.read().split()
            kv = dict(zip(out[::2], out[1::2]))
            results[name] = kv
            if "setuid_failed" in kv:
                notes.append("%s skipped: cannot setuid(%d) here" % (name, a.uid))
            elif p.returncode != 0:
                problems.append("attacker %s got an answer it must not: %s" % (name, kv))
        good.send_signal(signal.SIGTERM)
        good.wait(timeout=120)
        with open(stats) as f:
            g = json.load(f)
        if good.returncode != 0:
            problems.append("the well-behaved client exited %d" % good.returncode)
        if g.get("verified", 0) == 0:
            problems.append("the well-behaved client verified nothing")
        for key in ("corrupted", "lost_unexpectedly", "lost_reported"):
            if g.get(key, 0) != 0:
                problems.append("the well-behaved client has %s = %s" % (key, g[key]))
        if health_failures:
            problems.append("%d of %d health checks failed" % (health_failures, health_checks))
        growth_mib = (peak_rss - base_rss) / 1024.0
        if growth_mib > a.max_rss_growth_mib:
            problems.append("RSS grew %.0f MiB (ceiling %g)" % (growth_mib, a.max_rss_growth_mib))
        if peak_pte / 1024.0 > a.max_page_tables_mib:
            problems.append("page tables reached %.1f MiB (ceiling %g)" %
                            (peak_pte / 1024.0, a.max_page_tables_mib))
        daemon.send_signal(signal.SIGTERM)
        rc = daemon.wait(timeout=60)
        if rc != 0:
            problems.append("daemon exited %d after SIGTERM" % rc)
        report = {"seconds": a.seconds, "health_checks": health_checks,
                  "health_failures": health_failures, "rss_growth_mib": round(growth_mib, 1),
                  "peak_page_tables_mib": round(peak_pte / 1024.0, 2),
                  "good_client": {k: g.get(k) for k in ("requests", "verified", "corrupted",
                                                        "lost_unexpectedly")},
                  "attackers": results, "notes": notes, "problems": problems}
        print(json.dumps(report, indent=1, sort_keys=True))
    finally:
        if daemon.poll() is None:
            daemon.kill()
        others = list(locals().get("attackers", {}).values()) + [locals().get("good")]
        for p in [p for p in others if p is not None]:
            if p.poll() is None:
                p.kill()
                p.wait()
        leftover_regions.remove_dead()  # of attackers killed here or dead on their own
    if problems:
        print("daemon log: " + os.path.join(tmp, "daemon.log"))
        return 1
    shutil.rmtree(tmp, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
