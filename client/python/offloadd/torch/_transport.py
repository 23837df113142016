"""Moving one tensor's bytes to and from the daemon: shm staging or CUDA IPC.

A saved tensor is offloaded as its *dense span*: for a tensor whose elements are non-overlapping
and dense (contiguous, or a permutation of contiguous such as a transpose), the ``numel`` elements
occupy one run of ``numel * element_size`` bytes starting at ``data_ptr()``. Reload recreates the
same sizes and strides (``torch.empty_strided``) and fills the same span, so the unpacked tensor
is bitwise and layout-identical to the saved one (kernels pick the same paths, results stay
bitwise equal). Tensors that are not dense are left in place by the store.

ShmTransport (daemon backend "shm"; any device): copy the span into a slot of the client's
shared-memory staging arena (offloadd.shm), send Offload, free the slot on OffloadDone; reload
into a slot, then copy into a new tensor (``.to(device)`` for a non-CPU tensor).

CudaIpcTransport (daemon backend "cuda"; CUDA tensors): the daemon reads the tensor's own memory:
region = the caching allocator's segment (IPC handle of the allocation base, offset per request),
ordered after the producing kernels by an interprocess event recorded on the current stream. The
tensor is held until OffloadDone. Reloads go into a fresh ``torch.empty_strided`` tensor; the
daemon is told to write only after an event recorded on the current stream after the allocation
has completed (EventGate), because the caching allocator may hand out memory that queued kernels
still use. ReloadDone means the copy finished. Not runnable here (no GPU); see offloadd/cuda.py.
"""

import collections
import concurrent.futures
import threading

import torch

from .. import cuda as _cuda
from .. import errors
from ..shm import StagingArena


class Meta:
    """Layout of a saved tensor: shape, stride, dtype, device, numel, nbytes (int bytes)."""

    __slots__ = ("shape", "stride", "dtype", "device", "numel", "nbytes")

    def __init__(self, t):
        self.shape, self.stride = tuple(t.shape), tuple(t.stride())
        self.dtype, self.device = t.dtype, t.device
        self.numel = t.numel()
        self.nbytes = self.numel * t.element_size()


def dense_span(t):
    """True when ``t``'s elements fill exactly ``numel`` consecutive elements of memory."""
    if t.is_contiguous():
        return True
    expected = 1
    for stride, size in sorted((st, sz) for sz, st in zip(t.shape, t.stride()) if sz != 1):
        if stride != expected:
            return False
        expected *= size
    return True


def flat(t):
    """The dense span of ``t`` as a 1-D tensor of ``t.dtype`` (a view)."""
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def empty_like_meta(meta, device=None, pin_memory=False):
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype,
                               device=meta.device if device is None else device,
                               pin_memory=pin_memory)


def chain(src, dst):
    """Completes Future ``dst`` with ``src``'s outcome."""
    def done(f):
        exc = f.exception()
        if exc is not None:
            dst.set_exception(exc)
        else:
            dst.set_result(f.result())
    src.add_done_callback(done)


class OffloadOp:
    __slots__ = ("future", "slot", "tensor", "event", "orphan_reload")

    def __init__(self, future, slot=None, tensor=None, event=None):
        self.future, self.slot, self.tensor, self.event = future, slot, tensor, event
        self.orphan_reload = None


class ReloadOp:
    """A reload's destination and completion (``done``: Future of ReloadDone)."""

    __slots__ = ("slot", "dest", "region_id", "offset", "gate_event", "done", "sent", "priority")

    def __init__(self, slot=None, dest=None, region_id=0, offset=0, gate_event=None):
        self.slot, self.dest, self.region_id, self.offset = slot, dest, region_id, offset
        self.gate_event = gate_event
        self.done = concurrent.futures.Future()
        self.sent = False
        self.priority = 0


