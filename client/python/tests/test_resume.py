"""Client.resume against the real daemon on a shared pool: SIGKILL it, start another on the same
pool object, and the blocks the client was told are stored reload bit-exact.

Run: tests/python/run.sh (or python -m unittest discover -s client/python/tests).
"""

import os
import secrets
import unittest

from daemon_fixture import Daemon

from offloadd import errors
from offloadd.client import URGENT, Client
from offloadd.shm import ShmRegion


class ResumeTest(unittest.TestCase):
    def setUp(self):
        self.pool = "offloadd-py-resume-%d-%s" % (os.getpid(), secrets.token_hex(4))
        self.extra = ("--pool_shm_name", self.pool, "--resume_grace_seconds", "60")
        self.daemons = []

    def tearDown(self):
        for d in self.daemons:
            d.stop()
        try:
            os.unlink("/dev/shm/" + self.pool)
        except OSError:
            pass

    def start(self):
        d = Daemon("64MiB", self.extra)
        self.daemons.append(d)
        return d

    def test_blocks_survive_sigkill_and_reload_bit_exact(self):
        first = self.start()
        client = Client(first.sock, "resume", "cpu")
        self.assertEqual(len(client.resume_token), 16)
        src = ShmRegion(1 << 20)
        payloads = [os.urandom(100_000 + i) for i in range(4)]
        for i, p in enumerate(payloads):
            src.mm[i * 200_000:i * 200_000 + len(p)] = p
        rid = client.register_shm(src.name, src.size_bytes)
        ids = [client.offload(rid, i * 200_000, len(p)).result(10).block_id
               for i, p in enumerate(payloads)]
        token = client.resume_token
        first.proc.kill()
        first.proc.wait()
        client.close()

        second = self.start()
        with self.assertRaises(errors.OffloaddError) as forged:
            Client.resume(second.sock, b"\x00" * 16, device_id="cpu", total_seconds=5)
        self.assertEqual(forged.exception.code, errors.NOT_FOUND)
        resumed = Client.resume(second.sock, token, "resumed", "cpu", total_seconds=10)
        self.assertEqual(resumed.blocks_resumed, len(ids))
        self.assertEqual(resumed.resume_token, token)
        dst = ShmRegion(1 << 20)
        did = resumed.register_shm(dst.name, dst.size_bytes)
        for i, (bid, p) in enumerate(zip(ids, payloads)):
            resumed.reload(bid, did, i * 200_000, URGENT, release_after=True).result(10)
            self.assertEqual(bytes(dst.mm[i * 200_000:i * 200_000 + len(p)]), p)
        self.assertEqual(second.stats().blocks, 0)
        resumed.close()
        for r in (src, dst):
            r.unlink()
            r.close()


if __name__ == "__main__":
    unittest.main()
