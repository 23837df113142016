"""GaLore projector refreshes computed by the offloadd daemon (proto/projector.proto).

:class:`ServiceProjector` offers the interface of the reference GaLore projector
(``GaLoreProjector`` in github.com/jiaweizzhao/GaLore, galore_torch/galore_projector.py; Zhao et
al. 2024, shared/reference/galore-paper.txt, Alg. 1): ``project(full_rank_grad, iter)`` returns
the low-rank gradient and refreshes the projection every ``update_proj_gap`` steps;
``project_back(low_rank_grad)`` maps a low-rank update back to full rank, times ``scale``. The
top-r SVD runs in the daemon (LAPACK on its host CPU, fp32 whatever the gradient's dtype) instead
of ``torch.linalg.svd`` in the training process.

Sides (``proj_type``): "std" projects the smaller side (m >= n: right vectors, else left),
"reverse_std" the larger one, "left"/"right" a fixed one; "full" is not offered.

Layout: ``ortho_matrix`` is what the reference keeps: ``U[:, :r]`` (m x r) on the left side and
``Vh[:r, :]`` (r x n) on the right side, in the gradient's dtype and on its device. The daemon
writes P as side_dim x r row-major (for the right side ``Vh[:r, :].T``); this module transposes.
Singular vectors carry arbitrary signs in the reference and here alike; ``project_back(project(G))``
does not depend on them.

Modes:
  * default: a refresh step waits for its projector (the reference's results: the same subspace,
    measured by the tests against ``torch.linalg.svd``);
  * ``asynchronous=True`` (opt-in): a refresh step submits and returns at once, and the current
    projector stays in use until the new one is ready; ``project`` adopts it at its next call
    after the daemon has finished (the first refresh always waits: there is nothing to use yet).
  * ``lazy=True``: the daemon may skip a refresh while this parameter's consecutive projectors
    stay similar (server/projector/lazy_policy.h); the current projector is then kept.

Data path: G is copied into a POSIX shared-memory object this projector owns (offloadd.shm's
ShmRegion, named while the projector lives, since the daemon opens it by name), P comes back
through the same object. CUDA tensors are staged through host memory the same way. A gradient of
another dtype than fp32/bf16/fp16 (e.g. fp64) is sent as fp32 and P is cast back.

Results: after each adopted refresh ``last_result`` holds the daemon's RefreshResult (singular
values, captured energy, residual ratio, orthogonality error after the dtype cast, similarity to
the previous projector, timings). Errors raise :class:`offloadd.errors.OffloaddError` with the
daemon's code: INVALID_ARGUMENT for NaN/Inf in G (naming the first bad row) or a 1-D gradient,
OUT_OF_RANGE, NOT_FOUND, ...; :class:`~offloadd.errors.DaemonUnavailable` when no daemon answers.
An all-zero gradient keeps the current projector (the daemon reports it degenerate); with none yet,
the first r columns of the identity are used.
"""

import itertools
import os
import threading
import warnings

import grpc

from . import errors
from .shm import ShmRegion
from .socket_path import default_socket_path

try:
    from .v1 import offload_pb2
    from .v1 import projector_pb2 as pb
    from .v1 import projector_pb2_grpc as pb_grpc
except ImportError as e:  # pragma: no cover - depends on the build
    raise ImportError(
        "offloadd.galore needs the generated stubs offloadd/v1/projector_pb2*.py: run "
        "client/python/gen_proto.sh (%s)" % e) from e

ALIGN_BYTES = 64
_ids = itertools.count()


def _grpc_error(e):
    """An OffloaddError (DaemonUnavailable for UNAVAILABLE) from a grpc.RpcError."""
    code = e.code()
    number = code.value[0] if code is not None else errors.UNKNOWN
    text = e.details() or str(code)
    if number == errors.UNAVAILABLE:
        return errors.DaemonUnavailable(text)
    return errors.OffloaddError(number, text)


