"""The projector itself: :class:`ServiceProjector` (galore-torch's projector interface, refreshed
by the daemon), its statistics and staging (the package docstring, offloadd.galore, has the
semantics)."""

from __future__ import annotations

import atexit
import itertools
import json
import os
import threading
import warnings
import weakref
from typing import TYPE_CHECKING, Any, Dict, Optional, Tuple

from .. import errors
from ..shm import ShmRegion
from ..v1 import offload_pb2
from ._connection import ProjectorConnection, _unreachable, pb, shared_connection

if TYPE_CHECKING:
    import torch

ALIGN_BYTES = 64
STATE_FORMAT = 1  # of ServiceProjector.state_dict()
_ids = itertools.count()
# Test hooks (never set in production): "adopted"(projector, grad or None, p) -> p, called with
# every projector about to be adopted (tests align singular-vector signs with it).
_TEST_HOOKS = {}


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



class ProjectorStats:
    """Counts of one process's projectors (shared by all projectors :func:`enable` makes).

    projectors, refreshes_submitted (refreshes the daemon accepted: a Submit it answered; one
    no daemon took is not counted), refreshes_adopted, computed (adopted results the daemon
    computed for this process: neither deduplicated nor skipped by the lazy policy),
    deduplicated (adopted results the daemon took from another rank's identical refresh),
    local_fallbacks (synchronous refreshes computed in process because no daemon answered),
    kept_stale (asynchronous refreshes that failed, the previous projector kept), broadcasts
    (projectors received from or sent to other nodes).
    """

    FIELDS = ("projectors", "refreshes_submitted", "refreshes_adopted", "computed",
              "deduplicated", "local_fallbacks", "kept_stale", "broadcasts")

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self._lock:
            for f in self.FIELDS:
                setattr(self, f, 0)

    def count(self, field: str, n: int = 1) -> None:
        """Adds ``n`` to ``field`` (safe from the asynchronous submit thread)."""
        with self._lock:
            setattr(self, field, getattr(self, field) + n)

    def as_dict(self) -> Dict[str, int]:
        with self._lock:
            return {f: getattr(self, f) for f in self.FIELDS}

    def __repr__(self):
        return "ProjectorStats(%s)" % ", ".join("%s=%d" % kv for kv in self.as_dict().items())


class LocalSharing:
    """No other ranks: every projector submits its own refreshes, nothing is broadcast."""

    broadcasting = False

    def submits(self, index: int) -> bool:  # noqa: ARG002 - galore._optim.NodeSharing's
        return True

    def broadcast(self, p: Optional[torch.Tensor], index: int, shape: Tuple[int, ...],
                  dtype: torch.dtype,
                  device: torch.device) -> Optional[torch.Tensor]:  # noqa: ARG002
        return p


_live_staging = weakref.WeakSet()


@atexit.register
def _remove_staging_at_exit():
    """Projectors inside optimizer states are rarely closed; their shm names go at exit."""
    for st in list(_live_staging):
        try:
            st.close()
        except Exception:
            pass


class _Staging:
    """Where one refresh's G and P live: this projector's shm object or its CUDA buffer."""

    def __init__(self):
        self.region = None     # ShmRegion
        self.cuda_buf = None   # torch uint8 tensor on the gradient's GPU
        self.cuda_handle = None  # (RegionHandle, offset of the buffer in it, device uuid)
        _live_staging.add(self)

    def close(self):
        if self.region is not None:
            self.region.close()
            self.region = None
        self.cuda_buf = self.cuda_handle = None


def cuda_region_fields(runtime: Any, ptr: int, ordinal: int) -> Tuple[Any, int, str]:
    """(RegionHandle, offset_bytes, device_id) naming device pointer ``ptr`` of GPU ``ordinal``
    by CUDA IPC: the handle of its allocation base (an IPC handle covers a whole cudaMalloc
    allocation), the pointer's offset in it, the GPU's UUID. ``runtime``: offloadd.cuda's
    CudaRuntime (or a fake with allocation_range / ipc_mem_handle / device_uuid)."""
    base, size = runtime.allocation_range(ptr)
    handle = offload_pb2.RegionHandle(cuda_ipc_handle=runtime.ipc_mem_handle(base),
                                      size_bytes=size)
    return handle, ptr - base, runtime.device_uuid(ordinal)


