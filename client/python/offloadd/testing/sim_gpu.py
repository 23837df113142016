"""A simulated CUDA GPU for the client side: device memory, a caching allocator, streams with
modelled kernel times, interprocess memory and event handles -- in one shared-memory table that a
daemon running ``--backend=cuda-sim`` reads and writes (layout: common/sim_gpu_table.h).

With it the CUDA data path -- IPC handles, the event protocol (proto/offload.proto, ReloadRequest),
mappings that follow the allocator, expandable segments, the CUDA error state -- runs and is
checked on machines without a GPU, with the bytes moved by the daemon and compared here. Every
time it reports is SIMULATED: kernels take the time they are told to, copies the time the
daemon's timing model gives.

What is modelled, and how it maps to CUDA:

* :class:`SimGpu` -- one client process's simulated GPUs (``devices`` of ``device_bytes`` each),
  backed by the table "/ofd-simgpu-<pid>" (0600; removed by :meth:`SimGpu.close` or at exit;
  tables of killed processes are removed by the next SimGpu: :func:`sweep_stale_tables`). One
  SimGpu per process at a time: the daemon finds the table by the pid.
* :class:`SimAllocator` -- PyTorch's caching allocator in outline: segments (cudaMalloc) of 2 MiB
  for requests up to 1 MiB (the small pool, which serves only those), 20 MiB up to 10 MiB, else
  the request rounded up to 2 MiB; blocks split inside segments and cached per stream (the one
  a segment was first allocated for) after free; ``record_stream`` defers reuse until
  the recorded streams have passed the free; :meth:`SimAllocator.empty_cache` frees every
  unused segment; an allocation that does not fit frees every cached segment and retries once
  (torch's retry after a failed cudaMalloc), else raises :class:`SimOutOfMemoryError`. With
  ``expandable_segments`` on (constructor, or :meth:`SimGpu.set_allocator_settings` at run time,
  as ``torch.cuda.memory._set_allocator_settings``) new segments are VMM memory, which has no
  legacy IPC handle, as in CUDA.
* Tensors are CPU tensors viewing the simulated device memory (``torch.from_numpy`` over the
  table's mapping); a block returns to the allocator when its last view dies.
* :class:`SimStream` -- a timeline: ``kernel(seconds)`` queues modelled work; an event recorded
  on a stream completes when the stream's work before it does; ``wait_event`` orders the stream
  after an event (a pending daemon event: resolved when the daemon writes its completion).
  ``synchronize`` blocks the host until the stream's work is done: the simulated GPU runs its
  kernels on the CPU when they are queued, so a stream that waits on a pending event holds the
  host there. Callers count that as device time, never as a host wait.
* :class:`SimCudaRuntime` -- the calls offloadd's transport makes, with CUDA's error state: a
  failed call sets the last error (``peek_last_error``) until someone clears it
  (``get_last_error``, cudaGetLastError), as the runtime does for torch's next launch check.
* Violations the table counts (bugs of whichever side caused them): a segment freed while the
  daemon had it mapped, a daemon copy on freed memory, a stream wait on an event not recorded
  since the request (CUDA would order nothing), a reload read before its done event completed.

Benchmark knobs (attributes of :class:`SimGpu`, also constructor arguments), so that the simulated
device's own work neither hides nor inflates the cost of the client around it:

* ``checksums`` (True): the CUDA transport takes a CRC-32 of every offloaded tensor and checks
  the reloaded bytes against it, after making the host wait for the reload's stream. False: no
  CRC and no host wait (as on a GPU, where the host never reads a reloaded tensor); the bytes
  are still moved by the daemon.
* ``count_own_cpu`` (False): True counts the whole simulated device's CPU apart, per thread: the
  thread CPU time spent inside every entry point of the simulation (the methods of
  :class:`SimCudaDevice` and :class:`SimCudaRuntime` that offloadd's transport calls, those of
  :class:`SimGpu`, :class:`SimStream` and :class:`SimEvent` that code driving the device calls,
  the device kind's ``key``/``open``, a tensor's block returning to the allocator when its last
  view dies, and the resolver thread's rounds). That is the simulated CUDA runtime and driver
  (events, streams, pointer queries, IPC handles), its caching allocator, copies into simulated
  memory (``SimCudaDevice.adopt``) and the checksums. An entry point called from inside another
  is counted once, in the outermost (a per-thread depth flag). Read with
  :meth:`SimGpu.own_cpu_seconds` / :meth:`SimGpu.own_cpu_ns`, the number of outermost calls with
  :meth:`SimGpu.own_calls`. The counting costs two reads of the thread's CPU clock per outermost
  call; what of that falls outside the counted window (about half of each read, and the
  wrapper's call) stays the caller's: :meth:`SimGpu.accounting_residual_ns` measures it per call.
  What is not counted: ``launch_host_seconds``' spin (a modelled cost of the caller's) and
  :meth:`SimStream.synchronize`'s sleeps (no CPU).
* ``launch_host_seconds`` (0.0, off): host CPU charged per kernel launch. Each
  :meth:`SimStream.kernel` call first spins its calling thread until that thread has used this
  much CPU (the driver's and the framework's work to launch one kernel, which a real host pays
  on the launching thread), and the kernel starts no earlier than the launch ends; so a step
  whose kernels are shorter than their launches is launch-bound, as on a GPU. Launches are
  counted in ``SimGpu.launches``. The figure is a model input: CUDA's own launch is commonly
  a few µs to ~20 µs per kernel (NVIDIA's Nsight Systems guide measured ~20 µs for a PyTorch
  element-wise kernel on a V100); the GPU bundle should measure it on the machine in question.

A tensor that already lies in simulated device memory (made by :meth:`SimGpu.empty_strided`) is
used as it is by the transport; other CPU tensors are first copied in (``adopt``).

Thread-safety: every object here is safe to use from several threads (one lock per SimGpu).
"""