class ProjectorConnection:
    """A gRPC channel to the daemon's Projector service; share one among many projectors.

    Args:
      socket_path: daemon socket (default :func:`offloadd.socket_path.default_socket_path`).
      timeout_seconds: deadline of each call; a waiting GetResult included.
    """

    def __init__(self, socket_path=None, timeout_seconds=600.0):
        self.socket_path = socket_path or default_socket_path()
        self.timeout_seconds = float(timeout_seconds)
        self.channel = grpc.insecure_channel("unix:" + self.socket_path)
        self.stub = pb_grpc.ProjectorStub(self.channel)

    def submit(self, request):
        """Submit(RefreshRequest) -> SubmitReply. Raises OffloaddError."""
        try:
            return self.stub.Submit(request, timeout=self.timeout_seconds)
        except grpc.RpcError as e:
            raise _grpc_error(e) from None

    def result(self, refresh_id, wait=True):
        """GetResult -> RefreshResult; a failed refresh raises its error."""
        try:
            return self.stub.GetResult(pb.GetResultRequest(refresh_id=refresh_id, wait=wait),
                                       timeout=self.timeout_seconds)
        except grpc.RpcError as e:
            raise _grpc_error(e) from None

    def watch(self, batch_id="", refresh_ids=()):
        """Yields RefreshProgress as each refresh of the batch finishes."""
        try:
            for progress in self.stub.WatchBatch(
                    pb.WatchRequest(batch_id=batch_id, refresh_ids=list(refresh_ids)),
                    timeout=self.timeout_seconds):
                yield progress
        except grpc.RpcError as e:
            raise _grpc_error(e) from None

    def close(self):
        self.channel.close()


_shared = {}
_shared_lock = threading.Lock()


def shared_connection(socket_path=None):
    """One ProjectorConnection per socket path for the whole process."""
    path = socket_path or default_socket_path()
    with _shared_lock:
        if path not in _shared:
            _shared[path] = ProjectorConnection(path)
        return _shared[path]


def _resolve_side(proj_type, rows, cols):
    """"left" or "right": which singular vectors ``proj_type`` selects for rows x cols."""
    if proj_type == "std":
        return "right" if rows >= cols else "left"
    if proj_type == "reverse_std":
        return "left" if rows >= cols else "right"
    if proj_type in ("left", "right"):
        return proj_type
    raise ValueError("proj_type %r is not offered by the projector service: use std, "
                     "reverse_std, left or right" % (proj_type,))


_SIDES = {"std": pb.SIDE_STD, "reverse_std": pb.SIDE_REVERSE_STD, "left": pb.SIDE_LEFT,
          "right": pb.SIDE_RIGHT}
_METHODS = {"exact": pb.METHOD_EXACT, "randomized": pb.METHOD_RANDOMIZED}


def _round_up(n, k):
    return (n + k - 1) // k * k


