"""offloadd.shm: shared-memory regions and the staging sub-allocator (no daemon needed)."""

import os
import threading
import unittest

import daemon_fixture  # noqa: F401  (sys.path)

from offloadd.shm import ALIGN_BYTES, ShmRegion, StagingArena


class FakeRegistrar:
    def __init__(self):
        self.registered, self.unregistered = [], []

    def register(self, name, size):
        assert os.path.exists("/dev/shm" + name), "registered before the object exists"
        self.registered.append((name, size))
        return 100 + len(self.registered)

    def unregister(self, rid):
        self.unregistered.append(rid)


class ShmRegionTest(unittest.TestCase):
    def test_create_map_unlink(self):
        r = ShmRegion(1 << 16)
        self.assertTrue(r.name.startswith("/offloadd-py-%d-" % os.getpid()))
        self.assertTrue(os.path.exists(r.path))
        self.assertEqual(os.stat(r.path).st_mode & 0o777, 0o600)
        r.mm[100:105] = b"abcde"
        r.unlink()
        self.assertFalse(os.path.exists(r.path))
        self.assertEqual(r.mm[100:105], b"abcde")  # the mapping outlives the name
        r.close()


class StagingArenaTest(unittest.TestCase):
    def setUp(self):
        self.reg = FakeRegistrar()
        self.arena = StagingArena(self.reg.register, grow_bytes=1 << 20, max_bytes=4 << 20,
                                  unregister=self.reg.unregister)

    def tearDown(self):
        self.arena.close()

    def test_first_region_is_created_and_registered_on_demand(self):
        self.assertEqual(self.arena.regions, 0)
        slot = self.arena.alloc(1000)
        self.assertEqual(self.arena.regions, 1)
        self.assertEqual(self.reg.registered[0][1], 1 << 20)
        self.assertEqual(slot.region_id, 101)
        self.assertEqual((slot.offset, slot.nbytes, slot.size), (0, 1000, 1024))
        self.assertFalse(os.path.exists(slot.region.path), "name unlinked after registering")

    def test_alignment_first_fit_and_coalescing(self):
        a, b, c = (self.arena.alloc(n) for n in (100, 200, 300))
        # 100 -> 128 and 200 -> 256 aligned bytes
        self.assertEqual([s.offset for s in (a, b, c)], [0, 128, 384])
        for s in (a, b, c):
            self.assertEqual(s.offset % ALIGN_BYTES, 0)
        self.arena.free(b)
        d = self.arena.alloc(150)  # 192 aligned bytes: first fit is b's 256-byte hole
        self.assertEqual(d.offset, 128)
        self.arena.free(a)
        self.arena.free(d)
        self.arena.free(c)
        self.assertEqual(self.arena.free_spans(a.region), [[0, 1 << 20]])
        self.assertEqual(self.arena.used_bytes, 0)
        self.assertEqual(self.arena.peak_used_bytes, 128 + 256 + 320)

    def test_grows_with_a_new_region_and_reuses_after_free(self):
        big = self.arena.alloc(900 << 10)
        second = self.arena.alloc(300 << 10)
        self.assertEqual(self.arena.regions, 2)
        self.assertIsNot(big.region, second.region)
        huge = self.arena.alloc((1 << 20) + 1)  # larger than grow_bytes: a region of its size
        self.assertEqual(huge.region.size_bytes, 2 << 20)
        self.assertEqual(self.arena.capacity_bytes, 4 << 20)
        for s in (big, second, huge):
            self.arena.free(s)
        again = self.arena.alloc(900 << 10)
        self.assertEqual(self.arena.regions, 3)  # no growth: freed space is reused
        self.arena.free(again)

    def test_full_arena_waits_then_times_out(self):
        slots = [self.arena.alloc(1 << 20) for _ in range(4)]
        with self.assertRaises(TimeoutError):
            self.arena.alloc(1 << 20, timeout=0.05)
        threading.Timer(0.05, self.arena.free, args=(slots[1],)).start()
        s = self.arena.alloc(1 << 20, timeout=5)
        self.assertIs(s.region, slots[1].region)

    def test_view_reads_and_writes_the_slot(self):
        s = self.arena.alloc(8)
        self.arena.view(s)[:] = b"12345678"
        self.assertEqual(bytes(s.region.mm[s.offset:s.offset + 8]), b"12345678")

    def test_close_unregisters(self):
        self.arena.alloc(10)
        self.arena.alloc(2 << 20)
        self.arena.close()
        self.assertEqual(self.reg.unregistered, [101, 102])


if __name__ == "__main__":
    unittest.main()
