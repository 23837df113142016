#!/usr/bin/env python3
"""The activation-checkpoint offload study's table, run through offloadd on simulated GPUs.

SIMULATED: every step time here is a simulated GPU's modelled compute stream, and every copy
time the cuda-sim daemon's timing model (server/copy/timing/copy_timing_model.h). Nothing runs on
a GPU.

The study (shared/reference/activation-checkpoint-offload.txt, "When the copy is free: the
bandwidth arithmetic") gives, per transformer layer and b = 1:
  forward F   = (2 x tokens x layer parameters + 2 x b x s^2 x attention width) / 500 TFLOPS
  checkpoint  = b x s x hidden x 2 bytes (bf16), copied out in forward and back in backward
  copy c      = checkpoint / 55.43 GB/s (PCIe 5 x16, nvbandwidth on an 8x H200 node); with n
                GPUs behind one link, each gets 1/n of it: c = n x checkpoint / 55.43 GB/s
  a step      = ~4 forwards per layer with checkpointing (forward, recompute, backward of 2)
  synchronous (Transformers save_on_cpu, both copies on the compute stream, no prefetch):
                slowdown = 2c / 4F
  overlapped (Arctic: side streams, keep_last_n=1, prefetch of one; "forward never waits"):
                slowdown = max(0, c - 3F) / 4F (a reload hides behind the next layer's
                recompute and backward)
Its quoted figures, which `arithmetic_checks` reproduces: Qwen3-8B at 4K: F = 3.44 ms, c = 0.61
ms; at 128K the copy is ~5 % of a forward; Qwen3-1.7B at 4K: 15.7 % synchronous slowdown.

What runs (per row and GPU, one process each): offloadd's hook engine (offloadd.torch's Store,
keep_last_n=1, prefetch=1) on a simulated client GPU (offloadd.testing.sim_gpu) against a daemon on
--backend=cuda-sim, whose model has the row's GPUs behind one switch limited to the link's
rate (1 GPU: its copy engine at the link's rate; the daemon's start-up link calibration stays on
and measures that engine, so the pacing is the configured rate). A step packs the L layer inputs in forward (pack of layer l, then a modelled kernel of F)
and unpacks them L..1 in backward (unpack, then recompute F + backward 2F as one kernel). The
same loop without the Store is the no-offload baseline; steps alternate between the two (after
warm-up steps), every GPU of a row starting each step at the same time. The step time is the
span of the GPU's compute stream from its first kernel's start to its last kernel's end;
offloadd's overhead = mean step time with offloadd / mean without - 1 (over steps and GPUs).

Scaling, so a row runs in seconds on a small host (both keep every copy-to-compute ratio):
  * sizes by S: each checkpoint is CHECKPOINT_BYTES (1 MiB) instead of b x s x h x 2 bytes, and
    the link's rate and chunk size are divided by the same S;
  * time by T: kernel times are multiplied by T and rates divided by T, so that F is about
    --forward_ms (40 ms): the host's per-request costs (gRPC, the simulation's checksums,
    ~1 ms) stay small next to a layer.
The host runs at most --lead_ms ahead of the simulated GPU (it waits before each pack and
unpack until the GPU's queued work ends within that), so a prefetch is issued when the GPU
reaches the layer before, as the study's schedule has it, plus that lead.

Rows at real time scale (T = 1), where the host's per-request and per-launch costs are not
hidden behind a 40 ms layer: seed-2k and seed-4k, the GPU check's Qwen3 seed model
(client/python/tests/qwen3_fixture.py: 8 layers, hidden 512, fp32, batch 2; each checkpoint
2 x seq x 512 x 4 bytes) at seq 2048 and 4096. F is the H200's measured checkpointed step
(BENCHMARKS.md, GPU: the middle of its range of medians) over 4 x 8 forwards, so everything else
in that step (embedding, head, loss, optimizer) is folded into the layers. Each forward is
--kernels_per_forward launches of F / K (recompute and backward 3 K of them), and the simulated
GPU charges --launch_us of host CPU per launch (sim_gpu's launch_host_seconds: the launching
thread spins, the kernel starts after its launch; the GPU bundle measures the real figure:
FIGURE step_timing_launch, docs/gpu-check.md); "bound" sets it to F / K, the launch-bound
limit, where host and GPU take equally long and any further host cost lengthens the step. These
rows also run torch's save_on_cpu schedule: a blocking D2H copy on the compute stream at each
pack (the host waits for the GPU to drain), an asynchronous H2D at each unpack; the copies take
checkpoint / 55.43 GB/s. Each seed row reports offloadd / checkpointing and save_on_cpu /
checkpointing beside the H200's measured ratios.

Usage: bench/study_table.py [--rows all|quick|seed|NAME,...] [--pairs N] [--json FILE] [--bin DIR]
             [--launch_us US|bound] [--kernels_per_forward K]
Rows: 8b-4k, 8b-32k, 8b-128k, 1.7b-4k, each x1 and x8 GPUs ("8b-4k-x8"); seed-2k, seed-4k
(--rows seed: both; not in "all"). --rows quick (or --quick): one short row (a 12-layer
Qwen3-8B at 32K on 1 GPU, one pair of steps), for the test suite.
"""

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

