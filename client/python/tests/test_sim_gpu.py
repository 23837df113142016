"""The CUDA data path on a simulated client GPU (offloadd.testing.sim_gpu) against a cuda-sim
daemon.

The simulated GPU's memory, segments and interprocess events live in a shared table the daemon's
SimCudaApi reads and writes (common/sim_gpu_table.h), and the daemon moves the bytes of
its copies when its timing model says they complete, so everything the CUDA transport does is
checked here with real bytes: the event protocol both ways (no host wait for a prefetched reload;
an offload waits for its own producer only), mappings that follow the allocator (empty_cache and
the retry after a failed allocation between steps, a client freeing memory under a copy),
expandable segments (one documented error, also when switched on at run time), and CUDA's error
state after a failed export. Every time figure is SIMULATED.
"""

import contextlib
import gc
import os
import threading
import time
import unittest
from unittest import mock
import warnings

import torch
from daemon_fixture import DaemonTestCase, run_python

import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q
from offloadd import cuda, errors
from offloadd.testing import sim_gpu
from offloadd.client import Client, PREFETCH, URGENT
from offloadd.torch import _endpoint, _store, _transport

torch.set_num_threads(2)
MIB = 1 << 20



def linear_relu_grads(layers, x, ctx):
    """The parameters' gradients of ``layers`` (Linear layers, each followed by relu) run on
    ``x`` with ``ctx`` entered around forward; the gradients are cleared after."""
    y = x
    with ctx:
        for layer in layers:
            y = torch.relu(layer(y))
    y.sum().backward()
    g = [p.grad.clone() for layer in layers for p in layer.parameters()]
    for layer in layers:
        layer.zero_grad(set_to_none=True)
    return g


def within_seconds(seconds, fn, *args):
    """fn(*args) on a thread of its own; fails the test when it has not returned in time."""
    out = []
    worker = threading.Thread(target=lambda: out.append(fn(*args)), daemon=True)
    worker.start()
    worker.join(seconds)
    if worker.is_alive():
        raise AssertionError("%r still running after %g s" % (fn, seconds))
    return out[0]


def settle(seconds):
    """A pause in a test's wait for the store to learn of answers: the answers on the request
    rings are taken first (as the next hook call would), then ``seconds`` pass."""
    _endpoint.pump()
    time.sleep(seconds)