class ShmTransport:
    """Staging through a per-client shared-memory arena (see module doc)."""

    def __init__(self, client, grow_bytes=16 << 20, max_bytes=1 << 30, alloc_timeout_seconds=30.0):
        self.client = client
        self._lock = threading.Lock()
        self.alloc_timeout_seconds = alloc_timeout_seconds
        self.arena = StagingArena(client.register_shm, grow_bytes, max_bytes,
                                  unregister=lambda rid: client.unregister(rid),
                                  keep_names=client.reconnect and client.resume_grace_seconds > 0)

    def _staged(self, slot, meta):
        return torch.frombuffer(self.arena.view(slot), dtype=meta.dtype, count=meta.numel)

    def start_offload(self, t, meta, ordering=None):
        slot = self.arena.alloc(meta.nbytes, timeout=self.alloc_timeout_seconds)
        try:
            self._staged(slot, meta).copy_(flat(t))
            future = self.client.offload(slot.region_id, slot.offset, meta.nbytes,
                                         ordering=ordering)
        except BaseException:
            self.arena.free(slot)
            raise
        return OffloadOp(future, slot=slot)

    def finish_offload(self, op):
        if op.slot is not None:
            self.arena.free(op.slot)
            op.slot = None

    def rescue(self, op, meta, pin_memory):
        """After a failed offload: an in-process copy from the staging slot (host memory,
        pinned when asked and CUDA is there; the store moves it back to the device on unpack)."""
        pin = pin_memory and meta.device.type == "cuda" and torch.cuda.is_available()
        host = empty_like_meta(meta, device="cpu", pin_memory=pin)
        flat(host).copy_(self._staged(op.slot, meta))
        return host

    def prepare_reload(self, meta, wait=True):
        """A reload's staging slot. ``wait=False`` (prefetches) raises TimeoutError at once when
        the arena is full instead of waiting for room: a prefetch is never worth a stall."""
        timeout = self.alloc_timeout_seconds if wait else 0
        return ReloadOp(slot=self.arena.alloc(meta.nbytes, timeout=timeout))

    def send_reload(self, op, block_id, priority):
        op.sent = True
        chain(self.client.reload(block_id, op.slot.region_id, op.slot.offset, priority), op.done)

    def finish_reload(self, op, meta):
        """Waits for ReloadDone; returns a new tensor with the saved layout on meta.device."""
        try:
            op.done.result()
            out = empty_like_meta(meta, device="cpu")
            flat(out).copy_(self._staged(op.slot, meta))
        finally:
            self.release_dest(op)
        if meta.device.type != "cpu":
            out = out.to(meta.device)
        return out

    def release_dest(self, op):
        """Frees the reload's slot; idempotent, any thread."""
        with self._lock:
            slot, op.slot = op.slot, None
        if slot is not None:
            self.arena.free(slot)

    def abandon_reload(self, op):
        """Frees a reload's slot once the daemon can no longer write it."""
        if not op.sent:
            self.release_dest(op)
        else:
            op.done.add_done_callback(lambda _: self.release_dest(op))

    def close(self):
        self.arena.close()


class CudaIpcTransport:
    """The daemon copies device memory directly through CUDA IPC (see module doc)."""

    MAX_REGIONS = 1024     # registered segments kept; the least recently used is unregistered

    def __init__(self, client, runtime=None):
        self.client = client
        self.rt = runtime or _cuda.CudaRuntime()
        self.events = _cuda.IpcEventPool(self.rt)
        self.gate = _cuda.EventGate()
        self._regions = collections.OrderedDict()  # IPC handle bytes -> region id
        self._lock = threading.Lock()

    def region_for(self, ptr, nbytes):
        """(region id, offset) of device pointer ``ptr``; registers its allocation once
        (keyed by handle bytes: a freed and reallocated address gets a new handle)."""
        base, size = self.rt.allocation_range(ptr)
        offset = ptr - base
        if offset + nbytes > size:
            raise errors.CudaExportError("span 0x%x + %d bytes runs past its allocation "
                                         "(base 0x%x, %d bytes)" % (ptr, nbytes, base, size))
        handle = self.rt.ipc_mem_handle(base)
        with self._lock:
            rid = self._regions.get(handle)
            if rid is not None:
                self._regions.move_to_end(handle)
                return rid, offset
        rid = self.client.register_cuda(handle, size)
        evicted = []
        with self._lock:
            self._regions[handle] = rid
            while len(self._regions) > self.MAX_REGIONS:
                evicted.append(self._regions.popitem(last=False)[1])
        for old in evicted:
            self.client.unregister(old)
        return rid, offset

    def start_offload(self, t, meta, ordering=None):
        """The op holds ``t`` (and the event) until OffloadDone: the daemon reads ``t``.
        ``ordering``: (step, position) for the daemon's spill tier (``Client.offload``)."""
        _cuda.check_allocator_config()
        with torch.cuda.device(t.device):  # CUDA calls on the thread's context of t's device
            rid, offset = self.region_for(t.data_ptr(), meta.nbytes)
            ev = self.events.acquire()
            try:
                self.rt.record_event(ev.event, torch.cuda.current_stream(t.device).cuda_stream)
                future = self.client.offload(rid, offset, meta.nbytes, ready_event=ev.handle,
                                             ordering=ordering)
            except BaseException:
                self.events.release(ev)
                raise
        return OffloadOp(future, tensor=t, event=ev)

    def finish_offload(self, op):
        if op.event is not None:
            self.events.release(op.event)
            op.event = None
        op.tensor = None

    def rescue(self, op, meta, pin_memory):
        """After a failed offload the device tensor simply stays (it was held all along)."""
        return op.tensor

    def prepare_reload(self, meta, wait=True):
        with torch.cuda.device(meta.device):
            dest = empty_like_meta(meta)
            rid, offset = self.region_for(dest.data_ptr(), meta.nbytes)
            ev = torch.cuda.Event()
            ev.record(torch.cuda.current_stream(meta.device))
        return ReloadOp(dest=dest, region_id=rid, offset=offset, gate_event=ev)

    def send_reload(self, op, block_id, priority):
        op.sent = True

        def send():
            chain(self.client.reload(block_id, op.region_id, op.offset, priority), op.done)
        self.gate.submit(op.gate_event.synchronize, send)

    def finish_reload(self, op, meta):
        op.done.result()
        # The destination may have been allocated on another stream (a prefetch): tell the
        # caching allocator it is used on the current one.
        op.dest.record_stream(torch.cuda.current_stream(meta.device))
        return op.dest

    def release_dest(self, op):
        pass  # the destination is a tensor: it dies with its last reference

    def abandon_reload(self, op):
        if op.sent:  # keep dest alive until the daemon has written it
            op.done.add_done_callback(lambda _, keep=op.dest: None)

    def close(self):
        pass
