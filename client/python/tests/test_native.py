"""The native core's binding (offloadd/_native.py) against the real daemon binary: the
session's Hello and region go on a raw gRPC stream, offloads, reloads and releases on the ring
through liboffloadd_core.so (built by ``bazel build //client/core:liboffloadd_core.so``). Every
test runs under both bindings of the ring's hot calls: the extension module offloadd._ring_fast
(``bazel build //client/core:ring_fast.so``; the classes without a suffix, which use it when it
is built) and ctypes (the *Ctypes classes, OFFLOADD_RING_FAST=0)."""

import mmap
import os
import queue
import shutil
import struct
import subprocess
import sys
import tempfile
import textwrap
import threading
import unittest

import grpc
import pytest

from daemon_fixture import Daemon
from offloadd import _native
from offloadd.shm import ShmRegion
from offloadd.v1 import offload_pb2 as pb
from offloadd.v1 import offload_pb2_grpc as pb_grpc


class _Stream:
    """A Session stream fed from a queue; ``call(*requests)`` sends them in one message and
    returns the next ServerMessage's responses."""

    def __init__(self, sock):
        self.channel = grpc.insecure_channel("unix:" + sock)
        self.outbox = queue.Queue()
        self.replies = pb_grpc.OffloadStub(self.channel).Session(iter(self.outbox.get, None))

    def call(self, *requests):
        self.outbox.put(pb.ClientMessage(requests=list(requests)))
        return list(next(self.replies).responses)

    def close(self):
        self.outbox.put(None)
        for _ in self.replies:
            pass
        self.channel.close()


def _fast_built():
    return any(os.path.exists(p) for p in _native._FAST_CANDIDATES)


# The binding the classes without a suffix use: the extension module when it is built.
DEFAULT_BINDING = "c-extension" if _fast_built() else "ctypes"


class _Binding:
    """Sets OFFLOADD_RING_FAST for the test (FAST: None leaves it unset, "0" turns the
    extension module off) and restores it after."""
    FAST = None
    BINDING = DEFAULT_BINDING

    def setUp(self):
        self._saved_fast = os.environ.pop("OFFLOADD_RING_FAST", None)
        if self.FAST is not None:
            os.environ["OFFLOADD_RING_FAST"] = self.FAST

    def tearDown(self):
        os.environ.pop("OFFLOADD_RING_FAST", None)
        if self._saved_fast is not None:
            os.environ["OFFLOADD_RING_FAST"] = self._saved_fast


