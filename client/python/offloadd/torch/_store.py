"""The pack/unpack engine behind every offloadd context (torch.autograd.graph.saved_tensors_hooks).

``Store.pack(t)`` decides per saved tensor:
  * left in place (returned in a ``Kept`` with its version, which unpack checks as torch would:
    torch skips its own check once hooks are installed): below ``threshold_bytes``; a
    parameter, a view of one, or a leaf that requires grad; a view of (or the base of a view)
    already offloaded; not a dense strided CPU/CUDA tensor (sparse, quantized, nested, meta, a
    tensor subclass). With
    ``small_to_host`` (save_on_cpu), small CUDA tensors are copied to host memory instead, as
    torch's save_on_cpu does.
  * the same tensor saved twice in one step shares one handle (one offload, one reload); a
    handle of an earlier step (a graph still held, a failed step's lost handle) is never reused.
  * otherwise a handle (``Saved``) that holds the tensor while it is among the newest
    ``keep_last_n`` eligible ones, then offloads it (asynchronously: forward never waits).
``Store.unpack(handle)`` returns the tensor: from the device when kept, else from the daemon --
prefetched (issued PREFETCH when a later tensor was unpacked: backward runs in reverse order, so
unpacking entry k prefetches the ``prefetch`` offloaded entries before it) or fetched URGENT.
The reloaded tensor is kept by the handle until the handle dies, so a tensor that several
autograd nodes saved (one handle, de-duplicated at pack) is reloaded once however often it is
unpacked, and a graph can be run backward twice (retain_graph): reloads per step equal offloads
per step (as without hooks, a saved tensor then lives until its last user). A block is therefore
never read twice, and every reload asks the daemon to free the block once copied
(``release_after``): an offloaded tensor costs two requests, its offload and its reload. A handle
that dies without a reload (never unpacked, or used from the device while its offload was in
flight) releases its block with a request of its own; nothing stays in the pool after a step.

Per step the store keeps what does not change per tensor: each device's endpoint key and
endpoint (looked up again when its session ends), whether pinned host memory is possible, and
the allocator check (once per step and device), so a pack asks none of them per tensor.

Idle steps: a step ends when a pack follows an unpack (the next forward after a backward). A step
that packed saved tensors but sent none to the daemon (all below the threshold, parameters, or
kept by keep_last_n) is counted in ``stats.idle_steps`` and warned about once per process with
the reason -- offload "on" that does nothing is a configuration error users otherwise miss. It
is counted when the next step's first pack comes, or, for the last step of a run (or a one-step
run), at ``offloadd.torch.synchronize()`` or when the process exits, once its backward has
begun (an unpack came after its packs); never twice. Steps are per thread: each thread that
packs into the store has a step of its own (its packs, and what they sent), which ends at that
thread's pack after its backward began -- an unpack on the same thread, or on a thread that
packs nothing into this store (autograd runs a CUDA backward on its device threads); the step
of a thread that ended (a thread per step) ends at any thread's next step. So threads
sharing a context do not end each other's steps when each runs its own backward (on CPU), and a
thread's step that sent nothing is idle even while another thread sends. A tensor sent by
another thread's pack (keep_last_n) counts for the step that packed it while that is open. Threads
whose backwards all run on autograd's device threads still end each other's steps (an unpack
there cannot tell whose step it serves), as one thread's backward does its own.

Failures: daemon unreachable or refusing (RESOURCE_EXHAUSTED past its admission deadline,
OUT_OF_RANGE, registration errors, staging full) -> the tensor is kept in-process (fallback; a
pinned host copy for CUDA tensors when ``pin_memory`` and CUDA allow), one warning per process,
counted. ``strict=True`` raises OffloaddError instead (at the pack, or for an asynchronous
refusal at the next pack/unpack). A daemon that stops while holding a block loses it: its unpack
raises OffloaddError DATA_LOSS (the step cannot finish; later steps fall back).
Errors raised in backward's unpack reach the caller of ``backward()`` as the same OffloaddError
(torch >= 2.4 re-raises a hook's exception object; OffloaddError is a RuntimeError).
"""

import atexit
import enum
import functools
import os
import threading
import time
import warnings
import weakref

import torch

from .. import _native, _process, errors
from ..client import PREFETCH, URGENT, acquire_surely
from . import _endpoint
from ._live import STORES as _STORES  # every Store of the process (weak)
from ._live import finish_steps
from ._reaper import reaper, release_later
from ._stats import OffloadStats
from ._transport import CudaIpcTransport, Meta, OffloadOp, ReloadOp, empty_like_meta


class SavedState(enum.IntEnum):
    """Where a saved tensor's bytes are (``Saved.state``)."""

    KEPT = 0         # held by the handle: not offloaded (yet), or kept at OffloadDone
    OFFLOADING = 1   # Offload sent, its answer not handled yet; the transport holds the bytes
    OFFLOADED = 2    # in the daemon's block ``block_id`` (None once its reload freed it)
    FALLBACK = 3     # kept in this process after the offload failed or was refused
    LOST = 4         # the daemon lost the block (it stopped): unpack raises DATA_LOSS


# The members under the names the hot path compares with (ints: == and in work as before).
KEPT, OFFLOADING, OFFLOADED, FALLBACK, LOST = SavedState
_Tensor, _Parameter, _STRIDED = torch.Tensor, torch.nn.Parameter, torch.strided
_pump = _endpoint.hooks_pump
_FULL_UNTIL = _endpoint._full_until  # (pid, socket, device key) -> refused-for-room back-off


_front = _native.load_store_front()  # offloadd._store_front (client/core/store_front_module.c)
# Store.hook_pair gives torch the pack hook in C (offloadd._store_front.Hooks, whose usual path
# is Store.pack's in one C call); False: Store.pack itself (tests of both, benchmarks).
_hooks_in_c = True
_AGAIN = object()  # Store._reload_claimed: the handle changed state, unpack it again
_ORPHAN_TAKEN = object()  # OffloadOp.orphan_reload once _offload_orphaned looked at it
_WAITED = "waited"  # Saved.reloading: claimed, and another thread waits for the claim's end


class _BecameFallback(Exception):
    """Completes a reload that was waiting for an offload and will not be sent: the daemon
    refused the offload (the handle is a fallback now), or handling its answer raised (the
    handle holds its block; an unpack reloads it itself). An unpack waiting on the reload
    looks at the handle again."""


_callback_warned = [False]


