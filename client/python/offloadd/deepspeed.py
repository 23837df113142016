"""``offloadd.deepspeed.enable()``: DeepSpeed's ``cpu_checkpointing`` goes through offloadd.

DeepSpeed's activation checkpointing (``deepspeed.checkpointing.checkpoint``, configured by the
``"activation_checkpointing"`` section of the DeepSpeed config or
``deepspeed.checkpointing.configure(..., checkpoint_in_cpu=True)``) keeps each checkpoint's
inputs as attributes of its autograd function, not through saved-tensor hooks, so no
saved-tensor-hooks context (offloadd's or torch's ``save_on_cpu``) ever sees them. With
``cpu_checkpointing`` on and ``partition_activations`` off, DeepSpeed (0.19.8) asks
``deepspeed.runtime.activation_checkpointing.checkpointing._get_cpu_offload_engine()`` at each
checkpointed forward for an engine with ``offload_input(tensor) -> token or None`` (forward)
and ``restore_input(token) -> tensor`` (backward, once per token) and ``reset()``. :func:`enable`
replaces that function with one returning an engine that sends the inputs to the node's daemon
through offloadd's shared context (:func:`offloadd.torch.default_context`): the same threshold,
keep_last_n, reverse-order prefetch, fallback and statistics as offloadd's saved-tensor hooks.
On a CPU-only host DeepSpeed itself never offloads (its engine needs a side stream); through
offloadd it does, which is what the tests run.

With ``partition_activations`` on, DeepSpeed partitions and copies the inputs itself and
offloadd is not asked (enable() then warns once per process at the first such checkpoint).
"""

import threading
import warnings

_MODULE = "deepspeed.runtime.activation_checkpointing.checkpointing"
_lock = threading.Lock()
_saved = []        # [(module, previous _get_cpu_offload_engine)] while enabled
_engine = []       # the one _Engine while enabled
_warned = []       # [True] once the partition_activations warning was given


class _Engine:
    """DeepSpeed's cpu-offload engine interface over an offloadd context's pack/unpack hooks.

    ``offload_input(tensor)``: tensor (any dtype/shape, CPU or CUDA) -> int token; the context
    keeps what its pack hook returned (a handle for an offloaded tensor, the tensor itself for one
    it leaves in place). ``restore_input(token)``: the tensor, bitwise as given, on its device;
    KeyError for a token never given or already restored.
    """

    def __init__(self, context):
        self.context = context
        self._packed = {}
        self._next = 0
        self._lock = threading.Lock()

    def offload_input(self, tensor):
        """Saves ``tensor`` (any shape and dtype) through the context's pack hook; returns an
        int token for :meth:`restore_input`. Raises what the pack hook raises (the strict
        context's OffloaddError; otherwise a tensor offloadd cannot take stays in process)."""
        packed = self.context.pack_hook(tensor)
        with self._lock:
            token = self._next
            self._next += 1
            self._packed[token] = packed
        return token

    def restore_input(self, token):
        """The tensor saved under ``token`` (same shape, strides, dtype and device, bitwise
        equal), through the context's unpack hook; once per token: KeyError for a token
        restored already, reset or never given."""
        with self._lock:
            packed = self._packed.pop(token)
        return self.context.unpack_hook(packed)

    def reset(self):
        """Forgets every input not restored (DeepSpeed calls it after forwards without
        backward); the daemon frees their blocks when their handles die."""
        with self._lock:
            self._packed.clear()


def _checkpointing():
    import importlib
    try:
        module = importlib.import_module(_MODULE)
    except ImportError as e:
        raise ImportError("offloadd.deepspeed needs DeepSpeed (tested 0.19.8): %s" % e) from e
    if not callable(getattr(module, "_get_cpu_offload_engine", None)):
        import deepspeed
        raise ImportError(
            "offloadd.deepspeed needs a DeepSpeed whose cpu_checkpointing asks "
            "%s._get_cpu_offload_engine() for its engine (0.19.8 does); this process has "
            "DeepSpeed %s. Use DeepSpeed 0.19.8 or leave cpu_checkpointing off and offload "
            "through offloadd.transformers.enable()" % (_MODULE, deepspeed.__version__))
    return module


def _get_engine(module):
    def get_cpu_offload_engine():
        if not module.CPU_CHECKPOINT:
            return None
        if module.PARTITION_ACTIVATIONS:
            if not _warned:
                _warned.append(True)
                warnings.warn(
                    "offloadd: DeepSpeed's partition_activations is on, so cpu_checkpointing "
                    "copies the partitions to host memory itself and they do not go through "
                    "offloadd; set partition_activations false to offload through offloadd",
                    RuntimeWarning, stacklevel=3)
            return None
        return _engine[0] if _engine else None
    return get_cpu_offload_engine


def enable(**context_args):
    """Routes DeepSpeed's ``cpu_checkpointing`` through offloadd (see the module).

    Args:
      context_args: optional :class:`offloadd.torch.offload_checkpoints` arguments for the
        process's shared context (``keep_last_n``, ``prefetch``, ``threshold_bytes``,
        ``socket_path``, ...), as for :func:`offloadd.torch.enable`, which this also calls.
    Returns the shared context (``.stats`` for its statistics).
    Raises ImportError when DeepSpeed is missing or has no ``_get_cpu_offload_engine`` (tested:
    0.19.8). Idempotent. Call it before the first checkpointed forward, on every rank.
    """
    import offloadd.torch as ot
    module = _checkpointing()
    context = ot.enable(**context_args)
    with _lock:
        _engine[:] = [_Engine(context)]
        if not _saved:
            _saved.append((module, module._get_cpu_offload_engine))
            module._get_cpu_offload_engine = _get_engine(module)
    return context


def disable():
    """Puts DeepSpeed's own engine lookup back (no-op when not enabled); offloadd.torch stays
    enabled (``offloadd.torch.disable()`` undoes that)."""
    with _lock:
        while _saved:
            module, previous = _saved.pop()
            module._get_cpu_offload_engine = previous
        _engine.clear()


def enabled():
    """True while DeepSpeed's cpu_checkpointing goes through offloadd."""
    return bool(_saved)
