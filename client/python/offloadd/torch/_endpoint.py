"""One daemon connection per process per device: client + transport, reconnects, warn-once.

``get(socket_path, device)`` returns the process's Endpoint for (socket, device) -- one
offloadd.client.Client (one Session stream) and its transport -- connecting on first use. When the
daemon is unreachable it returns None with the reason, and does not try that (socket, device)
again for ``retry_seconds`` (so a training step never waits on connect timeouts twice). A dead
endpoint (the daemon stopped) is dropped and reconnected after the same back-off.

Device ids sent in Hello: "cpu" for CPU tensors; for CUDA tensors the GPU's UUID (offloadd.cuda)
or, when the driver cannot be asked, "cuda:<ordinal>"; other device kinds registered with
offloadd._devices name their own (with a simulated GPU active, offloadd.testing.sim_gpu, CPU
tensors belong to its current device, whose UUID is the one a cuda-sim daemon gives it). The
transport follows the daemon's backend: "shm" -> ShmTransport for any device; "cuda" ->
CudaIpcTransport for a device whose kind has a CUDA device object (a CPU tensor needs a shm daemon
and falls back otherwise).

A daemon whose pool (or this session's or uid's quota) stays full refuses an offload with
RESOURCE_EXHAUSTED only after its admission deadline: ``mark_full`` records such a refusal, and
for ``retry_seconds`` afterwards ``full_reason`` tells the hooks not to send that (socket, device)
any offload (they fall back at once, with the refusal as the reason); the first offload after the
back-off asks the daemon again. Without it every step would wait out the admission deadline.

Fallback bookkeeping is process-wide: ``warn_once`` emits one RuntimeWarning per process;
``fallbacks_total()`` counts every fallback of every context. Each endpoint reports its device's
totals (fallbacks, host waits, idle steps: offloadd.torch._stats.device_totals) to its daemon
(Client.report) when they changed, at most once per REPORT_INTERVAL_SECONDS from step ends, and
at once from synchronize() and at exit, so operators see clients that fell back in the daemon's
metrics (``offloadd_client_fallbacks_total``) and ``offloadctl sessions``.
"""

import atexit
import functools
import os
import sys
import threading
import time
import warnings

from .. import _devices, _native, _process
from .. import client as _client
from .. import errors
from ..client import Client
from ..socket_path import default_socket_path
from . import _stats
from . import _transport
from ._live import finish_steps
from ._reaper import reaper
from ._transport_protocol import Transport

_lock = threading.Lock()
_endpoints = {}     # (pid, socket_path, device key) -> Endpoint
_down_until = {}    # (pid, socket_path, device key) -> (monotonic deadline, reason)
_full_until = {}    # (pid, socket_path, device key) -> (monotonic deadline, reason)
_warned = [False]
_fallbacks = [0]
_idle_warned = [False]
_idle_steps = [0]
_acked_lock = threading.Lock()
_acked = {}  # (socket path, device key) -> the device totals a session of this process acked

# Seconds between two reports of an endpoint from step ends (synchronize and exit report at once).
REPORT_INTERVAL_SECONDS = 1.0

# Staging arena sizes for ShmTransport (bytes); tests and benchmarks may change them.
STAGING_GROW_BYTES = 16 << 20
STAGING_MAX_BYTES = 4 << 30


# "cuda:<ordinal>", another registered device kind's "<kind>:<ordinal>" (e.g. a CPU tensor of an
# active simulated GPU) or the device type (e.g. "cpu"): offloadd._devices.device_key.
device_key = _devices.device_key


