"""A crash-restart on a shared pool (pool_shm_name) that is large next to the host's free memory.

After a SIGKILL the pool object stays in /dev/shm with every block, and the kernel no longer
counts its memory in MemAvailable. `offloadd --check-config` (the systemd unit's ExecStartPre and
the container's entrypoint run it before every start) must then pass, and the restarted daemon
must adopt every block, even though a fresh pool of that size would not fit.

The host's memory is made small, not the pool big: the daemon and the check run in a private
mount namespace where /proc/meminfo is a copy whose MemAvailable is half the pool
(`unshare --mount`, a bind mount; needs root). The same meminfo refuses a fresh pool of that
size, which shows the small MemAvailable is in force.
Run: tests/python/run.sh -k large_pool
"""

import os
import re
import secrets
import shutil
import subprocess
import tempfile
import unittest

from daemon_fixture import Daemon, daemon_bin

from offloadd.client import URGENT, Client
from offloadd.shm import ShmRegion

POOL_BYTES = 64 << 20
BLOCK_BYTES = 4 << 20
BLOCKS = 12  # 48 MiB of the 64 MiB pool


def can_bind_mount():
    return os.geteuid() == 0 and shutil.which("unshare") is not None


@unittest.skipUnless(can_bind_mount(), "needs root and unshare (a private /proc/meminfo)")
class LargePoolRestartTest(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="ofd-large-")
        self.pool = "offloadd-py-large-%d-%s" % (os.getpid(), secrets.token_hex(4))
        self.daemons = []
        with open("/proc/meminfo") as f:
            text = f.read()
        # MemAvailable half the pool; everything else as the host has it.
        fake = re.sub(r"(?m)^MemAvailable:\s+\d+ kB$",
                      "MemAvailable:   %d kB" % (POOL_BYTES // 2 // 1024), text)
        self.meminfo = os.path.join(self.tmp, "meminfo")
        with open(self.meminfo, "w") as f:
            f.write(fake)
        # Execs the rest of its command line with the small MemAvailable.
        self.small_memory = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                             'mount --bind "$0" /proc/meminfo && exec "$@"', self.meminfo]
        self.conf = os.path.join(self.tmp, "offloadd.conf")
        with open(self.conf, "w") as f:
            f.write('backend: "shm"\npool_bytes: %d\npool_shm_name: "%s"\n'
                    'resume_grace_seconds: 60\nmetrics_address: ""\n' % (POOL_BYTES, self.pool))

    def tearDown(self):
        for d in self.daemons:
            d.stop()
        for name in (self.pool, self.pool + "-fresh"):
            try:
                os.unlink("/dev/shm/" + name)
            except OSError:
                pass
        shutil.rmtree(self.tmp)

    def check_config(self, sock, *flags):
        return subprocess.run(self.small_memory + [daemon_bin(), "--check-config", self.conf,
                                                   "--socket_path", sock] + list(flags),
                              capture_output=True, text=True, timeout=60)

    def test_check_config_passes_and_every_block_survives(self):
        first = Daemon("%d" % POOL_BYTES, ("--pool_shm_name", self.pool,
                                            "--resume_grace_seconds", "60"))
        self.daemons.append(first)
        client = Client(first.sock, "large-pool", "cpu", reconnect=False)
        src = ShmRegion(BLOCKS * BLOCK_BYTES)
        self.addCleanup(src.close)
        payloads = [os.urandom(BLOCK_BYTES) for _ in range(BLOCKS)]
        for i, p in enumerate(payloads):
            src.mm[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES] = p
        rid = client.register_shm(src.name, src.size_bytes)
        ids = [client.offload(rid, i * BLOCK_BYTES, BLOCK_BYTES).result(30).block_id
               for i in range(BLOCKS)]
        token = client.resume_token
        first.proc.kill()  # a crash: the pool object and its records stay
        first.proc.wait()
        client.close()

        # The memory check is in force: a fresh pool of this size does not fit.
        fresh = self.check_config(first.sock, "--pool_shm_name", self.pool + "-fresh")
        self.assertEqual(fresh.returncode, 1, fresh.stdout + fresh.stderr)
        self.assertIn("larger than MemAvailable", fresh.stderr)
        # The surviving pool needs no new memory: the check passes, its advice is not needed.
        r = self.check_config(first.sock)
        self.assertEqual(r.returncode, 0, r.stdout + r.stderr)
        self.assertIn("is valid and this host can run it", r.stdout)

        second = Daemon("%d" % POOL_BYTES, ("--pool_shm_name", self.pool,
                                             "--resume_grace_seconds", "60"),
                        sock=first.sock, prefix=self.small_memory)
        self.daemons.append(second)
        resumed = Client.resume(second.sock, token, "large-pool", "cpu", total_seconds=20)
        self.assertEqual(resumed.blocks_resumed, BLOCKS)
        dst = ShmRegion(BLOCKS * BLOCK_BYTES)
        self.addCleanup(dst.close)
        did = resumed.register_shm(dst.name, dst.size_bytes)
        for i, bid in enumerate(ids):
            resumed.reload(bid, did, i * BLOCK_BYTES, URGENT, release_after=True).result(30)
        for i, p in enumerate(payloads):
            self.assertEqual(bytes(dst.mm[i * BLOCK_BYTES:(i + 1) * BLOCK_BYTES]), p,
                             "block %d changed across the restart" % i)
        self.assertEqual(second.stats().blocks, 0)
        resumed.close()


if __name__ == "__main__":
    unittest.main()