REPO = os.path.abspath(os.path.join(os.path.dirname(__file__), ".."))
MIB = 1 << 20
TFLOPS = 500e12                 # the study's sustained rate
LINK_BYTES_PER_SECOND = 55.43e9  # PCIe 5 x16 H2D, nvbandwidth (the study)
REAL_CHUNK_BYTES = 8 * MIB      # the daemon's default chunk
CHECKPOINT_BYTES = 1 * MIB      # a simulated checkpoint (sizes scaled by S)
DEVICE_BYTES = 256 * MIB        # each simulated GPU's memory
TARGET_HIDDEN = 0.01            # overhead where the arithmetic says overlap hides the copies
TARGET_OTHERWISE = 0.10         # relative to the arithmetic elsewhere

# name: (layers, hidden, parameters per layer, attention width) -- from the models' configs, as
# the study gives them. Qwen3-1.7B: q and o 2048 x 2048, k and v 2048 x 1024, SwiGLU MLP of
# three 2048 x 6144 matrices.
MODELS = {
    "Qwen3-8B": (36, 4096, 192937984, 4096),
    "Qwen3-1.7B": (28, 2048, 2 * 2048 * 2048 + 2 * 2048 * 1024 + 3 * 2048 * 6144, 2048),
}
ROWS = [("8b-4k", "Qwen3-8B", 4096), ("8b-32k", "Qwen3-8B", 32768),
        ("8b-128k", "Qwen3-8B", 131072), ("1.7b-4k", "Qwen3-1.7B", 4096)]
# The Qwen3 seed model on one H200 (BENCHMARKS.md, GPU, 2026-12-04): seq -> (checkpointed step
# seconds, the middle of the run's medians 0.0620-0.0797 / 0.1710-0.1736; measured offloadd /
# checkpointing; measured save_on_cpu / checkpointing, at 4096 from the ranges of step times).
SEED_LAYERS, SEED_HIDDEN, SEED_BATCH, SEED_DTYPE_BYTES = 8, 512, 2, 4
SEED_H200 = {2048: (0.07085, "1.10-1.55", "1.10-1.25"), 4096: (0.1723, "1.01", "1.05-1.10")}
SEED_ROWS = [("seed-2k", 2048), ("seed-4k", 4096)]


# ---- the study's arithmetic ---------------------------------------------------------------
def forward_seconds(model, seq):
    """One layer's forward (the study's first-order FLOP count at 500 TFLOPS), b = 1."""
    _, _, params, width = MODELS[model]
    return (2 * seq * params + 2 * seq * seq * width) / TFLOPS