class Endpoint:
    """A connected client and the transport for one device. Raises what Client raises, or
    OffloaddError FAILED_PRECONDITION when the daemon's backend cannot serve this device."""

    def __init__(self, socket_path, key, connect_timeout_seconds, unresponsive_seconds=20.0):
        self.key = key
        self.pid = os.getpid()  # a forked child must neither use nor close its parent's
        kind, ordinal = _devices.kind_of(key)
        device_id, make_cuda_device = key, None
        if kind is not None:
            device_id, make_cuda_device = kind.open(ordinal)
        name = "%s pid %d %s" % (os.path.basename(sys.argv[0] or "python"), os.getpid(), key)
        self.client = Client(socket_path, client_name=name, device_id=device_id,
                             connect_timeout_seconds=connect_timeout_seconds,
                             unresponsive_seconds=unresponsive_seconds)
        backend = self.client.backend
        self.transport: Transport
        try:
            if backend == "shm":
                self.transport = _transport.ShmTransport(self.client, STAGING_GROW_BYTES,
                                                         STAGING_MAX_BYTES)
            elif backend == "cuda" and make_cuda_device is not None:
                self.transport = _transport.CudaIpcTransport(self.client, make_cuda_device())
            else:
                raise errors.OffloaddError(
                    errors.FAILED_PRECONDITION,
                    "the daemon at %s runs the %r backend, which cannot take %s tensors (CPU "
                    "tensors need a daemon with backend: \"shm\")" % (socket_path, backend, key))
        except BaseException:
            self.client.close(timeout=1.0)
            raise
        self.transport.device_key = key
        # The daemon adds each session's first report in full to its per-GPU counters: a later
        # endpoint of this process (after end-session, a broken or abandoned one) reports only
        # what no earlier session of this daemon socket acknowledged.
        self.socket_path = socket_path
        with _acked_lock:  # get() holds _lock
            self.base = dict(_acked.get((socket_path, key)) or _stats.device_totals(None))
        self.reported = _stats.device_totals(None)  # the last report's values (since base)
        self.reported_at = 0.0
        # The session began before its Hello was answered: this age is at most the daemon's.
        self.opened_at = time.monotonic()
        # abandon(): (the thread giving the session up, an Event set when it is done), or None.
        self.giving_up = None

    @property
    def alive(self):
        return self.client.alive

    def report(self, force=False):
        """Sends this device's totals to the daemon when they changed since the last report,
        unless one went less than REPORT_INTERVAL_SECONDS ago (``force``: regardless). Never
        blocks and never raises: the answer is not awaited; a daemon that refuses the report
        (an older one) only leaves the counts unseen there. The daemon refuses a whole report
        whose host_wait_seconds_total passes the session's age (+1 s); several threads that
        wait at once can sum to more: the report then carries the session's age and the rest
        goes in later reports (and sessions), once the session is old enough."""
        now = time.monotonic()
        if not force and now - self.reported_at < REPORT_INTERVAL_SECONDS:
            return  # checked first: a step's end asks, and the totals' copy is not free
        totals = _stats.device_totals(self.key)
        sent = {k: totals[k] - self.base[k] for k in totals}
        sent["host_wait_seconds_total"] = max(
            min(sent["host_wait_seconds_total"], now - self.opened_at),
            self.reported["host_wait_seconds_total"])
        if sent == self.reported:
            return
        self.reported, self.reported_at = sent, now
        accepted = {k: self.base[k] + sent[k] for k in sent}
        acked_key = (self.socket_path, self.key)

        def acked(future):
            if future.cancelled() or future.exception() is not None:
                return
            with _acked_lock:
                before = _acked.get(acked_key) or accepted
                _acked[acked_key] = {k: max(before[k], accepted[k]) for k in accepted}

        try:
            self.client.report(**sent).add_done_callback(acked)
        except Exception:
            pass

    def close(self, timeout=2.0):
        self.client.close(timeout=timeout)
        try:
            self.transport.close()
        except Exception:
            pass


def get(socket_path, device, retry_seconds=30.0, connect_timeout_seconds=5.0,
        unresponsive_seconds=20.0):
    """(Endpoint, None) or (None, reason string). Thread-safe; connects under a lock so one
    thread connects while others wait. A new endpoint's client gets ``unresponsive_seconds``."""
    socket_path = socket_path or default_socket_path()
    key = (os.getpid(), socket_path, device_key(device))
    with _lock:
        ep = _endpoints.get(key)
        if ep is not None:
            if ep.alive:
                return ep, None
            del _endpoints[key]
            _down_until[key] = (time.monotonic() + retry_seconds,
                                "the daemon session ended: %s" % (ep.client._dead,))
            ep.close(timeout=0.1)
        down = _down_until.get(key)
        if down is not None and time.monotonic() < down[0]:
            return None, down[1]
        try:
            ep = Endpoint(socket_path, key[2], connect_timeout_seconds, unresponsive_seconds)
        except Exception as e:  # any set-up failure (daemon, CUDA runtime) means: fall back
            _down_until[key] = (time.monotonic() + retry_seconds, str(e))
            return None, str(e)
        _down_until.pop(key, None)
        _endpoints[key] = ep
        return ep, None


