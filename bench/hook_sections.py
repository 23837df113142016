#!/usr/bin/env python3
"""Where the training thread's CPU goes inside the offloadd hooks, by section: a diagnostic for
the cuda-sim variant of bench/hook_overhead.py (same step: N packs of 16 MiB simulated-GPU
tensors with ~4 ms of model-like busy work between hook calls, then N unpacks in reverse; this
process on CPU 0, the daemon on CPU 1). Not in `make bench`: it wraps the store's internals.

Each section is timed with the thread's CPU clock around one call, and the simulated device's
own CPU inside it (SimGpu(count_own_cpu=True)) is taken out and printed beside it, as in
hook_overhead.py. Sections (the per-call median over the measured steps, and calls per step):

  hooks' pump          offloadd.torch._endpoint.hooks_pump: the ring's answers taken at every
                       hook (with --pump-by-answers instead: each client's C pump, through the
                       Python loop _endpoint.pump, by the answers it took: 0, 1, 2+)
  front.pack           Store._front.pack: classification, de-duplication, the handle's record
  front.pop_due        Store._front.pop_due
  lane.offload         OffloadLane.offload: a handle's offload (after the step's first)
  Store._offload (py)  the store's Python offload (the step's first, which makes the lane)
  _prefetch_before     the unpack's prefetch of the next handle (its lane.reload inside)
  lane.reload          OffloadLane.reload
  lane.finish          OffloadLane.finish: an answered reload's stream wait and events
  pack / unpack total  the whole hook call

The wrappers are Python calls themselves (~1 us each, cold): nested sections add theirs to the
ones around them, so the totals run above hook_overhead.py's figures; read the sections against
each other. The hooks timed are Store.pack and Store.unpack, the store's Python around those
sections: torch gets the C hooks (offloadd._store_front.Hooks), which call the same sections'
C functions directly, where no Python wrapper can see them.

  .venv/bin/python bench/hook_sections.py [--bin build/bin] [--reps 40] [--gap-us 4000]
      [--pump-by-answers]
"""

import argparse
import collections
import os
import statistics
import sys
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MIB = 1 << 20


class Sections:
    """Per-section CPU of the calling thread, less the simulated device's share inside."""

    def __init__(self, gpu):
        self.gpu, self.on = gpu, False
        self.samples = collections.defaultdict(list)  # name -> [(client_ns, device_ns)]

    def wrap(self, name, fn):
        """fn timed as section ``name``; a callable ``name`` names the section by fn's result."""
        gpu, me = self.gpu, threading.get_ident()

        def call(*args):
            s0, t0 = gpu.own_cpu_ns(me), time.thread_time_ns()
            result = None
            try:
                result = fn(*args)
                return result
            finally:
                t1, s1 = time.thread_time_ns(), gpu.own_cpu_ns(me)
                if self.on:
                    key = name(result) if callable(name) else name
                    self.samples[key].append((t1 - t0 - (s1 - s0), s1 - s0))
        return call


class LaneProbe:
    def __init__(self, lane, sections):
        self.offload = sections.wrap("lane.offload", lane.offload)
        self.reload = sections.wrap("lane.reload", lane.reload)
        self.finish = sections.wrap("lane.finish", lane.finish)


class FrontProbe:
    def __init__(self, front, sections):
        self._front = front
        self.pack = sections.wrap("front.pack", front.pack)
        self.pop_due = sections.wrap("front.pop_due", front.pop_due)

    def __getattr__(self, name):
        return getattr(self._front, name)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--reps", type=int, default=40)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--ops", type=int, default=8)
    ap.add_argument("--gap-us", type=float, default=4000.0)
    ap.add_argument("--pump-by-answers", action="store_true",
                    help="time each client's C pump by the answers it took (through the Python "
                         "loop _endpoint.pump instead of pump_all)")
    args = ap.parse_args()
    sys.path[:0] = [os.path.join(REPO, "bench"), os.path.join(REPO, "client", "python", "tests"),
                    os.path.join(REPO, "client", "python")]
    os.environ["OFFLOADD_BIN"] = os.path.join(os.path.abspath(args.bin), "offloadd")
    os.sched_setaffinity(0, {0})
    import torch
    torch.set_num_threads(1)
    from daemon_fixture import Daemon
    from offloadd.testing import sim_gpu
    import offloadd.torch as ot
    from offloadd.torch import _endpoint, _store
    import hook_overhead

    daemon = Daemon(pool_bytes="512MiB", extra=("--backend", "cuda-sim"),
                    prefix=("taskset", "-c", "1"))
    try:
        gpu = sim_gpu.SimGpu(devices=1, device_bytes=1024 * MIB, checksums=False,
                             count_own_cpu=True)
        sim_gpu.activate(gpu)
        nbytes = 16 * MIB
        xs = [gpu.empty_strided((nbytes // 4,), (1,), torch.float32) for _ in range(args.ops)]
        busy = hook_overhead.make_busy(torch, args.gap_us)
        Save = hook_overhead.make_save(torch, busy)
        ctx = ot.offload_checkpoints(socket_path=daemon.sock, keep_last_n=0, prefetch=1,
                                     strict=True)
        store, sections = ctx.store, Sections(gpu)
        lane_for = _store._lane_for
        _store._lane_for = lambda ep: (lambda lane: None if lane is None else
                                       LaneProbe(lane, sections))(lane_for(ep))
        if args.pump_by_answers:  # the Python loop, each client's C pump timed by its answers
            _endpoint._pump_client = sections.wrap(
                lambda n: "client pump, %s answers" % ("2+" if isinstance(n, int) and n > 1
                                                       else n),
                _endpoint._pump_client)
            _store._pump = _endpoint.pump
        else:
            _store._pump = sections.wrap("hooks' pump", _store._pump)
        store._offload = sections.wrap("Store._offload (py)", store._offload)
        store._prefetch_before = sections.wrap("_prefetch_before", store._prefetch_before)
        store._front = FrontProbe(store._front, sections)
        pack = sections.wrap("pack total", store.pack)
        unpack = sections.wrap("unpack total", store.unpack)
        for rep in range(args.warmup + args.reps):
            sections.on = rep >= args.warmup
            y = torch.zeros(1, requires_grad=True)
            with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                for x in xs:
                    busy()
                    y = Save.apply(x, y)
            y.sum().backward()
            ot.synchronize(5.0)
    finally:
        daemon.stop()
    print("== hook sections (bench/hook_sections.py); %s; %d CPUs; %d x 16 MiB per step, busy "
          "gap %.0f us; medians of %d steps; SIMULATED device, its share beside" % (
              time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.cpu_count(), args.ops,
              args.gap_us, args.reps))
    print("  %-22s %10s %10s %10s" % ("section", "client us", "device us", "per step"))
    for name, values in sorted(sections.samples.items()):
        print("  %-22s %10.1f %10.1f %10.1f" % (
            name, statistics.median(c for c, _ in values) / 1e3,
            statistics.median(d for _, d in values) / 1e3, len(values) / args.reps))
    return 0


if __name__ == "__main__":
    sys.exit(main())