def _warn_callback_failure(err, outcome):
    """One RuntimeWarning per process: handling an offload's answer raised ``err``, with
    ``outcome`` (what that means for the saved tensor)."""
    if _callback_warned[0]:
        return
    _callback_warned[0] = True
    warnings.warn("offloadd: handling the daemon's answer to an offload raised %r; %s. This "
                  "warning is shown once per process." % (err, outcome), RuntimeWarning,
                  stacklevel=2)


# Failures that keep a tensor in process (a fallback). Not errors.OffloadConfigError: a process
# whose allocator hands out memory offloadd cannot export hears it at once, not per tensor.
_RECOVERABLE = (errors.OffloaddError, errors.CudaExportError, OSError, TimeoutError)
_REASONS = (_BecameFallback,) + _RECOVERABLE  # what a claimed reload's end handles


# What pack returns for an eligible tensor (opaque to autograd): a record of the extension
# module, with these attributes (the store's policy reads and writes them under its lock):
#   store, seq (its number in the store), offset (its position in its step), step (its step's
#   index), version (autograd's version of the tensor at the pack), state (SavedState), tensor
#   (the bytes while held: the saved tensor, or a fallback copy), src (weakref to the saved
#   tensor, for de-duplication and the version check), ep, op (the offload in flight), block_id,
#   reload (ReloadOp in flight), result (the reloaded tensor, kept for later unpacks), unpacked,
#   pin (pinned host memory for an in-process copy on fallback), served (unpacked from the device
#   tensor while its offload was in flight), prefetch_kept (device tensor kept at OffloadDone for
#   a prefetch: Store._keep_for_prefetch), reloading (a thread is finishing its reload:
#   Store._claim), counts (the _StepCounts of the thread's step that packed it), modified (the
#   version at which the saved tensor was seen modified in place while this handle held it,
#   else None: unpack raises then, even when the caller dropped the tensor), sent_version (the
#   version of the transport's source when sent: a device transport may read a copy of its own,
#   the simulated GPU's), dead; and the saved tensor's layout as Meta has it (shape, stride,
#   dtype, device, numel, nbytes, checksum; ``meta`` is the record itself). Its death calls
#   Store._on_death once.
Saved = _front.Saved
# Lanes (a handle's usual offload and reload in one C call each, _front.OffloadLane) in use;
# the benchmarks and tests switch them off to compare with the Python path.
_offload_lanes = True


class Kept:
    """What pack returns for a saved tensor it leaves in place (below the threshold, a
    parameter, a leaf, a view, not dense): the tensor and its version at the pack. torch skips
    its own saved-tensor version check whenever saved-tensor hooks are installed, so unpack
    makes it (Store._check_kept): a weight or small tensor modified in place before backward
    raises torch's error instead of giving wrong gradients. ``detach``: hold an autograd node's
    output detached (a plain tensor: "small", "views"; see _held)."""

    __slots__ = ("tensor", "version")

    def __init__(self, t, detach=False):
        self.tensor, self.version = _held(t) if detach else t, t._version


class HostCopy:
    """A small CUDA tensor copied to host memory (save_on_cpu semantics)."""

    __slots__ = ("host", "device", "non_blocking")

    def __init__(self, t, pin):
        self.device, self.non_blocking = t.device, pin
        self.host = empty_like_meta(Meta(t), device="cpu", pin_memory=pin)
        self.host.copy_(t, non_blocking=pin)