def mark_broken(ep, reason, retry_seconds=30.0):
    """Drops ``ep`` after a failure that makes it unusable (the stream is gone)."""
    with _lock:
        for key, cur in list(_endpoints.items()):
            if cur is ep:
                del _endpoints[key]
                _down_until[key] = (time.monotonic() + retry_seconds, reason)


def mark_full(ep, reason, retry_seconds=30.0):
    """Records that the daemon behind ``ep`` refused an offload with RESOURCE_EXHAUSTED
    (``reason``: the refusal's text): no offload goes to its (socket, device) for
    ``retry_seconds`` seconds (``full_reason``)."""
    with _lock:
        _full_until[(ep.pid, ep.socket_path, ep.key)] = (time.monotonic() + retry_seconds,
                                                         reason)


def full_reason(ep):
    """The refusal that ``mark_full`` recorded for ``ep``'s (socket, device) while its back-off
    lasts, else None (the back-off is over: offloads go to the daemon again)."""
    key = (ep.pid, ep.socket_path, ep.key)
    full = _full_until.get(key)
    if full is None:
        return None
    if time.monotonic() < full[0]:
        return full[1]
    with _lock:
        if _full_until.get(key) is full:
            del _full_until[key]
    return None


def abandon(ep, failure, retry_seconds=30.0):
    """Gives up on ``ep`` after the daemon stopped answering (``failure``: a
    DaemonUnresponsive): its requests fail at once -- offloads still in flight complete as
    fallbacks from the copies the client holds -- the stream is cancelled (a daemon that resumes
    frees the session's blocks), and the (socket, device) is not tried again for
    ``retry_seconds``. Never blocks on the daemon.

    One thread gives the session up; another thread's call (threads training on one context,
    each waiting on the frozen daemon) waits until it is done, so that every offload in flight
    has become a fallback and the staging memory is closed only after the copies out of it:
    returning earlier, it could find its own tensor still in flight and call it lost. A call
    from within the give-up (a callback it runs) returns at once."""
    me = threading.get_ident()
    with _lock:
        giving_up = ep.giving_up
        if giving_up is None:
            ep.giving_up = (me, threading.Event())
    if giving_up is not None:
        if giving_up[0] != me:
            giving_up[1].wait()
        return
    try:
        mark_broken(ep, str(failure), retry_seconds)
        ep.client.abandon(failure)
        try:
            ep.transport.close()  # its shared-memory names and mappings go now, not at exit
        except Exception:
            pass
    finally:
        ep.giving_up[1].set()


def count_fallback(reason, warn=True, device=None):
    """Counts one fallback (for ``device``'s totals too, when given); the first warned one in the
    process emits one RuntimeWarning."""
    if device is not None:
        _stats.count_for_device(device_key(device), fallbacks=1)
    with _lock:
        _fallbacks[0] += 1
        first = warn and not _warned[0]
        _warned[0] = _warned[0] or warn
    if first:
        warnings.warn("offloadd: %s; keeping saved tensors in this process instead (pinned host "
                      "copies for CUDA tensors where possible). Training continues; fallbacks "
                      "are counted in each context's stats. This warning is shown once per "
                      "process." % reason, RuntimeWarning, stacklevel=3)


def count_idle_step(reason, device=None):
    """Counts a step that sent nothing to the daemon (for ``device``'s totals too, when given);
    the first one warns (once per process)."""
    if device is not None:
        _stats.count_for_device(device_key(device), idle_steps=1)
    with _lock:
        _idle_steps[0] += 1
        first = not _idle_warned[0]
        _idle_warned[0] = True
    if first:
        warnings.warn("offloadd: offload is on but %s. Counted in each context's "
                      "stats.idle_steps and offloadd.torch.idle_steps_total(); this warning is "
                      "shown once per process." % reason, RuntimeWarning, stacklevel=4)


def idle_steps_total() -> int:
    """Steps in this process (all contexts) that saved tensors but sent none to the daemon."""
    return _idle_steps[0]


def fallbacks_total() -> int:
    """Fallbacks in this process since import (all contexts)."""
    return _fallbacks[0]


