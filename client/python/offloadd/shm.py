"""POSIX shared-memory staging for the shm backend: regions and a sub-allocator over them.

On the shm backend the daemon copies between a client's shared-memory object and its pool with
memcpy (server/copy/shm_engine.cc maps the object, MAP_SHARED|MAP_POPULATE, when the region is
registered). A client therefore stages bytes: it copies a tensor into a slot of a registered
region, sends Offload(region, offset, bytes), and frees the slot when OffloadDone arrives; a
reload is the mirror image.

:class:`ShmRegion` creates ``/dev/shm/<name>`` (the Linux home of shm_open objects) with O_EXCL
and mode 0600, sizes it with ftruncate and maps it; the name can be unlinked as soon as the
daemon has registered it (nothing is left in /dev/shm if the process dies) -- unless the arena
keeps names (``keep_names``, for a client that re-registers its regions with a restarted daemon:
a name is the only way the daemon can map the object again); then the names go with
:meth:`ShmRegion.close`, and those of a process that died without closing are removed by the next
arena that keeps names (:func:`sweep_stale`). We do not use
``multiprocessing.shared_memory``: its resource tracker would unlink the object behind us.

:class:`StagingArena` sub-allocates registered regions first-fit with coalescing, 64-byte
aligned, and grows by creating and registering another region when none has room (one region per
growth, ``max(grow_bytes, request)``), up to ``max_bytes`` in all; past that, ``alloc`` waits
for frees. Thread-safe. Growth calls ``register`` (a blocking round trip): never call ``alloc``
on the client's reader thread (future callbacks); ``free`` is safe anywhere.
"""

import itertools
import mmap
import os
import secrets
import threading

ALIGN_BYTES = 64
_names = itertools.count()


def _round_up(n, k):
    return (n + k - 1) // k * k


class ShmRegion:
    """A shared-memory object created and mapped read-write by this process.

    Attributes: ``name`` ("/offloadd-py-<pid>-<n>-<hex>", the shm_open name the daemon opens),
    ``size_bytes``, ``mm`` (the mmap.mmap), ``region_id`` (set by the arena once registered).
    Raises OSError (e.g. ENOSPC when /dev/shm is full: its size is a tmpfs mount option).
    """

    def __init__(self, size_bytes, prefix="offloadd-py"):
        self.size_bytes = int(size_bytes)
        self.name = "/%s-%d-%d-%s" % (prefix, os.getpid(), next(_names), secrets.token_hex(4))
        self.path = "/dev/shm" + self.name
        self.region_id = None
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        try:
            os.ftruncate(fd, self.size_bytes)
            self.mm = mmap.mmap(fd, self.size_bytes, mmap.MAP_SHARED,
                                mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            self.unlink()
            raise
        os.close(fd)

    def relink(self):
        """``(name, unlink)`` for registering the object again (Client.register_shm's
        ``relink``): its name, which must still exist, and a no-op (the name stays)."""
        return self.name, lambda: None

    def unlink(self):
        """Removes the name (the mapping stays valid). Idempotent."""
        try:
            os.unlink(self.path)
        except FileNotFoundError:
            pass

    def close(self):
        """Unlinks and unmaps; a view still exported (e.g. a live torch.frombuffer tensor) keeps
        the mapping alive until it dies."""
        self.unlink()
        try:
            self.mm.close()
        except BufferError:
            pass


def sweep_stale(prefix="offloadd-py"):
    """Removes this uid's ``/dev/shm/<prefix>-<pid>-...`` objects whose process is gone
    (names kept by an arena with ``keep_names`` whose process was killed). Returns how many."""
    removed = 0
    try:
        names = os.listdir("/dev/shm")
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix + "-"):
            continue
        pid = name[len(prefix) + 1:].split("-", 1)[0]
        if not pid.isdigit() or os.path.exists("/proc/%s" % pid):
            continue
        path = "/dev/shm/" + name
        try:
            if os.stat(path).st_uid == os.getuid():
                os.unlink(path)
                removed += 1
        except OSError:
            pass
    return removed


class Slot:
    """``nbytes`` at ``offset`` of ``region`` (a ShmRegion); ``size`` is the aligned extent."""

    __slots__ = ("region", "offset", "nbytes", "size")

    def __init__(self, region, offset, nbytes, size):
        self.region, self.offset, self.nbytes, self.size = region, offset, nbytes, size

    @property
    def region_id(self):
        return self.region.region_id


