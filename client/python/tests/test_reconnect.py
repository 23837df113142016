"""The Python Client recovers by itself from a daemon SIGKILLed and restarted on its shared pool:
it reconnects, resumes, registers its regions again, re-sends what was not answered and lets
requests made during the outage wait (docs/failure-modes.md).

Run: tests/python/run.sh -k reconnect.
"""

import os
import secrets
import struct
import time
import unittest

from daemon_fixture import Daemon

from offloadd import errors
from offloadd.client import URGENT, Client
from offloadd.shm import ShmRegion

SLOT = 200_000
HEADER_BYTES, RECORD_BYTES = 4096, 64  # the shared pool's layout (server/pool/block_table.h)


class ReconnectTest(unittest.TestCase):
    def setUp(self):
        self.pool = "offloadd-py-reconnect-%d-%s" % (os.getpid(), secrets.token_hex(4))
        self.extra = ("--pool_shm_name", self.pool, "--resume_grace_seconds", "60")
        self.daemons, self.regions = [], []

    def tearDown(self):
        for d in self.daemons:
            d.stop()
        for r in self.regions:
            r.close()
        try:
            os.unlink("/dev/shm/" + self.pool)
        except OSError:
            pass

    def start(self, sock=None):
        d = Daemon("64MiB", self.extra, sock=sock)
        self.daemons.append(d)
        return d

    def region(self, size=1 << 20):
        r = ShmRegion(size)
        self.regions.append(r)
        return r

    def client_with_source(self, daemon, payloads, **kw):
        client = Client(daemon.sock, "reconnect", "cpu", **kw)
        src, dst = self.region(), self.region()
        for i, p in enumerate(payloads):
            src.mm[i * SLOT:i * SLOT + len(p)] = p
        # Names kept (relink): the daemon after the restart maps the same objects again.
        sid = client.register_shm(src.name, src.size_bytes, relink=src.relink)
        did = client.register_shm(dst.name, dst.size_bytes, relink=dst.relink)
        return client, src, dst, sid, did

    def test_resends_unanswered_and_outage_requests_bit_exact(self):
        first = self.start()
        payloads = [os.urandom(100_000 + i) for i in range(5)]
        client, src, dst, sid, did = self.client_with_source(first, payloads)
        self.assertEqual(client.resume_grace_seconds, 60)
        confirmed = [client.offload(sid, i * SLOT, len(p)).result(10).block_id
                     for i, p in enumerate(payloads[:3])]
        first.kill()
        # Issued while no daemon serves the socket: they wait instead of failing.
        late = client.offload(sid, 3 * SLOT, len(payloads[3]))
        reloads = [client.reload(b, did, i * SLOT, URGENT) for i, b in enumerate(confirmed)]
        time.sleep(0.3)
        self.assertFalse(late.done())
        self.assertTrue(client.alive)
        second = self.start(sock=first.sock)
        late_id = late.result(30).block_id
        for r in reloads:
            r.result(30)
        for i, p in enumerate(payloads[:3]):
            self.assertEqual(bytes(dst.mm[i * SLOT:i * SLOT + len(p)]), p)
        # After the resume: the regions still answer to the client's ids.
        client.reload(late_id, did, 3 * SLOT, URGENT).result(10)
        self.assertEqual(bytes(dst.mm[3 * SLOT:3 * SLOT + len(payloads[3])]), payloads[3])
        self.assertEqual(client.counters.resumes, 1)
        self.assertEqual(client.blocks_resumed, 3)
        self.assertEqual(second.stats().blocks, 4)  # nothing stored twice
        for b in confirmed + [late_id]:
            client.release(b).result(10)
        self.assertEqual(second.stats().blocks, 0)
        client.close()

    def test_the_resumed_session_takes_a_new_request_ring(self):
        """The ring ends with the connection that attached it; the resume's Hello offers a new
        one, so requests after the resume travel on a ring again, bit-exact."""
        first = self.start()
        payloads = [os.urandom(50_000 + i) for i in range(2)]
        client, src, dst, sid, did = self.client_with_source(first, payloads)
        self.assertTrue(client.ring_active, client.ring_error)
        old_ring = client._ring_native
        before = client.offload(sid, 0, len(payloads[0])).result(10).block_id
        first.kill()
        second = self.start(sock=first.sock)
        after = client.offload(sid, SLOT, len(payloads[1])).result(30).block_id  # waits
        self.assertEqual(client.counters.resumes, 1)
        self.assertTrue(client.ring_active, client.ring_error)
        self.assertIsNot(client._ring_native, old_ring)
        sent = client.counters.ring_requests_sent
        for i, b in enumerate((before, after)):
            self.assertTrue(client.reload(b, did, i * SLOT, URGENT, release_after=True)
                            .result(10).released)
            self.assertEqual(bytes(dst.mm[i * SLOT:i * SLOT + len(payloads[i])]), payloads[i])
        self.assertEqual(client.counters.ring_requests_sent, sent + 2)
        self.assertEqual(second.stats().blocks, 0)
        client.close()

    def test_block_stored_but_not_confirmed_is_released_not_kept_twice(self):
        first = self.start()
        payloads = [os.urandom(50_000), os.urandom(60_000)]
        client, src, dst, sid, did = self.client_with_source(first, payloads)
        kept = client.offload(sid, 0, len(payloads[0])).result(10).block_id
        swallowed = client.offload(sid, SLOT, len(payloads[1])).result(10).block_id
        # As if the crash had swallowed this OffloadDone: the daemon recorded the block, the
        # client never learned its id.
        with client._lock:
            client._confirmed.discard(swallowed)
        first.kill()
        second = self.start(sock=first.sock)
        client.reload(kept, did, 0, URGENT).result(30)
        self.assertTrue(client.drain(10))
        self.assertEqual(client.counters.orphans_released, 1)
        self.assertEqual(second.stats().blocks, 1)
        self.assertEqual(bytes(dst.mm[:len(payloads[0])]), payloads[0])
        client.close()

    def test_corrupt_record_is_data_loss_for_that_block_only(self):
        first = self.start()
        payloads = [os.urandom(70_000 + i) for i in range(3)]
        client, src, dst, sid, did = self.client_with_source(first, payloads)
        ids = [client.offload(sid, i * SLOT, len(p)).result(10).block_id
               for i, p in enumerate(payloads)]
        first.kill()
        self.assertTrue(corrupt_record(self.pool, ids[1]))
        self.start(sock=first.sock)
        futures = [client.reload(b, did, i * SLOT, URGENT) for i, b in enumerate(ids)]
        for i in (0, 2):
            futures[i].result(30)
            self.assertEqual(bytes(dst.mm[i * SLOT:i * SLOT + len(payloads[i])]), payloads[i])
        with self.assertRaises(errors.OffloaddError) as lost:
            futures[1].result(30)
        self.assertEqual(lost.exception.code, errors.DATA_LOSS)
        self.assertTrue(client.alive)
        client.close()

    def test_outage_longer_than_reconnect_seconds_fails_clearly(self):
        first = self.start()
        client, src, dst, sid, did = self.client_with_source(
            first, [b"x" * 1000], reconnect_seconds=1.0)
        block = client.offload(sid, 0, 1000).result(10).block_id
        first.kill()
        waiting = client.reload(block, did, 0, URGENT)
        t0 = time.monotonic()
        with self.assertRaises(errors.DaemonUnavailable) as gone:
            waiting.result(30)
        self.assertLess(time.monotonic() - t0, 10)
        self.assertIn("did not come back within 1.0 s", str(gone.exception))
        self.assertFalse(client.alive)
        client.close()

    def test_anonymous_pool_ends_the_session_at_once(self):
        d = Daemon("64MiB")
        self.daemons.append(d)
        client = Client(d.sock, "anon", "cpu")
        self.assertEqual(client.resume_grace_seconds, 0)
        d.kill()
        deadline = time.monotonic() + 10
        while client.alive and time.monotonic() < deadline:
            time.sleep(0.02)
        self.assertFalse(client.alive)
        with self.assertRaises(errors.DaemonUnavailable):
            client.release(1).result(1)
        client.close()


def corrupt_record(pool, block_id):
    """Flips a byte of ``block_id``'s record in the shared pool object; True when found."""
    with open("/dev/shm/" + pool, "r+b") as f:
        data = f.read(16 << 20)
        for off in range(HEADER_BYTES, len(data) - RECORD_BYTES, RECORD_BYTES):
            if struct.unpack_from("<Q", data, off)[0] == block_id:
                f.seek(off + 33)  # inside the bytes field
                f.write(bytes([data[off + 33] ^ 0x5a]))
                return True
    return False


if __name__ == "__main__":
    unittest.main()
