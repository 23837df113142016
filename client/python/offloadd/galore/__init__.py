"""GaLore projector refreshes computed by the offloadd daemon (proto/projector.proto).

One line for galore-torch users (:func:`enable`, in ``offloadd/galore/_optim.py``)::

    import offloadd.galore
    offloadd.galore.enable()          # before the optimizer's first step
    # GaLoreAdamW / GaLoreAdamW8bit / GaLoreAdafactor, or TrainingArguments(optim="galore_*")

:class:`ServiceProjector` offers the interface of the reference GaLore projector
(``GaLoreProjector`` in galore-torch 1.0, galore_torch/galore_projector.py; Zhao et al. 2024,
shared/reference/galore-paper.txt, Alg. 1): ``project(full_rank_grad, iter)`` returns the low-rank
gradient and refreshes the projection when ``iter % update_proj_gap == 0`` (and at the first
call); ``project_back(low_rank_grad)`` maps a low-rank update back to full rank, times ``scale``.
The top-r SVD runs in the daemon (LAPACK on its host CPU, fp32 whatever the gradient's dtype;
cuSOLVER on the gradient's GPU with ``projector { backend: "cusolver" }``) instead of
``torch.linalg.svd`` inside the optimizer step.

Sides (``proj_type``): "std" projects the smaller side (m >= n: right vectors, else left),
"reverse_std" the larger one, "left"/"right" a fixed one; "full" is not offered.

Layout: ``ortho_matrix`` is what the reference keeps: ``U[:, :r]`` (m x r) on the left side and
``Vh[:r, :]`` (r x n) on the right side, in the gradient's dtype and on its device. The daemon
writes P as side_dim x r row-major (for the right side ``Vh[:r, :].T``); this module transposes.
Singular vectors carry arbitrary signs in the reference and here alike; ``project_back(project(G))``
does not depend on them, but Adam's moments are kept across a refresh, so after the second
refresh results depend on the signs: they are close to the stock optimizer's, not bitwise equal.

Modes:
  * synchronous (default): a refresh step waits for its projector — the reference's semantics.
  * ``asynchronous=True``: the staleness rule. A refresh due at step s (s % gap == 0) while a
    projector is in use is submitted at s and adopted at step ``s + k``, k = ``adopt_after_steps``
    (default ``max(1, gap // 2)``, at most gap); steps s .. s+k-1 project with the previous
    projector, and at step s+k ``project`` waits for the result if it has not arrived (the only
    wait). The adopted step depends on the step count only, never on timing, so every
    data-parallel rank adopts the same projector at the same step. The first refresh of a
    parameter always waits (there is nothing to use yet).
  * ``method="randomized"`` (Halko-Martinsson-Tropp range finder; ``oversampling``,
    ``power_iterations``, ``warm_start``) instead of the exact SVD.
  * ``lazy=True``: the daemon may skip a refresh while this parameter's consecutive projectors
    stay similar (server/projector/lazy_policy.h); the current projector is then kept.

Data path: on the shm daemon G is copied into a POSIX shared-memory object this projector owns
and P comes back through it. On a cuda daemon (``cuda_regions`` in its projector stats) a CUDA
gradient is copied device-to-device into a buffer this projector allocates once, exported by CUDA
IPC handle (offloadd.cuda: the allocation base plus an offset), and P is written back into that
buffer by the daemon: no host staging on the training thread. A gradient of another dtype than
fp32/bf16/fp16 (e.g. fp64) is sent as fp32 and P is cast back.

Errors: INVALID_ARGUMENT from the daemon (NaN/Inf in G, naming the first bad row; a 1-D gradient)
raises :class:`offloadd.errors.OffloaddError` naming the parameter. When the daemon cannot be
reached (:class:`~offloadd.errors.DaemonUnavailable`, or a deadline): synchronous mode with
``fallback="local"`` computes that refresh in process with ``torch.linalg.svd`` (the reference's
own computation; warned once, counted in ``stats.local_fallbacks``), with ``fallback="error"``
raises; asynchronous mode keeps the current projector (``stats.kept_stale``). An all-zero
gradient keeps the current projector (the daemon reports it degenerate); with none yet, the first
r columns of the identity are used.

Results: after each adopted refresh ``last_result`` holds the daemon's RefreshResult (singular
values, captured energy, residual ratio, orthogonality error after the dtype cast, similarity to
the previous projector, deduplicated, timings).

Modules: ``_connection`` (the Projector service's channel), ``_projector`` (ServiceProjector, its
statistics and staging), ``_optim`` (enable(): galore-torch's optimizers). Importing this package
needs neither torch nor galore-torch.
"""

from ._connection import ProjectorConnection, pb, shared_connection
from ._optim import disable, enable, name_parameters
from ._projector import (ALIGN_BYTES, STATE_FORMAT, LocalSharing, ProjectorStats,
                         ServiceProjector, _TEST_HOOKS, cuda_region_fields)

__all__ = ["ServiceProjector", "ProjectorConnection", "ProjectorStats", "LocalSharing",
           "shared_connection", "cuda_region_fields", "enable", "disable", "name_parameters",
           "ALIGN_BYTES", "STATE_FORMAT"]
