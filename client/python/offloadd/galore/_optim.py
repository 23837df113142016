"""offloadd.galore.enable(): galore-torch's optimizers with their projectors in the daemon.

How it attaches (galore-torch 1.0, read from its sources): GaLoreAdamW, GaLoreAdamW8bit and
GaLoreAdafactor each make one ``GaLoreProjector`` per parameter, lazily, at the parameter's first
step (``if "projector" not in state``), and call ``state["projector"].project(grad,
state["step"])`` / ``project_back(...)``. :func:`enable` registers a global optimizer step
pre-hook (``torch.optim.optimizer.register_optimizer_step_pre_hook``; galore-torch's optimizers,
bitsandbytes' included, are torch optimizers, so every ``step()`` runs it) which, before each
step of one of those three classes, puts an :class:`offloadd.galore.ServiceProjector` into the
state of every GaLore parameter that has a gradient and no projector yet — so the optimizer's own
``GaLoreProjector`` is never made. Nothing of galore-torch, torch or Transformers is replaced,
except ``transformers.Trainer.create_optimizer``, wrapped to name the model's parameters first
(the Trainer's ``galore_*`` optims, layerwise included, build their optimizers inside it).

Parameter ids (the daemon's key, with the job id and the step) are the parameters' names when
known — from the Trainer, from ``enable(model=...)`` or :func:`name_parameters` — else
"galore.<n>.<rows>x<cols>" with n the order in which this process's GaLore parameters first step
(the optimizer's parameter order; the same on every rank and after a restart of the same script).
Never a pid or an object id. The job id is drawn by rank 0 and broadcast when torch.distributed
is initialised (``job_id=`` or $OFFLOADD_JOB_ID override it); a process of its own gets a random
one, so two unrelated runs never share keys.

Data-parallel ranks: every rank of a node submits each refresh with the same key; the node's
daemon computes it once and writes bitwise the same P into every rank's memory (the daemon checks
that the gradients are bitwise equal, server/projector/refresh_service.h; DDP's all-reduced
gradients are). Across nodes the projector is *distributed*, not recomputed: parameter n's
refresh is computed only on node n mod N (N nodes, as told apart by hostname and daemon socket),
and its local rank-0 sends P to every rank with ``torch.distributed.broadcast`` (the job's own
process group; gloo or NCCL), so all ranks of all nodes hold bitwise the same P whatever their
hosts' LAPACK builds or thread counts. ``broadcast=True`` does the same on one node (every
refresh's outcome, including a fallback or a kept stale projector, is then rank 0's on all ranks);
``broadcast=False`` never broadcasts. The broadcast is collective: every rank must step the same
parameters in the same order (DDP does).

Checkpoints: optimizers of the three classes get a ``state_dict`` post-hook that replaces each
ServiceProjector by :meth:`ServiceProjector.state_dict` — ints and uint8 tensors, which
``torch.load(weights_only=True)`` (the Trainer's resume) accepts — and the step pre-hook turns such
an entry back into a projector after ``load_state_dict``. A run saved at step k and resumed adopts
the same projectors at the same steps (exact and randomized without warm start; a warm start or
the lazy policy use the daemon's history, which a resume does not restore). Load with
:func:`enable` active: a stock optimizer cannot use the saved entry. The Trainer's layerwise
optims save no optimizer state at all (its LayerWiseDummyOptimizer holds none), with or without
offloadd.

Errors: ImportError when galore-torch is missing; RuntimeError when its version is not the one
tested (GALORE_TORCH_VERSION; ``check_version=False`` accepts another), or when the ranks of a job
disagree on the galore-torch or offloadd version or on enable()'s options (every rank raises,
naming the rank that differs). Refresh errors: see offloadd.galore.
"""

from __future__ import annotations

import importlib.metadata
import os
import secrets
import socket
import threading
import warnings
from typing import TYPE_CHECKING, Optional

from ._connection import ProjectorConnection
from ._projector import LocalSharing, ProjectorStats, ServiceProjector

if TYPE_CHECKING:
    import torch

GALORE_TORCH_VERSION = "1.0"  # the version whose sources this module was written against
_NAME_ATTR = "_offloadd_galore_name"
_lock = threading.Lock()
_active = None  # the Routing while enabled


