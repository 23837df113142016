"""The daemon's readiness protocol for systemd's Type=notify (sd_notify), without systemd.

A datagram socket stands in for the service manager ($NOTIFY_SOCKET). The daemon must say what
start-up is doing (STATUS=), send READY=1 only once its socket serves (the health check answers
SERVING the moment READY arrives), with its pid as MAINPID, and STOPPING=1 at SIGTERM. Without
$NOTIFY_SOCKET it starts as before. The unit under a real systemd: tests/systemd.
Run: /usr/bin/python3 -m unittest test_notify (from tests/monitoring).
"""
import os
import shutil
import socket
import subprocess
import time
import unittest

import common


class NotifyTest(unittest.TestCase):
    def setUp(self):
        self.tmp = common.short_tmpdir("ofnt")
        self.notify_path = os.path.join(self.tmp, "notify")
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.notify_path)
        self.daemon = None

    def tearDown(self):
        if self.daemon:
            self.daemon.stop()
        self.sock.close()
        shutil.rmtree(self.tmp)

    def messages_until(self, key, timeout=30):
        """Datagrams received until one holds `key` (as dicts); fails after `timeout` s."""
        got = []
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            self.sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = self.sock.recv(4096).decode()
            except socket.timeout:
                break
            fields = dict(line.split("=", 1) for line in data.split("\n") if "=" in line)
            got.append(fields)
            if key in fields:
                return got
        self.fail("no %s= from the daemon within %d s; got %r" % (key, timeout, got))

    def drain(self):
        """Every datagram queued now (the daemon has exited)."""
        got = []
        self.sock.setblocking(False)
        while True:
            try:
                data = self.sock.recv(4096).decode()
            except BlockingIOError:
                return got
            got.append(dict(line.split("=", 1) for line in data.split("\n") if "=" in line))

    def health(self):
        return subprocess.run([common.binary("offloadctl"), "--socket", self.daemon.socket_path,
                               "health"], capture_output=True, text=True, timeout=30)

    def test_status_ready_once_serving_then_stopping(self):
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path)
        # A 256 MiB pool: pre-faulting it takes long enough that a READY sent at fork time would
        # come before the socket serves.
        self.daemon = common.Daemon(self.tmp, extra=["--pool_bytes=256MiB"], env=env)
        got = self.messages_until("READY")
        r = self.health()  # at once: READY means serving
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("SERVING", r.stdout)
        statuses = [m["STATUS"] for m in got if "STATUS" in m]
        self.assertTrue(any(s.startswith("mapping and pre-faulting the pool: 268435456 bytes")
                            for s in statuses), statuses)
        ready = got[-1]
        self.assertEqual(ready["READY"], "1")
        self.assertEqual(ready["MAINPID"], str(self.daemon.proc.pid))
        self.assertTrue(ready["STATUS"].startswith("serving on %s: pool 256 MiB, backend shm"
                                                   % self.daemon.socket_path), ready)
        self.assertTrue(all("READY" not in m for m in got[:-1]), "READY sent twice")
        self.daemon.proc.terminate()
        stopping = self.messages_until("STOPPING")[-1]
        self.assertEqual(stopping["STOPPING"], "1")
        self.assertIn("finishing copies in flight", stopping["STATUS"])
        self.assertEqual(self.daemon.proc.wait(30), 0)

    def test_start_up_failure_is_the_last_status(self):
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path)
        self.daemon = common.Daemon(self.tmp, extra=["--pool_bytes=1000TiB"], env=env)
        self.assertEqual(self.daemon.proc.wait(30), 1)
        got = self.drain()
        self.assertTrue(got[-1]["STATUS"].startswith("failed: host pool of"), got)
        self.assertNotIn("READY", got[-1])

    def test_without_notify_socket_nothing_changes(self):
        env = {k: v for k, v in os.environ.items() if k != "NOTIFY_SOCKET"}
        self.daemon = common.Daemon(self.tmp, env=env)
        self.daemon.wait_ready()
        self.assertIn("SERVING", self.health().stdout)


if __name__ == "__main__":
    unittest.main()
