"""Per-context offload statistics (tensors and bytes; seconds for waits).

Counted by the context's store (offloadd/torch/_store.py):
  offloaded   saved tensors the daemon took (OffloadDone), and their bytes
  reloaded    tensors read back from the daemon in backward (ReloadDone consumed by an unpack)
  prefetched_in_time  reloads that were complete when backward asked (issued as PREFETCH)
  waited      reloads backward had to wait for (prefetch still running, or issued URGENT then),
              with the seconds spent waiting in ``waited_seconds``
  urgent      reloads requested only when backward asked for the tensor (no prefetch had been
              issued for it): the first of each step in eager backward, plus the first of each
              compiled graph's backward node under torch.compile (see README, torch.compile)
  prefetched_unused  tensors reloaded (or kept on the device, see served_in_flight) ahead of
              need whose handle died without being unpacked
              (saved by a branch backward never reached): link traffic for nothing
  kept        tensors eligible for offload kept on their device (the newest keep_last_n)
  fallbacks   tensors kept in-process because the daemon was unreachable or refused
              (pinned host copy for CUDA tensors where possible)
  skipped_small / skipped_params / skipped_leaves / skipped_views / skipped_other  saved
              tensors left in place: below the size threshold, parameters (or views of them),
              other leaves that require grad (inputs the caller owns), views of a tensor already
              offloaded, or not a dense CPU/CUDA tensor
  lost        offloaded tensors the daemon no longer had when backward asked (it stopped)
  idle_steps  training steps (a step ends when a pack follows an unpack) that saved tensors but
              sent none to the daemon: all below the threshold, parameters, or kept on device
  host_waits  times the training thread blocked on offloadd: waiting for a reload's answer
              (ReloadDone not arrived when backward needed the tensor) or for a staging slot;
              their seconds in ``host_wait_seconds``. On CUDA a reload whose answer arrived costs
              no host wait: the compute stream waits on the daemon's done event instead
  served_in_flight  tensors backward needed while their offload was still copying, or
              prefetched then and kept when that offload finished: used from the device as
              they were (CUDA), no reload
Every reloaded tensor counts once in exactly one of prefetched_in_time and waited.

Besides each context's statistics the process keeps, per device key ("cuda:0", "cpu",
"sim:1"; offloadd.torch._endpoint.device_key), the totals its daemon sessions report
(Client.report): fallbacks, host waits (count and seconds) and idle steps of every context.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Dict, Optional, TextIO, Union

from .. import _native

_FIELDS = ("offloaded", "offloaded_bytes", "reloaded", "reloaded_bytes", "prefetched_in_time",
           "prefetched_in_time_bytes", "waited", "waited_bytes", "kept", "kept_bytes",
           "fallbacks", "fallback_bytes", "skipped_small", "skipped_params", "skipped_leaves",
           "skipped_views",
           "skipped_other", "lost", "idle_steps", "urgent", "prefetched_unused", "host_waits",
           "served_in_flight", "served_in_flight_bytes")


_device_lock = threading.Lock()
_device_totals = {}  # device key -> {"fallbacks_total": n, ...} since the process started


def count_for_device(key, fallbacks=0, host_waits=0, host_wait_seconds=0.0, idle_steps=0):
    """Adds to the process's totals for device ``key`` (counts; seconds for the waits)."""
    with _device_lock:
        t = _device_totals.setdefault(key, _zero_totals())
        t["fallbacks_total"] += fallbacks
        t["host_waits_total"] += host_waits
        t["host_wait_seconds_total"] += host_wait_seconds
        t["idle_steps_total"] += idle_steps


def device_totals(key):
    """A copy of the process's totals for device ``key``: the keyword arguments of
    Client.report (all zero before anything was counted)."""
    with _device_lock:
        return dict(_device_totals.get(key) or _zero_totals())


def reset_device_totals():
    """Forgets every device's totals (tests only)."""
    with _device_lock:
        _device_totals.clear()


def _after_fork_in_child():
    """A forked child starts with no totals (its parent reports its own) and a fresh lock."""
    global _device_lock
    _device_lock = threading.Lock()
    _device_totals.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)


def _zero_totals():
    return {"fallbacks_total": 0, "host_waits_total": 0, "host_wait_seconds_total": 0.0,
            "idle_steps_total": 0}


_TensorCounts = _native.load_store_front().TensorCounts
_COUNTED = _TensorCounts.FIELDS  # counted in C: the per-tensor counts and waited_seconds


