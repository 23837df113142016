#!/usr/bin/python3
"""Chaos soak of offloadd (loopback only, bounded in time and request count).

    soak.py --bin DIR [--seconds 120] [--clients 8] [--kill_every 3] [--max_requests 5000000]
            [--pool 128MiB] [--max_block_bytes 2097152] [--daemon_kills 3] [--grace 10]
            [--spill_directory D] [--freezes 1] [--freeze_seconds 3]
            [--daemon_arg=--flag=value ...] [--json]

DIR holds offloadd, offloadctl and soak_client. `--clients` soak_client processes offload and
reload blocks of random sizes with checksums (tests/soak/soak_client.cc); a chaos loop SIGKILLs a
random client every ~kill_every seconds and starts a new one. The daemon keeps its pool in a
shared-memory object (pool_shm_name, resume_grace_seconds = --grace) and is restarted on the same
socket and pool --daemon_kills + 1 times, evenly spread: SIGKILLed --daemon_kills times and once
SIGTERMed (an upgrade); the clients resume by themselves (auto_resume). --freezes times, between
the restarts, the daemon is frozen (SIGSTOP) for --freeze_seconds and resumed (SIGCONT), as a
debugger, a cgroup freezer or a stuck driver call would: below the clients' keepalive bound it
must cost only time (it must then answer a health check within 10 s). At the end every client
gets SIGTERM, reloads and verifies what it still holds, and exits. --daemon_kills 0 restarts it
once with SIGTERM on an anonymous pool instead (blocks are then lost and reported).

Must hold (exit 0): no block corrupted, no block lost without an error, and with a shared pool
no block lost at all (every block a client was told is stored survives the daemon's deaths);
every surviving client finished its final pass; the daemon exited 0 after each SIGTERM; and the
pool returned to its baseline (0 bytes, no session) once the clients were gone (blocks of clients
killed while the daemon was down are freed resume_grace_seconds after the restart).

With --spill_directory the daemon spills to that directory (docs/spill.md; it must take
O_DIRECT, so not tmpfs): with a pool much smaller than the clients hold (e.g. --pool 4MiB) blocks
go to disk and come back while clients are killed. It must then also hold: blocks were spilled
and staged back, and no spill file was lost. Spilled blocks do not survive a daemon restart
(only the pool's blocks are adopted), so use it with --daemon_kills 0 (one SIGTERM restart on an
anonymous pool, whose blocks are reported lost to their clients).
"""
import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time

import leftover_regions

SPILL_COUNTERS = ("spilled_blocks_total", "staged_blocks_total", "reloads_from_disk_total",
                  "blocks_lost_total", "spill_failures_total")
COUNTERS = ("requests", "offloads", "reloads", "releases", "refused", "bytes_offloaded",
            "bytes_verified", "verified", "corrupted", "lost_reported", "lost_unexpectedly",
            "unconfirmed", "reconnects", "resumes", "reloads_refused")


