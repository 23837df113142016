"""``offloadd.torch.checkpoint``: torch.utils.checkpoint.checkpoint that offloads the layer input.

Checkpointing keeps one tensor per layer, its input; this function sends that input to the
offloadd daemon (through a context's store: threshold, keep_last_n, prefetch, fallback, stats)
and recomputes the layer in backward from the reloaded copy.

How, per torch version (docs/ARCHITECTURE.md, "Pitfalls"; measured on Debian's torch 1.13):
  * ``use_reentrant=True``, any version: torch's reentrant checkpoint saves the inputs with
    ``ctx.save_for_backward``, i.e. through saved-tensor hooks: it runs inside the context.
  * ``use_reentrant=False`` on torch >= 2.0: torch's non-reentrant checkpoint saves the inputs
    as ordinary saved tensors before entering its own inner hooks: same.
  * ``use_reentrant=False`` on torch 1.13: its non-reentrant checkpoint keeps the inputs in a
    closure no outer hook sees, so this module implements non-reentrant checkpointing itself,
    with the same algorithm as torch 1.13's ``_checkpoint_without_reentrant`` (forward under
    hooks that store placeholders; the first unpack in backward re-runs the function under hooks
    that capture the recomputed saved tensors, restoring the RNG and autocast state of forward),
    except that the inputs are packed through the store, and the recomputation runs on detached
    reloaded copies with the original ``requires_grad`` flags (so autograd saves the same set of
    tensors). Gradients reach the inputs through the forward graph, as in torch's version.
"""

import contextlib
import weakref

import torch
import torch.utils.checkpoint as _tcp

from ._hooks import default_context

_TORCH_MAJOR = int(torch.__version__.split(".")[0])


def checkpoint(function, *args, use_reentrant=False, context=None, preserve_rng_state=True,
               **kwargs):
    """Drop-in for ``torch.utils.checkpoint.checkpoint`` that offloads the layer input.

    Args:
      function, args, kwargs: as torch's; tensor args at or above the context's threshold are
        offloaded (kwargs tensors stay in place, as torch 2.x keeps them).
      use_reentrant: torch's meaning; default False (non-reentrant semantics on every version).
      context: an ``offload_checkpoints`` whose store and statistics to use (default: the
        process's :func:`offloadd.torch.default_context`).
      preserve_rng_state: restore the RNG state of forward for the recomputation.
    Returns the function's output. Errors: as torch's checkpoint; OffloaddError with strict
    contexts; OffloaddError DATA_LOSS when the daemon lost an input it held.
    """
    ctx = context if context is not None else default_context()
    if use_reentrant or _TORCH_MAJOR >= 2:
        with torch.autograd.graph.saved_tensors_hooks(ctx.store.pack, ctx.store.unpack):
            return _tcp.checkpoint(function, *args, use_reentrant=use_reentrant,
                                   preserve_rng_state=preserve_rng_state, **kwargs)
    return _checkpoint_non_reentrant(ctx.store, function, preserve_rng_state, args, kwargs)


class _Holder:
    """Placeholder a forward-saved tensor is replaced by (weakly keyed)."""

    __slots__ = ("__weakref__",)


def _autocast_state():
    return {"cpu": (torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()),
            "cuda": (torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()),
            "cache": torch.is_autocast_cache_enabled()}


def _autocast(stack, state):
    enabled, dtype = state["cpu"]
    stack.enter_context(torch.autocast("cpu", dtype=dtype, enabled=enabled,
                                       cache_enabled=state["cache"]))
    if torch.cuda.is_available():
        enabled, dtype = state["cuda"]
        stack.enter_context(torch.autocast("cuda", dtype=dtype, enabled=enabled,
                                           cache_enabled=state["cache"]))


def _checkpoint_non_reentrant(store, function, preserve_rng_state, args, kwargs):
    autocast = _autocast_state()
    had_cuda = False
    if preserve_rng_state:
        cpu_rng = torch.get_rng_state()
        had_cuda = torch.cuda.is_initialized()
        if had_cuda:
            gpu_devices, gpu_states = _tcp.get_device_states(*args)
    is_tensor = [isinstance(a, torch.Tensor) for a in args]
    needs_grad = [t and a.requires_grad for t, a in zip(is_tensor, args)]
    packed = [store.pack(a) if t else a for t, a in zip(is_tensor, args)]
    holders = []                            # weakref(_Holder), in save order
    storage = weakref.WeakKeyDictionary()   # _Holder -> recomputed tensor (detached)

    def recompute():
        inputs = []
        for t, g, p in zip(is_tensor, needs_grad, packed):
            if t:
                x = store.unpack(p).detach()
                x.requires_grad_(g)
                inputs.append(x)
            else:
                inputs.append(p)
        count = [0]

        def inner_pack(x):
            i = count[0]
            count[0] += 1
            h = holders[i]() if i < len(holders) else None
            if h is not None:  # a dead holder's value will never be read
                storage[h] = x.detach()

        def inner_unpack(_):
            raise RuntimeError("offloadd.torch.checkpoint: a tensor saved during the "
                               "recomputation was unpacked; this is a bug, please report it")

        rng_devices = gpu_devices if had_cuda else []
        with torch.random.fork_rng(devices=rng_devices, enabled=preserve_rng_state):
            if preserve_rng_state:
                torch.set_rng_state(cpu_rng)
                if had_cuda:
                    _tcp.set_device_states(gpu_devices, gpu_states)
            with contextlib.ExitStack() as stack:
                stack.enter_context(torch.enable_grad())
                _autocast(stack, autocast)
                stack.enter_context(torch.autograd.graph.saved_tensors_hooks(inner_pack,
                                                                             inner_unpack))
                function(*inputs, **kwargs)

    def pack(x):
        h = _Holder()
        holders.append(weakref.ref(h))
        return h

    def unpack(h):
        if len(storage) == 0:
            recompute()
        if h not in storage:
            raise RuntimeError(
                "offloadd.torch.checkpoint: a saved tensor was read twice without a "
                "recomputation in between (backward twice over one checkpointed graph is not "
                "supported, as with torch's non-reentrant checkpoint in 1.13)")
        return storage[h]

    with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        output = function(*args, **kwargs)
    return output