class SimAllocatorTest(unittest.TestCase):
    """The simulated caching allocator and streams, without a daemon."""

    def setUp(self):
        self.gpu = sim_gpu.SimGpu(devices=1, device_bytes=64 * MIB)

    def tearDown(self):
        gc.collect()
        self.gpu.close()

    def segments(self):
        return sorted(s.size for s in self.gpu.allocators[0].segments.values())

    def test_segment_sizes_follow_torch_and_freed_blocks_are_reused(self):
        a = self.gpu.empty_strided((1024,), (1,), torch.float32)       # 4 KiB -> 2 MiB segment
        b = self.gpu.empty_strided((3 * MIB // 4,), (1,), torch.float32)  # 3 MiB -> 20 MiB
        c = self.gpu.empty_strided((9 * MIB // 2,), (1,), torch.float32)  # 18 MiB: > 17 left
        self.assertEqual(self.segments(), [2 * MIB, 18 * MIB, 20 * MIB])
        ptr = b.data_ptr()
        del b
        b2 = self.gpu.empty_strided((3 * MIB // 4,), (1,), torch.float32)
        self.assertEqual(b2.data_ptr(), ptr)  # the cached block, no new segment
        self.assertEqual(self.segments(), [2 * MIB, 18 * MIB, 20 * MIB])
        del a, c, b2

    def test_empty_cache_frees_unused_segments_and_an_allocation_that_does_not_fit_retries(self):
        keep = self.gpu.empty_strided((4 * MIB,), (1,), torch.float32)   # 16 MiB segment
        t = self.gpu.empty_strided((10 * MIB,), (1,), torch.float32)     # 40 MiB segment
        del t
        self.assertEqual(self.segments(), [16 * MIB, 40 * MIB])
        big = self.gpu.empty_strided((11 * MIB,), (1,), torch.float32)   # 44 MiB: needs the 40
        alloc = self.gpu.allocators[0]
        self.assertEqual(alloc.oom_retries, 1)
        self.assertEqual(self.segments(), [16 * MIB, 44 * MIB])
        del big
        self.gpu.empty_cache()
        self.assertEqual(self.segments(), [16 * MIB])
        with self.assertRaises(sim_gpu.SimOutOfMemoryError):
            self.gpu.empty_strided((13 * MIB,), (1,), torch.float32)
        del keep

    def test_a_block_recorded_on_a_stream_is_reused_only_after_that_stream_passed(self):
        side = self.gpu.new_stream(0)
        t = self.gpu.empty_strided((MIB,), (1,), torch.float32)
        ptr = t.data_ptr()
        side.kernel(0.2)
        self.gpu.record_stream(t, side)
        del t
        u = self.gpu.empty_strided((MIB,), (1,), torch.float32)
        self.assertNotEqual(u.data_ptr(), ptr)  # side's kernel may still use it
        side.synchronize()
        v = self.gpu.empty_strided((MIB,), (1,), torch.float32)
        self.assertEqual(v.data_ptr(), ptr)
        del u, v

    def test_the_launch_cost_knob_spins_the_launching_thread_and_delays_the_kernel(self):
        s = self.gpu.current_stream(0)
        self.assertEqual(self.gpu.launch_host_seconds, 0.0)  # off unless asked for
        s.kernel(0.0)
        self.assertEqual(self.gpu.launches, 1)
        self.gpu.launch_host_seconds = 0.02
        cpu0, wall0 = time.thread_time_ns(), time.monotonic_ns()
        for _ in range(5):
            s.kernel(0.0)
        # each launch used at least 20 ms of this thread's CPU, and a kernel (0 s long) ends
        # no earlier than its launch: the stream's tail is past all five launches' CPU
        self.assertGreaterEqual(time.thread_time_ns() - cpu0, 5 * 20_000_000)
        self.assertGreaterEqual(s.tail_ns - wall0, 5 * 20_000_000)
        self.assertEqual(self.gpu.launches, 6)

    def test_events_follow_modelled_kernels_and_a_wait_on_an_unrecorded_event_counts(self):
        s = self.gpu.current_stream(0)
        ev = self.gpu.new_event()
        s.kernel(0.1)
        s.record(ev)
        self.assertFalse(ev.query())
        other = self.gpu.new_stream(0)
        other.wait_event(ev, expect_seq=ev.seq)
        waited = other.synchronize()
        self.assertTrue(ev.query())
        self.assertGreater(waited, 0.05)
        other.wait_event(ev, expect_seq=ev.seq + 1)  # not recorded that far: orders nothing
        self.assertEqual(self.gpu.violations(sim_gpu.WAIT_UNRECORDED), 1)

    def test_a_wait_keeps_its_ordering_when_the_event_is_recorded_again(self):
        """A CUDA stream wait captures the record it follows, so a thread may hand the event to
        another request as soon as its wait is enqueued. The table keeps only an event's last
        record: the model released the waiting stream when the event was recorded again, and
        reloads read their destination before the daemon's copy landed (stale bytes)."""
        ev = self.gpu.new_event()
        self.gpu.table.record_event(ev.slot, sim_gpu.PENDING)  # the daemon's record, pending
        waiting = self.gpu.new_stream(0)
        waiting.wait_event(ev, expect_seq=ev.seq)
        done_at = []

        def daemon_completes():  # its copy ends 0.1 s after it writes the time
            time.sleep(0.05)
            done_at.append(time.monotonic_ns() + 100_000_000)
            self.gpu.table.signed[self.gpu.table.event_word(ev.slot) + 1] = done_at[0]
        daemon = threading.Thread(target=daemon_completes)
        daemon.start()
        self.gpu.new_stream(0).record(ev)  # recorded again while the first record is pending
        daemon.join()
        waiting.synchronize()
        self.assertGreaterEqual(time.monotonic_ns(), done_at[0])
        self.assertEqual(self.gpu.violations(sim_gpu.WAIT_UNRECORDED), 0)

    def test_own_cpu_counts_every_call_into_the_device_once_and_not_the_work_between(self):
        me = threading.get_ident()
        dev = sim_gpu.SimCudaDevice(self.gpu)
        t = self.gpu.empty_strided((MIB,), (1,), torch.float32)
        self.assertEqual((self.gpu.own_cpu_ns(), self.gpu.own_calls()), (0, 0))  # knob off
        self.gpu.count_own_cpu = True
        s0 = self.gpu.own_cpu_seconds(me)
        ev = dev.new_event()
        dev.record(ev, dev.current_stream())
        self.assertGreater(self.gpu.own_cpu_seconds(me), s0)  # the runtime calls are counted
        s1 = self.gpu.own_cpu_seconds(me)
        info = dev.describe(t.data_ptr())  # nests the runtime's and the SimGpu's describe
        self.assertEqual(info.device, 0)
        self.assertGreater(self.gpu.own_cpu_seconds(me), s1)
        self.assertEqual(self.gpu.own_calls(me), 4)  # new_event, current_stream, record, describe
        ns, cpu0 = self.gpu.own_cpu_ns(me), time.thread_time_ns()
        while time.thread_time_ns() - cpu0 < 20_000_000:  # the caller's own work: 20 ms
            pass
        self.assertEqual((self.gpu.own_cpu_ns(me), self.gpu.own_calls(me)), (ns, 4))
        self.gpu.launch_host_seconds = 0.02
        cpu0 = time.thread_time_ns()
        self.gpu.current_stream(0).kernel(0.0)  # the launch's spin is the caller's cost
        self.assertGreaterEqual(time.thread_time_ns() - cpu0, 20_000_000)
        self.assertLess(self.gpu.own_cpu_ns(me) - ns, 20_000_000)
        self.assertEqual(self.gpu.own_calls(me), 6)  # current_stream, kernel
        self.gpu.accounting_residual_ns(calls=50, rounds=3)  # counts nothing itself
        self.assertEqual(self.gpu.own_calls(me), 6)
        other = []
        th = threading.Thread(target=lambda: other.append(self.gpu.new_event()))
        th.start()
        th.join()
        self.assertEqual((self.gpu.own_calls(me), self.gpu.own_calls()), (6, 7))
        self.assertEqual(self.gpu.own_cpu_ns(), self.gpu.own_cpu_ns(me) +
                         self.gpu.own_cpu_ns(th.ident))
        del t

    def test_a_failed_export_leaves_no_last_error_and_the_raw_runtime_would(self):
        dev = sim_gpu.SimCudaDevice(self.gpu)
        outside = torch.empty(16)
        with self.assertRaises(errors.CudaExportError):
            dev.describe(outside.data_ptr())
        self.assertEqual(dev.rt.peek_last_error(), sim_gpu.CUDA_SUCCESS)
        with self.assertRaises(errors.CudaExportError):  # the runtime alone keeps it, as CUDA
            dev.rt.pointer_info(outside.data_ptr())
        self.assertEqual(dev.rt.peek_last_error(), sim_gpu.CUDA_ERROR_INVALID_VALUE)

    def test_expandable_segments_have_no_ipc_handle(self):
        self.gpu.set_allocator_settings("expandable_segments:True")
        dev = sim_gpu.SimCudaDevice(self.gpu)
        t = self.gpu.empty_strided((1024,), (1,), torch.float32)
        with self.assertRaises(errors.OffloadConfigError) as cm:
            dev.describe(t.data_ptr())
        self.assertIn("expandable_segments", str(cm.exception))
        self.assertEqual(dev.rt.peek_last_error(), sim_gpu.CUDA_SUCCESS)
        del t


class SimTableLifetimeTest(unittest.TestCase):
    """A SimGpu's table leaves /dev/shm with the SimGpu, or with the next one after its process
    was killed; a process has one SimGpu at a time."""

    KILLED = ("import os, signal; from offloadd.testing import sim_gpu; "
              "g = sim_gpu.SimGpu(devices=1, device_bytes=4 << 20); "
              "print(os.getpid(), flush=True); os.kill(os.getpid(), signal.%s)")

    def killed_table(self, signal_name):
        r = run_python(self.KILLED % signal_name)
        self.assertLess(r.returncode, 0, r.stderr[-2000:])  # died of the signal
        return sim_gpu.table_path(int(r.stdout.split()[0]))

    def test_tables_of_killed_processes_go_with_the_next_sim_gpu(self):
        killed = self.killed_table("SIGKILL")
        self.assertTrue(os.path.exists(killed))
        terminated = self.killed_table("SIGTERM")  # its SimGpu removed the killed one's table
        self.assertEqual([os.path.exists(killed), os.path.exists(terminated)], [False, True])
        gpu = sim_gpu.SimGpu(devices=1, device_bytes=4 * MIB)
        try:
            self.assertFalse(os.path.exists(terminated))
            self.assertTrue(os.path.exists(sim_gpu.table_path()))
        finally:
            gpu.close()
        self.assertFalse(os.path.exists(sim_gpu.table_path()))

    def test_nothing_is_swept_where_proc_is_not_this_pid_namespaces(self):
        killed = self.killed_table("SIGKILL")
        with mock.patch("offloadd.shm.proc_shows_own_pids", return_value=False):
            self.assertEqual(sim_gpu.sweep_stale_tables(), 0)
        self.assertTrue(os.path.exists(killed))
        self.assertGreaterEqual(sim_gpu.sweep_stale_tables(), 1)
        self.assertFalse(os.path.exists(killed))

    def test_a_stale_table_of_this_pid_is_replaced_and_a_second_sim_gpu_is_refused(self):
        with open(sim_gpu.table_path(), "wb") as f:  # as a dead process of this pid left it
            f.write(b"stale")
        gpu = sim_gpu.SimGpu(devices=1, device_bytes=4 * MIB)
        try:
            self.assertGreater(os.path.getsize(sim_gpu.table_path()), 4 * MIB)
            with self.assertRaises(FileExistsError) as e:
                sim_gpu.SimGpu(devices=1, device_bytes=4 * MIB)
            self.assertIn("one SimGpu at a time", str(e.exception))
            self.assertTrue(os.path.exists(sim_gpu.table_path()))  # the first one's, kept
        finally:
            gpu.close()
        second = sim_gpu.SimGpu(devices=1, device_bytes=4 * MIB)  # once the first is closed
        second.close()


class SimDaemonTestCase(DaemonTestCase):
    POOL_BYTES = "256MiB"
    EXTRA = ("--backend", "cuda-sim")
    DEVICE_BYTES = 256 * MIB

    def setUp(self):
        super().setUp()
        self.gpu = sim_gpu.SimGpu(devices=1, device_bytes=self.DEVICE_BYTES)
        sim_gpu.activate(self.gpu)

    def tearDown(self):
        from offloadd.torch import _endpoint
        _endpoint.reset_for_tests()
        sim_gpu.activate(None)
        gc.collect()
        self.gpu.close()

    def transport(self):
        client = Client(self.daemon.sock, device_id=sim_gpu.device_uuid(0))
        self.addCleanup(client.close)
        self.assertEqual(client.backend, "cuda")
        return _transport.CudaIpcTransport(client, sim_gpu.SimCudaDevice(self.gpu))

    def violations(self):
        return {k: self.gpu.violations(v) for k, v in (
            ("freed_while_mapped", sim_gpu.FREED_WHILE_MAPPED),
            ("copy_on_freed", sim_gpu.COPY_ON_FREED),
            ("wait_unrecorded", sim_gpu.WAIT_UNRECORDED),
            ("consumed_early", sim_gpu.CONSUMED_EARLY))}

    def assertNoViolations(self):
        self.assertEqual(self.violations(), dict.fromkeys(self.violations(), 0))


class SimEventProtocolTest(SimDaemonTestCase):
    def test_offload_then_reload_moves_the_bytes_and_the_stream_waits_on_the_done_event(self):
        tr = self.transport()
        t = torch.arange(4 * MIB, dtype=torch.float32)  # 16 MiB: two 8 MiB chunks
        meta = _transport.Meta(t)
        op = tr.start_offload(t, meta)
        block = op.future.result(30).block_id
        tr.finish_offload(op)
        rl = tr.prepare_reload(meta)
        tr.send_reload(rl, block, PREFETCH)
        reply = rl.done.result(30)
        self.assertTrue(reply.done_event_recorded)  # answered when the record was issued
        stats = ot.OffloadStats()
        out = tr.finish_reload(rl, meta, stats)
        self.assertEqual(stats.host_waits, 0)  # the answer was there: no host wait
        self.assertTrue(torch.equal(out, t))
        self.assertNoViolations()

    def test_a_ready_offload_is_not_held_behind_another_offloads_producer(self):
        tr = self.transport()
        compute = self.gpu.current_stream(0)
        other = self.gpu.new_stream(0, "other")
        dev = tr.dev

        def offload(t, stream):
            saved = dev.current_stream
            dev.current_stream = lambda device=None: stream
            try:
                return tr.start_offload(t, _transport.Meta(t))
            finally:
                dev.current_stream = saved

        # B first, behind a 50 ms (modelled) producer on the compute stream, plus twice what one
        # submit takes on this host (measured: the submits must fit before B's producer ends);
        # then A, whose producer on another stream is done. A must be stored before B's ends.
        t0 = time.monotonic()
        warm = offload(torch.full((MIB,), 0.5), other)
        tr.client.release(warm.future.result(30).block_id)
        tr.finish_offload(warm)
        submit_seconds = time.monotonic() - t0
        b = torch.full((MIB,), 2.0)
        a = torch.full((MIB,), 1.0)
        compute.kernel(0.05 + 2 * submit_seconds)
        b_ready_at = compute.tail_ns
        op_b = offload(b, compute)
        a_submitted_at = time.monotonic_ns()
        op_a = offload(a, other)
        op_a.future.result(30)
        a_done_at = time.monotonic_ns()
        op_b.future.result(30)
        b_done_at = time.monotonic_ns()
        for op in (op_a, op_b):
            tr.client.release(op.future.result().block_id)
            tr.finish_offload(op)
        print("SIMULATED: offload A (1 MiB) stored %.1f ms after its submit, %.1f ms before B's "
              "producer ended; B stored %.1f ms after that (one submit took %.1f ms here)"
              % ((a_done_at - a_submitted_at) / 1e6, (b_ready_at - a_done_at) / 1e6,
                 (b_done_at - b_ready_at) / 1e6, submit_seconds * 1e3))
        self.assertLess(a_done_at, b_ready_at)
        self.assertGreaterEqual(b_done_at, b_ready_at)  # B's bytes waited for its producer
        self.assertNoViolations()

    def test_a_reload_waits_for_its_destination_to_be_free(self):
        tr = self.transport()
        t = torch.arange(2 * MIB, dtype=torch.float32)
        meta = _transport.Meta(t)
        op = tr.start_offload(t, meta)
        block = op.future.result(30).block_id
        tr.finish_offload(op)
        tr.dev.reload_stream().kernel(0.05)  # the destination's stream is still busy
        rl = tr.prepare_reload(meta)
        ready_at = rl.ready_event.complete_at_ns()
        tr.send_reload(rl, block, URGENT)
        rl.done.result(30)
        answered_at = time.monotonic_ns()
        self.assertGreaterEqual(answered_at, ready_at)  # no chunk before the ready event
        out = tr.finish_reload(rl, meta, ot.OffloadStats())
        self.assertTrue(torch.equal(out, t))
        self.assertNoViolations()

    def test_an_interrupt_after_serving_a_tensor_in_flight_leaves_it_for_the_next_unpack(self):
        """A tensor served from the device while its offload copies is the handle's result
        from the moment it is marked served: an interrupt in the prefetch after it (a signal
        handler raising) leaves it there, rather than a handle with no tensor and, once its
        offload ends, no block."""
        from offloadd.torch._store import Store
        store = Store(name="served", threshold_bytes=4096, keep_last_n=0, prefetch=1,
                      strict=True, socket_path=self.daemon.sock)
        self.gpu.current_stream(0).kernel(0.3)  # the offloads wait for this producer
        ha = store.pack(torch.full((MIB,), 1.0))
        hb = store.pack(torch.full((MIB,), 2.0))
        real = Store._prefetch_before

        def interrupted(self, s):
            raise KeyboardInterrupt("a signal handler raised")
        with mock.patch.object(Store, "_prefetch_before", interrupted):
            with self.assertRaises(KeyboardInterrupt):
                store.unpack(hb)
        self.assertIs(Store._prefetch_before, real)
        self.assertTrue(ot.synchronize())  # both offloads ended: b's block was not needed
        tb = store.unpack(hb)
        self.assertTrue(torch.equal(tb, torch.full((MIB,), 2.0)))
        self.assertTrue(torch.equal(store.unpack(ha), torch.full((MIB,), 1.0)))
        st = store.stats.snapshot()
        self.assertEqual((st.offloaded, st.served_in_flight, st.reloaded), (2, 1, 1))
        del tb, ha, hb
        self.assertTrue(ot.synchronize())

    def test_a_prefetch_of_a_tensor_still_offloading_keeps_it_on_the_device_instead_of_a_reload(self):
        from offloadd.torch._store import Store
        store = Store(name="keep", threshold_bytes=4096, keep_last_n=0, prefetch=1, strict=True,
                      socket_path=self.daemon.sock)
        compute = self.gpu.current_stream(0)
        compute.kernel(0.3)  # both offloads wait for this (modelled) producer
        ha = store.pack(torch.full((MIB,), 1.0))
        hb = store.pack(torch.full((MIB,), 2.0))
        # b is still offloading: served from the device; its unpack prefetches a, which is
        # still offloading too: that PREFETCH waits for a's OffloadDone.
        tb = store.unpack(hb)
        self.assertEqual(store.stats.snapshot().served_in_flight, 1)
        deadline = time.monotonic() + 30
        while ha.op is not None and time.monotonic() < deadline:  # a's OffloadDone
            settle(0.01)
        ta = store.unpack(ha)
        deadline = time.monotonic() + 10  # b's OffloadDone may come after a's
        while store.stats.snapshot().offloaded < 2 and time.monotonic() < deadline:
            settle(0.01)
        st = store.stats.snapshot()
        print("SIMULATED: %s" % st.summary())
        self.assertTrue(torch.equal(tb, torch.full((MIB,), 2.0)))
        self.assertTrue(torch.equal(ta, torch.full((MIB,), 1.0)))
        # a was kept on the device when its offload finished, not reloaded
        self.assertEqual((st.offloaded, st.served_in_flight, st.reloaded, st.kept), (2, 2, 0, 0))
        self.assertEqual(st.host_waits, 0)
        del ta, tb, ha, hb
        ot.synchronize()
        deadline = time.monotonic() + 10
        while self.daemon.stats().blocks and time.monotonic() < deadline:
            settle(0.05)
        self.assertEqual(self.daemon.stats().blocks, 0)  # both blocks released
        self.assertNoViolations()

    def test_a_kept_tensor_never_unpacked_counts_as_an_unused_prefetch_not_as_served(self):
        from offloadd.torch._store import Store
        store = Store(name="keep-unused", threshold_bytes=4096, keep_last_n=0, prefetch=1,
                      strict=True, socket_path=self.daemon.sock)
        self.gpu.current_stream(0).kernel(0.3)
        ha = store.pack(torch.full((MIB,), 1.0))
        hb = store.pack(torch.full((MIB,), 2.0))
        tb = store.unpack(hb)  # served; prefetches a, still offloading
        deadline = time.monotonic() + 30
        while ha.op is not None and time.monotonic() < deadline:  # a kept at its OffloadDone
            settle(0.01)
        while hb.op is not None and time.monotonic() < deadline:  # b counted at its OffloadDone
            settle(0.01)
        del ha  # a branch backward never reached: a is never unpacked
        gc.collect()
        del tb, hb
        gc.collect()
        ot.synchronize()
        deadline = time.monotonic() + 10
        while (self.daemon.stats().blocks or store.stats.snapshot().prefetched_unused == 0 or
               store.stats.snapshot().offloaded < 2) and time.monotonic() < deadline:
            settle(0.05)
        st = store.stats.snapshot()
        self.assertEqual((st.offloaded, st.served_in_flight, st.reloaded, st.prefetched_unused),
                         (2, 1, 0, 1))
        self.assertEqual(self.daemon.stats().blocks, 0)
        self.assertNoViolations()


class SimThreadsTest(SimDaemonTestCase):
    def test_threads_sharing_one_device_reload_their_own_bytes(self):
        """Eight threads, each with its own context, on one simulated device: every reload's
        bytes are its tensor's (a reload's done event handed to another thread's request
        while a stream still waited on it made most runs fail a checksum with DATA_LOSS)."""
        torch.set_num_threads(1)
        errors_seen, mismatches = [], []

        def train(seed):
            torch.manual_seed(seed)
            layers = [torch.nn.Linear(256, 256) for _ in range(6)]
            x = torch.randn(1024, 256)

            def grads(ctx):
                return linear_relu_grads(layers, x, ctx)
            want = grads(contextlib.nullcontext())
            ctx = ot.offload_checkpoints(threshold_bytes=1 << 18, keep_last_n=0,
                                         socket_path=self.daemon.sock)
            for _ in range(3):
                try:
                    got = grads(ctx)
                except errors.OffloaddError as e:
                    errors_seen.append(str(e))
                    continue
                if not all(torch.equal(a, b) for a, b in zip(got, want)):
                    mismatches.append(seed)
            return ctx.stats.snapshot()
        stats = []
        threads = [threading.Thread(target=lambda i=i: stats.append(train(i))) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors_seen, [])
        self.assertEqual(mismatches, [])
        self.assertEqual(len(stats), 8)
        for st in stats:  # every step of every thread went through the daemon
            # Each of the 18 tensors was stored (OffloadDone counted) or served from the device
            # while its offload still copied: a step's last tensors can be, and when backward
            # ends before that OffloadDone arrives (a loaded machine) it is not counted.
            self.assertGreaterEqual(st.offloaded + st.served_in_flight, 3 * 6, st.summary())
            self.assertGreater(st.reloaded, 0, st.summary())
            self.assertEqual((st.fallbacks, st.lost, st.kept, st.idle_steps), (0, 0, 0, 0),
                             st.summary())
        self.assertNoViolations()


class _CountedLane:
    """An OffloadLane that counts the offloads it sent (calls["lane"]), the reloads it sent
    and finished (calls["lane_reload"], calls["lane_finish"])."""

    def __init__(self, lane, calls):
        self.lane, self.calls = lane, calls

    def offload(self, saved, step):
        sent = self.lane.offload(saved, step)
        self.calls["lane"] += sent
        return sent

    def reload(self, saved, priority):
        rl = self.lane.reload(saved, priority)
        self.calls["lane_reload"] += rl is not None
        return rl

    def finish(self, rl, saved):
        t = self.lane.finish(rl, saved)
        self.calls["lane_finish"] += t is not None
        return t


class SimRingAnswersTest(SimDaemonTestCase):
    """A step's requests submitted on the ring in C (offloadd._ring_fast.submit; the step's
    offloads after its first, and its reloads, by the store's OffloadLane) and its OffloadDone
    answers applied to the handles in C (offloadd._store_front.take_answers): the store's Python
    callback does not run for them, the handles end OFFLOADED with their blocks, the bytes come
    back, and with the C path switched off every answer goes through the callback instead (so
    the count can fail). ``calls``: "sent" offloads through Store._offload, "lane" through the
    lane; "lane_reload" and "lane_finish" the lane's reloads sent and finished."""

    def step(self, ctx, layers, x):
        calls = {"sent": 0, "lane": 0, "callback": 0, "lane_reload": 0, "lane_finish": 0}
        store = ctx.store
        offload, done = store._offload, store._offload_done

        def counted(name, fn):
            def call(*args):
                calls[name] += 1
                return fn(*args)
            return call
        store._offload, store._offload_done = counted("sent", offload), counted("callback", done)
        lane_for = _store._lane_for
        try:
            _store._lane_for = lambda ep: _CountedLane(lane_for(ep), calls)
            y = x
            with ctx:
                for layer in layers:
                    y = torch.relu(layer(y))
            deadline = time.monotonic() + 30
            while store.stats.offloaded < calls["sent"] + calls["lane"] and \
                    time.monotonic() < deadline:
                settle(0.01)  # every OffloadDone taken before backward: no reload attached
            states = {h.state for h in store.handles()}
            y.sum().backward()
        finally:
            del store._offload, store._offload_done
            _store._lane_for = lane_for
        self.assertTrue(ot.synchronize())
        return calls, states, [p.grad.clone() for layer in layers for p in layer.parameters()]

    def run_steps(self):
        torch.manual_seed(0)
        layers = [torch.nn.Linear(256, 256) for _ in range(4)]
        x = torch.randn(1024, 256)
        want = linear_relu_grads(layers, x, contextlib.nullcontext())
        ctx = ot.offload_checkpoints(threshold_bytes=1 << 18, keep_last_n=0, prefetch=0,
                                     socket_path=self.daemon.sock)
        calls, states, got = self.step(ctx, layers, x)
        self.assertTrue(all(torch.equal(a, b) for a, b in zip(got, want)))
        self.assertEqual((ctx.stats.fallbacks, ctx.stats.lost), (0, 0), ctx.stats.summary())
        sent = calls["sent"] + calls["lane"]
        self.assertEqual(ctx.stats.offloaded, sent, ctx.stats.summary())
        self.assertEqual(ctx.stats.reloaded, sent, ctx.stats.summary())
        self.assertNoViolations()
        ep = _endpoint.endpoints()[0]
        self.assertTrue(ep.client.ring_active, ep.client.ring_error)
        self.assertEqual(ep.transport.events.created, len(ep.transport.events._free))
        return calls, states

    def test_offload_answers_reach_the_handles_without_the_callback(self):
        in_python, real = [], Client._ring_submit

        def ring_submit(client, kind, *args, **kwargs):
            in_python.append(kind)
            return real(client, kind, *args, **kwargs)
        with mock.patch.object(Client, "_ring_submit", ring_submit):
            calls, states = self.run_steps()
        self.assertEqual(in_python, [])  # every request submitted in C (_ring_fast.submit)
        # The step's first offload goes through Store._offload, which makes the lane; so do
        # those whose memory lies in a segment not registered yet (the lane leaves them).
        self.assertGreaterEqual(calls["lane"], 3, calls)
        self.assertEqual(calls["sent"] + calls["lane"], 5, calls)
        # prefetch=0: every reload URGENT, its unpack waits for it in Python (none finishes
        # in C: test_offload_lane has those)
        self.assertGreaterEqual(calls["lane_reload"], 3, calls)
        self.assertEqual(calls["callback"], 0)
        self.assertEqual(states, {2})  # OFFLOADED, before backward

    def test_with_the_c_path_off_every_answer_runs_the_callback(self):
        from offloadd import client as client_mod
        with mock.patch.object(client_mod, "_take_answers", None):
            calls, states = self.run_steps()
        self.assertGreaterEqual(calls["sent"] + calls["lane"], 4)
        self.assertEqual(calls["callback"], calls["sent"] + calls["lane"])
        self.assertEqual(states, {2})

    def test_with_the_lanes_off_every_offload_goes_through_the_store(self):
        with mock.patch.object(_store, "_offload_lanes", False):
            calls, states = self.run_steps()
        self.assertEqual((calls["lane"], calls["lane_reload"], calls["lane_finish"]), (0, 0, 0))
        self.assertGreaterEqual(calls["sent"], 4)
        self.assertEqual(calls["callback"], 0)
        self.assertEqual(states, {2})


class SimUnpackReloadInCTest(SimDaemonTestCase):
    """The unpack hook's reload of a claimed handle in C (client/core/store_unpack.c): a handle
    whose reload a prefetch sent is reloaded, the next one prefetched, the reload finished by its
    lane and counted without Store._reload_claimed; a recoverable error there is the same
    DATA_LOSS as from the Python; a method replaced on the store sends the reload to Python."""

    def packed(self, n=4, prefetch=1):
        ctx = ot.offload_checkpoints(threshold_bytes=1 << 16, keep_last_n=0, prefetch=prefetch,
                                     socket_path=self.daemon.sock)
        xs = [self.gpu.empty_strided((1 << 16,), (1,), torch.float32) for _ in range(n)]
        for i, x in enumerate(xs):
            x.fill_(float(i + 1))
        handles = [ctx.pack_hook(x) for x in xs]
        self.assertTrue(ot.synchronize())
        self.assertEqual([h.state for h in handles], [_store.OFFLOADED] * n)
        return ctx, xs, handles

    @staticmethod
    def counted(calls, name):
        """Store.<name> at class level, counting (the C hooks look for replacements in the
        store's instance dict only: this one does not divert them)."""
        real = getattr(_store.Store, name)

        def wrapper(self, *args):
            calls[name] = calls.get(name, 0) + 1
            return real(self, *args)
        return mock.patch.object(_store.Store, name, wrapper)

    def answered(self, handle):
        deadline = time.monotonic() + 30
        while not handle.reload.done.done() and time.monotonic() < deadline:
            settle(0.005)
        self.assertTrue(handle.reload.done.done())

    def unpack_in_reverse(self, ctx, handles):
        """Each handle unpacked, newest first, once its prefetched reload (if any) answered;
        the tensors in that order."""
        got = []
        for h in reversed(handles):
            if h.reload is not None:
                self.answered(h)
            got.append(ctx.unpack_hook(h))
        return got

    def test_a_prefetched_handle_is_reloaded_in_c(self):
        ctx, xs, handles = self.packed()
        calls = {}
        with self.counted(calls, "_reload_claimed"), self.counted(calls, "_prefetch_before"), \
                self.counted(calls, "_reload_finish"):
            got = self.unpack_in_reverse(ctx, handles)
        # the last handle's reload was not sent (Python sends it URGENT and prefetches the one
        # before); every other had its reload prefetched: reloaded, prefetched and finished in C
        self.assertEqual(calls, {"_reload_claimed": 1, "_prefetch_before": 1,
                                 "_reload_finish": 1})
        for t, x in zip(got, reversed(xs)):
            self.assertTrue(torch.equal(t.cpu(), x.cpu()))
        self.assertEqual([(h.reload, h.block_id, h.reloading) for h in handles],
                         [(None, None, False)] * 4)
        self.assertEqual([h.result is t for h, t in zip(reversed(handles), got)], [True] * 4)
        st = ctx.stats.snapshot()
        self.assertEqual((st.reloaded, st.prefetched_in_time, st.waited, st.lost), (4, 3, 1, 0))
        self.assertEqual(st.reloaded_bytes, 4 * xs[0].nbytes)
        self.assertEqual(ctx.store._last_unpacked_seq, handles[0].seq)
        self.assertIs(ctx.unpack_hook(handles[1]), got[2])  # its result again, no reload
        self.assertTrue(ot.synchronize())
        self.assertNoViolations()

    def test_a_device_error_in_the_finish_is_data_loss_as_from_python(self):
        ctx, xs, handles = self.packed(n=3)
        calls, armed = {}, []
        real = sim_gpu.SimCudaDevice.record_stream

        def record_stream(dev, t, stream):
            if armed:
                raise OSError("the device call failed")
            return real(dev, t, stream)
        with mock.patch.object(sim_gpu.SimCudaDevice, "record_stream", record_stream), \
                self.counted(calls, "_reload_claimed"), self.counted(calls, "_reload_raised"):
            ctx.store._lanes.clear()  # made again below, reading the replaced method
            self.assertTrue(torch.equal(ctx.unpack_hook(handles[2]).cpu(), xs[2].cpu()))
            self.assertEqual(list(ctx.store._lanes), [])
            ctx.store._lanes[handles[1].device] = _store._lane_for(handles[1].ep)
            self.answered(handles[1])
            armed.append(True)
            with self.assertRaisesRegex(errors.OffloaddError, "the device call failed") as cm:
                ctx.unpack_hook(handles[1])
        self.assertEqual(cm.exception.code, errors.DATA_LOSS)
        self.assertIsNone(cm.exception.__context__)
        self.assertEqual(calls, {"_reload_claimed": 1, "_reload_raised": 1})
        self.assertEqual((handles[1].state, handles[1].reloading), (_store.LOST, False))
        self.assertEqual(ctx.stats.snapshot().lost, 1)

    def test_a_method_replaced_on_the_store_sends_the_reload_to_python(self):
        for name in ("_prefetch_before", "_start_reload", "_reload_finish"):
            with self.subTest(replaced=name):
                ctx, xs, handles = self.packed(n=3)
                seen, real = [], getattr(ctx.store, name)
                setattr(ctx.store, name, lambda s, *a: (seen.append(s.seq), real(s, *a))[1])
                calls = {}
                with self.counted(calls, "_reload_claimed"):
                    got = self.unpack_in_reverse(ctx, handles)
                self.assertEqual(calls, {"_reload_claimed": 3})
                self.assertGreater(len(seen), 0)  # the replacement ran
                for t, x in zip(got, reversed(xs)):
                    self.assertTrue(torch.equal(t.cpu(), x.cpu()))
                self.assertEqual(ctx.stats.snapshot().reloaded, 3)
                self.assertTrue(ot.synchronize())

    def test_a_prefetch_count_given_as_a_float_prefetches_as_from_python(self):
        ctx, xs, handles = self.packed(prefetch=2.0)
        calls = {}
        with self.counted(calls, "_reload_claimed"):
            got = self.unpack_in_reverse(ctx, handles)
        self.assertEqual(calls, {"_reload_claimed": 1})  # the rest prefetched, reloaded in C
        for t, x in zip(got, reversed(xs)):
            self.assertTrue(torch.equal(t.cpu(), x.cpu()))
        self.assertEqual(ctx.stats.snapshot().prefetched_in_time, 3)

    def test_a_reload_interrupted_before_it_went_out_is_let_go_and_made_again(self):
        """An interrupt (a signal handler raising) in the device call just before a reload's
        request is sent -- the URGENT reload's in Python, or the prefetch's in the lane's C --
        leaves no reload attached to the handle that would never be answered: the next unpack
        reloads it at once."""
        for interrupted_call in (1, 2):  # 1: the URGENT reload's send, 2: the prefetch's
            real, calls = sim_gpu.SimCudaDevice.event_seq, []

            def event_seq(dev, ev):  # the lanes read the method when made: patched before
                if calls:
                    calls[0] += 1
                    if calls[0] == interrupted_call:
                        raise KeyboardInterrupt("a signal handler raised")
                return real(dev, ev)
            with self.subTest(call=interrupted_call), \
                    mock.patch.object(sim_gpu.SimCudaDevice, "event_seq", event_seq):
                ctx, xs, handles = self.packed(n=3)
                calls.append(0)
                with self.assertRaises(KeyboardInterrupt):
                    ctx.unpack_hook(handles[2])
                self.assertEqual([h.reload is None or h.reload.sent for h in handles],
                                 [True] * 3)  # none attached that never went out
                for i in (2, 1, 0):
                    t = within_seconds(10, ctx.unpack_hook, handles[i])
                    self.assertTrue(torch.equal(t.cpu(), xs[i].cpu()))
                self.assertTrue(ot.synchronize())

    def test_counts_replaced_by_a_subclass_or_on_an_instance_are_called_by_the_c_paths(self):
        """The answers and the reload in C add to OffloadStats' C fields directly, unless the
        statistics' class overrides the method, or an instance (of a class with a __dict__)
        replaced it: then that runs, as from Python."""
        class Overriding(ot.OffloadStats):
            __slots__ = ()
            seen = []

            def add_offloaded(self, nbytes):
                Overriding.seen.append(("offloaded", nbytes))
                super().add_offloaded(nbytes)

        class WithDict(ot.OffloadStats):
            pass
        for kind in ("subclass", "instance"):
            with self.subTest(kind):
                ctx = ot.offload_checkpoints(threshold_bytes=1 << 16, keep_last_n=0,
                                             prefetch=1, socket_path=self.daemon.sock)
                seen = Overriding.seen = []
                stats = Overriding() if kind == "subclass" else WithDict()
                if kind == "instance":
                    def add_reloaded(nbytes, in_time, waited, real=stats.add_reloaded):
                        seen.append(("reloaded", nbytes))
                        real(nbytes, in_time, waited)
                    stats.add_reloaded = add_reloaded
                ctx.store.stats = stats
                xs = [self.gpu.empty_strided((1 << 16,), (1,), torch.float32) for _ in range(3)]
                handles = [ctx.pack_hook(x) for x in xs]
                self.assertTrue(ot.synchronize())
                got = self.unpack_in_reverse(ctx, handles)
                for t, x in zip(got, reversed(xs)):
                    self.assertTrue(torch.equal(t.cpu(), x.cpu()))
                want = "offloaded" if kind == "subclass" else "reloaded"
                self.assertEqual(seen, [(want, 1 << 18)] * 3)
                self.assertEqual((stats.offloaded, stats.reloaded, stats.offloaded_bytes),
                                 (3, 3, 3 << 18))
                self.assertTrue(ot.synchronize())

    def test_a_count_that_raises_leaves_the_tensor_for_the_next_unpack(self):
        for hooks_in_c in (True, False):
            with self.subTest(hooks_in_c=hooks_in_c), \
                    mock.patch.object(_store, "_hooks_in_c", hooks_in_c):
                ctx, xs, handles = self.packed(n=3)
                self.assertTrue(torch.equal(ctx.unpack_hook(handles[2]).cpu(), xs[2].cpu()))
                self.answered(handles[1])
                real = ctx.store.stats

                class Breaking:  # OffloadStats has slots: its method is replaced by a proxy
                    def __getattr__(self, name):
                        return getattr(real, name)

                    def add_reloaded(self, *args):
                        raise ValueError("the count broke")
                ctx.store.stats = Breaking()
                try:
                    with self.assertRaisesRegex(ValueError, "the count broke"):
                        ctx.unpack_hook(handles[1])
                finally:
                    ctx.store.stats = real
                self.assertEqual(handles[1].reloading, False)
                t = within_seconds(10, ctx.unpack_hook, handles[1])  # no reload again
                self.assertIs(t, handles[1].result)
                self.assertTrue(torch.equal(t.cpu(), xs[1].cpu()))
                self.assertEqual(ctx.stats.snapshot().reloaded, 1)  # the count that raised: none
                self.assertTrue(ot.synchronize())


class SimTransformersTest(SimDaemonTestCase):
    """The reference study's model shape (qwen3_fixture.SEED_CONFIG) through
    offloadd.transformers.enable() on simulated device tensors, at a shorter sequence."""

    SEQ = 256

    def tearDown(self):
        otf.disable()   # enable() swaps process-wide names (torch's too): leave them as found
        super().tearDown()

    def make(self):
        model = q.make_model(seed=0, max_seq=self.SEQ, **q.SEED_CONFIG)
        ids = q.batch(q.SEED_CONFIG["vocab_size"], q.SEED_BATCH, self.SEQ)
        return model, ids

    def test_prefetched_reloads_cost_no_host_wait_and_gradients_are_bitwise_equal(self):
        model, ids = self.make()
        q.set_checkpointing(model, "ckpt")
        want = q.step(model, ids)
        ctx = otf.enable(socket_path=self.daemon.sock)
        q.set_checkpointing(model, "offload")
        for _ in range(2):
            got = q.step(model, ids)
            self.assertTrue(torch.equal(got[0], want[0]))
            self.assertTrue(all(torch.equal(x, y) for x, y in zip(got[1], want[1])))
        st = ctx.stats.snapshot()
        print("SIMULATED: %s" % st.summary())
        layers = q.SEED_CONFIG["num_hidden_layers"]
        self.assertEqual(st.offloaded, 2 * (layers - 1))  # keep_last_n=1 keeps the last layer's
        self.assertEqual(st.reloaded, st.offloaded)
        self.assertEqual(st.fallbacks, 0)
        self.assertEqual(st.prefetched_in_time, st.reloaded)
        self.assertEqual(st.host_waits, 0)
        self.assertNoViolations()

    def test_empty_cache_and_an_allocation_retry_between_steps_leave_nothing_mapped(self):
        model, ids = self.make()
        q.set_checkpointing(model, "ckpt")
        want = q.step(model, ids)
        ctx = otf.enable(socket_path=self.daemon.sock)
        q.set_checkpointing(model, "offload")
        q.step(model, ids)
        ot.synchronize()
        self.gpu.empty_cache()
        alloc = self.gpu.allocators[0]
        freed = alloc.segments_freed
        self.assertGreater(freed, 0)
        # Fill the device but for one 2 MiB segment: the forward takes it, and backward's first
        # reload destination (on the reload stream, which the forward's cached blocks do not
        # serve) then needs the retry that frees every cached segment.
        filler = self.gpu.empty_strided(
            ((self.DEVICE_BYTES - alloc.used_bytes() - 2 * MIB) // 4,), (1,), torch.float32)
        got = q.step(model, ids)
        del filler
        ot.synchronize()
        self.assertTrue(torch.equal(got[0], want[0]))
        self.assertTrue(all(torch.equal(x, y) for x, y in zip(got[1], want[1])))
        print("SIMULATED: segments freed by empty_cache %d, allocation retries %d, stats %s"
              % (freed, alloc.oom_retries, ctx.stats.snapshot().summary()))
        self.assertGreater(alloc.oom_retries, 0)
        self.assertNoViolations()

    def test_expandable_segments_are_one_error_not_a_fallback_also_when_switched_at_run_time(self):
        model, ids = self.make()
        ctx = otf.enable(socket_path=self.daemon.sock)
        q.set_checkpointing(model, "offload")
        q.step(model, ids)
        self.gpu.set_allocator_settings("expandable_segments:True")
        with self.assertRaises(errors.OffloadConfigError) as cm:
            q.step(model, ids)
        self.assertIn("expandable_segments", str(cm.exception))
        self.assertEqual(ctx.stats.fallbacks, 0)

    def test_the_environment_setting_is_refused_at_enable(self):
        import os
        os.environ["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
        try:
            with self.assertRaises(errors.OffloadConfigError) as cm:
                otf.enable(socket_path=self.daemon.sock)
            self.assertIn("PYTORCH_CUDA_ALLOC_CONF", str(cm.exception))
            with self.assertRaises(errors.OffloadConfigError):
                cuda.check_allocator_config(environ={}, settings="expandable_segments:True",
                                            backend="native")
            with self.assertRaises(errors.OffloadConfigError):
                cuda.check_allocator_config(environ={}, settings="", backend="cudaMallocAsync")
        finally:
            del os.environ["PYTORCH_CUDA_ALLOC_CONF"]
        cuda.check_allocator_config(environ={}, settings="", backend="native")


class SimFreedMemoryTest(SimDaemonTestCase):
    """A client that frees memory the daemon is copying (a bug, or a killed process)."""

    def test_the_copy_fails_with_a_status_and_the_daemon_serves_others(self):
        tr = self.transport()
        compute = self.gpu.current_stream(0)
        t = torch.full((4 * MIB,), 3.0)
        compute.kernel(0.2)  # the producer runs; the daemon holds the mapping meanwhile
        op = tr.start_offload(t, _transport.Meta(t))
        seg = tr.dev.describe(op.tensor.data_ptr()).segment
        # The transfer's mapping, held while it waits 0.2 s for the producer: seen mapped twice
        # 20 ms apart, not the registration's check (an open and a close microseconds apart).
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            if self.gpu.table.daemon_maps(seg.slot) > 0:
                time.sleep(0.02)
                if self.gpu.table.daemon_maps(seg.slot) > 0:
                    break
            time.sleep(0.001)
        with self.gpu.lock:  # the bug: the segment goes while the daemon still copies from it
            self.gpu.allocators[0]._release_segment(seg)
        with self.assertRaises(errors.OffloaddError) as cm:
            op.future.result(30)
        print("the offload of freed memory failed: %s" % cm.exception)
        self.assertGreaterEqual(self.gpu.violations(sim_gpu.FREED_WHILE_MAPPED), 1)
        self.assertGreaterEqual(self.gpu.violations(sim_gpu.COPY_ON_FREED), 1)
        tr.finish_offload(op)
        # Another session on the same daemon is unaffected.
        tr2 = self.transport()
        u = torch.arange(MIB, dtype=torch.float32)
        meta = _transport.Meta(u)
        op2 = tr2.start_offload(u, meta)
        block = op2.future.result(30).block_id
        tr2.finish_offload(op2)
        rl = tr2.prepare_reload(meta)
        tr2.send_reload(rl, block, URGENT)
        self.assertTrue(torch.equal(tr2.finish_reload(rl, meta), u))


if __name__ == "__main__":
    warnings.simplefilter("default")
    unittest.main()