class NativeRingTest(_Binding, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("64MiB")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def setUp(self):
        super().setUp()
        self.ring = _native.NativeRing(64)
        self.assertEqual(self.ring.binding, self.BINDING, _native.ring_fast_error)
        self.stream = _Stream(self.daemon.sock)
        self.region = ShmRegion(1 << 20)
        hello = pb.Request(request_id=1, hello=pb.Hello(device_id="py-native", pid=os.getpid(),
                                                        ring=pb.RingOffer(fd=self.ring.fd)))
        (reply,) = self.stream.call(hello)
        self.assertTrue(reply.hello.ring_attached, reply.hello.ring_error)
        reg = pb.Request(request_id=2, register_region=pb.RegisterRegion(handle=pb.RegionHandle(
            shm_name=self.region.name, size_bytes=self.region.size_bytes)))
        (reply,) = self.stream.call(reg)
        self.region_id = reply.region_registered.region_id
        self.assertNotEqual(self.region_id, 0)

    def tearDown(self):
        self.stream.close()
        self.region.close()
        self.ring.close()
        super().tearDown()

    def test_offload_reload_release_are_bitwise_exact_and_answer_by_id(self):
        data = bytes((i * 31 + 5) % 256 for i in range(65536))
        self.region.mm[0:65536] = data
        off = self.ring.offload(self.region_id, 0, 65536, tag=4)
        back = self.ring.reload(0, self.region_id, 65536, release_after=True, tag=4)
        self.assertNotEqual(off & (1 << 63), 0)
        done = self.ring.wait(off, timeout=10)
        self.assertEqual(done.kind, _native.OFFLOAD_DONE, done.message)
        self.assertEqual(done.bytes, 65536)
        got = self.ring.wait(back, timeout=10)
        self.assertEqual(got.kind, _native.RELOAD_DONE, got.message)
        self.assertEqual(got.block_id, done.block_id)
        self.assertTrue(got.flags & _native.FLAG_RELEASED)
        self.assertEqual(bytes(self.region.mm[65536:131072]), data)
        with self.assertRaises(KeyError):  # taken once
            self.ring.wait(back, timeout=0)
        gone = self.ring.wait(self.ring.release(done.block_id), timeout=10)
        self.assertEqual(gone.kind, _native.ERROR)
        self.assertEqual(gone.status_code, grpc.StatusCode.NOT_FOUND.value[0], gone.message)
        self.assertEqual(self.ring.pending, 0)
        self.assertEqual(self.daemon.stats().blocks, 0)

    def test_errors_carry_codes_and_the_ring_closes_with_the_session(self):
        bad = self.ring.wait(self.ring.offload(self.region_id, (1 << 20) - 10, 4096), timeout=10)
        self.assertEqual(bad.kind, _native.ERROR)
        self.assertEqual(bad.status_code, grpc.StatusCode.OUT_OF_RANGE.value[0], bad.message)
        with self.assertRaises(ValueError):
            self.ring.reload(1, self.region_id, 0, done_event=b"short")
        # Fill the pool until an offload waits for space: its waiter sleeps in native code with
        # the GIL released (another Python thread runs meanwhile), and a release lets it in.
        blocks, waiting = [], None
        for _ in range(80):
            rid = self.ring.offload(self.region_id, 0, 1 << 20)
            try:
                done = self.ring.wait(rid, timeout=0.5)
            except TimeoutError:
                waiting = rid
                break
            self.assertEqual(done.kind, _native.OFFLOAD_DONE, done.message)
            blocks.append(done.block_id)
        self.assertIsNotNone(waiting, "the pool never filled")
        ticks = []
        stop = threading.Event()

        def tick():
            while not stop.is_set():
                ticks.append(1)
        t = threading.Thread(target=tick)
        t.start()
        with self.assertRaises(TimeoutError):
            self.ring.wait(waiting, timeout=0.3)
        stop.set()
        t.join()
        self.assertGreater(len(ticks), 1000)
        freed = self.ring.wait(self.ring.release(blocks.pop()), timeout=10)
        self.assertEqual(freed.kind, _native.RELEASED, freed.message)
        admitted = self.ring.wait(waiting, timeout=10)
        self.assertEqual(admitted.kind, _native.OFFLOAD_DONE, admitted.message)
        self.stream.close()
        deadline = 100
        while not self.ring.closed and deadline > 0:
            threading.Event().wait(0.05)
            deadline -= 1
        self.assertTrue(self.ring.closed)
        with self.assertRaises(_native.RingClosed) as refused:
            self.ring.release(1)
        self.assertIn("the daemon ended the session", str(refused.exception))
        self.stream = _Stream(self.daemon.sock)  # for tearDown

    def test_a_ring_attached_to_a_live_session_is_refused_to_another(self):
        # Two Hellos of one process offering one memfd: the second session goes on without it.
        other = _Stream(self.daemon.sock)
        try:
            hello = pb.Request(request_id=1, hello=pb.Hello(
                device_id="py-native-2", pid=os.getpid(), ring=pb.RingOffer(fd=self.ring.fd)))
            (reply,) = other.call(hello)
            self.assertFalse(reply.hello.ring_attached)
            self.assertIn("already attached to another session", reply.hello.ring_error)
            # Its stream serves it; the first session's ring keeps working.
            reg = pb.Request(request_id=2, register_region=pb.RegisterRegion(
                handle=pb.RegionHandle(shm_name=self.region.name,
                                       size_bytes=self.region.size_bytes)))
            (reply,) = other.call(reg)
            self.assertNotEqual(reply.region_registered.region_id, 0)
            self.region.mm[0:4096] = b"\x5a" * 4096
            done = self.ring.wait(self.ring.offload(self.region_id, 0, 4096), timeout=10)
            self.assertEqual(done.kind, _native.OFFLOAD_DONE, done.message)
            back = self.ring.wait(self.ring.reload(done.block_id, self.region_id, 8192,
                                                   release_after=True), timeout=10)
            self.assertEqual(back.kind, _native.RELOAD_DONE, back.message)
            self.assertEqual(bytes(self.region.mm[8192:12288]), b"\x5a" * 4096)
            self.assertFalse(self.ring.closed)
        finally:
            other.close()

    def test_a_refused_hellos_ring_is_not_attached_by_a_later_hello_without_one(self):
        ring, stream = _native.NativeRing(8), _Stream(self.daemon.sock)
        try:
            (refused,) = stream.call(pb.Request(request_id=5, hello=pb.Hello(
                device_id="", pid=os.getpid(), ring=pb.RingOffer(fd=ring.fd))))
            self.assertEqual(refused.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
            (reply,) = stream.call(pb.Request(request_id=5, hello=pb.Hello(
                device_id="py-native-4", pid=os.getpid())))
            self.assertEqual(reply.WhichOneof("body"), "hello", reply)
            self.assertFalse(reply.hello.ring_attached)
            self.assertEqual(reply.hello.ring_error, "")
        finally:
            stream.close()
            ring.close()

    def test_a_ring_request_id_on_the_stream_is_refused_and_counted(self):
        before = self.daemon.stats().errors_total
        (reply,) = self.stream.call(pb.Request(request_id=(1 << 63) | 77,
                                               release=pb.ReleaseRequest(block_id=1)))
        self.assertEqual(reply.error.code, grpc.StatusCode.INVALID_ARGUMENT.value[0])
        self.assertIn("belong to the session's request ring", reply.error.message)
        self.assertEqual(self.daemon.stats().errors_total, before + 1)

    def test_a_descriptor_not_open_is_named_with_the_process(self):
        stream = _Stream(self.daemon.sock)
        try:
            (reply,) = stream.call(pb.Request(request_id=1, hello=pb.Hello(
                device_id="py-native-3", pid=os.getpid(), ring=pb.RingOffer(fd=999999))))
            self.assertFalse(reply.hello.ring_attached)
            self.assertIn("descriptor 999999 is not open in the client process %d"
                          % os.getpid(), reply.hello.ring_error)
            self.assertNotIn("No such file", reply.hello.ring_error)
        finally:
            stream.close()

    def test_drain_answers_as_tuples_with_the_messages_of_errors(self):
        self.region.mm[0:8192] = b"\x33" * 8192
        ok = self.ring.offload(self.region_id, 0, 8192, tag=9, ordering=(1, 0))
        bad = self.ring.offload(self.region_id, (1 << 20) - 10, 4096)
        gone = self.ring.release(0, tag=12345)  # no block has that tag
        answers = {}
        for _ in range(100):
            for answer in self.ring.drain(timeout=0.1) or []:
                answers[answer[0]] = answer
            if len(answers) == 3:
                break
        self.assertEqual(sorted(answers), sorted((ok, bad, gone)))
        for answer in answers.values():
            self.assertEqual(len(answer), 9)
            self.assertEqual([type(v) for v in answer],
                             [int] * 5 + [float] * 2 + [int, str])
        rid, kind, code, block, nbytes, queued, copied, flags, message = answers[ok]
        self.assertEqual((kind, code, nbytes, flags, message), (_native.OFFLOAD_DONE, 0, 8192, 0,
                                                               ""))
        self.assertNotEqual(block, 0)
        self.assertGreaterEqual(queued, 0.0)
        self.assertGreaterEqual(copied, 0.0)
        rid, kind, code, block, nbytes, queued, copied, flags, message = answers[bad]
        self.assertEqual((kind, code), (_native.ERROR, grpc.StatusCode.OUT_OF_RANGE.value[0]))
        self.assertGreater(len(message), 10)
        rid, kind, code, block, nbytes, queued, copied, flags, message = answers[gone]
        self.assertEqual((kind, code), (_native.ERROR, grpc.StatusCode.NOT_FOUND.value[0]))
        self.assertEqual(self.ring.drain(), [])
        self.assertEqual(self.ring.pending, 0)
        # Request ids count up by one per submission on a ring, whatever the binding.
        self.assertEqual((bad - ok, gone - ok), (1, 2))
        self.ring.release(block)

    def test_an_event_handle_of_another_length_is_refused_with_value_error(self):
        for bad in (b"", b"x" * 63, bytearray(65)):
            with self.assertRaises(ValueError) as refused:
                self.ring.offload(self.region_id, 0, 4096, ready_event=bad)
            self.assertIn("an event handle is 64 bytes", str(refused.exception))
            with self.assertRaises(ValueError):
                self.ring.reload(1, self.region_id, 0, ready_event=None, done_event=bad)
        with self.assertRaises(TypeError):
            self.ring.offload(self.region_id, 0, 4096, ready_event=64)
        self.assertEqual(self.ring.pending, 0)  # nothing was submitted
        # 64 bytes of any bytes-like kind are taken.
        self.region.mm[0:4096] = b"\x11" * 4096
        done = self.ring.wait(self.ring.offload(self.region_id, 0, 4096,
                                                ready_event=bytearray(64)), timeout=10)
        self.assertNotEqual(done.kind, 0)
        if done.kind == _native.OFFLOAD_DONE:
            self.ring.release(done.block_id)


# What both bindings raise for a call on a closed ring.
_CLOSED_TEXT = ("this offloadd NativeRing is closed (close() was called): create a new NativeRing "
                "and offer it in a new session's Hello")
_NOT_INT_OR_STR = ("an event handle is None or 64 bytes (cudaIpcEventHandle_t), not an int or a "
                   "str")
# Bad events: (argument, exception type, its text), the same through either binding.
_BAD_EVENTS = (
    (b"short", ValueError, "an event handle is 64 bytes (cudaIpcEventHandle_t), not 5"),
    (bytearray(65), ValueError, "an event handle is 64 bytes (cudaIpcEventHandle_t), not 65"),
    (64, TypeError, _NOT_INT_OR_STR),
    ("e" * 64, TypeError, _NOT_INT_OR_STR),
    (object(), TypeError, "cannot convert 'object' object to bytes"),
)


def _publish_error_answer(ring, request_id, message, message_bytes, index):
    """Writes an error answer (kind 4, status 5) for ``request_id`` with the raw 200-byte
    ``message`` and ``message_bytes`` into completion slot ``index`` of the ring's shared
    memory and publishes it, as the daemon does (common/ring_format.h: the completion offset at
    byte 40 of the header, the completion tail a uint32 at byte 192)."""
    view = mmap.mmap(ring.fd, os.fstat(ring.fd).st_size)
    try:
        (completions,) = struct.unpack_from("<Q", view, 40)
        entry = struct.pack("<QIiQQddII", request_id, 4, 5, 0, 0, 0.0, 0.0, 0, message_bytes)
        entry += message.ljust(200, b"\0")
        slot = completions + 256 * index
        view[slot:slot + 256] = entry
        struct.pack_into("<I", view, 192, index + 1)
    finally:
        view.close()


@pytest.mark.parametrize("fast", [None, "0"], ids=["c-extension", "ctypes"])
def test_both_bindings_raise_and_decode_alike(fast, monkeypatch):
    """Through either binding: the same exception type and text for the same bad event, on an
    open ring and on a closed one (RingReleased first), and an answer's message cut at its
    message_bytes, not at a NUL inside it."""
    if fast is None and not _fast_built():
        pytest.skip("the extension module is not built (bazel build //client/core:ring_fast.so)")
    monkeypatch.delenv("OFFLOADD_RING_FAST", raising=False)
    if fast is not None:
        monkeypatch.setenv("OFFLOADD_RING_FAST", fast)
    ring = _native.NativeRing(8)
    assert ring.binding == ("ctypes" if fast else "c-extension"), _native.ring_fast_error
    for event, kind, text in _BAD_EVENTS:
        with pytest.raises(kind) as offload:
            ring.offload(1, 0, 4096, ready_event=event, timeout=0.0)
        with pytest.raises(kind) as reload:
            ring.reload(1, 1, 0, ready_event=None, done_event=event, timeout=0.0)
        assert (type(offload.value), str(offload.value)) == (kind, text)
        assert (type(reload.value), str(reload.value)) == (kind, text)
    assert ring.pending == 0  # nothing was submitted
    # Messages: message_bytes long, NULs kept, bytes past message_bytes not; bad UTF-8 replaced.
    raw = b"no block 7\0 (tag \xc3" + b"NOT-PART-OF-IT"
    first, second = ring.release(1, timeout=0.0), ring.release(2, timeout=0.0)
    _publish_error_answer(ring, first, raw, 18, 0)
    (answer,) = ring.drain(0.0)
    assert (answer[0], answer[1], answer[2], answer[8]) == (first, 4, 5, "no block 7\0 (tag \ufffd")
    _publish_error_answer(ring, second, raw, 18, 1)
    assert ring.wait(second, timeout=0).message == "no block 7\0 (tag \ufffd"
    ring.close()
    for event, _, _ in _BAD_EVENTS + ((b"e" * 64, None, None),):
        with pytest.raises(_native.RingReleased) as offload:
            ring.offload(1, 0, 4096, ready_event=event)
        with pytest.raises(_native.RingReleased) as reload:
            ring.reload(1, 1, 0, done_event=event)
        assert str(offload.value) == str(reload.value) == _CLOSED_TEXT


class NativeRingCtypesTest(NativeRingTest):
    FAST = "0"
    BINDING = "ctypes"


class RingFastModuleTest(unittest.TestCase):
    """The extension module itself, without a daemon."""

    def setUp(self):
        if not _fast_built():
            self.skipTest("the extension module is not built (bazel build "
                          "//client/core:ring_fast.so)")
        self._saved = os.environ.pop("OFFLOADD_RING_FAST", None)
        self.fast = _native.load_ring_fast()
        self.assertIsNotNone(self.fast, _native.ring_fast_error)

    def tearDown(self):
        if self._saved is not None:
            os.environ["OFFLOADD_RING_FAST"] = self._saved

    def test_the_binding_is_the_extension_when_built_and_ctypes_when_turned_off(self):
        ring = _native.NativeRing(8)
        self.assertEqual(ring.binding, "c-extension")
        self.assertIsNone(_native.ring_fast_error)
        os.environ["OFFLOADD_RING_FAST"] = "0"
        try:
            off = _native.NativeRing(8)
            self.assertEqual(off.binding, "ctypes")
            self.assertEqual(_native.ring_fast_error, "OFFLOADD_RING_FAST=0")
            off.close()
        finally:
            del os.environ["OFFLOADD_RING_FAST"]
        self.assertEqual(self.fast.__name__, "offloadd._ring_fast")
        ring.close()

    def test_bad_arguments_are_refused_before_the_core_is_called(self):
        ring = _native.NativeRing(8)
        ptr = ring._ring
        with self.assertRaises(ValueError) as refused:
            self.fast.offload(ptr, 1, 0, 4096, 0, b"y" * 65, 0, 0, 0, 0.0)
        self.assertIn("64 bytes (cudaIpcEventHandle_t), not 65", str(refused.exception))
        with self.assertRaises(ValueError):
            self.fast.reload(ptr, 1, 0, 1, 0, 1, 0, 0.0, b"z" * 64, b"z" * 3, 0.0)
        with self.assertRaises(TypeError):
            self.fast.offload(ptr, 1, 0, 4096, 0, None, 0, 0, 0)  # 9 arguments
        with self.assertRaises(TypeError):
            self.fast.release(ptr, 1.5, 0, 0.0)  # a float id
        with self.assertRaises(ValueError):
            self.fast.release(0, 1, 0, 0.0)  # no ring
        with self.assertRaises(ValueError):
            self.fast.drain(ptr, 65, 0.0)
        # Bound once per process: other addresses (another core) are refused, the first kept.
        with self.assertRaisesRegex(RuntimeError, "bound to another liboffloadd_core.so"):
            self.fast.bind(1, 2, 3, 4)
        self.assertEqual(ring.pending, 0)
        # A release on a ring nobody serves: submitted (an id with bit 63), answered by nobody.
        rid = self.fast.release(ptr, 1, 0, 0.0)
        self.assertEqual(rid >> 63, 1)
        self.assertEqual(ring.pending, 1)
        self.assertEqual(self.fast.drain(ptr, 64, 0.0), [])
        ring.close()
        self.assertIsNone(self.fast.drain(ptr, 64, 0.0))  # shut down: as the core's < 0


def _run(script, fast=None):
    """Runs ``script`` (after ``from offloadd import _native``) in a fresh interpreter: (exit
    code, output). A segfault is exit code -11. ``fast``: OFFLOADD_RING_FAST there (None:
    unset)."""
    package_root = os.path.dirname(os.path.dirname(os.path.abspath(_native.__file__)))
    env = dict(os.environ)
    env.pop("OFFLOADD_RING_FAST", None)
    if fast is not None:
        env["OFFLOADD_RING_FAST"] = fast
    env["PYTHONPATH"] = package_root + os.pathsep + env.get("PYTHONPATH", "")
    env["OFFLOADD_CORE_LIB"] = _native.load()._name
    done = subprocess.run([sys.executable, "-c", "from offloadd import _native\n"
                           + textwrap.dedent(script)], env=env, capture_output=True, text=True,
                          timeout=60)
    return done.returncode, done.stdout + done.stderr


class NativeRingLifetimeTest(unittest.TestCase):
    """A NativeRing without a daemon: calls after close() and close() under other threads' calls
    raise RingReleased instead of reaching freed or NULL native memory."""
    FAST = None
    BINDING = DEFAULT_BINDING

    def _run(self, script):
        rc, out = _run("print('binding', _native.NativeRing(8).binding)\n"
                       + textwrap.dedent(script), self.FAST)
        self.assertIn("binding %s\n" % self.BINDING, out)
        return rc, out

    def test_every_call_after_close_raises_ring_released(self):
        rc, out = self._run("""
            ring = _native.NativeRing(8)
            ring.close()
            ring.close()  # idempotent
            print("closed", ring.closed)
            calls = [lambda: ring.fd, lambda: ring.offload(1, 0, 4096),
                     lambda: ring.reload(1, 1, 0), lambda: ring.release(1),
                     lambda: ring.poll(1 << 63 | 1), lambda: ring.wait(1 << 63 | 1, 1),
                     lambda: ring.drain(0.0), lambda: ring.wake(), lambda: ring.pending]
            for call in calls:
                try:
                    call()
                    print("not refused")
                except _native.RingReleased as e:
                    assert isinstance(e, ValueError)
                    print("refused:", e)
            """)
        self.assertEqual(rc, 0, out)
        self.assertIn("closed True", out)
        self.assertEqual(out.count("refused: this offloadd NativeRing is closed"), 9, out)
        self.assertNotIn("not refused", out)

    def test_close_returns_threads_asleep_in_the_ring_and_frees_it_after_them(self):
        rc, out = self._run("""
            import threading
            ring = _native.NativeRing(8)
            for _ in range(8):
                ring.release(1, timeout=0.0)  # nobody takes them: the ring is full
            results = {}

            def call(name, fn):
                try:
                    results[name] = fn()
                except _native.RingReleased as e:
                    results[name] = "released: %s" % e
            threads = [threading.Thread(target=call, args=args) for args in (
                ("drain3", lambda: ring.drain(timeout=3)),
                ("drain", lambda: ring.drain(timeout=None)),
                ("wait", lambda: ring.wait(1 << 63 | 1)),
                ("submit", lambda: ring.release(2)))]
            for t in threads:
                t.start()
            ring.close()
            for t in threads:
                t.join(30)
                assert not t.is_alive(), "a thread still sleeps in the closed ring"
            for name in sorted(results):
                print(name, results[name])
            print("after", ring.closed, ring._ring)
            """)
        self.assertEqual(rc, 0, out)
        for name in ("drain", "drain3", "submit", "wait"):
            self.assertIn("%s released: this offloadd NativeRing" % name, out)
        self.assertIn("after True None", out)

    def test_a_full_ring_is_told_apart_from_a_closed_one(self):
        rc, out = self._run("""
            ring = _native.NativeRing(8)
            for _ in range(8):
                ring.release(1, timeout=0.0)
            try:
                ring.release(1, timeout=0.0)
            except _native.RingFull as e:
                assert isinstance(e, ConnectionError) and isinstance(e, TimeoutError)
                print("full:", e)
            print("closed", ring.closed)
            """)
        self.assertEqual(rc, 0, out)
        self.assertIn("full: no slot of the offloadd ring freed within the timeout", out)
        self.assertIn("closed False", out)


class NativeRingLifetimeCtypesTest(NativeRingLifetimeTest):
    FAST = "0"
    BINDING = "ctypes"


class LoadPathsTest(unittest.TestCase):
    """load() and load_ring_fast() try their candidate paths in order, take the first that
    loads, and say of every path tried before why it was passed over (a fresh interpreter each:
    both cache what they load)."""

    def setUp(self):
        folder = tempfile.mkdtemp(prefix="offloadd-load-")
        self.addCleanup(shutil.rmtree, folder)
        self.not_elf = os.path.join(folder, "not_a_library.so")  # text, not a shared object
        with open(self.not_elf, "w") as f:
            f.write("not a shared object\n" * 64)

    def test_a_core_that_does_not_load_is_named_with_each_path_tried(self):
        for given, why in (("/nonexistent/liboffloadd_core.so", "missing"),
                           (self.not_elf, "invalid ELF header")):
            rc, out = _run("""
                import os
                os.environ["OFFLOADD_CORE_LIB"] = %r
                try:
                    _native.load()
                except OSError as e:
                    print("refused:", e)
                """ % given)
            self.assertEqual(rc, 0, out)
            self.assertIn("refused: the offloadd native core (liboffloadd_core.so) was not found: "
                          "build it with 'bazel build //client/core:liboffloadd_core.so' or set "
                          "OFFLOADD_CORE_LIB (%s: " % given, out)
            self.assertIn(why + ")\n", out)

    def test_the_extension_module_is_the_first_candidate_that_loads(self):
        if not _fast_built():
            self.skipTest("the extension module is not built (bazel build "
                          "//client/core:ring_fast.so)")
        built = next(p for p in _native._FAST_CANDIDATES if os.path.exists(p))
        rc, out = _run("""
            _native._FAST_CANDIDATES = ("/nonexistent/ring_fast.so", %r)
            print("none", _native.load_ring_fast())
            print("why", _native.ring_fast_error)
            _native._FAST_CANDIDATES = ("/nonexistent/ring_fast.so", %r, %r)
            print("loaded", _native.load_ring_fast().__name__, _native.ring_fast_error)
            """ % (self.not_elf, self.not_elf, built))
        self.assertEqual(rc, 0, out)
        self.assertIn("none None\n", out)
        self.assertIn("why the extension module was not found or did not load "
                      "(/nonexistent/ring_fast.so: missing; %s: " % self.not_elf, out)
        self.assertIn("invalid ELF header)\n", out)
        self.assertIn("loaded offloadd._ring_fast None\n", out)


if __name__ == "__main__":
    unittest.main()