def installed_galore_version() -> Optional[str]:
    """galore-torch's installed version (importlib.metadata), or None."""
    try:
        return importlib.metadata.version("galore-torch")
    except importlib.metadata.PackageNotFoundError:
        return None


def name_parameters(model: torch.nn.Module, prefix: str = "") -> None:
    """Names ``model``'s parameters for offloadd's GaLore keys (``named_parameters()``'s names).
    Call it before the first step; the Trainer does it by itself once enabled."""
    for name, p in model.named_parameters():
        try:
            setattr(p, _NAME_ATTR, prefix + name)
        except (AttributeError, TypeError):  # e.g. a tensor subclass with __slots__
            pass


class NodeSharing:
    """Who computes and who receives each refresh in a torch.distributed job (see the module).

    ``nodes``: the node index of every rank; ``leaders``: each node's lowest rank. Parameter
    ordinal n is computed on node n mod len(leaders) and broadcast from that node's leader."""

    def __init__(self, rank, nodes, broadcasting):
        self.rank = rank
        self.nodes = nodes
        self.leaders = []
        for r, node in enumerate(nodes):
            if node == len(self.leaders):
                self.leaders.append(r)
        self.broadcasting = broadcasting

    def source(self, index):
        return self.leaders[index % len(self.leaders)]

    def submits(self, index):
        if not self.broadcasting:
            return True
        return self.nodes[self.rank] == self.nodes[self.source(index)]

    def broadcast(self, p, index, shape, dtype, device):
        import torch
        import torch.distributed as dist
        src = self.source(index)
        if self.rank == src:
            buf = p.contiguous()
        else:
            buf = torch.empty(tuple(shape), dtype=dtype, device=device)
        dist.broadcast(buf, src)
        return buf


class Routing:
    """What :func:`enable` returns: ``stats`` (offloadd.galore.ProjectorStats, all projectors of
    the process), ``projectors()`` (those made so far, in order), ``job_id``, ``options``."""

    def __init__(self, options, connection):
        self.options = options
        self.connection = connection
        self.stats = ProjectorStats()
        self.job_id = None
        self.sharing = None
        self._projectors = []
        self._hook = None
        self._trainer_patch = None
        self._seen = set()  # ids of optimizers whose state_dict hook is registered

    def projectors(self):
        return list(self._projectors)

    # ---- first step: the job, the ranks, the versions ----

    def _setup_job(self):
        if self.job_id is not None:
            return
        import torch.distributed as dist
        opts = self.options
        given = opts["job_id"] or os.environ.get("OFFLOADD_JOB_ID", "")
        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            self.job_id = given or "job-" + secrets.token_hex(8)
            self.sharing = LocalSharing()
            if opts["broadcast"]:
                warnings.warn("offloadd: broadcast=True without a torch.distributed job of "
                              "several ranks: nothing to broadcast", RuntimeWarning)
            return
        rank, world = dist.get_rank(), dist.get_world_size()
        mine = {"galore": installed_galore_version(), "offloadd": _offloadd_version(),
                "options": _agreed(opts),
                "node": "%s|%s" % (socket.gethostname(),
                                   os.path.realpath(self.connection.socket_path)),
                "job": given or ("job-" + secrets.token_hex(8) if rank == 0 else "")}
        everyone = [None] * world
        dist.all_gather_object(everyone, mine)
        _check_ranks_agree(everyone)
        self.job_id = everyone[0]["job"]
        order = []
        for e in everyone:
            if e["node"] not in order:
                order.append(e["node"])
        nodes = [order.index(e["node"]) for e in everyone]
        broadcasting = opts["broadcast"] if opts["broadcast"] is not None else len(order) > 1
        self.sharing = NodeSharing(rank, nodes, bool(broadcasting))

    # ---- the step pre-hook ----

    def pre_step(self, optimizer, args, kwargs):  # noqa: ARG002 - the hook's signature
        if not isinstance(optimizer, _galore_classes()):
            return None
        self._setup_job()
        if id(optimizer) not in self._seen:
            self._seen.add(id(optimizer))
            optimizer.register_state_dict_post_hook(_save_projectors)
        for group in optimizer.param_groups:
            if "rank" not in group:
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = optimizer.state[p]
                entry = state.get("projector")
                if entry is None:
                    made = self._make(group, p)
                    if made is not None:
                        state["projector"] = made
                elif isinstance(entry, dict) and entry.get("offloadd_galore_projector"):
                    state["projector"] = self._restore(group, p, entry)
                proj = state.get("projector")
                if isinstance(proj, ServiceProjector):
                    proj.prefetch(p.grad, state.get("step", 0))
        return None

    def _make(self, group, p, parameter_id=None):
        if group.get("proj_type", "std") == "full" or p.dim() != 2:
            if group.get("proj_type") == "full":
                warnings.warn("offloadd: proj_type 'full' is not offered by the projector "
                              "service; galore-torch computes those projectors itself",
                              RuntimeWarning)
            return None
        index = len(self._projectors)
        pid = parameter_id or getattr(p, _NAME_ATTR, None) or "galore.%d.%dx%d" % (
            index, p.shape[0], p.shape[1])
        o = self.options
        proj = ServiceProjector(
            group["rank"], update_proj_gap=group["update_proj_gap"], scale=group["scale"],
            proj_type=group.get("proj_type", "std"), method=o["method"],
            oversampling=o["oversampling"], power_iterations=o["power_iterations"],
            warm_start=o["warm_start"], asynchronous=o["asynchronous"],
            adopt_after_steps=o["adopt_after_steps"], lazy=o["lazy"],
            lazy_similarity_threshold=o["lazy_similarity_threshold"], parameter_id=pid,
            job_id=self.job_id, fallback=o["fallback"], connection=self.connection,
            sharing=self.sharing, index=index, stats=self.stats, verbose=o["verbose"])
        self._projectors.append(proj)
        self.stats.projectors += 1
        return proj

    def _restore(self, group, p, entry):
        proj = self._make(group, p)
        if proj is None:
            raise RuntimeError("offloadd: a saved offloadd GaLore projector cannot be restored "
                               "for a parameter of shape %s" % (tuple(p.shape),))
        proj.load_state_dict(entry, device=p.device)
        return proj

    def close(self):
        if self._hook is not None:
            self._hook.remove()
            self._hook = None
        if self._trainer_patch is not None:
            cls, original = self._trainer_patch
            cls.create_optimizer = original
            self._trainer_patch = None