class Store:
    def __init__(self, name="", threshold_bytes=1 << 20, keep_last_n=1, prefetch=1,
                 strict=False, socket_path=None, pin_memory=True, small_to_host=False,
                 retry_seconds=30.0, connect_timeout_seconds=5.0, unresponsive_seconds=20.0):
        if keep_last_n < 0 or prefetch < 0 or threshold_bytes < 0:
            raise ValueError("keep_last_n, prefetch and threshold_bytes must be >= 0")
        if unresponsive_seconds <= 0:
            raise ValueError("unresponsive_seconds must be > 0")
        self.unresponsive_seconds = float(unresponsive_seconds)
        # Seconds the packs of the current step may still spend in waits for a daemon that
        # does not answer (connects, staging room, registrations); reset at each step's end.
        self._stall_left = self.unresponsive_seconds
        self.threshold_bytes = threshold_bytes
        self.keep_last_n, self.prefetch = keep_last_n, prefetch
        self.strict, self.socket_path, self.pin_memory = strict, socket_path, pin_memory
        self.small_to_host = small_to_host
        self.retry_seconds, self.connect_timeout_seconds = retry_seconds, connect_timeout_seconds
        self.stats = OffloadStats(name)
        self._lock = threading.RLock()
        # Signalled when a thread stops finishing a handle's reload (Saved.reloading).
        self._reloaded = threading.Condition(self._lock)
        # The step's tables, in the extension module: the handles in order of their numbers
        # (seq), those still held for keep_last_n, and this step's saved tensors and their bases
        # by address, for de-duplication (emptied at each step's end: _end_step).
        self._front = _front.Front(_Tensor, _Parameter, _STRIDED)
        self._async_error = None
        self._unpacking = False              # an unpack came after the last pack (any thread)
        self._last_unpacked_seq = None       # for telling forward-order consumers apart
        # Step positions whose handle died without being unpacked (saved by a branch backward
        # never reached): prefetch skips them in later steps of the same shape. Updated from
        # Store._on_death without a lock (set.add/discard are atomic under the GIL).
        self._unused_offsets = set()
        # Idle-step counts: one _StepCounts per thread that packs (``_thread.step``), ended by
        # that thread's pack after its backward began; ``_open_steps`` holds them (strongly: a
        # thread that ends before its last step is counted) for finish_step. Unpacks on threads
        # that pack nothing here (autograd's CUDA device threads) add to ``_foreign_unpacks``.
        self._thread = threading.local()
        self._open_steps = set()
        self._foreign_unpacks = 0
        self._step_eps = {}    # device key -> Endpoint of this step (checked alive per use)
        # torch.device -> OffloadLane of this step's endpoint for it, made after the endpoint
        # served the step's first offload (cleared with _step_eps): the usual offload and
        # reload in C (None for an endpoint that has none: shm).
        self._lanes = {}
        self._device_keys = {}  # torch.device -> its endpoint key, per step (kinds may change)
        self._can_pin = None   # pin_memory possible (torch.cuda.is_available()), per step
        _STORES.add(self)

    # ---- pack ------------------------------------------------------------------------------
    def pack(self, t, small_to_host=None, pin_memory=None):
        """The pack hook. ``small_to_host`` / ``pin_memory`` override the store's policy for
        this call (save_on_cpu instances sharing the default store)."""
        _pump()  # answers on the request rings: completes offloads (callbacks run here)
        if self._async_error is not None:
            self._raise_async_error()
        step = getattr(self._thread, "step", None)
        if step is None or step.unpacked or step.foreign_unpacks != self._foreign_unpacks:
            step = self._end_thread_step(step)
        if self._unpacking:
            self._unpacking = False
            self._end_step()
        pin = self.pin_memory if pin_memory is None else pin_memory
        if pin:
            pin = self._can_pin
            if pin is None:
                pin = self._can_pin = torch.cuda.is_available()
        # The rules of the module doc; a new handle carries this step's counts from the start.
        r = self._front.pack(t, self.threshold_bytes, pin, self, step)
        if r.__class__ is str:  # left in place: the category it was left for
            return self._left(t, r, step, small_to_host, pin)
        step.saw(t, None)
        due = self._front.pop_due(self.keep_last_n)  # None for a handle packed before
        if due is not None:
            lanes = self._lanes
            for o in due:
                lane = lanes.get(o.device) if lanes else None
                if lane is None or not lane.offload(o, step):
                    self._offload(o)
        return r

    def _left(self, t, category, step, small_to_host, pin):
        """What pack returns for ``t``, left in place for ``category`` (counted in ``step`` and
        the statistics): a HostCopy (a small CUDA tensor, where the policy copies those to
        host, pinned as ``pin`` says), else a Kept."""
        step.saw(t, category)
        self.stats.add(**{"skipped_" + category: 1})
        to_host = self.small_to_host if small_to_host is None else small_to_host
        if category == "small" and to_host and t.device.type == "cuda":
            return HostCopy(t, pin)
        return Kept(t, category == "small" or category == "views")

    def hook_pair(self, small_to_host=None, pin_memory=None):
        """The (pack, unpack) pair torch calls: the hooks in C (offloadd._store_front.Hooks:
        the usual paths of pack and unpack in one call each, the rest through this store's
        Python), with ``small_to_host`` / ``pin_memory`` overriding the store's policy as
        pack's arguments do; pack and unpack themselves while ``_hooks_in_c`` is False."""
        if not _hooks_in_c:
            if small_to_host is None and pin_memory is None:
                return self.pack, self.unpack
            return functools.partial(self.pack, small_to_host=small_to_host,
                                     pin_memory=pin_memory), self.unpack
        hooks = _front.Hooks(self, globals())
        if small_to_host is None and pin_memory is None:
            return hooks.pack, hooks.unpack
        return functools.partial(hooks.pack_with, small_to_host, pin_memory), hooks.unpack

    def _offload(self, s):
        """Sends ``s`` to the daemon, or keeps it in process (fallback), from a pack; counted as
        sent in the step that packed ``s``, or in the packing thread's when that one is over.
        The waits for the daemon here (connect, staging room, a region's registration) take at
        most ``_stall_left`` seconds of the step in all when they fail: past that budget the
        rest of the step's tensors stay in process without asking the daemon."""
        # Attempted: a refusal or an unreachable daemon warns on its own.
        (self._thread.step if s.counts.counted else s.counts).sent += 1
        if self._stall_left <= 0:
            return self._fallback(s, "the offloadd daemon did not answer within this step's "
                                  "bound of %.1f s (unresponsive_seconds)"
                                  % self.unresponsive_seconds)
        device = s.meta.device
        key = self._device_keys.get(device)
        if key is None:
            key = self._device_keys[device] = _endpoint.device_key(device)
        ep = self._step_eps.get(key)
        first = ep is None or not ep.alive or ep.pid != _process.pid
        if first:
            t0 = time.monotonic()
            ep, reason = _endpoint.get(self.socket_path, s.meta.device, self.retry_seconds,
                                       min(self.connect_timeout_seconds, self._stall_left),
                                       self.unresponsive_seconds)
            if ep is None:
                self._step_eps.pop(key, None)
                self._lanes.clear()
                self._stall_left -= time.monotonic() - t0
                return self._fallback(s, "the offloadd daemon is unreachable (%s)" % reason)
            self._step_eps[key] = ep
        # Refused for room lately: do not wait its deadline (no back-off anywhere: no call).
        full = _endpoint.full_reason(ep) if _FULL_UNTIL else None
        if full is not None:
            return self._fallback(s, "offloadd refused a tensor (%s); no offloads to it for "
                                  "%g s (retry_seconds)" % (full, self.retry_seconds),
                                  errors.RESOURCE_EXHAUSTED)
        if s.tensor._version != s.version:
            _note_version(s, s.tensor)
        t0 = time.monotonic()
        try:
            # The ordering hint: backward reloads a step's blocks in reverse of position, so the
            # daemon's spill tier sends the earliest of a step to disk first. The allocator's
            # settings are checked at a step's first offload per device (they may change at run
            # time, between steps).
            # ``target``: the answer may be applied to ``s`` in C (_offload_done's usual path).
            wref = weakref.ref(s)
            op = ep.transport.start_offload(s.tensor, s.meta, ordering=(s.step, s.offset),
                                            timeout=self._stall_left,
                                            unresponsive_seconds=self._stall_left,
                                            check_allocator=first, target=wref)
        except errors.OffloadConfigError:
            self._step_eps.pop(key, None)  # the next offload checks the allocator again
            self._lanes.clear()
            raise
        except _RECOVERABLE as e:
            elapsed = time.monotonic() - t0
            self._stall_left -= elapsed
            # Silent: the wait ended without a word from the daemon all along (not a live
            # daemon whose staging room or pool stays full).
            silent = isinstance(e, errors.DaemonUnresponsive) or (
                isinstance(e, TimeoutError) and ep.client.silent_seconds() >= elapsed)
            why, code = str(e.with_traceback(None)), getattr(e, "code", errors.UNAVAILABLE)
            e = None
            if silent:
                self._stall_left = 0.0
                self._abandon(ep, why)
            elif not ep.alive:
                _endpoint.mark_broken(ep, why, self.retry_seconds)
            return self._fallback(s, "offloadd could not take a tensor (%s)" % why, code)
        source = getattr(op, "tensor", None)
        with self._lock:  # the op holds what the transport still needs (a CUDA source tensor)
            s.ep, s.op, s.state, s.tensor = ep, op, OFFLOADING, None
            s.sent_version = None if source is None else source._version
        op.future.add_done_callback(lambda f: self._offload_done(wref, ep, op, f))
        if first and _offload_lanes:  # the step's later offloads to ep: in C
            self._lanes[device] = _lane_for(ep)

    def _offload_done(self, wref, ep, op, future):
        """OffloadDone or the error that refused the offload, on the thread that took the
        answer: the client's reader (stream), or a hook, wait or synchronize that pumped the
        request ring. The outcome's runner swallows what a callback raises, so whatever raises
        here part way (a transport, a statistics hook, a bug) is handled here: a reload attached
        to this offload is sent or failed at once, never left for its unpack to wait on until
        the unresponsive bound, and the block is released or held by the handle."""
        exc = future.exception()
        if exc is not None:
            self._step_eps.clear()  # look the endpoint up again (it may be broken now)
            self._lanes.clear()
        s = wref()
        if s is not None:
            with self._lock:
                if s.dead:
                    s = None
        if s is None:  # the graph died before the offload finished
            self._offload_orphaned(ep, op, future, exc)
            return
        if exc is not None:
            self._offload_refused(s, ep, op, exc)
            return
        block_id = future.result().block_id
        source = getattr(op, "tensor", None)  # a device source modified while copied
        if source is not None:
            _note_version(s, source, baseline=s.sent_version)
        rl, settled = None, False
        try:
            with self._lock:
                served, kept = s.served, self._keep_for_prefetch(s, ep, op)
                s.block_id, s.op = block_id, None
                s.state = KEPT if served or kept is not None else OFFLOADED
                rl = s.reload
                if kept is not None:
                    s.tensor, s.served, s.prefetch_kept, s.reload = kept, True, True, None
            ep.transport.finish_offload(op)
            self.stats.add_offloaded(s.meta.nbytes)
            if served or kept is not None:  # backward uses the device tensor: block not needed
                ep.client.release(block_id)
                settled = True
                if kept is not None:  # counted served_in_flight at its unpack, if it comes
                    ep.transport.abandon_reload(rl)
            elif rl is not None and not rl.sent:
                ep.transport.send_reload(rl, block_id, rl.priority, release_after=True)
        except Exception as e:  # noqa: BLE001 -- the outcome's runner would swallow it
            self._offload_done_raised(s, ep, op, block_id, rl, settled, e)

    def _offload_done_raised(self, s, ep, op, block_id, rl, settled, err):
        """_offload_done raised ``err`` while handling the OffloadDone of ``s``'s block
        ``block_id``. ``rl``: the reload attached to the offload when the handle was read
        (None: not read yet); ``settled``: the block was released as not needed and the
        attached reload handed to abandon_reload. Ends as the success path would have: the
        handle holds its block (OFFLOADED), or it was used from the device and the block is
        released; a reload attached and not known to be sent is failed with _BecameFallback,
        so that the unpack waiting on it (if any) at once looks at the handle again and
        reloads the block URGENT on its own thread, where a transport that still fails
        raises as any failed reload does. Warns with ``err`` (once per process)."""
        if not settled:
            try:
                ep.transport.finish_offload(op)  # idempotent: what the offload still held
            except Exception:  # noqa: BLE001 -- reported below with err
                pass
            with self._lock:
                if s.op is op:  # raised before the handle took its block
                    s.block_id, s.op = block_id, None
                    s.state = KEPT if s.served else OFFLOADED
                if rl is None:
                    rl = s.reload
                if s.reload is rl:
                    s.reload = None
                needed = s.state == OFFLOADED
            if rl is not None:  # never sent (send_reload raised in it at most)
                rl.done.set_exception(_BecameFallback())
            try:
                if not needed:
                    ep.client.release(block_id)
                if rl is not None:
                    ep.transport.abandon_reload(rl)
            except Exception:  # noqa: BLE001 -- the daemon frees the session's blocks at its end
                pass
        _warn_callback_failure(err, "the saved tensor stays usable (backward reloads it)")

    def _offload_orphaned(self, ep, op, future, exc):
        """The handle died before its offload finished: frees what the offload held, its block
        (when stored) and the reload attached to it (left on ``op`` by the handle's death,
        _on_death, which frees it itself when it comes after this); each step runs even when
        one before it raised."""
        with self._lock:
            rl, op.orphan_reload = op.orphan_reload, _ORPHAN_TAKEN
        try:
            ep.transport.finish_offload(op)
        finally:
            try:
                if exc is None:
                    ep.client.release(future.result().block_id)
            finally:
                if rl is not None and rl is not _ORPHAN_TAKEN:
                    ep.transport.abandon_reload(rl)

    def _offload_refused(self, s, ep, op, exc):
        """The daemon refused ``s``'s offload (or its session failed) with ``exc``: the handle
        keeps the transport's copy (a fallback, Transport.rescue) and a reload attached to the
        offload fails with _BecameFallback, so an unpack waiting on it takes the fallback. When
        no copy can be made (rescue raised) the tensor is lost: the handle is LOST and the
        attached reload fails at once with DATA_LOSS (its unpack raises it)."""
        rescued = lost = failure = None
        try:
            rescued = _held(ep.transport.rescue(op, s.meta, s.pin))
        except Exception as e:  # noqa: BLE001 -- the tensor is gone: told to its unpack
            failure = e.with_traceback(None)  # not this frame (nor the step's graph) in it
            lost = errors.OffloaddError(
                errors.DATA_LOSS, "the daemon refused the offload (%s) and no copy of the "
                "tensor could be kept in this process (%r)" % (exc, failure))
        try:
            ep.transport.finish_offload(op)
        finally:
            with self._lock:
                s.tensor, s.state, s.op = rescued, FALLBACK if lost is None else LOST, None
                rl, s.reload = s.reload, None
            if rl is not None:  # never sent: wake an unpack waiting on it, free its destination
                rl.done.set_exception(_BecameFallback() if lost is None else lost)
                ep.transport.abandon_reload(rl)  # and, on CUDA, its events
        if isinstance(exc, errors.DaemonUnavailable):
            _endpoint.mark_broken(ep, str(exc), self.retry_seconds)
        elif getattr(exc, "code", None) == errors.RESOURCE_EXHAUSTED:
            _endpoint.mark_full(ep, str(exc), self.retry_seconds)
        if lost is None:
            self._count_fallback(s, _refusal_reason(exc), exc)
        else:
            _warn_callback_failure(failure, "that saved tensor is lost (its unpack raises "
                                   "DATA_LOSS)")

    def _abandon(self, ep, why):
        """The daemon behind ``ep`` stopped answering: give the session up (its offloads still
        in flight become fallbacks from the client's copies) and do not ask it again for
        retry_seconds."""
        _endpoint.abandon(ep, errors.DaemonUnresponsive(_strip_code(why)), self.retry_seconds)

    def _end_step(self):
        """A pack followed an unpack (of any thread): what the store keeps per step starts
        again. (Idle steps are counted per thread: _end_thread_step.)"""
        self._stall_left = self.unresponsive_seconds
        self._front.end_step()  # a handle of an earlier step is never reused (de-duplication)
        self._step_eps.clear()
        self._lanes.clear()
        self._device_keys.clear()
        self._can_pin = None
        self._last_unpacked_seq = None

    def _end_thread_step(self, step):
        """This thread's pack came first in this store, or after its step's backward began:
        counts ``step`` (None: no step yet) if it sent nothing and was not counted yet, and
        returns this thread's new step."""
        new = _StepCounts(self._foreign_unpacks)
        with self._lock:
            due = [step] if step is not None and not step.counted else []
            if step is not None:
                step.counted = True
                self._open_steps.discard(step)
            # Steps of threads that ended (a thread per step, its backward run elsewhere) have
            # no next pack of their own: they end here, once their backward began.
            for other in [o for o in self._open_steps if not o.thread.is_alive() and (
                    o.unpacked or o.foreign_unpacks != self._foreign_unpacks)]:
                other.counted = True
                self._open_steps.discard(other)
                due.append(other)
            self._open_steps.add(new)
        self._thread.step = new
        for done in due:
            self._count_idle(done)
        return new

    def _count_idle(self, step):
        reason = step.idle_reason(self)
        if reason is not None:
            self.stats.add(idle_steps=1)
            _endpoint.count_idle_step(reason, step.device)
        _endpoint.report()

    def finish_step(self):
        """Runs the idle-step check now of each thread's current step whose backward has begun
        (the last step of a run has no next pack to end it; its thread may have ended); a later
        end of such a step does not count it again. Called by synchronize() and at exit."""
        with self._lock:
            due = [step for step in self._open_steps if not step.counted and (
                step.unpacked or step.foreign_unpacks != self._foreign_unpacks)]
            for step in due:
                step.counted = True
                self._open_steps.discard(step)
        for step in due:
            self._count_idle(step)

    def _fallback(self, s, reason, code=errors.UNAVAILABLE):
        """Keeps ``s`` in process; with strict, raises OffloaddError ``code`` instead (the
        refusal's own code: RESOURCE_EXHAUSTED while a full daemon's back-off lasts)."""
        if self.strict:
            raise errors.OffloaddError(code, reason + " (strict=True)")
        t = s.tensor
        _note_version(s, t)
        if t.device.type == "cuda" and s.pin:
            t = HostCopy(t, True).host
        t = _held(t)
        with self._lock:
            s.tensor, s.state = t, FALLBACK
        self._count_fallback(s, reason, None)

    def _count_fallback(self, s, reason, exc):
        self.stats.add(fallbacks=1, fallback_bytes=s.meta.nbytes)
        if self.strict and exc is not None:  # raised at the next pack/unpack, not warned
            self._async_error = errors.OffloaddError(getattr(exc, "code", errors.UNKNOWN),
                                                     reason + " (strict=True)")
        _endpoint.count_fallback(reason, warn=not self.strict, device=s.meta.device)

    def _raise_async_error(self):
        """Raises the refusal strict mode kept for the next hook call. The local is cleared on
        the way out: the raised error's traceback holds this frame, and a frame naming its own
        exception is a reference cycle that kept the failed step's graph and its daemon blocks
        alive until Python's cycle collector ran (a loop catching the error found the pool still
        full step after step)."""
        err, self._async_error = self._async_error, None
        if err is None:
            return
        try:
            raise err
        finally:
            err = None

    # ---- unpack ----------------------------------------------------------------------------
    def unpack(self, s):
        self._unpacking = True
        step = getattr(self._thread, "step", None)
        if step is not None:
            step.unpacked = True  # this thread's backward began: its next pack ends its step
        else:  # a thread that packs nothing here: its unpacks end every thread's step
            self._foreign_unpacks += 1
        if type(s) is not Saved:
            return self._unpack_left(s)
        return self._unpack_saved(s)

    def _unpack_left(self, s):
        """What unpack returns for what pack left in place (a Kept, a HostCopy), or for
        anything else it is given (returned as it is)."""
        kind = type(s)
        if kind is Kept:
            return self._check_kept(s)
        if kind is HostCopy:
            return s.host.to(s.device, non_blocking=s.non_blocking)
        return s

    def _unpack_saved(self, s, pumped=False):
        """unpack of a handle, after unpack counted the step's backward as begun (``pumped``:
        and pumped the rings' answers, as the C unpack has when it comes here)."""
        if not pumped:
            _pump()
        if self._async_error is not None:
            self._raise_async_error()
        src = s.src()
        if src is None or src._version != s.version or s.modified is not None:
            self._check_version(s)  # the tensor is gone, or it changed: the full check
        r = s.result
        if r is not None:
            return r
        claimed = False  # this thread holds s's reload claim (see _claim); the finally lets it go
        try:
            with self._lock:
                state, first = s.state, not s.unpacked
                s.unpacked = True
                # Read with the state: another thread's pack may offload this handle once the
                # lock is let go (it was due before this unpack began), which takes the tensor.
                t = s.tensor
                # The usual case claims the reload here: an offloaded handle of this process
                # that no thread is reloading. Inside the try: an interrupt raised as the lock
                # is let go still lets the claim go.
                if state == OFFLOADED and not s.reloading and (
                        s.ep is None or s.ep.pid == _process.pid):
                    claimed = s.reloading = True
            if state in (KEPT, FALLBACK):
                if first and state == KEPT and s.prefetch_kept:
                    self.stats.add(served_in_flight=1, served_in_flight_bytes=s.meta.nbytes)
                elif first and state == KEPT and not s.served:
                    self.stats.add(kept=1, kept_bytes=s.meta.nbytes)
                self._prefetch_before(s)
                return t if t.device == s.meta.device else t.to(s.meta.device)
            if state == LOST:
                raise self._lost(s, None)
            if not claimed and s.ep is not None and s.ep.pid != _process.pid:
                raise _inherited(s)
            if state == OFFLOADING:
                t = self._serve_in_flight(s)
                if t is not None:
                    return t
            # One handle may be unpacked by several threads at once (a tensor that graphs of
            # several threads saved, de-duplicated at pack): one thread finishes its reload,
            # the others wait for it and return its result.
            if not claimed:
                if not self._claim(s):
                    return self.unpack(s)
                claimed = True
            t = self._reload_claimed(s)
        finally:
            if claimed:
                self._unclaim(s)
        return self.unpack(s) if t is _AGAIN else t

    def _claim(self, s):
        """True when this thread may finish ``s``'s reload; False after waiting for another
        thread that was finishing it (its result, or its failure, is then on ``s``)."""
        claimed = False
        try:
            with self._lock:
                if not s.reloading:
                    claimed = s.reloading = True
                    return True
                while s.reloading:
                    s.reloading = _WAITED  # the claim's holder wakes the waiters when it lets go
                    self._reloaded.wait()
                return False
        except BaseException:
            if claimed:  # interrupted as the lock was let go: the claim goes with it
                self._unclaim(s)
            raise

    def _unclaim(self, s):
        """Lets ``s``'s reload claim go and wakes the threads waiting for it. An interrupt
        while waiting for the lock does not keep the claim (every later unpack of ``s`` would
        wait for it forever): the wait goes on, and the first interrupt is raised after."""
        interrupted = acquire_surely(self._lock)
        try:
            waited, s.reloading = s.reloading is _WAITED, False
            if waited:
                self._reloaded.notify_all()
        finally:
            self._lock.release()
        if interrupted is not None:
            try:
                raise interrupted
            finally:
                interrupted = None

    def _reload_claimed(self, s):
        """The reload part of unpack, by the one thread that claimed ``s``: the tensor, or
        _AGAIN when ``s`` became a fallback meanwhile (unpack it again). The hooks in C run its
        usual path in C (client/core/store_unpack.c) and call _reload_finish and
        _reload_raised from there."""
        if s.result is not None:  # finished by a thread that held the claim before
            return s.result
        try:
            rl = s.reload
            if rl is None:
                rl = self._start_reload(s, URGENT)
                if rl is None:  # became a fallback meanwhile
                    raise _BecameFallback()
                self.stats.add(urgent=1)
            self._prefetch_before(s)
            in_time = rl.done.done() and rl.priority == PREFETCH
        except _REASONS as e:
            error, rl = e.with_traceback(None), None
        else:
            return self._reload_finish(s, rl, in_time, time.monotonic())
        return self._reload_raised(s, error)

    def _reload_finish(self, s, rl, in_time, t0):
        """The rest of _reload_claimed once ``rl`` (a ReloadOp) is ``s``'s reload and the
        prefetch went out: the reload finished (by the lane when answered, else by the transport,
        which waits for the answer), ``s``'s reload cleared and counted (``in_time``: it was
        prefetched in time; ``t0``: time.monotonic() before the finish, for the host wait).
        Returns the tensor, or _AGAIN; raises what _reload_failed raises."""
        try:
            lane = self._lanes.get(s.device) if self._lanes else None
            t = None if lane is None else lane.finish(rl, s)  # answered: in C
            if t is None:
                t = s.ep.transport.finish_reload(rl, s.meta, self.stats,
                                                 self.unresponsive_seconds)
        except _REASONS as e:
            error, rl = e.with_traceback(None), None
        else:
            waited = time.monotonic() - t0
            with self._lock:
                s.reload = None
                if rl.release_after:
                    s.block_id = None  # the daemon freed it after the copy
                # Later unpacks of this handle get the same tensor, not another reload; kept
                # before the count, so that an unpack after a count that raised finds it.
                s.result = t
            self.stats.add_reloaded(s.meta.nbytes, in_time, waited)
            return t
        return self._reload_raised(s, error)

    def _reload_raised(self, s, e):
        """What the reload of claimed handle ``s`` raised (``e``, one of _REASONS; the hooks in
        C pass what their prefetch or finish raised), called outside the except clause that
        caught it. _BecameFallback: ``s`` became a fallback meanwhile, _AGAIN. Else raises what
        _reload_failed raises (DATA_LOSS; the daemon given up), or returns its _AGAIN."""
        # The reload's outcome keeps ``e``: no traceback, so it keeps no frame of this unpack
        # (and through them ``s`` and its reload) alive in a reference cycle; and the error
        # raised here, outside the except block, does not have ``e`` as its __context__.
        e.with_traceback(None)
        if isinstance(e, _BecameFallback):
            with self._lock:
                s.unpacked = False
            return _AGAIN
        why, unresponsive = "%s" % e, isinstance(e, errors.DaemonUnresponsive)
        e = None
        return self._reload_failed(s, why, unresponsive)

    @staticmethod
    def _keep_for_prefetch(s, ep, op):
        """Under the lock, as ``s``'s offload completes: the device tensor it read when backward
        has already asked for it back (a PREFETCH waiting for this OffloadDone) and the
        transport still holds it (CUDA), else None. Keeping it costs no more device memory than
        the reload's destination it replaces, and saves a copy that backward would wait for:
        the offload finished only just before backward needs the tensor (a link shared by many
        GPUs drains forward's offloads into backward)."""
        rl = s.reload
        if s.served or rl is None or rl.sent or rl.priority != PREFETCH:
            return None
        return ep.transport.in_flight_tensor(op)

    def _serve_in_flight(self, s):
        """A tensor still being offloaded when backward needs it: the CUDA transport still holds
        it on the device, so it is used as it is and the offload's block released once stored.
        None when the transport holds no such tensor (shm) or the offload just finished."""
        with self._lock:
            if s.state != OFFLOADING or s.op is None:
                return None
            t = s.ep.transport.in_flight_tensor(s.op)
            if t is None:
                return None
            # kept with the mark: an error or interrupt below must not leave a served handle
            # without its tensor (its offload's end then drops the block as not needed)
            s.served, s.result = True, t
            rl, s.reload = s.reload, None
        self.stats.add(served_in_flight=1, served_in_flight_bytes=s.meta.nbytes)
        if rl is not None:  # a prefetch waiting for OffloadDone: never sent
            s.ep.transport.abandon_reload(rl)
        self._prefetch_before(s)
        return t

    def _reload_failed(self, s, why, unresponsive):
        """An unpack's reload failed with ``why``. A daemon that stopped answering is given
        up (Store._abandon): a handle whose offload it never confirmed then holds the client's
        copy and is returned from it; one whose bytes only the daemon has raises
        DaemonUnresponsive. Any other failure: DATA_LOSS."""
        if unresponsive:
            self._abandon(s.ep, why)
            with self._lock:
                fell_back = s.state == FALLBACK
                s.unpacked = not fell_back
            if fell_back:
                return _AGAIN
        with self._lock:
            s.state, s.reload = LOST, None
        if unresponsive:
            self.stats.add(lost=1)
            raise errors.DaemonUnresponsive(
                "%s; a saved tensor of %d bytes that only the daemon held cannot be reloaded, "
                "so this backward cannot finish. The session was given up (the daemon frees its "
                "blocks if it resumes); later steps keep tensors in process until the daemon "
                "answers again" % (_strip_code(why), s.meta.nbytes))
        raise self._lost(s, why)

    @staticmethod
    def _check_kept(k):
        """The tensor pack left in place, after torch's version check (see Kept)."""
        t = k.tensor
        if t._version != k.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                "inplace operation: [%s %s] is at version %d; expected version %d instead "
                "(checked by offloadd, which left it in place when saved)"
                % (t.dtype, list(t.shape), t._version, k.version))
        return t

    @staticmethod
    def _check_version(s):
        """torch skips its saved-tensor version check when hooks are installed; do it here, with
        torch's words: a tensor modified in place after it was saved makes backward wrong. The
        tensor is the caller's while it lives, else the one a kept handle holds; a modification
        seen while the handle held it (Saved.modified) counts after the tensor is gone."""
        t = s.src()
        if t is None and s.state == KEPT and not s.prefetch_kept:
            t = s.tensor  # the saved tensor itself: a kept handle holds no copy
        version = t._version if t is not None else s.version
        if version == s.version and s.modified is not None:
            version = s.modified
        if version != s.version:
            raise RuntimeError(
                "one of the variables needed for gradient computation has been modified by an "
                "inplace operation: [%s %s] is at version %d; expected version %d instead "
                "(checked by offloadd, which saved it at that version)"
                % (s.meta.dtype, list(s.meta.shape), version, s.version))

    def _lost(self, s, why):
        """A new DATA_LOSS error for handle ``s``; ``why``: the failure's text (None: the handle
        was lost by an earlier unpack)."""
        self.stats.add(lost=1)
        gone = why is None or why.startswith("UNAVAILABLE")
        return errors.OffloaddError(
            errors.DATA_LOSS, "a saved tensor of %d bytes held by the offloadd daemon could not "
            "be reloaded%s (%s): this backward cannot finish; later steps keep tensors in "
            "process until the daemon is back" % (
                s.meta.nbytes, ": the daemon no longer has it" if gone else "",
                why or "lost earlier"))

    def _start_reload(self, s, priority):
        """Prepares a reload (outside the lock: it may register memory) and sends it, or
        attaches it to the offload in flight. Returns the ReloadOp, or None when the entry is
        no longer offloaded. A PREFETCH never waits for staging room (TimeoutError at once).
        The usual reload of an OFFLOADED handle goes in one C call (OffloadLane.reload)."""
        lane = self._lanes.get(s.device) if self._lanes else None
        rl = None if lane is None else lane.reload(s, priority)
        if rl is not None:
            return rl
        ep = s.ep
        if ep.pid != _process.pid:
            raise _inherited(s)  # a prefetch skips it; the parent's session is the parent's
        rl = ep.transport.prepare_reload(s.meta, wait=priority != PREFETCH)
        rl.priority = priority
        with self._lock:
            block_id = s.block_id  # read here: a reload finished meanwhile clears it
            # Stale: reloading already, not offloaded, or (a prefetch chosen before another
            # thread's unpack reloaded it and the daemon freed the block) nothing to reload.
            stale = s.reload is not None or s.state not in (OFFLOADING, OFFLOADED) or \
                (s.state == OFFLOADED and block_id is None)
            if not stale:
                s.reload = rl
                send_now = s.state == OFFLOADED
        if stale:
            ep.transport.abandon_reload(rl)
            return s.reload
        if send_now:
            try:
                ep.transport.send_reload(rl, block_id, priority, release_after=True)
            except BaseException:  # an interrupt too: a reload never sent is let go
                if not rl.sent:
                    with self._lock:
                        if s.reload is rl:
                            s.reload = None
                    ep.transport.abandon_reload(rl)
                raise
        return rl

    def _prefetch_before(self, s):
        """Prefetches what backward will unpack next: the ``prefetch`` offloaded entries saved
        before ``s`` (eager backward runs in reverse order of saving) and, when the entry saved
        right after ``s`` is still waiting to be unpacked (a consumer that unpacks in forward
        order, such as a compiled graph's backward node), the ``prefetch`` pending entries after
        ``s`` too -- but only where the order looks forward: the previous unpack was the entry
        before ``s``, or no entry before ``s`` waits (``s`` starts a run). Entries worth it
        await their unpack (offloading or offloaded) and their step position was not left
        unused in an earlier step; the scan back looks at no more than 4 x prefetch + 16
        entries. An entry saved by a branch backward never reaches waits forever without being
        unpacked; such a prefetch counts in ``stats.prefetched_unused``."""
        with self._lock:
            previous, self._last_unpacked_seq = self._last_unpacked_seq, s.seq
            if self.prefetch <= 0:
                return
            todo = self._front.prefetch_candidates(s.seq, previous, self.prefetch,
                                                   self._unused_offsets)
        for o in todo:
            try:
                self._start_reload(o, PREFETCH)
            except _RECOVERABLE:
                pass  # the unpack of o will try URGENT and report

    # ---- lifetime ----------------------------------------------------------------------------
    def _on_death(self, unpacked, offset, state, ep, op, rl, block_id, prefetch_kept):
        """A handle died (called once by the record, out of every table and with no weak
        reference left to it; its fields as arguments): its cleanup is queued (see _Reaper).
        The usual end (unpacked, no offload in flight, no block left to free) the record does
        itself, without this call: it discards the offset from ``_unused_offsets``.
        An offload still in flight hands its reload to _offload_orphaned, which frees the block
        and the reload once it is answered (or it is freed here when that already ran)."""
        if not unpacked:
            self._unused_offsets.add(offset)
            if rl is not None or prefetch_kept:  # counted on the reaper: no locks here
                stats = self.stats
                reaper.put(lambda: stats.add(prefetched_unused=1))
        else:
            self._unused_offsets.discard(offset)
        if state == OFFLOADING and op is not None:
            with self._lock:
                taken = op.orphan_reload is _ORPHAN_TAKEN
                if not taken:
                    op.orphan_reload = rl
            if taken and rl is not None:
                reaper.put(lambda: ep.transport.abandon_reload(rl))
            return
        if state == OFFLOADED and block_id is not None:  # None: freed by its reload
            release_later(ep, block_id, rl)

    def live_handles(self):
        """Saved handles of this store still alive (tests: 0 after a step)."""
        return self._front.live()

    def handles(self):
        """The live Saved handles of this store, oldest first (tests)."""
        return self._front.handles()

    def seen_entries(self):
        """Entries of this step's de-duplication table (tests: two at most per live handle)."""
        return self._front.seen_entries()

    def _after_fork_in_child(self):
        """In a forked child: the parent's step is not the child's. Forgets what the store keeps
        per step -- the de-duplication table (a tensor the parent saved would otherwise get the
        parent's handle), the handles waiting to be offloaded and the order prefetch walks --
        so the child neither matches, offloads nor prefetches a handle of its parent; a parent
        handle the child unpacks still raises FAILED_PRECONDITION (_inherited). Its statistics
        start at zero: the child counts its own work. The locks are new: a parent thread may
        have held them at the fork."""
        self._lock = threading.RLock()
        self._reloaded = threading.Condition(self._lock)
        self._thread = threading.local()
        self._open_steps = set()
        self._front.forget()
        self._async_error = None
        self._unpacking = False
        self.stats._lock = threading.Lock()
        self.stats.reset()  # the child counts its own work (the parent's stays the parent's)
        self._end_step()



