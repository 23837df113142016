"""offloadd.client against a real daemon (shm backend): bytes, batching, errors, daemon loss --
with the request ring (the native core, the default) and on the stream alone (ring=False), and
a client whose ring cannot be had (no core, a daemon that refuses it) on the stream.

Run: tests/python/run.sh (or /usr/bin/python3 -m unittest discover -s client/python/tests).
"""

import os
import signal
import socket
import tempfile
import threading
import time
import unittest

from daemon_fixture import Daemon, DaemonTestCase

from offloadd import _native, errors
from offloadd import client as client_module
from offloadd.client import PREFETCH, URGENT, Client
from offloadd.shm import ShmRegion
from offloadd.socket_path import (default_socket_path_for, join_group_remedy,
                                  permission_denied_reason, socket_path_fits)


class ClientTest(DaemonTestCase):
    """Offloads, reloads and releases on the request ring (the native core must be built:
    bazel build //client/core:liboffloadd_core.so)."""

    RING = True

    def setUp(self):
        super().setUp()
        self.client = Client(self.daemon.sock, "test_client", "cpu", ring=self.RING)
        self.assertEqual(self.client.ring_active, self.RING, self.client.ring_error)
        self.region = ShmRegion(1 << 20)
        self.region_id = self.client.register_shm(self.region.name, self.region.size_bytes)
        self.region.unlink()

    def tearDown(self):
        self.client.close()
        self.region.close()

    def test_hello_reports_the_daemon(self):
        self.assertEqual(self.client.backend, "shm")
        self.assertEqual(self.client.pool_capacity_bytes, 64 << 20)
        self.assertGreater(self.client.chunk_bytes, 0)
        self.assertGreater(self.client.session_id, 0)
        self.assertTrue(self.client.link)

    def test_offload_and_reload_move_the_bytes(self):
        mm = self.region.mm
        patterns = [bytes([i]) * 4096 + os.urandom(4096) for i in range(3)]
        for i, p in enumerate(patterns):
            mm[i * 8192:(i + 1) * 8192] = p
        done = [self.client.offload(self.region_id, i * 8192, 8192) for i in range(3)]
        blocks = [f.result(10).block_id for f in done]
        self.assertEqual(len(set(blocks)), 3)
        mm[0:3 * 8192] = b"\0" * (3 * 8192)
        base = 512 << 10
        for i, block in enumerate(reversed(blocks)):
            prio = URGENT if i == 0 else PREFETCH
            r = self.client.reload(block, self.region_id, base + i * 8192, prio,
                                   release_after=True).result(10)
            self.assertEqual(r.bytes, 8192)
            self.assertTrue(r.released)
        for i, p in enumerate(reversed(patterns)):
            self.assertEqual(mm[base + i * 8192:base + (i + 1) * 8192], p)
        self.assertEqual(self.daemon.stats().blocks, 0)

    def test_answers_carry_the_protocol_fields(self):
        """Answers are records (OffloadAnswer, ReloadAnswer, ReleaseAnswer) with the fields of
        the protocol's messages, on the ring and on the stream alike."""
        done = self.client.offload(self.region_id, 0, 4096).result(10)
        self.assertEqual(done.bytes, 4096)
        self.assertGreater(done.block_id, 0)
        self.assertGreaterEqual(done.queued_seconds, 0.0)
        self.assertGreaterEqual(done.copy_seconds, 0.0)
        back = self.client.reload(done.block_id, self.region_id, 8192, URGENT).result(10)
        self.assertEqual((back.block_id, back.bytes, back.released), (done.block_id, 4096, False))
        self.assertFalse(back.done_event_recorded)  # shm: the copy completed
        gone = self.client.release(done.block_id).result(10)
        self.assertEqual(gone.block_id, done.block_id)
        kinds = (client_module.OffloadAnswer, client_module.ReloadAnswer, client_module.ReleaseAnswer)
        for answer, kind in zip((done, back, gone), kinds):
            self.assertIs(type(answer), kind)
        self.assertEqual(gone, client_module.ReleaseAnswer(done.block_id))
        self.assertNotEqual(gone, client_module.ReleaseAnswer(done.block_id + 1))
        self.assertEqual(repr(gone), "ReleaseAnswer(block_id=%d)" % done.block_id)
        with self.assertRaises(TypeError):
            hash(gone)  # a record's fields may be set: not hashable
        self.assertEqual(self.daemon.stats().blocks, 0)

    def test_requests_are_batched(self):
        futures = [self.client.offload(self.region_id, 0, 4096) for _ in range(300)]
        blocks = [f.result(10).block_id for f in futures]
        for f in [self.client.release(b) for b in blocks]:
            f.result(10)
        c = self.client.counters
        if self.RING:  # the stream carried Hello and the registration only
            self.assertEqual((c.requests_sent, c.responses_received), (2, 2))
            self.assertEqual((c.ring_requests_sent, c.ring_answers_received), (600, 600))
        else:
            self.assertEqual(c.requests_sent, 2 + 600)  # hello + register + 300 + 300
            self.assertLess(c.messages_sent, c.requests_sent / 2)
            self.assertEqual(c.responses_received, c.requests_sent)
            self.assertEqual(c.ring_requests_sent, 0)
        self.assertEqual(c.unknown_responses, 0)
        self.assertEqual(self.daemon.stats().blocks, 0)

    def test_daemon_errors_carry_codes(self):
        with self.assertRaises(errors.OffloaddError) as e:
            self.client.reload(12345, self.region_id, 0, URGENT).result(10)
        self.assertEqual(e.exception.code, errors.NOT_FOUND)
        with self.assertRaises(errors.OffloaddError) as e:
            self.client.offload(self.region_id, (1 << 20) - 100, 4096).result(10)
        self.assertEqual(e.exception.code, errors.OUT_OF_RANGE)
        with self.assertRaises(errors.OffloaddError) as e:
            self.client.register_shm("/offloadd-no-such-object-%d" % os.getpid(), 4096, 10)
        self.assertEqual(e.exception.code, errors.NOT_FOUND)
        with self.assertRaises(errors.OffloaddError) as e:
            self.client.register_cuda(b"short", 4096)
        self.assertEqual(e.exception.code, errors.INVALID_ARGUMENT)

    def test_a_registration_answered_after_its_wait_is_undone(self):
        undone = []
        unregister = self.client.unregister

        def recording(region_id):
            undone.append(region_id)
            return unregister(region_id)

        self.client.unregister = recording
        region = ShmRegion(1 << 20)
        self.addCleanup(region.close)
        with self.assertRaises(TimeoutError) as e:
            self.client.register_shm(region.name, region.size_bytes, timeout=1e-9)
        late = e.exception.answer.result(10).region_id  # the daemon registered it after all
        deadline = time.monotonic() + 10  # the answer's callbacks run after result() returns
        while not undone and time.monotonic() < deadline:
            time.sleep(0.01)
        self.assertTrue(self.client.drain(10))
        self.assertEqual(undone, [late])
        self.assertNotEqual(late, self.region_id)

    def test_requests_after_close_fail(self):
        self.client.close()
        self.assertFalse(self.client.alive)
        with self.assertRaises(errors.OffloaddError) as e:
            self.client.offload(self.region_id, 0, 4096).result(10)
        self.assertIn(e.exception.code, (errors.FAILED_PRECONDITION, errors.CANCELLED))

    def test_get_stats(self):
        f = self.client.offload(self.region_id, 0, 65536)
        block = f.result(10).block_id
        stats = self.client.get_stats()
        self.assertEqual(stats.backend, "shm")
        self.assertEqual(stats.blocks, 1)
        self.assertGreaterEqual(stats.pool_used_bytes, 65536)
        self.client.release(block).result(10)
        self.assertEqual(self.client.get_stats().blocks, 0)