def _save_projectors(optimizer, state_dict):  # noqa: ARG001 - torch's hook signature
    """state_dict post-hook: ServiceProjectors as plain data (shallow copies; the live state
    keeps its projectors)."""
    states = state_dict.get("state", {})
    for key, value in list(states.items()):
        if isinstance(value, dict) and isinstance(value.get("projector"), ServiceProjector):
            copy = dict(value)
            copy["projector"] = value["projector"].state_dict()
            states[key] = copy
    return state_dict


def _galore_classes():
    import galore_torch
    return (galore_torch.GaLoreAdamW, galore_torch.GaLoreAdafactor, galore_torch.GaLoreAdamW8bit)


def _offloadd_version():
    try:
        return importlib.metadata.version("offloadd")
    except importlib.metadata.PackageNotFoundError:
        return "source"


_AGREED = ("asynchronous", "adopt_after_steps", "method", "oversampling", "power_iterations",
           "warm_start", "lazy", "lazy_similarity_threshold", "broadcast", "fallback")


def _agreed(options):
    return {k: options[k] for k in _AGREED}


def _check_ranks_agree(everyone):
    first = everyone[0]
    for rank, e in enumerate(everyone):
        for what in ("galore", "offloadd", "options"):
            if e[what] != first[what]:
                raise RuntimeError(
                    "offloadd.galore: the ranks of this job disagree: rank %d has %s %r, rank 0 "
                    "has %r; every rank must run the same galore-torch (tested: %s) and offloadd "
                    "and call offloadd.galore.enable() with the same options" % (
                        rank, {"galore": "galore-torch", "offloadd": "offloadd",
                               "options": "enable() options"}[what], e[what], first[what],
                        GALORE_TORCH_VERSION))


def _patch_trainer(routing):
    """Wraps transformers.Trainer.create_optimizer to name the model's parameters first."""
    try:
        import transformers
    except ImportError:
        return
    cls = transformers.Trainer
    original = cls.create_optimizer

    def create_optimizer(self, *args, **kwargs):
        if getattr(self, "model", None) is not None:
            name_parameters(self.model)
        return original(self, *args, **kwargs)
    create_optimizer.__wrapped__ = original
    cls.create_optimizer = create_optimizer
    routing._trainer_patch = (cls, original)