class StagingArena:
    """First-fit sub-allocator over registered shared-memory regions.

    Args:
      register: ``callable(shm_name, size_bytes) -> region_id`` (e.g. Client.register_shm).
      grow_bytes: size of the first region and the minimum of each later one (bytes).
      max_bytes: cap on the sum of region sizes; an alloc that would pass it waits for frees.
      unregister: optional ``callable(region_id)`` used by close().
      keep_names: keep each region's name until close() and pass ``relink=region.relink`` to
        ``register`` (Client.register_shm), so a client can register the regions again with a
        restarted daemon; sweeps the names dead processes left (:func:`sweep_stale`).
    """

    def __init__(self, register, grow_bytes=16 << 20, max_bytes=1 << 30, unregister=None,
                 keep_names=False):
        self._register = register
        self._keep_names = keep_names
        if keep_names:
            sweep_stale()
        self._unregister = unregister
        self.grow_bytes = int(grow_bytes)
        self.max_bytes = int(max_bytes)
        self._cv = threading.Condition()
        self._regions = []       # ShmRegion, in creation order
        self._free = {}          # region name -> sorted list of [offset, size]
        self._growing = False    # one thread creates a region at a time
        self.used_bytes = 0      # aligned bytes handed out and not freed
        self.peak_used_bytes = 0
        self.capacity_bytes = 0  # sum of region sizes

    @property
    def regions(self):
        return len(self._regions)

    def alloc(self, nbytes, timeout=None):
        """A Slot of at least ``nbytes`` (> 0). Grows when no region has room.

        Raises TimeoutError when ``max_bytes`` is reached and nothing was freed within
        ``timeout`` seconds (None waits forever); OSError / the register callable's errors when a
        new region cannot be created or registered.
        """
        size = _round_up(max(int(nbytes), 1), ALIGN_BYTES)
        with self._cv:
            while True:
                slot = self._take(size, nbytes)
                if slot is not None:
                    return slot
                room = self.capacity_bytes + max(size, self.grow_bytes) <= self.max_bytes
                if not self._growing and (room or not self._regions):
                    self._growing = True
                    break
                if not self._cv.wait(timeout):
                    raise TimeoutError(
                        "offloadd staging arena full (%d of %d bytes in use): raise max_bytes "
                        "or let offloads finish" % (self.used_bytes, self.max_bytes))
        # Create and register outside the lock: the reader thread frees slots while we wait for
        # the daemon's answer.
        region = None
        try:
            region = ShmRegion(_round_up(max(size, self.grow_bytes), 1 << 20))
            if self._keep_names:
                region.region_id = self._register(region.name, region.size_bytes,
                                                  relink=region.relink)
            else:
                try:
                    region.region_id = self._register(region.name, region.size_bytes)
                finally:
                    region.unlink()  # the daemon has mapped it (or failed): name not needed
        except BaseException:
            if region is not None:
                region.close()
            with self._cv:
                self._growing = False
                self._cv.notify_all()
            raise
        with self._cv:
            self._growing = False
            self._regions.append(region)
            self._free[region.name] = [[0, region.size_bytes]]
            self.capacity_bytes += region.size_bytes
            self._cv.notify_all()
            return self._take(size, nbytes)

    def _take(self, size, nbytes):
        for region in self._regions:
            spans = self._free[region.name]
            for i, (off, length) in enumerate(spans):
                if length >= size:
                    if length == size:
                        del spans[i]
                    else:
                        spans[i] = [off + size, length - size]
                    self.used_bytes += size
                    self.peak_used_bytes = max(self.peak_used_bytes, self.used_bytes)
                    return Slot(region, off, int(nbytes), size)
        return None

    def free(self, slot):
        """Returns a slot; coalesces with its neighbours. Safe on any thread."""
        with self._cv:
            spans = self._free[slot.region.name]
            lo, hi = 0, len(spans)
            while lo < hi:
                mid = (lo + hi) // 2
                if spans[mid][0] < slot.offset:
                    lo = mid + 1
                else:
                    hi = mid
            spans.insert(lo, [slot.offset, slot.size])
            if lo + 1 < len(spans) and spans[lo][0] + spans[lo][1] == spans[lo + 1][0]:
                spans[lo][1] += spans[lo + 1][1]
                del spans[lo + 1]
            if lo > 0 and spans[lo - 1][0] + spans[lo - 1][1] == spans[lo][0]:
                spans[lo - 1][1] += spans[lo][1]
                del spans[lo]
            self.used_bytes -= slot.size
            self._cv.notify_all()

    def free_spans(self, region):
        """[[offset, size], ...] free in ``region`` (a copy; for tests)."""
        with self._cv:
            return [list(s) for s in self._free[region.name]]

    def view(self, slot):
        """A writable memoryview of the slot's ``nbytes``."""
        return memoryview(slot.region.mm)[slot.offset:slot.offset + slot.nbytes]

    def close(self):
        """Unregisters (when an unregister callable was given) and unmaps every region."""
        with self._cv:
            regions, self._regions = self._regions, []
            self._free.clear()
            self.capacity_bytes = 0
        for region in regions:
            if self._unregister is not None and region.region_id is not None:
                try:
                    self._unregister(region.region_id)
                except Exception:
                    pass
            region.close()
