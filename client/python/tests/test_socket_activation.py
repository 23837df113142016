"""Socket activation (LISTEN_FDS, deploy/offloadd.socket): the listening socket belongs to the
service manager, so it outlives a daemon that is SIGKILLed and restarted -- connects made
meanwhile wait in its backlog instead of being refused, and a client resumes across the restart.
This test plays the service manager: it binds the socket and passes it to each daemon as fd 3.

Run: tests/python/run.sh -k socket_activation.
"""

import ctypes
import errno
import os
import secrets
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import unittest

from daemon_fixture import Daemon, daemon_bin

from offloadd.client import URGENT, Client
from offloadd.shm import ShmRegion


def _activated(listener_fd):
    """preexec_fn: the socket as fd 3, LISTEN_PID/LISTEN_FDS for this process, die with us."""
    def pre():
        os.dup2(listener_fd, 3)
        os.environ["LISTEN_PID"] = str(os.getpid())
        os.environ["LISTEN_FDS"] = "1"
        ctypes.CDLL("libc.so.6").prctl(1, signal.SIGTERM)
    return pre


class ActivatedDaemon:
    def __init__(self, listener, sock, extra=()):
        self.log = tempfile.NamedTemporaryFile(prefix="offloadd-act-", suffix=".log")
        self.proc = subprocess.Popen(
            [daemon_bin(), "--socket_path", sock, "--pool_bytes", "64MiB",
             "--metrics_address", ""] + list(extra),
            stdout=subprocess.PIPE, stderr=self.log, text=True, close_fds=False,
            preexec_fn=_activated(listener.fileno()))
        line = self.proc.stdout.readline()
        if "ready" not in line:
            self.proc.kill()
            self.log.seek(0)
            raise RuntimeError("activated offloadd did not start: %s" % self.log.read())
        threading.Thread(target=self.proc.stdout.read, daemon=True).start()

    def kill(self):
        self.proc.kill()
        self.proc.wait()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            return self.proc.wait(30)
        return self.proc.returncode


def connect_error(path):
    """0 when a connect to ``path`` succeeds, else its errno."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        return 0
    except OSError as e:
        return e.errno
    finally:
        s.close()


class SocketActivationTest(unittest.TestCase):
    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="ofd-act-", dir="/tmp")
        self.sock = os.path.join(self.dir, "d.sock")
        self.pool = "offloadd-py-act-%d-%s" % (os.getpid(), secrets.token_hex(4))
        self.extra = ("--pool_shm_name", self.pool, "--resume_grace_seconds", "60")
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(self.sock)
        self.listener.listen(128)
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.stop()
        self.listener.close()
        for path in (self.sock, "/dev/shm/" + self.pool):
            try:
                os.unlink(path)
            except OSError:
                pass
        shutil.rmtree(self.dir, ignore_errors=True)

    def test_connects_wait_and_the_client_resumes_across_a_sigkill(self):
        first = ActivatedDaemon(self.listener, self.sock, self.extra)
        self.daemons.append(first)
        client = Client(self.sock, "activated", "cpu")
        src, dst = ShmRegion(1 << 20), ShmRegion(1 << 20)
        payload = os.urandom(300_000)
        src.mm[:len(payload)] = payload
        sid = client.register_shm(src.name, src.size_bytes, relink=src.relink)
        did = client.register_shm(dst.name, dst.size_bytes, relink=dst.relink)
        block = client.offload(sid, 0, len(payload)).result(10).block_id
        first.kill()
        # No daemon runs, yet the socket accepts: the connect waits in the backlog.
        self.assertEqual(connect_error(self.sock), 0)
        self.assertTrue(os.path.exists(self.sock))
        waiting = client.reload(block, did, 0, URGENT)
        second = ActivatedDaemon(self.listener, self.sock, self.extra)
        self.daemons.append(second)
        waiting.result(30)
        self.assertEqual(bytes(dst.mm[:len(payload)]), payload)
        self.assertEqual(client.counters.resumes, 1)
        client.release(block).result(10)
        client.close()
        self.assertEqual(second.stop(), 0)
        self.assertTrue(os.path.exists(self.sock), "an activated daemon left the socket file")
        for r in (src, dst):
            r.close()

    def test_config_socket_mode_not_in_force_is_named(self):
        os.chmod(self.sock, 0o666)  # what the service manager made, not the config's 0660
        d = ActivatedDaemon(self.listener, self.sock, ("--socket_mode", "0660"))
        self.daemons.append(d)
        self.assertEqual(d.stop(), 0)
        d.log.seek(0)
        log = d.log.read().decode()
        self.assertIn("passed by the service manager has mode 0666", log)
        self.assertIn("asks for socket_mode 0660", log)
        self.assertIn("SocketMode=", log)
        self.assertEqual(os.stat(self.sock).st_mode & 0o777, 0o666, "the daemon changed it")

    def test_without_activation_connects_are_refused_while_the_daemon_is_down(self):
        self.listener.close()
        os.unlink(self.sock)
        d = Daemon("64MiB", sock=self.sock)
        d.kill()
        self.assertEqual(connect_error(self.sock), errno.ECONNREFUSED)


if __name__ == "__main__":
    unittest.main()
