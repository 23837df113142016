"""What the store asks of a transport: :class:`Transport`, which ShmTransport and CudaIpcTransport
(offloadd/torch/_transport.py) implement.

A transport moves one saved tensor's dense span (``meta.nbytes`` bytes; offloadd.torch._transport
explains the span) to the daemon and back over one Endpoint's client. The store drives each
tensor through: ``start_offload`` -> (OffloadDone) ``finish_offload``, or on a failure ``rescue``;
later ``prepare_reload`` -> ``send_reload`` -> ``finish_reload``, or ``abandon_reload`` for a
reload nobody will consume. ``meta`` is an offloadd.torch._transport.Meta (shape, stride, dtype,
device, numel, nbytes); ops are the _transport module's OffloadOp / ReloadOp, opaque to the
store but for ``OffloadOp.future`` (the Offload request's Future), ``ReloadOp.done`` (an
outcome of ReloadDone, Client.reload_outcome) and ``ReloadOp.sent``.

Errors common to every method that talks to the daemon: offloadd.errors.OffloaddError (the
daemon's refusal, with its code), DaemonUnavailable (the stream is gone), DaemonUnresponsive
(the daemon stayed silent for ``unresponsive_seconds``), OSError (shared memory). The store
treats those as a fallback for the tensor; offloadd.errors.OffloadConfigError (an allocator
whose memory cannot be exported) is raised to the caller.
"""

from typing import Any, Optional, Protocol, Tuple, runtime_checkable


@runtime_checkable
class Transport(Protocol):
    """One device's data path to the daemon. Thread-safety: every method may be called from any
    thread (training, autograd, the client's reader, the reaper); ``release_dest`` is
    idempotent."""

    client: Any
    """The offloadd.client.Client whose session carries the requests."""
    device_key: Optional[str]
    """The device's key (offloadd._devices), set by the Endpoint: host waits count toward this
    device's totals (offloadd.torch._stats)."""

    def start_offload(self, t: Any, meta: Any, ordering: Optional[Tuple[int, int]] = None,
                      timeout: Optional[float] = None,
                      unresponsive_seconds: Optional[float] = None,
                      check_allocator: bool = True, target: Any = None) -> Any:
        """Sends the Offload of tensor ``t`` (layout ``meta``) and returns its OffloadOp at once
        (the answer arrives on ``op.future``). ``ordering``: (step, position) for the daemon's
        spill tier. ``timeout`` (seconds, None: the transport's own bound) caps a wait for
        staging room; ``unresponsive_seconds`` ends any wait when the daemon stays silent that
        long. ``check_allocator``: check the device allocator's settings first. ``target``: a
        weak reference to the hooks' handle (Saved); a transport whose finish_offload C can do
        passes it on to Client.offload, which may then apply the OffloadDone to the handle
        without the op's callback (the others ignore it). Raises TimeoutError,
        DaemonUnresponsive, OffloaddError, OffloadConfigError."""

    def finish_offload(self, op: Any) -> None:
        """After the Offload's answer (either outcome): frees what the op held (staging slot,
        device tensor, ready event). Never raises."""

    def rescue(self, op: Any, meta: Any, pin_memory: bool) -> Any:
        """After a failed offload, before ``finish_offload``: a tensor with ``meta``'s layout
        holding the saved bytes, kept in process (host memory, pinned when ``pin_memory`` and
        CUDA is there; or the held device tensor itself)."""

    def in_flight_tensor(self, op: Any) -> Any:
        """The tensor an offload still in flight reads, which a backward may use as it is
        before OffloadDone; None when the transport holds only a copy."""

    def prepare_reload(self, meta: Any, wait: bool = True) -> Any:
        """A ReloadOp with a destination for ``meta.nbytes`` bytes, not sent yet. ``wait=False``
        (prefetches) raises TimeoutError at once where room would have to be waited for.
        Raises DaemonUnresponsive, OffloaddError."""

    def send_reload(self, op: Any, block_id: int, priority: int,
                    release_after: bool = False) -> None:
        """Sends the Reload of daemon block ``block_id`` into ``op``'s destination at
        ``priority`` (offloadd.client.URGENT / PREFETCH); ``release_after``: the daemon frees
        the block once copied. Sets ``op.sent``; the answer completes ``op.done``."""

    def finish_reload(self, op: Any, meta: Any, stats: Any = None,
                      unresponsive_seconds: Optional[float] = None) -> Any:
        """Waits for ReloadDone (a host wait, counted in ``stats``, an OffloadStats, only when
        it has not arrived) and returns the reloaded tensor, bitwise and layout-identical to
        the saved one, on ``meta.device``. Raises what the reload's answer carries,
        DaemonUnresponsive after ``unresponsive_seconds`` of silence, OffloaddError DATA_LOSS
        when a simulated GPU's checksum differs."""

    def release_dest(self, op: Any) -> None:
        """Lets go of a reload's destination (staging slot); idempotent, any thread."""

    def abandon_reload(self, op: Any) -> None:
        """A reload nobody will consume: its destination is released once the daemon can no
        longer write it (at once when it was never sent)."""

    def close(self) -> None:
        """Releases the transport's own resources (the staging arena); requests in flight are
        the client's."""