# After _endpoint's close_all was registered (it is imported above): handlers run last-in
# first-out, so every store's step ends before the endpoints send their last reports.
atexit.register(finish_steps)


def _lane_for(ep):
    """The OffloadLane of endpoint ``ep`` (after it served an offload of this step, which
    checked the allocator's settings), or None where the usual offload and reload stay in
    Python: the shm transport (its staging copies)."""
    if type(ep.transport) is not CudaIpcTransport:
        return None
    return _front.OffloadLane(ep, _FULL_UNTIL, OffloadOp, ReloadOp, functools.partial)


def _stores_after_fork_in_child():
    for store in list(_STORES):
        store._after_fork_in_child()


os.register_at_fork(after_in_child=_stores_after_fork_in_child)


def _note_version(s, t, baseline=None):
    """Records on handle ``s`` that ``t`` (None: not at hand) was modified in place since the
    pack; the first change seen counts. ``t`` is the tensor ``s`` saved, whose version at the
    pack is ``s.version`` (``baseline`` None), or a copy of it whose version was ``baseline``
    when made (a transport's device source); ``s.modified`` is in the saved tensor's versions."""
    if t is None or s.modified is not None:
        return
    base = s.version if baseline is None else baseline
    if t._version != base:
        s.modified = s.version + t._version - base


