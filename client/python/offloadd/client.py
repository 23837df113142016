"""The offloadd protocol over grpcio: one Session stream per Client, many requests in flight.

Protocol: proto/offload.proto (package offloadd.v1); semantics follow the C++ client
(client/offloadd_client.h). The daemon listens on a Unix socket, gRPC target ``unix:<path>``.

Threads: every method is thread-safe. A Client has
  * a writer: grpcio consumes a generator that drains every request queued since its last write
    into ONE ``ClientMessage`` (batching, at most ``MAX_REQUESTS_PER_MESSAGE``), and
  * a reader thread that resolves each request's ``concurrent.futures.Future`` by request id as
    ``ServerMessage``s arrive (the daemon may answer in any order). Done-callbacks run on it: keep
    them short and never block on another future there.

Units: sizes and offsets are int bytes; durations float seconds.

Errors (raised by ``Future.result()`` or directly):
  * :class:`~offloadd.errors.OffloaddError` with the daemon's code and message for ``Error``
    responses (INVALID_ARGUMENT, NOT_FOUND, RESOURCE_EXHAUSTED pool or quota full past the
    admission deadline, OUT_OF_RANGE, ...);
  * :class:`~offloadd.errors.DaemonUnavailable` when nothing serves the socket or the stream ended
    (daemon stopped/restarted): the session's blocks and regions are gone; make a new Client;
  * CANCELLED for requests pending when :meth:`Client.close` ended the stream; FAILED_PRECONDITION
    for requests issued after it began; INTERNAL when a response has the wrong kind.
"""

import concurrent.futures
import itertools
import os
import queue
import threading
import time

import grpc

from . import errors
from .socket_path import default_socket_path, socket_path_fits
from .v1 import offload_pb2 as pb
from .v1 import offload_pb2_grpc as pb_grpc

URGENT = pb.URGENT      # the caller is blocked on this reload (backward is waiting)
PREFETCH = pb.PREFETCH  # needed soon; scheduled after urgent reloads, before offloads

MAX_REQUESTS_PER_MESSAGE = 4096
_CLOSE = object()

# Request field -> the Response field that answers it.
_EXPECTED = {
    "hello": "hello",
    "register_region": "region_registered",
    "unregister_region": "region_unregistered",
    "offload": "offload_done",
    "reload": "reload_done",
    "release": "released",
}


class Counters:
    """Counts since connect; batching shows as requests_sent / messages_sent > 1."""

    __slots__ = ("messages_sent", "requests_sent", "messages_received", "responses_received",
                 "unknown_responses")

    def __init__(self):
        for k in self.__slots__:
            setattr(self, k, 0)

    def as_dict(self):
        return {k: getattr(self, k) for k in self.__slots__}