import atexit
import bisect
import collections
import contextlib
import ctypes
import enum
import fcntl
import functools
import mmap
import os
import struct
import threading
import time
import weakref

import numpy as np

from .. import _devices
from .. import shm
from .. import errors

TABLE_MAGIC = b"OFDSIMG1"
MEM_MAGIC = b"OFDSIMM1"
EVENT_MAGIC = b"OFDSIME1"
VERSION = 1
NEVER = -1
PENDING = (1 << 63) - 1
HEADER_BYTES = 4096
EVENT_SLOT_BYTES = 32
SEGMENT_SLOT_BYTES = 64


class SegmentState(enum.IntEnum):
    """A segment slot's state in the table (SimSegmentState in common/sim_gpu_table.h)."""

    FREE = 0   # the slot holds no segment
    LIVE = 1   # an allocated segment the daemon may open
    FREED = 2  # freed: a handle naming it is refused


SEG_FREE, SEG_LIVE, SEG_FREED = SegmentState
SEGMENT_VMM = 1
# Header violations[] indices (SimViolation in sim_gpu_table.h).
FREED_WHILE_MAPPED, COPY_ON_FREED, WAIT_UNRECORDED, CONSUMED_EARLY = 0, 1, 2, 3
_INSTANCE_OFFSET = 56    # after magic(8) + 4 x u32 + 4 x u64
_VIOLATIONS_OFFSET = 64
BLOCK_ALIGN = 512
MIB = 1 << 20
# cudaError_t values the simulated runtime reports.
CUDA_SUCCESS = 0
CUDA_ERROR_INVALID_VALUE = 1
CUDA_ERROR_MEMORY_ALLOCATION = 2
CUDA_ERROR_INVALID_RESOURCE_HANDLE = 400


_thread_time_ns = time.thread_time_ns
_get_ident = threading.get_ident


class _Nesting(threading.local):
    """Per thread: 1 while the thread is inside a counted call into a simulated device."""

    depth = 0


_nesting = _Nesting()


def _device_call(fn):
    """Makes ``fn`` (a method of an object whose ``gpu`` is its SimGpu) an entry point of the
    simulated device: with ``gpu.count_own_cpu`` on, the thread CPU time it takes, from the first
    read of the thread's clock to the last, is added to the calling thread's own-work total and
    the call to its count of calls, once for the outermost of nested entry points. Both reads
    lie inside the window as far as they can: the bookkeeping before the last read is counted."""

    @functools.wraps(fn)
    def device_call_entry(self, *args, **kwargs):
        gpu = self.gpu
        if not gpu.count_own_cpu or _nesting.depth:
            return fn(self, *args, **kwargs)
        t0 = _thread_time_ns()
        _nesting.depth = 1
        try:
            return fn(self, *args, **kwargs)
        finally:
            _nesting.depth = 0
            cell = gpu._own.get(_get_ident()) or gpu._own_cell()
            cell[1] += 1
            cell[0] += _thread_time_ns() - t0
    return device_call_entry


def _device_property(fn):
    """A read-only property that is an entry point of the simulated device (_device_call)."""
    return property(_device_call(fn), doc=fn.__doc__)


def _unlink_quietly(path):
    """Removes a simulated device's table from /dev/shm if it is still there."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _unlink_at_exit(path, pid):
    """At exit of process ``pid`` (not of a forked child): removes its table if still there."""
    if os.getpid() == pid:
        _unlink_quietly(path)


class SimOutOfMemoryError(RuntimeError):
    """The simulated device has no room for an allocation, even after freeing cached segments."""


def table_path(pid=None):
    """The table of process ``pid`` (default: this one): the daemon finds it by the pid."""
    return "/dev/shm/ofd-simgpu-%d" % (os.getpid() if pid is None else pid)


_TABLE_PREFIX = "ofd-simgpu-"
_open_tables = set()  # paths of this process's tables not closed yet


def _stale(path):
    """True when no process holds ``path``'s lock (each table's creator holds an flock on it
    while it is open: a killed process's lock is gone with it). False when it is held, or
    the table is not there (any more) or not readable."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return True
    except OSError:
        return False
    finally:
        os.close(fd)


def sweep_stale_tables():
    """Removes this uid's tables that no live process holds (of processes killed before they
    closed their SimGpu or ran their exit handlers; SIGKILL, SIGTERM) and whose pid is not a
    process here; none where /proc is not this PID namespace's (shm.proc_shows_own_pids).
    Returns how many were removed."""
    removed = 0
    try:
        names = os.listdir("/dev/shm") if shm.proc_shows_own_pids() else []
    except OSError:
        return 0
    for name in names:
        pid = name[len(_TABLE_PREFIX):]
        if not name.startswith(_TABLE_PREFIX) or not pid.isdigit() or \
                os.path.exists("/proc/" + pid):
            continue
        path = "/dev/shm/" + name
        try:
            if os.stat(path).st_uid == os.getuid() and _stale(path):
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return removed


def _create_table_file(path):
    """Creates ``path`` (0600) and returns its fd, holding its flock (see _stale). A table of
    this pid that a dead process left (pids are reused) is replaced; FileExistsError when this
    process has a SimGpu open (the daemon finds a process's table by its pid, so a process has
    one SimGpu at a time, with as many devices as it needs) or another process holds it."""
    if path in _open_tables:
        raise FileExistsError(
            "this process already has a SimGpu (table %s): the daemon finds a process's "
            "simulated GPUs by its pid, so a process has one SimGpu at a time; close() it "
            "first, or give it more devices" % path)
    sweep_stale_tables()
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    except FileExistsError:
        if not _stale(path):
            raise FileExistsError(
                "%s exists and another process holds it (a process of this pid in another "
                "PID namespace sharing /dev/shm): run the simulated GPU in a process of "
                "another pid" % path) from None
        _unlink_quietly(path)  # left by a dead process that had this pid
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)  # a sweeper's test holds it for a moment at most
    _open_tables.add(path)
    return fd