class ServiceProjector:
    """The reference GaLore projector's interface, with the SVD done by the offloadd daemon.

    Args (the reference's first): rank, verbose, update_proj_gap, scale, proj_type;
      then method ("exact" | "randomized"), oversampling, power_iterations, warm_start
      (randomized: start from the previous projector), asynchronous, adopt_after_steps (see the
      module's staleness rule), lazy (+ lazy_similarity_threshold), parameter_id (a stable name
      of the weight; default a unique one), job_id (shared by the ranks of one run; keys are
      (job_id, parameter_id, step)), fallback ("local" | "error", see the module), batch_prefix
      (refreshes of one step share the batch id "<prefix><step>" for WatchBatch), connection
      (a ProjectorConnection) or socket_path; sharing/index/stats/cuda_runtime: set by
      :func:`enable` (cross-node broadcast, this projector's ordinal, shared counters, the CUDA
      runtime binding).
    Raises ValueError for an unknown proj_type, method or fallback.
    """

    def __init__(self, rank: int, verbose: bool = False, update_proj_gap: int = 200,
                 scale: float = 1.0, proj_type: str = "std", *, method: str = "exact",
                 oversampling: Optional[int] = None, power_iterations: Optional[int] = None,
                 warm_start: bool = False, asynchronous: bool = False,
                 adopt_after_steps: Optional[int] = None, lazy: bool = False,
                 lazy_similarity_threshold: Optional[float] = None,
                 parameter_id: Optional[str] = None, job_id: str = "", fallback: str = "error",
                 batch_prefix: Optional[str] = None,
                 connection: Optional[ProjectorConnection] = None,
                 socket_path: Optional[str] = None, sharing: Any = None, index: int = 0,
                 stats: Optional[ProjectorStats] = None, cuda_runtime: Any = None) -> None:
        if proj_type not in _SIDES:
            _resolve_side(proj_type, 1, 1)  # raises
        if method not in _METHODS:
            raise ValueError("method must be 'exact' or 'randomized', not %r" % (method,))
        if fallback not in ("local", "error"):
            raise ValueError("fallback must be 'local' or 'error', not %r" % (fallback,))
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
        k = adopt_after_steps if adopt_after_steps is not None else self.update_proj_gap // 2
        self.adopt_after_steps = max(1, min(int(k), max(1, self.update_proj_gap)))
        self.lazy = bool(lazy)
        self.lazy_similarity_threshold = lazy_similarity_threshold
        self.parameter_id = parameter_id or "py-%d-%d" % (os.getpid(), next(_ids))
        self.job_id = job_id or ""
        self.fallback = fallback
        self.batch_prefix = batch_prefix
        self.connection = connection or shared_connection(socket_path)
        self.sharing = sharing or LocalSharing()
        self.index = int(index)
        self.stats = stats or ProjectorStats()
        self.cuda_runtime = cuda_runtime
        self.last_result = None  # the RefreshResult of the projector in use (None: none/local)
        self.last_error = None   # the error of the last refresh that failed and was absorbed
        # The step whose gradient first used each adopted projector (the staleness rule's record):
        # the refresh step in synchronous mode, refresh step + adopt_after_steps in asynchronous.
        self.adopted_steps = []
        self._p = None           # side_dim x r, the gradient's dtype and device
        self._side = None
        self._staging = _Staging()
        self._pending = None     # a submitted asynchronous refresh, not adopted yet
        self._prefetched = None  # a waited-for refresh submitted early by prefetch()
        self._warned = set()

    # ---- the reference interface ----

    @property
    def ortho_matrix(self) -> Optional[torch.Tensor]:
        """The reference's projection matrix: U[:, :r] (left) or Vh[:r, :] (right); None before
        the first refresh."""
        if self._p is None:
            return None
        return self._p if self._side == "left" else self._p.t()

    def project(self, full_rank_grad: torch.Tensor,
                iter: int) -> torch.Tensor:  # noqa: A002 - the reference's argument name
        """The low-rank gradient of ``full_rank_grad`` (r x n on the left side, m x r on the
        right), refreshing the projection first when due (see the module's modes)."""
        step = int(iter)
        if self._pending is not None and step >= self._pending["adopt_at"]:
            self._adopt_pending(step)
        if self._p is None or step % self.update_proj_gap == 0:
            if self._p is None or not self.asynchronous:
                self._refresh_now(full_rank_grad, step)
            else:
                if self._pending is not None:  # adopt_after_steps == gap: adopt, then submit
                    self._adopt_pending(step)
                self._submit_async(full_rank_grad, step)
        p = self._p.to(full_rank_grad.device)
        if self._side == "left":
            return p.t() @ full_rank_grad
        return full_rank_grad @ p

    def project_back(self, low_rank_grad: torch.Tensor) -> torch.Tensor:
        """``scale`` times the full-rank image of ``low_rank_grad``."""
        p = self._p.to(low_rank_grad.device)
        if self._side == "left":
            full = p @ low_rank_grad
        else:
            full = low_rank_grad @ p.t()
        return full * self.scale

    def prefetch(self, full_rank_grad: torch.Tensor,
                 iter: int) -> None:  # noqa: A002 - project()'s argument name
        """Submits now, in the background, the refresh that ``project(full_rank_grad, iter)``
        will wait for (the first one, or a synchronous refresh step), so the daemon computes it
        while the optimizer updates the parameters before this one. Nothing when no refresh is
        due or this rank does not compute it; an error is left for ``project`` to meet.
        :func:`offloadd.galore.enable`'s step pre-hook calls it for every projector."""
        step = int(iter)
        due = self._p is None or (not self.asynchronous and step % self.update_proj_gap == 0)
        if not due or self._prefetched is not None or not self.sharing.submits(self.index):
            return
        try:
            self._prefetched = self._submit(full_rank_grad, step, background=True)
        except errors.OffloaddError:
            self._prefetched = None  # project() submits again and handles the error

    # ---- service details ----

    @property
    def pending(self) -> bool:
        """True while a submitted refresh has not been adopted (asynchronous mode)."""
        return self._pending is not None

    @property
    def pending_adopt_step(self) -> Optional[int]:
        """The step at which the pending refresh will be adopted (None when none is pending)."""
        return None if self._pending is None else self._pending["adopt_at"]

    def wait(self) -> None:
        """Adopts a pending refresh now, waiting for it (or raises its error); recorded in
        ``adopted_steps`` at the step the rule would have adopted it."""
        if self._pending is not None:
            self._adopt_pending(self._pending["adopt_at"])

    def close(self) -> None:
        """Removes the staging memory (the daemon keeps its mapping while it needs it)."""
        self._staging.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    # ---- one refresh ----

    def _named(self, e, step):
        """``e`` with this projector's parameter and step in front of the daemon's sentence."""
        cls = errors.DaemonUnavailable if isinstance(e, errors.DaemonUnavailable) else None
        text = "GaLore projector refresh of %s at step %d: %s" % (self.parameter_id, step,
                                                                 e.message)
        return cls(text) if cls else errors.OffloaddError(e.code, text)

    def _warn_once(self, kind, text):
        if kind not in self._warned:
            self._warned.add(kind)
            warnings.warn("offloadd: " + text, RuntimeWarning, stacklevel=3)

    def _layout(self, grad):
        """(side, r, side_dim) of a 2-D gradient; (None, 0, 0) otherwise (the daemon refuses
        it with INVALID_ARGUMENT)."""
        shape = list(grad.shape)
        if len(shape) != 2:
            return None, 0, 0
        side = _resolve_side(self.proj_type, shape[0], shape[1])
        r = min(self.rank, shape[0], shape[1])
        return side, r, (shape[0] if side == "left" else shape[1])

    def _side_of(self, grad):
        """"left" or "right" for this gradient (None when it is not 2-D)."""
        return self._layout(grad)[0]

    def _refresh_now(self, grad, step):
        """A refresh this step waits for (the first one, or synchronous mode)."""
        side, r, side_dim = self._layout(grad)
        p, result = None, None
        if self.sharing.submits(self.index):
            try:
                pending, self._prefetched = self._prefetched, None
                if pending is None or pending["step"] != step:
                    pending = self._submit(grad, step)
                p, result = self._collect(pending)
            except errors.OffloaddError as e:
                if not _unreachable(e) or self.fallback == "error" or side is None:
                    raise self._named(e, step) from None
                self.stats.local_fallbacks += 1
                self.last_error = e
                self._warn_once("fallback", "no projector daemon answered (%s); GaLore "
                                "refreshes are computed in this process with torch.linalg.svd "
                                "until it is back" % e.message)
                p = self._local_svd(grad, side, r)
            hook = _TEST_HOOKS.get("adopted")
            if hook is not None and p is not None:
                p = hook(self, grad, p)
        self._set(p, side, side_dim, r, grad, result, step)

    def _submit_async(self, grad, step):
        side, r, side_dim = self._layout(grad)
        pending = {"adopt_at": step + self.adopt_after_steps, "step": step, "side": side,
                   "side_dim": side_dim, "r": r, "dtype": grad.dtype, "device": grad.device}
        if self.sharing.submits(self.index):
            try:
                pending.update(self._submit(grad, step, background=True))
            except errors.OffloaddError as e:
                if not _unreachable(e):
                    raise self._named(e, step) from None
                self._absorb(e, step)
        self._pending = pending

    def _absorb(self, e, step):
        """An asynchronous refresh that could not be had: the current projector stays."""
        self.stats.kept_stale += 1
        self.last_error = e
        self._warn_once("stale", "asynchronous GaLore refresh of %s at step %d failed, the "
                        "previous projector stays in use (counted in stats.kept_stale): %s"
                        % (self.parameter_id, step, e.message))

    def _adopt_pending(self, step):
        pending, self._pending = self._pending, None
        p, result = None, None
        if "future" in pending or "id" in pending:
            try:
                p, result = self._collect(pending)
            except errors.OffloaddError as e:
                if not _unreachable(e):
                    raise self._named(e, pending["step"]) from None
                self._absorb(e, pending["step"])
        elif "p" in pending:  # restored from a checkpoint taken while it was pending
            p = pending["p"]
        hook = _TEST_HOOKS.get("adopted")
        if hook is not None and p is not None:
            p = hook(self, None, p)
        if p is None and self._p is not None and self._side == pending["side"]:
            p = self._p  # nothing new: keep the current one (and send it, when broadcasting)
        self._set(p, pending["side"], pending["side_dim"], pending["r"], None, result, step,
                  dtype=pending["dtype"], device=pending["device"])

    def _set(self, p, side, side_dim, r, grad, result, step, dtype=None, device=None):
        """Adopts ``p`` (None: keep / identity) at ``step``, exchanging it across nodes when
        broadcasting."""
        import torch
        dtype = dtype if dtype is not None else grad.dtype
        device = device if device is not None else grad.device
        if p is None and (self._p is None or self._side != side):
            p = torch.eye(side_dim, r, dtype=dtype, device=device)  # degenerate, nothing yet
        if self.sharing.broadcasting:
            p = self.sharing.broadcast(p if p is not None else self._p, self.index,
                                       (side_dim, r), dtype, device)
            self.stats.broadcasts += 1
        if p is not None:
            self._p, self._side = p, side
        self.last_result = result
        self.adopted_steps.append(step)
        self.stats.count("refreshes_adopted")
        if result is not None and result.deduplicated:
            self.stats.count("deduplicated")
        elif result is not None and not result.skipped:
            self.stats.count("computed")
        if self.verbose:
            print("offloadd: projector %s adopted the refresh of step %d" %
                  (self.parameter_id, step))

    @staticmethod
    def _local_svd(grad, side, r):
        """The reference's own computation (torch.linalg.svd of G in fp32), as side_dim x r."""
        import torch
        u, _, vh = torch.linalg.svd(grad.detach().float(), full_matrices=False)
        p = u[:, :r] if side == "left" else vh[:r, :].t()
        return p.contiguous().to(grad.dtype)

    def _stage_shm(self, staged, g_bytes, p_offset, p_bytes):
        import torch
        st = self._staging
        need = p_offset + max(p_bytes, 1)
        if st.region is None or st.region.size_bytes < need:
            st.close()
            mode, gid = self.connection.shm_access()  # readable by a daemon of another uid
            st.region = ShmRegion(_round_up(need, 1 << 20), prefix="offloadd-galore",
                                  mode=mode, gid=gid)
        if g_bytes:
            dst = torch.frombuffer(st.region.mm, dtype=torch.uint8, count=g_bytes, offset=0)
            dst.copy_(staged.reshape(-1).view(torch.uint8))
            del dst
        handle = offload_pb2.RegionHandle(shm_name=st.region.name,
                                          size_bytes=st.region.size_bytes)
        return handle, 0, "", None

    def _stage_cuda(self, staged, g_bytes, p_offset, p_bytes):
        """G copied device-to-device into this projector's CUDA buffer; an event the submit
        waits for (the daemon's copy has no event of ours to wait on)."""
        import torch
        from .. import cuda as ocuda
        st = self._staging
        need = p_offset + max(p_bytes, 1)
        if st.cuda_buf is None or st.cuda_buf.numel() < need:
            st.cuda_buf = torch.empty(_round_up(need, 1 << 20), dtype=torch.uint8,
                                      device=staged.device)
            runtime = self.cuda_runtime or ocuda.CudaRuntime()
            st.cuda_handle = cuda_region_fields(runtime, st.cuda_buf.data_ptr(),
                                                staged.device.index or 0)
        if g_bytes:
            st.cuda_buf[:g_bytes].copy_(staged.reshape(-1).view(torch.uint8))
        ready = torch.cuda.Event()
        ready.record()
        handle, base_offset, uuid = st.cuda_handle
        return handle, base_offset, uuid, ready

    def _submit(self, grad, step, background=False):
        """Stages G and submits; returns the pending dict (refresh id, or a Future of it)."""
        import torch
        g = grad.detach()
        dtype_code = {torch.float32: pb.DTYPE_FLOAT32, torch.bfloat16: pb.DTYPE_BFLOAT16,
                      torch.float16: pb.DTYPE_FLOAT16}.get(g.dtype)
        staged = g
        if dtype_code is None:  # e.g. fp64: computed in fp32 anyway
            staged, dtype_code = g.float(), pb.DTYPE_FLOAT32
        staged = staged.contiguous()
        side, r, side_dim = self._layout(g)
        g_bytes = staged.numel() * staged.element_size()
        p_offset = _round_up(max(g_bytes, 1), ALIGN_BYTES)
        p_bytes = side_dim * r * staged.element_size()
        use_cuda = staged.is_cuda and self.connection.cuda_regions()
        if not use_cuda:
            staged = staged.to("cpu")
        stage = self._stage_cuda if use_cuda else self._stage_shm
        handle, base, device_id, ready = stage(staged, g_bytes, p_offset, p_bytes)
        request = self._request(step, g, dtype_code, handle, base, p_offset, device_id)
        pending = {"side": side, "side_dim": side_dim, "r": r, "p_offset": p_offset,
                   "dtype": g.dtype, "staged_dtype": staged.dtype, "device": g.device,
                   "step": step, "cuda": use_cuda}
        if background:
            pending["future"] = self.connection.background(
                lambda: self._send(request, ready))
        else:
            pending["id"] = self._send(request, ready)
        return pending

    def _request(self, step, g, dtype_code, handle, base, p_offset, device_id):
        request = pb.RefreshRequest(
            key=pb.RefreshKey(parameter_id=self.parameter_id, step=step, job_id=self.job_id),
            gradient_region=handle, gradient_offset=base, shape=list(g.shape), dtype=dtype_code,
            rank=self.rank, side=_SIDES[self.proj_type], method=_METHODS[self.method],
            warm_start=self.warm_start and self.method == "randomized",
            projector_offset=base + p_offset, lazy=self.lazy, device_id=device_id)
        if self.oversampling is not None:
            request.oversampling = int(self.oversampling)
        if self.power_iterations is not None:
            request.power_iterations = int(self.power_iterations)
        if self.lazy_similarity_threshold is not None:
            request.lazy_similarity_threshold = float(self.lazy_similarity_threshold)
        if self.batch_prefix is not None:
            request.batch_id = "%s%d" % (self.batch_prefix, step)
        return request

    def _send(self, request, ready):
        """Submit (after the CUDA copy of G has completed); returns the refresh id."""
        if ready is not None:
            ready.synchronize()
        try:
            reply = self.connection.submit(request)
        except errors.OffloaddError as e:
            if e.code != errors.FAILED_PRECONDITION:
                raise
            # A step older than one already refreshed: training restarted from a checkpoint.
            request.reset_history = True
            reply = self.connection.submit(request)
        self.stats.count("refreshes_submitted")  # only what the daemon took
        if self.verbose:
            print("offloadd: projector refresh %d of %s at step %d submitted" %
                  (reply.refresh_id, self.parameter_id, request.key.step))
        return reply.refresh_id

    def _collect(self, pending):
        """Waits for a submitted refresh; (P as side_dim x r on the gradient's device, or None
        when the daemon wrote none — degenerate G or a lazy skip; the RefreshResult)."""
        import torch
        refresh_id = pending.get("id")
        if refresh_id is None:
            try:
                refresh_id = pending["future"].result()
            finally:
                pending.pop("future", None)
            pending["id"] = refresh_id
        result = self.connection.result(refresh_id, wait=True)
        if result.state == pb.REFRESH_FAILED:  # WatchBatch-style result; GetResult raises
            raise errors.OffloaddError(result.error.code, result.error.message)
        if not result.projector_written:
            return None, result
        elem = torch.empty((), dtype=pending["staged_dtype"]).element_size()
        count = pending["side_dim"] * pending["r"] * elem
        if pending["cuda"]:
            raw = self._staging.cuda_buf[pending["p_offset"]:pending["p_offset"] + count]
        else:
            raw = torch.frombuffer(self._staging.region.mm, dtype=torch.uint8, count=count,
                                   offset=pending["p_offset"])
        p = raw.view(pending["staged_dtype"]).reshape(pending["side_dim"], pending["r"]).clone()
        del raw
        return p.to(device=pending["device"], dtype=pending["dtype"]), result

    # ---- checkpoints ----

    def state_dict(self) -> Dict[str, Any]:
        """This projector as plain data a ``torch.load(weights_only=True)`` accepts: ints and
        uint8 tensors (JSON metadata, P's bytes, and a pending refresh's P, fetched now so a
        resumed run adopts it at the same step). See offloadd/galore/_optim.py."""
        import torch
        meta = {"format": STATE_FORMAT, "rank": self.rank, "gap": self.update_proj_gap,
                "scale": self.scale, "proj_type": self.proj_type, "side": self._side,
                "parameter_id": self.parameter_id, "adopted_steps": self.adopted_steps[-1:]}
        out = {"offloadd_galore_projector": STATE_FORMAT}
        if self._p is not None:
            meta["p"] = _tensor_meta(self._p)
            out["p"] = _tensor_bytes(self._p)
        if self._pending is not None:
            pend = self._pending
            meta["pending"] = {k: pend[k] for k in ("adopt_at", "step", "side", "side_dim", "r")}
            meta["pending"]["dtype"] = str(pend["dtype"]).replace("torch.", "")
            p = pend.get("p")
            if p is None and ("future" in pend or "id" in pend):
                try:
                    p, _ = self._collect(pend)
                except errors.OffloaddError as e:
                    if not _unreachable(e):
                        raise self._named(e, pend["step"]) from None
                pend.pop("id", None)
                pend["p"] = p
            if p is not None:
                meta["pending"]["p"] = _tensor_meta(p)
                out["pending_p"] = _tensor_bytes(p)
        out["meta"] = torch.frombuffer(bytearray(json.dumps(meta).encode()), dtype=torch.uint8)
        return out

    def load_state_dict(self, state: Dict[str, Any], device: Any = None) -> None:
        """Restores what :meth:`state_dict` saved (P on ``device``, default where it was).
        Raises ValueError for a state of another format."""
        import torch
        meta = json.loads(_raw_bytes(state["meta"]).numpy().tobytes().decode())
        if meta.get("format") != STATE_FORMAT:
            raise ValueError("offloadd GaLore projector state of format %r; this offloadd "
                             "reads format %d" % (meta.get("format"), STATE_FORMAT))
        self.parameter_id = meta["parameter_id"]
        self._side = meta["side"]
        if "p" in meta:
            self._p = _tensor_from(state["p"], meta["p"], device)
        self.adopted_steps = list(meta.get("adopted_steps", []))
        if "pending" in meta:
            pend = dict(meta["pending"])
            pend["dtype"] = getattr(torch, pend["dtype"])
            pend["device"] = device if device is not None else state["meta"].device
            pend["p"] = (_tensor_from(state["pending_p"], pend.pop("p"), device)
                         if "pending_p" in state else None)
            self._pending = pend


def _tensor_meta(t):
    return {"shape": list(t.shape), "dtype": str(t.dtype).replace("torch.", ""),
            "device": str(t.device)}


def _tensor_bytes(t):
    import torch
    return t.detach().contiguous().reshape(-1).view(torch.uint8).cpu().clone()


def _raw_bytes(t):
    """The uint8 tensor :func:`_tensor_bytes` made, on the CPU. Optimizer.load_state_dict casts
    every state tensor to its parameter's floating dtype: byte values 0-255 are exact in fp32,
    fp16 and bf16 (8 significant bits), so rounding gives the bytes back."""
    import torch
    t = t.detach().cpu()
    if t.dtype != torch.uint8:
        t = t.round().to(torch.uint8)
    return t.contiguous()


def _tensor_from(raw, meta, device):
    import torch
    dtype = getattr(torch, meta["dtype"])
    t = _raw_bytes(raw).view(dtype).reshape(meta["shape"]).clone()
    return t.to(device if device is not None else meta["device"])

