"""CUDA IPC export of device memory and events through ctypes (no torch, no compiled extension).

Why not PyTorch's own sharing path: ``storage._share_cuda_()`` (torch.multiprocessing) puts the
block under cross-process reference counting; a consumer that never decrements the counter (the
daemon) leaves blocks stuck in the training process (docs/ARCHITECTURE.md, "Pitfalls"). Here the
allocation is exported with the CUDA runtime directly:

* allocation base and size: ``cuMemGetAddressRange_v2`` (driver API, libcuda.so.1): an IPC
  handle covers a whole cudaMalloc allocation, so the handle is taken of the *base* and each
  request carries ``offset = ptr - base`` (checked: ``offset + bytes <= size``);
* ``cudaIpcGetMemHandle(base)`` (runtime API, libcudart): 64 bytes the daemon opens once;
* ready events: ``cudaEventCreateWithFlags(cudaEventInterprocess | cudaEventDisableTiming)``,
  ``cudaIpcGetEventHandle`` (64 bytes), ``cudaEventRecord(event, stream)`` on the producing
  stream; the daemon's copy waits on it. An event must outlive every copy that waits on it:
  :class:`IpcEventPool` hands an event out again only after its offload completed;
* device identity: ``cuDeviceGetUuid`` formatted "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  (ordinals differ between processes under CUDA_VISIBLE_DEVICES; UUIDs do not).

Memory from VMM allocators (PyTorch ``expandable_segments:True``) has no legacy IPC handle (it
would need cuMemExportToShareableHandle and a file descriptor over SCM_RIGHTS, which gRPC cannot
carry): :func:`check_allocator_config` and a failing cudaIpcGetMemHandle raise CudaExportError.

Every call must run on a thread whose current device/context owns the pointer (PyTorch's forward
and autograd device threads do). Not runnable without a GPU: tests/test_cuda_export.py drives it
with fake libraries.
"""

import ctypes
import ctypes.util
import os
import queue
import re
import sys
import threading

from .errors import CudaExportError

CUDA_EVENT_DISABLE_TIMING = 0x02  # cudaEventDisableTiming
CUDA_EVENT_INTERPROCESS = 0x04    # cudaEventInterprocess
IPC_HANDLE_BYTES = 64             # sizeof(cudaIpcMemHandle_t) == sizeof(cudaIpcEventHandle_t)


class _Handle64(ctypes.Structure):
    # Unsigned bytes, not c_char: a c_char array field reads back truncated at its first NUL.
    _fields_ = [("reserved", ctypes.c_ubyte * IPC_HANDLE_BYTES)]


class _Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


def check_allocator_config(environ=None):
    """Raises CudaExportError when PyTorch's caching allocator is set to expandable segments."""
    environ = os.environ if environ is None else environ
    for var in ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"):
        if re.search(r"expandable_segments\s*:\s*true", environ.get(var, ""), re.I):
            raise CudaExportError(
                "%s sets expandable_segments:True: that memory (CUDA VMM) has no legacy IPC "
                "handle, so offloadd cannot export it; unset it for training with offloadd"
                % var)


def format_uuid(raw16):
    """16 raw bytes -> "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx" (nvidia-smi's form)."""
    h = bytes(raw16).hex()
    if len(h) != 32:
        raise ValueError("a CUDA UUID has 16 bytes")
    return "GPU-%s-%s-%s-%s-%s" % (h[:8], h[8:12], h[12:16], h[16:20], h[20:])


def _loaded_library(stem):
    """Path of an already mapped library whose file name starts with ``stem`` (e.g. the
    libcudart PyTorch loaded), so we share its instance; None if not mapped."""
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                path = line.rsplit(None, 1)[-1]
                if os.path.basename(path).startswith(stem + ".so"):
                    return path
    except OSError:
        pass
    return None


def _open_library(stem, candidates):
    tried = []
    for name in [_loaded_library(stem), ctypes.util.find_library(stem[3:])] + candidates:
        if not name or name in tried:
            continue
        tried.append(name)
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    raise CudaExportError("cannot load %s (tried %s): install the CUDA runtime / NVIDIA driver"
                          % (stem, ", ".join(tried)))