def checkpoint_bytes(model, seq):
    return seq * MODELS[model][1] * 2


def arithmetic(model, seq, gpus):
    """The study's figures for one row: F, c (each GPU's share of the link), and the slowdowns
    of the synchronous and overlapped schedules (fractions of the checkpointed step)."""
    f = forward_seconds(model, seq)
    c = checkpoint_bytes(model, seq) * gpus / LINK_BYTES_PER_SECOND
    return {"forward_s": f, "copy_s": c, "copy_over_forward": c / f,
            "sync": 2 * c / (4 * f), "overlap": max(0.0, c - 3 * f) / (4 * f),
            "layers": MODELS[model][0]}


def arithmetic_checks():
    """(text, ok) lines: the reconstruction against the study's quoted figures."""
    a8 = arithmetic("Qwen3-8B", 4096, 1)
    a128 = arithmetic("Qwen3-8B", 131072, 1)
    a17 = arithmetic("Qwen3-1.7B", 4096, 1)
    return [
        ("Qwen3-8B 4K forward %.2f ms (study: 3.44)" % (a8["forward_s"] * 1e3),
         round(a8["forward_s"] * 1e3, 2) == 3.44),
        ("Qwen3-8B 4K copy %.2f ms (study: 0.61)" % (a8["copy_s"] * 1e3),
         round(a8["copy_s"] * 1e3, 2) == 0.61),
        ("Qwen3-8B 128K copy/forward %.1f %% (study: about 5 %%)"
         % (a128["copy_over_forward"] * 100), 0.045 < a128["copy_over_forward"] < 0.055),
        ("Qwen3-1.7B 4K synchronous slowdown %.1f %% (study: 15.7 %%)" % (a17["sync"] * 100),
         round(a17["sync"] * 100, 1) == 15.7),
    ]