class InterruptedConnectTest(DaemonTestCase):
    """An interrupt (a signal handler raising) while a Client connects closes what it opened:
    the daemon's session ends and no reader thread is left."""

    def test_an_interrupt_as_the_stream_starts_ends_the_session(self):
        from unittest import mock
        real = client_module._Conn.start

        def start_then_interrupt(conn):
            real(conn)
            raise KeyboardInterrupt("a signal handler raised")
        readers = lambda: sum(t.name == "offloadd-reader" for t in threading.enumerate())  # noqa
        before = readers()
        with mock.patch.object(client_module._Conn, "start", start_then_interrupt):
            with self.assertRaises(KeyboardInterrupt):
                Client(socket_path=self.daemon.sock, client_name="interrupted")
        deadline = time.monotonic() + 10
        while (self.daemon.stats().sessions_open or readers() > before) and \
                time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertEqual((self.daemon.stats().sessions_open, readers()), (0, before))
        c = Client(socket_path=self.daemon.sock, client_name="after")  # the daemon serves on
        self.assertEqual(self.daemon.stats().sessions_open, 1)
        c.close()


class StreamClientTest(ClientTest):
    """The same on the stream alone (ring=False)."""

    RING = False


class NoRingTest(DaemonTestCase):
    """A ring that cannot be had leaves every request on the stream, and says why."""

    def check_on_the_stream(self, client):
        region = ShmRegion(1 << 20)
        try:
            rid = client.register_shm(region.name, region.size_bytes)
            region.unlink()
            region.mm[0:4096] = b"\x5a" * 4096
            block = client.offload(rid, 0, 4096).result(10).block_id
            region.mm[0:4096] = b"\0" * 4096
            self.assertTrue(client.reload(block, rid, 0, URGENT, release_after=True)
                            .result(10).released)
            self.assertEqual(bytes(region.mm[0:4096]), b"\x5a" * 4096)
            self.assertEqual(client.counters.ring_requests_sent, 0)
            self.assertEqual(client.counters.requests_sent, 2 + 2)  # hello, register, 2
        finally:
            client.close()
            region.close()

    def test_without_the_native_core(self):
        def missing():
            raise OSError("the offloadd native core (liboffloadd_core.so) was not found")
        saved, _native.load = _native.load, missing
        try:
            client = Client(self.daemon.sock, "no-core", "cpu")
        finally:
            _native.load = saved
        self.assertFalse(client.ring_active)
        self.assertIn("liboffloadd_core.so", client.ring_error)
        self.check_on_the_stream(client)

    def test_a_ring_the_daemon_refuses(self):
        class NotARing:  # a descriptor that is no sealed memfd: the daemon refuses it
            def __init__(self, entries):
                self.fd = os.open("/dev/null", os.O_RDONLY)

            def close(self):
                os.close(self.fd)
        saved, client_module._native.NativeRing = _native.NativeRing, NotARing
        try:
            client = Client(self.daemon.sock, "refused", "cpu")
        finally:
            client_module._native.NativeRing = saved
        self.assertFalse(client.ring_active)
        self.assertTrue(client.ring_error)
        self.check_on_the_stream(client)

    def test_off_by_environment(self):
        os.environ["OFFLOADD_RING"] = "0"
        try:
            client = Client(self.daemon.sock, "env-off", "cpu")
        finally:
            del os.environ["OFFLOADD_RING"]
        self.assertFalse(client.ring_active)
        self.check_on_the_stream(client)


