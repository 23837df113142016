"""Hugging Face Transformers integration: checkpoint offload through offloadd in one line.

Transformers (>= 5.17; tested 5.24.0) offloads checkpointed layer inputs when asked with
``model.activation_checkpointing_enable(offload=True)`` (``gradient_checkpointing_enable``, its
deprecated alias until Transformers 6, takes the same argument), or through the Trainer with
``TrainingArguments(activation_checkpointing=True,
activation_checkpointing_kwargs={"offload": True})`` (``gradient_checkpointing`` /
``gradient_checkpointing_kwargs``: the deprecated names of the same arguments). Either way each checkpointed layer call runs
inside ``transformers.modeling_utils.save_on_cpu(pin_memory=True, device_type=...)``, which is
``torch.autograd.graph.save_on_cpu``: a device-to-host and a host-to-device copy on the compute
stream, no prefetch. :func:`enable` swaps that name for :class:`offloadd.torch.save_on_cpu`, so
the same layer inputs go to the node's offloadd daemon instead (asynchronous offload,
reverse-order prefetch, one shared pinned pool per node); it calls :func:`offloadd.torch.enable`
first, so torch's own entry points (``torch.autograd.graph.save_on_cpu``, torch.distributed's
``offload_wrapper``, which accelerate's FSDP2 activation offload uses) go there too::

    import offloadd.transformers
    offloadd.transformers.enable(strict=True)      # before the first forward; strict: raise
    model.activation_checkpointing_enable(offload=True)  # on a refusal (production)

Every ``transformers.Trainer`` made after :func:`enable` logs offloadd's figures with the loss
(``offloadd/offloaded_gib``, ``offloadd/reloads_in_time``, ``offloadd/reloads_waited``,
``offloadd/host_wait_seconds``, ``offloadd/fallbacks``, GaLore refreshes while
``offloadd.galore.enable()`` routes them), so they reach TensorBoard or W&B, and ends training
with one "offloadd: training summary" line; ``enable(trainer_callback=False)`` leaves the
Trainer's callbacks alone.

Only the names Transformers and torch look up at call time change, and the Trainer's default
callbacks gain offloadd's; models, the Trainer and torch are not patched otherwise. On a host
without an accelerator Transformers calls torch's ``save_on_cpu(pin_memory=True,
device_type="cpu")``, which fails: torch asks ``torch.cpu.is_available()`` (true), allocates
pinned host memory for the first saved tensor and raises a RuntimeError in forward ("Found no
NVIDIA driver on your system" with torch 2.15.0's CUDA build; with its default
``device_type="cuda"`` torch's class copies unpinned there instead). offloadd's pins only where
CUDA is available, so the same code runs on CPU-only test machines.
"""

from __future__ import annotations

import sys
import threading
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from offloadd.torch import offload_checkpoints

_lock = threading.Lock()
_saved = []  # the save_on_cpu that enable() replaced (empty when not enabled)


def enable(*, trainer_callback: bool = True, **context_args: Any) -> offload_checkpoints:
    """Routes Transformers' checkpoint offload through offloadd.

    Args:
      trainer_callback: add offloadd's figures to the logs of every ``transformers.Trainer``
        made from now on (offloaded GiB, reloads in time / waited, host-wait seconds,
        fallbacks, GaLore refreshes; a summary line at the end of training: see
        offloadd._trainer_log). False removes the callback again.
      context_args: optional :class:`offloadd.torch.offload_checkpoints` arguments for the
        process's shared context (``keep_last_n``, ``prefetch``, ``threshold_bytes``,
        ``strict``, ``socket_path``, ...); without any, the current default context is kept.
    Returns the shared context (``.stats`` for its statistics).
    Raises ImportError when transformers is missing or older than 5.17 (no offload switch), or
    when torch is outside offloadd.torch's supported range; offloadd.errors.OffloadConfigError
    when training on CUDA (or a simulated GPU) with an allocator whose memory offloadd cannot
    export (expandable segments, cudaMallocAsync: docs/pytorch.md "Troubleshooting"), which is also
    checked at every offload, as the setting can change at run time. Idempotent: a second call
    only reconfigures the context.
    """
    import transformers
    import transformers.modeling_utils as mu

    import offloadd.torch as ot
    version = tuple(int(p) for p in transformers.__version__.split(".")[:2] if p.isdigit())
    if version < (5, 17) or not hasattr(mu, "save_on_cpu"):
        raise ImportError("offloadd.transformers needs transformers >= 5.17 (checkpoint offload "
                          "through modeling_utils.save_on_cpu); this process has %s"
                          % transformers.__version__)
    from offloadd import _trainer_log
    context = ot.enable(**context_args)   # torch's own names, and the allocator check
    with _lock:
        if not _saved:
            _saved.append(mu.save_on_cpu)
        mu.save_on_cpu = ot.save_on_cpu
        _trainer_log.install(bool(trainer_callback))
    return context


def disable() -> None:
    """Puts back the ``save_on_cpu`` that :func:`enable` replaced, and torch's names
    (:func:`offloadd.torch.disable`); a no-op when not enabled."""
    import transformers.modeling_utils as mu

    import offloadd.torch as ot
    with _lock:
        if _saved:
            mu.save_on_cpu = _saved.pop()
        if "offloadd._trainer_log" in sys.modules:
            sys.modules["offloadd._trainer_log"].install(False)
    ot.disable()


def enabled() -> bool:
    """True while Transformers' checkpoint offload goes through offloadd."""
    return bool(_saved)
