"""CUDA IPC export of device memory and events through ctypes (no torch, no compiled extension).

Why not PyTorch's own sharing path: ``storage._share_cuda_()`` (torch.multiprocessing) puts the
block under cross-process reference counting; a consumer that never decrements the counter (the
daemon) leaves blocks stuck in the training process (docs/ARCHITECTURE.md, "Pitfalls"). Here the
allocation is exported with the CUDA runtime directly:

* allocation base, size, buffer id and IPC capability in one driver call,
  ``cuPointerGetAttributes`` (RANGE_START_ADDR, RANGE_SIZE, BUFFER_ID,
  IS_LEGACY_CUDA_IPC_CAPABLE; libcuda.so.1): an IPC handle covers a whole cudaMalloc allocation,
  so the handle is taken of the *base* and each request carries ``offset = ptr - base``; the
  buffer id is unique per allocation for the process's lifetime, so the transport caches the
  handle per buffer id (a freed and reallocated address gets a new id, never a stale handle);
* ``cudaIpcGetMemHandle(base)`` (runtime API, libcudart): 64 bytes, once per allocation;
* ready events: ``cudaEventCreateWithFlags(cudaEventInterprocess | cudaEventDisableTiming)``,
  ``cudaIpcGetEventHandle`` (64 bytes), ``cudaEventRecord(event, stream)`` on the producing
  stream; the daemon's copy waits on it. An event must outlive every copy that waits on it:
  :class:`IpcEventPool` hands an event out again only after its offload completed;
* device identity: ``cuDeviceGetUuid`` formatted "GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx"
  (ordinals differ between processes under CUDA_VISIBLE_DEVICES; UUIDs do not).

Memory from VMM allocators (PyTorch ``expandable_segments:True``) and from the
``cudaMallocAsync`` backend's pools has no legacy IPC handle: :func:`check_allocator_config`
(the environment and PyTorch's current settings, which can change at run time) and memory whose
IS_LEGACY_CUDA_IPC_CAPABLE attribute is 0 raise OffloadConfigError, naming the setting.

CUDA's error state: a failed runtime call leaves its error as the thread's "last error", which
torch's next kernel-launch check would report as its own. Every failed runtime call here is
followed by ``cudaGetLastError()``, which clears it (driver-API calls keep no such state).

Every call must run on a thread whose current device/context owns the pointer (PyTorch's forward
and autograd device threads do). Not runnable without a GPU: tests/test_cuda_export.py drives it
with fake libraries.
"""

import ctypes
import ctypes.util
import os
import re
import sys
import threading

from .errors import CudaExportError, OffloadConfigError

CUDA_EVENT_DISABLE_TIMING = 0x02  # cudaEventDisableTiming
CUDA_EVENT_INTERPROCESS = 0x04    # cudaEventInterprocess
IPC_HANDLE_BYTES = 64             # sizeof(cudaIpcMemHandle_t) == sizeof(cudaIpcEventHandle_t)
# CU_POINTER_ATTRIBUTE_* (cuda.h): RANGE_START_ADDR, RANGE_SIZE, BUFFER_ID,
# IS_LEGACY_CUDA_IPC_CAPABLE, DEVICE_ORDINAL.
_POINTER_ATTRIBUTES = (11, 12, 7, 10, 9)
_CUDA_ERROR_NOT_READY = 600       # cudaErrorNotReady


class PointerInfo:
    """Where a device pointer lies: its allocation's ``base`` and ``size`` (bytes),
    ``buffer_id`` (unique per allocation for the process's lifetime), ``ipc_capable`` (False for
    VMM / memory-pool memory, which cudaIpcGetMemHandle cannot export), ``device`` (ordinal)."""

    __slots__ = ("base", "size", "buffer_id", "ipc_capable", "device")

    def __init__(self, base, size, buffer_id, ipc_capable, device):
        self.base, self.size, self.buffer_id = base, size, buffer_id
        self.ipc_capable, self.device = ipc_capable, device


class _Handle64(ctypes.Structure):
    # Unsigned bytes, not c_char: a c_char array field reads back truncated at its first NUL.
    _fields_ = [("reserved", ctypes.c_ubyte * IPC_HANDLE_BYTES)]


class _Uuid(ctypes.Structure):
    _fields_ = [("bytes", ctypes.c_ubyte * 16)]


ALLOCATOR_REMEDY = (
    "offloadd's CUDA transport needs memory with a legacy CUDA IPC handle (cudaMalloc "
    "segments): unset expandable_segments (PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False) "
    "and keep the native allocator backend for training with offloadd, or train without "
    "offloadd's hooks")


