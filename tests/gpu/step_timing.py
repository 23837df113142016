"""What offloadd costs a training step: step time of the Qwen3 seed model with Transformers'
checkpointing, alone and with three ways of offloading its checkpointed layer inputs.

Run by tests/gpu/run.sh: ``python3 step_timing.py --socket PATH --python-root DIR``. The model is
qwen3_fixture.SEED_CONFIG (8 layers, hidden 512; random init, no hub), batch 1, bf16 on CUDA
(fp32 on CPU), Transformers' default attention (sdpa), non-reentrant checkpointing of every layer.
Modes, each checkpointed layer call inside the ``save_on_cpu`` name Transformers' ``offload=True``
path looks up (``transformers.modeling_utils.save_on_cpu``), which each mode sets:

  ckpt        checkpointing alone (offload off): the reference
  save_on_cpu torch.autograd.graph.save_on_cpu(pin_memory=True): copies on the compute stream
  sidestream  the in-process anchor (SideStream below): a pinned host buffer pool, a dedicated
              CUDA stream for the device-to-host copies with events, reload on unpack on that
              stream with the compute stream waiting on it, and a prefetch of the next one; what
              a minimal in-process offloader costs, against which offloadd's cost is read
  offloadd    offloadd.transformers.enable(keep_last_n=0) against the daemon at --socket

Per sequence length, 2 warm-up rounds and then --steps rounds; a round runs one step of every
mode, in a new seeded random order each round so that drift (clocks, other tenants) hits every
mode alike and no mode always runs after the same one (whose caches it would find warm or
cold). A step is zero_grad, forward and backward (labels = inputs); its host time is
perf_counter around forward + backward + torch.cuda.synchronize, its GPU time a pair of CUDA
events (enable_timing) recorded on the compute stream before forward and after backward. Around
each step (and offloadd's ``synchronize`` after it, so that its releases are counted) the CPU of
every thread of this process is read from /proc/self/task/*/schedstat; the hooks of the three
offload modes are wrapped to add up the training thread's CPU inside them (thread_time).

FIGURE lines, per sequence length and mode (medians over the timed steps; p10/p90 and min/max
for the spread; ratio = the mode's median / ckpt's median):

  step_timing_host seq=S mode=M median_ms p10_ms p90_ms min_ms max_ms ratio steps
  step_timing_gpu  seq=S mode=M (the same, CUDA event time)
  step_timing_hooks seq=S mode=M train_us_per_op pack_us unpack_us ops_per_step
      training-thread CPU inside the hooks per op; an op is one pack or one unpack of a tensor
      the mode moves (offloadd: sent to the daemon; sidestream: copied to host; save_on_cpu:
      every saved tensor); pack_us / unpack_us per hook call
  step_timing_client_cpu seq=S mode=M us_per_op p10_us p90_us
      all threads' CPU of the step minus the ckpt step's of the same round, per op (the
      training thread, offloadd's client threads, torch's and gRPC's native threads)
  step_timing_counts seq=S mode=M offloaded reloaded (offloadd also served_in_flight,
      fallbacks, lost, host_waits)
  step_timing_launch host_us_per_launch p10_us p90_us launches device
      once per run: the launching thread's CPU per kernel launch (median over 9 loops of 400
      launches; launch_cost), the per-launch host cost the simulated GPU models

A time limit (--time-limit-s, from the script's start) stops new rounds so that the script always
prints what it measured (a NOTE says how many rounds ran). PASS/FAIL lines check the counts
(offloadd: every tensor went through the daemon, none fell back; sidestream: every tensor copied
out was reloaded). ``--device cpu`` is the stand-in of client/python/tests (tiny sequences, an
shm daemon): perf_counter replaces the CUDA events, nothing is pinned, torch's save_on_cpu runs
unpinned and the side-stream anchor copies synchronously.
"""

import argparse
import contextlib
import os
import random
import statistics
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
MODES = ("ckpt", "save_on_cpu", "sidestream", "offloadd")


