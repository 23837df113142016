"""Resource exhaustion beside a training loop: attacker processes push every
bound of one daemon at once (connections, pending-Hello streams, sessions, shm mappings and
regions, request floods, unparsable messages, oversized projector refreshes) while a small torch
model trains through offloadd's save_on_cpu hooks in this process. Every step's loss and
gradients must be bit-exact with a no-offload reference and must really have gone through the
daemon (offloaded and reloaded, no fallback, nothing lost); the daemon must answer every health
check (SERVING), and its RSS growth and page tables (VmPTE) must stay under the ceilings below.

Attackers needing another uid run as 65534 - k when this test runs as root, else they are
skipped (as this uid they would, rightly, take the trainer's own slots). The C++ attackers are
tests/soak/exhaust_client (bazel build //tests/soak:exhaust_client). ATTACK_SECONDS (default
25) sets how long they run.
"""

import os
import shutil
import subprocess
import sys
import tempfile
import time
import unittest

import grpc
import torch
from daemon_fixture import REPO, THRESHOLD, Daemon, bitwise_equal, run_step

import offloadd.torch as ot

torch.set_num_threads(2)

ATTACK_SECONDS = float(os.environ.get("ATTACK_SECONDS", "25"))
MAX_RSS_GROWTH_MIB = 256
MAX_PAGE_TABLES_MIB = 64
EXHAUST_CLIENT = os.path.join(REPO, "bazel-bin", "tests", "soak", "exhaust_client")
HERE = os.path.dirname(os.path.abspath(__file__))

# Small bounds, so the attackers reach every one of them within seconds.
BOUNDS = """
socket_mode: 0666
chunk_bytes: 1048576
max_connections_total: 512
max_connections_per_uid: 128
admin_reserved_connections: 32
unused_connection_timeout_seconds: 3
max_sessions: 64
max_sessions_per_uid: 16
max_pending_hello_streams_total: 256
max_pending_hello_streams_per_uid: 64
hello_timeout_seconds: 2
max_streams_per_connection: 32
"""


def status_kib(pid, key):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def healthy(sock):
    """grpc.health.v1.Health/Check for the whole daemon, on a connection of its own."""
    with grpc.insecure_channel("unix:" + sock) as channel:
        check = channel.unary_unary("/grpc.health.v1.Health/Check")
        try:
            return check(b"", timeout=5) == b"\x08\x01"   # status: SERVING
        except grpc.RpcError:
            return False


@unittest.skipUnless(os.access(EXHAUST_CLIENT, os.X_OK),
                     "build //tests/soak:exhaust_client for the C++ attackers")
class ExhaustionBesideTrainingTest(unittest.TestCase):
    def test_training_stays_bit_exact_while_every_bound_is_attacked(self):
        root = os.geteuid() == 0
        tmp = tempfile.mkdtemp(prefix="ofd-exhaust-py-")
        os.chmod(tmp, 0o755)
        conf = os.path.join(tmp, "offloadd.conf")
        with open(conf, "w") as f:
            f.write(BOUNDS)
        daemon = Daemon(pool_bytes="256MiB", extra=["--config", conf])
        attackers, notes = {}, []
        try:
            ref = run_step("plain")
            time.sleep(0.3)
            base_rss = status_kib(daemon.proc.pid, "VmRSS")

            def start(name, cmd, uid=None):
                if uid is not None and not root:
                    notes.append("%s skipped: needs another uid (run as root)" % name)
                    return
                out = open(os.path.join(tmp, name + ".out"), "w+")
                p = subprocess.Popen(cmd + ([] if uid is None or cmd[0] != EXHAUST_CLIENT
                                            else ["--uid=%d" % uid]),
                                     stdout=out, stderr=subprocess.STDOUT, text=True)
                p.out = out
                attackers[name] = p

            def cxx(mode, *extra):
                return [EXHAUST_CLIENT, "--mode=" + mode, "--socket=" + daemon.sock,
                        "--seconds=%g" % ATTACK_SECONDS] + list(extra)

            def py(mode, uid):
                return [sys.executable, os.path.join(HERE, "exhaust_attacker.py"), "--mode", mode,
                        "--socket", daemon.sock, "--seconds", "%g" % ATTACK_SECONDS,
                        "--uid", str(uid)]
            start("connections", cxx("connections", "--count=400"), 65534)
            start("mappings", cxx("mappings"), 65533)
            start("hello", py("hello", 65532), 65532)
            start("sessions", py("sessions", 65531), 65531)
            start("badmsg", cxx("badmsg"))
            start("hugebatch", cxx("hugebatch"))
            start("refresh", cxx("refresh"))

            ctx = ot.offload_checkpoints(socket_path=daemon.sock, keep_last_n=0,
                                         threshold_bytes=THRESHOLD)
            steps = health = health_failures = 0
            peak_rss = base_rss
            peak_pte = 0
            end = time.monotonic() + ATTACK_SECONDS
            while time.monotonic() < end or steps == 0:
                ctx.stats.reset()
                out = run_step("hooks", ctx)
                self.assertTrue(bitwise_equal(out, ref), "step %d differs from the reference"
                                % steps)
                self.assertTrue(ot.synchronize())
                s = ctx.stats
                self.assertGreater(s.offloaded, 0, s.summary())
                self.assertEqual(s.reloaded, s.offloaded, s.summary())
                self.assertEqual((s.fallbacks, s.lost), (0, 0), s.summary())
                steps += 1
                health += 1
                if not healthy(daemon.sock):
                    health_failures += 1
                peak_rss = max(peak_rss, status_kib(daemon.proc.pid, "VmRSS"))
                peak_pte = max(peak_pte, status_kib(daemon.proc.pid, "VmPTE"))
            results = {}
            for name, p in attackers.items():
                try:
                    p.wait(timeout=60)
                except subprocess.TimeoutExpired:
                    p.kill()
                    self.fail("attacker %s did not finish" % name)
                p.out.seek(0)
                text = p.out.read()
                results[name] = " ".join(text.split())[:300]
                self.assertEqual(p.returncode, 0, "attacker %s: %s" % (name, text[-2000:]))
            growth = (peak_rss - base_rss) / 1024.0
            print("\nexhaustion beside training: %d steps bit-exact, %d/%d health checks, RSS "
                  "+%.0f MiB, VmPTE %.1f MiB; attackers %s %s"
                  % (steps, health - health_failures, health, growth, peak_pte / 1024.0,
                     results, notes), file=sys.stderr)
            self.assertEqual(health_failures, 0)
            self.assertTrue(healthy(daemon.sock))
            self.assertLess(growth, MAX_RSS_GROWTH_MIB)
            self.assertLess(peak_pte / 1024.0, MAX_PAGE_TABLES_MIB)
        finally:
            for p in attackers.values():
                if p.poll() is None:
                    p.kill()
                    p.wait()
            from offloadd.torch import _endpoint
            _endpoint.reset_for_tests()
            daemon.stop()
            shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    unittest.main()
