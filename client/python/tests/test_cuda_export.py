"""offloadd.cuda and the CUDA IPC transport's bookkeeping, driven by fake CUDA libraries.

There is no GPU here: these tests check what the ctypes layer sends and decodes (argument
values, flags, handle bytes with NULs inside, error messages, allocation-base arithmetic, region
caching by handle bytes, event reuse) with fakes standing in for libcudart and libcuda. The real
calls run only on a GPU machine.
"""

import ctypes
import threading
import unittest

import daemon_fixture  # noqa: F401  (sys.path)

from offloadd import cuda
from offloadd.errors import CudaExportError


def _fn(impl):
    """A plain function (ctypes code sets argtypes/restype attributes on it)."""
    def f(*args):
        return impl(*args)
    return f


class FakeCuda:
    """Allocations {base: size}; handles are 64 bytes derived from the base, with NULs inside."""

    def __init__(self, allocations, ipc_error=0):
        self.allocations = dict(allocations)
        self.ipc_error = ipc_error
        self.calls = []
        self.next_event = 0x5000
        for name in ("cudaGetErrorString", "cudaIpcGetMemHandle", "cudaEventCreateWithFlags",
                     "cudaIpcGetEventHandle", "cudaEventRecord", "cudaEventDestroy",
                     "cuMemGetAddressRange_v2", "cuDeviceGet", "cuDeviceGetUuid",
                     "cuGetErrorString", "cuInit"):
            setattr(self, name, _fn(getattr(self, "_" + name)))

    @staticmethod
    def handle_for(base):
        return (base.to_bytes(8, "little") + b"\0\x01\0") * 5 + b"\0" * 9

    def _cudaGetErrorString(self, rc):
        return b"fake error %d" % rc

    def _cudaIpcGetMemHandle(self, href, ptr):
        self.calls.append(("cudaIpcGetMemHandle", ptr.value))
        if self.ipc_error:
            return self.ipc_error
        ctypes.memmove(ctypes.addressof(href._obj), self.handle_for(ptr.value), 64)
        return 0

    def _cudaEventCreateWithFlags(self, evref, flags):
        self.calls.append(("cudaEventCreateWithFlags", flags))
        self.next_event += 16
        evref._obj.value = self.next_event
        return 0

    def _cudaIpcGetEventHandle(self, href, ev):
        ctypes.memmove(ctypes.addressof(href._obj), b"E\0" * 32, 64)
        return 0

    def _cudaEventRecord(self, ev, stream):
        self.calls.append(("cudaEventRecord", ev.value, stream.value))
        return 0

    def _cudaEventDestroy(self, ev):
        return 0

    def _cuMemGetAddressRange_v2(self, base_ref, size_ref, ptr):
        for base, size in self.allocations.items():
            if base <= ptr.value < base + size:
                base_ref._obj.value, size_ref._obj.value = base, size
                return 0
        return 1  # CUDA_ERROR_INVALID_VALUE

    def _cuDeviceGet(self, dev_ref, ordinal):
        dev_ref._obj.value = 40 + ordinal
        return 0

    def _cuDeviceGetUuid(self, uuid_ref, dev):
        for i in range(16):
            uuid_ref._obj.bytes[i] = (dev + i) & 0xFF
        return 0

    def _cuGetErrorString(self, rc, sref):
        sref._obj.value = b"CUDA_ERROR_INVALID_VALUE"
        return 0

    def _cuInit(self, flags):
        return 0


class FakeClient:
    def __init__(self):
        self.registered, self.unregistered = [], []

    def register_cuda(self, handle, size):
        self.registered.append((handle, size))
        return len(self.registered)

    def unregister(self, rid):
        self.unregistered.append(rid)