def figure(msg):
    print("FIGURE " + msg, flush=True)


def note(msg):
    print("NOTE " + msg, flush=True)


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    return ok


# ---- the in-process anchor --------------------------------------------------------------------
class _Rec:
    """One tensor copied out: its host copy until reloaded, then its device copy."""
    __slots__ = ("host", "copied", "shape", "dtype", "device", "index", "dev", "loaded")


class SideStream:
    """A minimal in-process side-stream offloader (the anchor): pack copies each eligible tensor
    (>= ``threshold_bytes``, on ``device``, not a leaf that requires grad) into a pooled pinned
    host buffer on a dedicated CUDA stream after the compute stream's work so far (an event),
    and lets the device tensor go (record_stream keeps its memory until the copy ran); unpack
    reloads it on the same stream, reloads the tensor packed before it too (backward unpacks in
    reverse order: a prefetch), and makes the compute stream wait on the reload's event: the host
    never blocks. On CPU (``device.type == "cpu"``) the copies are synchronous, unpinned.
    ``offloaded`` / ``reloaded``: tensors copied out / back."""

    def __init__(self, torch, device, threshold_bytes):
        self.torch, self.device, self.threshold = torch, device, threshold_bytes
        self.cuda = device.type == "cuda"
        self.side = torch.cuda.Stream(device) if self.cuda else None
        self.pool = {}            # (shape, dtype) -> [(pinned host buffer, event or None)]
        self.order, self.unpacking = [], False
        self.offloaded = self.reloaded = 0

    def pack(self, t):
        if (type(t) is not self.torch.Tensor or t.device != self.device
                or (t.requires_grad and t.is_leaf) or t.nbytes < self.threshold):
            return t
        if self.unpacking:        # the first pack after a backward: a new step
            self.order, self.unpacking = [], False
        r = _Rec()
        r.shape, r.dtype, r.device, r.index = t.shape, t.dtype, t.device, len(self.order)
        r.host, r.dev, r.copied, r.loaded = self._host(t.shape, t.dtype), None, None, None
        if self.cuda:
            self.side.wait_stream(self.torch.cuda.current_stream(t.device))
            with self.torch.cuda.stream(self.side):
                r.host.copy_(t, non_blocking=True)
            t.record_stream(self.side)
            r.copied = self.torch.cuda.Event()
            r.copied.record(self.side)
        else:
            r.host.copy_(t)
        self.order.append(r)
        self.offloaded += 1
        return r

    def unpack(self, r):
        if not isinstance(r, _Rec):
            return r
        self.unpacking = True
        if r.dev is None:
            self._reload(r)
        self.order[r.index] = None   # the step's list no longer keeps its device copy alive
        prev = self.order[r.index - 1] if r.index > 0 else None
        if prev is not None and prev.dev is None:
            self._reload(prev)
        if self.cuda:
            cur = self.torch.cuda.current_stream(r.device)
            cur.wait_event(r.loaded)
            r.dev.record_stream(cur)
        return r.dev

    def _reload(self, r):
        if self.cuda:
            with self.torch.cuda.stream(self.side):   # after the copy out (same stream)
                r.dev = self.torch.empty(r.shape, dtype=r.dtype, device=r.device)
                r.dev.copy_(r.host, non_blocking=True)
                r.loaded = self.torch.cuda.Event()
                r.loaded.record(self.side)
        else:
            r.dev = r.host.clone()
        self.pool.setdefault((tuple(r.shape), r.dtype), []).append((r.host, r.loaded))
        r.host = None
        self.reloaded += 1

    def _host(self, shape, dtype):
        free = self.pool.get((tuple(shape), dtype))
        if free:
            buf, ev = free.pop()
            if ev is not None:
                ev.synchronize()  # its reload ran long ago (a step ago) in practice
            return buf
        return self.torch.empty(shape, dtype=dtype, pin_memory=self.cuda)

    def context_class(self, timer):
        """A class with save_on_cpu's signature whose instances push this anchor's hooks."""
        anchor, hooks = self, self.torch.autograd.graph.saved_tensors_hooks

        class AnchorSaveOnCpu(hooks):
            def __init__(self, pin_memory=True, device_type="cuda"):
                super().__init__(*timer.wrap(anchor.pack, anchor.unpack,
                                             lambda p: isinstance(p, _Rec)))
        return AnchorSaveOnCpu


