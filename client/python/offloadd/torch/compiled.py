"""Offload through offloadd inside ``torch.compile``'d graphs: a Dynamo backend.

Saved-tensor hooks step aside while Dynamo traces (see offloadd.torch._hooks), so a compiled
region keeps what it saves for backward. :func:`backend` offloads inside the compiled graph
instead, with torch's own compiled offload pass (torch._functorch._activation_offloading, torch
>= 2.10) choosing where:

1. a joint-graph pass (``torch._functorch.config.joint_custom_pass``) marks every node whose
   output is at least ``threshold_bytes`` with ``meta["should_offload"]``;
2. torch's pass (``torch._functorch.config.enable_activation_offloading``, synchronous form)
   puts a ``prims.device_put(x, cpu)`` after the last forward use of each marked tensor that the
   partitioner saves for backward (not parameters, model outputs, views, non-contiguous
   tensors), and the ``device_put`` back before its first backward use;
3. this module rewrites those nodes into its own ops: ``offloadd::offload(Tensor x, int
   store_id) -> Tensor`` (an int64 handle of shape (1,), the only thing the graph saves) calls
   the context's pack, the
   same as the saved-tensor hook (threshold, keep_last_n, fallback, statistics), and
   ``offloadd::reload(Tensor handle, int[] size, int[] stride, ScalarType dtype, Device device)
   -> Tensor`` its unpack.

The graphs then run as ``aot_eager`` runs them (the eager kernels; Inductor is not wired: its
input checks would meet a handle where the partitioner planned the activation). Use::

    import offloadd.torch.compiled as oc
    model = torch.compile(model, backend=oc.backend(threshold_bytes=1 << 20))

Each handle is reloaded once by the backward of the step that saved it: a second backward over the
same graph (``retain_graph=True``, with ``torch._functorch.config.donated_buffer=False``) raises
RuntimeError saying so (the eager hooks support it). A step whose backward never runs keeps its
offloaded blocks until :func:`release_pending` is called (or the process exits, when the daemon
releases the session's blocks); a backward after that raises RuntimeError naming
release_pending.
"""

import itertools
import threading
import warnings

import torch

_lock = threading.Lock()
_pending = {}            # handle -> (unpack hook, packed): offloaded by a forward, not reloaded
_released = set()       # handles release_pending dropped that no backward asked for yet
_handles = itertools.count(1)
_stores = {}             # store_id -> the context whose hooks a backend packs with
_ops = []                # [offload op, reload op] once registered


def _offload(store_id, x):
    with _lock:
        ctx = _stores[store_id]
    packed = ctx.pack_hook(x)  # the hooks eager torch gets from the context (its store's C pair)
    with _lock:
        handle = next(_handles)
        _pending[handle] = (ctx.unpack_hook, packed)
    return torch.tensor([handle], dtype=torch.int64)


def _reload(handle):
    """The tensor offloaded under ``handle`` (once: the entry goes). Raises RuntimeError when
    it was already reloaded (a second backward over the graph) or dropped by release_pending."""
    h = int(handle.item())
    with _lock:
        entry = _pending.pop(h, None)
        released = entry is None and h in _released
        _released.discard(h)
    if entry is None and released:
        raise RuntimeError(
            "offloadd.torch.compiled: this backward needs a tensor its graph's forward offloaded, "
            "but release_pending() dropped it; call release_pending() only for steps whose "
            "backward will not run")
    if entry is None:
        raise RuntimeError(
            "offloadd.torch.compiled: this backward needs a tensor its graph's forward offloaded, "
            "but an earlier backward over the same graph already reloaded it: a compiled "
            "graph's offloaded activations are reloaded once, so retain_graph=True (a second "
            "backward) is not supported with offloadd.torch.compiled.backend; for double "
            "backward use the eager hooks (offloadd.torch.offload_checkpoints) or run forward "
            "again")
    unpack, packed = entry
    return unpack(packed)


def _register_ops():
    """Defines offloadd::offload / offloadd::reload once per process; returns them."""
    if _ops:
        return _ops

    @torch.library.custom_op("offloadd::offload", mutates_args=())
    def offload(x: torch.Tensor, store_id: int) -> torch.Tensor:
        return _offload(store_id, x)

    @offload.register_fake
    def _(x, store_id):
        return torch.empty(1, dtype=torch.int64)

    @torch.library.custom_op("offloadd::reload", mutates_args=())
    def reload(handle: torch.Tensor, size: list[int], stride: list[int], dtype: torch.dtype,
               device: torch.device) -> torch.Tensor:
        t = _reload(handle)
        # A tensor the store kept in place is the forward's own: a custom op may not return an
        # alias of what the graph already holds, so hand back a copy of the same bits.
        return t.clone() if t._base is not None or not t.is_contiguous() else t

    @reload.register_fake
    def _(handle, size, stride, dtype, device):
        return torch.empty_strided(size, stride, dtype=dtype, device=device)

    torch.fx.has_side_effect(torch.ops.offloadd.offload.default)
    _ops.extend([torch.ops.offloadd.offload.default, torch.ops.offloadd.reload.default])
    return _ops