def _held(t):
    """``t`` as a handle keeps it for good (a fallback, a tensor left in place): an autograd
    node's output detached. ``t`` holds its grad_fn, which may be the node whose saved variable
    holds the handle (exp saves its output): a cycle through torch's graph that Python's
    collector cannot see, so a graph dropped without backward would keep the tensor forever.
    The detached tensor shares the storage and the version counter; autograd gives what unpack
    returns the saved variable's own grad_fn. (A handle waiting for keep_last_n holds the
    tensor itself: the next packs offload it, which lets it go.)"""
    return t.detach() if t is not None and t.grad_fn is not None else t


def _refusal_reason(exc):
    """Why an offload in flight became a fallback, in words that say what happened: the daemon
    refused it, or stopped answering, or the session ended before the daemon confirmed it."""
    if isinstance(exc, errors.DaemonUnresponsive):
        return "the offloadd daemon stopped answering before it confirmed a tensor's offload " \
            "(%s)" % exc
    if isinstance(exc, errors.DaemonUnavailable):
        return "the offloadd session ended before the daemon confirmed a tensor's offload " \
            "(%s)" % exc
    return "offloadd refused a tensor (%s)" % exc


def _inherited(s):
    """The error for reloading, in a forked child, a tensor its parent offloaded."""
    return errors.OffloaddError(
        errors.FAILED_PRECONDITION, "a saved tensor of %d bytes was offloaded by process %d, "
        "which forked this process %d: only the process that ran forward can reload it from "
        "its offloadd session; run backward in that process (in a child, run forward and "
        "backward there)" % (s.meta.nbytes, s.ep.pid, os.getpid()))


