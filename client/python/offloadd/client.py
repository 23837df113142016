"""The offloadd protocol over grpcio: one Session stream per Client, many requests in flight.

Protocol: proto/offload.proto (package offloadd.v1); semantics follow the C++ client
(client/offloadd_client.h). The daemon listens on a Unix socket, gRPC target ``unix:<path>``.

Threads: every method is thread-safe. A Client has, per connection,
  * a writer: grpcio consumes a generator that drains every request queued since its last write
    into ONE ``ClientMessage`` (batching, at most ``MAX_REQUESTS_PER_MESSAGE``), and
  * a reader thread that resolves each request's ``concurrent.futures.Future`` by request id as
    ``ServerMessage``s arrive (the daemon may answer in any order). Done-callbacks run on it: keep
    them short and never block on another future there.

Units: sizes and offsets are int bytes; durations float seconds.

Fork: a Client belongs to the process that created it. In a process forked after that, its
requests, waits for unfinished answers, ``pump``, ``drain``, ``abandon`` and ``get_stats`` raise
OffloaddError FAILED_PRECONDITION (the session's stream, request ring and request ids are the
parent's) and ``close`` does nothing: create a new Client in the child.

Reconnecting (a daemon with ``pool_shm_name``, which says so in HelloReply.resume_grace_seconds):
when the session stream breaks (daemon killed, crashed or upgraded) the Client reconnects by
itself with exponential backoff, presents its resume token, registers its regions again (region
ids returned by ``register_*`` are the client's own and stay valid) and re-sends every request
not yet answered. Requests issued meanwhile wait. Rules (docs/failure-modes.md):
  * an offload not answered is sent again from the same source bytes (the caller keeps them
    until its future resolves); a block the dead daemon had stored for it but could not confirm
    (it is among the resumed blocks yet was never acknowledged) is released by the client, so a
    re-sent offload never leaves two blocks;
  * a reload not answered is sent again (it rewrites the same bytes to the same place); a
    release not answered is sent again, and counts as done when the block is no longer there;
  * a confirmed block missing from the resumed ones (its record failed the daemon's check) is
    lost: requests naming it fail with DATA_LOSS. So does a reload with ``release_after`` whose
    block is gone (the copy may have completed before the crash; nothing can confirm it);
  * when the daemon does not come back within ``reconnect_seconds`` (default: the daemon's
    resume_grace_seconds), or it has no blocks for the token while the client holds confirmed
    ones, every waiting and later request fails (DaemonUnavailable, or DATA_LOSS for the blocks).
A daemon whose pool does not outlive it (resume_grace_seconds 0) makes the stream's end final.

Liveness: the channel sends HTTP/2 keepalive pings every ``keepalive_time_seconds`` (10) and drops
a connection whose daemon does not answer one within ``keepalive_timeout_seconds`` (30): the
stream then ends as if the daemon had gone away. :meth:`Client.wait` bounds a wait for an answer
by silence instead: it raises :class:`~offloadd.errors.DaemonUnresponsive` once the daemon has
sent nothing on the session stream for ``unresponsive_seconds`` (20) while the caller waited
(docs/failure-modes.md). While the client reconnects, a daemon whose socket refuses
connections (down, restarting) does not count as silent -- the reconnect window bounds that
case -- but one that accepts and does not answer Hello does.

Errors (raised by ``Future.result()`` or directly):
  * :class:`~offloadd.errors.OffloaddError` with the daemon's code and message for ``Error``
    responses (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED pool or quota full past the
    admission deadline, OUT_OF_RANGE, ...);
  * :class:`~offloadd.errors.DaemonUnavailable` when nothing serves the socket or the stream ended
    for good (see above): the session's blocks and regions are gone; make a new Client;
  * CANCELLED for requests pending when :meth:`Client.close` ended the stream; FAILED_PRECONDITION
    for requests issued after it began; INTERNAL when a response has the wrong kind.
"""

import concurrent.futures
import errno
import itertools
import os
import queue
import socket
import threading
import time

import grpc

from . import _native
from . import _outcome
from . import _process
from . import errors
from . import socket_path as _socket_path
from .shm import shm_access
from .socket_path import default_socket_path, socket_path_fits
from .v1 import offload_pb2 as pb
from .v1 import offload_pb2_grpc as pb_grpc

URGENT = pb.URGENT      # the caller is blocked on this reload (backward is waiting)
PREFETCH = pb.PREFETCH  # needed soon; scheduled after urgent reloads, before offloads

MAX_REQUESTS_PER_MESSAGE = 4096
RING_ENTRIES = 1024  # submission and completion slots of the request ring each
_CLOSE = object()

# Request field -> the Response field that answers it.
_EXPECTED = {
    "hello": "hello",
    "register_region": "region_registered",
    "unregister_region": "region_unregistered",
    "offload": "offload_done",
    "reload": "reload_done",
    "release": "released",
    "client_report": "client_report_ack",
}


class Counters:
    """Counts since connect; batching shows as requests_sent / messages_sent > 1 (requests on
    the stream). ``ring_requests_sent`` / ``ring_answers_received``: offloads, reloads and
    releases submitted on the request ring and answers taken from it. ``resumes``: reconnects
    that resumed the session; ``resent``: requests sent again after one (on the stream);
    ``orphans_released``: blocks stored for an offload whose answer the crash swallowed."""

    __slots__ = ("messages_sent", "requests_sent", "messages_received", "responses_received",
                 "unknown_responses", "resumes", "resent", "orphans_released",
                 "ring_requests_sent", "ring_answers_received")

    def __init__(self):
        for k in self.__slots__:
            setattr(self, k, 0)

    def as_dict(self):
        """The counters as {name: int count}, in the order of ``__slots__``."""
        return {k: getattr(self, k) for k in self.__slots__}


class _Pending:
    """A request waiting for its answer. ``request`` names the client's region ids; ``conn``: the
    connection it was last written on (None: not yet); ``internal``: the client's own (Hello,
    re-registration, orphan release), never re-sent."""

    __slots__ = ("future", "expected", "request", "conn", "internal", "region")

    def __init__(self, future, expected, request, internal=False, region=None):
        self.future, self.expected, self.request = future, expected, request
        self.conn, self.internal, self.region = None, internal, region


# Ring completion kinds -> (the Response field the stream would have answered with, its type).
_RING_KIND = {_native.OFFLOAD_DONE: "offload_done", _native.RELOAD_DONE: "reload_done",
              _native.RELEASED: "released"}
_RING_REQUEST = {"offload": "offload_done", "reload": "reload_done", "release": "released"}


class _Answer:
    """The answer to an offload, reload or release, on the request ring or the stream: a record
    with the fields of the protocol message it stands for (proto/offload.proto), built from the
    ring's answer without that message (the hooks take one per saved tensor, and a message costs
    several times the record). Compares equal to another record of its class with the same
    fields; not hashable (a record's fields may be set)."""

    __slots__ = ()

    def _fields(self):
        return tuple(getattr(self, name) for name in self.__slots__)

    def __eq__(self, other):
        return type(other) is type(self) and other._fields() == self._fields()

    __hash__ = None

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (name, getattr(self, name)) for name in self.__slots__))


class OffloadAnswer(_Answer):
    """OffloadDone: block_id, bytes (int), queued_seconds, copy_seconds (float seconds)."""

    __slots__ = ("block_id", "bytes", "queued_seconds", "copy_seconds")

    def __init__(self, block_id, nbytes, queued_seconds, copy_seconds):
        self.block_id, self.bytes = block_id, nbytes
        self.queued_seconds, self.copy_seconds = queued_seconds, copy_seconds


class ReloadAnswer(_Answer):
    """ReloadDone: block_id, bytes (int), released, copy_seconds (float seconds),
    done_event_recorded (bool)."""

    __slots__ = ("block_id", "bytes", "released", "copy_seconds", "done_event_recorded")

    def __init__(self, block_id, nbytes, released, copy_seconds, done_event_recorded):
        self.block_id, self.bytes, self.released = block_id, nbytes, released
        self.copy_seconds, self.done_event_recorded = copy_seconds, done_event_recorded


class ReleaseAnswer(_Answer):
    """Released: block_id (int)."""

    __slots__ = ("block_id",)

    def __init__(self, block_id):
        self.block_id = block_id


