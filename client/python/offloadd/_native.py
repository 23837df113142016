"""Binding of the native client core (client/core/offloadd_core.h): the request ring of a
session, without a Python thread per request or per answer.

The core is liboffloadd_core.so (``bazel build //client/core:liboffloadd_core.so``), loaded with
ctypes; it links no gRPC and no Python. The hot calls (the submissions offload, reload, release
and drain) go through the extension module offloadd._ring_fast
(client/core/ring_fast_module.c, ``bazel build //client/core:ring_fast.so``; CPython's stable
ABI of 3.10), which parses the arguments in C instead of ctypes' per-call conversion: it links
no second core but is handed the addresses of the ctypes-loaded library's functions. Both
release the GIL during calls that may sleep, so :meth:`NativeRing.wait`, a drain with a timeout
and a submission waiting for a slot sleep in a futex with the GIL released.
:attr:`NativeRing.binding` says which is in use: "c-extension", or "ctypes" when the module is
not built or does not load, or $OFFLOADD_RING_FAST is 0 (:data:`ring_fast_error` says why).

The library is found at $OFFLOADD_CORE_LIB, beside this file, in the repository's build/bin
(``make build``) or where a Bazel build of the repository leaves it; :func:`load` raises OSError
naming the places it looked. The extension module is found beside this file
(_ring_fast.abi3.so, in the wheel), else as ring_fast.so where a Bazel build or ``make build``
leaves it (:func:`load_ring_fast`).

Use: create a :class:`NativeRing`, name ``ring.fd`` in Hello (``Hello.ring.fd``) on the
session's stream, and once ``HelloReply.ring_attached`` submit offloads, reloads and releases
here (region ids are the daemon's). Sizes and offsets are int bytes, times float seconds;
request ids are ints with bit 63 set. Event handles: None or 64 bytes.
"""

import ctypes
import functools
import importlib.util
import os
import threading
import weakref

_HERE = os.path.dirname(os.path.abspath(__file__))
_REPO = os.path.abspath(os.path.join(_HERE, "..", "..", ".."))
_CANDIDATES = (
    os.path.join(_HERE, "liboffloadd_core.so"),
    os.path.join(_REPO, "bazel-bin", "client", "core", "liboffloadd_core.so"),
    os.path.join(_REPO, "build", "bin", "liboffloadd_core.so"),  # make build
    os.path.join(_REPO, "bazel-out", "k8-opt", "bin", "client", "core", "liboffloadd_core.so"),
    os.path.join(_REPO, "bazel-out", "k8-fastbuild", "bin", "client", "core",
                 "liboffloadd_core.so"),
)

# The extension module of the ring's hot calls (client/core/ring_fast_module.c): in the wheel
# beside this file, else where `make build` or a Bazel build of the repository leaves it.
_FAST_CANDIDATES = (
    os.path.join(_HERE, "_ring_fast.abi3.so"),
    os.path.join(_REPO, "bazel-bin", "client", "core", "ring_fast.so"),
    os.path.join(_REPO, "build", "bin", "ring_fast.so"),  # make build
    os.path.join(_REPO, "bazel-out", "k8-opt", "bin", "client", "core", "ring_fast.so"),
)

# The extension module of the torch hooks' per-tensor records (client/core/store_front_module.c):
# in the wheel beside this file, else where `make build` or a Bazel build leaves it.
_STORE_FRONT_CANDIDATES = (
    os.path.join(_HERE, "_store_front.abi3.so"),
    os.path.join(_REPO, "bazel-bin", "client", "core", "store_front.so"),
    os.path.join(_REPO, "build", "bin", "store_front.so"),  # make build
    os.path.join(_REPO, "bazel-out", "k8-opt", "bin", "client", "core", "store_front.so"),
)

# Results of poll and wait (offloadd_core.h).
DONE, PENDING, CLOSED, UNKNOWN = 1, 0, -1, -2
# Answers one drain call takes at most (offloadd_ring_drain).
DRAIN_BATCH = 64
# Completion kinds and flags.
OFFLOAD_DONE, RELOAD_DONE, RELEASED, ERROR = 1, 2, 3, 4
FLAG_RELEASED, FLAG_DONE_EVENT_RECORDED = 1, 2
URGENT, PREFETCH = 1, 2


