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

CudaIpcTransport (daemon backend "cuda"; CUDA tensors, or simulated ones): the daemon reads the
tensor's own memory, and nothing on the training thread waits for the GPU (the event protocol,
proto/offload.proto and docs/ARCHITECTURE.md):

* offload: region = the caching allocator's segment (IPC handle of the allocation base, cached
  per allocation buffer id; offset per request); a ready event recorded on the current stream
  after the producing kernels; the daemon issues no chunk before it completed. The tensor is
  held until OffloadDone, and a backward that needs it before then gets it back as it is.
* reload: the destination is allocated on a side stream that runs no kernels (so the caching
  allocator hands out memory no queued kernel uses), with a ready event recorded there after the
  allocation; the daemon records the request's done event right after its last chunk and answers
  at once; the unpack makes the current stream wait on the done event (cudaStreamWaitEvent) and
  returns -- the host waits only when the answer has not arrived yet (counted in stats).
* mappings follow the allocator: the daemon holds a segment mapped only while a transfer of it
  is in flight, and the transport keeps the tensor (or destination) alive until then.

Both implement offloadd.torch._transport_protocol.Transport, the methods the store calls (with
their shapes, units and errors). The device calls go through a device object:
offloadd.cuda.TorchCudaDevice on a GPU, or offloadd.testing.sim_gpu.SimCudaDevice on a simulated
one (then every reload's bytes are checked against a checksum taken at offload).
"""

import collections
import threading
import time
import zlib

import torch

from .. import _outcome
from .. import cuda as _cuda
from .. import errors
from ..shm import StagingArena
from . import _stats


class Meta:
    """Layout of a saved tensor: shape, stride, dtype, device, numel, nbytes (int bytes);
    checksum (CRC-32 of its bytes) on a simulated GPU only."""

    __slots__ = ("shape", "stride", "dtype", "device", "numel", "nbytes", "checksum")

    def __init__(self, t):
        self.shape, self.stride = tuple(t.shape), tuple(t.stride())
        self.dtype, self.device = t.dtype, t.device
        self.numel, self.nbytes = t.numel(), t.nbytes
        self.checksum = None


def crc32(t):
    """CRC-32 of a dense tensor's bytes (host memory)."""
    return zlib.crc32(flat(t).contiguous().view(torch.uint8).numpy())


def note_host_wait(stats, seconds, device_key=None):
    """Counts one wait of the training thread on offloadd (a daemon answer, a staging slot) in
    ``stats`` and in the process's totals for ``device_key`` (reported to the daemon)."""
    if stats is not None:
        stats.add(host_waits=1, host_wait_seconds=seconds)
    if device_key is not None:
        _stats.count_for_device(device_key, host_waits=1, host_wait_seconds=seconds)


def wait_for_answer(client, future, stats, unresponsive_seconds, device_key=None):
    """The future's result (Client.wait, bounded by the daemon's silence), counting a host wait
    in ``stats`` (and for ``device_key``) when it had not resolved yet."""
    if future.done():
        return future.result()
    t0 = time.monotonic()
    try:
        return client.wait(future, unresponsive_seconds=unresponsive_seconds, what="a reload")
    finally:
        note_host_wait(stats, time.monotonic() - t0, device_key)


def flat(t):
    """The dense span of ``t`` as a 1-D tensor of ``t.dtype`` (a view)."""
    return t.as_strided((t.numel(),), (1,), t.storage_offset())


def empty_like_meta(meta, device=None, pin_memory=False):
    return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype,
                               device=meta.device if device is None else device,
                               pin_memory=pin_memory)


class OffloadOp:
    __slots__ = ("future", "slot", "tensor", "event", "orphan_reload")

    def __init__(self, future, slot=None, tensor=None, event=None):
        self.future, self.slot, self.tensor, self.event = future, slot, tensor, event
        self.orphan_reload = None


