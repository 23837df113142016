"""PyTorch integration of offloadd: saved tensors of training go to the node's daemon.

* :class:`offload_checkpoints` -- context manager on ``torch.autograd.graph.saved_tensors_hooks``:
  saved tensors >= ``threshold_bytes`` (default 1 MiB) are offloaded in the pack hook and reloaded
  in the unpack hook, with keep_last_n, reverse-order prefetch, fallback and statistics.
* :class:`save_on_cpu` -- the signature of ``torch.autograd.graph.save_on_cpu`` (pin_memory,
  device_type), routed through the daemon (a drop-in for Hugging Face Transformers'
  ``gradient_checkpointing_enable(offload=True)``: see client/python/README.md).
* :func:`checkpoint` -- drop-in for ``torch.utils.checkpoint.checkpoint`` that offloads the
  layer input itself (torch's checkpoint inside the context's hooks).
* :func:`enable` / :func:`disable` / :func:`enabled` -- torch's own offload entry points
  (``torch.autograd.graph.save_on_cpu`` and the ``save_on_cpu`` that torch.distributed's
  ``offload_wrapper`` uses, which accelerate's FSDP2 activation offload calls) go through
  offloadd; torch's class constructed through another name warns, naming the caller.
* :mod:`offloadd.torch.compiled` -- ``backend()``: a ``torch.compile`` backend that offloads
  inside the compiled graph (the contexts above step aside while Dynamo traces); imported on use.
* :class:`OffloadStats`, :func:`default_context`, :func:`fallbacks_total`,
  :func:`idle_steps_total`, :func:`synchronize` (wait for every request sent so far),
  :func:`close`.

Supported torch: 2.4 <= version < 3 (tested: 2.15.0, client/python/requirements.lock); importing
this module under another torch, or with no torch installed, raises ImportError naming the range
and how to install it. Hugging Face Transformers
(>= 5.17, tested 5.24.0): see :mod:`offloadd.transformers`.

CPU tensors are staged through POSIX shared memory (daemon backend "shm"); CUDA tensors are
exported through the CUDA runtime (IPC handle of the allocation base + offset, interprocess
events) on a "cuda" daemon, or staged through shared memory on a "shm" one.
"""

try:
    import torch as _torch
except ModuleNotFoundError as _missing:
    if _missing.name != "torch":
        raise
    raise ImportError(
        "offloadd.torch needs PyTorch, which this Python does not have: install torch >= 2.4 "
        "and < 3 (pip install 'offloadd[torch]', or pip install 'torch>=2.4,<3'), or use "
        "offloadd.client directly without the PyTorch hooks.", name="torch") from None

SUPPORTED_TORCH = ((2, 4), (3, 0))  # [lowest, first unsupported): saved-tensor hooks as tested


def _check_torch_version(version):
    """Raises ImportError unless ``version`` (a torch.__version__ string) is supported."""
    try:
        parts = tuple(int(p) for p in version.split("+")[0].split(".")[:2])
    except ValueError:
        parts = None
    lo, hi = SUPPORTED_TORCH
    if parts is None or not lo <= parts < hi:
        raise ImportError(
            "offloadd.torch supports torch >= %d.%d and < %d.%d; this process has torch %s. "
            "Install a supported torch (tested: 2.15.0; pip install 'torch>=2.4,<3') or use "
            "offloadd.client directly without the PyTorch hooks." % (lo + hi + (version,)))


_check_torch_version(_torch.__version__)

from ._checkpoint import checkpoint  # noqa: E402
from ._enable import disable, enable, enabled  # noqa: E402
from ._endpoint import close_all as close  # noqa: E402
from ._endpoint import fallbacks_total, idle_steps_total, synchronize  # noqa: E402
from ._hooks import default_context, offload_checkpoints, save_on_cpu  # noqa: E402
from ._stats import OffloadStats  # noqa: E402

__all__ = ["offload_checkpoints", "save_on_cpu", "checkpoint", "OffloadStats",
           "default_context", "fallbacks_total", "idle_steps_total", "synchronize", "close",
           "enable", "disable", "enabled", "SUPPORTED_TORCH"]