class Completion(ctypes.Structure):
    """One answer (offloadd_completion, 256 bytes): ``kind`` one of OFFLOAD_DONE, RELOAD_DONE,
    RELEASED, ERROR; ``status_code`` a google.rpc.Code when ERROR; ``message`` (str) why."""
    _fields_ = [("request_id", ctypes.c_uint64), ("kind", ctypes.c_uint32),
                ("status_code", ctypes.c_int32), ("block_id", ctypes.c_uint64),
                ("bytes", ctypes.c_uint64), ("queued_seconds", ctypes.c_double),
                ("copy_seconds", ctypes.c_double), ("flags", ctypes.c_uint32),
                ("message_bytes", ctypes.c_uint32), ("message_raw", ctypes.c_char * 200)]

    @property
    def message(self):
        """The first ``message_bytes`` bytes of the message (at most 200; the format is
        length-delimited, not NUL-terminated: NULs inside are kept), decoded from UTF-8 with
        errors replaced."""
        field = Completion.message_raw
        # self.message_raw would stop at the first NUL (a c_char array's value): read the
        # field's bytes themselves.
        return ctypes.string_at(ctypes.addressof(self) + field.offset,
                                min(self.message_bytes, field.size)).decode("utf-8", "replace")


_lib = None


def _load_first(paths, open_path, failures):
    """``open_path(path)`` of the first of ``paths`` (str) that exists and opens, in order:
    ``(what it returned, errors)``, or ``(None, errors)`` when none does. ``errors`` (a list of
    str) says why each path tried before was passed over: "PATH: missing", or "PATH: TEXT" for
    an exception of ``failures`` (a tuple of types) that ``open_path`` raised. Any other
    exception propagates."""
    errors = []
    for path in paths:
        if not os.path.exists(path):
            errors.append("%s: missing" % path)
            continue
        try:
            return open_path(path), errors
        except failures as e:
            errors.append("%s: %s" % (path, e))
    return None, errors


def load():
    """The loaded core (cached). Raises OSError when no candidate loads."""
    global _lib
    if _lib is not None:
        return _lib
    env = os.environ.get("OFFLOADD_CORE_LIB")
    lib, errors = _load_first([env] if env else _CANDIDATES, ctypes.CDLL, (OSError,))
    if lib is not None:
        _declare(lib)
        _lib = lib
        return lib
    raise OSError("the offloadd native core (liboffloadd_core.so) was not found: build it with "
                  "'bazel build //client/core:liboffloadd_core.so' or set OFFLOADD_CORE_LIB ("
                  + "; ".join(errors) + ")")


_fast = None        # the loaded offloadd._ring_fast, bound to _lib's functions
ring_fast_error = None  # why NativeRings use ctypes (a sentence), or None


def load_ring_fast():
    """The extension module of the ring's hot calls, bound to the loaded core, or None (then
    NativeRing calls the core through ctypes; :data:`ring_fast_error` says why): when
    $OFFLOADD_RING_FAST is 0, when it was not built, or when it does not load (a CPython older
    than 3.10). Loads the core first (OSError as :func:`load`)."""
    global _fast, ring_fast_error
    lib = load()
    if os.environ.get("OFFLOADD_RING_FAST", "1") == "0":
        ring_fast_error = "OFFLOADD_RING_FAST=0"
        return None
    if _fast is not None:
        ring_fast_error = None
        return _fast
    module, errors = _load_first(_FAST_CANDIDATES, lambda path: _bound_ring_fast(path, lib),
                                 (ImportError, OSError, RuntimeError))
    if module is not None:
        _fast, ring_fast_error = module, None
        return module
    ring_fast_error = "the extension module was not found or did not load (" + \
        "; ".join(errors) + ")"
    return None


_store_front = None  # the loaded offloadd._store_front


