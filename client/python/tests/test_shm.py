"""offloadd.shm: shared-memory regions and the staging sub-allocator (no daemon needed)."""

import concurrent.futures
import os
import threading
import unittest
from unittest import mock

from daemon_fixture import run_python

from offloadd import errors
from offloadd.shm import (ALIGN_BYTES, ShmRegion, StagingArena, pid_namespace_id,
                          proc_shows_own_pids, shm_access, sweep_stale)

_readlink = os.readlink


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


class SweepStaleTest(unittest.TestCase):
    """Names of dead processes of this PID namespace go; another namespace's names stay (the
    same pid may be a live process there: /dev/shm is shared by containers and sandboxes)."""

    def test_only_this_namespaces_dead_names_are_removed(self):
        pid = os.fork()
        if pid == 0:
            os._exit(0)
        os.waitpid(pid, 0)  # its pid is now free
        ns = pid_namespace_id()
        self.assertGreater(ns, 0)
        prefix = "offloadd-pysweep%d" % os.getpid()
        dead = "/dev/shm/%s-%d-%d-0-deadbeef" % (prefix, pid, ns)
        foreign = "/dev/shm/%s-%d-%d-0-deadbeef" % (prefix, pid, ns + 1)
        live = "/dev/shm/%s-%d-%d-0-deadbeef" % (prefix, os.getpid(), ns)
        for p in (dead, foreign, live):
            open(p, "w").close()
            self.addCleanup(lambda p=p: os.path.exists(p) and os.unlink(p))
        self.assertEqual(sweep_stale(prefix), 1)
        self.assertFalse(os.path.exists(dead))
        self.assertTrue(os.path.exists(foreign))
        self.assertTrue(os.path.exists(live))
        r = ShmRegion(4096, prefix=prefix)
        self.addCleanup(r.close)
        self.assertTrue(r.name.startswith("/%s-%d-%d-" % (prefix, os.getpid(), ns)), r.name)


class NamesLeftByAProcessTest(unittest.TestCase):
    """A process's kept names go at its normal exit (an arena whose daemon died is never
    closed); a killed process's names go with the next arena, keeping names or not."""

    CHILD = ("import os, signal; from offloadd.shm import ShmRegion; r = ShmRegion(4096); "
             "print(r.path, flush=True); %s")

    def child_name(self, ending):
        r = run_python(self.CHILD % ending)
        path = r.stdout.split()[0]
        self.addCleanup(lambda: os.path.exists(path) and os.unlink(path))
        return r.returncode, path

    def test_a_normal_exit_removes_the_names(self):
        rc, path = self.child_name("raise SystemExit(3)")
        self.assertEqual(rc, 3)
        self.assertFalse(os.path.exists(path))

    def test_nothing_is_swept_where_proc_is_not_this_pid_namespaces(self):
        """In a PID namespace that kept its parent's /proc, /proc/<pid> names no process of
        ours: the sweep took live processes' names for dead ones."""
        rc, path = self.child_name("os.kill(os.getpid(), signal.SIGTERM)")
        self.assertEqual(rc, -15)
        with mock.patch("os.readlink", side_effect=lambda p, *a, **k: (
                str(os.getpid() + 1) if p == "/proc/self" else _readlink(p, *a, **k))):
            self.assertFalse(proc_shows_own_pids())
            self.assertEqual(sweep_stale(), 0)
        self.assertTrue(os.path.exists(path))
        self.assertTrue(proc_shows_own_pids())
        self.assertEqual(sweep_stale(), 1)
        self.assertFalse(os.path.exists(path))

    def test_a_killed_process_names_go_with_the_next_arena(self):
        rc, path = self.child_name("os.kill(os.getpid(), signal.SIGTERM)")
        self.assertEqual(rc, -15)
        self.assertTrue(os.path.exists(path))
        arena = StagingArena(FakeRegistrar().register)  # not keeping names
        self.assertFalse(os.path.exists(path))
        arena.close()