def device_uuid(ordinal):
    """The UUID a cuda-sim daemon gives its simulated device ``ordinal`` (SimCudaApi)."""
    return "GPU-51300000-0000-0000-0000-%012d" % ordinal


def _align(n, a):
    return (n + a - 1) // a * a


class _Table:
    """The mapped table: header, event slots, segment slots, device memory."""

    def __init__(self, devices, device_bytes, event_slots, segment_slots):
        self.devices, self.device_bytes = devices, device_bytes
        self.event_slots, self.segment_slots = event_slots, segment_slots
        self.events_offset = HEADER_BYTES
        self.segments_offset = _align(self.events_offset + event_slots * EVENT_SLOT_BYTES, 4096)
        self.memory_offset = _align(self.segments_offset + segment_slots * SEGMENT_SLOT_BYTES,
                                    2 * MIB)
        self.size = self.memory_offset + devices * device_bytes
        self.path = table_path()
        fd = self.fd = _create_table_file(self.path)  # open while the table is: its lock
        try:
            os.ftruncate(fd, self.size)
            self.mm = mmap.mmap(fd, self.size, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            _open_tables.discard(self.path)
            os.close(fd)
            os.unlink(self.path)
            raise
        atexit.register(_unlink_at_exit, self.path, os.getpid())  # one that never closed it
        self.words = memoryview(self.mm)[:self.memory_offset].cast("Q")
        self.signed = memoryview(self.mm)[:self.memory_offset].cast("q")
        self.instance = int.from_bytes(os.urandom(8), "little") | 1
        struct.pack_into("<8sIIIIQQQQQ", self.mm, 0, TABLE_MAGIC, VERSION, devices, event_slots,
                         segment_slots, device_bytes, self.events_offset, self.segments_offset,
                         self.memory_offset, self.instance)
        for i in range(event_slots):
            self.signed[(self.events_offset + i * EVENT_SLOT_BYTES) // 8 + 1] = NEVER
        self.base_address = ctypes.addressof(ctypes.c_char.from_buffer(self.mm))

    # Events: seq u64 | complete_at_ns i64 | device u32 | in_use u32 | pad.
    def event_word(self, slot):
        return (self.events_offset + slot * EVENT_SLOT_BYTES) // 8

    def event_seq(self, slot):
        return self.words[self.event_word(slot)]

    def event_complete_at(self, slot):
        return self.signed[self.event_word(slot) + 1]

    def record_event(self, slot, complete_at_ns):
        w = self.event_word(slot)
        self.signed[w + 1] = complete_at_ns  # the time first, then the sequence number
        self.words[w] = self.words[w] + 1

    # Segments: generation u64 | state u32, device u32 | offset u64 | size u64 |
    # daemon_maps u32, flags u32 | buffer_id u64.
    def segment_word(self, slot):
        return (self.segments_offset + slot * SEGMENT_SLOT_BYTES) // 8

    def write_segment(self, slot, generation, state, device, offset, size, flags, buffer_id):
        w = self.segment_word(slot)
        self.words[w + 2] = offset
        self.words[w + 3] = size
        self.words[w + 4] = flags << 32  # daemon_maps 0
        self.words[w + 5] = buffer_id
        self.words[w] = generation
        self.words[w + 1] = (device << 32) | state

    def set_segment_state(self, slot, state):
        w = self.segment_word(slot)
        self.words[w + 1] = (self.words[w + 1] & ~0xFFFFFFFF) | state

    def daemon_maps(self, slot):
        return self.words[self.segment_word(slot) + 4] & 0xFFFFFFFF

    def violations(self, kind):
        return self.words[_VIOLATIONS_OFFSET // 8 + kind]

    def count_violation(self, kind):
        self.words[_VIOLATIONS_OFFSET // 8 + kind] += 1

    def close(self):
        self.words.release()
        self.signed.release()
        try:
            self.mm.close()
        except BufferError:  # tensors still view the memory: leave the mapping to the process
            pass
        _unlink_quietly(self.path)
        if self.path in _open_tables:
            _open_tables.discard(self.path)
            os.close(self.fd)


class SimEvent:
    """An interprocess event: a slot of the table. ``handle``: its 64 IPC handle bytes."""

    __slots__ = ("gpu", "slot", "handle", "device")

    def __init__(self, gpu, slot, device):
        self.gpu, self.slot, self.device = gpu, slot, device
        self.handle = EVENT_MAGIC + struct.pack("<IIQQ", os.getpid(), slot, 0,
                                                gpu.table.instance) + bytes(32)

    @property
    def seq(self):
        return self.gpu.table.event_seq(self.slot)

    def complete_at_ns(self):
        return self.gpu.table.event_complete_at(self.slot)

    @_device_call
    def query(self):
        """True once the work before the event's last record completed (cudaEventQuery)."""
        return time.monotonic_ns() >= self.complete_at_ns()


class SimStream:
    """A modelled stream of one simulated device (see module doc)."""

    def __init__(self, gpu, device, name=""):
        self.gpu, self.device, self.name = gpu, device, name
        self.tail_ns = 0
        self._waits = []  # (SimEvent, seq) still pending when waited on

    @_device_call
    def kernel(self, seconds):
        """Queues a kernel of ``seconds`` (modelled) after the stream's work, after the host's
        launch cost (``SimGpu.launch_host_seconds`` of this thread's CPU, spun here: the
        caller's cost, not counted as the device's own work)."""
        self.gpu.launch_cost()
        with self.gpu.lock:
            self._resolve()
            self.tail_ns = max(self.tail_ns, time.monotonic_ns()) + int(seconds * 1e9)

    def _resolve(self):
        """Folds waits whose event has completed into the tail; True when none is pending."""
        left = []
        for ev, seq in self._waits:
            at = self.gpu.record_completion(ev, seq)
            if at != PENDING:
                self.tail_ns = max(self.tail_ns, at)
            else:
                left.append((ev, seq))
        self._waits = left
        return not left

    @_device_call
    def record(self, ev):
        """cudaEventRecord: ``ev`` completes when the stream's work so far has."""
        self.gpu.settle_event(ev)
        with self.gpu.lock:
            if self._resolve():
                self.gpu.table.record_event(ev.slot, max(self.tail_ns, time.monotonic_ns()))
            else:  # behind a pending daemon event: completed by the resolver thread
                self.gpu.table.record_event(ev.slot, PENDING)
                self.gpu.defer_record(ev, self, list(self._waits), self.tail_ns)

    @_device_call
    def wait_event(self, ev, expect_seq=None):
        """cudaStreamWaitEvent: the stream's later work waits for ``ev``'s last record.
        ``expect_seq``: the record the caller means to wait for; an event not recorded that far
        orders nothing (as in CUDA) and counts a WAIT_UNRECORDED violation."""
        with self.gpu.lock:
            seq = ev.seq
            if expect_seq is not None and seq < expect_seq:
                self.gpu.table.count_violation(WAIT_UNRECORDED)
                return
            at = ev.complete_at_ns()
            if at == PENDING:
                self._waits.append((ev, seq))
            elif at != NEVER:
                self.tail_ns = max(self.tail_ns, at)

    @_device_call
    def synchronize(self, timeout=60.0):
        """Blocks until the stream's work is done; the seconds blocked (device time)."""
        t0 = time.monotonic()
        deadline = t0 + timeout
        while True:
            with self.gpu.lock:
                done = self._resolve()
                tail = self.tail_ns
            now = time.monotonic_ns()
            if done and now >= tail:
                return time.monotonic() - t0
            if time.monotonic() > deadline:
                raise TimeoutError("simulated stream %s did not finish within %.0f s (an event "
                                   "it waits on was never completed)" % (self.name, timeout))
            time.sleep(min(max((tail - now) / 1e9, 20e-6), 1e-3) if done else 50e-6)


class _Segment:
    __slots__ = ("slot", "device", "offset", "size", "vmm", "buffer_id", "generation", "blocks",
                 "small")

    def __init__(self, slot, device, offset, size, vmm, buffer_id, generation):
        self.slot, self.device, self.offset, self.size = slot, device, offset, size
        self.vmm, self.buffer_id, self.generation = vmm, buffer_id, generation
        self.blocks = []  # _Block, by offset
        self.small = False  # torch's small pool (requests up to 1 MiB) or the large one


class _Block:
    __slots__ = ("segment", "offset", "size", "allocated", "stream", "uses", "ready_ns",
                 "__weakref__")

    def __init__(self, segment, offset, size, stream):
        self.segment, self.offset, self.size, self.stream = segment, offset, size, stream
        self.allocated = False
        self.uses = set()   # streams given by record_stream
        self.ready_ns = 0   # freed with uses: reusable once every use's tail passed this


class SimAllocator:
    """PyTorch's caching allocator in outline, for one simulated device (see module doc)."""

    def __init__(self, gpu, device):
        self.gpu, self.device = gpu, device
        self.free_ranges = [(0, gpu.device_bytes)]  # cudaMalloc's view: (offset, size), sorted
        self.segments = {}  # offset -> _Segment
        self.offsets = []   # sorted segment offsets
        self.pending_frees = []  # blocks freed with stream uses not yet passed
        self.oom_retries = 0
        self.segments_freed = 0

    # -- cudaMalloc / cudaFree of segments --
    def _malloc_range(self, size):
        for i, (off, n) in enumerate(self.free_ranges):
            if n >= size:
                self.free_ranges[i] = (off + size, n - size)
                if n == size:
                    del self.free_ranges[i]
                return off
        return None

    def _free_range(self, off, size):
        r = self.free_ranges
        bisect.insort(r, (off, size))
        merged = []
        for o, n in r:
            if merged and merged[-1][0] + merged[-1][1] == o:
                merged[-1] = (merged[-1][0], merged[-1][1] + n)
            else:
                merged.append((o, n))
        self.free_ranges[:] = merged

    def _new_segment(self, size, small):
        off = self._malloc_range(size)
        if off is None:
            return None
        seg = self.gpu.new_segment(self.device, off, size, self.gpu.expandable_segments)
        seg.small = small
        self.segments[off] = seg
        bisect.insort(self.offsets, off)
        seg.blocks.append(_Block(seg, 0, size, None))  # takes its stream at the first malloc
        return seg

    def _release_segment(self, seg):
        self.gpu.free_segment(seg)
        del self.segments[seg.offset]
        self.offsets.remove(seg.offset)
        self._free_range(seg.offset, seg.size)
        self.segments_freed += 1

    # -- blocks --
    @staticmethod
    def segment_size(nbytes):
        if nbytes <= MIB:
            return 2 * MIB
        if nbytes < 10 * MIB:
            return 20 * MIB
        return _align(nbytes, 2 * MIB)

    def _process_frees(self, wait=False):
        """Returns blocks freed under record_stream whose streams have passed the free."""
        left = []
        for b in self.pending_frees:
            tails = [s.tail_ns for s in b.uses]
            if wait:
                for s in b.uses:
                    s.synchronize()
            if wait or time.monotonic_ns() >= max([b.ready_ns] + tails):
                b.uses = set()
                self._return(b)
            else:
                left.append(b)
        self.pending_frees = left

    def _find_free(self, size, stream):
        best = None
        small = size <= MIB
        for off in self.offsets:
            if self.segments[off].small != small:  # torch keeps the two pools apart
                continue
            for b in self.segments[off].blocks:
                if not b.allocated and b.size >= size and b.stream in (None, stream) and \
                        not b.uses and (best is None or b.size < best.size):
                    best = b
        return best

    def malloc(self, nbytes, stream):
        """A block of at least ``nbytes`` for use on ``stream``. Raises SimOutOfMemoryError."""
        size = _align(max(int(nbytes), 1), BLOCK_ALIGN)
        self._process_frees()
        b = self._find_free(size, stream)
        if b is None:
            small = size <= MIB
            seg = self._new_segment(self.segment_size(size), small)
            if seg is None:  # torch: free every cached block, then try cudaMalloc again
                self.oom_retries += 1
                self._release_cached()
                seg = self._new_segment(self.segment_size(size), small)
            if seg is None:
                raise SimOutOfMemoryError(
                    "simulated device %d is out of memory: %d bytes requested, %d bytes in free "
                    "ranges" % (self.device, size, sum(n for _, n in self.free_ranges)))
            b = seg.blocks[0]
        b.stream = stream  # a segment's blocks serve the stream it was first allocated for
        self._split(b, size)
        b.allocated = True
        return b

    def _split(self, b, size):
        if b.size - size >= BLOCK_ALIGN:
            rest = _Block(b.segment, b.offset + size, b.size - size, b.stream)
            blocks = b.segment.blocks
            blocks.insert(blocks.index(b) + 1, rest)
            b.size = size

    def free(self, b):
        """The last view of the block died: back to the cache, after its recorded streams."""
        b.allocated = False
        if b.uses:
            b.ready_ns = time.monotonic_ns()
            self.pending_frees.append(b)
        else:
            self._return(b)

    def _return(self, b):
        blocks = b.segment.blocks
        i = blocks.index(b)
        for j in (i + 1, i - 1):  # merge free neighbours of the same stream
            if 0 <= j < len(blocks):
                n = blocks[j]
                if not n.allocated and not n.uses and n.stream == b.stream and \
                        n not in self.pending_frees:
                    lo, hi = (b, n) if j > i else (n, b)
                    lo.size += hi.size
                    blocks.remove(hi)
                    b = lo
                    i = blocks.index(b)

    def _release_cached(self):
        for off in list(self.offsets):
            seg = self.segments[off]
            if all(not b.allocated and not b.uses for b in seg.blocks):
                self._release_segment(seg)

    def empty_cache(self):
        """torch.cuda.empty_cache: waits for deferred frees, then frees every unused segment."""
        self._process_frees(wait=True)
        self._release_cached()

    def find(self, offset):
        """The segment holding device offset ``offset``, or None."""
        i = bisect.bisect_right(self.offsets, offset) - 1
        if i < 0:
            return None
        seg = self.segments[self.offsets[i]]
        return seg if offset < seg.offset + seg.size else None

    def used_bytes(self):
        return sum(s.size for s in self.segments.values())


class SimGpu:
    """The simulated GPUs of this process (see module doc). Close it when done."""

    def __init__(self, devices=1, device_bytes=256 * MIB, event_slots=4096, segment_slots=4096,
                 expandable_segments=False, checksums=True, count_own_cpu=False,
                 launch_host_seconds=0.0):
        self.checksums, self.count_own_cpu = checksums, count_own_cpu
        self.launch_host_seconds = launch_host_seconds
        self.launches = 0  # SimStream.kernel calls, every stream of this SimGpu
        self._own = {}  # threading.get_ident() -> [ns, calls] of the device's own work (knob)
        self.gpu = self  # what _device_call reads on every simulated object
        self.device_bytes = _align(device_bytes, 2 * MIB)
        self.table = _Table(devices, self.device_bytes, event_slots, segment_slots)
        self.lock = threading.RLock()
        self.devices = devices
        self.expandable_segments = expandable_segments
        self.allocators = [SimAllocator(self, d) for d in range(devices)]
        self._free_events = []
        self._next_event = 0
        self._free_slots = list(range(segment_slots - 1, -1, -1))
        self._generations = [0] * segment_slots
        self._next_buffer_id = 1
        self._deferred = []  # (event, stream, waits, tail) records behind pending events
        # (event slot, seq) -> completion ns of records recorded over since (settle_event)
        self._settled = collections.OrderedDict()
        self._resolver = None
        self.closed = False

    @_device_call
    def launch_cost(self):
        """One kernel launch's host cost: counts it and spins the calling thread until it has
        used ``launch_host_seconds`` (float seconds) of thread CPU time; nothing when 0. The
        spin is the caller's cost: it is left out of the own-work count (``count_own_cpu``)."""
        with self.lock:
            self.launches += 1
        if self.launch_host_seconds > 0:
            start = now = _thread_time_ns()
            until = start + int(self.launch_host_seconds * 1e9)
            while now < until:
                now = _thread_time_ns()
            if self.count_own_cpu and _nesting.depth:  # the caller's cost: out of the count
                self._own_cell()[0] -= now - start

    # -- the simulated device's own CPU time (the count_own_cpu knob) --
    def _own_cell(self):
        """This thread's [ns, calls] of the device's own work, made at its first call."""
        return self._own.setdefault(_get_ident(), [0, 0])

    def _own_sum(self, index, thread_ident):
        if thread_ident is not None:
            return self._own.get(thread_ident, (0, 0))[index]
        return sum(cell[index] for cell in list(self._own.values()))

    def own_cpu_ns(self, thread_ident=None):
        """Integer ns of thread CPU spent inside the simulated device's entry points
        (``count_own_cpu``; see module doc) on thread ``thread_ident`` (threading.get_ident();
        None: all threads together). 0 while the knob is off."""
        return self._own_sum(0, thread_ident)

    def own_cpu_seconds(self, thread_ident=None):
        """:meth:`own_cpu_ns` in float seconds."""
        return self.own_cpu_ns(thread_ident) / 1e9

    def own_calls(self, thread_ident=None):
        """Integer count of the outermost calls into the simulated device's entry points counted
        on thread ``thread_ident`` (None: all threads), each standing for one call of a real
        GPU's runtime, driver or allocator."""
        return self._own_sum(1, thread_ident)

    @_device_call
    def _counted_noop(self):
        pass

    def _plain_noop(self):
        pass

    def accounting_residual_ns(self, calls=2000, rounds=9):
        """Float ns of the calling thread's CPU that counting one outermost call leaves outside
        the counted window (its wrapper's call, the parts of the clock reads before the first
        and after the last sample): the thread CPU of a counted no-op entry point, less what was
        counted in it, less the CPU of the same call uncounted; the median of ``rounds`` rounds
        of ``calls`` calls. 0.0 while ``count_own_cpu`` is off. Counts nothing itself."""
        if not self.count_own_cpu:
            return 0.0
        cell = self._own_cell()
        saved = list(cell)
        out = []
        for _ in range(rounds):
            own0, t0 = cell[0], _thread_time_ns()
            for _ in range(calls):
                self._counted_noop()
            t1 = _thread_time_ns()
            for _ in range(calls):
                self._plain_noop()
            t2 = _thread_time_ns()
            out.append(((t1 - t0) - (cell[0] - own0) - (t2 - t1)) / calls)
        cell[:] = saved
        out.sort()
        return out[len(out) // 2]

    # -- allocator settings (torch.cuda.memory._set_allocator_settings) --
    @_device_call
    def set_allocator_settings(self, text):
        for part in text.split(","):
            k, _, v = part.partition(":")
            if k.strip() == "expandable_segments":
                self.expandable_segments = v.strip().lower() == "true"

    # -- segments (called with the lock held, by the allocators) --
    def new_segment(self, device, offset, size, vmm):
        if not self._free_slots:
            raise SimOutOfMemoryError("simulated GPU table has no free segment slot")
        slot = self._free_slots.pop()
        self._generations[slot] += 1
        buffer_id = self._next_buffer_id
        self._next_buffer_id += 1
        self.table.write_segment(slot, self._generations[slot], SEG_LIVE, device, offset, size,
                                 SEGMENT_VMM if vmm else 0, buffer_id)
        return _Segment(slot, device, offset, size, vmm, buffer_id, self._generations[slot])

    def free_segment(self, seg):
        """cudaFree: the daemon must hold no mapping of it (else FREED_WHILE_MAPPED)."""
        if self.table.daemon_maps(seg.slot) > 0:
            self.table.count_violation(FREED_WHILE_MAPPED)
        self.table.set_segment_state(seg.slot, SEG_FREED)
        self._free_slots.insert(0, seg.slot)  # reused last: a stale handle stays detectable

    # -- tensors --
    @_device_call
    def empty_strided(self, shape, stride, dtype, device=0, stream=None):
        """A CPU tensor of ``shape``/``stride``/``dtype`` in device ``device``'s memory,
        allocated for ``stream`` (default: the device's current stream)."""
        import torch
        itemsize = torch.empty((), dtype=dtype).element_size()
        span = 1 + sum((n - 1) * st for n, st in zip(shape, stride)) if all(shape) else 0
        nbytes = max(span, 1) * itemsize
        stream = stream or self.current_stream(device)
        with self.lock:
            b = self.allocators[device].malloc(nbytes, stream)
            start = self.table.memory_offset + device * self.device_bytes + \
                b.segment.offset + b.offset
        arr = np.frombuffer(self.table.mm, dtype=np.uint8, count=nbytes, offset=start)
        weakref.finalize(arr, self._on_block_dead, b)
        flat = torch.from_numpy(arr).view(dtype)
        return flat.as_strided(tuple(shape), tuple(stride))

    @_device_call
    def _on_block_dead(self, b):
        if self.closed:
            return
        with self.lock:
            self.allocators[b.segment.device].free(b)

    @_device_call
    def record_stream(self, t, stream):
        """Tensor.record_stream: ``t``'s block is not reused before ``stream`` passes its free."""
        info = self.describe(t.data_ptr())
        if info is not None:
            with self.lock:
                seg = self.allocators[info.device].find(info.offset)
                for b in seg.blocks:
                    if b.offset <= info.offset - seg.offset < b.offset + b.size and b.allocated:
                        b.uses.add(stream)

    @_device_call
    def empty_cache(self):
        for d in range(self.devices):
            with self.lock:
                self.allocators[d].empty_cache()

    # -- streams and events --
    @_device_call
    def current_stream(self, device=0):
        with self.lock:
            key = ("current", device)
            s = self.__dict__.setdefault("_streams", {}).get(key)
            if s is None:
                s = self._streams[key] = SimStream(self, device, "compute:%d" % device)
            return s

    @_device_call
    def new_stream(self, device=0, name="side"):
        return SimStream(self, device, "%s:%d" % (name, device))

    @_device_call
    def new_event(self, device=0):
        with self.lock:
            if self._free_events:
                return self._free_events.pop()
            if self._next_event >= self.table.event_slots:
                raise SimOutOfMemoryError("simulated GPU table has no free event slot")
            ev = SimEvent(self, self._next_event, device)
            self._next_event += 1
            return ev

    @_device_call
    def destroy_event(self, ev):
        with self.lock:
            self._free_events.append(ev)

    @_device_call
    def settle_event(self, ev, timeout=60.0):
        """Before ``ev`` is recorded again (by a stream here, or by the daemon for a reload
        that names it as its done event): waits until its last record has completed and keeps
        that record's completion time for the streams that waited on it. A CUDA stream wait
        captures the record it follows, so an event may be recorded again as soon as a wait
        on it is enqueued; the table keeps only an event's last record, so the simulation
        holds the next record until the last one's completion is known. Simulated device
        time; TimeoutError after ``timeout`` seconds (a record that never completes)."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                seq, at = ev.seq, ev.complete_at_ns()
                if at != PENDING:
                    if seq > 0:
                        self._settled[(ev.slot, seq)] = at
                        while len(self._settled) > self.table.event_slots:
                            self._settled.popitem(last=False)
                    return
            if time.monotonic() > deadline:
                raise TimeoutError("simulated event %d: its last record did not complete within "
                                   "%.0f s" % (ev.slot, timeout))
            time.sleep(50e-6)

    def record_completion(self, ev, seq):
        """Completion ns of ``ev``'s record number ``seq`` (PENDING while not known): the
        table's when it is still the last record, else the one settle_event kept (0 when none
        was kept: a record that completed before the next one was made, long ago)."""
        if ev.seq == seq:
            return ev.complete_at_ns()
        return self._settled.get((ev.slot, seq), 0)

    def defer_record(self, ev, stream, waits, tail_ns):
        self._deferred.append((ev, waits, tail_ns))
        if self._resolver is None:
            self._resolver = threading.Thread(target=self._resolve_loop, daemon=True,
                                              name="offloadd-sim-gpu-resolver")
            self._resolver.start()

    def _resolve_loop(self):
        while not self.closed:
            self._resolve_deferred()
            time.sleep(50e-6)

    @_device_call
    def _resolve_deferred(self):
        """One round of the resolver thread: completes deferred records whose waits resolved."""
        with self.lock:
            left = []
            for ev, waits, tail in self._deferred:
                ats = [self.record_completion(w, seq) for w, seq in waits]
                if PENDING in ats:
                    left.append((ev, waits, tail))
                else:
                    w = self.table.event_word(ev.slot)
                    self.table.signed[w + 1] = max([tail] + ats)
            self._deferred = left

    # -- pointers --
    @_device_call
    def describe(self, ptr):
        """PointerInfo of a device pointer into this table's memory, or None."""
        rel = ptr - self.table.base_address - self.table.memory_offset
        if rel < 0 or rel >= self.devices * self.device_bytes:
            return None
        device, offset = divmod(rel, self.device_bytes)
        with self.lock:
            seg = self.allocators[device].find(offset)
            if seg is None:
                return None
            base = ptr - (offset - seg.offset)
            return PointerInfo(base, seg.size, seg.buffer_id, not seg.vmm, device, offset, seg)

    @_device_call
    def violations(self, kind):
        return self.table.violations(kind)

    @_device_call
    def count_violation(self, kind):
        with self.lock:
            self.table.count_violation(kind)

    def close(self):
        self.closed = True
        if self._resolver is not None:
            self._resolver.join(timeout=1)
        self.table.close()


class PointerInfo:
    """Where a device pointer lies: its allocation (segment) ``base``/``size``, ``buffer_id``
    (unique per allocation in the process), ``ipc_capable`` (False for VMM memory), device."""

    __slots__ = ("base", "size", "buffer_id", "ipc_capable", "device", "offset", "segment")

    def __init__(self, base, size, buffer_id, ipc_capable, device, offset=0, segment=None):
        self.base, self.size, self.buffer_id = base, size, buffer_id
        self.ipc_capable, self.device = ipc_capable, device
        self.offset, self.segment = offset, segment


class SimCudaRuntime:
    """The runtime calls offloadd's CUDA transport makes (offloadd.cuda.CudaRuntime's), on a
    SimGpu, with CUDA's last-error state. Errors raise CudaExportError like the real one."""

    def __init__(self, gpu):
        self.gpu = gpu
        self._last_error = CUDA_SUCCESS

    def _fail(self, code, message):
        self._last_error = code
        raise errors.CudaExportError(message)

    @_device_call
    def get_last_error(self):
        """cudaGetLastError: returns and clears the last error."""
        e, self._last_error = self._last_error, CUDA_SUCCESS
        return e

    @_device_call
    def peek_last_error(self):
        """cudaPeekAtLastError: what torch's next kernel-launch check would see."""
        return self._last_error

    @_device_call
    def pointer_info(self, ptr):
        info = self.gpu.describe(ptr)
        if info is None:
            self._fail(CUDA_ERROR_INVALID_VALUE, "cuPointerGetAttributes(0x%x) failed: not "
                       "simulated device memory" % ptr)
        return info

    @_device_call
    def ipc_mem_handle(self, info):
        """64 handle bytes of the allocation ``info`` describes (cudaIpcGetMemHandle)."""
        if not info.ipc_capable:
            self._fail(CUDA_ERROR_INVALID_VALUE,
                       "cudaIpcGetMemHandle(0x%x) failed: error 1 (invalid argument): memory "
                       "from a VMM allocator (expandable segments) has no IPC handle"
                       % info.base)
        seg = info.segment
        return MEM_MAGIC + struct.pack("<IIQQ", os.getpid(), seg.slot, seg.generation,
                                       self.gpu.table.instance) + bytes(32)

    @_device_call
    def create_ipc_event(self, device=0):
        return self.gpu.new_event(device)

    @_device_call
    def destroy_event(self, ev):
        self.gpu.destroy_event(ev)


class SimCudaDevice:
    """The device side of offloadd's CUDA transport on a SimGpu device: the simulated twin of
    offloadd.cuda.TorchCudaDevice (same methods; see there). Tensors given to the transport are
    CPU tensors standing for device tensors: ``adopt`` copies one into simulated device memory
    (the model of "this tensor was on the GPU"; a simulation step, not a cost of offloadd).
    ``device_wait_seconds`` adds up what ``before_host_read`` blocked: simulated device time.
    Every method is an entry point of the simulated device (``count_own_cpu``); the context
    manager ``context`` returns is the standard library's no-op one, whose enter and exit are
    not counted."""

    simulated = True

    def __init__(self, gpu, ordinal=0):
        self.gpu, self.ordinal = gpu, ordinal
        self.rt = SimCudaRuntime(gpu)
        self._reload_stream = gpu.new_stream(ordinal, "reload")
        self.device_wait_seconds = 0.0

    @_device_call
    def context(self, device):
        return _NO_CONTEXT

    @_device_property
    def checksums(self):
        """The SimGpu's ``checksums`` knob (see module doc)."""
        return self.gpu.checksums

    @_device_call
    def adopt(self, t):
        """``t`` itself when it lies in this device's simulated memory, else a copy there."""
        info = self.gpu.describe(t.data_ptr())
        if info is not None and info.device == self.ordinal:
            return t
        dst = self.gpu.empty_strided(t.shape, t.stride(), t.dtype, self.ordinal)
        n = t.numel()
        dst.as_strided((n,), (1,), dst.storage_offset()).copy_(
            t.as_strided((n,), (1,), t.storage_offset()))
        return dst

    @_device_call
    def checksum(self, t):
        """CRC-32 of ``t``'s bytes, counted as the simulation's own work."""
        from ..torch._transport import crc32
        return crc32(t)

    @_device_call
    def check_allocator(self):
        if self.gpu.expandable_segments:
            from ..cuda import ALLOCATOR_REMEDY
            raise errors.OffloadConfigError(
                "the simulated GPU's allocator sets expandable_segments:True (CUDA VMM memory): "
                "that memory has no legacy CUDA IPC handle. " + ALLOCATOR_REMEDY)

    def _call(self, fn, *args):
        try:
            return fn(*args)
        except errors.CudaExportError:
            self.rt.get_last_error()  # as CudaRuntime does: torch must not see it
            raise

    @_device_call
    def describe(self, ptr):
        info = self._call(self.rt.pointer_info, ptr)
        if not info.ipc_capable:
            self.check_allocator()
            from ..cuda import ALLOCATOR_REMEDY
            raise errors.OffloadConfigError(
                "this tensor's memory is VMM memory (expandable segments): it has no legacy "
                "CUDA IPC handle. " + ALLOCATOR_REMEDY)
        return info

    @_device_call
    def mem_handle(self, info):
        return self._call(self.rt.ipc_mem_handle, info)

    @_device_call
    def new_event(self):
        return self.rt.create_ipc_event(self.ordinal)

    @_device_call
    def current_stream(self, device=None):
        return self.gpu.current_stream(self.ordinal)

    @_device_call
    def reload_stream(self, device=None):
        return self._reload_stream

    @_device_call
    def empty_on(self, meta, stream):
        return self.gpu.empty_strided(meta.shape, meta.stride, meta.dtype, self.ordinal, stream)

    @_device_call
    def record(self, ev, stream):
        stream.record(ev)

    @_device_call
    def wait(self, stream, ev, expect_seq=None):
        stream.wait_event(ev, expect_seq)

    @_device_call
    def query(self, ev):
        return ev.query()

    @_device_call
    def event_seq(self, ev):
        """The seq of ``ev``'s last record, once that record has completed (settle_event):
        the transport calls it just before sending ``ev`` as a reload's done event, which the
        daemon records again."""
        self.gpu.settle_event(ev)
        return ev.seq

    @_device_call
    def record_stream(self, t, stream):
        self.gpu.record_stream(t, stream)

    @_device_call
    def before_host_read(self, stream, meta):
        """The host is about to compute on the stream's data (the simulated GPU runs kernels on
        the CPU when queued): wait for the stream's work, as the GPU would."""
        waited = stream.synchronize()
        self.device_wait_seconds += waited
        return waited


_NO_CONTEXT = contextlib.nullcontext()  # reusable: it holds no state
_NOT_COUNTING = type("_NotCounting", (), {"count_own_cpu": False})()  # no SimGpu active
_active = {"gpu": None}
_local = threading.local()


def activate(gpu):
    """Makes ``gpu`` this process's simulated GPU: offloadd's hooks then treat CPU tensors as
    tensors of its current device (``set_device``) and, with a daemon on the cuda-sim backend,
    move them through the CUDA transport. ``activate(None)`` turns it off."""
    _active["gpu"] = gpu


def active():
    """The SimGpu made active by activate(), or None."""
    gpu = _active["gpu"]
    return None if gpu is None or gpu.closed else gpu


def set_device(ordinal):
    """The simulated device this thread's tensors belong to (default 0)."""
    _local.device = int(ordinal)


def current_device():
    return getattr(_local, "device", 0)


class _SimKind(_devices.DeviceKind):
    """The simulated GPU as a device kind (offloadd._devices): while a SimGpu is active, CPU
    tensors are its current device's ("sim:<ordinal>"); the Hello carries the device's UUID and a
    cuda-sim daemon's CUDA transport drives a :class:`SimCudaDevice`."""

    name = "sim"
    torch_type = "cpu"

    @property
    def gpu(self):
        """The active SimGpu, whose entry points these methods are (_device_call)."""
        return _active["gpu"] or _NOT_COUNTING

    @_device_call
    def key(self, device):
        if active() is None:
            return None
        return "sim:%d" % current_device()

    @_device_call
    def open(self, ordinal):
        gpu = active()
        if gpu is None:  # turned off since the key was made: only a shm daemon takes the tensor
            return device_uuid(ordinal), None
        return device_uuid(ordinal), lambda: SimCudaDevice(gpu, ordinal)

    @_device_call
    def uses_cuda_allocator(self):
        return active() is not None


_devices.register(_SimKind())
