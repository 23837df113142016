"""offloadd.cuda and the CUDA IPC transport's bookkeeping, driven by fake CUDA libraries.

There is no GPU here: these tests check what the ctypes layer sends and decodes (argument
values, flags, handle bytes with NULs inside, error messages, allocation-base arithmetic, region
caching by handle bytes, event reuse) with fakes standing in for libcudart and libcuda. The real
calls run only on a GPU machine.
"""

import ctypes
import os
import threading
import unittest
from unittest import mock

import daemon_fixture  # noqa: F401  (sys.path)

from offloadd import cuda
from offloadd.errors import CudaExportError, OffloadConfigError


def _fn(impl):
    """A plain function (ctypes code sets argtypes/restype attributes on it)."""
    def f(*args):
        return impl(*args)
    return f


class FakeCuda:
    """Allocations {base: size}; handles are 64 bytes derived from the base, with NULs inside."""

    def __init__(self, allocations, ipc_error=0, vmm=()):
        self.allocations = dict(allocations)
        self.vmm = set(vmm)          # bases of VMM allocations (no legacy IPC handle)
        self.ipc_error = ipc_error
        self.calls = []
        self.next_event = 0x5000
        self.last_error = 0          # the runtime's per-thread "last error"
        self.pending = set()         # events cudaEventQuery reports not ready
        for name in ("cudaGetErrorString", "cudaIpcGetMemHandle", "cudaEventCreateWithFlags",
                     "cudaIpcGetEventHandle", "cudaEventRecord", "cudaEventDestroy",
                     "cudaStreamWaitEvent", "cudaEventQuery", "cudaGetLastError",
                     "cuPointerGetAttributes", "cuMemGetAddressRange_v2", "cuDeviceGet",
                     "cuDeviceGetUuid", "cuGetErrorString", "cuInit"):
            setattr(self, name, _fn(getattr(self, "_" + name)))

    def _fail(self, rc):
        self.last_error = rc
        return rc

    def _cudaGetLastError(self):
        self.calls.append(("cudaGetLastError",))
        rc, self.last_error = self.last_error, 0
        return rc

    def _cudaStreamWaitEvent(self, stream, ev, flags):
        self.calls.append(("cudaStreamWaitEvent", stream.value, ev.value, flags))
        return 0

    def _cudaEventQuery(self, ev):
        return self._fail(600) if ev.value in self.pending else 0

    def _cuPointerGetAttributes(self, n, attrs, data, ptr):
        for base, size in self.allocations.items():
            if base <= ptr.value < base + size:
                values = {11: (ctypes.c_uint64, base), 12: (ctypes.c_size_t, size),
                          7: (ctypes.c_uint64, base >> 12), 10: (ctypes.c_int, base not in self.vmm),
                          9: (ctypes.c_int, 0)}
                for i in range(n):
                    ctype, v = values[attrs[i]]
                    ctypes.cast(data[i], ctypes.POINTER(ctype))[0] = v
                return 0
        return 1  # CUDA_ERROR_INVALID_VALUE (a driver call: no runtime last error)

    @staticmethod
    def handle_for(base):
        return (base.to_bytes(8, "little") + b"\0\x01\0") * 5 + b"\0" * 9

    def _cudaGetErrorString(self, rc):
        return b"fake error %d" % rc

    def _cudaIpcGetMemHandle(self, href, ptr):
        self.calls.append(("cudaIpcGetMemHandle", ptr.value))
        if self.ipc_error:
            return self._fail(self.ipc_error)
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
        # Torch's process-wide allocator settings are whatever an earlier test in this worker
        # left (PYTORCH_CUDA_ALLOC_CONF read once): these tests name their own.
        patcher = mock.patch.object(cuda, "_torch_allocator_settings", return_value=("", ""))
        patcher.start()
        self.addCleanup(patcher.stop)
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

    def test_ipc_handle_failure_names_vmm_and_clears_the_last_error(self):
        failing = FakeCuda({}, ipc_error=1)
        rt = cuda.CudaRuntime(cudart=failing, libcuda=self.fake)
        with self.assertRaises(CudaExportError) as e:
            rt.ipc_mem_handle(0x7F0000000000)
        self.assertIn("expandable_segments", str(e.exception))
        self.assertIn("fake error 1", str(e.exception))
        # torch's next launch check must not see offloadd's failure.
        self.assertEqual(failing.last_error, 0)
        self.assertIn(("cudaGetLastError",), failing.calls)

    def test_export_refused_for_expandable_segments_clears_the_last_error(self):
        # With expandable segments on, the failed export raises the allocator's error, and
        # that error too must leave no last error for torch's next launch check.
        failing = FakeCuda({}, ipc_error=1)
        rt = cuda.CudaRuntime(cudart=failing, libcuda=self.fake)
        with mock.patch.dict(os.environ, {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}):
            with self.assertRaises(OffloadConfigError) as e:
                rt.ipc_mem_handle(0x7F0000000000)
        self.assertIn("expandable_segments:True", str(e.exception))
        self.assertEqual(failing.last_error, 0)

    def test_pointer_info_in_one_driver_call(self):
        fake = FakeCuda({0x7F0000000000: 2 << 20}, vmm=[0x7F0000000000])
        rt = cuda.CudaRuntime(cudart=fake, libcuda=fake)
        info = self.rt.pointer_info(0x7F0000400000 + 100)
        self.assertEqual((info.base, info.size, info.buffer_id, info.ipc_capable),
                         (0x7F0000400000, 1 << 20, 0x7F0000400000 >> 12, True))
        self.assertFalse(rt.pointer_info(0x7F0000000000).ipc_capable)
        with self.assertRaises(CudaExportError):
            self.rt.pointer_info(0x1000)
        dev = cuda.TorchCudaDevice(rt)
        with self.assertRaises(OffloadConfigError):  # one clear error, not a fallback
            dev.describe(0x7F0000000000)

    def test_stream_wait_and_event_query(self):
        self.rt.stream_wait_event(0xABC, 0x5010)
        self.assertEqual(self.fake.calls[-1], ("cudaStreamWaitEvent", 0xABC, 0x5010, 0))
        self.fake.pending.add(0x5010)
        self.assertFalse(self.rt.event_query(0x5010))
        self.assertEqual(self.fake.last_error, 0)  # "not ready" is not left as an error
        self.fake.pending.clear()
        self.assertTrue(self.rt.event_query(0x5010))

    def test_events_are_interprocess_without_timing(self):
        event, handle = self.rt.create_ipc_event()
        self.assertEqual(self.fake.calls[-1], ("cudaEventCreateWithFlags", 0x04 | 0x02))
        self.assertEqual(handle, b"E\0" * 32)
        self.rt.record_event(event, 0xABC)
        self.assertEqual(self.fake.calls[-1], ("cudaEventRecord", event, 0xABC))

    def test_event_pool_reuses_released_events(self):
        pool = cuda.IpcEventPool(lambda: cuda.IpcEvent(*self.rt.create_ipc_event()))
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

    def test_allocator_settings_without_ipc_are_refused(self):
        cuda.check_allocator_config({"PYTORCH_CUDA_ALLOC_CONF": "max_split_size_mb:128"},
                                    settings="", backend="native")
        for conf in ("expandable_segments:True", "max_split_size_mb:64,expandable_segments:true",
                     "backend:cudaMallocAsync"):
            with self.assertRaises(OffloadConfigError) as e:
                cuda.check_allocator_config({"PYTORCH_CUDA_ALLOC_CONF": conf}, settings="",
                                            backend="native")
            self.assertIn("PYTORCH_CUDA_ALLOC_CONF", str(e.exception))
        # Switched on at run time (torch.cuda.memory._set_allocator_settings), or the backend.
        with self.assertRaises(OffloadConfigError):
            cuda.check_allocator_config({}, settings="expandable_segments:True", backend="native")
        with self.assertRaises(OffloadConfigError):
            cuda.check_allocator_config({}, settings="", backend="cudaMallocAsync")


