#!/usr/bin/env python3
"""What the offloadd hooks cost the training process per saved tensor, in a training-shaped step.

One step: N packs of 16 MiB tensors, then N unpacks in reverse order (backward), with model-like
busy work between every two hook calls (a fixed number of tiny torch ops, as a training thread
launching kernels does: work that holds the GIL, calibrated once to --gap-us). The tensors lie
in a simulated GPU's memory (offloadd.testing.sim_gpu, active, so the hooks treat them as GPU tensors).
Variants, interleaved step by step in one process (in a new seeded random order every
repetition, so that no variant always follows the same one):

  noop         a no-op ``saved_tensors_hooks`` pair (the floor every difference is taken from)
  tensor-attrs a pack that only reads what any pack hook must read of a saved tensor to decide
               whether to offload it and to describe it to the daemon (type, base, autograd
               flags, layout, device, dtype, size, shape, strides, storage offset, data
               pointer, contiguity: the reads of the store's classification and Meta) and keeps
               it: what those torch attribute reads cost by themselves, between model work
  store-front  offloadd's hooks as cuda-sim's, with keep_last_n so large that nothing is
               offloaded: the store's per-tensor bookkeeping (classification, the handle, its
               step, de-duplication, prefetch order) without a request, an answer or a device
               call (its unpack returns the kept tensor; its steps count as idle)
  sidestream   a minimal in-process pure-Python side-stream offloader written here (a pool of
               host buffers, one worker thread, a future per request), the in-process anchor
  cuda-sim     offloadd's public hooks (offload_checkpoints, keep_last_n=0, prefetch=1) against
               a daemon on --backend cuda-sim (the CUDA IPC path on the simulated GPU)
  shm          the same hooks against a daemon on the shm backend (staging copies: 2 x 16 MiB
               memcpy per tensor on the training thread, real data movement of that backend)
  native-floor the floor under any native store: a hook pair written in C
               (bench/native_floor_hooks.c, `bazel build -c opt //bench:native_floor_hooks.so`)
               that reads the tensor's data_ptr and nbytes, offloads it through the request ring
               of an offloadd.Client session to the shm daemon (the tensors lie in one registered
               shm region: no staging), and reloads it by tag (urgent, the previous one as a
               prefetch, release_after), waiting in the native core with the GIL released. No
               classification, fallback, resume or dedup: skipped, with a line saying so, when
               the module is not built
  cuda-sim-pyring  cuda-sim with the request ring's C paths switched off around its steps:
               every submission through Client._ring_submit and every answer through the
               Python path (offloadd._ring_fast.submit and offloadd._store_front.take_answers
               unused), what those two C calls save, paired in one run
  cuda-sim-pylane  cuda-sim with the store's lanes and the hooks' C pump switched off around
               its steps (offloadd.torch._store._offload_lanes False; the endpoints pumped by
               Client.pump) and Store.pack / unpack as the hooks: every offload and reload
               through the store's and the transport's Python, what the lanes
               (offloadd._store_front.OffloadLane), offloadd._store_front.pump and the C pack
               hook save, paired in one run
  cuda-sim-pyhook  cuda-sim with Store.pack as the pack hook instead of the C one
               (offloadd._store_front.Hooks, what offload_checkpoints gives torch): what the
               C pack hook saves, paired in one run
  cuda-sim-pyreload  cuda-sim with the C hooks, but the reload of a claimed handle in the
               store's Python (Store._reload_claimed set on the store as an instance attribute,
               which the C unpack hands the reload to): what the reload in C
               (client/core/store_unpack.c) saves, paired in one run
  store-front@REV, cuda-sim@REV  (with --store-from REV) store-front and cuda-sim with the
               store of git revision REV (client/python/offloadd/torch/_store.py as it was
               there, loaded beside today's and using today's transport, client and
               offloadd._store_front): today's store against an earlier one, paired in one
               process; only for a revision whose store calls today's C module as today's
               does (not before the reload in C, main at 6bbddff: the C unpack calls
               Store._reload_finish and _reload_raised)
  native-floor-simdev, native-floor-nulldev  the native floor, each hook call first making
               the simulated device's calls an OffloadLane makes for one offload (the device's
               context, adopt, the current stream, an event record, the pointer's description)
               or one reload (the reload stream, the destination's allocation, an event record,
               the done event's seq, the current stream's wait, record_stream), from a small
               Python wrapper; nulldev makes the same calls to a stand-in whose methods return
               at once. Their client figures differ only by what the simulated device's work,
               its CPU taken out, still costs the code around it (its code and objects passing
               through the caches): how much the simulator inflates a cuda-sim client figure
  native-front the native floor whose pack first reads, through the Python C API, what a
               store's pack must know of the tensor (tensor-attrs' reads: type, base, autograd
               flags, layout, device, dtype, shape, strides, storage offset, contiguity) and
               keeps it in the module's table as a native store would (C integers, the dtype
               and device referenced): a native store's pack without linking libtorch

Per variant and step: wall time; CPU of every thread of this process (/proc/self/task/*/
schedstat: the training thread, each Python thread by name, native threads -- gRPC's, torch's
-- together); the training thread's CPU inside each pack and each unpack (thread CPU time);
requests sent to the daemon. Figures are medians over --reps repetitions of per-repetition
differences against the noop step of the same repetition; ops = 2N per step (N packs + N
unpacks). "All
client CPU per op" is the whole-step difference of the CPU of every thread of this process
(training thread, Python threads, native threads) against the noop step; the wall-time
difference is printed beside it but swings by milliseconds on a machine shared with other work.
The daemon's own CPU per op is printed too (it is not the client's).

The simulated device is taken out whole, and shown beside. ``SimGpu(count_own_cpu=True)`` counts
apart, per thread, the thread CPU spent inside every entry point of offloadd.testing.sim_gpu (a
call made from inside another is counted once, in the outermost): offloadd's CUDA transport calls
the simulated twin of its device adapter (SimCudaDevice) and the device kind (``key``); the
sidestream anchor calls SimGpu, SimStream and SimEvent directly. That is the simulated CUDA
runtime and driver (the device context, current and reload streams, event create / record /
wait / query, pointer and allocation queries, IPC handles), its caching allocator (reload
destinations, record_stream, a block returned when its tensor dies), its resolver thread, the
checksums (off here: ``SimGpu(checksums=False)``) and copies into its memory (none here: the
tensors already lie there). Added to it: the counting's own cost that falls outside the counted
windows (two reads of the thread CPU clock per call; SimGpu.accounting_residual_ns, measured on
the training thread before and after the timed steps and printed; about 0.3-0.4 us per call on
the 2-vCPU build machine). That sum, the simulated device's share, is what is taken out of every
client figure: of the training thread's CPU per pack and per unpack (the figures the budgets
read) and, over all threads, of the whole-step CPU and wall differences. Per hook call the table
prints the client's figure, the device's share, the hook call as measured, and the calls into
the simulated device.

On a real GPU these calls are offloadd.cuda.TorchCudaDevice's: about 6.4 per pack and 8.8 per
unpack for cuda-sim on 2026-12-06 (each run prints its means). Per pack: the device context
(torch.cuda.device), adopt and the checksums knob (nothing on a GPU), describe
(cuPointerGetAttributes), the current stream, cudaEventRecord; besides, at a step's first
offload the allocator-settings check, on a new IPC event cudaEventCreate and
cudaIpcGetEventHandle, at an allocation's first registration cudaIpcGetMemHandle. Per unpack:
the next prefetch's preparation (context, reload stream, a destination from the caching
allocator, describe, cudaEventRecord), the done event's record count (nothing on a GPU), then
the current stream, cudaStreamWaitEvent, record_stream and the checksums knob; and the block
returned to the allocator when the tensor dies. What they cost on a GPU is not modelled here:
the GPU bundle's step timing measures it (tests/gpu/step_timing.py, in its
``step_timing_hooks seq=S mode=offloadd train_us_per_op pack_us unpack_us ops_per_step`` lines:
the training thread's CPU inside the hooks, these calls included, and ``step_timing_client_cpu``:
every thread's).

After the timed steps, --count-steps more steps per variant run under cProfile, which counts the
training thread's Python-level calls per pack and per unpack (Counted): a figure that does not
move with the machine's load.

Layouts: "split" runs this process on CPU 0 and the daemons on CPU 1; "one" runs everything on
CPU 0 (the daemons' CPU then lands in the step's wall time too). Needs taskset and 2 CPUs for
"split". The budgets (all client CPU per op <= 39 us; training thread <= 15 us per pack and
<= 25 us per unpack including the next prefetch's preparation; <= 1.1 requests per op) are
printed as met / not met, never asserted.

  .venv/bin/python bench/hook_overhead.py [--bin build/bin] [--reps 60] [--layouts split,one]
      [--native-floor bazel-out/k8-opt/bin/bench/native_floor_hooks.so] [--ring-poll-seconds S]
      [--store-from REV]
"""