class CudaRuntimeTest(unittest.TestCase):
    def setUp(self):
        self.fake = FakeCuda({0x7F0000000000: 2 << 20, 0x7F0000400000: 1 << 20})
        self.rt = cuda.CudaRuntime(cudart=self.fake, libcuda=self.fake)

    def test_allocation_range_and_handle_bytes(self):
        base, size = self.rt.allocation_range(0x7F0000000000 + 4096)
        self.assertEqual((base, size), (0x7F0000000000, 2 << 20))
        handle = self.rt.ipc_mem_handle(base)
        self.assertEqual(len(handle), 64)
        self.assertEqual(handle, FakeCuda.handle_for(base))  # NULs inside survive
        with self.assertRaises(CudaExportError) as e:
            self.rt.allocation_range(0x1000)
        self.assertIn("cuMemGetAddressRange", str(e.exception))
        self.assertIn("CUDA_ERROR_INVALID_VALUE", str(e.exception))

    def test_ipc_handle_failure_names_vmm(self):
        rt = cuda.CudaRuntime(cudart=FakeCuda({}, ipc_error=1), libcuda=self.fake)
        with self.assertRaises(CudaExportError) as e:
            rt.ipc_mem_handle(0x7F0000000000)
        self.assertIn("expandable_segments", str(e.exception))
        self.assertIn("fake error 1", str(e.exception))

    def test_events_are_interprocess_without_timing(self):
        event, handle = self.rt.create_ipc_event()
        self.assertEqual(self.fake.calls[-1], ("cudaEventCreateWithFlags", 0x04 | 0x02))
        self.assertEqual(handle, b"E\0" * 32)
        self.rt.record_event(event, 0xABC)
        self.assertEqual(self.fake.calls[-1], ("cudaEventRecord", event, 0xABC))

    def test_event_pool_reuses_released_events(self):
        pool = cuda.IpcEventPool(self.rt)
        a, b = pool.acquire(), pool.acquire()
        self.assertNotEqual(a.event, b.event)
        pool.release(a)
        self.assertIs(pool.acquire(), a)
        self.assertEqual(pool.created, 2)

    def test_device_uuid_format(self):
        self.assertEqual(self.rt.device_uuid(1),
                         "GPU-292a2b2c-2d2e-2f30-3132-333435363738")
        self.assertEqual(cuda.format_uuid(bytes(range(16))),
                         "GPU-00010203-0405-0607-0809-0a0b0c0d0e0f")

    def test_expandable_segments_are_refused(self):
        cuda.check_allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"})
        for conf in ("expandable_segments:True", "max_split_size_mb:64,expandable_segments:true"):
            with self.assertRaises(CudaExportError):
                cuda.check_allocator_config({"PYTORCH_CUDA_ALLOC_CONF": conf})

    def test_event_gate_runs_in_order_after_wait(self):
        gate = cuda.EventGate()
        order, done = [], threading.Event()
        release = threading.Event()
        gate.submit(lambda: release.wait(5), lambda: order.append(1))
        gate.submit(lambda: None, lambda: (order.append(2), done.set()))
        self.assertEqual(order, [])
        release.set()
        self.assertTrue(done.wait(5))
        self.assertEqual(order, [1, 2])


class CudaRegionTest(unittest.TestCase):
    """CudaIpcTransport.region_for: one registration per allocation, offsets from the base."""

    def setUp(self):
        try:
            from offloadd.torch._transport import CudaIpcTransport
        except ImportError as e:  # torch missing
            self.skipTest(str(e))
        self.fake = FakeCuda({0x7F0000000000: 2 << 20, 0x7F0000400000: 1 << 20})
        self.client = FakeClient()
        self.transport = CudaIpcTransport(self.client, cuda.CudaRuntime(self.fake, self.fake))

    def test_registers_each_allocation_base_once(self):
        rid, off = self.transport.region_for(0x7F0000000000 + 8192, 4096)
        self.assertEqual((rid, off), (1, 8192))
        rid2, off2 = self.transport.region_for(0x7F0000000000 + 65536, 4096)
        self.assertEqual((rid2, off2), (1, 65536))
        rid3, off3 = self.transport.region_for(0x7F0000400000, 1 << 20)
        self.assertEqual((rid3, off3), (2, 0))
        self.assertEqual(self.client.registered,
                         [(FakeCuda.handle_for(0x7F0000000000), 2 << 20),
                          (FakeCuda.handle_for(0x7F0000400000), 1 << 20)])
        ipc_bases = [c[1] for c in self.fake.calls if c[0] == "cudaIpcGetMemHandle"]
        self.assertEqual(set(ipc_bases), {0x7F0000000000, 0x7F0000400000})

    def test_span_past_the_allocation_is_refused(self):
        with self.assertRaises(CudaExportError):
            self.transport.region_for(0x7F0000400000 + 4096, 1 << 20)

    def test_least_recently_used_regions_are_unregistered(self):
        self.transport.MAX_REGIONS = 1
        self.transport.region_for(0x7F0000000000, 16)
        self.transport.region_for(0x7F0000400000, 16)
        self.assertEqual(self.client.unregistered, [1])


if __name__ == "__main__":
    unittest.main()