def _torch_allocator_settings():
    """(settings text, backend name) of PyTorch's CUDA allocator now, or ("", "") without
    torch/CUDA. The settings follow torch.cuda.memory._set_allocator_settings at run time."""
    import sys
    torch = sys.modules.get("torch")
    if torch is None:
        return "", ""
    settings = ""
    getter = getattr(torch._C, "_accelerator_getAllocatorSettings", None)
    if getter is not None:
        try:
            settings = getter() or ""
        except Exception:
            settings = ""
    backend = ""
    try:
        if torch.cuda.is_available():
            backend = torch.cuda.memory.get_allocator_backend()
    except Exception:
        backend = ""
    return settings, backend


def allocator_problem(environ=None, settings=None, backend=None):
    """Why PyTorch's allocator hands out memory offloadd cannot export, or None."""
    environ = os.environ if environ is None else environ
    if settings is None or backend is None:
        s, b = _torch_allocator_settings()
        settings = s if settings is None else settings
        backend = b if backend is None else backend
    sources = [(var, environ.get(var, "")) for var in ("PYTORCH_CUDA_ALLOC_CONF",
                                                      "PYTORCH_ALLOC_CONF")]
    sources.append(("PyTorch's current allocator settings", settings))
    for where, text in sources:
        if re.search(r"expandable_segments\s*:\s*true", text or "", re.I):
            return "%s sets expandable_segments:True (CUDA VMM memory)" % where
        if re.search(r"backend\s*:\s*cudaMallocAsync", text or "", re.I):
            return "%s selects the cudaMallocAsync backend (CUDA memory pools)" % where
    if backend == "cudaMallocAsync":
        return "PyTorch's allocator backend is cudaMallocAsync (CUDA memory pools)"
    return None


def check_allocator_config(environ=None, settings=None, backend=None):
    """Raises OffloadConfigError when PyTorch's CUDA allocator hands out memory without a
    legacy IPC handle: expandable segments or the cudaMallocAsync backend, set in the environment
    or at run time (``settings`` / ``backend`` override what torch reports, for tests)."""
    problem = allocator_problem(environ, settings, backend)
    if problem is not None:
        raise OffloadConfigError("%s: that memory has no legacy CUDA IPC handle. %s"
                                 % (problem, ALLOCATOR_REMEDY))


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
        rt.cudaStreamWaitEvent.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_uint]
        rt.cudaEventQuery.argtypes = [ctypes.c_void_p]
        rt.cudaGetLastError.argtypes = []
        drv.cuPointerGetAttributes.argtypes = [ctypes.c_uint, ctypes.POINTER(ctypes.c_int),
                                               ctypes.POINTER(ctypes.c_void_p), ctypes.c_uint64]
        drv.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64),
                                                ctypes.POINTER(ctypes.c_size_t), ctypes.c_uint64]
        drv.cuDeviceGet.argtypes = [ctypes.POINTER(ctypes.c_int), ctypes.c_int]
        drv.cuDeviceGetUuid.argtypes = [ctypes.POINTER(_Uuid), ctypes.c_int]
        drv.cuGetErrorString.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_char_p)]

    def _rt(self, rc, call):
        if rc != 0:
            # Clear the thread's last error, or torch's next launch check reports it as its own.
            self.cudart.cudaGetLastError()
            msg = self.cudart.cudaGetErrorString(rc)
            raise CudaExportError("%s failed: error %d (%s)"
                                  % (call, rc, msg.decode() if msg else "?"))

    def pointer_info(self, ptr):
        """PointerInfo of device pointer ``ptr`` (one cuPointerGetAttributes call): allocation
        base and size, buffer id (unique per allocation for the process's lifetime), whether
        cudaIpcGetMemHandle can export it, device ordinal."""
        attrs = (ctypes.c_int * 5)(*_POINTER_ATTRIBUTES)
        base, size, buffer_id = ctypes.c_uint64(), ctypes.c_size_t(), ctypes.c_uint64()
        ipc, ordinal = ctypes.c_int(), ctypes.c_int()
        data = (ctypes.c_void_p * 5)(*[ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
                                       for v in (base, size, buffer_id, ipc, ordinal)])
        self._drv(self.libcuda.cuPointerGetAttributes(5, attrs, data, ctypes.c_uint64(ptr)),
                  "cuPointerGetAttributes(0x%x)" % ptr)
        if size.value == 0:
            raise CudaExportError("0x%x is not device memory known to CUDA (no allocation range)"
                                  % ptr)
        return PointerInfo(base.value, size.value, buffer_id.value, bool(ipc.value),
                           ordinal.value)

    def stream_wait_event(self, stream, event):
        """cudaStreamWaitEvent(stream, event, 0): the stream's later work waits for the event's
        last record (``stream``: a cudaStream_t as int)."""
        self._rt(self.cudart.cudaStreamWaitEvent(ctypes.c_void_p(stream), ctypes.c_void_p(event),
                                                 0), "cudaStreamWaitEvent")

    def event_query(self, event):
        """True when the work captured by the event's last record has completed."""
        rc = self.cudart.cudaEventQuery(ctypes.c_void_p(event))
        if rc == _CUDA_ERROR_NOT_READY:
            self.cudart.cudaGetLastError()  # not an error, but the runtime records it
            return False
        self._rt(rc, "cudaEventQuery")
        return True

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
        """64 handle bytes of the allocation at ``base`` (must be an allocation base; a
        PointerInfo is accepted too)."""
        base = getattr(base, "base", base)
        h = _Handle64()
        rc = self.cudart.cudaIpcGetMemHandle(ctypes.byref(h), ctypes.c_void_p(base))
        if rc != 0:
            # The last error is cleared before any error is raised, the allocator's one included.
            self.cudart.cudaGetLastError()
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
    """An interprocess event: ``event`` (cudaEvent_t as int) and its 64 ``handle`` bytes."""

    __slots__ = ("event", "handle")

    def __init__(self, event, handle):
        self.event, self.handle = event, handle