def _strip_code(why):
    """An error's text without its "DEADLINE_EXCEEDED: " prefix."""
    prefix = errors.CODE_NAMES[errors.DEADLINE_EXCEEDED] + ": "
    return why[len(prefix):] if why.startswith(prefix) else why


class _StepCounts:
    """What one thread's step saw (for the idle-step warning): its packs, and whether its
    backward began (``unpacked``: an unpack on the same thread; or a change of the store's
    ``_foreign_unpacks`` from ``foreign_unpacks``, the count when the step began)."""

    __slots__ = ("packs", "eligible", "sent", "largest_bytes", "categories", "device",
                 "unpacked", "foreign_unpacks", "counted", "thread")

    def __init__(self, foreign_unpacks=0):
        self.thread = threading.current_thread()  # whose step: one that ended has no next pack
        self.packs = self.eligible = self.sent = self.largest_bytes = 0
        self.unpacked = self.counted = False  # counted: its idle check ran (never twice)
        self.foreign_unpacks = foreign_unpacks
        self.categories = {}  # category -> tensors left in place for it
        self.device = None  # of the step's first saved tensor: whose totals an idle step joins

    def saw(self, t, category):
        if self.packs == 0:
            self.device = t.device
        self.packs += 1
        if category is None:
            self.eligible += 1
        else:
            self.categories[category] = self.categories.get(category, 0) + 1
        if category == "small":
            self.largest_bytes = max(self.largest_bytes, t.numel() * t.element_size())

    def idle_reason(self, store):
        """None when the step tried to send something to the daemon (or packed nothing), else
        why not."""
        if self.packs == 0 or self.sent > 0:
            return None
        if self.eligible > 0:
            return ("a training step sent none of its %d eligible saved tensors to offloadd: "
                    "keep_last_n=%d keeps that many on the device (use keep_last_n=0, or "
                    "checkpoint more layers)" % (self.eligible, store.keep_last_n))
        left = ", ".join("%d %s" % (n, c) for c, n in sorted(self.categories.items()))
        why = ""
        if self.categories.get("small"):
            why = ("; the largest small one was %d bytes, below threshold_bytes=%d: lower "
                   "threshold_bytes, or check that checkpointing is on (only checkpointed "
                   "layer inputs are meant to go)" % (self.largest_bytes, store.threshold_bytes))
        return ("a training step sent nothing to offloadd: all %d saved tensors were left in "
                "place (%s)%s" % (self.packs, left, why))