import argparse
import collections
import contextlib
import json
import os
import queue
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import types
import warnings

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
sys.path.insert(0, os.path.join(REPO, "client", "python"))

MIB = 1 << 20
BUDGET_ALL_US, BUDGET_PACK_US, BUDGET_UNPACK_US, BUDGET_MSGS = 39.0, 15.0, 25.0, 1.1
# The variants whose steps leave releases to send (synchronized after each step, untimed).
SYNCHRONIZED = ("cuda-sim", "cuda-sim-pyring", "cuda-sim-pylane", "cuda-sim-pyhook",
                "cuda-sim-pyreload", "shm", "cuda-sim@REV")
VARIANTS = ("noop", "tensor-attrs", "store-front", "store-front@REV", "sidestream", "cuda-sim",
            "cuda-sim-pyring", "cuda-sim-pylane", "cuda-sim-pyhook", "cuda-sim-pyreload",
            "cuda-sim@REV", "shm",
            "native-floor", "native-front", "native-floor-simdev", "native-floor-nulldev")
PY_PATHS = ("cuda-sim-pyring", "cuda-sim-pylane", "cuda-sim-pyhook",
            "cuda-sim-pyreload")  # cuda-sim, some C paths off


# ---- process threads' CPU ---------------------------------------------------------------------
def thread_cpu_ns(pid="self"):
    """{tid: ns of CPU run so far} for every thread of process ``pid`` (schedstat)."""
    out = {}
    base = "/proc/%s/task" % pid
    for tid in os.listdir(base):
        try:
            with open("%s/%s/schedstat" % (base, tid)) as f:
                out[int(tid)] = int(f.read().split()[0])
        except (OSError, ValueError):
            pass
    return out


def thread_groups():
    """{tid: group name}: the training thread, Python threads by name (numbers stripped)."""
    names = {}
    for t in threading.enumerate():
        if t.native_id is None:
            continue
        if t is threading.main_thread():
            names[t.native_id] = "training thread"
        else:
            name = t.name
            if name.startswith("Thread-"):  # threading's default name, "Thread-N (target)"
                name = "python thread " + name.partition(" ")[2].strip("()")
            names[t.native_id] = name
    return names


# ---- the ablations -----------------------------------------------------------------------------
def tensor_attrs(t):
    """The tensor-attrs pack: the reads of the store's classification and Meta, nothing else."""
    type(t), t._base, t.requires_grad, t.is_leaf, t.layout, t.is_cuda, t.nbytes
    t.shape, t.stride(), t.storage_offset(), t.dtype, t.device, t.data_ptr(), t.is_contiguous()
    return t


# ---- the in-process anchor --------------------------------------------------------------------
class _Rec:
    __slots__ = ("t", "host", "offloaded", "reload", "dest", "index")


class SideStream:
    """A minimal in-process side-stream offloader in pure Python: pack hands the tensor to a
    worker thread that issues its device-to-host copy on a side stream of the simulated GPU into
    a buffer of a host pool (modelled copy time, no bytes moved: the device's work is not the
    client's), completing a future; unpack prefetches the previous tensor and waits for its own
    reload's future, then orders the current stream after the copy."""

    def __init__(self, gpu, nbytes, slots, link_bytes_per_second=50e9):
        import concurrent.futures
        self.gpu, self.futures = gpu, concurrent.futures
        self.copy_seconds = nbytes / link_bytes_per_second
        self.side = gpu.new_stream(0, "anchor-copy")
        self.compute = gpu.current_stream(0)
        self.pool = collections.deque(range(slots))  # host buffer slots ("pinned pool")
        self.dests = {}  # shape -> free device buffers reused as reload destinations
        self.q = queue.SimpleQueue()
        self.order = []
        self.unpacking = False
        threading.Thread(target=self._run, name="anchor-worker", daemon=True).start()

    def _run(self):
        while True:
            kind, rec, fut, ready = self.q.get()
            self.side.wait_event(ready)  # after the producer (d2h) or the consumer's stream
            self.gpu.destroy_event(ready)
            self.side.kernel(self.copy_seconds)
            ev = self.gpu.new_event(0)
            self.side.record(ev)
            if kind == "d2h":
                rec.t = None  # the device tensor's bytes are on the host once ev completes
            fut.set_result(ev)

    def _submit(self, kind, rec, fut):
        ready = self.gpu.new_event(0)
        self.compute.record(ready)
        self.q.put((kind, rec, fut, ready))

    def pack(self, t):
        if self.unpacking:
            self.unpacking, self.order = False, []
        rec = _Rec()
        rec.t, rec.host, rec.reload, rec.dest = t, self.pool.popleft(), None, t
        rec.index = len(self.order)
        self.order.append(rec)
        rec.offloaded = self.futures.Future()
        self._submit("d2h", rec, rec.offloaded)
        return rec

    def _start_reload(self, rec):
        rec.reload = self.futures.Future()
        self._submit("h2d", rec, rec.reload)

    def unpack(self, rec):
        self.unpacking = True
        if rec.reload is None:
            self._start_reload(rec)
        if rec.index > 0:
            prev = self.order[rec.index - 1]
            if prev.reload is None:
                self._start_reload(prev)
        ev = rec.reload.result()
        self.gpu.destroy_event(rec.offloaded.result())
        self.compute.wait_event(ev)
        self.gpu.destroy_event(ev)
        self.pool.append(rec.host)
        return rec.dest


