"""The native core's ctypes binding (offloadd/_native.py) against the real daemon binary: the
session's Hello and region go on a raw gRPC stream, offloads, reloads and releases on the ring
through liboffloadd_core.so (built by ``bazel build //client/core:liboffloadd_core.so``)."""

import os
import queue
import threading
import unittest

import grpc

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


class NativeRingTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Daemon("64MiB")

    @classmethod
    def tearDownClass(cls):
        cls.daemon.stop()

    def setUp(self):
        self.ring = _native.NativeRing(64)
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
        with self.assertRaises(ConnectionError):
            self.ring.release(1)
        self.stream = _Stream(self.daemon.sock)  # for tearDown


if __name__ == "__main__":
    unittest.main()
