"""``offloadd.torch.checkpoint``: torch.utils.checkpoint.checkpoint that offloads the layer input.

Checkpointing keeps one tensor per layer, its input; this function runs torch's own checkpoint
inside a context's saved-tensor hooks, so that input goes to the offloadd daemon (threshold,
keep_last_n, prefetch, fallback, stats of the context) and the layer is recomputed in backward
from the reloaded copy. On torch >= 2.4 (the supported range) both modes save the inputs as
ordinary saved tensors, which the outer hooks see: ``use_reentrant=True`` through
``ctx.save_for_backward``, ``use_reentrant=False`` before entering checkpoint's own inner hooks
(measured on torch 2.15: exactly the L layer inputs reach the hook, bitwise-equal gradients;
client/python/tests/test_torch2.py).
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import torch
import torch.utils.checkpoint as _tcp

from ._hooks import default_context, offload_checkpoints


def checkpoint(function: Callable[..., Any], *args: Any, use_reentrant: bool = False,
               context: Optional[offload_checkpoints] = None, preserve_rng_state: bool = True,
               **kwargs: Any) -> Any:
    """Drop-in for ``torch.utils.checkpoint.checkpoint`` that offloads the layer input.

    Args:
      function, args, kwargs: as torch's; tensor args at or above the context's threshold are
        offloaded (kwargs tensors stay in place, as torch keeps them).
      use_reentrant: torch's meaning; default False (torch's recommended mode).
      context: an ``offload_checkpoints`` whose store and statistics to use (default: the
        process's :func:`offloadd.torch.default_context`).
      preserve_rng_state: restore the RNG state of forward for the recomputation.
    Returns the function's output. Errors: as torch's checkpoint; OffloaddError with strict
    contexts; OffloaddError DATA_LOSS (raised from backward) when the daemon lost an input it
    held.
    """
    ctx = context if context is not None else default_context()
    with torch.autograd.graph.saved_tensors_hooks(ctx.pack_hook, ctx.unpack_hook):
        return _tcp.checkpoint(function, *args, use_reentrant=use_reentrant,
                               preserve_rng_state=preserve_rng_state, **kwargs)