def native_floor(path, sock, n, nbytes, torch):
    """The native-floor variant: (pack, unpack, tensors, requests_fn, close), or a sentence
    saying why it is skipped. Its tensors (n x nbytes) lie in one shm region registered on an
    offloadd.Client session whose request ring the C module drives alone (nothing else of this
    process takes that ring's answers)."""
    import ctypes
    import importlib.util
    from offloadd import _native, client as client_mod, shm
    if not os.path.exists(path):
        return "native-floor skipped: %s is not built (bazel build -c opt " \
               "//bench:native_floor_hooks.so)" % path
    spec = importlib.util.spec_from_file_location("native_floor_hooks", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    c = client_mod.Client(socket_path=sock, client_name="native-floor")
    if not c.ring_active:
        c.close()
        return "native-floor skipped: the daemon attached no request ring (%s)" % c.ring_error
    region = shm.ShmRegion(n * nbytes)
    region_id = c.register_shm(region.name, region.size_bytes)
    whole = torch.frombuffer(region.mm, dtype=torch.uint8)
    xs = [whole[i * nbytes:(i + 1) * nbytes].view(torch.float32) for i in range(n)]
    lib = _native.load()
    addr = [ctypes.cast(f, ctypes.c_void_p).value for f in (
        lib.offloadd_ring_offload, lib.offloadd_ring_reload, lib.offloadd_ring_drain)]
    mod.attach(c._ring._ring, *addr, region_id, whole.data_ptr(), region.size_bytes)

    def close():
        c.close()
        region.close()
    return mod.pack, mod.unpack, xs, lambda: sum(mod.counts()[:2]), close, mod.pack_described


# ---- the step -----------------------------------------------------------------------------------
def make_busy(torch, gap_us):
    """A work-based busy function taking ~gap_us of this thread now (tiny torch ops)."""
    s = torch.zeros(4)

    def run(n):
        for _ in range(n):
            s.add_(1.0)
    n = 200
    while True:
        t0 = time.thread_time()
        run(n)
        took = time.thread_time() - t0
        if took > 0.005:
            break
        n *= 2
    count = max(1, int(n * gap_us * 1e-6 / took))
    spent = [0]  # ns of thread CPU inside the busy work so far

    def busy():
        t0 = time.thread_time_ns()
        run(count)
        spent[0] += time.thread_time_ns() - t0
    busy.spent = spent
    return busy


def make_save(torch, busy):
    class Save(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, dep):
            ctx.save_for_backward(x)
            return dep * 1.0

        @staticmethod
        def backward(ctx, g):
            (x,) = ctx.saved_tensors
            busy()
            return None, g
    return Save


class Timed:
    """Wraps a pack/unpack pair, adding up the training thread's CPU time in each, and the
    simulated device's own CPU (SimGpu.own_cpu_ns) and calls into it (SimGpu.own_calls) there;
    both read outside the timed window."""

    def __init__(self, pack, unpack, gpu):
        self.pack_fn, self.unpack_fn, self.gpu = pack, unpack, gpu
        self.pack_ns = self.unpack_ns = self.packs = self.unpacks = 0
        self.pack_sim_ns = self.unpack_sim_ns = 0  # the simulated device's own work inside
        self.pack_sim_calls = self.unpack_sim_calls = 0  # outermost calls into the device

    def pack(self, t):
        me = threading.get_ident()
        s0, c0 = self.gpu.own_cpu_ns(me), self.gpu.own_calls(me)
        t0 = time.thread_time_ns()
        r = self.pack_fn(t)
        self.pack_ns += time.thread_time_ns() - t0
        self.pack_sim_ns += self.gpu.own_cpu_ns(me) - s0
        self.pack_sim_calls += self.gpu.own_calls(me) - c0
        self.packs += 1
        return r

    def unpack(self, r):
        me = threading.get_ident()
        s0, c0 = self.gpu.own_cpu_ns(me), self.gpu.own_calls(me)
        t0 = time.thread_time_ns()
        t = self.unpack_fn(r)
        self.unpack_ns += time.thread_time_ns() - t0
        self.unpack_sim_ns += self.gpu.own_cpu_ns(me) - s0
        self.unpack_sim_calls += self.gpu.own_calls(me) - c0
        self.unpacks += 1
        return t


class Counted:
    """Runs a pack/unpack pair under cProfile (the calling thread only): the Python-level calls
    (functions, methods, builtins) per hook call, by where the called code lives: the hooks' own
    (offloadd's package, or the anchor written here), the simulated device's, or torch's, the
    standard library's and builtins. A count, not a time: it does not move with the machine's
    load, and not what a hook costs: between model work every hook starts with cold caches,
    and its time follows the objects it creates and touches more than its calls (native-front
    reads the tensor with nearly as many getter calls as tensor-attrs, from C, and costs a
    fraction of store-front).
    The simulated device's count is of its own functions, nested ones included
    (its calls from the hook code are in the timed table); its counting is off during these
    steps and its wrapper is left out."""

    ORIGINS = ("hook code", "simulated device", "torch, stdlib, builtins")

    def __init__(self, pack, unpack):
        import cProfile
        self.pack_fn, self.unpack_fn = pack, unpack
        self.profiles = {"pack": cProfile.Profile(), "unpack": cProfile.Profile()}
        self.calls = {"pack": 0, "unpack": 0}
        self.hook_calls = {"pack": {}, "unpack": {}}  # "file:function" -> calls per hook call

    def _run(self, kind, fn, arg):
        prof = self.profiles[kind]
        prof.enable()
        try:
            return fn(arg)
        finally:
            prof.disable()
            self.calls[kind] += 1

    def pack(self, t):
        return self._run("pack", self.pack_fn, t)

    def unpack(self, r):
        return self._run("unpack", self.unpack_fn, r)

    @staticmethod
    def origin(filename):
        path = filename.replace(os.sep, "/")
        if "/offloadd/testing/" in path:
            return "simulated device"
        if ("/offloadd/" in path and "site-packages" not in path) or \
                os.path.abspath(filename) == os.path.abspath(__file__):
            return "hook code"   # offloadd's package, or the anchor written here
        return "torch, stdlib, builtins"

    def per_call(self):
        """{"pack"|"unpack": {origin: Python-level calls per hook call}}. The simulated device's
        counting wrapper (sim_gpu's device_call_entry, run with its knob off here) is left out:
        the count is of the simulation's own functions, as without the wrapper."""
        import pstats
        out = {}
        for kind, prof in self.profiles.items():
            by = dict.fromkeys(self.ORIGINS, 0)
            if self.calls[kind] == 0:   # a profile that recorded nothing: pstats refuses it
                out[kind] = by
                continue
            for (filename, _, name), (_, ncalls, _, _, _) in pstats.Stats(prof).stats.items():
                origin = self.origin(filename)
                if origin == "simulated device" and name == "device_call_entry":
                    continue
                by[origin] += ncalls
                if origin == "hook code":
                    self.hook_calls[kind]["%s:%s" % (os.path.basename(filename), name)] = \
                        ncalls / max(self.calls[kind], 1)
            out[kind] = {k: v / max(self.calls[kind], 1) for k, v in by.items()}
        return out


class python_ring_paths:
    """While entered with ``on``: the request ring's C paths off (every endpoint's
    Client._submit_fast and offloadd.client._take_answers None), restored on exit; with
    ``lanes`` the stores' lanes off (offloadd.torch._store._offload_lanes False: a store makes
    no lane while it is, so a store that runs only inside makes none) and the hooks' pump in
    Python (offloadd.torch._endpoint.pump and Client.pump instead of
    offloadd._store_front.pump_all and .pump)."""

    def __init__(self, on, lanes=False):
        self.on, self.lanes, self.saved = on, lanes, None

    def __enter__(self):
        if self.lanes:
            from offloadd.torch import _endpoint, _store
            _store._offload_lanes = False
            self.pump_client, self.hooks_pump = _endpoint._pump_client, _store._pump
            _endpoint._pump_client = lambda client, batch, take: client.pump()
            _store._pump = _endpoint.pump
        if self.on:
            from offloadd import client
            from offloadd.torch import _endpoint
            eps = _endpoint.endpoints()
            self.saved = (client._take_answers, [(ep.client, ep.client._submit_fast)
                                                 for ep in eps])
            client._take_answers = None
            for ep in eps:
                ep.client._submit_fast = None
        return self

    def __exit__(self, *exc):
        if self.lanes:
            from offloadd.torch import _endpoint, _store
            _store._offload_lanes = True
            _endpoint._pump_client, _store._pump = self.pump_client, self.hooks_pump
        if self.saved is not None:
            from offloadd import client
            client._take_answers = self.saved[0]
            for c, fast in self.saved[1]:
                c._submit_fast = fast
            self.saved = None


class DeviceCalls:
    """Wraps a hook pair so that each call first makes, on ``dev``, the device calls of an
    OffloadLane's offload (pack) or reload (unpack): store_offload.c and store_reload.c. With a
    SimCudaDevice those are the simulated device's (counted as its share); with NullDevice
    they return at once. The reload destinations are kept until ``after_step`` (untimed), as
    a step's reloaded tensors live until backward used them."""

    def __init__(self, dev, xs, pack, unpack):
        self.dev, self.xs, self.i, self.dests = dev, xs, 0, []
        self.ev_offload, self.ev_ready, self.ev_done = (dev.new_event() for _ in range(3))
        x = xs[0]
        self.meta = types.SimpleNamespace(shape=tuple(x.shape), stride=tuple(x.stride()),
                                          dtype=x.dtype)
        self.inner_pack, self.inner_unpack = pack, unpack

    def pack(self, t):
        d, x = self.dev, self.xs[self.i % len(self.xs)]
        self.i += 1
        with d.context(0):
            src = d.adopt(x)
            d.record(self.ev_offload, d.current_stream(0))
            d.describe(src.data_ptr())
        return self.inner_pack(t)

    def unpack(self, handle):
        d = self.dev
        with d.context(0):
            stream = d.reload_stream(0)
            dest = d.empty_on(self.meta, stream)
            d.record(self.ev_ready, stream)
            seq = d.event_seq(self.ev_done)
            current = d.current_stream(0)
            d.wait(current, self.ev_done, seq)
            d.record_stream(dest, current)
        self.dests.append(dest)
        return self.inner_unpack(handle)

    def after_step(self):
        self.dests.clear()


class NullDevice:
    """SimCudaDevice's methods that DeviceCalls calls, each returning at once."""

    def __init__(self, x):
        self.x = x

    def new_event(self):
        return object()

    def context(self, device):
        return contextlib.nullcontext()

    def adopt(self, t):
        return t

    def record(self, ev, stream):
        return None

    def current_stream(self, device):
        return None

    def describe(self, ptr):
        return None

    def reload_stream(self, device):
        return None

    def empty_on(self, meta, stream):
        return self.x

    def event_seq(self, ev):
        return 0

    def wait(self, stream, ev, expect_seq=None):
        return None

    def record_stream(self, t, stream):
        return None


def worker(args):
    import torch
    torch.set_num_threads(1)
    from offloadd.testing import sim_gpu
    import offloadd.torch as ot
    from offloadd.torch import _endpoint
    sys.path.insert(0, os.path.join(REPO, "client", "python", "tests"))
    from daemon_fixture import Daemon

    prefix = ("taskset", "-c", "1") if args.layout == "split" else ("taskset", "-c", "0")
    poll = () if args.ring_poll_seconds is None else (
        "--ring_poll_seconds", repr(args.ring_poll_seconds))
    sim_d = Daemon(pool_bytes="512MiB", extra=("--backend", "cuda-sim") + poll, prefix=prefix)
    shm_d = Daemon(pool_bytes="512MiB", extra=poll, prefix=prefix)
    gpu = sim_gpu.SimGpu(devices=1, device_bytes=1024 * MIB, checksums=False, count_own_cpu=True)
    sim_gpu.activate(gpu)
    n, nbytes = args.ops, args.mib * MIB
    xs = [gpu.empty_strided((nbytes // 4,), (1,), torch.float32) for _ in range(n)]
    for x in xs:
        x.fill_(1.0)
    busy = make_busy(torch, args.gap_us)
    Save = make_save(torch, busy)
    anchor = SideStream(gpu, nbytes, 4 * n)

    old_store = store_at(args.store_from) if args.store_from else None

    def hooks_for(variant):
        if variant == "noop":
            return (lambda t: t), (lambda t: t), None
        if variant == "sidestream":
            return anchor.pack, anchor.unpack, None
        if variant == "tensor-attrs":
            return tensor_attrs, (lambda t: t), None
        base, _, rev = variant.partition("@")
        base = "cuda-sim" if base in PY_PATHS else base
        keep = 1 << 30 if base == "store-front" else 0
        sock = shm_d.sock if base == "shm" else sim_d.sock
        store = None if not rev else old_store.Store(
            variant, 1 << 20, keep, 1, True, sock)  # offload_checkpoints' defaults otherwise
        ctx = ot.offload_checkpoints(socket_path=sock, keep_last_n=keep, prefetch=1,
                                     strict=True, name=variant, store=store)
        if variant in ("cuda-sim-pylane", "cuda-sim-pyhook"):  # Store.pack itself, in Python
            return ctx.store.pack, ctx.store.unpack, sock
        if variant == "cuda-sim-pyreload":  # an instance attribute: the C unpack defers to it
            ctx.store._reload_claimed = ctx.store._reload_claimed
        return ctx.pack_hook, ctx.unpack_hook, sock  # what torch calls: the C pack hook

    variants = ["noop", "tensor-attrs", "store-front", "sidestream", "cuda-sim", "cuda-sim-pyring",
                "cuda-sim-pylane", "cuda-sim-pyhook", "cuda-sim-pyreload", "shm"]
    if old_store is not None:
        variants += ["store-front@REV", "cuda-sim@REV"]
    # store-front's steps send nothing by design: its idle-step warning says nothing here.
    warnings.filterwarnings("ignore", message="offloadd: offload is on but",
                            category=RuntimeWarning)
    timed, socks, raw, tensors, counters, after_step = {}, {}, {}, {}, {}, {}
    for v in variants:
        pack, unpack, sock = hooks_for(v)
        timed[v] = Timed(pack, unpack, gpu)
        socks[v] = sock
        raw[v] = (pack, unpack)
    floor = native_floor(args.native_floor, shm_d.sock, n, nbytes, torch)
    skipped = []
    if isinstance(floor, str):
        skipped.append(floor)
    else:
        variants.append("native-floor")
        timed["native-floor"] = Timed(floor[0], floor[1], gpu)
        raw["native-floor"], tensors["native-floor"] = floor[:2], floor[2]
        socks["native-floor"], counters["native-floor"] = None, floor[3]
        variants.append("native-front")  # the same ring and tensors, the pack reading more
        timed["native-front"] = Timed(floor[5], floor[1], gpu)
        raw["native-front"], tensors["native-front"] = (floor[5], floor[1]), floor[2]
        socks["native-front"], counters["native-front"] = None, floor[3]
        for v, dev in (("native-floor-simdev", sim_gpu.SimCudaDevice(gpu, 0)),
                       ("native-floor-nulldev", NullDevice(xs[0]))):
            calls = DeviceCalls(dev, xs, floor[0], floor[1])
            variants.append(v)
            timed[v] = Timed(calls.pack, calls.unpack, gpu)
            raw[v], tensors[v] = (calls.pack, calls.unpack), floor[2]
            socks[v], counters[v], after_step[v] = None, floor[3], calls.after_step

    daemon_pid = {"cuda-sim": sim_d.proc.pid, "shm": shm_d.proc.pid,
                  "cuda-sim-pyring": sim_d.proc.pid, "cuda-sim-pylane": sim_d.proc.pid,
                  "cuda-sim-pyhook": sim_d.proc.pid, "cuda-sim-pyreload": sim_d.proc.pid,
                  "cuda-sim@REV": sim_d.proc.pid,
                  "native-floor": shm_d.proc.pid, "native-front": shm_d.proc.pid,
                  "native-floor-simdev": shm_d.proc.pid, "native-floor-nulldev": shm_d.proc.pid}

    def daemon_cpu_ns(v):
        pid = daemon_pid.get(v)
        return sum(thread_cpu_ns(pid).values()) if pid else 0

    def requests_sent(v):
        if v in counters:
            return counters[v]()
        if socks[v] is None:
            return 0
        return sum(ep.client.counters.requests_sent + ep.client.counters.ring_requests_sent
                   for ep in _endpoint.endpoints()
                   if ep.socket_path == socks[v])

    def step(v, tm=None):
        tm = tm or timed[v]
        saved = tensors.get(v, xs)
        dep = torch.zeros(1, requires_grad=True)
        y = dep
        with python_ring_paths(v == "cuda-sim-pyring", lanes=v == "cuda-sim-pylane"):
            with torch.autograd.graph.saved_tensors_hooks(tm.pack, tm.unpack):
                for i in range(n):
                    busy()
                    y = Save.apply(saved[i], y)
            y.sum().backward()
        busy()

    rows = collections.defaultdict(list)
    main_ident = threading.get_ident()
    residual_ns = [gpu.accounting_residual_ns()]  # per counted call; again after the steps
    for rep in range(args.warmup + args.reps):
        # A new order every repetition (seeded: the same run to run). A rotation kept each
        # variant's predecessor the same, and a step runs faster after a step of similar code,
        # whose caches it finds warm: with a rotation two variants with the same pack differed
        # by 13 us per pack, paired, over 240 repetitions.
        order = list(variants)
        random.Random(rep).shuffle(order)
        for v in order:
            tm = timed[v]
            p0, u0, pn0, un0 = tm.pack_ns, tm.unpack_ns, tm.packs, tm.unpacks
            ps0, us0 = tm.pack_sim_ns, tm.unpack_sim_ns
            pc0, uc0 = tm.pack_sim_calls, tm.unpack_sim_calls
            req0 = requests_sent(v)
            own_main0, own_all0 = gpu.own_cpu_seconds(main_ident), gpu.own_cpu_seconds()
            calls_all0 = gpu.own_calls()
            groups = thread_groups()
            b0 = busy.spent[0]
            dc0 = daemon_cpu_ns(v)
            c0 = thread_cpu_ns()
            w0 = time.perf_counter()
            step(v)
            w1 = time.perf_counter()
            c1 = thread_cpu_ns()
            dc1 = daemon_cpu_ns(v)
            groups.update(thread_groups())
            if v in SYNCHRONIZED:
                ot.synchronize(5.0)  # the step's releases, outside its timing
            if v in after_step:
                after_step[v]()  # the reload destinations it kept, outside its timing
            if rep < args.warmup:
                continue
            per_group = collections.Counter()
            for tid in set(c0) | set(c1):
                per_group[groups.get(tid, "native threads")] += c1.get(tid, 0) - c0.get(tid, 0)
            rows[v].append({
                "wall_s": w1 - w0,
                "cpu_s": sum(per_group.values()) / 1e9,
                "groups": {k: x / 1e9 for k, x in per_group.items()},
                "pack_s": (tm.pack_ns - p0) / 1e9 / max(tm.packs - pn0, 1),
                "unpack_s": (tm.unpack_ns - u0) / 1e9 / max(tm.unpacks - un0, 1),
                "pack_sim_s": (tm.pack_sim_ns - ps0) / 1e9 / max(tm.packs - pn0, 1),
                "unpack_sim_s": (tm.unpack_sim_ns - us0) / 1e9 / max(tm.unpacks - un0, 1),
                "pack_sim_calls": (tm.pack_sim_calls - pc0) / max(tm.packs - pn0, 1),
                "unpack_sim_calls": (tm.unpack_sim_calls - uc0) / max(tm.unpacks - un0, 1),
                "requests": requests_sent(v) - req0,
                "daemon_cpu_s": (dc1 - dc0) / 1e9,
                "busy_s": (busy.spent[0] - b0) / 1e9,
                "sim_own_main_s": gpu.own_cpu_seconds(main_ident) - own_main0,
                "sim_own_all_s": gpu.own_cpu_seconds() - own_all0,
                "sim_calls_all": gpu.own_calls() - calls_all0,
            })
    residual_ns.append(gpu.accounting_residual_ns())
    calls = {}
    gpu.count_own_cpu = False  # the counting's clock reads are not the simulation's calls
    # After the timed steps (cProfile slows every call it counts); none with --count-steps 0.
    for v in variants[1:] if args.count_steps > 0 else []:
        counted = Counted(*raw[v])
        for _ in range(args.count_steps):
            step(v, counted)
            if v in SYNCHRONIZED:
                ot.synchronize(5.0)
            if v in after_step:
                after_step[v]()
        calls[v] = counted.per_call()
        if v in args.count_detail_list:
            calls[v]["hook_calls"] = counted.hook_calls
    if not skipped:
        floor[4]()
    for d in (sim_d, shm_d):
        d.stop()
    return {"rows": rows, "calls": calls, "skipped": skipped, "residual_ns": residual_ns}


# ---- reporting ----------------------------------------------------------------------------------
def med(xs):
    return statistics.median(xs) if xs else float("nan")


def add_device_shares(rows, residual_ns):
    """Adds to every row the simulated device's share, in float seconds: what was counted inside
    its entry points plus ``residual_ns`` (the counting's cost left outside them) per call:
    ``pack_dev_s`` / ``unpack_dev_s`` per hook call on the training thread, ``dev_all_s`` over
    the step on all threads."""
    for rs in rows.values():
        for r in rs:
            r["pack_dev_s"] = r["pack_sim_s"] + r["pack_sim_calls"] * residual_ns / 1e9
            r["unpack_dev_s"] = r["unpack_sim_s"] + r["unpack_sim_calls"] * residual_ns / 1e9
            r["dev_all_s"] = r["sim_own_all_s"] + r["sim_calls_all"] * residual_ns / 1e9


def by_parts(r, b, groups, ops):
    """All client CPU per op (us) of repetition ``r`` against the noop step ``b``, added up from
    its parts instead of taken from the whole step: the training thread's CPU inside the hook
    calls (less the device's share there) plus the CPU of the process's other threads over the
    step (less the simulated device's work on them), against the noop step's. It leaves out
    what the hooks slow the rest of the step by (caches), which the whole-step figures hold, but
    the training thread's swing between steps is not in it."""
    hooks = (r["pack_s"] - r["pack_dev_s"] + r["unpack_s"] - r["unpack_dev_s"]) / 2
    others = sum(r["groups"].get(g, 0) - b["groups"].get(g, 0)
                 for g in groups if g != "training thread")
    device_elsewhere = (r["sim_own_all_s"] - r["sim_own_main_s"]) - \
        (b["sim_own_all_s"] - b["sim_own_main_s"])
    return (hooks + (others - device_elsewhere) / ops) * 1e6


def summarize(rows, ops, residual_ns):
    """Per variant: the figures (us per op unless named), medians of per-rep differences; the
    simulated device's share (add_device_shares, with ``residual_ns`` per call) taken out."""
    add_device_shares(rows, residual_ns)
    noop = rows["noop"]
    out = {}
    for v, rs in rows.items():
        d_wall = [(r["wall_s"] - b["wall_s"] - (r["dev_all_s"] - b["dev_all_s"]))
                  / ops * 1e6 for r, b in zip(rs, noop)]
        d_cpu = [(r["cpu_s"] - b["cpu_s"] - (r["dev_all_s"] - b["dev_all_s"]))
                 / ops * 1e6 for r, b in zip(rs, noop)]
        d_cpu_nb = [(r["cpu_s"] - r["busy_s"] - b["cpu_s"] + b["busy_s"] -
                     (r["dev_all_s"] - b["dev_all_s"])) / ops * 1e6
                    for r, b in zip(rs, noop)]
        groups = sorted({g for r in rs + noop for g in r["groups"]})
        d_parts = [by_parts(r, b, groups, ops) for r, b in zip(rs, noop)]
        d_groups = {}
        for g in groups:
            d = [(r["groups"].get(g, 0) - b["groups"].get(g, 0)) / ops * 1e6
                 for r, b in zip(rs, noop)]
            if abs(med(d)) >= 0.5:
                d_groups[g] = med(d)
        pack = [(r["pack_s"] - r["pack_dev_s"]) * 1e6 for r in rs]
        unpack = [(r["unpack_s"] - r["unpack_dev_s"]) * 1e6 for r in rs]
        # The simulated device's own work on the training thread, per pack and unpack together.
        own_main = [r["sim_own_main_s"] / ops * 1e6 for r in rs]
        out[v] = {
            "step_ms": med([r["wall_s"] * 1e3 for r in rs]),
            "all_client_us_per_op_wall": med(d_wall),
            "all_client_us_per_op_cpu": med(d_cpu),
            "all_client_us_per_op_cpu_less_busy": med(d_cpu_nb),
            "all_client_us_per_op_by_parts": med(d_parts),
            "busy_ms_per_step": med([r["busy_s"] * 1e3 for r in rs]),
            "cpu_by_thread_us_per_op": d_groups,
            "train_pack_us": med(pack),
            "train_unpack_us": med(unpack),
            "train_pack_with_device_us": med([r["pack_s"] * 1e6 for r in rs]),
            "train_unpack_with_device_us": med([r["unpack_s"] * 1e6 for r in rs]),
            "train_pack_sim_us": med([r["pack_dev_s"] * 1e6 for r in rs]),
            "train_unpack_sim_us": med([r["unpack_dev_s"] * 1e6 for r in rs]),
            "train_pack_sim_counted_us": med([r["pack_sim_s"] * 1e6 for r in rs]),
            "train_unpack_sim_counted_us": med([r["unpack_sim_s"] * 1e6 for r in rs]),
            "device_calls_per_pack": med([r["pack_sim_calls"] for r in rs]),
            "device_calls_per_unpack": med([r["unpack_sim_calls"] for r in rs]),
            "sim_own_train_us_per_op": med(own_main),
            "sim_own_all_us_per_op": med([r["dev_all_s"] / ops * 1e6 for r in rs]),
            "requests_per_op": med([r["requests"] / ops for r in rs]),
            "daemon_us_per_op": med([r["daemon_cpu_s"] / ops * 1e6 for r in rs]),
            "reps": len(rs),
        }
    return out


def budget(value, limit):
    return "met" if value <= limit else "NOT met"


def budget_of_whole_step(value, limit):
    """As budget, for a whole-step difference: a negative one says the step's own swing was
    larger than what is measured, so it neither meets nor misses anything."""
    if value < 0:
        return "not resolved (negative: the step-to-step swing is larger than the figure)"
    return budget(value, limit)


def measured(results, first=0):
    """(variant, its results) for each variant from VARIANTS[first:] that ``results`` holds, in
    VARIANTS' order."""
    return [(v, results[v]) for v in VARIANTS[first:] if v in results]


def report(layout, summary, args):
    print("-- layout %s: %s; %d x %d MiB saved per step, busy gap %.0f us; medians of %d reps"
          % (layout, "training process on CPU 0, daemons on CPU 1" if layout == "split"
             else "everything on CPU 0", args.ops, args.mib, args.gap_us,
             summary["noop"]["reps"]))
    print("%-12s %8s %8s %10s %10s %10s %10s %7s %7s %10s" % (
        "variant", "step ms", "busy ms", "cpu/op us", "cpu-b/op", "parts/op", "wall/op us",
        "req/op", "sim/op", "daemon/op"))
    for v, s in measured(summary):
        print("%-12s %8.2f %8.2f %10.1f %10.1f %10.1f %10.1f %7.2f %7.1f %10.1f" % (
            v, s["step_ms"], s["busy_ms_per_step"], s["all_client_us_per_op_cpu"],
            s["all_client_us_per_op_cpu_less_busy"], s["all_client_us_per_op_by_parts"],
            s["all_client_us_per_op_wall"], s["requests_per_op"], s["sim_own_all_us_per_op"],
            s["daemon_us_per_op"]))
    print("  cpu/op: all client CPU per op -- the CPU of every thread of the training process "
          "(native ones included) over the step, minus the noop step's, per op (ops = packs + "
          "unpacks); cpu-b/op: the same with the busy work's own thread CPU (busy ms per step, "
          "measured around each busy call) taken out of both steps -- far less noisy (the busy "
          "work's cost swings by milliseconds a step here), but it leaves out whatever the "
          "client's threads slow the busy work by; parts/op: the same added up from its parts, "
          "the training thread's CPU inside the hook calls plus the other threads' CPU over the "
          "step against the noop step's (steady where the whole-step figures swing by more "
          "than they measure; it leaves out what the hooks slow the rest of the step by); "
          "wall/op: the same difference of the step's "
          "wall time (on a machine shared with other work this one swings by milliseconds: read "
          "cpu/op); all three less the simulated device's share (sim/op: its own CPU on every "
          "thread, counted inside its entry points, plus the counting's residual per call). "
          "req/op: requests sent to the daemon per op. daemon/op: the daemon's CPU.")
    res = summary["accounting_residual_ns"]
    print("  per hook call, training-thread CPU in us: client = the hook call less the simulated "
          "device's share (the figure the budgets read); device = its share (CPU counted inside "
          "its entry points + %.0f ns of counting residual per call, measured before and after "
          "the steps: %s ns); with device = the hook call as measured; calls = outermost calls "
          "into the simulated device per hook call (each a CUDA runtime, driver or allocator "
          "call on a GPU)" % (statistics.mean(res), " / ".join("%.0f" % x for x in res)))
    print("    %-12s | %-33s | %-33s" % ("", "pack", "unpack"))
    print("    %-12s | %7s %7s %11s %5s | %7s %7s %11s %5s" % (
        "variant", "client", "device", "with device", "calls",
        "client", "device", "with device", "calls"))
    for v, s in measured(summary):
        print("    %-12s | %7.1f %7.1f %11.1f %5.1f | %7.1f %7.1f %11.1f %5.1f" % (
            v, s["train_pack_us"], s["train_pack_sim_us"], s["train_pack_with_device_us"],
            s["device_calls_per_pack"], s["train_unpack_us"], s["train_unpack_sim_us"],
            s["train_unpack_with_device_us"], s["device_calls_per_unpack"]))
    for v, s in measured(summary, 1):
        g = s["cpu_by_thread_us_per_op"]
        print("  %s CPU per op by thread, us (vs noop): %s" % (
            v, ", ".join("%s %.1f" % (k, x) for k, x in sorted(g.items(), key=lambda i: -i[1]))))
    calls = summary["python_calls_per_hook_call"]
    if not calls:
        print("  Python-level calls on the training thread per pack / unpack: not counted "
              "(--count-steps %d)" % args.count_steps)
    else:
        print("  Python-level calls on the training thread per pack / unpack (cProfile over %d "
              "steps; a count, not a time; %s):" % (args.count_steps, " + ".join(Counted.ORIGINS)))
    for v, c in measured(calls, 1):
        print("    %-12s %6.1f / %6.1f  (%s / %s)" % (
            v, sum(c["pack"].values()), sum(c["unpack"].values()),
            " + ".join("%.1f" % c["pack"][o] for o in Counted.ORIGINS),
            " + ".join("%.1f" % c["unpack"][o] for o in Counted.ORIGINS)))
    for v, c in measured(calls, 1):
        for kind, per in sorted(c.get("hook_calls", {}).items(), reverse=True):
            print("    %s hook code per %s: %s" % (v, kind, ", ".join(
                "%s %.2f" % (name, n) for name, n in sorted(per.items(), key=lambda i: -i[1]))))
    for v in ("cuda-sim", "cuda-sim@REV", "shm", "native-floor", "native-front"):
        if v not in summary:
            continue
        s = summary[v]
        pack = s["train_pack_us"]
        unpack = s["train_unpack_us"]
        print("  budgets, %s: all client CPU per op %.1f us (busy work taken out: %.1f; by "
              "parts: %.1f, %s) (<= %.0f): %s; training thread per "
              "pack %.1f us (<= %.0f): %s; per unpack %.1f us (<= %.0f): %s; requests per op "
              "%.2f (<= %.1f): %s" % (
                  v, s["all_client_us_per_op_cpu"], s["all_client_us_per_op_cpu_less_busy"],
                  s["all_client_us_per_op_by_parts"],
                  budget(s["all_client_us_per_op_by_parts"], BUDGET_ALL_US), BUDGET_ALL_US,
                  budget_of_whole_step(s["all_client_us_per_op_cpu"], BUDGET_ALL_US), pack,
                  BUDGET_PACK_US,
                  budget(pack, BUDGET_PACK_US), unpack, BUDGET_UNPACK_US,
                  budget(unpack, BUDGET_UNPACK_US), s["requests_per_op"], BUDGET_MSGS,
                  budget(s["requests_per_op"], BUDGET_MSGS)))
    sys.stdout.flush()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--bin", default=None, help="directory of the offloadd binary")
    ap.add_argument("--reps", type=int, default=60)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--ops", type=int, default=8, help="tensors saved per step (N)")
    ap.add_argument("--mib", type=int, default=16)
    ap.add_argument("--gap-us", type=float, default=4000.0,
                    help="busy work between two hook calls, us of the training thread")
    ap.add_argument("--layouts", default="split,one")
    ap.add_argument("--count-steps", type=int, default=4,
                    help="steps per variant run under cProfile after the timed ones, counting "
                         "the training thread's Python-level calls per pack and unpack")
    ap.add_argument("--native-floor", default=os.path.join(
        REPO, "bazel-out", "k8-opt", "bin", "bench", "native_floor_hooks.so"),
        help="the built C hook pair of the native-floor variant")
    ap.add_argument("--ring-poll-seconds", type=float, default=None,
                    help="the daemons' ring_poll_seconds (default: the daemon's; 0: every "
                         "submission wakes the daemon)")
    ap.add_argument("--store-from", default=None, metavar="REV",
                    help="also run store-front and cuda-sim with the hooks' store of this git "
                         "revision (variants store-front@REV, cuda-sim@REV)")
    ap.add_argument("--count-detail", default="",
                    help="comma-separated variants whose hook-code calls per pack and unpack "
                         "(from the counted steps, by function) are printed after the counts")
    ap.add_argument("--json", default=None)
    ap.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    args.count_detail_list = [v for v in args.count_detail.split(",") if v]
    if args.bin:
        os.environ["OFFLOADD_BIN"] = os.path.join(os.path.abspath(args.bin), "offloadd")
    if args.worker:
        args.layout = args.worker
        rows = worker(args)
        json.dump(rows, sys.stdout)
        return 0
    print("== hook overhead per saved tensor (bench/hook_overhead.py); machine: %d CPUs, %s; %s"
          % (os.cpu_count(), _cpu_model(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())))
    print("   load average %s; daemons' ring_poll_seconds: %s" % (
        " ".join(open("/proc/loadavg").read().split()[:3]),
        "the default" if args.ring_poll_seconds is None else args.ring_poll_seconds))
    if args.store_from:
        print("   @REV: the hooks' store of git revision %s" % args.store_from)
    results = {}
    for layout in args.layouts.split(","):
        if layout == "split" and (os.cpu_count() or 1) < 2:
            print("-- layout split skipped: one CPU")
            continue
        cmd = ["taskset", "-c", "0", sys.executable, os.path.abspath(__file__),
               "--worker", layout] + _passthrough(args)
        with tempfile.TemporaryFile("w+") as out:
            rc = subprocess.call(cmd, stdout=out)
            out.seek(0)
            text = out.read()
        if rc != 0:
            print("-- layout %s failed (exit %d)" % (layout, rc))
            return rc
        out = json.loads(text)
        residual_ns = statistics.mean(out["residual_ns"])
        summary = summarize(out["rows"], 2 * args.ops, residual_ns)
        summary["python_calls_per_hook_call"] = out["calls"]
        summary["accounting_residual_ns"] = out["residual_ns"]
        results[layout] = summary
        report(layout, summary, args)
        for other, name in (("cuda-sim-pyring", "pyring"), ("cuda-sim-pylane", "pylane"),
                            ("cuda-sim-pyhook", "pyhook"), ("cuda-sim-pyreload", "pyreload"),
                            ("cuda-sim@REV", "rev")):
            key = "paired_%s_minus_c_us" % name
            summary[key] = paired_difference(out["rows"], other, "cuda-sim")
            if summary[key]:
                print("  paired per repetition, %s minus cuda-sim, training thread per pack / "
                      "unpack (client figures), median [quartiles] (95 %% CI of the median) "
                      "us: %s" % (other, " / ".join("%.1f [%.1f, %.1f] (%.1f..%.1f)" % q
                                                    for q in summary[key])))
        key = "paired_simdev_minus_nulldev_us"
        summary[key] = paired_difference(out["rows"], "native-floor-simdev",
                                         "native-floor-nulldev")
        if summary[key]:
            print("  paired per repetition, native-floor-simdev minus native-floor-nulldev "
                  "(what the simulated device's work costs the code around it, its CPU taken "
                  "out), per pack / unpack, median [quartiles] (95 %% CI of the median) us: %s"
                  % " / ".join("%.1f [%.1f, %.1f] (%.1f..%.1f)" % q for q in summary[key]))
        for line in out["skipped"]:
            print("  " + line)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    return 0


def paired_difference(rows, a, b):
    """Per repetition, variant ``a``'s training-thread CPU per pack and per unpack less
    variant ``b``'s of the same repetition (client figures: the device's share out), as
    ((median, lower quartile, upper quartile, low, high) for pack, the same for unpack) in us,
    low..high the distribution-free 95 % confidence interval of the median (the sign test's
    order statistics: the k-th smallest and largest differences, k = (n - 1.96 sqrt(n)) / 2;
    W. J. Conover, Practical Nonparametric Statistics, 3rd ed., 1999, section 3.2); () when
    either variant did not run. Pairing takes out what drifts between repetitions."""
    if a not in rows or b not in rows:
        return ()
    out = []
    for kind in ("pack", "unpack"):
        d = sorted(((ra[kind + "_s"] - ra[kind + "_dev_s"]) -
                    (rb[kind + "_s"] - rb[kind + "_dev_s"])) * 1e6
                   for ra, rb in zip(rows[a], rows[b]))
        q = statistics.quantiles(d, n=4) if len(d) > 1 else [d[0]] * 3
        k = max(0, int((len(d) - 1.96 * len(d) ** 0.5) / 2))
        out.append((statistics.median(d), q[0], q[2], d[k], d[-1 - k]))
    return tuple(out)


def _passthrough(args):
    out = ["--reps", str(args.reps), "--warmup", str(args.warmup), "--ops", str(args.ops),
           "--mib", str(args.mib), "--gap-us", str(args.gap_us),
           "--count-steps", str(args.count_steps), "--native-floor", args.native_floor,
           "--count-detail", args.count_detail]
    if args.bin:
        out += ["--bin", args.bin]
    if args.ring_poll_seconds is not None:
        out += ["--ring-poll-seconds", repr(args.ring_poll_seconds)]
    if args.store_from:
        out += ["--store-from", args.store_from]
    return out


def store_at(rev):
    """offloadd.torch's _store module as it was at git revision ``rev``, loaded as
    offloadd.torch._store_at_rev beside today's (its imports resolve to today's package)."""
    import importlib.util
    source = subprocess.run(["git", "-C", REPO, "show",
                             "%s:client/python/offloadd/torch/_store.py" % rev],
                            check=True, capture_output=True, text=True).stdout
    path = os.path.join(tempfile.mkdtemp(prefix="hook-overhead-"), "_store_at_rev.py")
    with open(path, "w") as f:
        f.write(source)
    spec = importlib.util.spec_from_file_location("offloadd.torch._store_at_rev", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _cpu_model():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return "?"


if __name__ == "__main__":
    sys.exit(main())