class ShmAccessTest(unittest.TestCase):
    """Which mode and group the staging objects get, for the daemon's uid."""

    def setUp(self):
        self.env = {k: os.environ.pop(k) for k in ("OFFLOADD_SHM_MODE", "OFFLOADD_SHM_GROUP")
                    if k in os.environ}
        self.sock = "/tmp/ofd-access-%d" % os.getpid()
        with open(self.sock, "w"):
            pass
        os.chown(self.sock, -1, os.getegid())

    def tearDown(self):
        os.environ.update(self.env)
        os.unlink(self.sock)

    def test_private_for_a_root_daemon_or_our_own_uid(self):
        self.assertEqual(shm_access(self.sock, 0), (0o600, None))
        self.assertEqual(shm_access(self.sock, os.geteuid()), (0o600, None))
        self.assertEqual(shm_access(self.sock, None), (0o600, None))

    def test_group_of_the_socket_for_a_daemon_of_another_uid(self):
        self.assertEqual(shm_access(self.sock, 10001), (0o660, os.getegid()))
        self.assertEqual(shm_access("/nonexistent/x.sock", 10001), (0o660, None))

    def test_explicit_and_environment_settings(self):
        self.assertEqual(shm_access(self.sock, 0, mode="0660", group=str(os.getegid())),
                         (0o660, os.getegid()))
        os.environ["OFFLOADD_SHM_MODE"] = "0600"
        self.assertEqual(shm_access(self.sock, 10001), (0o600, None))
        os.environ["OFFLOADD_SHM_MODE"] = "0666"
        with self.assertRaises(errors.OffloaddError) as e:
            shm_access(self.sock, 10001)
        self.assertEqual(e.exception.code, errors.INVALID_ARGUMENT)
        del os.environ["OFFLOADD_SHM_MODE"]
        with self.assertRaises(errors.OffloaddError):
            shm_access(self.sock, 10001, group="no-such-group-offloadd")

    def test_region_gets_the_group_and_mode_before_anyone_can_open_it(self):
        r = ShmRegion(1 << 20, mode=0o660, gid=os.getegid())
        try:
            st = os.stat(r.path)
            self.assertEqual((st.st_mode & 0o777, st.st_gid), (0o660, os.getegid()))
        finally:
            r.close()
        r = ShmRegion(1 << 20)
        try:
            self.assertEqual(os.stat(r.path).st_mode & 0o777, 0o600)
        finally:
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

    def test_an_alloc_that_may_not_wait_never_grows(self):
        with self.assertRaises(TimeoutError):
            self.arena.alloc(1000, timeout=0)
        self.assertEqual((self.arena.regions, self.reg.registered), (0, []))
        self.arena.free(self.arena.alloc(1000))  # grows
        slot = self.arena.alloc(1000, timeout=0)  # room in the region: no wait needed
        self.assertEqual((self.arena.regions, len(self.reg.registered)), (1, 1))
        self.arena.free(slot)

    def test_a_registration_still_queued_keeps_the_name_until_its_answer(self):
        answer, names = concurrent.futures.Future(), []

        def register(name, size, timeout=None):
            names.append(name)
            e = TimeoutError("no answer within %s s" % timeout)
            e.answer = answer
            raise e

        arena = StagingArena(register, grow_bytes=1 << 20, max_bytes=4 << 20)
        with self.assertRaises(TimeoutError):
            arena.alloc(1000, timeout=0.5)
        self.assertEqual(arena.regions, 0)
        self.assertTrue(os.path.exists("/dev/shm" + names[0]), "the daemon may still open it")
        answer.set_result(None)
        self.assertFalse(os.path.exists("/dev/shm" + names[0]))
        arena.close()

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

    def test_free_after_close_drops_the_slot(self):
        # A reload abandoned when an admin ended the session frees its slot from the reply's
        # callback, after the transport closed the arena: no KeyError from a callback thread.
        s = self.arena.alloc(1000)
        self.arena.close()
        self.arena.free(s)
        self.assertEqual(self.arena.capacity_bytes, 0)

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