# ---- one row -------------------------------------------------------------------------------
class Row:
    """A row of the table and its scaled simulation: sizes / S, times x T."""

    def __init__(self, name, model, seq, gpus, layers=None, forward_ms=40.0):
        self.name, self.model, self.seq, self.gpus = name, model, seq, gpus
        self.arith = arithmetic(model, seq, gpus)
        self.layers = layers or self.arith["layers"]
        self.scale_bytes = checkpoint_bytes(model, seq) / CHECKPOINT_BYTES      # S
        self.scale_time = forward_ms / 1e3 / self.arith["forward_s"]           # T
        self.forward_sim_s = self.arith["forward_s"] * self.scale_time
        self.link_sim = LINK_BYTES_PER_SECOND / (self.scale_bytes * self.scale_time)
        self.chunk_bytes = max(4096, int(REAL_CHUNK_BYTES / self.scale_bytes) // 4096 * 4096)

    def daemon_config(self):
        """cuda-sim: the row's GPUs behind one switch at the (scaled) link rate."""
        rate = int(self.link_sim)
        return ("backend: \"cuda-sim\"\nchunk_bytes: %d\ncuda_sim {\n  gpus: %d\n"
                "  gpus_per_switch: %d\n  engine_bytes_per_second: %d\n"
                "  switch_bytes_per_second: %d\n}\n"
                % (self.chunk_bytes, self.gpus, self.gpus, rate, rate if self.gpus > 1 else 0))

    kernels_per_forward, launch_s, save_on_cpu_copy_s = 1, 0.0, 0.0
    measured = None

    def step_estimate_s(self):
        return 4 * self.layers * self.forward_sim_s * (1 + self.arith["sync"])


class SeedRow(Row):
    """The Qwen3 seed model at real time scale (T = 1; see module doc): checkpoints of 1 MiB
    standing for 2 x seq x 512 x 4 bytes (S), F from the H200's measured step."""

    def __init__(self, name, seq, kernels_per_forward, launch_us):
        self.name, self.model, self.seq, self.gpus = name, "Qwen3-seed", seq, 1
        self.layers = SEED_LAYERS
        step_s, ratio_offloadd, ratio_save = SEED_H200[seq]
        self.measured = {"step_ckpt_s": step_s, "offloadd": ratio_offloadd,
                         "save_on_cpu": ratio_save}
        f = step_s / (4 * self.layers)
        real_bytes = SEED_BATCH * seq * SEED_HIDDEN * SEED_DTYPE_BYTES
        c = real_bytes / LINK_BYTES_PER_SECOND
        self.arith = {"forward_s": f, "copy_s": c, "copy_over_forward": c / f,
                      "sync": 2 * c / (4 * f), "overlap": max(0.0, c - 3 * f) / (4 * f),
                      "layers": self.layers}
        self.scale_bytes, self.scale_time = real_bytes / CHECKPOINT_BYTES, 1.0
        self.forward_sim_s = f
        self.link_sim = LINK_BYTES_PER_SECOND / self.scale_bytes
        self.chunk_bytes = max(4096, int(REAL_CHUNK_BYTES / self.scale_bytes) // 4096 * 4096)
        self.kernels_per_forward = kernels_per_forward
        self.launch_s = f / kernels_per_forward if launch_us == "bound" else float(launch_us) / 1e6
        self.save_on_cpu_copy_s = c


def daemon_binary(bin_dir):
    for p in ([os.path.join(bin_dir, "offloadd")] if bin_dir else []) + [
            os.path.join(REPO, "build/bin/offloadd"), os.path.join(REPO, "bazel-bin/server/offloadd")]:
        if os.access(p, os.X_OK):
            return p
    raise SystemExit("study_table: no offloadd binary (make build, or --bin DIR)")


class Daemon:
    def __init__(self, binary, row, workdir, extra=()):
        self.sock = os.path.join(workdir, "d.sock")
        conf = os.path.join(workdir, "offloadd.conf")
        with open(conf, "w") as f:
            f.write(row.daemon_config())
        pool = max(256 * MIB, 2 * row.gpus * row.layers * CHECKPOINT_BYTES)
        self.log = open(os.path.join(workdir, "daemon.log"), "w")
        self.proc = subprocess.Popen(
            [binary, "--config", conf, "--socket_path", self.sock, "--pool_bytes", str(pool),
             "--metrics_address", ""] + list(extra), stdout=subprocess.PIPE, stderr=self.log,
            text=True)
        deadline = time.monotonic() + 30
        for line in self.proc.stdout:
            if line.startswith("offloadd: ready on"):
                break
            if time.monotonic() > deadline:
                break
        else:
            raise SystemExit("study_table: the daemon did not start (log %s)" % self.log.name)
        threading.Thread(target=lambda: [None for _ in self.proc.stdout], daemon=True).start()

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()
        return self.proc.returncode


def run_row(row, binary, modes, lead_ms, daemon_args=()):
    """Starts a daemon (with ``daemon_args`` added) and one worker per GPU; returns every
    worker's step records."""
    workdir = tempfile.mkdtemp(prefix="ofd-study-")
    daemon = Daemon(binary, row, workdir, daemon_args)
    env = dict(os.environ, PYTHONPATH=os.path.join(REPO, "client", "python"),
               OMP_NUM_THREADS="1")
    spec = {"socket": daemon.sock, "layers": row.layers, "forward_s": row.forward_sim_s,
            "modes": modes, "lead_s": lead_ms / 1e3, "kernels": row.kernels_per_forward,
            "launch_s": row.launch_s, "copy_s": row.save_on_cpu_copy_s,
            "lean_sim": row.measured is not None,
            "period_s": 1.3 * row.step_estimate_s() + 0.5}
    workers = []
    try:
        for g in range(row.gpus):
            workers.append(subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker",
                 json.dumps(dict(spec, gpu=g))], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                text=True, env=env))
        for w in workers:
            if w.stdout.readline().strip() != "ready":
                raise SystemExit("study_table: a worker did not start")
        start_at = time.monotonic() + 0.3
        for w in workers:
            w.stdin.write("%r\n" % start_at)
            w.stdin.flush()
        results = []
        for w in workers:
            out, _ = w.communicate(timeout=spec["period_s"] * len(modes) + 120)
            if w.returncode != 0:
                raise SystemExit("study_table: a worker failed (exit %d)" % w.returncode)
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
            try:  # a worker that failed left its simulated GPU's table
                os.unlink("/dev/shm/ofd-simgpu-%d" % w.pid)
            except FileNotFoundError:
                pass
        rc = daemon.stop()
    if rc != 0:
        raise SystemExit("study_table: the daemon exited %d (log kept in %s)" % (rc, workdir))
    shutil.rmtree(workdir, ignore_errors=True)
    return results


