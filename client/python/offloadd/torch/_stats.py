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
Every reloaded tensor counts once in exactly one of prefetched_in_time and waited.
"""

import sys
import threading

_FIELDS = ("offloaded", "offloaded_bytes", "reloaded", "reloaded_bytes", "prefetched_in_time",
           "prefetched_in_time_bytes", "waited", "waited_bytes", "kept", "kept_bytes",
           "fallbacks", "fallback_bytes", "skipped_small", "skipped_params", "skipped_leaves",
           "skipped_views",
           "skipped_other", "lost", "idle_steps", "urgent")


class OffloadStats:
    """A snapshot (or the live, locked counters) of one context's statistics."""

    __slots__ = _FIELDS + ("waited_seconds", "name", "_lock")

    def __init__(self, name=""):
        for f in _FIELDS:
            setattr(self, f, 0)
        self.waited_seconds = 0.0
        self.name = name
        self._lock = threading.Lock()

    def add(self, **deltas):
        with self._lock:
            for k, v in deltas.items():
                setattr(self, k, getattr(self, k) + v)

    def snapshot(self):
        """A consistent copy."""
        s = OffloadStats(self.name)
        with self._lock:
            for f in _FIELDS + ("waited_seconds",):
                setattr(s, f, getattr(self, f))
        return s

    def reset(self):
        with self._lock:
            for f in _FIELDS:
                setattr(self, f, 0)
            self.waited_seconds = 0.0

    def as_dict(self):
        with self._lock:
            d = {f: getattr(self, f) for f in _FIELDS}
            d["waited_seconds"] = self.waited_seconds
        return d

    def __sub__(self, other):
        """Counts between two snapshots (self later)."""
        s = OffloadStats(self.name)
        for f in _FIELDS + ("waited_seconds",):
            setattr(s, f, getattr(self, f) - getattr(other, f))
        return s

    def summary(self):
        """One line: "offloaded 8 (2.0 MiB), reloaded 8 (...): 7 prefetched in time, ..."."""
        mib = lambda b: "%.1f MiB" % (b / 2.0 ** 20)  # noqa: E731
        d = self.as_dict()
        return ("offloaded %d (%s), reloaded %d (%s): %d prefetched in time, %d waited for "
                "(%.3f s), %d requested urgently; kept in place (keep_last_n) %d; fallbacks %d "
                "(%s); lost %d; left in place: %d small, %d params, %d leaves, %d views, %d other; "
                "idle steps %d"
                % (d["offloaded"], mib(d["offloaded_bytes"]), d["reloaded"],
                   mib(d["reloaded_bytes"]), d["prefetched_in_time"], d["waited"],
                   d["waited_seconds"], d["urgent"], d["kept"], d["fallbacks"],
                   mib(d["fallback_bytes"]), d["lost"], d["skipped_small"], d["skipped_params"],
                   d["skipped_leaves"], d["skipped_views"], d["skipped_other"], d["idle_steps"]))

    def __repr__(self):
        return "OffloadStats(%s)" % ", ".join("%s=%r" % kv for kv in self.as_dict().items())

    def log(self, stream=None):
        """Writes "offloadd[<name>]: <summary>" to ``stream`` (default stderr)."""
        (stream or sys.stderr).write("offloadd[%s]: %s\n" % (self.name or "default",
                                                              self.summary()))
