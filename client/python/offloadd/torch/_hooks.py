"""Saved-tensor hook contexts: ``offload_checkpoints`` and the drop-in ``save_on_cpu``.

Both are ``torch.autograd.graph.saved_tensors_hooks`` subclasses (PyTorch >= 1.10): inside the
``with`` block every tensor autograd saves for backward goes through ``pack_hook``; backward calls
``unpack_hook`` (also after the block is left). Call backward outside the block: a backward that
recomputes (reentrant checkpointing) inside it would send the recomputed tensors through the hooks
too.

What reaches the hooks: on torch >= 2.4 (the supported range) both reentrant and non-reentrant
``torch.utils.checkpoint.checkpoint`` save each layer's input as an ordinary saved tensor, which
these hooks see; the tensors inside a checkpointed layer go to checkpoint's own inner hooks.

Under ``torch.compile``: while Dynamo traces (``torch.compiler.is_compiling()``), making and
entering these contexts does nothing -- no hook is pushed, the shared context's lock is not
taken -- so they add no graph break of their own and the compiled graph is the one checkpointing
alone gives. Tensors saved inside a compiled region are then kept by the compiled graph, not
offloaded; a context entered in eager code (outside any compiled region) still offloads, also
the tensors a compiled region called inside it saves for backward (torch defers saved-tensor
hooks to run time). To offload inside compiled graphs, compile with
``offloadd.torch.compiled.backend``. docs/compiled-graphs.md has the details.
"""

from __future__ import annotations

import atexit
import threading
from typing import Any, Optional

import torch

from ._live import finish_steps
from ._stats import OffloadStats
from ._store import Store


def _log_at_exit(store):
    """Counts the last step first (its idle-step check, which the package's own exit handler
    would run only after this one: handlers run last registered first), then logs."""
    finish_steps()
    store.stats.log()


def _tracing():
    """True while Dynamo traces the calling code (torch.compile): the contexts step aside."""
    return torch.compiler.is_compiling()


_DEFAULT_MIN_BYTES = 1 << 20  # 1 MiB: smaller tensors are not worth a round trip


class offload_checkpoints(torch.autograd.graph.saved_tensors_hooks):
    """Context manager: saved tensors of at least ``threshold_bytes`` go to the offloadd daemon.

    Args:
      threshold_bytes: int bytes (numel * element_size); smaller saved tensors stay in place.
      keep_last_n: the newest n eligible tensors stay on their device (backward needs them
        first); older ones are offloaded asynchronously as newer ones are saved.
      prefetch: how many offloaded tensors before the one being unpacked to reload ahead
        (backward runs in reverse order of saving), as PREFETCH; 0 disables.
      strict: raise OffloaddError instead of falling back when the daemon is unreachable or
        refuses.
      socket_path: daemon socket (default: $OFFLOADD_SOCKET or the default rule).
      pin_memory: pinned host memory for CUDA tensors kept in-process on fallback.
      name: label of the statistics (``stats``) and of their exit log line.
      log_stats_at_exit: write ``stats.summary()`` to stderr when the process exits.
      retry_seconds: after the daemon was unreachable, do not try it again for this long; after
        it refused an offload with RESOURCE_EXHAUSTED (pool or quota full past its admission
        deadline), send it no offload for this long either (tensors fall back at once, counted
        as fallbacks with that reason), then offload again.
      connect_timeout_seconds: one connect + Hello.
      unresponsive_seconds: float > 0 (20). A reload backward waits for gets no answer from
        the daemon for this long: the session is given up -- tensors whose offload the daemon
        never confirmed come back from the client's copy, others raise DaemonUnresponsive
        (an OffloaddError, DEADLINE_EXCEEDED). The packs of one step wait at most this long in
        all for a daemon that does not answer; then the step keeps the rest in process (one
        warning). A daemon that answers again within it costs only the wait.
      store: share another context's engine (ordering, keep_last_n, stats) instead of a new one.
      (``_small_to_host``, keyword only, is the store's save_on_cpu policy: not for callers.)
    Parameters (and views of them), other leaves that require grad, views of a tensor already
    offloaded and non-dense or non-CPU/CUDA tensors stay in place. The object may be entered
    again for every step; statistics accumulate (``stats.reset()`` clears them).
    """

    def __init__(self, threshold_bytes: int = _DEFAULT_MIN_BYTES, keep_last_n: int = 1,
                 prefetch: int = 1, strict: bool = False, socket_path: Optional[str] = None,
                 pin_memory: bool = True, name: str = "", log_stats_at_exit: bool = False,
                 retry_seconds: float = 30.0, connect_timeout_seconds: float = 5.0,
                 store: Optional[Store] = None, unresponsive_seconds: float = 20.0, *,
                 _small_to_host: bool = False) -> None:
        self._pushed = []   # per __enter__: whether it pushed the hooks (not while tracing)
        self.store = store or Store(name, threshold_bytes, keep_last_n, prefetch, strict,
                                    socket_path, pin_memory, _small_to_host, retry_seconds,
                                    connect_timeout_seconds, unresponsive_seconds)
        pair = getattr(self.store, "hook_pair", None)  # a store without one: its methods
        super().__init__(*(pair() if pair is not None else (self.store.pack, self.store.unpack)))
        if log_stats_at_exit:
            atexit.register(_log_at_exit, self.store)

    def __enter__(self) -> "offload_checkpoints":
        if _tracing():
            return self   # step aside: see the module's "Under torch.compile"
        super().__enter__()
        self._pushed.append(True)
        return self

    def __exit__(self, *exc_info: Any) -> None:
        if _tracing() or not self._pushed:
            return None
        self._pushed.pop()
        return super().__exit__(*exc_info)

    @property
    def stats(self) -> OffloadStats:
        """The live :class:`~offloadd.torch.OffloadStats` of this context (``.snapshot()`` for a
        copy, ``.as_dict()``, ``.summary()``)."""
        return self.store.stats