# ---- a worker: one simulated GPU -------------------------------------------------------------
def worker_main(spec):
    import torch
    from offloadd.testing import sim_gpu
    from offloadd.torch._store import Store

    torch.set_num_threads(1)
    g = spec["gpu"]
    # The seed rows leave out the simulation's own per-tensor work (no CRC-32 and no host
    # read of reloads; tensors made in simulated memory), as the hook-cost benchmark does.
    lean = spec.get("lean_sim", False)
    gpu = sim_gpu.SimGpu(devices=g + 1, device_bytes=DEVICE_BYTES, checksums=not lean,
                         launch_host_seconds=spec.get("launch_s", 0.0))
    sim_gpu.activate(gpu)
    sim_gpu.set_device(g)
    store = Store(name="gpu%d" % g, threshold_bytes=4096, keep_last_n=1, prefetch=1,
                  strict=True, socket_path=spec["socket"])
    loop = StepLoop(gpu, gpu.current_stream(g), store, spec)
    print("ready", flush=True)
    start_at = float(sys.stdin.readline())
    records = []
    try:
        for i, mode in enumerate(spec["modes"]):
            wait_until(start_at + i * spec["period_s"])
            records.append(loop.step(mode) | {"mode": mode, "index": i})
        from offloadd.torch import _endpoint
        _endpoint.synchronize()
    finally:
        sim_gpu.activate(None)
    violations = [gpu.violations(k) for k in range(4)]
    print(json.dumps({"gpu": g, "steps": records, "violations": violations}), flush=True)
    gpu.close()  # removes its table from /dev/shm
    os._exit(0)  # no interpreter teardown: tensors may still view the table's mapping


def wait_until(t):
    while True:
        left = t - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(left, 0.05))