def load_store_front():
    """The extension module of the torch hooks' per-tensor records (offloadd._store_front:
    the handle type Saved and the step tables of a store, Front), cached. It needs no core and
    no torch at import. Raises ImportError naming the places looked at when it is not built
    (``bazel build //client/core:store_front.so``, or ``make build``) or does not load (a
    CPython older than 3.10)."""
    global _store_front
    if _store_front is None:
        module, errors = _load_first(_STORE_FRONT_CANDIDATES, _import_store_front,
                                     (ImportError, OSError))
        if module is None:
            raise ImportError("offloadd: the extension module of the torch hooks' records "
                              "(_store_front) was not found or did not load: install the "
                              "offloadd wheel, or run 'make build' in the repository ("
                              + "; ".join(errors) + ")")
        _store_front = module
    return _store_front


def _import_store_front(path):
    spec = importlib.util.spec_from_file_location("offloadd._store_front", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _bound_ring_fast(path, lib):
    """The extension module at ``path``, imported as offloadd._ring_fast and bound to ``lib``'s
    functions. Raises ImportError or OSError when it does not import, RuntimeError when the
    module is bound to another core of this process already."""
    spec = importlib.util.spec_from_file_location("offloadd._ring_fast", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.bind(*(ctypes.cast(getattr(lib, "offloadd_ring_" + name), ctypes.c_void_p).value
                  for name in ("offload", "reload", "release", "drain")))
    return module


def _declare(lib):
    u64, u32, dbl, p = ctypes.c_uint64, ctypes.c_uint32, ctypes.c_double, ctypes.c_void_p
    ev = ctypes.c_char_p
    lib.offloadd_ring_create.restype = p
    lib.offloadd_ring_create.argtypes = [u32, u32, ctypes.c_char_p, ctypes.c_size_t]
    lib.offloadd_ring_destroy.argtypes = [p]
    lib.offloadd_ring_fd.restype = ctypes.c_int
    lib.offloadd_ring_fd.argtypes = [p]
    lib.offloadd_ring_offload.restype = u64
    lib.offloadd_ring_offload.argtypes = [p, u64, u64, u64, u64, ev, ctypes.c_int, u64, u64, dbl]
    lib.offloadd_ring_reload.restype = u64
    lib.offloadd_ring_reload.argtypes = [p, u64, u64, u64, u64, u32, ctypes.c_int, dbl, ev, ev,
                                         dbl]
    lib.offloadd_ring_release.restype = u64
    lib.offloadd_ring_release.argtypes = [p, u64, u64, dbl]
    for name in ("offloadd_ring_poll",):
        getattr(lib, name).restype = ctypes.c_int
        getattr(lib, name).argtypes = [p, u64, ctypes.POINTER(Completion)]
    lib.offloadd_ring_wait.restype = ctypes.c_int
    lib.offloadd_ring_wait.argtypes = [p, u64, dbl, ctypes.POINTER(Completion)]
    lib.offloadd_ring_drain.restype = ctypes.c_int
    lib.offloadd_ring_drain.argtypes = [p, ctypes.POINTER(Completion), ctypes.c_size_t, dbl]
    lib.offloadd_ring_wake.argtypes = [p]
    lib.offloadd_ring_shutdown.argtypes = [p]
    lib.offloadd_ring_pending.restype = ctypes.c_size_t
    lib.offloadd_ring_pending.argtypes = [p]
    lib.offloadd_ring_closed.restype = ctypes.c_int
    lib.offloadd_ring_closed.argtypes = [p]


class RingClosed(ConnectionError):
    """A submission was refused because the ring is closed: the daemon ended the session
    (reconnect: the stream carries the requests)."""


class RingFull(ConnectionError, TimeoutError):
    """A submission was refused because no slot of the ring freed within its timeout: the
    daemon is behind. Take answers (:meth:`NativeRing.drain`) and submit again. A
    ConnectionError too, as every refused submission was before."""


class RingReleased(ValueError):
    """A call on a :class:`NativeRing` after its :meth:`~NativeRing.close` (or a call that was
    inside the ring when close() ended it)."""


def _event(event):
    """An event argument as the core takes it: None, or 64 bytes. The rule of the extension
    module's get_event (ring_fast_module.c), with its texts: an int or a str is a TypeError
    (bytes(64) would make 64 zero bytes of an int), anything else goes through bytes() (its
    TypeError as it raises it), and another length than 64 is a ValueError."""
    if event is None:
        return None
    if isinstance(event, (int, str)):
        raise TypeError("an event handle is None or 64 bytes (cudaIpcEventHandle_t), not an "
                        "int or a str")
    event = bytes(event)
    if len(event) != 64:
        raise ValueError("an event handle is 64 bytes (cudaIpcEventHandle_t), not %d" % len(event))
    return event


# The ctypes binding's submissions, with the extension module's arguments (events as the
# caller gave them, checked here, inside NativeRing._call as the module checks them).
def _offload_ctypes(lib, ring, region_id, offset, nbytes, tag, ready_event, has_ordering, step,
                    position, timeout):
    return lib.offloadd_ring_offload(ring, region_id, offset, nbytes, tag, _event(ready_event),
                                     has_ordering, step, position, timeout)


def _reload_ctypes(lib, ring, block_id, tag, region_id, offset, priority, release_after,
                   deadline_seconds, ready_event, done_event, timeout):
    return lib.offloadd_ring_reload(ring, block_id, tag, region_id, offset, priority,
                                    release_after, deadline_seconds, _event(ready_event),
                                    _event(done_event), timeout)


# Every NativeRing not yet freed: a process forked after one was made must not use it.
_RINGS = weakref.WeakSet()


def _released_in_child():
    """After a fork, in the child: every ring made before it is the parent's. Its memory is a
    shared mapping, so a child that submitted would put requests the parent never made (under
    ids the parent's next requests also get) before the daemon, and a child that drained would
    take the parent's answers: each ring is released here (calls raise RingReleased; freeing
    the object unmaps the child's copy only)."""
    for ring in list(_RINGS):
        ring._released = True
        ring._ring = None


os.register_at_fork(after_in_child=_released_in_child)


class NativeRing:
    """A session's request ring. ``entries``: submission and completion slots each (a power of
    two from 8 to 65536). Raises OSError when the core is missing or the ring cannot be made.
    Thread-safe. :meth:`close` ends it; its memory is freed with the object (keep it until the
    session ends). After close() every method raises :class:`RingReleased` (``closed`` is True);
    a close() while other threads are inside calls returns those threads at once (a sleeping
    drain or wait too: they raise RingReleased). In a process forked after it was made, it is
    released as by close() (the parent's daemon session owns it), without touching the
    parent's ring.

    Both bindings (:attr:`binding`) raise the same exception with the same text for a closed
    ring and for events. A call on a closed ring raises RingReleased before the ids, sizes and
    events it passes to the core are checked (a RingReleased is a ValueError: code that catches
    a bad event's ValueError catches it too). Ids, sizes, priorities and orderings are integers
    taken modulo 2**64 by both (-1 is 2**64 - 1: the daemon refuses what does not fit its
    region or pool), times real seconds; a value of another type (a float, None, a str) raises
    TypeError through the extension but ctypes.ArgumentError (not a TypeError) through ctypes,
    with different texts. Events (``ready_event``, ``done_event``): None or
    64 bytes; an int or a str raises TypeError, anything else is converted by bytes() (its
    TypeError) and another length raises ValueError. Answers' messages (``drain`` tuples,
    :attr:`Completion.message`) are the answer's ``message_bytes`` bytes, NULs included (the
    ring's format is length-delimited, as the C++ client reads it), decoded from UTF-8 with
    errors replaced.
    """

    def __init__(self, entries=256):
        self._lib = load()
        fast = self._fast = load_ring_fast()
        # The submissions and drain: the extension module's functions or the core's through
        # ctypes, with the same arguments (events checked inside each, after _call's check of
        # close(); partials of the library, not bound methods: no cycle delays __del__).
        lib = self._lib
        self._offload_fn = fast.offload if fast else functools.partial(_offload_ctypes, lib)
        self._reload_fn = fast.reload if fast else functools.partial(_reload_ctypes, lib)
        self._release_fn = fast.release if fast else lib.offloadd_ring_release
        self._lock = threading.Lock()  # close() against close()
        self._released = False   # close() was called
        self._ring = None        # the native ring while usable (None after close())
        self._owned = None       # the native ring until it is freed (__del__)
        # Answers taken off the ring by a drain that a signal handler interrupted: the next
        # drain returns them (offloadd._ring_fast.drain's carry; the ctypes path has none).
        self._carry = []
        error = ctypes.create_string_buffer(256)
        ring = self._lib.offloadd_ring_create(entries, entries, error, len(error))
        if not ring:
            raise OSError("offloadd ring: " + error.value.decode("utf-8", "replace"))
        self._ring = self._owned = ring
        self._local = threading.local()  # per thread: the buffer drain fills
        _RINGS.add(self)

    def _call(self, fn, *args):
        """``fn(ring, *args)`` on the native ring. No lock: close() only shuts the ring down
        (its memory lives until this object is freed, and a thread inside a call holds a
        reference to it), so a call that read the pointer before a close() still reaches live
        memory. Raises RingReleased after close(), or when close() came during the call (its
        result is not the daemon's)."""
        ring = self._ring
        if ring is None:
            raise RingReleased("this offloadd NativeRing is closed (close() was called): create "
                               "a new NativeRing and offer it in a new session's Hello")
        result = fn(ring, *args)
        if self._released:
            raise RingReleased("this offloadd NativeRing was closed (close() was called) during "
                               "the call")
        return result

    @property
    def binding(self):
        """How this ring calls the core's submissions and drain: "c-extension" (the module
        offloadd._ring_fast) or "ctypes" (:data:`ring_fast_error` says why)."""
        return "c-extension" if self._fast is not None else "ctypes"

    @property
    def fd(self):
        """The memfd descriptor to name in Hello.ring.fd."""
        return self._call(self._lib.offloadd_ring_fd)

    def _submitted(self, request_id):
        if request_id != 0:
            return request_id
        if self._call(self._lib.offloadd_ring_closed):
            raise RingClosed("the offloadd session's ring is closed (the daemon ended the "
                             "session): reconnect; requests go on the stream")
        raise RingFull("no slot of the offloadd ring freed within the timeout (the daemon is "
                       "behind): take answers with drain() and submit again")

    def offload(self, region_id, offset, nbytes, tag=0, ready_event=None, ordering=None,
                timeout=-1.0):
        """Submits an offload of ``nbytes`` at ``offset`` of region ``region_id``; its request
        id. ``ordering``: (step, position) or None. Raises RingClosed (the session ended) or
        RingFull (no slot freed within ``timeout`` seconds; < 0: no limit), both
        ConnectionErrors, when not submitted; RingReleased after close()."""
        step, position = ordering if ordering is not None else (0, 0)
        rid = self._call(self._offload_fn, region_id, offset, nbytes, tag, ready_event,
                         int(ordering is not None), step, position, timeout)
        return rid or self._submitted(rid)

    def reload(self, block_id, region_id, offset, priority=URGENT, release_after=False,
               deadline_seconds=0.0, tag=0, ready_event=None, done_event=None, timeout=-1.0):
        """Submits a reload of block ``block_id`` (0: the block offloaded with ``tag``) to
        ``offset`` of region ``region_id``; its request id. Raises as :meth:`offload`."""
        rid = self._call(self._reload_fn, block_id, tag, region_id, offset, priority,
                         int(release_after), deadline_seconds, ready_event, done_event, timeout)
        return rid or self._submitted(rid)

    def release(self, block_id, tag=0, timeout=-1.0):
        """Submits a release of block ``block_id`` (0: by ``tag``); its request id. Raises as
        :meth:`offload`."""
        return self._submitted(self._call(self._release_fn, block_id, tag, timeout))

    def poll(self, request_id):
        """``(result, Completion or None)``: DONE with the answer (taken), or PENDING, CLOSED,
        UNKNOWN."""
        out = Completion()
        result = self._call(self._lib.offloadd_ring_poll, request_id, ctypes.byref(out))
        return result, (out if result == DONE else None)

    def wait(self, request_id, timeout=None):
        """The answer of ``request_id`` (a Completion), waiting with the GIL released. Raises
        TimeoutError after ``timeout`` seconds (None: no limit), ConnectionError when the ring
        closed without it, KeyError for an id not pending. Only a live daemon closes the ring:
        a daemon that was killed (SIGKILL, a crash) leaves it open, so wait with a timeout
        and check the session's gRPC stream (which ends at once) between waits: with
        ``timeout=None`` such a wait never returns."""
        out = Completion()
        result = self._call(self._lib.offloadd_ring_wait, request_id,
                            -1.0 if timeout is None else float(timeout), ctypes.byref(out))
        if result == DONE:
            return out
        if result == PENDING:
            raise TimeoutError("no answer to offloadd ring request %#x within %s s"
                               % (request_id, timeout))
        if result == CLOSED:
            raise ConnectionError("the offloadd session ended before answering ring request "
                                  "%#x" % request_id)
        raise KeyError(request_id)

    def drain(self, timeout=0.0):
        """The answers that arrived, of any requests (taken; at most DRAIN_BATCH per call: call
        again while it returns that many), as a list of ``(request_id, kind, status_code,
        block_id, bytes, queued_seconds, copy_seconds, flags, message)`` tuples (``message`` a
        str, "" unless ERROR). Sleeps (GIL released) up to ``timeout`` seconds for the first (0:
        not at all; None: no limit). None when none was there and the ring is closed (the
        session ended). A killed daemon leaves the ring open: bound the wait. With the
        extension module, a signal handler that raises once answers were taken (a signal that
        came during the sleep) raises here and the answers are returned by the next drain."""
        timeout = -1.0 if timeout is None else float(timeout)
        if self._fast is not None:  # the tuples are made in C; interrupted ones carried
            return self._call(self._fast.drain, DRAIN_BATCH, timeout, self._carry)
        buf = getattr(self._local, "buf", None)
        if buf is None:
            buf = self._local.buf = (Completion * DRAIN_BATCH)()
        n = self._call(self._lib.offloadd_ring_drain, buf, DRAIN_BATCH, timeout)
        if n < 0:
            return None
        out = []
        for i in range(n):
            c = buf[i]
            out.append((c.request_id, c.kind, c.status_code, c.block_id, c.bytes,
                        c.queued_seconds, c.copy_seconds, c.flags,
                        c.message if c.kind == ERROR else ""))
        return out

    def wake(self):
        """Wakes every thread sleeping in :meth:`wait`, :meth:`drain` or a submission of this
        ring (they re-check what they wait for)."""
        self._call(self._lib.offloadd_ring_wake)

    @property
    def pending(self):
        """Requests submitted whose answers were not taken."""
        return self._call(self._lib.offloadd_ring_pending)

    @property
    def closed(self):
        """True once the daemon closed the ring (the session ended), or after :meth:`close`."""
        if self._released:
            return True
        try:
            return bool(self._call(self._lib.offloadd_ring_closed))
        except RingReleased:
            return True

    def close(self):
        """Ends the ring (idempotent): threads inside calls on it return at once (raising
        RingReleased) and every later call raises RingReleased. The memory is freed when this
        object is (the session's Client lets go of it at its close)."""
        with self._lock:
            if self._released:
                return
            self._released = True
            ring, self._ring = self._ring, None
        if ring is not None:
            self._lib.offloadd_ring_shutdown(ring)  # wakes every thread asleep in it

    def __del__(self):
        try:
            self._released = True
            ring, self._ring, self._owned = self._owned, None, None
            if ring is not None:
                self._lib.offloadd_ring_destroy(ring)
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass
