"""``offloadd.torch.enable()``: torch's own offload entry points go through offloadd.

torch offers one activation-offload context, ``torch.autograd.graph.save_on_cpu``, reachable
through two names:

* ``torch.autograd.graph.save_on_cpu``, looked up at call time by code that writes
  ``torch.autograd.graph.save_on_cpu(...)``;
* ``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.save_on_cpu``, bound when that
  module is imported and used by its ``offload_wrapper`` (``OffloadWrapper.forward``); accelerate's
  FSDP2 ``activation_checkpointing_offload`` wraps each checkpointed layer with that
  ``offload_wrapper``.

:func:`enable` points both names at :class:`offloadd.torch.save_on_cpu`. A module that bound
torch's class under a name of its own before :func:`enable` ran (``from torch.autograd.graph import
save_on_cpu``) still holds torch's class: while enabled, constructing it warns (RuntimeWarning,
once per calling line) naming the caller, as its saved tensors do not reach offloadd.
"""

from __future__ import annotations

import sys
import threading
import warnings
from typing import Any

import torch

from .. import _devices
from ._hooks import default_context, offload_checkpoints, save_on_cpu

_CHECKPOINT_WRAPPER = "torch.distributed.algorithms._checkpoint.checkpoint_wrapper"

_lock = threading.Lock()
_saved = []     # [(module, attribute name, previous value)] that enable() replaced
_original = {}  # "init": torch's save_on_cpu.__init__ while the warning wrapper is installed
_warned = set()  # (filename, line) of callers already warned about


def _bindings():
    """The modules whose ``save_on_cpu`` attribute enable() replaces, in order."""
    import torch.autograd.graph as graph
    modules = [graph]
    if torch.distributed.is_available():
        import importlib
        modules.append(importlib.import_module(_CHECKPOINT_WRAPPER))
    return modules


def _torch_save_on_cpu():
    """torch's own save_on_cpu class (also while enable() has replaced the public name)."""
    for module, _, previous in _saved:
        if module.__name__ == "torch.autograd.graph":
            return previous
    return torch.autograd.graph.save_on_cpu


def _caller(depth):
    """(filename, line, "module.function") of the frame ``depth`` levels above the caller."""
    frame = sys._getframe(depth + 1)
    name = "%s.%s" % (frame.f_globals.get("__name__", "?"), frame.f_code.co_name)
    return frame.f_code.co_filename, frame.f_lineno, name


def _warning_init(self, *args, **kwargs):
    """torch's save_on_cpu.__init__ with a warning naming its caller (once per line)."""
    filename, line, name = _caller(1)
    key = (filename, line)
    if key not in _warned:
        _warned.add(key)
        warnings.warn(
            "offloadd: torch.autograd.graph.save_on_cpu was used by %s (%s:%d) after "
            "offloadd.torch.enable(); its saved tensors do not go through offloadd, because "
            "that code bound torch's class under its own name. Call offloadd.torch.enable() "
            "(offloadd.transformers.enable() for Transformers) before importing it, or use "
            "offloadd.torch.save_on_cpu there" % (name, filename, line),
            RuntimeWarning, stacklevel=2)   # points at the caller
    _original["init"](self, *args, **kwargs)


def enable(**context_args: Any) -> offload_checkpoints:
    """Routes torch's offload entry points through offloadd (see the module).

    Args:
      context_args: optional :class:`offloadd.torch.offload_checkpoints` arguments for the
        process's shared context (``keep_last_n``, ``prefetch``, ``threshold_bytes``,
        ``strict``, ``socket_path``, ...); without any, the current default context is kept.
    Returns the shared context (``.stats`` for its statistics).
    Raises offloadd.errors.OffloadConfigError when training on CUDA (or a simulated GPU) with an
    allocator whose memory offloadd cannot export (expandable segments, cudaMallocAsync).
    Idempotent: a second call only reconfigures the context. Call it before the first forward.
    """
    if _devices.uses_cuda_allocator():
        from offloadd import cuda
        cuda.check_allocator_config()
    with _lock:
        if not _saved:
            for module in _bindings():
                _saved.append((module, "save_on_cpu", module.save_on_cpu))
                module.save_on_cpu = save_on_cpu
            cls = _torch_save_on_cpu()
            if "init" not in _original and isinstance(cls, type) and \
                    "__init__" in cls.__dict__:
                _original["init"] = cls.__dict__["__init__"]
                cls.__init__ = _warning_init
    return default_context(**context_args)


def disable() -> None:
    """Puts back every name :func:`enable` replaced and torch's class as it was (no-op when not
    enabled). Contexts already entered keep going through offloadd until they are left."""
    with _lock:
        cls = _torch_save_on_cpu()
        while _saved:
            module, attr, previous = _saved.pop()
            setattr(module, attr, previous)
        if "init" in _original:
            cls.__init__ = _original.pop("init")


def enabled() -> bool:
    """True while torch's offload entry points go through offloadd."""
    return bool(_saved)