class StepLoop:
    """One simulated GPU's training step (see module doc)."""

    def __init__(self, gpu, compute, store, spec):
        self.gpu, self.compute, self.store = gpu, compute, store
        self.layers, self.f = spec["layers"], spec["forward_s"]
        self.launches_per_forward, self.copy_s = spec.get("kernels", 1), spec.get("copy_s", 0.0)
        self.lean_sim = spec.get("lean_sim", False)
        self.lead_ns = int(spec["lead_s"] * 1e9)
        self.elems = CHECKPOINT_BYTES // 4
        self.host_gap_s = 0.0

    def pace(self):
        """Waits until the GPU's queued work ends within the lead."""
        while True:
            with self.gpu.lock:
                self.compute._resolve()
                left = self.compute.tail_ns - self.lead_ns - time.monotonic_ns()
            if left <= 0:
                return
            time.sleep(min(left / 1e9, 0.005))

    def kernel(self, seconds):
        """A modelled kernel; the time the stream sat idle because the host was late counts in
        host_gap_s (a host artifact, in both modes)."""
        with self.gpu.lock:
            idle = not self.compute._waits and self.compute.tail_ns > 0
            late = time.monotonic_ns() - self.compute.tail_ns
            self.compute.kernel(seconds)
        if idle and late > 0 and self.first_done:
            self.host_gap_s += late / 1e9
        if not self.first_done:
            self.first_done = True
            self.start_ns = self.compute.tail_ns - int(seconds * 1e9)

    def forwards(self, n):
        """n forwards' worth of modelled kernels, launches_per_forward launches each."""
        k = self.launches_per_forward
        for _ in range(n * k):
            self.kernel(self.f / k)

    def layer_input(self, value):
        """A checkpoint: in simulated device memory when lean_sim, else a CPU tensor that the
        transport copies in."""
        if not self.lean_sim:
            return torch_full(self.elems, value)
        import torch
        x = self.gpu.empty_strided((self.elems,), (1,), torch.float32, sim_device(self.gpu))
        return x.fill_(float(value))

    def save_on_cpu_pack(self, x):
        """torch's save_on_cpu pack: a blocking copy to host memory on the compute stream."""
        self.kernel(self.copy_s)
        self.compute.synchronize()
        return x

    def step(self, mode):
        """One step; mode "none" (checkpointing alone), "offload" (offloadd's Store) or
        "save_on_cpu" (see module doc)."""
        store, offload = self.store, mode == "offload"
        before = store.stats.snapshot()
        launches0, cpu0 = self.gpu.launches, time.thread_time()
        self.first_done, self.host_gap_s = False, 0.0
        handles = []
        for layer in range(self.layers):
            self.pace()
            x = self.layer_input(layer + 1)
            if mode == "save_on_cpu":
                x = self.save_on_cpu_pack(x)
            handles.append(store.pack(x) if offload else x)
            del x
            self.forwards(1)
            self.peak_used = self.gpu.allocators[sim_device(self.gpu)].used_bytes()
        for _ in range(self.layers):
            self.pace()
            h = handles.pop()
            t = store.unpack(h) if offload else h
            if mode == "save_on_cpu":
                self.kernel(self.copy_s)  # the asynchronous H2D on the compute stream
            self.forwards(3)
            del t, h
        cpu_s, launches = time.thread_time() - cpu0, self.gpu.launches - launches0
        forward_used = self.peak_used
        self.compute.synchronize()
        span = (self.compute.tail_ns - self.start_ns) / 1e9
        d = (store.stats.snapshot() - before).as_dict()
        keys = ("host_waits", "host_wait_seconds", "offloaded", "reloaded", "prefetched_in_time",
                "waited", "urgent", "served_in_flight", "fallbacks", "kept")
        return {"span_s": span, "host_gap_s": self.host_gap_s, "used_mib": forward_used / MIB,
                "launches": launches, "thread_cpu_s": cpu_s} | {k: d[k] for k in keys}


def sim_device(gpu):
    return gpu.devices - 1


def torch_full(n, value):
    import torch
    return torch.full((n,), float(value), dtype=torch.float32)


# ---- the table -----------------------------------------------------------------------------
def summarize(row, results, warmup):
    """The row's figures from the workers' records (steps after warm-up)."""
    def steps(mode):
        return [s for r in results for s in r["steps"] if s["mode"] == mode and
                s["index"] >= warmup]
    on, off = steps("offload"), steps("none")
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    span_on, span_off = mean([s["span_s"] for s in on]), mean([s["span_s"] for s in off])
    overhead = span_on / span_off - 1
    a = row.arith
    hidden = a["overlap"] == 0
    target = TARGET_HIDDEN if hidden else a["overlap"] * (1 + TARGET_OTHERWISE)
    return {
        "row": row.name, "model": row.model, "seq": row.seq, "gpus": row.gpus,
        "layers": row.layers, "S": row.scale_bytes, "T": row.scale_time,
        "forward_ms": a["forward_s"] * 1e3, "copy_ms": a["copy_s"] * 1e3,
        "sync": a["sync"], "overlap": a["overlap"],
        "step_none_s": span_off, "step_offload_s": span_on, "overhead": overhead,
        "target": target, "within_target": overhead <= target,
        "ideal_step_s": 4 * row.layers * row.forward_sim_s,
        "host_waits_per_step": mean([s["host_waits"] for s in on]),
        "host_wait_ms_per_step": mean([s["host_wait_seconds"] for s in on]) * 1e3,
        "host_gap_ms_none": mean([s["host_gap_s"] for s in off]) * 1e3,
        "host_gap_ms_offload": mean([s["host_gap_s"] for s in on]) * 1e3,
        "per_step": {k: mean([s[k] for s in on]) for k in (
            "offloaded", "reloaded", "prefetched_in_time", "waited", "urgent",
            "served_in_flight", "fallbacks")},
        "device_mib_after_forward": max(s["used_mib"] for s in on),
        "violations": [sum(r["violations"][k] for r in results) for k in range(4)],
    } | seed_figures(row, steps("save_on_cpu"), off, span_off, mean, on)