_default_lock = threading.Lock()
_default = [None]


def default_context(**overrides: Any) -> offload_checkpoints:
    """The process-wide context shared by ``save_on_cpu`` and ``checkpoint`` when no context is
    given. The first call may pass ``offload_checkpoints`` arguments (``configure``); later calls
    with arguments replace it (statistics start again)."""
    with _default_lock:
        if _default[0] is None or overrides:
            overrides.setdefault("name", "default")
            _default[0] = offload_checkpoints(**overrides)
        return _default[0]


class save_on_cpu(offload_checkpoints):
    """Drop-in for ``torch.autograd.graph.save_on_cpu(pin_memory=False, device_type="cuda")``
    that routes saved tensors through the offloadd daemon.

    Same signature and the same effect on the device: every saved tensor leaves it. Tensors of
    at least 1 MiB go to the daemon; smaller CUDA tensors are copied to host memory in-process
    (pinned when ``pin_memory`` and CUDA is available), as torch's version does; CPU tensors
    below 1 MiB and parameters stay in place. ``device_type`` is accepted for compatibility
    (torch 2.x uses it to decide whether pinning is possible; here pinning needs CUDA).

    All instances share the process's default context (:func:`default_context`), so code that
    creates one per layer call -- Hugging Face Transformers'
    ``gradient_checkpointing_enable(offload=True)`` wraps every checkpointed layer in a new
    ``save_on_cpu(pin_memory=True, device_type=...)`` -- still gets one ordering, keep_last_n and
    prefetch across layers, and one set of statistics (``save_on_cpu.stats()``)::

        import offloadd.torch, transformers.modeling_utils
        transformers.modeling_utils.save_on_cpu = offloadd.torch.save_on_cpu
        model.gradient_checkpointing_enable(offload=True)
    """

    def __init__(self, pin_memory: bool = False, device_type: str = "cuda") -> None:
        self.device_type = device_type
        self._pin = bool(pin_memory)
        if _tracing():   # step aside under Dynamo (no lock, no store): __enter__ is a no-op too
            self._pushed, self.store = [], None
            return
        shared = default_context().store
        super().__init__(store=_PinView(shared, self._pin))

    @staticmethod
    def stats() -> OffloadStats:  # type: ignore[override]
        """Statistics of the shared default context."""
        return default_context().stats


class _PinView:
    """The shared store with this instance's pin_memory and save_on_cpu's small-tensor policy."""

    def __init__(self, store, pin):
        self._store, self._pin = store, pin
        self.stats = store.stats

    def pack(self, t):
        return self._store.pack(t, small_to_host=True, pin_memory=self._pin)

    def unpack(self, packed):
        return self._store.unpack(packed)

    def hook_pair(self):
        return self._store.hook_pair(small_to_host=True, pin_memory=self._pin)
