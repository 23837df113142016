"""The daemon's Projector service over gRPC: :class:`ProjectorConnection` (one channel, shared by
many projectors; :func:`shared_connection` keeps one per socket path) and how its errors map to
offloadd.errors."""

from __future__ import annotations

import errno as _errno
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Iterable, Optional, Tuple

import grpc

from .. import errors
from .. import socket_path as _socket_path
from ..shm import shm_access
from ..socket_path import default_socket_path

try:
    from ..v1 import projector_pb2 as pb
    from ..v1 import projector_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "offloadd.galore needs the generated stubs offloadd/v1/projector_pb2*.py: run "
        "client/python/gen_proto.sh (%s)" % e) from e


def _grpc_error(e):
    """An OffloaddError (DaemonUnavailable for UNAVAILABLE) from a grpc.RpcError."""
    code = e.code()
    number = code.value[0] if code is not None else errors.UNKNOWN
    text = e.details() or str(code)
    if number == errors.UNAVAILABLE:
        return errors.DaemonUnavailable(text)
    return errors.OffloaddError(number, text)


def _unreachable(e):
    """True for errors that mean "no daemon answered" (the fallback cases), not bad input."""
    return isinstance(e, errors.DaemonUnavailable) or e.code in (
        errors.UNAVAILABLE, errors.DEADLINE_EXCEEDED, errors.CANCELLED)


class ProjectorConnection:
    """A gRPC channel to the daemon's Projector service; share one among many projectors.

    Args:
      socket_path: daemon socket (default :func:`offloadd.socket_path.default_socket_path`).
      timeout_seconds: deadline of each call; a waiting GetResult included.
      shm_mode, shm_group: access of the shared-memory objects the projectors stage G and P
        in (:func:`offloadd.shm.shm_access`; default $OFFLOADD_SHM_MODE / $OFFLOADD_SHM_GROUP,
        else what the daemon's uid needs).
    """

    def __init__(self, socket_path: Optional[str] = None, timeout_seconds: float = 600.0,
                 shm_mode: Optional[int] = None, shm_group: Optional[str] = None) -> None:
        self.socket_path = socket_path or default_socket_path()
        self.timeout_seconds = float(timeout_seconds)
        self.channel = grpc.insecure_channel("unix:" + self.socket_path)
        self.stub = pb_grpc.ProjectorStub(self.channel)
        self._cuda_regions = None
        self._executor = None
        self._lock = threading.Lock()
        self._shm = (shm_mode, shm_group)
        self._access = None

    def shm_access(self) -> Tuple[int, int]:
        """``(mode, gid)`` for staging objects (:func:`offloadd.shm.shm_access`), found on first
        use with one connect() to the socket, which also reports a socket this user may not
        open at once (SocketPermissionDenied, naming its group and how to join it) instead of
        after the call's deadline."""
        if self._access is None:
            err, uid = _socket_path.probe(self.socket_path)
            if err in (_errno.EACCES, _errno.EPERM):
                raise errors.SocketPermissionDenied(
                    "cannot connect to the offloadd socket %s: %s"
                    % (self.socket_path, _socket_path.permission_denied_reason(self.socket_path)))
            self._access = shm_access(self.socket_path, uid, *self._shm)
        return self._access

    def submit(self, request: Any) -> Any:
        """Submit(RefreshRequest) -> SubmitReply. Raises OffloaddError."""
        try:
            return self.stub.Submit(request, timeout=self.timeout_seconds)
        except grpc.RpcError as e:
            raise _grpc_error(e) from None

    def result(self, refresh_id: int, wait: bool = True) -> Any:
        """GetResult -> RefreshResult; a failed refresh raises its error."""
        try:
            return self.stub.GetResult(pb.GetResultRequest(refresh_id=refresh_id, wait=wait),
                                       timeout=self.timeout_seconds)
        except grpc.RpcError as e:
            raise _grpc_error(e) from None

    def stats(self) -> Any:
        """GetProjectorStats -> ProjectorStats (computed vs deduplicated counts, ...)."""
        try:
            return self.stub.GetProjectorStats(pb.ProjectorStatsRequest(),
                                               timeout=self.timeout_seconds)
        except grpc.RpcError as e:
            raise _grpc_error(e) from None

    def cuda_regions(self) -> bool:
        """True when the daemon opens CUDA IPC handles (asked once; False if unreachable)."""
        if self._cuda_regions is None:
            try:
                self._cuda_regions = bool(self.stats().cuda_regions)
            except errors.OffloaddError:
                return False
        return self._cuda_regions

    def background(self, fn: Callable[[], Any]) -> Any:
        """Runs ``fn`` on this connection's one submit thread; returns its Future."""
        with self._lock:
            if self._executor is None:
                self._executor = ThreadPoolExecutor(1, thread_name_prefix="offloadd-galore")
            return self._executor.submit(fn)

    def watch(self, batch_id: str = "", refresh_ids: Iterable[int] = ()) -> Any:
        """Yields RefreshProgress as each refresh of the batch finishes."""
        try:
            for progress in self.stub.WatchBatch(
                    pb.WatchRequest(batch_id=batch_id, refresh_ids=list(refresh_ids)),
                    timeout=self.timeout_seconds):
                yield progress
        except grpc.RpcError as e:
            raise _grpc_error(e) from None

    def close(self) -> None:
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self.channel.close()


_shared = {}
_shared_lock = threading.Lock()


def shared_connection(socket_path: Optional[str] = None,
                      timeout_seconds: Optional[float] = None) -> ProjectorConnection:
    """One ProjectorConnection per socket path for the whole process."""
    path = socket_path or default_socket_path()
    with _shared_lock:
        if path not in _shared:
            _shared[path] = ProjectorConnection(path, timeout_seconds or 600.0)
        return _shared[path]
