"""POSIX shared-memory staging for the shm backend: regions and a sub-allocator over them.

On the shm backend the daemon copies between a client's shared-memory object and its pool with
memcpy (server/copy/shm/shm_engine.cc maps the object, MAP_SHARED|MAP_POPULATE, when the region is
registered). A client therefore stages bytes: it copies a tensor into a slot of a registered
region, sends Offload(region, offset, bytes), and frees the slot when OffloadDone arrives; a
reload is the mirror image.

:class:`ShmRegion` creates ``/dev/shm/<name>`` (the Linux home of shm_open objects) with O_EXCL
and mode 0600 (or, for a daemon running as another uid, 0660 and a group the daemon is in:
:func:`shm_access`), sizes it with ftruncate and maps it; the name can be unlinked as soon as the
daemon has registered it (nothing is left in /dev/shm if the process dies) -- unless the arena
keeps names (``keep_names``, for a client that re-registers its regions with a restarted daemon:
a name is the only way the daemon can map the object again); then the names go with
:meth:`ShmRegion.close` or at the process's exit (also when an arena was never closed), and those
of a killed process are removed by the next arena (:func:`sweep_stale`). We do not use
``multiprocessing.shared_memory``: its resource tracker would unlink the object behind us.

:class:`StagingArena` sub-allocates registered regions first-fit with coalescing, 64-byte
aligned, and grows by creating and registering another region when none has room (one region per
growth, ``max(grow_bytes, request)``), up to ``max_bytes`` in all; past that, ``alloc`` waits
for frees. Thread-safe. Growth calls ``register`` (a blocking round trip): never call ``alloc``
on the client's reader thread (future callbacks); ``free`` is safe anywhere.
"""

import atexit
import grp
import itertools
import mmap
import os
import secrets
import threading
import time

from . import errors

ALIGN_BYTES = 64
_names = itertools.count()
# Paths of the objects this process created and has not unlinked: removed at exit (an arena
# whose daemon died is never closed); a forked child's set starts empty (its parent's names).
_linked = set()


def _unlink_linked_at_exit():
    for path in list(_linked):
        try:
            os.unlink(path)
        except OSError:
            pass
    _linked.clear()


atexit.register(_unlink_linked_at_exit)
os.register_at_fork(after_in_child=_linked.clear)


def _round_up(n, k):
    return (n + k - 1) // k * k


def _parse_group(group):
    """A group name or number -> gid; OffloaddError INVALID_ARGUMENT for an unknown name."""
    if isinstance(group, int) or str(group).isdigit():
        return int(group)
    try:
        return grp.getgrnam(group).gr_gid
    except KeyError:
        raise errors.OffloaddError(
            errors.INVALID_ARGUMENT, "shm group %r is not a group on this machine: give a group "
            "name or gid the daemon is a member of" % (group,)) from None


def shm_access(socket_path, daemon_uid, mode=None, group=None):
    """``(mode, gid)`` for the shared-memory objects a client of the daemon at ``socket_path``
    creates, so the daemon (``daemon_uid``, from the socket's SO_PEERCRED) can open them. ``gid``
    None: leave the group as created (the process's effective gid).

    ``mode`` (int, or an octal string such as "0660") and ``group`` (name or gid) default to
    $OFFLOADD_SHM_MODE and $OFFLOADD_SHM_GROUP, else:
      * a daemon running as root or as this uid, or an unknown one: 0600, no group change;
      * a daemon of another uid (the non-root daemon of the container image, uid 10001): 0660
        with the socket file's group -- the socket group the daemon gives its socket to, and
        this process connects through -- when this process is a member, else with ``group``.
    A 0660 object can be opened by every member of that group, not only by the daemon (the
    daemon itself registers only objects of the session's own uid): give the daemon a group of
    its own to share with (``group``), or run it as root, where that matters.
    Only 0600 and 0660 are accepted (mode INVALID_ARGUMENT otherwise): never world access.
    """
    mode = mode if mode is not None else os.environ.get("OFFLOADD_SHM_MODE") or None
    group = group if group is not None else os.environ.get("OFFLOADD_SHM_GROUP") or None
    if isinstance(mode, str):
        try:
            mode = int(mode, 8)
        except ValueError:
            mode = -1
    if mode is None:
        mode = 0o600 if daemon_uid in (None, 0, os.geteuid()) and group is None else 0o660
    if mode not in (0o600, 0o660):
        raise errors.OffloaddError(
            errors.INVALID_ARGUMENT, "shm mode must be 0600 (this uid only) or 0660 (and a group "
            "the daemon is in), not %r" % (mode,))
    if mode == 0o600:
        return mode, None
    if group is not None:
        return mode, _parse_group(group)
    try:
        gid = os.stat(socket_path).st_gid
    except OSError:
        return mode, None
    mine = set([os.getegid()] + os.getgroups())
    return mode, gid if gid in mine else None