# ---- measuring ----------------------------------------------------------------------------------
def thread_cpu_ns():
    """{tid: ns of CPU run so far} for every thread of this process (schedstat)."""
    out = {}
    for tid in os.listdir("/proc/self/task"):
        try:
            with open("/proc/self/task/%s/schedstat" % tid) as f:
                out[tid] = int(f.read().split()[0])
        except (OSError, ValueError, IndexError):
            pass
    return out


def cpu_delta_ns(c0, c1):
    return sum(c1.get(t, 0) - c0.get(t, 0) for t in set(c0) | set(c1))


class HookTimer:
    """Adds up the calling thread's CPU (thread_time_ns) inside wrapped pack/unpack hooks, and
    the ops among the calls (``is_op(packed)``: a tensor the mode moves)."""

    def __init__(self):
        self.pack_ns = self.unpack_ns = self.packs = self.unpacks = self.ops = 0

    def take(self):
        """(hook ns, pack calls, unpack calls, ops, pack ns, unpack ns) since the last take."""
        r = (self.pack_ns + self.unpack_ns, self.packs, self.unpacks, self.ops,
             self.pack_ns, self.unpack_ns)
        self.pack_ns = self.unpack_ns = self.packs = self.unpacks = self.ops = 0
        return r

    def wrap(self, pack, unpack, is_op):
        clock = time.thread_time_ns

        def timed_pack(*a, **k):
            t0 = clock()
            p = pack(*a, **k)
            self.pack_ns += clock() - t0
            self.packs += 1
            self.ops += is_op(p)
            return p

        def timed_unpack(p):
            t0 = clock()
            t = unpack(p)
            self.unpack_ns += clock() - t0
            self.unpacks += 1
            self.ops += is_op(p)
            return t
        return timed_pack, timed_unpack


def spread(xs):
    """(median, p10, p90, min, max) of a non-empty list."""
    s = sorted(xs)

    def pick(q):
        return s[min(len(s) - 1, int(round(q * (len(s) - 1))))]
    return statistics.median(s), pick(0.1), pick(0.9), s[0], s[-1]


# ---- the run ------------------------------------------------------------------------------------
def main():
    import traceback
    try:
        return run(parse_args())
    except Exception as e:
        traceback.print_exc()
        print("FAIL: step_timing under %s: %s: %s"
              % (versions(), type(e).__name__, str(e).splitlines()[0][:300] if str(e) else ""),
              flush=True)
        return 1


def versions():
    return ", ".join("%s %s" % (n, getattr(sys.modules.get(n), "__version__", "not imported"))
                     for n in ("torch", "transformers"))


def parse_args():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True, help="the offloadd daemon's socket path")
    ap.add_argument("--python-root", default=None, help="dir holding offloadd/ (else the path's)")
    ap.add_argument("--fixture-dir", default=HERE, help="where qwen3_fixture.py is")
    ap.add_argument("--device", default="cuda", help="cuda, or cpu (the stand-in for tests)")
    ap.add_argument("--config", choices=("seed", "small"), default="seed")
    ap.add_argument("--seqs", default="2048,4096")
    ap.add_argument("--steps", type=int, default=20, help="timed rounds per sequence length")
    ap.add_argument("--warmup", type=int, default=2, help="untimed rounds first")
    ap.add_argument("--dtype", default=None, help="bf16 or fp32 (default bf16 on CUDA, else fp32)")
    ap.add_argument("--threshold-bytes", type=int, default=1 << 20,
                    help="tensors the offloaders move (offloadd's and the anchor's), bytes")
    ap.add_argument("--time-limit-s", type=float, default=100.0,
                    help="no round starts that would end later than this after the start")
    return ap.parse_args()