class Soak:
    def __init__(self, a):
        self.a = a
        self.tmp = tempfile.mkdtemp(prefix="ofd-soak-", dir="/tmp")
        self.sock = os.path.join(self.tmp, "d.sock")
        self.daemon = None
        self.daemon_logs = 0
        self.clients = {}  # slot -> (Popen, stats path)
        self.finished = []  # (stats path, how it ended: "killed" | "exited")
        self.incarnations = 0
        self.problems = []
        self.rng = random.Random(a.seed)
        self.pool_name = "offloadd-soak-%d" % os.getpid() if a.daemon_kills > 0 else ""
        self.spill = dict.fromkeys(SPILL_COUNTERS, 0)  # summed over the daemon's incarnations

    def bin(self, name):
        return os.path.join(self.a.bin, name)

    def start_daemon(self):
        self.daemon_logs += 1
        log = open(os.path.join(self.tmp, "daemon%d.log" % self.daemon_logs), "w")
        self.daemon = subprocess.Popen(
            [self.bin("offloadd"), "--socket_path=" + self.sock, "--pool_bytes=" + self.a.pool,
             "--metrics_address=", "--chunk_bytes=1MiB", "--admission_deadline_seconds=1",
             "--pool_shm_name=" + self.pool_name, "--resume_grace_seconds=%g" % self.a.grace]
             + (["--spill_directory=" + self.a.spill_directory] if self.a.spill_directory else [])
             + list(self.a.daemon_arg),
            stdout=subprocess.PIPE, stderr=log, text=True)
        if "ready" not in self.daemon.stdout.readline():
            raise SystemExit("daemon did not start; see %s" % log.name)

    def note_spill(self):
        """Adds this daemon incarnation's spill counters (asked just before it is stopped)."""
        if not self.a.spill_directory:
            return
        r = subprocess.run([self.bin("offloadctl"), "--socket", self.sock, "stats", "--json"],
                           capture_output=True, text=True)
        d = json.loads(r.stdout).get("spill", {}) if r.returncode == 0 else {}
        if not d:
            self.problems.append("the daemon reports no spill tier: %s" % r.stderr.strip())
        for k in SPILL_COUNTERS:
            self.spill[k] += int(d.get(k, 0))

    def kill_daemon(self):
        self.note_spill()
        self.daemon.kill()
        self.daemon.wait()

    def stop_daemon(self):
        self.note_spill()
        self.daemon.send_signal(signal.SIGTERM)
        rc = self.daemon.wait(timeout=60)
        if rc != 0:
            self.problems.append("daemon exited %d after SIGTERM" % rc)

    def freeze_daemon(self, seconds):
        """SIGSTOP for `seconds`, SIGCONT; a problem unless it answers health within 10 s."""
        self.daemon.send_signal(signal.SIGSTOP)
        time.sleep(seconds)
        self.daemon.send_signal(signal.SIGCONT)
        t0 = time.time()
        while time.time() - t0 < 10:
            if subprocess.run([self.bin("offloadctl"), "--socket", self.sock, "health"],
                              capture_output=True, timeout=15).returncode == 0:
                return time.time() - t0
            time.sleep(0.1)
        self.problems.append("the daemon did not answer a health check within 10 s of SIGCONT")
        return None

    def start_client(self, slot):
        self.incarnations += 1
        stats = os.path.join(self.tmp, "client%d.json" % self.incarnations)
        p = subprocess.Popen(
            [self.bin("soak_client"), "--socket=" + self.sock,
             "--name=soak%d" % self.incarnations, "--seed=%d" % (self.a.seed * 1000 +
                                                                self.incarnations),
             "--max_block_bytes=%d" % self.a.max_block_bytes, "--max_blocks=16",
             "--stats=" + stats],
            stdout=subprocess.DEVNULL, stderr=open(stats + ".log", "w"))
        self.clients[slot] = (p, stats)

    def kill_client(self, slot):
        p, stats = self.clients.pop(slot)
        p.kill()
        p.wait()
        leftover_regions.remove_dead()  # its region, never unlinked
        self.finished.append((stats, "killed"))

    def read(self, path):
        try:
            with open(path) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def requests_so_far(self):
        paths = [s for s, _ in self.finished] + [s for _, s in self.clients.values()]
        return sum(self.read(p).get("requests", 0) for p in paths)

    def sessions(self):
        r = subprocess.run([self.bin("offloadctl"), "--socket", self.sock, "sessions", "--json"],
                           capture_output=True, text=True)
        return json.loads(r.stdout) if r.returncode == 0 else None

    def run(self):
        a = self.a
        self.start_daemon()
        base = self.sessions()
        baseline = int(base["pool_used_bytes"]) if base else -1
        for slot in range(a.clients):
            self.start_client(slot)
        start = time.time()
        next_kill = start + a.kill_every * self.rng.uniform(0.5, 1.5)
        # Daemon restarts, evenly spread: SIGKILLs and one SIGTERM (the second, when there are
        # kills; the only one without).
        signals = [signal.SIGKILL] * a.daemon_kills
        signals.insert(min(1, len(signals)), signal.SIGTERM)
        restart_at = [start + a.seconds * (k + 1) / (len(signals) + 1) for k in range(len(signals))]
        # Freezes between the restarts (half-way to the next one).
        freeze_at = [start + a.seconds * (k + 0.5) / (len(signals) + 1) for k in range(a.freezes)]
        restarts, daemon_kills, kills, freezes, healthy_after = 0, 0, 0, 0, []
        while time.time() - start < a.seconds and self.requests_so_far() < a.max_requests:
            time.sleep(0.05)
            for slot, (p, stats) in list(self.clients.items()):
                if p.poll() is not None:  # a client must only end when told to
                    self.problems.append("client %s exited %d on its own: %s" % (
                        stats, p.returncode, self.read(stats).get("last_problem", "")))
                    self.clients.pop(slot)
                    self.finished.append((stats, "exited"))
                    self.start_client(slot)
            if freezes < len(freeze_at) and time.time() >= freeze_at[freezes]:
                took = self.freeze_daemon(a.freeze_seconds)
                freezes += 1
                if took is not None:
                    healthy_after.append(round(took, 2))
            if restarts < len(signals) and time.time() >= restart_at[restarts]:
                if signals[restarts] == signal.SIGKILL:
                    self.kill_daemon()
                    daemon_kills += 1
                else:
                    self.stop_daemon()
                self.start_daemon()
                restarts += 1
            if time.time() >= next_kill:
                self.kill_client(self.rng.choice(sorted(self.clients)))
                kills += 1
                self.start_client(max(self.clients, default=-1) + 1)
                next_kill = time.time() + a.kill_every * self.rng.uniform(0.5, 1.5)
        elapsed = time.time() - start
        for p, _ in self.clients.values():
            p.send_signal(signal.SIGTERM)
        survivors = 0
        for slot, (p, stats) in list(self.clients.items()):
            try:
                rc = p.wait(timeout=120)
            except subprocess.TimeoutExpired:
                p.kill()
                rc = -9
            s = self.read(stats)
            if rc != 0 or not s.get("final_pass_done") or s.get("held", 1) != 0:
                self.problems.append("client %s: exit %s, final pass %s, %s blocks still held: %s"
                                     % (stats, rc, s.get("final_pass_done"), s.get("held"),
                                        s.get("last_problem", "")))
            survivors += 1
            self.finished.append((stats, "exited"))
        self.clients.clear()
        # The pool returns to its baseline once every client is gone.
        deadline, end = time.time() + 15 + a.grace, None
        while time.time() < deadline:
            end = self.sessions()
            if end and not end.get("sessions") and int(end["pool_used_bytes"]) == baseline:
                break
            time.sleep(0.2)
        pool_end = int(end["pool_used_bytes"]) if end else -1
        if pool_end != baseline or (end and end.get("sessions")):
            self.problems.append("pool at the end %d bytes (baseline %d), sessions %s"
                                 % (pool_end, baseline, end.get("sessions") if end else "?"))
        self.stop_daemon()
        totals = dict.fromkeys(COUNTERS, 0)
        for stats, _ in self.finished:
            s = self.read(stats)
            for k in COUNTERS:
                totals[k] += s.get(k, 0)
        if totals["corrupted"] or totals["lost_unexpectedly"]:
            for stats, _ in self.finished:
                s = self.read(stats)
                if s.get("corrupted") or s.get("lost_unexpectedly"):
                    self.problems.append("%s: %s" % (stats, s.get("last_problem")))
        if restarts != len(signals) or daemon_kills != a.daemon_kills:
            self.problems.append("the daemon was restarted %d times (%d SIGKILLs), not %d (%d)"
                                 % (restarts, daemon_kills, len(signals), a.daemon_kills))
        if self.pool_name and totals["lost_reported"]:
            self.problems.append("%d blocks lost at daemon restarts on a shared pool"
                                 % totals["lost_reported"])
        if kills < 1:
            self.problems.append("no client was killed (run longer than kill_every)")
        if freezes != a.freezes:
            self.problems.append("the daemon was frozen %d times, not %d" % (freezes, a.freezes))
        if totals["verified"] == 0:
            self.problems.append("nothing was verified")
        if a.spill_directory:
            if self.spill["spilled_blocks_total"] == 0 or self.spill["staged_blocks_total"] == 0:
                self.problems.append("spilling was on but %d blocks were spilled and %d staged "
                                     "back (make --pool smaller than the clients hold)" % (
                                         self.spill["spilled_blocks_total"],
                                         self.spill["staged_blocks_total"]))
            if self.spill["blocks_lost_total"]:
                self.problems.append("%d spilled blocks lost (their files were not touched)"
                                     % self.spill["blocks_lost_total"])
        return {
            "seconds": round(elapsed, 1), "clients": a.clients, "client_processes": len(
                self.finished), "clients_killed": kills, "daemon_restarts": restarts,
            "daemon_sigkills": daemon_kills, "daemon_freezes": freezes,
            "freeze_seconds_each": a.freeze_seconds,
            "health_answered_after_sigcont_seconds": healthy_after,
            "client_resumes": totals["resumes"],
            "requests": totals["requests"], "offloads": totals["offloads"],
            "reloads": totals["reloads"], "releases": totals["releases"],
            "offloads_refused_pool_full": totals["refused"],
            # reloads of spilled blocks refused for pool room (RESOURCE_EXHAUSTED), retried
            "reloads_refused_pool_full": totals["reloads_refused"],
            "bytes_offloaded": totals["bytes_offloaded"],
            "bytes_verified": totals["bytes_verified"], "blocks_verified": totals["verified"],
            "blocks_lost_reported_by_restart": totals["lost_reported"],
            "blocks_corrupted": totals["corrupted"],
            "blocks_lost_without_error": totals["lost_unexpectedly"],
            # reloads with release_after cut by a SIGKILL, answered DATA_LOSS as documented
            "release_after_reloads_unconfirmed": totals["unconfirmed"],
            "client_reconnects": totals["reconnects"], "pool_baseline_bytes": baseline,
            "pool_end_bytes": pool_end,
            **({"blocks_spilled": self.spill["spilled_blocks_total"],
                "blocks_staged_back": self.spill["staged_blocks_total"],
                "reloads_from_disk": self.spill["reloads_from_disk_total"],
                "spill_failures": self.spill["spill_failures_total"],
                "spilled_blocks_lost": self.spill["blocks_lost_total"]}
               if a.spill_directory else {}),
            "problems": self.problems,
        }


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True)
    ap.add_argument("--seconds", type=float, default=120)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--kill_every", type=float, default=3)
    ap.add_argument("--max_requests", type=int, default=5000000)
    ap.add_argument("--pool", default="128MiB")
    ap.add_argument("--max_block_bytes", type=int, default=2 << 20)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--daemon_kills", type=int, default=3)
    ap.add_argument("--grace", type=float, default=10)
    ap.add_argument("--freezes", type=int, default=1,
                    help="times the daemon is frozen (SIGSTOP) between restarts")
    ap.add_argument("--freeze_seconds", type=float, default=3,
                    help="how long each freeze lasts (below the clients' keepalive bound)")
    ap.add_argument("--spill_directory", default="",
                    help="spill tier directory (must take O_DIRECT); see above")
    ap.add_argument("--daemon_arg", action="append", default=[],
                    help="extra daemon flag, repeatable (e.g. --daemon_arg=--spill_directory=D)")
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    soak = Soak(a)
    try:
        result = soak.run()
    finally:
        for p, _ in soak.clients.values():
            p.kill()
            p.wait()
        if soak.daemon and soak.daemon.poll() is None:
            soak.daemon.kill()
        leftover_regions.remove_dead()  # of clients killed here or dead on their own
        if soak.pool_name:
            try:
                os.unlink("/dev/shm/" + soak.pool_name)
            except OSError:
                pass
    if a.json:
        print(json.dumps(result))
    else:
        for k, v in result.items():
            print("%-34s %s" % (k, v))
    ok = not result["problems"]
    print("soak: %s" % ("PASSED" if ok else "FAILED (logs in %s)" % soak.tmp))
    if ok:
        shutil.rmtree(soak.tmp, ignore_errors=True)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