def seed_figures(row, save, none, span_none, mean, offload):
    """The seed rows' extra figures: save_on_cpu / checkpointing, the launch model, and the
    training thread's CPU per launch in the checkpointed step (the simulation's own Python per
    launch included)."""
    if row.measured is None:
        return {}
    span_save = mean([s["span_s"] for s in save])
    return {"measured_h200": row.measured, "launch_us": row.launch_s * 1e6,
            "kernels_per_forward": row.kernels_per_forward, "step_save_on_cpu_s": span_save,
            "ratio_save_on_cpu": span_save / span_none,
            "host_cpu_us_per_launch_none": 1e6 * mean(
                [s["thread_cpu_s"] / s["launches"] for s in none]),
            "training_thread_cpu_ms": {m: 1e3 * mean([s["thread_cpu_s"] for s in steps])
                                       for m, steps in (("none", none), ("save_on_cpu", save),
                                                        ("offload", offload))}}


def print_seed_row(s):
    m = s["measured_h200"]
    print("SIMULATED %-8s seq %d, F %.2f ms as %d launches, launch cost %.1f us (training thread "
          "CPU per launch in the checkpointed step, simulation included: %.1f us) | step ms: "
          "checkpointing %.1f (H200 %.1f), offloadd %.1f, save_on_cpu %.1f | offloadd / ckpt "
          "x%.3f (H200 x%s), save_on_cpu / ckpt x%.3f (H200 x%s) | host waits/step %.1f (%.2f "
          "ms), host gaps none / offloadd %.1f / %.1f ms | training thread CPU ms/step none / "
          "offloadd / save_on_cpu %.1f / %.1f / %.1f"
          % (s["row"], s["seq"], s["forward_ms"], s["kernels_per_forward"], s["launch_us"],
             s["host_cpu_us_per_launch_none"], s["step_none_s"] * 1e3,
             m["step_ckpt_s"] * 1e3, s["step_offload_s"] * 1e3, s["step_save_on_cpu_s"] * 1e3,
             1 + s["overhead"], m["offloadd"], s["ratio_save_on_cpu"], m["save_on_cpu"],
             s["host_waits_per_step"], s["host_wait_ms_per_step"], s["host_gap_ms_none"],
             s["host_gap_ms_offload"], *(s["training_thread_cpu_ms"][m] for m in (
                 "none", "offload", "save_on_cpu"))), flush=True)