class CudaRuntime:
    """ctypes bindings of the few runtime/driver calls offloadd needs.

    ``cudart`` / ``libcuda``: loaded CDLL-like objects (injectable for tests); by default the
    libcudart already mapped into the process (PyTorch's), else the system's, and libcuda.so.1.
    Every method raises CudaExportError naming the failing call and its error string.
    """

    def __init__(self, cudart=None, libcuda=None):
        self.cudart = cudart or _open_library(
            "libcudart", ["libcudart.so", "libcudart.so.13", "libcudart.so.12",
                          "libcudart.so.11.0", "/usr/local/cuda/lib64/libcudart.so"])
        self.libcuda = libcuda or _open_library("libcuda", ["libcuda.so.1", "libcuda.so"])
        rt, drv = self.cudart, self.libcuda
        rt.cudaGetErrorString.restype = ctypes.c_char_p
        rt.cudaGetErrorString.argtypes = [ctypes.c_int]
        rt.cudaIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle64), ctypes.c_void_p]
        rt.cudaEventCreateWithFlags.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint]
        rt.cudaIpcGetEventHandle.argtypes = [ctypes.POINTER(_Handle64), ctypes.c_void_p]
        rt.cudaEventRecord.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        rt.cudaEventDestroy.argtypes = [ctypes.c_void_p]
        drv.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        drv.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        drv.cuDeviceGetUuid.argtypes = [ctypes.POINTER(_Uuid), ctypes.c_int]
        drv.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def _rt(self, rc, call):
        if rc != 0:
            msg = self.cudart.cudaGetErrorString(rc)
            raise CudaExportError("%s failed: error %d (%s)"
                                  % (call, rc, msg.decode() if msg else "?"))

    def _drv(self, rc, call):
        if rc != 0:
            s = ctypes.c_char_p()
            self.libcuda.cuGetErrorString(rc, ctypes.byref(s))
            raise CudaExportError("%s failed: CUresult %d (%s)"
                                  % (call, rc, s.value.decode() if s.value else "?"))

    def allocation_range(self, ptr):
        """(base, size_bytes) of the allocation containing device pointer ``ptr``."""
        base, size = ctypes.c_uint64(), ctypes.c_size_t()
        self._drv(self.libcuda.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size),
                                                       ctypes.c_uint64(ptr)),
                  "cuMemGetAddressRange(0x%x)" % ptr)
        return base.value, size.value

    def ipc_mem_handle(self, base):
        """64 handle bytes of the allocation at ``base`` (must be an allocation base)."""
        h = _Handle64()
        rc = self.cudart.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base))
        if rc != 0:
            check_allocator_config()
            self._rt(rc, "cudaIpcGetMemHandle(0x%x) (memory from a VMM allocator, e.g. "
                         "expandable_segments, has no IPC handle)" % base)
        return bytes(h)

    def create_ipc_event(self):
        """(event pointer, 64 IPC handle bytes) of a new interprocess, timing-disabled event."""
        ev = ctypes.c_void_p()
        self._rt(self.cudart.cudaEventCreateWithFlags(
            ctypes.byref(ev), CUDA_EVENT_INTERPROCESS | CUDA_EVENT_DISABLE_TIMING),
            "cudaEventCreateWithFlags(Interprocess|DisableTiming)")
        h = _Handle64()
        try:
            self._rt(self.cudart.cudaIpcGetEventHandle(ctypes.byref(h), ev),
                     "cudaIpcGetEventHandle")
        except CudaExportError:
            self.cudart.cudaEventDestroy(ev)
            raise
        return ev.value, bytes(h)

    def record_event(self, event, stream):
        """cudaEventRecord(event, stream); ``stream`` is a cudaStream_t as int (0: legacy)."""
        self._rt(self.cudart.cudaEventRecord(ctypes.c_void_p(event), ctypes.c_void_p(stream)),
                 "cudaEventRecord")

    def destroy_event(self, event):
        self._rt(self.cudart.cudaEventDestroy(ctypes.c_void_p(event)), "cudaEventDestroy")

    def device_uuid(self, ordinal):
        """"GPU-..." UUID of the device with this (process-visible) ordinal."""
        self.libcuda.cuInit(0)
        dev = ctypes.c_int()
        self._drv(self.libcuda.cuDeviceGet(ctypes.byref(dev), int(ordinal)),
                  "cuDeviceGet(%d)" % ordinal)
        u = _Uuid()
        self._drv(self.libcuda.cuDeviceGetUuid(ctypes.byref(u), dev.value), "cuDeviceGetUuid")
        return format_uuid(bytes(u.bytes))


class IpcEvent:
    __slots__ = ("event", "handle")

    def __init__(self, event, handle):
        self.event, self.handle = event, handle


class IpcEventPool:
    """Interprocess events reused across offloads (creating one costs a driver call and the
    daemon caches opened handles). ``acquire`` a free event or create one; ``release`` it only
    after the offload that waits on it completed. Thread-safe."""

    def __init__(self, runtime):
        self._runtime = runtime
        self._free = []
        self._lock = threading.Lock()
        self.created = 0

    def acquire(self):
        with self._lock:
            if self._free:
                return self._free.pop()
        event, handle = self._runtime.create_ipc_event()
        with self._lock:
            self.created += 1
        return IpcEvent(event, handle)

    def release(self, ev):
        with self._lock:
            self._free.append(ev)


class EventGate:
    """Runs ``then()`` after ``wait()`` returns, on one background thread, in submission order.

    Used for reloads into freshly allocated device memory: the caching allocator may hand out
    memory that kernels still queued on the compute stream read or write, so the daemon may only
    write after an event recorded on that stream has completed (``wait`` = its synchronize).
    """

    def __init__(self):
        self._queue = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="offloadd-cuda-gate", daemon=True)
        self._thread.start()

    def submit(self, wait, then):
        self._queue.put((wait, then))

    def _run(self):
        while True:
            wait, then = self._queue.get()
            try:
                wait()
            except Exception as e:  # the reload then fails in the daemon or times out
                sys.stderr.write("offloadd: waiting for a CUDA event failed: %r\n" % (e,))
            try:
                then()
            except Exception as e:
                sys.stderr.write("offloadd: sending a gated request failed: %r\n" % (e,))