class ReloadOp:
    """A reload's destination and completion (``done``: an outcome of ReloadDone, from
    Client.reload_outcome: waited on, failed or given callbacks before the request is sent, and
    completed by its answer; a wait takes the ring's answers meanwhile). CUDA: its ready
    and done events, and the done event's record count when sent (simulated GPU)."""

    __slots__ = ("slot", "dest", "region_id", "offset", "ready_event", "done_event", "done_seq",
                 "done", "sent", "priority", "release_after")

    def __init__(self, slot=None, dest=None, region_id=0, offset=0, ready_event=None,
                 done_event=None, client=None):
        self.slot, self.dest, self.region_id, self.offset = slot, dest, region_id, offset
        self.ready_event, self.done_event, self.done_seq = ready_event, done_event, None
        # Completed by the reload's answer (Client.reload ``into``), or failed before it is
        # sent; a plain outcome without a client (tests).
        self.done = client.reload_outcome() if client is not None else _outcome.Outcome()
        self.sent = False
        self.priority = 0
        self.release_after = False  # the daemon frees the block once this reload copied it


class ShmTransport:
    """Staging through a per-client shared-memory arena (see module doc); a Transport
    (offloadd.torch._transport_protocol)."""

    device_key = None  # set by the Endpoint: host waits count toward this device's totals

    def __init__(self, client, grow_bytes=16 << 20, max_bytes=1 << 30, alloc_timeout_seconds=30.0):
        self.client = client
        self._lock = threading.Lock()
        self.alloc_timeout_seconds = alloc_timeout_seconds
        self.arena = StagingArena(client.register_shm, grow_bytes, max_bytes,
                                  unregister=lambda rid: client.unregister(rid),
                                  keep_names=client.reconnect and client.resume_grace_seconds > 0,
                                  access=(client.shm_mode, client.shm_gid))

    def _staged(self, slot, meta):
        return torch.frombuffer(self.arena.view(slot), dtype=meta.dtype, count=meta.numel)

    def _pump(self, seconds):
        """For StagingArena.alloc: staging slots are freed by the answers of the offloads that
        read them; on the request ring those are taken by a thread that asks (Client.pump):
        this one, while it waits for room. False when nothing is in flight on the ring."""
        if not self.client._ring_ops:
            return False
        self.client.pump(seconds)
        return True

    def _silence(self, bound):
        """For StagingArena.alloc's ``abort``: DaemonUnresponsive once the daemon has been
        silent for ``bound`` seconds (None: the client's unresponsive_seconds), else None."""
        bound = self.client.unresponsive_seconds if bound is None else bound
        if self.client.silent_seconds() < bound:
            return None
        return errors.DaemonUnresponsive(
            "the offloadd daemon at %s sent nothing for %.1f s (unresponsive_seconds) while "
            "this process waited for staging room: it is unresponsive, not known to have lost "
            "anything" % (self.client.target, bound))

    def start_offload(self, t, meta, ordering=None, timeout=None, unresponsive_seconds=None,
                      check_allocator=True, target=None):
        """Stages ``t`` and sends Offload; an OffloadOp. Waits for staging room (or a new
        region's registration) at most ``timeout`` seconds (None: alloc_timeout_seconds) and
        no longer than the daemon stays silent for ``unresponsive_seconds``: TimeoutError,
        DaemonUnresponsive. ``check_allocator``, ``target``: unused (no device allocator; the
        staging slot is freed by finish_offload, so every answer is handled in Python)."""
        wait = self.alloc_timeout_seconds if timeout is None \
            else min(timeout, self.alloc_timeout_seconds)
        slot = self.arena.alloc(meta.nbytes, timeout=wait,
                                abort=lambda: self._silence(unresponsive_seconds),
                                pump=self._pump)
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
        the arena is full instead of waiting for room: a prefetch is never worth a stall. A
        wait ends with DaemonUnresponsive when the daemon stays silent (Client.wait)."""
        timeout = self.alloc_timeout_seconds if wait else 0
        return ReloadOp(slot=self.arena.alloc(meta.nbytes, timeout=timeout,
                                              abort=lambda: self._silence(None),
                                              pump=self._pump), client=self.client)

    def send_reload(self, op, block_id, priority, release_after=False):
        """Sends the reload of ``block_id`` into ``op``'s slot; ``release_after``: the daemon
        frees the block once copied (the hooks' reloads: a handle keeps what it reloaded)."""
        op.sent, op.release_after = True, release_after
        self.client.reload(block_id, op.slot.region_id, op.slot.offset, priority,
                           release_after=release_after, into=op.done)

    def in_flight_tensor(self, op):
        """None: the staged copy is not the saved tensor (see CudaIpcTransport)."""
        return None

    def finish_reload(self, op, meta, stats=None, unresponsive_seconds=None):
        """Waits for ReloadDone (a host wait, counted in ``stats``, when it has not arrived;
        Client.wait: DaemonUnresponsive after ``unresponsive_seconds`` of silence); returns a
        new tensor with the saved layout on meta.device."""
        try:
            wait_for_answer(self.client, op.done, stats, unresponsive_seconds, self.device_key)
            with self._lock:  # the copy owns the slot: no other thread frees it meanwhile
                slot, op.slot = op.slot, None
            if slot is None:
                raise errors.OffloaddError(
                    errors.FAILED_PRECONDITION, "this reload's staging slot was already freed "
                    "(the reload was finished or abandoned by another thread): reload the "
                    "block again")
            try:
                out = empty_like_meta(meta, device="cpu")
                flat(out).copy_(self._staged(slot, meta))
            finally:
                self.arena.free(slot)
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


# Reload destinations a daemon that stopped answering may still write if it resumes (its session
# was abandoned, not closed): kept until the process ends, never reused.
_QUARANTINED = []


def _quarantine_unanswered(future, dest):
    if isinstance(future.exception(), errors.DaemonUnresponsive):
        _QUARANTINED.append(dest)


class CudaIpcTransport:
    """The daemon copies device memory directly through CUDA IPC (see module doc); a Transport
    (offloadd.torch._transport_protocol).
    ``device``: offloadd.cuda.TorchCudaDevice or offloadd.testing.sim_gpu.SimCudaDevice."""

    device_key = None  # set by the Endpoint: host waits count toward this device's totals
    MAX_REGIONS = 1024     # registered segments kept; the least recently used is unregistered

    def __init__(self, client, device):
        self.client, self.dev = client, device
        self.events = _cuda.IpcEventPool(device.new_event)
        self._regions = collections.OrderedDict()  # allocation buffer id -> region id
        self._lock = threading.Lock()
        self._abandoned = []  # reloads whose destination waits for the daemon's copy to end

    def region_for(self, info):
        """The region id of the allocation ``info`` describes; registers it once (keyed by its
        buffer id: a freed and reallocated address has a new one)."""
        with self._lock:
            rid = self._regions.get(info.buffer_id)
            if rid is not None:
                self._regions.move_to_end(info.buffer_id)
                return rid
        rid = self.client.register_cuda(self.dev.mem_handle(info), info.size)
        evicted = []
        with self._lock:
            self._regions[info.buffer_id] = rid
            while len(self._regions) > self.MAX_REGIONS:
                evicted.append(self._regions.popitem(last=False)[1])
        for old in evicted:  # the daemon holds no mapping of an idle region anyway
            self.client.unregister(old)
        return rid

    def _export(self, t, nbytes):
        """(region id, offset) of ``t``'s span; OffloadConfigError for memory without IPC."""
        ptr = t.data_ptr()
        info = self.dev.describe(ptr)
        offset = ptr - info.base
        if offset + nbytes > info.size:
            raise errors.CudaExportError("span 0x%x + %d bytes runs past its allocation "
                                         "(base 0x%x, %d bytes)" % (ptr, nbytes, info.base,
                                                                    info.size))
        return self.region_for(info), offset

    def start_offload(self, t, meta, ordering=None, timeout=None, unresponsive_seconds=None,
                      check_allocator=True, target=None):
        """The op holds the device tensor (and the event) until OffloadDone: the daemon reads
        it. ``ordering``: (step, position) for the daemon's spill tier (``Client.offload``).
        ``target``: a weak reference to the hooks' handle, whose OffloadDone the client may
        then apply in C (it does this transport's finish_offload: see Client.offload). A
        segment's first registration waits as Client.wait does (``timeout`` unused here).
        ``check_allocator``: check PyTorch's allocator settings first (they may change at run
        time; the hooks do it at a step's first offload: OffloadConfigError)."""
        if check_allocator:
            self.dev.check_allocator()
        if self._abandoned:
            self.collect()
        with self.dev.context(t.device):
            src = self.dev.adopt(t)
            if self.dev.simulated and self.dev.checksums:
                meta.checksum = self.dev.checksum(src)
            rid, offset = self._export(src, meta.nbytes)
            ev = self.events.acquire()
            try:
                self.dev.record(ev, self.dev.current_stream(t.device))
                future = self.client.offload(
                    rid, offset, meta.nbytes, ready_event=ev.handle, ordering=ordering,
                    target=None if target is None else (target, self.events._free))
            except BaseException:
                self.events.release(ev)
                raise
        return OffloadOp(future, tensor=src, event=ev)

    def in_flight_tensor(self, op):
        """The device tensor an offload still in flight reads: a backward that needs it before
        OffloadDone uses it as it is (no reload)."""
        return op.tensor

    def finish_offload(self, op):
        if op.event is not None:
            self.events.release(op.event)
            op.event = None
        op.tensor = None

    def rescue(self, op, meta, pin_memory):
        """After a failed offload the device tensor simply stays (it was held all along)."""
        return op.tensor

    def prepare_reload(self, meta, wait=True):
        if self._abandoned:
            self.collect()
        with self.dev.context(meta.device):
            stream = self.dev.reload_stream(meta.device)
            dest = self.dev.empty_on(meta, stream)
            rid, offset = self._export(dest, meta.nbytes)
            ready, done = self.events.acquire(), self.events.acquire()
            self.dev.record(ready, stream)
        return ReloadOp(dest=dest, region_id=rid, offset=offset, ready_event=ready,
                        done_event=done, client=self.client)

    def send_reload(self, op, block_id, priority, release_after=False):
        """As ShmTransport.send_reload, with the event protocol's two events. The op is
        marked sent just before the request goes (the device call before it may raise: an op
        not marked never went out)."""
        seq = self.dev.event_seq(op.done_event)
        op.done_seq = None if seq is None else seq + 1  # the daemon's record
        op.sent, op.release_after = True, release_after
        self.client.reload(block_id, op.region_id, op.offset, priority,
                           release_after=release_after, ready_event=op.ready_event.handle,
                           done_event=op.done_event.handle, into=op.done)

    def finish_reload(self, op, meta, stats=None, unresponsive_seconds=None):
        """The destination, with the current stream ordered after the daemon's copy. The host
        waits (counted in ``stats``) only while ReloadDone has not arrived; DaemonUnresponsive
        after ``unresponsive_seconds`` of silence (the destination is then quarantined: a daemon
        that resumes may still write it)."""
        try:
            reply = wait_for_answer(self.client, op.done, stats, unresponsive_seconds,
                                    self.device_key)
        except errors.DaemonUnresponsive:
            _QUARANTINED.append(op.dest)
            raise
        stream = self.dev.current_stream(meta.device)
        if reply.done_event_recorded:
            self.dev.wait(stream, op.done_event, op.done_seq)
        self.dev.record_stream(op.dest, stream)
        self.events.release(op.ready_event)
        self.events.release(op.done_event)  # the wait above captured its record
        if self.dev.simulated and self.dev.checksums:
            self._check_simulated(op, meta, stream)
        return op.dest

    def _check_simulated(self, op, meta, stream):
        """Simulated GPU: the bytes the consumer reads are the ones offloaded."""
        self.dev.before_host_read(stream, meta)
        if meta.checksum is not None and self.dev.checksum(op.dest) != meta.checksum:
            raise errors.OffloaddError(errors.DATA_LOSS,
                                       "simulated GPU: a reloaded tensor's bytes differ from "
                                       "the offloaded ones (checksum mismatch)")

    def release_dest(self, op):
        pass  # the destination is a tensor: it dies with its last reference

    def abandon_reload(self, op):
        """A reload nobody will consume: its destination is kept until the daemon's copy into
        it has ended (its done event completed), so the allocator cannot hand the memory out
        while it is being written."""
        if not op.sent:
            self.events.release(op.ready_event)
            self.events.release(op.done_event)
            return
        op.done.add_done_callback(lambda f, op=op: self._park(op, f))

    def _park(self, op, future):
        if isinstance(future.exception(), errors.DaemonUnresponsive):
            _QUARANTINED.append(op.dest)  # a daemon that resumes may still write it
            return
        with self._lock:
            self._abandoned.append(op)

    def collect(self):
        """Lets go of abandoned destinations whose copy has ended. Cheap; called on offload
        and reload (never on the client's reader thread)."""
        if not self._abandoned:  # the usual case: nothing parked, no lock taken
            return
        with self._lock:
            parked, self._abandoned = self._abandoned, []
        left = []
        for op in parked:
            if op.done.exception() is None and op.done.result().done_event_recorded and \
                    not self.dev.query(op.done_event):
                left.append(op)
                continue
            self.events.release(op.ready_event)
            self.events.release(op.done_event)
        with self._lock:
            self._abandoned.extend(left)

    def close(self):
        pass