class ServiceProjector:
    """The reference GaLore projector's interface, with the SVD done by the offloadd daemon.

    Args (the reference's first): rank, verbose, update_proj_gap, scale, proj_type;
      then method ("exact" | "randomized"), oversampling, power_iterations, warm_start
      (randomized: start from the previous projector), asynchronous, lazy (+ lazy_similarity_
      threshold), parameter_id (a stable name of the weight; default a unique one), batch_prefix
      (refreshes of one step share the batch id "<prefix><step>" for WatchBatch), connection
      (a ProjectorConnection) or socket_path.
    """

    def __init__(self, rank, verbose=False, update_proj_gap=200, scale=1.0, proj_type="std",
                 *, method="exact", oversampling=None, power_iterations=None, warm_start=False,
                 asynchronous=False, lazy=False, lazy_similarity_threshold=None,
                 parameter_id=None, batch_prefix=None, connection=None, socket_path=None):
        if proj_type not in _SIDES:
            _resolve_side(proj_type, 1, 1)  # raises
        if method not in _METHODS:
            raise ValueError("method must be 'exact' or 'randomized', not %r" % (method,))
        self.rank = int(rank)
        self.verbose = verbose
        self.update_proj_gap = int(update_proj_gap)
        self.scale = scale
        self.proj_type = proj_type
        self.method = method
        self.oversampling = oversampling
        self.power_iterations = power_iterations
        self.warm_start = bool(warm_start)
        self.asynchronous = bool(asynchronous)
        self.lazy = bool(lazy)
        self.lazy_similarity_threshold = lazy_similarity_threshold
        self.parameter_id = parameter_id or "py-%d-%d" % (os.getpid(), next(_ids))
        self.batch_prefix = batch_prefix
        self.connection = connection or shared_connection(socket_path)
        self.last_result = None  # the RefreshResult of the projector in use
        self.last_error = None   # asynchronous mode: the error of a refresh that failed
        self._p = None           # side_dim x r, the gradient's dtype and device
        self._side = None
        self._region = None
        self._pending = None     # dict describing a submitted, not yet adopted refresh

    # ---- the reference interface ----

    @property
    def ortho_matrix(self):
        """The reference's projection matrix: U[:, :r] (left) or Vh[:r, :] (right); None before
        the first refresh."""
        if self._p is None:
            return None
        return self._p if self._side == "left" else self._p.t()

    def project(self, full_rank_grad, iter):  # noqa: A002 - the reference's argument name
        """The low-rank gradient of ``full_rank_grad`` (r x n on the left side, m x r on the
        right), refreshing the projection first when ``iter % update_proj_gap == 0``."""
        self.poll()
        if self._p is None or iter % self.update_proj_gap == 0:
            wait = self._p is None or not self.asynchronous
            self._refresh(full_rank_grad, int(iter), wait)
        p = self._p.to(full_rank_grad.device)
        if self._side == "left":
            return p.t() @ full_rank_grad
        return full_rank_grad @ p

    def project_back(self, low_rank_grad):
        """``scale`` times the full-rank image of ``low_rank_grad``."""
        p = self._p.to(low_rank_grad.device)
        if self._side == "left":
            full = p @ low_rank_grad
        else:
            full = low_rank_grad @ p.t()
        return full * self.scale

    # ---- service details ----

    @property
    def pending(self):
        """True while a submitted refresh has not been adopted (asynchronous mode)."""
        return self._pending is not None

    def poll(self):
        """Adopts a finished asynchronous refresh; returns True when one was adopted."""
        if self._pending is None:
            return False
        result = None
        try:
            result = self.connection.result(self._pending["id"], wait=False)
        except errors.OffloaddError as e:
            self._fail_pending(e)
            return False
        if result.state not in (pb.REFRESH_DONE, pb.REFRESH_FAILED):
            return False
        self._adopt(result)
        return True

    def wait(self):
        """Blocks until a pending refresh is adopted (or raises its error)."""
        if self._pending is None:
            return
        try:
            result = self.connection.result(self._pending["id"], wait=True)
        except errors.OffloaddError:
            self._pending = None
            raise
        self._adopt(result)

    def close(self):
        """Removes the shared-memory object (the daemon keeps its mapping while it needs it)."""
        if self._region is not None:
            self._region.close()
            self._region = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def _fail_pending(self, error):
        self._pending = None
        self.last_error = error
        warnings.warn("offloadd: projector refresh of %s failed, the previous projector stays in "
                      "use: %s" % (self.parameter_id, error))

    def _stage(self, nbytes):
        if self._region is None or self._region.size_bytes < nbytes:
            self.close()
            self._region = ShmRegion(_round_up(nbytes, 1 << 20), prefix="offloadd-galore")
        return self._region

    def _refresh(self, grad, step, wait):
        import torch
        if self._pending is not None:
            self.wait()  # one refresh in flight per projector: its region holds G and P
        g = grad.detach()
        shape = list(g.shape)
        dtype_code = {torch.float32: pb.DTYPE_FLOAT32, torch.bfloat16: pb.DTYPE_BFLOAT16,
                      torch.float16: pb.DTYPE_FLOAT16}.get(g.dtype)
        staged = g
        if dtype_code is None:  # e.g. fp64: computed in fp32 anyway
            staged, dtype_code = g.float(), pb.DTYPE_FLOAT32
        staged = staged.to("cpu").contiguous().reshape(-1)
        g_bytes = staged.numel() * staged.element_size()
        if len(shape) == 2:
            side = _resolve_side(self.proj_type, shape[0], shape[1])
            r = min(self.rank, shape[0], shape[1])
            side_dim = shape[0] if side == "left" else shape[1]
        else:
            side, r, side_dim = None, 0, 0  # the daemon refuses it (INVALID_ARGUMENT)
        p_offset = _round_up(max(g_bytes, 1), ALIGN_BYTES)
        p_bytes = side_dim * r * staged.element_size()
        region = self._stage(p_offset + max(p_bytes, 1))
        if g_bytes:
            dst = torch.frombuffer(region.mm, dtype=torch.uint8, count=g_bytes, offset=0)
            dst.copy_(staged.view(torch.uint8))
            del dst
        request = pb.RefreshRequest(
            key=pb.RefreshKey(parameter_id=self.parameter_id, step=step),
            gradient_region=offload_pb2.RegionHandle(shm_name=region.name,
                                                     size_bytes=region.size_bytes),
            gradient_offset=0, shape=shape, dtype=dtype_code, rank=self.rank,
            side=_SIDES[self.proj_type], method=_METHODS[self.method],
            warm_start=self.warm_start and self.method == "randomized",
            projector_offset=p_offset, lazy=self.lazy)
        if self.oversampling is not None:
            request.oversampling = int(self.oversampling)
        if self.power_iterations is not None:
            request.power_iterations = int(self.power_iterations)
        if self.lazy_similarity_threshold is not None:
            request.lazy_similarity_threshold = float(self.lazy_similarity_threshold)
        if self.batch_prefix is not None:
            request.batch_id = "%s%d" % (self.batch_prefix, step)
        try:
            reply = self.connection.submit(request)
        except errors.OffloaddError as e:
            if e.code != errors.FAILED_PRECONDITION:
                raise
            # A step older than one already refreshed: training restarted from a checkpoint.
            request.reset_history = True
            reply = self.connection.submit(request)
        self._pending = {"id": reply.refresh_id, "side": side, "side_dim": side_dim, "r": r,
                         "p_offset": p_offset, "dtype": g.dtype, "staged_dtype": staged.dtype,
                         "device": g.device}
        if self.verbose:
            print("offloadd: projector refresh %d of %s at step %d submitted" %
                  (reply.refresh_id, self.parameter_id, step))
        if wait:
            self.wait()

    def _adopt(self, result):
        import torch
        pending, self._pending = self._pending, None
        if result.state == pb.REFRESH_FAILED:  # WatchBatch-style result; GetResult raises
            self._fail_pending(errors.OffloaddError(result.error.code, result.error.message))
            return
        if result.projector_written:
            region = self._region
            elem = torch.empty((), dtype=pending["staged_dtype"]).element_size()
            count = pending["side_dim"] * pending["r"] * elem
            raw = torch.frombuffer(region.mm, dtype=torch.uint8, count=count,
                                   offset=pending["p_offset"])
            p = raw.view(pending["staged_dtype"]).reshape(pending["side_dim"], pending["r"]).clone()
            del raw
            self._p = p.to(device=pending["device"], dtype=pending["dtype"])
            self._side = pending["side"]
        elif self._p is None or self._side != pending["side"]:
            # Degenerate (all-zero G) with no projector yet: identity columns.
            self._p = torch.eye(pending["side_dim"], pending["r"], dtype=pending["dtype"],
                                device=pending["device"])
            self._side = pending["side"]
        self.last_result = result
        if self.verbose:
            print("offloadd: projector %s step %d: %s" % (
                self.parameter_id, result.key.step,
                "skipped (lazy)" if result.skipped else "degenerate gradient, kept" if
                result.degenerate else "similarity %.3f" % result.similarity))