class ShmRegion:
    """A shared-memory object created and mapped read-write by this process.

    Attributes: ``name`` ("/offloadd-py-<pid>-<pid namespace inode>-<n>-<hex>", the shm_open
    name the daemon opens),
    ``size_bytes``, ``mm`` (the mmap.mmap), ``region_id`` (set by the arena once registered).
    ``mode`` 0600 or 0660 and ``gid`` (None: the process's) as :func:`shm_access` returns them:
    the object is created 0600, given the group, then the mode, so no other group ever sees it.
    Raises OSError (e.g. ENOSPC when /dev/shm is full: its size is a tmpfs mount option; EPERM
    when this process is not a member of ``gid``).
    """

    def __init__(self, size_bytes, prefix="offloadd-py", mode=0o600, gid=None):
        self.size_bytes = int(size_bytes)
        self.name = "/%s-%d-%d-%d-%s" % (prefix, os.getpid(), pid_namespace_id(), next(_names),
                                          secrets.token_hex(4))
        self.path = "/dev/shm" + self.name
        self.region_id = None
        fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_RDWR, 0o600)
        _linked.add(self.path)
        try:
            if gid is not None:
                os.fchown(fd, -1, gid)
            if mode != 0o600:
                os.fchmod(fd, mode)
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
        _linked.discard(self.path)
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


def pid_namespace_id():
    """The inode of this process's PID namespace (``/proc/self/ns/pid`` reads
    "pid:[4026531836]"), 0 when unreadable. Object names carry it: /dev/shm is often shared
    between containers or sandboxes whose pids overlap, so a pid alone names no process."""
    try:
        link = os.readlink("/proc/self/ns/pid")
    except OSError:
        return 0
    digits = link[len("pid:["):-1] if link.startswith("pid:[") and link.endswith("]") else ""
    return int(digits) if digits.isdigit() else 0


def proc_shows_own_pids():
    """Whether /proc numbers processes as this PID namespace does (``/proc/self`` is this
    process's pid). False inside a PID namespace that kept its parent's /proc (``unshare
    --pid`` without ``--mount-proc``): a /proc/<pid> there names no process of ours, and a
    sweep would take live processes for dead ones."""
    try:
        return int(os.readlink("/proc/self")) == os.getpid()
    except (OSError, ValueError):
        return False


def sweep_stale(prefix="offloadd-py"):
    """Removes this uid's ``/dev/shm/<prefix>-<pid>-<pidns>-...`` objects made in this
    process's PID namespace whose process is gone (names kept by an arena with ``keep_names``
    whose process was killed). Names from other PID namespaces are left alone, and nothing is
    removed where /proc is not this namespace's (proc_shows_own_pids). Returns how many were
    removed."""
    removed = 0
    my_ns = pid_namespace_id()
    try:
        names = os.listdir("/dev/shm") if my_ns and proc_shows_own_pids() else []
    except OSError:
        return 0
    for name in names:
        if not name.startswith(prefix + "-"):
            continue
        parts = name[len(prefix) + 1:].split("-")
        if (len(parts) != 4 or not parts[0].isdigit() or parts[1] != str(my_ns)
                or os.path.exists("/proc/%s" % parts[0])):
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
        """The daemon's id (int) of the registered region this slot lies in."""
        return self.region.region_id