def run(args):
    t_start = time.perf_counter()
    if args.python_root:
        sys.path.insert(0, args.python_root)
    sys.path.insert(0, args.fixture_dir)
    import torch
    try:
        import transformers
    except ImportError:
        print("SKIPPED transformers is not installed on this machine")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIPPED: torch.cuda.is_available() is False (no driver or GPU)")
        return 0
    try:
        import offloadd.transformers  # noqa: F401
    except ImportError as e:
        print("FAIL: this offloadd does not support %s: %s" % (versions(), e), flush=True)
        return 1
    dev = torch.device(args.device, 0) if args.device == "cuda" else torch.device("cpu")
    if dev.type == "cpu":
        torch.set_num_threads(1)   # the stand-in: torch's thread pool spins on a shared machine
    dtype = {"bf16": torch.bfloat16, "fp32": torch.float32}[
        args.dtype or ("bf16" if dev.type == "cuda" else "fp32")]
    print("step_timing: torch %s, transformers %s, %s, %s, batch 1"
          % (torch.__version__, transformers.__version__,
             torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu", dtype), flush=True)
    seqs = [int(s) for s in args.seqs.split(",")]
    end = t_start + args.time_limit_s
    ok = True
    bench = Bench(torch, args, dev, dtype)
    launch_cost(torch, dev)
    for i, seq in enumerate(seqs):
        now = time.perf_counter()
        deadline = now + max(end - now, 0) * seq / sum(seqs[i:])  # time shared by sequence length
        ok = bench.run_seq(seq, deadline) and ok
    bench.close()
    return 0 if ok else 1


def launch_cost(torch, dev, launches=400, batches=9):
    """Prints the host CPU one kernel launch costs the launching thread (the figure the
    simulated GPU's launch model takes as ``--launch_us``, bench/study_table.py): ``batches``
    loops of ``launches`` in-place adds on a one-element tensor, each loop's thread CPU time
    over its launches (the device is synchronized between loops, never inside one, so a loop
    measures launches, not waits: 400 stay far below CUDA's launch queue). On CPU the same loop
    measures one eager op's dispatch and run instead."""
    x = torch.zeros(1, device=dev)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    for _ in range(launches):   # warm-up: the kernel's first launch loads it
        x.add_(1.0)
    sync()
    per_launch_us = []
    for _ in range(batches):
        c0 = time.thread_time_ns()
        for _ in range(launches):
            x.add_(1.0)
        per_launch_us.append((time.thread_time_ns() - c0) / launches / 1e3)
        sync()
    median, p10, p90, _, _ = spread(per_launch_us)
    figure("step_timing_launch host_us_per_launch=%.2f p10_us=%.2f p90_us=%.2f launches=%d "
           "device=%s" % (median, p10, p90, launches * batches, dev.type))


class Bench:
    """The model, the modes and the measurements of one run."""

    def __init__(self, torch, args, dev, dtype):
        import transformers.modeling_utils as mu

        import offloadd.torch as ot
        import offloadd.transformers as otf
        import qwen3_fixture as q
        from offloadd.torch._store import Saved
        self.torch, self.args, self.dev, self.dtype = torch, args, dev, dtype
        self.q, self.mu, self.ot, self.otf = q, mu, ot, otf
        self.cfg = q.SEED_CONFIG if args.config == "seed" else q.SMALL_CONFIG
        self.torch_save_on_cpu = mu.save_on_cpu    # torch's class, as Transformers bound it
        self.timers = {m: HookTimer() for m in MODES[1:]}
        self.anchor = SideStream(torch, dev, args.threshold_bytes)
        self.anchor_cls = self.anchor.context_class(self.timers["sidestream"])
        self.torch_cls = self._timed_torch_save_on_cpu()
        self.ctx = otf.enable(keep_last_n=0, socket_path=args.socket, strict=True,
                              threshold_bytes=args.threshold_bytes, trainer_callback=False)
        otf.disable()
        # save_on_cpu instances take their hooks from store.hook_pair (the C hooks): timed
        # around what it gives.
        store, timer = self.ctx.store, self.timers["offloadd"]
        pair = store.hook_pair

        def timed_pair(*args, **kwargs):
            return timer.wrap(*pair(*args, **kwargs), lambda p: isinstance(p, Saved))
        store.hook_pair = timed_pair

    def _timed_torch_save_on_cpu(self):
        torch_cls, timer, pin = self.torch_save_on_cpu, self.timers["save_on_cpu"], \
            self.dev.type == "cuda"

        class TimedSaveOnCpu(torch_cls):
            def __init__(self, pin_memory=True, device_type="cuda"):
                # Unpinned without CUDA: torch's pinning needs an accelerator.
                super().__init__(pin_memory=pin_memory and pin, device_type=device_type)
                self.pack_hook, self.unpack_hook = timer.wrap(
                    self.pack_hook, self.unpack_hook, lambda p: True)
        return TimedSaveOnCpu

    @contextlib.contextmanager
    def mode(self, model, m):
        """Checkpointing as mode ``m`` wants it, for one step."""
        self.q.set_checkpointing(model, "ckpt" if m == "ckpt" else "offload")
        self.mu.save_on_cpu = {"save_on_cpu": self.torch_cls, "sidestream": self.anchor_cls}.get(
            m, self.torch_save_on_cpu)
        if m == "offloadd":
            self.otf.enable(trainer_callback=False)   # the context made in __init__
        try:
            yield
        finally:
            if m == "offloadd":
                self.otf.disable()
            self.mu.save_on_cpu = self.torch_save_on_cpu

    def step(self, model, ids, m):
        """One step of mode ``m``: a dict of its measurements."""
        torch, cuda = self.torch, self.dev.type == "cuda"
        model.zero_grad(set_to_none=True)
        with self.mode(model, m):
            if cuda:
                torch.cuda.synchronize()
                ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(
                    enable_timing=True)
            c0 = thread_cpu_ns()
            t0 = time.perf_counter()
            if cuda:
                ev0.record()
            model(input_ids=ids, labels=ids).loss.backward()
            if cuda:
                ev1.record()
                torch.cuda.synchronize()
            t1 = time.perf_counter()
            if m == "offloadd":
                self.ot.synchronize()   # its releases: their client CPU belongs to this step
            c1 = thread_cpu_ns()
        row = {"host_s": t1 - t0, "gpu_s": ev0.elapsed_time(ev1) / 1e3 if cuda else t1 - t0,
               "cpu_ns": cpu_delta_ns(c0, c1)}
        if m in self.timers:
            (row["hook_ns"], row["packs"], row["unpacks"], row["ops"], row["pack_ns"],
             row["unpack_ns"]) = self.timers[m].take()
        return row

    def run_seq(self, seq, deadline):
        """Warm-up and timed rounds at ``seq`` until --steps or the deadline; prints the
        figures. False when a count check failed."""
        torch, q = self.torch, self.q
        model = q.make_model(seed=0, max_seq=seq, **self.cfg).to(self.dev, self.dtype)
        model.config.use_cache = False
        ids = q.batch(self.cfg["vocab_size"], 1, seq).to(self.dev)
        rows = {m: [] for m in MODES}
        n, last = 0, 0.0
        while n < self.args.warmup + self.args.steps:
            if n >= self.args.warmup and time.perf_counter() + 1.2 * last > deadline:
                note("step_timing seq=%d: time limit after %d of %d timed rounds"
                     % (seq, n - self.args.warmup, self.args.steps))
                break
            if n == self.args.warmup:
                for timer in self.timers.values():
                    timer.take()
                before = self.ctx.stats.snapshot()
                a_off, a_rel = self.anchor.offloaded, self.anchor.reloaded
            r0 = time.perf_counter()
            order = list(MODES)  # a new order each round: no mode always follows the same one
            random.Random(n).shuffle(order)
            for m in order:
                row = self.step(model, ids, m)
                if n >= self.args.warmup:
                    rows[m].append(row)
            last = time.perf_counter() - r0
            n += 1
        if not rows["ckpt"]:
            note("step_timing seq=%d: no timed round fit the time limit" % seq)
            return True
        self.report(seq, rows)
        d = self.ctx.stats.snapshot() - before
        ok = self.counts(seq, len(rows["ckpt"]), d,
                         self.anchor.offloaded - a_off, self.anchor.reloaded - a_rel)
        del model
        if self.dev.type == "cuda":
            torch.cuda.empty_cache()
        return ok

    def report(self, seq, rows):
        ref = {k: statistics.median(r[k] for r in rows["ckpt"]) for k in ("host_s", "gpu_s")}
        for m in MODES:
            for kind, key in (("host", "host_s"), ("gpu", "gpu_s")):
                med, p10, p90, lo, hi = (x * 1e3 for x in spread([r[key] for r in rows[m]]))
                figure("step_timing_%s seq=%d mode=%s median_ms=%.3f p10_ms=%.3f p90_ms=%.3f "
                       "min_ms=%.3f max_ms=%.3f ratio=%.4f steps=%d"
                       % (kind, seq, m, med, p10, p90, lo, hi, med / 1e3 / ref[key],
                          len(rows[m])))
        for m in MODES[1:]:
            self.report_cpu(seq, m, rows[m], rows["ckpt"])

    def report_cpu(self, seq, m, rows, ref_rows):
        ops = sum(r["ops"] for r in rows)
        calls_p, calls_u = sum(r["packs"] for r in rows), sum(r["unpacks"] for r in rows)
        figure("step_timing_hooks seq=%d mode=%s train_us_per_op=%.2f pack_us=%.2f unpack_us=%.2f "
               "ops_per_step=%.1f (training-thread CPU inside the hooks; pack/unpack per call)"
               % (seq, m, sum(r["hook_ns"] for r in rows) / 1e3 / max(ops, 1),
                  sum(r["pack_ns"] for r in rows) / 1e3 / max(calls_p, 1),
                  sum(r["unpack_ns"] for r in rows) / 1e3 / max(calls_u, 1), ops / len(rows)))
        per_op = [(r["cpu_ns"] - b["cpu_ns"]) / 1e3 / max(r["ops"], 1)
                  for r, b in zip(rows, ref_rows)]
        med, p10, p90, _, _ = spread(per_op)
        figure("step_timing_client_cpu seq=%d mode=%s us_per_op=%.2f p10_us=%.2f p90_us=%.2f "
               "(all threads of the process, schedstat, minus ckpt's step of the same round)"
               % (seq, m, med, p10, p90))

    def counts(self, seq, steps, d, a_off, a_rel):
        figure("step_timing_counts seq=%d mode=offloadd offloaded=%d reloaded=%d "
               "served_in_flight=%d fallbacks=%d lost=%d host_waits=%s steps=%d"
               % (seq, d.offloaded, d.reloaded, d.served_in_flight, d.fallbacks, d.lost,
                  getattr(d, "host_waits", "n/a"), steps))
        figure("step_timing_counts seq=%d mode=sidestream offloaded=%d reloaded=%d steps=%d"
               % (seq, a_off, a_rel, steps))
        # Each tensor sent is reloaded or, when backward needed it while its offload was still
        # copying (CUDA), used from the device; an offload completes for every reloaded one.
        ok = check(d.offloaded > 0 and d.fallbacks == 0 and d.lost == 0
                   and d.reloaded <= d.offloaded <= d.reloaded + d.served_in_flight,
                   "step_timing seq=%d: offloadd moved every tensor through the daemon (%s)"
                   % (seq, d.summary()))
        return check(a_off > 0 and a_off == a_rel,
                     "step_timing seq=%d: the side-stream anchor reloaded every tensor it "
                     "copied out (%d of %d)" % (seq, a_rel, a_off)) and ok

    def close(self):
        self.ot.synchronize()
        self.ot.close()


if __name__ == "__main__":
    sys.exit(main())