class _RingOp(_outcome.Outcome):
    """An offload, reload or release submitted on the request ring: what the caller holds in
    place of a Future (``done``, ``result(timeout)``, ``exception(timeout)``,
    ``add_done_callback``, ``cancelled``, ``set_result``, ``set_exception``). No thread of the
    client completes it: the thread that takes its answer from the ring does (``Client.pump``,
    or a wait for it), and its callbacks run there. ``args``: the request's fields with the
    client's region id (for a re-send on the stream after the session resumed)."""

    __slots__ = ("client", "kind", "args", "request_id", "target")

    def __init__(self, client, kind, args, target=None):
        self._done, self._value, self._exc = False, None, None  # Outcome's, set here: one call
        self._callbacks = self._event = None
        self.client, self.kind, self.args = client, kind, args
        self.request_id = 0
        self.target = target  # an offload's handle, for its answer taken in C (take_answers)

    def _wait(self, timeout):
        """While the client's ring is in use, takes its answers on this thread until this
        one's came; otherwise (a reload outcome whose request went on the stream) waits for
        the reader as any outcome does."""
        if self._done:
            return
        if self.client._ring_native is not None:
            self.client._await_ring(self, timeout)
        else:
            super()._wait(timeout)

    def request(self):
        """The request as it would travel on the stream (client region id, no request id)."""
        a = self.args
        if self.kind == "offload":
            region, offset, nbytes, ready_event, ordering = a
            req = pb.OffloadRequest(region_id=region, offset=offset, bytes=nbytes,
                                    ready_event=ready_event or b"")
            if ordering is not None:
                req.ordering.step, req.ordering.position = ordering
            return pb.Request(offload=req)
        if self.kind == "reload":
            block, region, offset, priority, release_after, deadline, ready, done = a
            return pb.Request(reload=pb.ReloadRequest(
                block_id=block, region_id=region, offset=offset, priority=priority,
                release_after=release_after, deadline_seconds=deadline,
                ready_event=ready or b"", done_event=done or b""))
        return pb.Request(release=pb.ReleaseRequest(block_id=a[0]))




class _Conn:
    """One connection: channel, stream and reader thread."""

    def __init__(self, client, connect_timeout_seconds):
        self.client = client
        self.outbox = queue.SimpleQueue()
        self.channel = grpc.insecure_channel(client.target, options=client.channel_options())
        self.call = None
        self.reader = None
        try:
            grpc.channel_ready_future(self.channel).result(timeout=connect_timeout_seconds)
        except grpc.FutureTimeoutError:
            self.channel.close()
            raise errors.DaemonUnavailable(_socket_path.no_answer_reason(
                client.socket_path, client.target, connect_timeout_seconds)) from None
        except BaseException:  # an interrupt: the channel and its threads go
            self.channel.close()
            raise
        self.stub = pb_grpc.OffloadStub(self.channel)

    def start(self):
        self.call = self.stub.Session(self._writer())
        self.reader = threading.Thread(target=self.client._read_loop, args=(self,),
                                       name="offloadd-reader", daemon=True)
        self.reader.start()

    def send(self, request):
        self.outbox.put(request)

    def _writer(self):
        """Generator consumed by grpcio: one ClientMessage per burst of queued requests."""
        counters, lock = self.client.counters, self.client._lock
        while True:
            item = self.outbox.get()
            if item is _CLOSE:
                return
            batch, done = [item], False
            while len(batch) < MAX_REQUESTS_PER_MESSAGE:
                try:
                    item = self.outbox.get_nowait()
                except queue.Empty:
                    break
                if item is _CLOSE:
                    done = True
                    break
                batch.append(item)
            with lock:
                counters.messages_sent += 1
                counters.requests_sent += len(batch)
            yield pb.ClientMessage(requests=batch)
            if done:
                return

    def close(self, timeout=0.5):
        self.outbox.put(_CLOSE)
        if self.reader is not None and self.reader is not threading.current_thread():
            self.reader.join(timeout)
            if self.reader.is_alive() and self.call is not None:
                self.call.cancel()
                self.reader.join(1.0)
        self.channel.close()