def print_row(s):
    if "measured_h200" in s:
        return print_seed_row(s)
    print("SIMULATED %-10s %-10s %6d tok x%d GPU: F %8.2f ms, copy %7.2f ms | arithmetic: sync "
          "%6.1f %%, overlapped %5.1f %% | offloadd: step %.3f s vs %.3f s without offload "
          "(scaled), overhead %+6.2f %% (target <= %.1f %%: %s) | host waits/step %.1f "
          "(%.1f ms) | per step: reloaded %.1f, prefetched in time %.1f, served in flight %.1f"
          " | host gaps %.1f / %.1f ms | S=%.0f T=%.3g"
          % (s["row"], s["model"], s["seq"], s["gpus"], s["forward_ms"], s["copy_ms"],
             s["sync"] * 100, s["overlap"] * 100, s["step_offload_s"], s["step_none_s"],
             s["overhead"] * 100, s["target"] * 100, "ok" if s["within_target"] else "MISSED",
             s["host_waits_per_step"], s["host_wait_ms_per_step"], s["per_step"]["reloaded"],
             s["per_step"]["prefetched_in_time"], s["per_step"]["served_in_flight"],
             s["host_gap_ms_none"], s["host_gap_ms_offload"], s["S"], s["T"]), flush=True)


def select_rows(args):
    if args.rows == "quick":
        return [Row("quick-8b-32k", "Qwen3-8B", 32768, 1, layers=12, forward_ms=args.forward_ms)]
    rows = [Row("%s-x%d" % (n, g), m, s, g, forward_ms=args.forward_ms)
            for g in (1, 8) for n, m, s in ROWS]
    seed = [SeedRow(n, s, args.kernels_per_forward, args.launch_us) for n, s in SEED_ROWS]
    if args.rows == "seed":
        return seed
    if args.rows != "all":
        want = set(args.rows.split(","))
        rows = [r for r in rows + seed if r.name in want]
        if len(rows) != len(want):
            raise SystemExit("study_table: unknown row in --rows %s (names: quick, seed, %s, %s)"
                             % (args.rows, ", ".join("%s-x1, %s-x8" % (n, n) for n, _, _ in ROWS),
                                ", ".join(n for n, _ in SEED_ROWS)))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--quick", action="store_true", help="the same as --rows quick")
    ap.add_argument("--rows", default="all", help="all, quick, or names such as 8b-4k-x8")
    ap.add_argument("--pairs", type=int, default=3, help="offload/none step pairs per row")
    ap.add_argument("--warmup", type=int, default=1, help="offload steps first, not counted")
    ap.add_argument("--forward_ms", type=float, default=40.0)
    ap.add_argument("--lead_ms", type=float, default=4.0)
    ap.add_argument("--launch_us", default="20",
                    help="seed rows: host CPU per kernel launch, µs, or 'bound' (F / K)")
    ap.add_argument("--kernels_per_forward", type=int, default=40,
                    help="seed rows: kernel launches per layer forward (K)")
    ap.add_argument("--ring_poll_seconds", type=float, default=None,
                    help="the daemon's ring_poll_seconds (default: the daemon's; 0: every ring "
                         "submission wakes the daemon)")
    ap.add_argument("--bin")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.worker:
        return worker_main(json.loads(args.worker))
    if args.quick:
        args.rows = "quick"
    if args.rows == "quick":
        args.pairs, args.forward_ms = 1, min(args.forward_ms, 20.0)
    print("SIMULATED: the study's table through offloadd (cuda-sim daemon, simulated client GPUs)")
    for text, ok in arithmetic_checks():
        print("arithmetic check: %s: %s" % (text, "ok" if ok else "MISMATCH"))
    binary = daemon_binary(args.bin)
    table = []
    for row in select_rows(args):
        cycle = ["none", "offload"] + (["save_on_cpu"] if row.measured else [])
        modes = ["offload"] * args.warmup + cycle * args.pairs
        results = run_row(row, binary, modes, args.lead_ms, () if args.ring_poll_seconds is None
                          else ("--ring_poll_seconds", repr(args.ring_poll_seconds)))
        s = summarize(row, results, args.warmup)
        print_row(s)
        table.append(s)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"rows": table, "checks": arithmetic_checks()}, f, indent=1)
    return 0 if all(s["within_target"] and not any(s["violations"]) for s in table) else 1


if __name__ == "__main__":
    sys.exit(main())