class OffloadStats(_TensorCounts):
    """A snapshot (or the live counters) of one context's statistics.

    The per-tensor counts (offloaded, reloaded, prefetched_in_time and waited, with their bytes,
    and waited_seconds) live in C (offloadd._store_front.TensorCounts, client/core/
    store_counts.c), where the hooks' answers and unpacks add to them without a Python call;
    each add is seen whole. The other fields are Python's, changed under ``_lock``."""

    __slots__ = tuple(f for f in _FIELDS if f not in _COUNTED) + (
        "host_wait_seconds", "name", "_lock")
    _SECONDS = ("waited_seconds", "host_wait_seconds")

    def __init__(self, name: str = "") -> None:
        for f in _FIELDS:
            if f not in _COUNTED:
                setattr(self, f, 0)
        self.host_wait_seconds = 0.0
        self.name = name
        self._lock = threading.Lock()

    def add(self, **deltas: Union[int, float]) -> None:
        """Adds each keyword's value to the field it names (the fields not counted per tensor
        in C: kept, fallbacks, skipped_*, lost, idle_steps, urgent, prefetched_unused,
        host_waits, host_wait_seconds, served_in_flight and their bytes)."""
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    # add_offloaded(nbytes) and add_reloaded(nbytes, in_time, waited_seconds), the per-tensor
    # counts, are TensorCounts' C methods.

    def _values(self) -> Dict[str, Union[int, float]]:
        """Every field's value: the C counts read at one instant, the others under the lock."""
        d = dict(zip(_COUNTED, self.counts()))
        with self._lock:
            for f in _FIELDS + self._SECONDS:
                if f not in _COUNTED:
                    d[f] = getattr(self, f)
        return d

    def snapshot(self) -> OffloadStats:
        """A consistent copy."""
        return _restored(self.name, self._values())

    def __reduce__(self):
        """copy.copy, copy.deepcopy and pickle take a snapshot (the name and every field)."""
        return (_restored, (self.name, self._values()))

    def reset(self) -> None:
        self.reset_counts()
        with self._lock:
            for f in _FIELDS:
                if f not in _COUNTED:
                    setattr(self, f, 0)
            self.host_wait_seconds = 0.0

    def as_dict(self) -> Dict[str, Union[int, float]]:
        d = self._values()
        return {f: d[f] for f in _FIELDS + self._SECONDS}

    def __sub__(self, other: OffloadStats) -> OffloadStats:
        """Counts between two snapshots (self later)."""
        s = OffloadStats(self.name)
        for f in _FIELDS + self._SECONDS:
            setattr(s, f, getattr(self, f) - getattr(other, f))
        return s

    def summary(self) -> str:
        """One line: "offloaded 8 (2.0 MiB), reloaded 8 (...): 7 prefetched in time, ..."."""
        mib = lambda b: "%.1f MiB" % (b / 2.0 ** 20)  # noqa: E731
        d = self.as_dict()
        return ("offloaded %d (%s), reloaded %d (%s): %d prefetched in time, %d waited for "
                "(%.3f s), %d requested urgently; kept in place (keep_last_n) %d; fallbacks %d "
                "(%s); lost %d; left in place: %d small, %d params, %d leaves, %d views, %d other; "
                "idle steps %d; host waits %d (%.3f s); served in flight %d"
                % (d["offloaded"], mib(d["offloaded_bytes"]), d["reloaded"],
                   mib(d["reloaded_bytes"]), d["prefetched_in_time"], d["waited"],
                   d["waited_seconds"], d["urgent"], d["kept"], d["fallbacks"],
                   mib(d["fallback_bytes"]), d["lost"], d["skipped_small"], d["skipped_params"],
                   d["skipped_leaves"], d["skipped_views"], d["skipped_other"], d["idle_steps"],
                   d["host_waits"], d["host_wait_seconds"], d["served_in_flight"]))

    def __repr__(self):
        return "OffloadStats(%s)" % ", ".join("%s=%r" % kv for kv in self.as_dict().items())

    def log(self, stream: Optional[TextIO] = None) -> None:
        """Writes "offloadd[<name>]: <summary>" to ``stream`` (default stderr); a context
        without a name writes "offloadd: <summary>" (the shared context is named "default")."""
        label = "offloadd[%s]" % self.name if self.name else "offloadd"
        (stream or sys.stderr).write("%s: %s\n" % (label, self.summary()))


def _restored(name: str, values: Dict[str, Union[int, float]]) -> OffloadStats:
    """An OffloadStats named ``name`` with these field values (snapshot, copy, pickle)."""
    s = OffloadStats(name)
    for f, v in values.items():
        setattr(s, f, v)
    return s