class StagingArena:
    """First-fit sub-allocator over registered shared-memory regions. Each arena first removes
    the names that killed processes left (:func:`sweep_stale`); a process's own names go with
    close() or at its exit.

    Args:
      register: ``callable(shm_name, size_bytes) -> region_id`` (e.g. Client.register_shm).
      grow_bytes: size of the first region and the minimum of each later one (bytes).
      max_bytes: cap on the sum of region sizes; an alloc that would pass it waits for frees.
      unregister: optional ``callable(region_id)`` used by close().
      keep_names: keep each region's name until close() and pass ``relink=region.relink`` to
        ``register`` (Client.register_shm), so a client can register the regions again with a
        restarted daemon.
      access: ``(mode, gid)`` of the regions (:func:`shm_access`; Client.shm_mode/shm_gid).
    """

    def __init__(self, register, grow_bytes=16 << 20, max_bytes=1 << 30, unregister=None,
                 keep_names=False, access=(0o600, None)):
        self._register = register
        self._access = access
        self._keep_names = keep_names
        sweep_stale()  # names of killed processes (a name is kept until registered, at least)
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
        """How many shared-memory regions the arena has created (int)."""
        return len(self._regions)

    def alloc(self, nbytes, timeout=None, abort=None, pump=None):
        """A Slot of at least ``nbytes`` (> 0). Grows when no region has room.

        Raises TimeoutError when ``max_bytes`` is reached and nothing was freed within
        ``timeout`` seconds (None waits forever), at once when ``timeout`` is 0 and no region
        has room (never grows: a registration waits for the daemon); what ``abort()`` returns when, checked every
        0.25 s of such a wait, it returns an exception (a daemon that stopped answering);
        ``pump(seconds)``, when given, is called (without the arena's lock) instead of waiting
        for a free: it waits up to ``seconds`` for answers that free slots, and returns False
        when it had nothing to wait for (the arena then waits as without it);
        OSError / the register callable's errors when a new region cannot be created or
        registered (a registration gets ``timeout`` too, where the callable takes one; when its
        error carries the request's Future as ``answer``, the new region's name is kept until
        that resolves, so that the daemon does not find it gone).
        """
        size = _round_up(max(int(nbytes), 1), ALIGN_BYTES)
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cv:
            while True:
                slot = self._take(size, nbytes)
                if slot is not None:
                    return slot
                if timeout is not None and timeout <= 0:
                    raise TimeoutError(
                        "no staging room for %d bytes (%d of %d bytes in use) and an alloc "
                        "that may not wait does not grow the arena (a registration waits for "
                        "the daemon)" % (size, self.used_bytes, self.capacity_bytes))
                room = self.capacity_bytes + max(size, self.grow_bytes) <= self.max_bytes
                if not self._growing and (room or not self._regions):
                    self._growing = True
                    break
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(
                        "offloadd staging arena full (%d of %d bytes in use): raise max_bytes "
                        "or let offloads finish" % (self.used_bytes, self.max_bytes))
                wait = 0.25 if left is None else min(left, 0.25)
                if pump is None:
                    self._cv.wait(wait)
                else:  # answers taken on this thread free slots: outside the lock
                    self._cv.release()
                    try:
                        waited = pump(wait)
                    finally:
                        self._cv.acquire()
                    if not waited:
                        self._cv.wait(wait)
                stop = abort() if abort is not None else None
                if stop is not None:
                    raise stop
        # Create and register outside the lock: the reader thread frees slots while we wait for
        # the daemon's answer.
        region = None
        kw = {} if deadline is None else {"timeout": max(deadline - time.monotonic(), 0.001)}
        try:
            region = ShmRegion(_round_up(max(size, self.grow_bytes), 1 << 20),
                               mode=self._access[0], gid=self._access[1])
            if self._keep_names:
                kw["relink"] = region.relink
            try:
                region.region_id = self._register(region.name, region.size_bytes, **kw)
            except BaseException as e:
                answer = getattr(e, "answer", None)  # a wait that ended before the answer
                if answer is not None:  # the daemon may still open the name: keep it till then
                    doomed, region = region, None
                    answer.add_done_callback(lambda _: doomed.close())
                raise
            if not self._keep_names:
                region.unlink()  # the daemon has mapped it: the name is not needed
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
        """Returns a slot; coalesces with its neighbours. Safe on any thread. A slot of a region
        the arena no longer holds (closed: its session ended under an op still in flight, whose
        completion callback frees its slot late) is dropped: the region is gone with it."""
        with self._cv:
            spans = self._free.get(slot.region.name)
            if spans is None:
                return
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