def report(force=False):
    """Each live endpoint of this process reports its device's totals (Endpoint.report)."""
    for ep in endpoints():
        ep.report(force)


def reset_for_tests():
    """Closes every endpoint and forgets back-off, the warn-once flag and the device totals
    (tests only)."""
    close_all()
    _stats.reset_device_totals()
    with _acked_lock:
        _acked.clear()
    with _lock:
        _down_until.clear()
        _full_until.clear()
        _warned[0] = False
        _fallbacks[0] = 0
        _idle_warned[0] = False
        _idle_steps[0] = 0


def close_all() -> None:
    """Closes every endpoint of this process (the daemon releases their blocks). Endpoints
    inherited through fork are only forgotten: their gRPC channels belong to the parent, and
    closing them from the child blocks forever."""
    with _lock:
        eps = list(_endpoints.values())
        _endpoints.clear()
    for ep in eps:
        if ep.pid == os.getpid():
            ep.report(force=True)  # answered before close() ends the stream
            ep.close()


def synchronize(timeout: float = 10.0) -> bool:
    """Waits until every request this process sent (offloads, reloads, releases) is answered:
    afterwards the daemon's stats reflect everything released so far. True if all completed.
    Also counts the current step as idle where it sent nothing and its backward has begun
    (Store.finish_step): a run's last step has no next step to end it."""
    finish_steps()
    report(force=True)
    deadline = time.monotonic() + timeout
    while True:
        # A release can be chained on a reload in flight (a dead handle's prefetch): it is sent
        # when that reload completes, after a drain began. Repeat until a round sent nothing.
        sent = _requests_sent()
        left = max(deadline - time.monotonic(), 0.0)
        ok = reaper.flush(left)
        for ep in endpoints():
            ok = ep.client.drain(max(deadline - time.monotonic(), 0.0)) and ok
        if not ok or _requests_sent() == sent:
            return ok
        if time.monotonic() >= deadline:
            return False


# Client.pump(0.0) with its usual case in one C call (offloadd._store_front.pump), else itself.
_pump_client = _client._pump_in_c or (lambda client, batch, take: client.pump())
_DRAIN_BATCH = _native.DRAIN_BATCH


def pump():
    """Takes the answers waiting on the request rings of this process's endpoints and completes
    their requests on the calling thread (Client.pump: their callbacks, such as the store's
    OffloadDone handling, run here). The hooks call it at every pack and unpack (as
    :data:`hooks_pump`); it costs a few attribute tests when nothing is in flight on a ring.
    Endpoints inherited through fork are the parent's: left alone."""
    pid = _process.pid
    for ep in tuple(_endpoints.values()):
        if ep.pid == pid:
            _pump_client(ep.client, _DRAIN_BATCH, _client._take_answers)


def _hooks_pump():
    """pump() in one C call (offloadd._store_front.pump_all) where the extension module has it,
    else pump itself."""
    if _client._pump_in_c is None:
        return pump
    pump_all = getattr(_native.load_store_front(), "pump_all", None)
    if pump_all is None:  # a module built before it had pump_all
        return pump
    return functools.partial(pump_all, _endpoints, _DRAIN_BATCH, _client)


# What the hooks call at every pack and unpack: pump(), without a Python frame of its own.
hooks_pump = _hooks_pump()


def _requests_sent():
    """Requests this process's endpoints sent so far, on their streams and rings."""
    return sum(ep.client.counters.requests_sent + ep.client.counters.ring_requests_sent
               for ep in endpoints())


def endpoints():
    """The live endpoints of this process (for stats and tests)."""
    with _lock:
        return [ep for (pid, _, _), ep in _endpoints.items() if pid == os.getpid()]


def _after_fork_in_child():
    """The parent's threads are gone in a forked child: a lock one of them held stays locked.
    The child's sessions are its own: it reports its totals from zero (the parent's acked
    totals as its base made its first report negative, refused, and its fallbacks were never
    counted by the daemon) and keeps none of the parent's unreachable-daemon back-offs."""
    global _lock, _acked_lock
    _lock = threading.Lock()
    _acked_lock = threading.Lock()
    _acked.clear()
    _down_until.clear()


atexit.register(close_all)
os.register_at_fork(after_in_child=_after_fork_in_child)
