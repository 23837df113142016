#!/usr/bin/env python3
"""Instructions and cache misses per saved tensor of the offloadd hooks, counted by Valgrind's
cachegrind: a figure that does not move with the machine's load.

bench/hook_overhead.py times the hooks between model work; on a shared 2-vCPU machine its
paired differences swing by more than a change of a few microseconds. This counts instead.
Per variant, the same training-shaped step as hook_overhead.py's (N packs of 1 MiB tensors on
the simulated GPU, then backward unpacking them in reverse, with no model work between) runs
under cachegrind twice, SHORT and LONG steps in one process each after the same start-up; the
difference of the two runs' totals over (LONG - SHORT) x 2N hook calls is what one saved
tensor's pack and unpack cost the training process, start-up taken out:

  Ir     instructions executed (every thread of the process)
  I1mr   first-level instruction cache read misses (the same model): the code a call runs
         that is not in the cache; between model work most of a hook's code is not
  D1mr   first-level data cache read misses (cachegrind's simulated caches: its model of the
         host's, not a measurement of them)
  DLmr   last-level data cache read misses (the same model)

Variants (each in processes of its own, against one cuda-sim daemon):
  noop             a no-op saved_tensors_hooks pair: the floor
  store-front      offloadd's hooks with keep_last_n so large that nothing is offloaded: the
                   store's per-tensor bookkeeping
  cuda-sim         offloadd's hooks (keep_last_n=0, prefetch=1) against the daemon: the whole
                   per-tensor path, the simulated device's own work included (SIMULATED: its
                   CUDA calls are Python here)
  cuda-sim-pylane  the same with the store's lanes and the hooks' C pump off, and Store.pack /
                   unpack as the hooks (no C pack hook)
                   (offloadd._store_front.OffloadLane and .pump unused): every offload and
                   reload through the store's and the transport's Python, every pump
                   through Client.pump
  cuda-sim-pyhook  cuda-sim with Store.pack as the pack hook instead of the C one
                   (offloadd._store_front.Hooks, what offload_checkpoints gives torch)
  cuda-sim-pyreload  cuda-sim with the C hooks, but the reload of a claimed handle in the
                   store's Python (Store._reload_claimed set on the store, which the C unpack
                   hands the reload to): what client/core/store_unpack.c saves
  cuda-sim-pystats  cuda-sim with the statistics' per-tensor counts as Python methods (a
                   subclass of OffloadStats replacing add_offloaded and add_reloaded, which
                   the C paths then call): what counting in C (store_counts.c) saves
  cuda-sim-pyring  the same with the request ring's C paths off (offloadd._ring_fast.submit and
                   offloadd._store_front.take_answers unused): every submission and answer in
                   Python
Every step waits for its offloads' answers before backward (offloadd.torch.synchronize) and
after it, so each step takes the same path (no tensor served from the device while its offload
is in flight); those waits are counted in cuda-sim's figures. PYTHONHASHSEED is fixed.

  .venv/bin/python bench/hook_instructions.py [--bin build/bin] [--short 10] [--long 40]
      [--variants noop,store-front,cuda-sim,cuda-sim-pylane,cuda-sim-pyring] [--json FILE]
      [--python-ops]

With --python-ops it runs no cachegrind: each variant's steps run under sys.settrace with
per-opcode events instead, and it prints the Python opcodes and calls per saved tensor by where
the code lives (the simulated device's Python, offloadd's, torch's, the benchmark's step, the
rest): what of the interpreter's work per tensor is the client's and what is the simulated
device's, whose CPU time bench/hook_overhead.py takes out but whose code still passes through
the caches between the client's calls. Exact counts, a few seconds a variant.

Needs valgrind (Debian package valgrind); without it prints one line saying so and exits 0.
Each run takes a minute or two (the interpreter and torch start under Valgrind).
"""

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
VARIANTS = ("noop", "store-front", "cuda-sim", "cuda-sim-pylane", "cuda-sim-pyhook",
            "cuda-sim-pyreload", "cuda-sim-pystats", "cuda-sim-pyring")