class DaemonLossTest(unittest.TestCase):
    def test_a_killed_daemon_ends_a_wait_on_the_ring(self):
        """A daemon SIGKILLed with a ring request unanswered leaves the ring open: the wait
        notices the stream's end (DaemonUnavailable) instead of sleeping on."""
        daemon = Daemon("8MiB")
        try:
            client = Client(daemon.sock, "ring-loss", "cpu", reconnect=False)
            self.assertTrue(client.ring_active, client.ring_error)
            region = ShmRegion(1 << 20)
            rid = client.register_shm(region.name, region.size_bytes)
            region.unlink()
            os.kill(daemon.proc.pid, signal.SIGSTOP)  # takes nothing from the ring any more
            op = client.offload(rid, 0, 4096)
            outcome = []
            waiter = threading.Thread(target=lambda: outcome.append(op.exception(60)))
            t0 = time.monotonic()
            waiter.start()
            time.sleep(0.2)
            self.assertFalse(op.done())
            daemon.kill()
            waiter.join(30)
            self.assertFalse(waiter.is_alive())
            self.assertLess(time.monotonic() - t0, 30)
            self.assertIsInstance(outcome[0], errors.DaemonUnavailable)
            with self.assertRaises(errors.DaemonUnavailable):
                client.offload(rid, 0, 4096).result(10)
            client.close()
            region.close()
        finally:
            daemon.stop()


    def test_stream_end_fails_pending_and_later_requests(self):
        daemon = Daemon("8MiB")
        try:
            client = Client(daemon.sock, "loss", "cpu")
            region = ShmRegion(1 << 20)
            rid = client.register_shm(region.name, region.size_bytes)
            region.unlink()
            daemon.stop()
            deadline = time.monotonic() + 10
            while client.alive and time.monotonic() < deadline:
                time.sleep(0.01)
            self.assertFalse(client.alive)
            with self.assertRaises(errors.DaemonUnavailable):
                client.offload(rid, 0, 4096).result(10)
            client.close()
            region.close()
        finally:
            daemon.stop()

    def test_dead_socket_fails_fast_and_says_so(self):
        path = "/tmp/offloadd-dead-%d.sock" % os.getpid()
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)  # bound, never listening: what a daemon that exited leaves
        try:
            t0 = time.monotonic()
            with self.assertRaises(errors.DaemonUnavailable) as e:
                Client(path)
            self.assertLess(time.monotonic() - t0, 1.0)
            self.assertIn("no daemon listens on it", str(e.exception))
        finally:
            s.close()
            os.unlink(path)

    def test_missing_socket_fails_fast(self):
        t0 = time.monotonic()
        with self.assertRaises(errors.DaemonUnavailable) as e:
            Client("/tmp/offloadd-no-daemon-%d.sock" % os.getpid())
        self.assertLess(time.monotonic() - t0, 5.0)
        self.assertIn("start the daemon", str(e.exception))
        # The remedy names where the path came from: the caller's argument here...
        self.assertIn("or pass the daemon's socket path (socket_path=PATH, or set "
                      "$OFFLOADD_SOCKET=PATH where no socket_path= is given)", str(e.exception))
        # ...the environment there.
        missing = "/tmp/offloadd-no-daemon-env-%d.sock" % os.getpid()
        old = os.environ.get("OFFLOADD_SOCKET")
        os.environ["OFFLOADD_SOCKET"] = missing
        try:
            with self.assertRaises(errors.DaemonUnavailable) as e:
                Client()
        finally:
            if old is None:
                del os.environ["OFFLOADD_SOCKET"]
            else:
                os.environ["OFFLOADD_SOCKET"] = old
        self.assertIn("no offloadd socket at %s" % missing, str(e.exception))
        self.assertIn("point $OFFLOADD_SOCKET at the daemon's socket path (or pass "
                      "socket_path=PATH)", str(e.exception))

    def test_a_listener_that_never_answers_is_not_called_a_stale_socket(self):
        # Something accepts connections but speaks no gRPC (a stopped daemon, another program):
        # the error says so and does not advise a restart as for a socket nobody listens on.
        path = "/tmp/offloadd-silent-%d.sock" % os.getpid()
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(path)
        listener.listen(16)
        try:
            t0 = time.monotonic()
            with self.assertRaises(errors.DaemonUnavailable) as e:
                Client(path, connect_timeout_seconds=0.5)
            self.assertLess(time.monotonic() - t0, 5.0)
        finally:
            listener.close()
            os.unlink(path)
        text = str(e.exception)
        self.assertIn("within 0.5 s: the socket accepts connections", text)
        self.assertIn("stopped (SIGSTOP, a debugger), hung or overloaded, or another program", text)
        self.assertNotIn("stale", text)

    def test_socket_path_rules(self):
        self.assertEqual(default_socket_path_for(0, "/run/user/5"), "/run/offloadd/offloadd.sock")
        self.assertEqual(default_socket_path_for(5, "/run/user/5"),
                         "/run/user/5/offloadd/offloadd.sock")
        self.assertEqual(default_socket_path_for(5, None), "/tmp/offloadd-5/offloadd.sock")
        # A system-wide daemon's directory: the same path for every user.
        self.assertEqual(default_socket_path_for(5, "/run/user/5", True),
                         "/run/offloadd/offloadd.sock")
        self.assertEqual(default_socket_path_for(7, None, True), "/run/offloadd/offloadd.sock")
        self.assertFalse(socket_path_fits("/tmp/" + "x" * 103))
        self.assertTrue(socket_path_fits("/tmp/" + "x" * 102))
        with self.assertRaises(errors.OffloaddError) as e:
            Client("/tmp/" + "x" * 200)
        self.assertEqual(e.exception.code, errors.INVALID_ARGUMENT)

    def test_group_root_is_never_the_group_to_join(self):
        # A socket in group root (a daemon started by hand as root): the remedy is a dedicated
        # socket group, never adding users to root.
        why = join_group_remedy("root (gid 0)", "root", "0")
        self.assertNotIn("usermod -aG root", why)
        self.assertNotIn("add this user to group root", why)
        self.assertIn("socket_group: offloadd in the config, or --socket_group=offloadd", why)
        self.assertIn("usermod -aG offloadd USER", why)
        # Nor is nogroup (gid 65534), the group of a daemon run as nobody.
        nogroup = join_group_remedy("nogroup (gid 65534)", "nogroup", "65534")
        self.assertNotIn("usermod -aG nogroup", nogroup)
        self.assertNotIn("add this user to group nogroup", nogroup)
        self.assertIn("its group is nogroup (gid 65534), and users must not be added", nogroup)
        self.assertIn("socket_group: offloadd in the config, or --socket_group=offloadd", nogroup)
        other = join_group_remedy("offloadd (gid 2000)", "offloadd", "2000")
        self.assertIn("add this user to group offloadd (gid 2000) (usermod -aG offloadd USER",
                      other)
        self.assertNotIn("socket_group", other)

    def test_permission_denied_on_a_socket_in_group_root(self):
        with tempfile.TemporaryDirectory() as d:
            sock = os.path.join(d, "offloadd.sock")
            open(sock, "w").close()
            os.chmod(sock, 0o660)
            try:
                os.chown(sock, -1, 0)
            except OSError:
                self.skipTest("cannot give a file group 0 here")
            why = permission_denied_reason(sock)
            self.assertIn("the socket %s (group root (gid 0), mode 0660)" % sock, why)
            self.assertNotIn("usermod -aG root", why)
            self.assertNotIn("usermod -aG 0 ", why)
            self.assertIn("--socket_group=offloadd", why)


if __name__ == "__main__":
    unittest.main()