class _Ptr:
    """A tensor stand-in: only data_ptr() is read by the export path."""

    def __init__(self, ptr):
        self.ptr = ptr

    def data_ptr(self):
        return self.ptr


class CudaRegionTest(unittest.TestCase):
    """CudaIpcTransport's export: one registration (and one IPC handle call) per allocation,
    cached by buffer id, offsets from the base."""

    def setUp(self):
        try:
            from offloadd.torch._transport import CudaIpcTransport
        except ImportError as e:  # torch missing
            self.skipTest(str(e))
        self.fake = FakeCuda({0x7F0000000000: 2 << 20, 0x7F0000400000: 1 << 20})
        self.client = FakeClient()
        self.transport = CudaIpcTransport(
            self.client, cuda.TorchCudaDevice(cuda.CudaRuntime(self.fake, self.fake)))

    def test_registers_each_allocation_once_and_asks_for_its_handle_once(self):
        export = self.transport._export
        self.assertEqual(export(_Ptr(0x7F0000000000 + 8192), 4096), (1, 8192))
        self.assertEqual(export(_Ptr(0x7F0000000000 + 65536), 4096), (1, 65536))
        self.assertEqual(export(_Ptr(0x7F0000400000), 1 << 20), (2, 0))
        self.assertEqual(self.client.registered,
                         [(FakeCuda.handle_for(0x7F0000000000), 2 << 20),
                          (FakeCuda.handle_for(0x7F0000400000), 1 << 20)])
        ipc_bases = [c[1] for c in self.fake.calls if c[0] == "cudaIpcGetMemHandle"]
        self.assertEqual(ipc_bases, [0x7F0000000000, 0x7F0000400000])  # cached per allocation

    def test_span_past_the_allocation_is_refused(self):
        with self.assertRaises(CudaExportError):
            self.transport._export(_Ptr(0x7F0000400000 + 4096), 1 << 20)

    def test_least_recently_used_regions_are_unregistered(self):
        self.transport.MAX_REGIONS = 1
        self.transport._export(_Ptr(0x7F0000000000), 16)
        self.transport._export(_Ptr(0x7F0000400000), 16)
        self.assertEqual(self.client.unregistered, [1])


if __name__ == "__main__":
    unittest.main()
