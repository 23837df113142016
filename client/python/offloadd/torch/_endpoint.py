"""One daemon connection per process per device: client + transport, reconnects, warn-once.

``get(socket_path, device)`` returns the process's Endpoint for (socket, device) -- one
offloadd.client.Client (one Session stream) and its transport -- connecting on first use. When the
daemon is unreachable it returns None with the reason, and does not try that (socket, device)
again for ``retry_seconds`` (so a training step never waits on connect timeouts twice). A dead
endpoint (the daemon stopped) is dropped and reconnected after the same back-off.

Device ids sent in Hello: "cpu" for CPU tensors; for CUDA tensors the GPU's UUID (offloadd.cuda)
or, when the driver cannot be asked, "cuda:<ordinal>". The transport follows the daemon's
backend: "shm" -> ShmTransport for any device; "cuda" -> CudaIpcTransport for CUDA tensors (a CPU
tensor needs a shm daemon and falls back otherwise).

Fallback bookkeeping is process-wide: ``warn_once`` emits one RuntimeWarning per process;
``fallbacks_total()`` counts every fallback of every context.
"""

import atexit
import os
import sys
import threading
import time
import warnings

from .. import errors
from ..client import Client
from ..socket_path import default_socket_path
from . import _transport

_lock = threading.Lock()
_endpoints = {}     # (pid, socket_path, device key) -> Endpoint
_down_until = {}    # (pid, socket_path, device key) -> (monotonic deadline, reason)
_warned = [False]
_fallbacks = [0]
_idle_warned = [False]
_idle_steps = [0]

# Staging arena sizes for ShmTransport (bytes); tests and benchmarks may change them.
STAGING_GROW_BYTES = 16 << 20
STAGING_MAX_BYTES = 4 << 30


def device_key(device):
    if device.type == "cuda":
        import torch
        index = device.index if device.index is not None else torch.cuda.current_device()
        return "cuda:%d" % index
    return device.type


class Endpoint:
    """A connected client and the transport for one device. Raises what Client raises, or
    OffloaddError FAILED_PRECONDITION when the daemon's backend cannot serve this device."""

    def __init__(self, socket_path, key, connect_timeout_seconds):
        self.key = key
        device_id = key
        cuda_runtime = None
        if key.startswith("cuda:"):
            try:
                from .. import cuda
                cuda_runtime = cuda.CudaRuntime()
                device_id = cuda_runtime.device_uuid(int(key[5:]))
            except Exception:
                cuda_runtime = None
        name = "%s pid %d %s" % (os.path.basename(sys.argv[0] or "python"), os.getpid(), key)
        self.client = Client(socket_path, client_name=name, device_id=device_id,
                             connect_timeout_seconds=connect_timeout_seconds)
        backend = self.client.backend
        try:
            if backend == "shm":
                self.transport = _transport.ShmTransport(self.client, STAGING_GROW_BYTES,
                                                         STAGING_MAX_BYTES)
            elif backend == "cuda" and key.startswith("cuda:"):
                self.transport = _transport.CudaIpcTransport(self.client, cuda_runtime)
            else:
                raise errors.OffloaddError(
                    errors.FAILED_PRECONDITION,
                    "the daemon at %s runs the %r backend, which cannot take %s tensors (CPU "
                    "tensors need a daemon with backend: \"shm\")" % (socket_path, backend, key))
        except BaseException:
            self.client.close(timeout=1.0)
            raise

    @property
    def alive(self):
        return self.client.alive

    def close(self, timeout=2.0):
        self.client.close(timeout=timeout)
        try:
            self.transport.close()
        except Exception:
            pass


def get(socket_path, device, retry_seconds=30.0, connect_timeout_seconds=5.0):
    """(Endpoint, None) or (None, reason string). Thread-safe; connects under a lock so one
    thread connects while others wait."""
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
            ep = Endpoint(socket_path, key[2], connect_timeout_seconds)
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


def count_fallback(reason, warn=True):
    """Counts one fallback; the first warned one in the process emits one RuntimeWarning."""
    with _lock:
        _fallbacks[0] += 1
        first = warn and not _warned[0]
        _warned[0] = _warned[0] or warn
    if first:
        warnings.warn("offloadd: %s; keeping saved tensors in this process instead (pinned host "
                      "copies for CUDA tensors where possible). Training continues; fallbacks "
                      "are counted in each context's stats. This warning is shown once per "
                      "process." % reason, RuntimeWarning, stacklevel=3)


def count_idle_step(reason):
    """Counts a step that sent nothing to the daemon; the first one warns (once per process)."""
    with _lock:
        _idle_steps[0] += 1
        first = not _idle_warned[0]
        _idle_warned[0] = True
    if first:
        warnings.warn("offloadd: offload is on but %s. Counted in each context's "
                      "stats.idle_steps and offloadd.torch.idle_steps_total(); this warning is "
                      "shown once per process." % reason, RuntimeWarning, stacklevel=4)


def idle_steps_total():
    """Steps in this process (all contexts) that saved tensors but sent none to the daemon."""
    return _idle_steps[0]


def fallbacks_total():
    """Fallbacks in this process since import (all contexts)."""
    return _fallbacks[0]


def reset_for_tests():
    """Closes every endpoint and forgets back-off and the warn-once flag (tests only)."""
    close_all()
    with _lock:
        _down_until.clear()
        _warned[0] = False
        _fallbacks[0] = 0
        _idle_warned[0] = False
        _idle_steps[0] = 0


def close_all():
    """Closes every endpoint of this process (the daemon releases their blocks)."""
    with _lock:
        eps = list(_endpoints.values())
        _endpoints.clear()
    for ep in eps:
        ep.close()


def synchronize(timeout=10.0):
    """Waits until every request this process sent (offloads, reloads, releases) is answered:
    afterwards the daemon's stats reflect everything released so far. True if all completed."""
    from ._reaper import reaper
    ok = reaper.flush(timeout)
    for ep in endpoints():
        ok = ep.client.drain(timeout) and ok
    return ok


def endpoints():
    """The live endpoints of this process (for stats and tests)."""
    with _lock:
        return [ep for (pid, _, _), ep in _endpoints.items() if pid == os.getpid()]


atexit.register(close_all)