def _rewrite(gm, forward, ops, store_id):
    """Replaces torch's offload pass's prims.device_put nodes by offloadd's ops, in place."""
    graph, replaced = gm.graph, 0
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target != torch.ops.prims.device_put.default:
            continue
        with graph.inserting_before(node):
            if forward:
                new = graph.call_function(ops[0], (node.args[0], store_id))
            else:
                v = node.meta["val"]
                new = graph.call_function(ops[1], (node.args[0], list(v.shape), list(v.stride()),
                                                   v.dtype, v.device))
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        replaced += 1
    graph.lint()
    gm.recompile()
    return replaced


def backend(threshold_bytes=1 << 20, context=None):
    """A ``torch.compile`` backend that offloads saved activations through offloadd.

    Args:
      threshold_bytes: int; forward tensors of at least this many bytes (numel * element_size)
        that the compiled graph saves for backward are offloaded; the context's own
        threshold_bytes (default 1 MiB) applies on top: smaller ones stay on their device.
      context: an :class:`offloadd.torch.offload_checkpoints` whose store packs and unpacks
        (keep_last_n, prefetch, strict, statistics); default the process's shared context
        (:func:`offloadd.torch.default_context`).
    Returns a callable for ``torch.compile(model, backend=...)``. ``.graphs`` lists, per compiled
    graph, ``(forward offloads inserted, backward reloads inserted)``.
    Raises ImportError when torch has no compiled offload pass (torch < 2.10). Warns
    (RuntimeWarning) when the context's threshold_bytes is above ``threshold_bytes``: the graph
    then gets offloads for tensors the context keeps on the device (counted as skipped_small).
    """
    import torch._functorch.config as fc
    from functorch.compile import make_boxed_func, min_cut_rematerialization_partition
    from torch._dynamo.backends.common import aot_autograd
    if not hasattr(fc, "enable_activation_offloading"):
        raise ImportError("offloadd.torch.compiled needs torch's compiled activation offload "
                          "pass (torch >= 2.10); this process has torch %s" % torch.__version__)
    from ._hooks import default_context
    ops = _register_ops()
    ctx = context or default_context()
    store = ctx.store
    if store.threshold_bytes > threshold_bytes:
        warnings.warn(
            "offloadd.torch.compiled.backend(threshold_bytes=%d): the context's threshold_bytes=%d "
            "is larger, so saved tensors between the two stay on the device; pass a context "
            "with threshold_bytes <= %d (offloadd.torch.offload_checkpoints(threshold_bytes=...) "
            "or offloadd.transformers.enable(threshold_bytes=...))"
            % (threshold_bytes, store.threshold_bytes, threshold_bytes),
            RuntimeWarning, stacklevel=2)
    with _lock:
        store_id = len(_stores) + 1
        _stores[store_id] = ctx
    counts = []

    def mark(gm, _inputs):
        for node in gm.graph.nodes:
            v = node.meta.get("val")
            if node.op == "call_function" and isinstance(v, torch.Tensor) and \
                    v.numel() * v.element_size() >= threshold_bytes:
                node.meta["should_offload"] = True
        return gm

    def compile_graph(gm, example_inputs):
        entry = [0, 0]   # this graph's offloads and reloads (backward compiles lazily)
        counts.append(entry)

        def forward_compiler(fw, _example):
            entry[0] = _rewrite(fw, True, ops, store_id)
            return make_boxed_func(fw.forward)

        def backward_compiler(bw, _example):
            entry[1] = _rewrite(bw, False, ops, store_id)
            return make_boxed_func(bw.forward)
        inner = aot_autograd(fw_compiler=forward_compiler, bw_compiler=backward_compiler,
                             partition_fn=min_cut_rematerialization_partition)
        with fc.patch(enable_activation_offloading=True, joint_custom_pass=mark,
                      activation_offload_separate_stream=False):
            return inner(gm, example_inputs)
    compile_graph.graphs = counts
    return compile_graph


def release_pending():
    """Drops every handle a forward offloaded and no backward reloaded (a step abandoned
    before backward); returns how many. Their blocks are released as those of a saved-tensor
    hook's packed tensors are when autograd drops a graph without backward."""
    with _lock:
        n = len(_pending)
        _released.update(_pending)
        _pending.clear()
    return n