EVENTS = ("Ir", "I1mr", "D1mr", "DLmr")
MIB = 1 << 20


def setup(variant, sock, ops, gap_seconds=0.0):
    """The variant's step as a function of a number of steps, and its context (None for noop).
    gap_seconds: a sleep after each pack and before each unpack, the daemon's time to answer
    (the timed benchmark's model work; 0 for cachegrind, whose runs are slow enough)."""
    sys.path.insert(0, os.path.join(REPO, "client", "python"))
    import torch
    torch.set_num_threads(1)
    from offloadd.testing import sim_gpu
    import offloadd.torch as ot

    gpu = sim_gpu.SimGpu(devices=1, device_bytes=64 * MIB, checksums=False)
    sim_gpu.activate(gpu)
    xs = [gpu.empty_strided((MIB // 4,), (1,), torch.float32) for _ in range(ops)]

    # the timed benchmark's step, without its busy work, and its switch of the C paths
    from hook_overhead import make_save, python_ring_paths
    gap = (lambda: time.sleep(gap_seconds)) if gap_seconds > 0 else (lambda: None)
    Save = make_save(torch, gap)
    ctx = None
    if variant == "noop":
        pack, unpack = (lambda t: t), (lambda t: t)
    else:
        keep = 1 << 30 if variant == "store-front" else 0
        ctx = ot.offload_checkpoints(socket_path=sock, keep_last_n=keep, prefetch=1,
                                     strict=True, threshold_bytes=1 << 18, name=variant)
        if variant in ("cuda-sim-pylane", "cuda-sim-pyhook"):  # Store.pack itself, in Python
            pack, unpack = ctx.store.pack, ctx.store.unpack
        else:  # what torch calls: the C pack hook
            pack, unpack = ctx.pack_hook, ctx.unpack_hook
        if variant == "cuda-sim-pyreload":  # an instance attribute: the C unpack defers to it
            ctx.store._reload_claimed = ctx.store._reload_claimed
        if variant == "cuda-sim-pystats":  # the per-tensor counts as Python methods
            ctx.store.stats = python_counted_stats(variant)

    def run(steps):
        for _ in range(steps):
            with python_ring_paths(variant == "cuda-sim-pyring",
                                   lanes=variant == "cuda-sim-pylane"):
                y = torch.zeros(1, requires_grad=True)
                with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
                    for x in xs:
                        y = Save.apply(x, y)
                        gap()
                ot.synchronize(10.0)
                y.sum().backward()
                ot.synchronize(10.0)
    return run, ctx


def python_counted_stats(name):
    """An OffloadStats whose per-tensor counts are Python methods, as they were before they
    were C fields: the C paths call them (a replaced method is called, store_counts.c)."""
    from offloadd.torch import OffloadStats

    class PythonCounted(OffloadStats):
        __slots__ = ()

        def add_offloaded(self, nbytes):
            with self._lock:
                self.offloaded += 1
                self.offloaded_bytes += nbytes

        def add_reloaded(self, nbytes, in_time, waited_seconds):
            with self._lock:
                self.reloaded += 1
                self.reloaded_bytes += nbytes
                if in_time:
                    self.prefetched_in_time += 1
                    self.prefetched_in_time_bytes += nbytes
                else:
                    self.waited += 1
                    self.waited_bytes += nbytes
                    self.waited_seconds += waited_seconds
    return PythonCounted(name)


def worker(variant, steps, sock, ops):
    """One process's steps (run under cachegrind by main)."""
    run, ctx = setup(variant, sock, ops)
    run(steps)
    if ctx is not None:
        print(ctx.stats.summary(), file=sys.stderr)
    return 0


# --python-ops: the Python bytecode a saved tensor runs, by where the code lives.
PY_GROUPS = (
    ("the simulated device", os.path.join("offloadd", "testing") + os.sep),
    ("offloadd (client/python/offloadd)", os.path.join("client", "python", "offloadd") + os.sep),
    ("torch's Python", os.sep + "torch" + os.sep),
    ("this benchmark's step", os.sep + "bench" + os.sep),
)


def py_group(filename):
    for name, part in PY_GROUPS:
        if part in filename:
            return name
    return "Python's standard library and the rest"


def traced(run, steps):
    """{filename: [opcodes, calls]} that run(steps) executes, every thread of the process
    (sys.settrace with per-opcode events: slow, but exact and independent of the machine)."""
    import collections
    import threading
    seen = collections.defaultdict(lambda: [0, 0])

    def trace(frame, event, arg):
        frame.f_trace_opcodes = True
        cell = seen[frame.f_code.co_filename or "?"]
        cell[1] += 1

        def each(frame, event, arg):
            if event == "opcode":
                cell[0] += 1
            return each
        return each
    threading.settrace(trace)
    sys.settrace(trace)
    try:
        run(steps)
    finally:
        sys.settrace(None)
        threading.settrace(None)
    return seen


def ops_worker(variant, short, long_, sock, ops, gap_seconds):
    """Prints, as JSON, the opcodes and calls per saved tensor by file: LONG less SHORT traced
    steps of one process, after two untraced ones."""
    run, _ = setup(variant, sock, ops, gap_seconds)
    run(2)
    a, b = traced(run, short), traced(run, long_)
    per = (long_ - short) * ops
    out = {f: [(b[f][i] - (a[f][i] if f in a else 0)) / per for i in (0, 1)] for f in b}
    print(json.dumps(out))
    return 0


def python_ops(variants, args, sock):
    """Per variant: Python opcodes and calls per saved tensor, by PY_GROUPS."""
    print("== Python bytecode per saved tensor (bench/hook_instructions.py --python-ops); %s; "
          "steps %d and %d of %d tensors, %.0f us sleep after each pack and before each unpack"
          % (time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), args.short, args.long,
             args.ops, args.gap_us))
    print("per saved tensor (its pack and unpack), every thread: opcodes, share, calls")
    for v in variants:
        cmd = [sys.executable, os.path.abspath(__file__), "--ops-worker", v, str(args.short),
               str(args.long), sock, str(args.ops), str(args.gap_us / 1e6)]
        env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
        done = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True)
        if done.returncode != 0:
            raise RuntimeError("%s failed:\n%s" % (v, done.stderr[-3000:]))
        groups = {}
        for f, (n_ops, n_calls) in json.loads(done.stdout.splitlines()[-1]).items():
            g = groups.setdefault(py_group(f), [0.0, 0.0])
            g[0] += n_ops
            g[1] += n_calls
        total = sum(g[0] for g in groups.values())
        print("  %s: %.0f opcodes, %.1f calls" % (v, total, sum(g[1] for g in groups.values())))
        for name, (n_ops, n_calls) in sorted(groups.items(), key=lambda kv: -kv[1][0]):
            print("    %-40s %8.0f %5.1f %%  %6.1f calls" % (
                name, n_ops, 100.0 * n_ops / total if total else 0.0, n_calls))


def totals(path):
    """{event: total} from a cachegrind output file."""
    with open(path) as f:
        text = f.read()
    names = re.search(r"^events: (.*)$", text, re.M).group(1).split()
    values = [int(v) for v in re.search(r"^summary: (.*)$", text, re.M).group(1).split()]
    return dict(zip(names, values))


def counted(variant, steps, sock, ops, out_dir):
    out = os.path.join(out_dir, "cg.%s.%d" % (variant, steps))
    cmd = ["valgrind", "--tool=cachegrind", "--cache-sim=yes", "--cachegrind-out-file=" + out,
           sys.executable, os.path.abspath(__file__), "--worker", variant, str(steps), sock,
           str(ops)]
    env = dict(os.environ, PYTHONHASHSEED="0", OMP_NUM_THREADS="1")
    done = subprocess.run(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)
    if done.returncode != 0:
        raise RuntimeError("%s (%d steps) failed:\n%s" % (variant, steps, done.stderr[-3000:]))
    return totals(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=os.path.join(REPO, "build", "bin"))
    ap.add_argument("--short", type=int, default=10)
    ap.add_argument("--long", type=int, default=40)
    ap.add_argument("--ops", type=int, default=8, help="tensors saved per step (N)")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--json", default=None)
    ap.add_argument("--python-ops", action="store_true",
                    help="instead of cachegrind: Python opcodes and calls per saved tensor by "
                         "where the code lives (the simulated device, offloadd, torch, ...)")
    ap.add_argument("--worker", nargs=4, default=None, help=argparse.SUPPRESS)
    ap.add_argument("--gap-us", type=float, default=4000.0,
                    help="with --python-ops: sleep after each pack and before each unpack, as "
                         "the timed benchmark's model work, so that answers come in between")
    ap.add_argument("--ops-worker", nargs=6, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        variant, steps, sock, ops = args.worker
        return worker(variant, int(steps), sock, int(ops))
    if args.ops_worker:
        variant, short, long_, sock, ops, gap = args.ops_worker
        return ops_worker(variant, int(short), int(long_), sock, int(ops), float(gap))
    if shutil.which("valgrind") is None and not args.python_ops:
        print("hook_instructions.py: skipped: valgrind is not installed "
              "(apt-get install valgrind)")
        return 0
    variants = [v for v in args.variants.split(",") if v]
    unknown = sorted(set(variants) - set(VARIANTS))
    if unknown:
        ap.error("unknown variants %s (known: %s)" % (unknown, ", ".join(VARIANTS)))
    os.environ["OFFLOADD_BIN"] = os.path.join(os.path.abspath(args.bin), "offloadd")
    sys.path.insert(0, os.path.join(REPO, "client", "python", "tests"))
    from daemon_fixture import Daemon
    if args.python_ops:
        daemon = Daemon(pool_bytes="256MiB", extra=("--backend", "cuda-sim"))
        try:
            python_ops(variants, args, daemon.sock)
        finally:
            daemon.stop()
        return 0
    print("== hook instructions per saved tensor (bench/hook_instructions.py, cachegrind); "
          "%s; %d CPUs; steps %d and %d of %d tensors" % (
              time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), os.cpu_count(), args.short,
              args.long, args.ops))
    daemon = Daemon(pool_bytes="256MiB", extra=("--backend", "cuda-sim"))
    calls = (args.long - args.short) * 2 * args.ops  # hook calls between the two runs
    results = {}
    try:
        with tempfile.TemporaryDirectory() as out_dir:
            for v in variants:
                short = counted(v, args.short, daemon.sock, args.ops, out_dir)
                long_ = counted(v, args.long, daemon.sock, args.ops, out_dir)
                results[v] = {e: (long_[e] - short[e]) / calls * 2 for e in EVENTS}
    finally:
        daemon.stop()
    print("per saved tensor (its pack and its unpack), the process's every thread:")
    print("  %-16s %12s %10s %10s %10s" % ("variant", "Ir", "I1mr", "D1mr", "DLmr"))
    for v in variants:
        r = results[v]
        print("  %-16s %12.0f %10.0f %10.0f %10.1f" % (v, r["Ir"], r["I1mr"], r["D1mr"], r["DLmr"]))
    if "noop" in results:
        print("less noop:")
        for v in variants[1:] if variants[0] == "noop" else variants:
            if v == "noop":
                continue
            print("  %-16s %12.0f %10.0f %10.0f %10.1f" % (v, *(
                results[v][e] - results["noop"][e] for e in EVENTS)))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"per_saved_tensor": results, "short": args.short, "long": args.long,
                       "ops": args.ops}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