class IpcEventPool:
    """Interprocess events reused across requests (creating one costs a driver call and the
    daemon caches opened handles). ``acquire`` a free event or make one with ``factory()``;
    ``release`` it only once nothing will use its last record: for an offload's or a reload's
    ready event once the daemon answered, for a reload's done event once a stream wait on it
    was enqueued (a wait captures the record it follows). Thread-safe."""

    def __init__(self, factory):
        self._factory = factory
        self._free = []
        self._lock = threading.Lock()
        self.created = 0

    def acquire(self):
        try:
            return self._free.pop()  # list.pop and list.append are atomic: no lock per event
        except IndexError:
            pass
        ev = self._factory()
        with self._lock:
            self.created += 1
        return ev

    def release(self, ev):
        self._free.append(ev)


class TorchCudaDevice:
    """The device side of offloadd's CUDA transport on a real GPU, through torch (streams,
    allocation) and :class:`CudaRuntime` (IPC handles, events). The transport
    (offloadd/torch/_transport.py) is written against this interface; offloadd.testing.sim_gpu has
    the simulated twin. Streams are torch.cuda.Stream objects; events are :class:`IpcEvent`."""

    simulated = False

    def __init__(self, runtime=None):
        self.rt = runtime or CudaRuntime()
        self._reload_streams = {}
        self._lock = threading.Lock()

    def context(self, device):
        import torch
        return torch.cuda.device(device)

    def adopt(self, t):
        """The device tensor the daemon reads for ``t`` (``t`` itself on a real GPU)."""
        return t

    def check_allocator(self):
        check_allocator_config()

    def describe(self, ptr):
        info = self.rt.pointer_info(ptr)
        if not info.ipc_capable:
            problem = allocator_problem() or "this tensor's memory is not from cudaMalloc"
            raise OffloadConfigError("%s: that memory has no legacy CUDA IPC handle. %s"
                                     % (problem, ALLOCATOR_REMEDY))
        return info

    def mem_handle(self, info):
        return self.rt.ipc_mem_handle(info.base)

    def new_event(self):
        return IpcEvent(*self.rt.create_ipc_event())

    def current_stream(self, device):
        import torch
        return torch.cuda.current_stream(device)

    def reload_stream(self, device):
        """A side stream per device that reload destinations are allocated on: it runs no
        kernels, so memory the caching allocator hands out there is not in use by queued work
        (what freed blocks the compute stream still used wait for is their record_stream)."""
        import torch
        key = torch.device(device).index
        with self._lock:
            s = self._reload_streams.get(key)
            if s is None:
                s = self._reload_streams[key] = torch.cuda.Stream(device)
            return s

    def empty_on(self, meta, stream):
        import torch
        with torch.cuda.stream(stream):
            return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype,
                                       device=meta.device)

    def record(self, ev, stream):
        self.rt.record_event(ev.event, stream.cuda_stream)

    def wait(self, stream, ev, expect_seq=None):
        self.rt.stream_wait_event(stream.cuda_stream, ev.event)

    def query(self, ev):
        return self.rt.event_query(ev.event)

    def event_seq(self, ev):
        return None  # only the simulation can see how often an event was recorded

    def record_stream(self, t, stream):
        t.record_stream(stream)

    def before_host_read(self, stream, meta):
        """Nothing on a real GPU: the stream waits, the host does not."""
        return 0.0