class Client:
    """A session with the daemon. Connects, opens the Session stream and sends Hello.

    Args:
      socket_path: daemon socket (default: :func:`offloadd.socket_path.default_socket_path`).
      client_name: free text shown in the daemon's stats.
      device_id: the GPU the client's memory lives on (UUID "GPU-..." on the cuda backend, any
        stable name such as "cpu" on the shm backend); selects the link copies are scheduled on.
      connect_timeout_seconds: socket connect + HelloReply, together.
    Raises: DaemonUnavailable (no socket, nothing accepting within the timeout), OffloaddError
      INVALID_ARGUMENT (path too long), DEADLINE_EXCEEDED (no HelloReply in time), or the daemon's
      Error for Hello.
    """

    def __init__(self, socket_path=None, client_name="", device_id="cpu",
                 connect_timeout_seconds=5.0, pid=None, resume_token=b""):
        self.socket_path = socket_path or default_socket_path()
        self.target = "unix:" + self.socket_path
        self.device_id = device_id
        self.counters = Counters()
        self._lock = threading.Lock()
        self._pending = {}
        self._ids = itertools.count(1)
        self._outbox = queue.SimpleQueue()
        self._closing = False
        self._dead = None  # the exception pending and later requests fail with
        self._channel = None
        self._call = None
        if not socket_path_fits(self.socket_path):
            raise errors.OffloaddError(
                errors.INVALID_ARGUMENT, "socket path '%s' is empty or longer than 107 bytes: "
                "use a shorter path" % self.socket_path)
        if not os.path.exists(self.socket_path):
            raise errors.DaemonUnavailable(
                "no offloadd socket at %s: start the daemon (offloadd --socket_path %s) or point "
                "OFFLOADD_SOCKET at the right path" % (self.socket_path, self.socket_path))
        self._channel = grpc.insecure_channel(self.target)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=connect_timeout_seconds)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise errors.DaemonUnavailable(
                "nothing accepted a connection at %s within %.1f s: the socket file exists but "
                "no daemon serves it (stale socket?); restart offloadd"
                % (self.target, connect_timeout_seconds)) from None
        self._stub = pb_grpc.OffloadStub(self._channel)
        hello = self._submit(pb.Request(hello=pb.Hello(
            client_name=client_name, device_id=device_id,
            pid=os.getpid() if pid is None else pid, resume_token=resume_token)))
        self._call = self._stub.Session(self._writer())
        self._reader = threading.Thread(target=self._read_loop, name="offloadd-reader",
                                        daemon=True)
        self._reader.start()
        try:
            self.hello = hello.result(timeout=connect_timeout_seconds)
        except concurrent.futures.TimeoutError:
            self.close(timeout=0.5)
            raise errors.OffloaddError(errors.DEADLINE_EXCEEDED, "connected to %s but no "
                                       "HelloReply within %.1f s: is the daemon overloaded?"
                                       % (self.target, connect_timeout_seconds)) from None
        except Exception:
            self.close(timeout=0.5)
            raise

    # ---- HelloReply fields -------------------------------------------------------------------
    session_id = property(lambda self: self.hello.session_id)
    backend = property(lambda self: self.hello.backend)  # "shm" or "cuda"
    pool_capacity_bytes = property(lambda self: self.hello.pool_capacity_bytes)
    session_quota_bytes = property(lambda self: self.hello.session_quota_bytes)  # 0: none
    chunk_bytes = property(lambda self: self.hello.chunk_bytes)
    link = property(lambda self: self.hello.link)
    # The claim on this session's blocks across a daemon restart (bytes; keep it secret) and,
    # for a resumed session, how many blocks it took over (README "Failure modes").
    resume_token = property(lambda self: self.hello.resume_token)
    blocks_resumed = property(lambda self: self.hello.blocks_resumed)

    @classmethod
    def resume(cls, socket_path, resume_token, client_name="", device_id="cpu",
               total_seconds=30.0, initial_backoff_seconds=0.05, max_backoff_seconds=1.0,
               connect_timeout_seconds=5.0):
        """A new session holding the blocks of the session `resume_token` named, after the daemon
        restarted on a shared pool (pool_shm_name). Retries while the daemon is down
        (DaemonUnavailable) with exponential backoff, for at most `total_seconds`. Regions must be
        registered again; requests not answered before the daemon went away are not re-sent.
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

    @property
    def alive(self):
        """True while the stream is up and close() has not begun."""
        with self._lock:
            return self._dead is None and not self._closing

    # ---- requests ----------------------------------------------------------------------------
    def register_shm(self, shm_name, size_bytes, timeout=None):
        """Registers POSIX shm object ``shm_name`` ("/name") of ``size_bytes``; returns region id.

        Blocks until the daemon answers (it maps the object then; the name may be unlinked
        afterwards). Errors: the daemon's (NOT_FOUND no such object, PERMISSION_DENIED, ...).
        """
        handle = pb.RegionHandle(shm_name=shm_name, size_bytes=size_bytes)
        return self._submit(pb.Request(register_region=pb.RegisterRegion(handle=handle))) \
            .result(timeout).region_id

    def register_cuda(self, ipc_handle, size_bytes, timeout=None):
        """Registers a CUDA allocation by its 64-byte cudaIpcMemHandle_t (of the allocation
        *base*) and its size in bytes; returns the region id. Blocks until the daemon answers."""
        if len(ipc_handle) != 64:
            raise errors.OffloaddError(
                errors.INVALID_ARGUMENT, "a cudaIpcMemHandle_t has 64 bytes, not %d"
                % len(ipc_handle))
        handle = pb.RegionHandle(cuda_ipc_handle=bytes(ipc_handle), size_bytes=size_bytes)
        return self._submit(pb.Request(register_region=pb.RegisterRegion(handle=handle))) \
            .result(timeout).region_id

    def unregister(self, region_id):
        """Future of RegionUnregistered."""
        return self._submit(pb.Request(unregister_region=pb.UnregisterRegion(region_id=region_id)))

    def offload(self, region_id, offset, nbytes, ready_event=b"", ordering=None):
        """Copies ``nbytes`` at ``offset`` of the region into a new pool block.

        Returns a Future of ``OffloadDone`` (block_id, bytes, queued_seconds, copy_seconds). The
        bytes must stay unchanged until it resolves. ``ready_event``: CUDA IPC event handle the
        daemon's copy waits on (cuda backend; ignored by shm). ``ordering``: optional
        ``(step, position)`` of the block in the reload order, for the daemon's spill tier
        (within a step backward reloads in reverse of position).
        """
        req = pb.OffloadRequest(region_id=region_id, offset=offset, bytes=nbytes,
                                ready_event=ready_event)
        if ordering is not None:
            req.ordering.step, req.ordering.position = ordering
        return self._submit(pb.Request(offload=req))

    def reload(self, block_id, region_id, offset, priority=URGENT, release_after=False,
               deadline_seconds=0.0):
        """Copies block ``block_id`` back to ``offset`` of the region; Future of ``ReloadDone``.

        May be sent before the block's offload completed (the daemon orders it after).
        priority: URGENT or PREFETCH. release_after: free the block once copied.
        """
        return self._submit(pb.Request(reload=pb.ReloadRequest(
            block_id=block_id, region_id=region_id, offset=offset, priority=priority,
            release_after=release_after, deadline_seconds=deadline_seconds)))

    def release(self, block_id):
        """Frees a pool block; Future of ``Released``."""
        return self._submit(pb.Request(release=pb.ReleaseRequest(block_id=block_id)))

    def get_stats(self, timeout=10.0):
        """Unary GetStats on the same channel: the daemon's ``Stats`` message.

        Raises DaemonUnavailable / OffloaddError with the RPC's code and the socket path."""
        try:
            return self._stub.GetStats(pb.GetStatsRequest(), timeout=timeout)
        except grpc.RpcError as e:
            raise _rpc_error(e, self.target, "GetStats") from None

    def drain(self, timeout=10.0):
        """Waits until every request submitted so far has its response (or failed).
        Returns True when all completed within ``timeout`` seconds."""
        with self._lock:
            futures = [f for f, _ in self._pending.values()]
        done, not_done = concurrent.futures.wait(futures, timeout=timeout)
        return not not_done

    # ---- lifecycle ---------------------------------------------------------------------------
    def close(self, timeout=5.0):
        """Half-closes the stream after the queued requests, waits up to ``timeout`` seconds for
        the daemon to end it (then cancels), and joins the reader. Pending requests fail with
        CANCELLED. The daemon releases the session's blocks and regions. Idempotent."""
        with self._lock:
            first = not self._closing
            self._closing = True
        if first:
            self._outbox.put(_CLOSE)
        reader = getattr(self, "_reader", None)
        if reader is not None and reader is not threading.current_thread():
            reader.join(timeout)
            if reader.is_alive() and self._call is not None:
                self._call.cancel()
                reader.join(1.0)
        self._fail_all(errors.OffloaddError(errors.CANCELLED, "the client closed its session "
                                            "with %s" % self.target))
        if self._channel is not None:
            self._channel.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ---- internals ---------------------------------------------------------------------------
    def _submit(self, request):
        future = concurrent.futures.Future()
        kind = request.WhichOneof("body")
        with self._lock:
            if self._dead is not None:
                future.set_exception(self._dead)
                return future
            if self._closing:
                future.set_exception(errors.OffloaddError(
                    errors.FAILED_PRECONDITION, "request issued after close() began"))
                return future
            request.request_id = next(self._ids)
            self._pending[request.request_id] = (future, _EXPECTED[kind])
        self._outbox.put(request)
        return future

    def _writer(self):
        """Generator consumed by grpcio: one ClientMessage per burst of queued requests."""
        while True:
            item = self._outbox.get()
            if item is _CLOSE:
                return
            batch, done = [item], False
            while len(batch) < MAX_REQUESTS_PER_MESSAGE:
                try:
                    item = self._outbox.get_nowait()
                except queue.Empty:
                    break
                if item is _CLOSE:
                    done = True
                    break
                batch.append(item)
            with self._lock:
                self.counters.messages_sent += 1
                self.counters.requests_sent += len(batch)
            yield pb.ClientMessage(requests=batch)
            if done:
                return

    def _read_loop(self):
        failure = None
        try:
            for message in self._call:
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
        with self._lock:
            if self._closing:
                failure = errors.OffloaddError(errors.CANCELLED, "the client closed its "
                                               "session with %s" % self.target)
        self._fail_all(failure)
        self._outbox.put(_CLOSE)  # lets the writer generator end

    def _complete(self, response):
        with self._lock:
            entry = self._pending.pop(response.request_id, None)
            if entry is None:
                self.counters.unknown_responses += 1
                return
        future, expected = entry
        kind = response.WhichOneof("body")
        if kind == "error":
            future.set_exception(errors.OffloaddError(response.error.code,
                                                      response.error.message))
        elif kind != expected:
            future.set_exception(errors.OffloaddError(
                errors.INTERNAL, "protocol mismatch: expected %s, the daemon answered %s"
                % (expected, kind)))
        else:
            future.set_result(getattr(response, kind))

    def _fail_all(self, failure):
        with self._lock:
            if self._dead is None:
                self._dead = failure
            pending, self._pending = self._pending, {}
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(failure)


def _rpc_error(e, target, rpc):
    code = e.code() if hasattr(e, "code") else None
    details = e.details() if hasattr(e, "details") else str(e)
    if code in (None, grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED):
        return errors.DaemonUnavailable("the offloadd daemon at %s went away (%s: %s)"
                                        % (target, rpc, details))
    return errors.OffloaddError(code.value[0], "%s at %s: %s" % (rpc, target, details))