def enable(*, socket_path: Optional[str] = None, asynchronous: bool = False,
           adopt_after_steps: Optional[int] = None, method: str = "exact",
           oversampling: Optional[int] = None, power_iterations: Optional[int] = None,
           warm_start: bool = False, lazy: bool = False,
           lazy_similarity_threshold: Optional[float] = None, fallback: str = "local",
           broadcast: Optional[bool] = None, job_id: Optional[str] = None,
           model: Optional[torch.nn.Module] = None, check_version: bool = True,
           timeout_seconds: float = 600.0, verbose: bool = False) -> Routing:
    """Routes every GaLore projector of galore-torch's GaLoreAdamW, GaLoreAdamW8bit and
    GaLoreAdafactor — the Transformers Trainer's ``optim="galore_*"`` and ``"galore_*_layerwise"``
    included — through the offloadd daemon. Call it once, before the optimizer's first step.

    Args:
      socket_path: the daemon's socket (default offloadd.socket_path.default_socket_path()).
      asynchronous, adopt_after_steps: the staleness rule (offloadd.galore); default synchronous,
        the stock semantics.
      method: "exact" (LAPACK sgesdd, the stock result up to signs and rounding) or "randomized"
        (with oversampling, power_iterations, warm_start).
      lazy, lazy_similarity_threshold: let the daemon skip refreshes of a stable subspace.
      fallback: "local" (default): a synchronous refresh no daemon answers is computed in process
        with torch.linalg.svd, warned once and counted; "error": raise DaemonUnavailable.
      broadcast: None (default: only across nodes), True or False; see the module.
      job_id: the daemon's job key (default drawn by rank 0; $OFFLOADD_JOB_ID).
      model: a module whose parameter names become the parameter ids (the Trainer's are named
        automatically).
      check_version: refuse a galore-torch other than GALORE_TORCH_VERSION.
      timeout_seconds: the deadline of each daemon call.
    Returns the process's :class:`Routing` (``.stats``). A second call replaces the first's
    options (projectors already made keep theirs).
    Raises ImportError (no galore-torch), RuntimeError (version), ValueError (bad option).
    """
    import torch.optim.optimizer as topt
    global _active
    version = installed_galore_version()
    if version is None:
        raise ImportError("offloadd.galore.enable needs galore-torch: pip install "
                          "'offloadd[galore]' (galore-torch==%s)" % GALORE_TORCH_VERSION)
    if check_version and version != GALORE_TORCH_VERSION:
        raise RuntimeError(
            "offloadd.galore.enable was written against galore-torch %s; this process has %s. "
            "Install galore-torch==%s, or pass check_version=False to try this one" % (
                GALORE_TORCH_VERSION, version, GALORE_TORCH_VERSION))
    if method not in ("exact", "randomized"):
        raise ValueError("method must be 'exact' or 'randomized', not %r" % (method,))
    if fallback not in ("local", "error"):
        raise ValueError("fallback must be 'local' or 'error', not %r" % (fallback,))
    if adopt_after_steps is not None and int(adopt_after_steps) < 1:
        raise ValueError("adopt_after_steps must be >= 1 (steps after the refresh step)")
    options = dict(asynchronous=bool(asynchronous), adopt_after_steps=adopt_after_steps,
                   method=method, oversampling=oversampling, power_iterations=power_iterations,
                   warm_start=bool(warm_start), lazy=bool(lazy),
                   lazy_similarity_threshold=lazy_similarity_threshold, fallback=fallback,
                   broadcast=broadcast, job_id=job_id, verbose=verbose)
    connection = ProjectorConnection(socket_path, timeout_seconds)
    _galore_classes()  # imports galore_torch (and bitsandbytes) now, not inside a step
    with _lock:
        if _active is not None:
            _active.close()
        routing = Routing(options, connection)
        routing._hook = topt.register_optimizer_step_pre_hook(routing.pre_step)
        _patch_trainer(routing)
        _active = routing
    if model is not None:
        name_parameters(model)
    return routing


def disable() -> None:
    """Removes the hooks :func:`enable` installed. Projectors already in optimizer states keep
    working (and saving); new ones are galore-torch's own again."""
    global _active
    with _lock:
        if _active is not None:
            _active.close()
            _active = None


def active() -> Optional[Routing]:
    """The current Routing, or None."""
    return _active