class Client:
    """A session with the daemon. Connects, opens the Session stream and sends Hello.

    Args:
      socket_path: daemon socket (default: :func:`offloadd.socket_path.default_socket_path`).
      client_name: free text shown in the daemon's stats.
      device_id: the GPU the client's memory lives on (UUID "GPU-..." on the cuda backend, any
        stable name such as "cpu" on the shm backend); selects the link copies are scheduled on.
      connect_timeout_seconds: socket connect + HelloReply, together.
      resume_token: a previous session's token (see :meth:`resume`); empty: a new session.
      reconnect: reconnect and resume by itself when the stream breaks (module doc); only with a
        daemon whose pool outlives it.
      reconnect_seconds: how long to try (and how long requests wait meanwhile); None: the
        daemon's resume_grace_seconds.
      reconnect_initial_backoff_seconds, reconnect_max_backoff_seconds: the wait between
        attempts, doubling from the first to the second.
      unresponsive_seconds: float > 0; :meth:`wait` gives up (DaemonUnresponsive) after this
        long without any message from the daemon.
      keepalive_time_seconds, keepalive_timeout_seconds: float > 0; the channel pings the daemon
        this often and drops the connection when a ping is not answered within the timeout (keep
        the timeout above ``unresponsive_seconds``: a dropped connection ends the session).
      shm_mode, shm_group: access of the shared-memory objects this client's staging creates
        for the daemon (:func:`offloadd.shm.shm_access`; default: $OFFLOADD_SHM_MODE /
        $OFFLOADD_SHM_GROUP, else 0600 for a root daemon or one of this uid, 0660 with the
        socket's group for a daemon of another uid). Read as ``shm_mode`` / ``shm_gid``.
      ring: offer the daemon a request ring (the native core, offloadd/_native.py) for
        offloads, reloads and releases; None: unless $OFFLOADD_RING is "0". Without the core
        (liboffloadd_core.so not found) or when the daemon does not attach it, every request
        travels on the stream; ``ring_active`` says which, ``ring_error`` why not.
    Attributes besides the HelloReply fields: ``daemon_uid``, the uid of the process listening
      on the socket (SO_PEERCRED; the service manager's under socket activation; None when the
      probe connect timed out).
    Raises: SocketPermissionDenied at once when this user may not connect to the socket (the
      message names the socket or directory, its group and how to join it), DaemonUnavailable
      (no socket, nobody listening, nothing accepting within the timeout), OffloaddError
      INVALID_ARGUMENT (path too long, bad shm_mode/shm_group), DEADLINE_EXCEEDED (no HelloReply
      in time), or the daemon's Error for Hello.
    """

    def __init__(self, socket_path=None, client_name="", device_id="cpu",
                 connect_timeout_seconds=5.0, pid=None, resume_token=b"", reconnect=True,
                 reconnect_seconds=None, reconnect_initial_backoff_seconds=0.05,
                 reconnect_max_backoff_seconds=1.0, unresponsive_seconds=20.0,
                 keepalive_time_seconds=10.0, keepalive_timeout_seconds=30.0, shm_mode=None,
                 shm_group=None, ring=None):
        if unresponsive_seconds <= 0 or keepalive_time_seconds <= 0 or \
                keepalive_timeout_seconds <= 0:
            raise ValueError("unresponsive_seconds and the keepalive times must be > 0")
        self.unresponsive_seconds = float(unresponsive_seconds)
        self.keepalive_time_seconds = float(keepalive_time_seconds)
        self.keepalive_timeout_seconds = float(keepalive_timeout_seconds)
        self._last_heard = time.monotonic()  # the daemon's last message (or refused connect)
        self.socket_path = socket_path or default_socket_path()
        # What to say when nothing serves it, naming both ways to give the path (as offloadctl
        # names --socket and $OFFLOADD_SOCKET): the path came from the caller (the torch hooks
        # pass the one they resolved), or from the environment or the default rule.
        self._path_remedy = (
            "pass the daemon's socket path (socket_path=PATH, or set $OFFLOADD_SOCKET=PATH "
            "where no socket_path= is given)" if socket_path else
            "point $OFFLOADD_SOCKET at the daemon's socket path (or pass socket_path=PATH)")
        self.target = "unix:" + self.socket_path
        self.client_name, self.device_id = client_name, device_id
        self.pid = os.getpid() if pid is None else pid
        self._owner_pid = os.getpid()  # the process whose session this is (see _check_process)
        self.connect_timeout_seconds = connect_timeout_seconds
        self.reconnect = reconnect
        self.reconnect_seconds = reconnect_seconds
        self.reconnect_initial_backoff_seconds = reconnect_initial_backoff_seconds
        self.reconnect_max_backoff_seconds = reconnect_max_backoff_seconds
        self.counters = Counters()
        self._lock = threading.Lock()
        self._pending = {}
        self._ids = itertools.count(1)
        self._region_ids = itertools.count(1)
        self._regions = {}       # client region id -> (RegionHandle, relink or None)
        self._daemon_region = {}  # client region id -> the current daemon's region id
        self._confirmed = set()  # block ids answered by OffloadDone and not yet released
        self._lost = set()       # confirmed block ids the restarted daemon did not have
        self._closing = False
        self._dead = None  # the exception pending and later requests fail with
        self._conn = None
        self._reconnecting = None  # the reconnect thread while the daemon is away
        self._ring = None        # the NativeRing while requests go on it (attached, stream up)
        # offloadd._ring_fast.submit when the ring's calls go through that module (_bound_submit)
        self._submit_fast = None
        self._ring_native = None  # the NativeRing offered, kept until close
        self._ring_conn = None   # the connection whose Hello attached it
        self._ring_ops = {}      # ring request id -> _RingOp not yet answered
        self._ring_moved = {}    # ring request id -> its stream request id, once moved there
        self.ring_error = ""
        if not socket_path_fits(self.socket_path):
            raise errors.OffloaddError(
                errors.INVALID_ARGUMENT, "socket path '%s' is empty or longer than 107 bytes: "
                "use a shorter path" % self.socket_path)
        self.daemon_uid = self._probe(min(1.0, connect_timeout_seconds))
        self.shm_mode, self.shm_gid = shm_access(self.socket_path, self.daemon_uid, shm_mode,
                                                 shm_group)
        if ring is None:
            ring = os.environ.get("OFFLOADD_RING", "1") != "0"
        self._ring_wanted = bool(ring)  # offered again in the Hello of every resume
        offer = self._offer_ring()
        self._conn, self.hello = self._open(resume_token, connect_timeout_seconds, offer)
        self._token = self.hello.resume_token
        with self._lock:
            self._take_ring_locked(offer, self._conn, self.hello)

    def _offer_ring(self):
        """A new NativeRing to offer in Hello, or None (``ring_error`` says why)."""
        if not self._ring_wanted:
            self.ring_error = "not offered (ring=False or OFFLOADD_RING=0)"
            return None
        try:
            return _native.NativeRing(RING_ENTRIES)
        except OSError as e:
            self.ring_error = str(e)
            return None

    def _take_ring_locked(self, offer, conn, hello):
        """After ``hello`` answered a Hello on ``conn`` that offered ``offer`` (None: none):
        the ring carries the requests from now on when the daemon attached it; else ``offer``
        is closed and ``ring_error`` says why. A ring of an earlier connection (retired when
        that connection ended) is let go: no request of it is left on it."""
        if offer is None:
            return
        if not hello.ring_attached:
            self.ring_error = hello.ring_error or "the daemon did not attach the ring"
            offer.close()
            return
        self.ring_error = ""
        self._ring = self._ring_native = offer
        self._submit_fast = _bound_submit(offer)
        self._ring_conn = conn
        self._ring_moved.clear()  # ids of the old ring: its answers are no longer taken

    @property
    def ring_active(self):
        """True while offloads, reloads and releases go on the request ring (attached in
        Hello; a ring ends with the connection that attached it, and the Hello of a resume
        offers a new one: requests travel on the stream only between the two)."""
        return self._ring is not None

    def _probe(self, timeout_seconds):
        """One connect() before gRPC's: a socket this user may not open, or that nobody serves,
        is reported at once and in words. Returns the listening process's uid (None when the
        probe timed out: gRPC's connect decides then)."""
        err, uid = _socket_path.probe(self.socket_path, timeout_seconds)
        if err == 0 or err == errno.ETIMEDOUT:
            return uid
        if err in (errno.EACCES, errno.EPERM):
            raise errors.SocketPermissionDenied("cannot connect to the offloadd socket %s: %s"
                                                % (self.socket_path,
                                                   _socket_path.permission_denied_reason(
                                                       self.socket_path)))
        if err == errno.ENOENT:
            raise errors.DaemonUnavailable(
                "no offloadd socket at %s: start the daemon (systemctl start offloadd, or "
                "offloadd --socket_path %s) or %s"
                % (self.socket_path, self.socket_path, self._path_remedy))
        raise errors.DaemonUnavailable(
            "cannot connect to the offloadd socket %s: %s; start the daemon (systemctl start "
            "offloadd) or %s"
            % (self.socket_path, _socket_path.unreachable_reason(self.socket_path, err),
               self._path_remedy))

    # ---- HelloReply fields -------------------------------------------------------------------
    session_id = property(lambda self: self.hello.session_id)
    backend = property(lambda self: self.hello.backend)  # "shm" or "cuda"
    pool_capacity_bytes = property(lambda self: self.hello.pool_capacity_bytes)
    session_quota_bytes = property(lambda self: self.hello.session_quota_bytes)  # 0: none
    chunk_bytes = property(lambda self: self.hello.chunk_bytes)
    link = property(lambda self: self.hello.link)
    # The claim on this session's blocks across a daemon restart (bytes; keep it secret) and,
    # for a resumed session, how many blocks it took over (docs/failure-modes.md).
    resume_token = property(lambda self: self.hello.resume_token)
    blocks_resumed = property(lambda self: self.hello.blocks_resumed)
    resume_grace_seconds = property(lambda self: self.hello.resume_grace_seconds)

    @classmethod
    def resume(cls, socket_path, resume_token, client_name="", device_id="cpu",
               total_seconds=30.0, initial_backoff_seconds=0.05, max_backoff_seconds=1.0,
               connect_timeout_seconds=5.0):
        """A new session holding the blocks of the session `resume_token` named, after the daemon
        restarted on a shared pool (pool_shm_name), for a caller whose Client is gone (another
        process). Retries while the daemon is down (DaemonUnavailable) with exponential backoff,
        for at most `total_seconds`. Regions must be registered again; requests not answered
        before the daemon went away are not re-sent (a live Client does all that by itself).
        Raises OffloaddError NOT_FOUND when nothing waits for the token (no shared pool, grace
        period passed: the blocks are lost), PERMISSION_DENIED for another uid's token, or the last
        DaemonUnavailable when the time is up."""
        start = time.monotonic()
        backoff = max(initial_backoff_seconds, 0.001)
        while True:
            left = total_seconds - (time.monotonic() - start)
            try:
                return cls(socket_path, client_name, device_id,
                           connect_timeout_seconds=max(0.001, min(connect_timeout_seconds, left)),
                           resume_token=resume_token)
            except errors.DaemonUnavailable:
                if time.monotonic() - start + backoff >= total_seconds:
                    raise
            time.sleep(backoff)
            backoff = min(backoff * 2, max(max_backoff_seconds, backoff))

    def channel_options(self):
        """grpcio channel options: keepalive pings (also while the stream is idle, without a
        cap on pings between data frames; the daemon accepts them: server/rpc/server.cc)."""
        return [("grpc.keepalive_time_ms", int(self.keepalive_time_seconds * 1000)),
                ("grpc.keepalive_timeout_ms", int(self.keepalive_timeout_seconds * 1000)),
                # grpcio >= 1.6x times a keepalive ping out by this one (default 60 s)
                ("grpc.http2.ping_timeout_ms", int(self.keepalive_timeout_seconds * 1000)),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.max_pings_without_data", 0)]

    def _check_process(self):
        """Raises OffloaddError FAILED_PRECONDITION in a process forked after this Client was
        created: the session (its stream, its request ring and their request ids) is the
        parent's, and a child that used it would take the parent's answers. Checked before any
        lock (a parent's thread may have held one at the fork)."""
        if os.getpid() != self._owner_pid:
            raise errors.OffloaddError(
                errors.FAILED_PRECONDITION, "this offloadd Client was created in process %d "
                "before a fork; process %d cannot use its session: create a new Client in "
                "the child" % (self._owner_pid, os.getpid()))

    def silent_seconds(self):
        """Seconds since the daemon last sent anything on the session stream (or, while
        reconnecting, refused a connection: it is down, not frozen)."""
        return time.monotonic() - self._last_heard

    def wait(self, future, timeout=None, unresponsive_seconds=None, what="an answer"):
        """``future.result()`` (a Future this client returned), bounded by the daemon's silence.

        Raises :class:`~offloadd.errors.DaemonUnresponsive` once the daemon has sent nothing for
        ``unresponsive_seconds`` (default: the client's) counted from the later of this call
        and its last message; TimeoutError after ``timeout`` seconds (None: no limit); else
        whatever the future raises. ``what`` names the awaited answer in the message."""
        if not future.done():
            self._check_process()
        bound = self.unresponsive_seconds if unresponsive_seconds is None \
            else float(unresponsive_seconds)
        start = time.monotonic()
        deadline = None if timeout is None else start + timeout
        while True:
            now = time.monotonic()
            quiet_left = max(self._last_heard, start) + bound - now
            left = quiet_left if deadline is None else min(quiet_left, deadline - now)
            try:
                if self._ring_native is not None and \
                        not isinstance(future, concurrent.futures.Future):
                    # Completed by an answer on the request ring, taken on this thread.
                    self._await_ring(future, max(left, 0.0))
                    return future.result()
                return future.result(max(left, 0.0))
            except concurrent.futures.TimeoutError:
                if future.done():
                    raise
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                raise TimeoutError("no answer from the offloadd daemon at %s within %.1f s"
                                   % (self.target, timeout))
            if now - max(self._last_heard, start) >= bound:
                raise errors.DaemonUnresponsive(
                    "the offloadd daemon at %s sent nothing for %.1f s (unresponsive_seconds) "
                    "while this process waited for %s: it is unresponsive (stopped, frozen by "
                    "a debugger or cgroup freezer, stuck in a driver call or paging), not "
                    "known to have lost anything" % (self.target, bound, what))

    def abandon(self, failure):
        """Gives up on this session without waiting for the daemon: every pending and later
        request fails with ``failure`` (fresh copies) and the stream is cancelled, so a daemon
        that resumes ends the session and frees its blocks. Never blocks. Idempotent.
        FAILED_PRECONDITION in a process forked after the Client was created."""
        self._check_process()
        with self._lock:
            self._closing = True
            conn = self._conn
        self._fail_all(failure)
        if conn is not None:
            conn.outbox.put(_CLOSE)
            if conn.call is not None:
                conn.call.cancel()

    @property
    def alive(self):
        """True while the stream is up (or being re-established) and close() has not begun.
        Read without the lock (the hooks ask per offload): each field changes once, from alive
        to not, so a read that races a change sees alive only as a call just before it would."""
        return self._dead is None and not self._closing

    # ---- requests ----------------------------------------------------------------------------
    def register_shm(self, shm_name, size_bytes, timeout=None, relink=None):
        """Registers POSIX shm object ``shm_name`` ("/name") of ``size_bytes``; returns the
        client's region id for it.

        Blocks until the daemon answers (it maps the object then; the name may be unlinked
        afterwards, if ``relink`` is given: ``relink()`` returns ``(name, unlink)``, a new name for
        the same object and a callable that removes it, used to register it again after a
        reconnect; see :meth:`offloadd.shm.ShmRegion.relink`). Errors: the daemon's (NOT_FOUND no
        such object, PERMISSION_DENIED, ...); TimeoutError after ``timeout`` seconds and
        DaemonUnresponsive, whose ``answer`` is the request's Future: keep the object's name
        until it resolves (the daemon may still open it); a late registration is unregistered.
        """
        handle = pb.RegionHandle(shm_name=shm_name, size_bytes=size_bytes)
        return self._register(handle, relink, timeout)

    def register_cuda(self, ipc_handle, size_bytes, timeout=None):
        """Registers a CUDA allocation by its 64-byte cudaIpcMemHandle_t (of the allocation
        *base*) and its size in bytes; returns the region id. Blocks until the daemon answers."""
        if len(ipc_handle) != 64:
            raise errors.OffloaddError(
                errors.INVALID_ARGUMENT, "a cudaIpcMemHandle_t has 64 bytes, not %d"
                % len(ipc_handle))
        handle = pb.RegionHandle(cuda_ipc_handle=bytes(ipc_handle), size_bytes=size_bytes)
        return self._register(handle, None, timeout)

    def _register(self, handle, relink, timeout):
        region = next(self._region_ids)
        future = self._submit(pb.Request(register_region=pb.RegisterRegion(handle=handle)),
                              region=(region, handle, relink))
        try:
            return self.wait(future, timeout, what="a region registration").region_id
        except (TimeoutError, errors.DaemonUnresponsive) as e:
            # The request may still be answered: the caller keeps the object's name until then
            # (``e.answer``, StagingArena), and a late registration is undone.
            e.answer = future
            future.add_done_callback(self._unregister_late)
            raise

    def _unregister_late(self, future):
        """A registration answered after its caller stopped waiting: nobody uses the region."""
        if future.cancelled() or future.exception() is not None:
            return
        try:
            self.unregister(future.result().region_id)
        except Exception:  # noqa: BLE001 -- a closed client: the session's end frees it
            pass

    def unregister(self, region_id):
        """Future of RegionUnregistered."""
        return self._submit(pb.Request(unregister_region=pb.UnregisterRegion(region_id=region_id)))

    def offload(self, region_id, offset, nbytes, ready_event=b"", ordering=None, target=None):
        """Copies ``nbytes`` at ``offset`` of the region into a new pool block.

        Returns a Future of an :class:`OffloadAnswer` (OffloadDone's block_id, bytes,
        queued_seconds, copy_seconds; on the request ring a future-like op completed by
        :meth:`pump` or a wait for it). The
        bytes must stay unchanged until it resolves. ``ready_event``: CUDA IPC event handle
        recorded after the kernels that produced the bytes: the daemon issues no chunk before
        it completed (cuda backend; ignored by shm). ``ordering``: optional
        ``(step, position)`` of the block in the reload order, for the daemon's spill tier
        (within a step backward reloads in reverse of position). ``target``: (weak reference
        to the torch hooks' handle that sends it, its transport's list of free IPC events):
        on the request ring its OffloadDone is then applied to the handle in C when nothing
        else waits on it (offloadd._store_front.take_answers, which documents the rule).
        """
        if self._ring is not None:
            args = (region_id, offset, nbytes, ready_event or None, ordering)
            op = self._submit_on_ring(_OFFLOAD, args, None, target)
            if op is not None:
                return op
        req = pb.OffloadRequest(region_id=region_id, offset=offset, bytes=nbytes,
                                ready_event=ready_event)
        if ordering is not None:
            req.ordering.step, req.ordering.position = ordering
        return self._submit(pb.Request(offload=req))

    def reload_outcome(self):
        """A future-like outcome for a reload not sent yet (pass it to :meth:`reload` as
        ``into``): it can be waited on, failed (``set_exception``) or given callbacks before
        the request goes out, and the answer completes it directly."""
        return _RingOp(self, "reload", None)

    def reload(self, block_id, region_id, offset, priority=URGENT, release_after=False,
               deadline_seconds=0.0, ready_event=b"", done_event=b"", into=None):
        """Copies block ``block_id`` back to ``offset`` of the region; Future of a
        :class:`ReloadAnswer` (ReloadDone's fields; ``into`` when given: an outcome from
        :meth:`reload_outcome`, not completed yet).

        May be sent before the block's offload completed (the daemon orders it after).
        priority: URGENT or PREFETCH. release_after: free the block once copied.
        deadline_seconds: seconds from now by which the data is needed (0 = none).
        CUDA backend (the event protocol, proto/offload.proto ReloadRequest): ``ready_event``
        (64 IPC handle bytes) recorded after the destination's allocation on its stream: no byte
        is written before it completed; ``done_event``: recorded by the daemon right after its
        last chunk. When the answer's ``done_event_recorded`` is true the copy may still be
        running: make the consuming stream wait on ``done_event`` before reading (only after
        this future resolved: before that the event's last record is an older one).
        """
        if self._ring is not None:
            op = self._submit_on_ring(_RELOAD, (block_id, region_id, offset, priority,
                                                release_after, deadline_seconds,
                                                ready_event or None, done_event or None), into)
            if op is not None:
                return op
        future = self._submit(pb.Request(reload=pb.ReloadRequest(
            block_id=block_id, region_id=region_id, offset=offset, priority=priority,
            release_after=release_after, deadline_seconds=deadline_seconds,
            ready_event=ready_event, done_event=done_event)))
        if into is None:
            return future
        future.add_done_callback(lambda f: _complete_from(into, f))
        return into

    def release(self, block_id):
        """Frees a pool block; Future of a :class:`ReleaseAnswer` (Released's block_id)."""
        if self._ring is not None:
            op = self._submit_on_ring(_RELEASE, (block_id,))
            if op is not None:
                return op
        return self._submit(pb.Request(release=pb.ReleaseRequest(block_id=block_id)))

    def report(self, fallbacks_total=0, host_waits_total=0, host_wait_seconds_total=0.0,
               idle_steps_total=0):
        """Tells the daemon what this process did without it on this session's device, so that
        operators see it (the ``offloadd_client_*_total`` metrics by gpu, ``offloadctl
        sessions``): cumulative counts since this session began -- saved tensors kept in
        process (fallbacks), times and seconds the training thread blocked on the daemon (host
        waits), steps that sent nothing (idle steps). Sending the same totals again is harmless.
        Future of ``ClientReportAck``; OffloaddError INVALID_ARGUMENT when a count is lower than
        this session's previous report, the seconds are negative, not finite, above 1e12 or
        above the session's age + 1 s (waits of several threads at once can sum to more:
        send at most the age, the rest later), or a count is above 1e6 per second of that age,
        CANCELLED or the session's failure once the client is closed or dead, and
        INVALID_ARGUMENT "unknown request kind" from a daemon older than the report."""
        return self._submit(pb.Request(client_report=pb.ClientReport(
            fallbacks_total=fallbacks_total, host_waits_total=host_waits_total,
            host_wait_seconds_total=host_wait_seconds_total,
            idle_steps_total=idle_steps_total)))

    def get_stats(self, timeout=10.0):
        """Unary GetStats on the current connection: the daemon's ``Stats`` message.

        Raises DaemonUnavailable / OffloaddError with the RPC's code and the socket path;
        FAILED_PRECONDITION in a process forked after the Client was created."""
        self._check_process()
        try:
            return self._conn.stub.GetStats(pb.GetStatsRequest(), timeout=timeout)
        except grpc.RpcError as e:
            raise _rpc_error(e, self.target, "GetStats") from None

    def drain(self, timeout=10.0):
        """Waits until every request submitted so far has its response (or failed).
        Returns True when all completed within ``timeout`` seconds. FAILED_PRECONDITION in a
        process forked after the Client was created."""
        self._check_process()
        deadline = time.monotonic() + timeout
        while self._ring_ops and time.monotonic() < deadline:
            self.pump(min(0.05, max(deadline - time.monotonic(), 0.0)))
        with self._lock:
            futures = [p.future for p in self._pending.values()]
        streamed = [f for f in futures if isinstance(f, concurrent.futures.Future)]
        done, not_done = concurrent.futures.wait(
            streamed, timeout=max(deadline - time.monotonic(), 0.0))
        while not all(f.done() for f in futures) and time.monotonic() < deadline:
            time.sleep(0.005)  # ring requests re-sent on the stream after a resume
        return not not_done and all(f.done() for f in futures) and not self._ring_ops

    # ---- lifecycle ---------------------------------------------------------------------------
    def close(self, timeout=5.0):
        """Half-closes the stream after the queued requests, waits up to ``timeout`` seconds for
        the daemon to end it (then cancels), and joins the reader. Pending requests fail with
        CANCELLED (requests on the request ring are given their answers first, for at most
        ``timeout`` seconds). The daemon releases the session's blocks and regions. Idempotent.
        In a process forked after the Client was created it does nothing: the session is the
        parent's, which still uses it."""
        if os.getpid() != self._owner_pid:
            return
        deadline = time.monotonic() + timeout
        while self._ring_ops and self._dead is None and time.monotonic() < deadline:
            self.pump(min(0.05, max(deadline - time.monotonic(), 0.0)))
        with self._lock:
            self._closing = True
            conn = self._conn
        if conn is not None:
            conn.close(max(deadline - time.monotonic(), 0.5))
        reconnecting = self._reconnecting
        if reconnecting is not None and reconnecting is not threading.current_thread():
            reconnecting.join(timeout)
        self._fail_all(errors.OffloaddError(errors.CANCELLED, "the client closed its session "
                                            "with %s" % self.target))
        with self._lock:
            self._ring = self._ring_conn = None
        # The NativeRing itself is freed when the last reference (a thread inside a call on it)
        # lets go of it.
        self._ring_native = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- connecting --------------------------------------------------------------------------
    def _open(self, token, timeout, ring=None):
        """A new connection that said Hello (with ``token`` when not empty, offering ``ring``
        when not None): (conn, HelloReply). Raises as the constructor; the connection is closed
        on failure."""
        conn = _Conn(self, timeout)
        hello = pb.Hello(client_name=self.client_name, device_id=self.device_id, pid=self.pid,
                         resume_token=token)
        if ring is not None:
            hello.ring.fd = ring.fd
        try:  # whatever is raised from here on (an interrupt too) closes the connection
            hello = self._submit(pb.Request(hello=hello), conn=conn)
            conn.start()
            return conn, hello.result(timeout=timeout)
        except concurrent.futures.TimeoutError:
            conn.close(0.5)
            raise errors.OffloaddError(errors.DEADLINE_EXCEEDED, "connected to %s but no "
                                       "HelloReply within %.1f s: is the daemon overloaded?"
                                       % (self.target, timeout)) from None
        except BaseException:
            conn.close(0.5)
            raise

    def _reconnect(self, failure):
        """The reconnect thread: resume the session on a restarted daemon, then re-send."""
        window = self.reconnect_seconds
        if window is None:
            window = self.hello.resume_grace_seconds
        deadline = time.monotonic() + window
        backoff = max(self.reconnect_initial_backoff_seconds, 0.001)
        token = self._token
        while True:
            with self._lock:
                if self._closing:
                    return
            left = deadline - time.monotonic()
            if left <= 0:
                return self._give_up(errors.DaemonUnavailable(
                    "the offloadd daemon at %s went away and did not come back within %.1f s "
                    "(reconnect_seconds / the daemon's resume_grace_seconds): %s"
                    % (self.target, window, failure)))
            if _refuses(self.socket_path):
                # Down or restarting, not frozen: not silence. No connect is tried (one waits
                # out its whole timeout on a refusing socket, and a wait bounded by the
                # daemon's silence would take that for a freeze).
                self._last_heard = time.monotonic()
                time.sleep(min(backoff, max(deadline - time.monotonic(), 0)))
                backoff = min(backoff * 2, max(self.reconnect_max_backoff_seconds, backoff))
                continue
            offer = self._offer_ring()
            try:
                conn, hello = self._open(token, min(self.connect_timeout_seconds, left), offer)
                if self._resume_on(conn, hello, offer):
                    return
                continue  # the new connection broke while re-registering: try again
            except errors.DaemonUnavailable as e:
                _close_offer(offer)
                failure = e
                if _refuses(self.socket_path):  # down or restarting, not frozen: not silence
                    self._last_heard = time.monotonic()
            except errors.OffloaddError as e:
                _close_offer(offer)
                if e.code == errors.DEADLINE_EXCEEDED:
                    failure = e
                elif e.code == errors.NOT_FOUND and token:
                    with self._lock:
                        holds = bool(self._confirmed)
                    if holds:  # the daemon has nothing for us: our blocks are lost
                        return self._give_up(errors.OffloaddError(
                            errors.DATA_LOSS, "the offloadd daemon at %s no longer holds this "
                            "session's blocks (%s): it restarted without them, or it ended the "
                            "session when the connection broke (a daemon frozen past "
                            "keepalive_timeout_seconds); they are lost: open a new Client" %
                            (self.target, e.message)))
                    token = b""  # nothing confirmed, nothing lost: a new session will do
                    continue
                else:
                    return self._give_up(e)
            time.sleep(min(backoff, max(deadline - time.monotonic(), 0)))
            backoff = min(backoff * 2, max(self.reconnect_max_backoff_seconds, backoff))

    def _resume_on(self, conn, hello, offer=None):
        """Registers the regions again on ``conn``, settles the blocks, re-sends what waits
        (on the stream), and moves later requests to ``offer`` (the NativeRing its Hello
        offered, or None) when the daemon attached it. False when ``conn`` broke meanwhile."""
        with self._lock:
            regions = dict(self._regions)
        mapping = {}
        try:
            for region, (handle, relink) in regions.items():
                mapping[region] = self._register_again(conn, handle, relink)
        except errors.DaemonUnavailable:
            conn.close(0.5)
            _close_offer(offer)
            return False
        except (errors.OffloaddError, OSError) as e:
            conn.close(0.5)
            _close_offer(offer)
            self._give_up(errors.OffloaddError(
                getattr(e, "code", errors.UNKNOWN), "offloadd at %s restarted and a region of "
                "this client could not be registered again: %s" % (self.target, e)))
            return True
        resumed = set(hello.resumed_block_ids)
        with self._lock:
            if self._closing:
                conn.close(0.5)
                _close_offer(offer)
                return True
            orphans = resumed - self._confirmed
            self._lost |= self._confirmed - resumed
            self._confirmed &= resumed
            self._daemon_region = mapping
            old, self._conn, self.hello = self._conn, conn, hello
            self._take_ring_locked(offer, conn, hello)
            self._token = hello.resume_token
            self._reconnecting = None
            self.counters.resumes += 1
            waiting = sorted((rid, p) for rid, p in self._pending.items()
                             if not p.internal and p.conn is not conn)
            settled, resend = [], []
            for rid, p in waiting:
                verdict = self._settle_locked(p, resumed)
                if verdict is None:
                    p.conn = conn
                    resend.append(self._wire_locked(p.request))
                else:
                    del self._pending[rid]
                    settled.append((p, verdict))
            self.counters.resent += len(resend)
            self.counters.orphans_released += len(orphans)
            # Orphan releases go first: a caller woken by a resent request's answer and then
            # draining must find them pending.
            for block_id in sorted(orphans):
                self._queue_locked(pb.Request(release=pb.ReleaseRequest(block_id=block_id)),
                                   concurrent.futures.Future(), internal=True)
            for request in resend:
                conn.send(request)
        old.channel.close()
        for p, verdict in settled:
            if isinstance(verdict, Exception):
                p.future.set_exception(verdict)
            else:
                p.future.set_result(verdict)
        return True

    def _register_again(self, conn, handle, relink):
        """Registers ``handle`` on ``conn`` (through a fresh name from ``relink``); the daemon's
        region id."""
        unlink = None
        if relink is not None:
            name, unlink = relink()
            handle = pb.RegionHandle(shm_name=name, size_bytes=handle.size_bytes)
        try:
            future = self._submit(pb.Request(register_region=pb.RegisterRegion(handle=handle)),
                                  conn=conn)
            return future.result(self.connect_timeout_seconds).region_id
        except concurrent.futures.TimeoutError:
            raise errors.DaemonUnavailable("no answer to a region registration from %s within "
                                           "%.1f s" % (self.target, self.connect_timeout_seconds))
        finally:
            if unlink is not None:
                unlink()

    def _settle_locked(self, p, resumed):
        """What a request unanswered across a restart becomes: None (send it again) or its
        answer (a result or an exception)."""
        kind = p.request.WhichOneof("body")
        if kind == "release":
            block = p.request.release.block_id
            if block not in resumed:
                self._lost.discard(block)
                return ReleaseAnswer(block)  # released before the crash, or lost anyway
        elif kind == "reload":
            r = p.request.reload
            # First: a confirmed block missing after the restart is in _lost by now, but this
            # reload was releasing it, and the dead daemon may have done so (copy and release)
            # just before the crash. Either way the block is no longer the client's.
            if r.release_after and r.block_id not in resumed:
                self._lost.discard(r.block_id)
                return errors.OffloaddError(
                    errors.DATA_LOSS, "offloadd at %s restarted while this reload with "
                    "release_after of block %d was in flight, and the block is gone: the copy may "
                    "have completed before the crash, but nothing can confirm it"
                    % (self.target, r.block_id))
            if r.block_id in self._lost:
                return self._lost_error(r.block_id)
        return None

    def _lost_error(self, block_id):
        return errors.OffloaddError(
            errors.DATA_LOSS, "block %d was confirmed stored, but the restarted offloadd daemon at "
            "%s did not have it (its record failed the check at adoption): it is lost"
            % (block_id, self.target))

    def _give_up(self, failure):
        with self._lock:
            self._reconnecting = None
        self._fail_all(failure)

    # ---- internals ---------------------------------------------------------------------------
    def _wire_locked(self, request):
        """``request`` as the current daemon must see it: client region ids mapped to its own."""
        kind = request.WhichOneof("body")
        body = getattr(request, kind)
        if kind in ("offload", "reload", "unregister_region") and body.region_id:
            daemon_id = self._daemon_region.get(body.region_id)
            if daemon_id is not None and daemon_id != body.region_id:
                wire = pb.Request()
                wire.CopyFrom(request)
                getattr(wire, kind).region_id = daemon_id
                return wire
        return request

    def _submit(self, request, conn=None, internal=False, region=None):
        """Queues ``request``; its Future. ``conn``: a connection being set up (Hello and
        re-registration, internal); ``region``: (client id, handle, relink) of a registration.
        Raises FAILED_PRECONDITION in a process forked after the Client was created."""
        self._check_process()
        future = concurrent.futures.Future()
        kind = request.WhichOneof("body")
        internal = internal or conn is not None
        with self._lock:
            if self._dead is not None:
                future.set_exception(self._dead.fresh())
                return future
            if self._closing:
                future.set_exception(errors.OffloaddError(
                    errors.FAILED_PRECONDITION, "request issued after close() began"))
                return future
            if kind == "reload" and request.reload.block_id in self._lost:
                future.set_exception(self._lost_error(request.reload.block_id))
                return future
            self._queue_locked(request, future, internal, conn, region)
        return future

    def _queue_locked(self, request, future, internal, conn=None, region=None):
        """Numbers ``request``, records it as pending and sends it on ``conn`` (else on the
        current connection, unless a reconnect is under way: the resume sends it)."""
        request.request_id = next(self._ids)
        p = _Pending(future, _EXPECTED[request.WhichOneof("body")], request, internal, region)
        self._pending[request.request_id] = p
        target = conn if conn is not None else (
            self._conn if self._reconnecting is None else None)
        if target is not None:
            p.conn = target
            target.send(request if conn is not None else self._wire_locked(request))

    def _read_loop(self, conn):
        failure = None
        try:
            for message in conn.call:
                self._last_heard = time.monotonic()
                with self._lock:
                    self.counters.messages_received += 1
                    self.counters.responses_received += len(message.responses)
                for response in message.responses:
                    self._complete(response)
            failure = errors.DaemonUnavailable(
                "the offloadd daemon at %s ended the session stream (it stopped or restarted)"
                % self.target)
        except grpc.RpcError as e:
            failure = _rpc_error(e, self.target, "Session")
        except Exception as e:  # never let the reader die silently
            failure = errors.OffloaddError(errors.INTERNAL, "reader failed: %r" % (e,))
        conn.outbox.put(_CLOSE)  # lets the writer generator end
        self._conn_ended(conn, failure)

    def _conn_ended(self, conn, failure):
        """A connection's stream ended: fail what only it could answer; reconnect or give up."""
        if conn is self._ring_conn:
            self._retire_ring()
        with self._lock:
            if self._closing:
                failure = errors.OffloaddError(errors.CANCELLED, "the client closed its "
                                               "session with %s" % self.target)
            mine = [rid for rid, p in self._pending.items() if p.internal and p.conn is conn]
            internal = [self._pending.pop(rid) for rid in mine]
            current = conn is self._conn and self._dead is None
            resume = (current and not self._closing and self._resumable_locked() and
                      isinstance(failure, errors.DaemonUnavailable) and
                      self._reconnecting is None)
            if resume:
                self._reconnecting = threading.Thread(
                    target=self._reconnect, args=(failure,), name="offloadd-reconnect",
                    daemon=True)
                self._reconnecting.start()
        for p in internal:
            if not p.future.done():
                p.future.set_exception(_fresh(failure))
        if current and not resume:
            self._fail_all(failure)

    def _complete(self, response):
        with self._lock:
            p = self._pending.get(response.request_id)
            if p is None:
                self.counters.unknown_responses += 1
                return
            kind = response.WhichOneof("body")
            if kind == "error" and response.error.code == errors.UNAVAILABLE and \
                    not p.internal and self._resumable_locked():
                return  # the daemon is shutting down (an upgrade): sent again after the resume
            del self._pending[response.request_id]
            result = getattr(response, kind) if kind == p.expected else None
            if result is not None and not p.internal:
                result = self._account_locked(p, kind, result)
        if kind == "error":
            p.future.set_exception(errors.OffloaddError(response.error.code,
                                                        response.error.message))
        elif result is None:
            p.future.set_exception(errors.OffloaddError(
                errors.INTERNAL, "protocol mismatch: expected %s, the daemon answered %s"
                % (p.expected, kind)))
        else:
            p.future.set_result(result)

    # ---- the request ring ---------------------------------------------------------------------
    def _submit_on_ring(self, kind, args, op=None, target=None):
        """The request on the ring: in one C call when it can be taken at once
        (offloadd._ring_fast.submit), else through _ring_submit. ``kind``: _OFFLOAD, _RELOAD or
        _RELEASE. Returns as _ring_submit does."""
        fast = self._submit_fast
        if fast is not None:
            submitted = fast(self, kind, args, None if op is None else op, target)
            if submitted is not None:
                return submitted
        return self._ring_submit(_KIND_NAMES[kind], args, op, target)

    def _ring_submit(self, kind, args, op=None, target=None):
        """Submits ``kind`` ("offload", "reload", "release") with ``args`` (see _RingOp) on the
        ring: its _RingOp (``op`` when given, not submitted yet; failed at once as _submit
        fails a request), or None when the ring is no longer in use (the caller sends it on the
        stream). A full ring (the daemon stopped taking submissions until answers are taken)
        is drained here while it waits. Raises FAILED_PRECONDITION in a process forked after
        the Client was created."""
        if _process.pid != self._owner_pid:
            self._check_process()
        if op is None:
            op = _RingOp(self, kind, args, target)
        else:
            op.args = args
        start = None  # when the first try found no slot
        while True:
            with self._lock:
                ring = self._ring
                if ring is None:
                    return None
                if self._dead is not None or self._closing or self._lost:
                    failure = self._refusal_locked(kind, args)
                    if failure is not None:
                        op.set_exception(failure)
                        return op
                rid = self._ring_send_locked(ring, kind, args)
                if rid:
                    op.request_id = rid
                    self._ring_ops[rid] = op
                    self.counters.ring_requests_sent += 1
                    return op
            if ring.closed:
                return None  # the session ended: the stream's end retires the ring
            if start is None:
                start = time.monotonic()
            if time.monotonic() - max(self._last_heard, start) >= self.unresponsive_seconds:
                op.set_exception(errors.DaemonUnresponsive(
                    "the offloadd daemon at %s took no request from its ring for %.1f s "
                    "(unresponsive_seconds): it is unresponsive" % (self.target,
                                                                    self.unresponsive_seconds)))
                return op
            self.pump(0.005)  # answers taken let the daemon take submissions again

    def _refusal_locked(self, kind, args):
        """The error a request fails with at once (dead, closing, a lost block), or None."""
        if self._dead is not None:
            return self._dead.fresh()
        if self._closing:
            return errors.OffloaddError(errors.FAILED_PRECONDITION,
                                        "request issued after close() began")
        if kind == "reload" and args[0] in self._lost:
            return self._lost_error(args[0])
        return None

    def _ring_send_locked(self, ring, kind, args):
        """One submission (never waits for a slot): its ring request id, 0 when not taken."""
        try:
            if kind == "offload":
                region, offset, nbytes, ready_event, ordering = args
                return ring.offload(self._daemon_region.get(region, region), offset, nbytes,
                                    ready_event=ready_event, ordering=ordering, timeout=0.0)
            if kind == "reload":
                block, region, offset, priority, release_after, deadline, ready, done = args
                return ring.reload(block, self._daemon_region.get(region, region), offset,
                                   priority=priority, release_after=release_after,
                                   deadline_seconds=deadline, ready_event=ready,
                                   done_event=done, timeout=0.0)
            return ring.release(args[0], timeout=0.0)
        except ConnectionError:
            return 0

    def pump(self, timeout=0.0):
        """Takes the answers the request ring holds and completes their requests on this thread
        (their done-callbacks run here, outside the client's lock); sleeps (GIL released) up to
        ``timeout`` seconds for the first. Returns how many it took. Costs one attribute test
        when nothing is in flight on the ring. The torch hooks call it at every pack and
        unpack; waits for a ring request call it."""
        ring = self._ring_native
        if ring is None or not self._ring_ops:
            return 0
        if _process.pid != self._owner_pid:
            self._check_process()  # a forked child never takes its parent's answers
        taken = 0
        while True:
            answers = ring.drain(timeout)
            if not answers:
                return taken
            drained = len(answers)
            taken += drained
            self._last_heard = time.monotonic()
            # The answers are off the ring: an interrupt while waiting for the lock (another
            # thread may hold it long) must not drop them, or their requests never complete.
            interrupted = acquire_surely(self._lock)
            try:
                self.counters.ring_answers_received += drained
                # Every ring numbers its requests from 1: an answer of a ring replaced while
                # this thread slept in its drain (a resume) never names the new ring's ops.
                ops = self._ring_ops if ring is self._ring_native else {}
                if _take_answers is not None and ops:  # the usual answers, applied in C
                    answers = _take_answers(answers, ops, self._confirmed)
                try:
                    outcomes = self._ring_outcomes_locked(answers, ops)
                except BaseException as e:  # noqa: B036 -- an interrupt at its start: again
                    interrupted = interrupted or e.with_traceback(None)
                    outcomes = self._ring_outcomes_locked(answers, ops)  # applied: no op
            finally:
                self._lock.release()
            interrupted = _finish_all(outcomes, interrupted)
            if interrupted is not None:
                try:
                    raise interrupted
                finally:
                    interrupted = None
            if drained < _native.DRAIN_BATCH:  # the ring is empty: a full batch may not be
                return taken
            timeout = 0.0

    def _ring_outcomes_locked(self, answers, ops):
        """[(op, (result, exception))] of ring ``answers`` (drain tuples) not taken in C, their
        ops out of ``ops`` (or back from the stream), for the caller to finish after letting
        the lock go; the answers of no op counted as unknown."""
        outcomes = []
        for answer in answers:
            op = ops.pop(answer[0], None)
            if op is None:
                op = self._moved_op_locked(answer[0])
            if op is None:
                self.counters.unknown_responses += 1
                continue
            outcome = self._ring_outcome_locked(op, answer)
            if outcome is not None:
                outcomes.append((op, outcome))
        return outcomes

    def _moved_op_locked(self, ring_id):
        """The op of a ring answer taken by a thread while the ring was being retired (the op
        had moved to the stream): taken back from the stream's pending requests."""
        stream_id = self._ring_moved.pop(ring_id, None)
        p = self._pending.pop(stream_id, None) if stream_id is not None else None
        return p.future if p is not None else None

    def _ring_outcome_locked(self, op, answer):
        """(result, exception) of ``op`` from its ring answer, the client's view of its blocks
        kept as for the stream (_account_locked); None when the request waits for a resume
        (the daemon is shutting down for an upgrade: re-sent on the stream after it)."""
        _, kind, code, block, nbytes, queued, copy, flags, message = answer
        if kind == _native.ERROR:
            if code == errors.UNAVAILABLE and self._resumable_locked():
                self._ring_to_stream_locked(op)
                return None
            return None, errors.OffloaddError(code, message)
        expected = _RING_REQUEST[op.kind]
        if _RING_KIND.get(kind) != expected:
            return None, errors.OffloaddError(
                errors.INTERNAL, "protocol mismatch: expected %s, the daemon's ring answered "
                "kind %d" % (expected, kind))
        if kind == _native.OFFLOAD_DONE:
            self._confirmed.add(block)
            return OffloadAnswer(block, nbytes, queued, copy), None
        if kind == _native.RELOAD_DONE:
            released = bool(flags & _native.FLAG_RELEASED)
            if released:
                self._confirmed.discard(block)
            return ReloadAnswer(block, nbytes, released, copy,
                                bool(flags & _native.FLAG_DONE_EVENT_RECORDED)), None
        self._confirmed.discard(op.args[0])
        return ReleaseAnswer(op.args[0]), None

    def _ring_to_stream_locked(self, op):
        """Makes ``op`` a stream request waiting to be sent (after a resume, like every request
        the broken stream left unanswered); its answer completes ``op``."""
        request = op.request()
        request.request_id = next(self._ids)
        if op.request_id:
            self._ring_moved[op.request_id] = request.request_id
        self._pending[request.request_id] = _Pending(op, _RING_REQUEST[op.kind], request)

    def _retire_ring(self):
        """The connection that attached the ring ended: later requests go on the stream; the
        answers the ring holds are taken, and the requests still unanswered wait on the stream
        for a resume (or fail with the session)."""
        with self._lock:
            self._ring = self._ring_conn = None
        self.pump(0.0)
        with self._lock:
            ops, self._ring_ops = self._ring_ops, {}
            for op in ops.values():
                self._ring_to_stream_locked(op)
        ring = self._ring_native
        if ring is not None:
            ring.wake()

    def _await_ring(self, future, timeout):
        """Takes ring answers on this thread until ``future`` (a _RingOp, or anything a ring
        answer completes) is done; TimeoutError after ``timeout`` seconds (None: no limit).
        Sleeps in slices of at most 50 ms (GIL released), so a stream that ends (it fails or
        moves the ring's requests, and wakes the ring) is noticed at once."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while not future.done():
            left = 0.05 if deadline is None else min(0.05, deadline - time.monotonic())
            if left <= 0:
                raise concurrent.futures.TimeoutError("no answer within %s s" % timeout)
            if self._ring_ops:
                self.pump(left)
            else:
                time.sleep(min(left, 0.005))  # re-sent on the stream: the reader completes it

    def _resumable_locked(self):
        hello = getattr(self, "hello", None)
        return self.reconnect and hello is not None and hello.resume_grace_seconds > 0

    def _account_locked(self, p, kind, result):
        """Keeps the client's view of its blocks and regions; the result the caller sees."""
        if kind == "offload_done":
            self._confirmed.add(result.block_id)
            return OffloadAnswer(result.block_id, result.bytes, result.queued_seconds,
                                 result.copy_seconds)
        if kind == "reload_done":
            if result.released:
                self._confirmed.discard(result.block_id)
            return ReloadAnswer(result.block_id, result.bytes, result.released,
                                result.copy_seconds, result.done_event_recorded)
        if kind == "released":
            self._confirmed.discard(p.request.release.block_id)
            return ReleaseAnswer(result.block_id)
        if kind == "region_registered" and p.region is not None:
            region, handle, relink = p.region
            self._regions[region] = (handle, relink)
            self._daemon_region[region] = result.region_id
            return pb.RegionRegistered(region_id=region)
        elif kind == "region_unregistered":
            region = p.request.unregister_region.region_id
            self._regions.pop(region, None)
            self._daemon_region.pop(region, None)
            return pb.RegionUnregistered(region_id=region)
        return result

    def _fail_all(self, failure):
        """Fails every pending request and every later one with ``failure``: each future gets
        its own copy (OffloaddError.fresh), and the one kept carries no traceback."""
        failure = _fresh(failure)
        with self._lock:
            if self._dead is None:
                self._dead = failure
            pending, self._pending = self._pending, {}
            ring_ops, self._ring_ops = self._ring_ops, {}
        for p in pending.values():
            if not p.future.done():
                p.future.set_exception(_fresh(failure))
        for op in ring_ops.values():
            op.set_exception(_fresh(failure))
        ring = self._ring_native
        if ring is not None:
            ring.wake()  # threads asleep on the ring see their requests failed


_OFFLOAD, _RELOAD, _RELEASE = 0, 1, 2  # offloadd._ring_fast.submit's kinds
_KIND_NAMES = ("offload", "reload", "release")


def _finish_all(outcomes, interrupted):
    """op._finish(value, exc) for each (op, (value, exc)) of ``outcomes``, every one: an op
    whose _finish raised (an interrupt) is finished once more, which an op already done ignores.
    Returns ``interrupted``, else the first exception caught, for the caller to raise."""
    for op, (value, exc) in outcomes:
        try:
            op._finish(value, exc)
        except BaseException as e:  # noqa: B036 -- raised by the caller once all are done
            interrupted = interrupted or e.with_traceback(None)
            op._finish(value, exc)
    return interrupted


def acquire_surely(lock):
    """Acquires ``lock`` even when waiting for it is interrupted (a signal handler raising, such
    as KeyboardInterrupt): the first such exception is returned for the caller to raise once
    its work under the lock is done, None when none came. After 100 interrupted waits the
    last interrupt propagates with the lock not held. The torch hooks' store lets a reload's
    claim go with it too."""
    first = None
    for tries in range(1, 101):
        try:
            lock.acquire()
            return first
        except BaseException as e:  # noqa: B036 -- kept and raised by the caller
            if tries == 100:
                raise
            first = first if first is not None else e.with_traceback(None)


def _bound_submit(ring):
    """offloadd._ring_fast.submit for a client whose NativeRing ``ring`` calls the core through
    that module (bound to this module's _RingOp), else None (ctypes: every request through
    _ring_submit)."""
    fast = getattr(ring, "_fast", None)
    if fast is None or not hasattr(fast, "submit"):
        return None
    fast.bind_client(_RingOp)
    return fast.submit


def _answers_taker():
    """(offloadd._store_front.take_answers bound to this module's answer records, its pump),
    or (None, None) when the extension module is not there (the protocol client works without
    it; the torch hooks require it)."""
    try:
        front = _native.load_store_front()
    except ImportError:
        return None, None
    if not hasattr(front, "bind_answers"):  # a module built before it had them
        return None, None
    front.bind_answers((_native.OFFLOAD_DONE, _native.RELOAD_DONE, _native.RELEASED),
                       (_native.FLAG_RELEASED, _native.FLAG_DONE_EVENT_RECORDED),
                       (OffloadAnswer, ReloadAnswer, ReleaseAnswer), _outcome.Outcome._lock,
                       _RingOp)
    return front.take_answers, getattr(front, "pump", None)


# Client.pump hands each batch of ring answers to _take_answers first (None: every answer in
# Python); _pump_in_c(client, DRAIN_BATCH, _take_answers) is Client.pump(0.0) with its usual
# case in one C call (the torch hooks' pump at every pack and unpack).
_take_answers, _pump_in_c = _answers_taker()


def _fresh(e):
    """A copy of ``e`` without traceback (OffloaddError.fresh), or ``e`` itself, its traceback
    cleared, for any other exception."""
    if isinstance(e, errors.OffloaddError):
        return e.fresh()
    return e.with_traceback(None)


def _complete_from(outcome, future):
    """Completes ``outcome`` with the result or exception of the finished ``future``."""
    exc = future.exception()
    outcome._finish(None if exc is not None else future.result(), exc)

def _close_offer(ring):
    """Closes a NativeRing offered in a Hello that did not take (None: nothing offered)."""
    if ring is not None:
        ring.close()


def _refuses(path):
    """True when nothing listens at the Unix socket ``path`` (no file, or connection refused):
    the daemon is down. A frozen daemon's socket still accepts (into its backlog)."""
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.settimeout(0.5)
        s.connect(path)
        return False
    except (FileNotFoundError, ConnectionRefusedError):
        return True
    except OSError:
        return False
    finally:
        s.close()


def _rpc_error(e, target, rpc):
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    if code in (None, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        if "ping timeout" in str(details) or "keepalive" in str(details):
            return errors.DaemonUnavailable(
                "the offloadd daemon at %s did not answer a keepalive ping in time (%s: %s): it "
                "is frozen or stopped, and the connection was dropped; the daemon frees this "
                "session's blocks if it resumes" % (target, rpc, details))
        return errors.DaemonUnavailable("the offloadd daemon at %s went away (%s: %s)"
                                        % (target, rpc, details))
    return errors.OffloaddError(code.value[0], "%s at %s: %s" % (rpc, target, details))
