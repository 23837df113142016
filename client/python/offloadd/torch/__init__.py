"""PyTorch integration of offloadd: saved tensors of training go to the node's daemon.

* :class:`offload_checkpoints` -- context manager on ``torch.autograd.graph.saved_tensors_hooks``:
  saved tensors >= ``threshold_bytes`` (default 1 MiB) are offloaded in the pack hook and reloaded
  in the unpack hook, with keep_last_n, reverse-order prefetch, fallback and statistics.
* :class:`save_on_cpu` -- the signature of ``torch.autograd.graph.save_on_cpu`` (pin_memory,
  device_type), routed through the daemon (a drop-in for Hugging Face Transformers'
  ``gradient_checkpointing_enable(offload=True)``: see client/python/README.md).
* :func:`checkpoint` -- drop-in for ``torch.utils.checkpoint.checkpoint`` that offloads the
  layer input itself, with non-reentrant semantics on every torch version from 1.13 on.
* :class:`OffloadStats`, :func:`default_context`, :func:`fallbacks_total`, :func:`synchronize`
  (wait for every request sent so far), :func:`close`.

CPU tensors are staged through POSIX shared memory (daemon backend "shm"); CUDA tensors are
exported through the CUDA runtime (IPC handle of the allocation base + offset, interprocess
events) on a "cuda" daemon, or staged through shared memory on a "shm" one.
"""

from ._checkpoint import checkpoint
from ._endpoint import close_all as close
from ._endpoint import fallbacks_total, synchronize
from ._hooks import default_context, offload_checkpoints, save_on_cpu
from ._stats import OffloadStats

__all__ = ["offload_checkpoints", "save_on_cpu", "checkpoint", "OffloadStats",
           "default_context", "fallbacks_total", "synchronize", "close"]
