#!/usr/bin/python3
"""Step time and peak process memory of the tiny transformer: checkpointing alone, torch's
save_on_cpu, and offloadd -- in one run, against a daemon this script starts.

  /usr/bin/python3 client/python/examples/bench_torch.py [--bin build/bin/offloadd] [--json F]

Modes (tiny_lm.py), each layer checkpointed:
  checkpoint         torch.utils.checkpoint alone, non-reentrant
  reentrant          torch.utils.checkpoint alone, reentrant
  torch-save-on-cpu  torch.autograd.graph.save_on_cpu around each checkpoint call, the way
                     Transformers' gradient_checkpointing_enable(offload=True) does (non-reentrant)
  offloadd           offloadd.torch.checkpoint: layer inputs to the daemon (shm backend),
                     non-reentrant
  hooks-reentrant    offloadd's offload_checkpoints around reentrant torch checkpoint
Each mode runs in a fresh worker process (so getrusage's ru_maxrss is that mode's peak), in
rounds that cycle through the modes, and reports the median step time over all measured steps
and the median of the per-process peaks, plus the ratio to checkpointing alone.

On a CPU this measures the overhead of the offload path, not GPU memory savings: a CPU tensor
handed to save_on_cpu stays where it is, and offloadd copies it into shared memory and the daemon
copies it into its pool (memcpy both ways, plus a gRPC round trip per batch of requests). The
memory column shows what leaves the training process: offloadd's checkpoints live in the daemon.
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", "..", ".."))
MODES = ("checkpoint", "reentrant", "torch-save-on-cpu", "offloadd", "hooks-reentrant")


def rss_bytes():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def worker(args):
    """Runs one mode; prints one JSON line."""
    sys.path[:0] = [HERE, os.path.dirname(HERE)]
    import torch
    import tiny_lm
    torch.set_num_threads(args.threads)
    data = tiny_lm.CharData()
    model = tiny_lm.make_model(data.vocab, args.layers, args.hidden, args.heads)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(0)
    ctx = None
    if args.worker in ("offloadd", "hooks-reentrant"):
        import offloadd.torch as ot
        ctx = ot.offload_checkpoints(socket_path=args.socket, keep_last_n=1,
                                     threshold_bytes=min(1 << 20, args.batch * args.seq *
                                                         args.hidden * 4))
    setup_rss = rss_bytes()
    times = []
    for step in range(args.warmup + args.steps):
        idx, tgt = data.batch(args.batch, args.seq, gen)
        t0 = time.perf_counter()
        loss = model(idx, tgt, args.worker, ctx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step >= args.warmup:
            times.append(time.perf_counter() - t0)
    out = {"mode": args.worker, "step_seconds": times, "setup_rss_bytes": setup_rss,
           "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
           "torch": torch.__version__}
    if ctx is not None:
        out["offloaded_bytes_per_step"] = ctx.stats.offloaded_bytes // (args.warmup + args.steps)
        out["fallbacks"] = ctx.stats.fallbacks
    print(json.dumps(out), flush=True)


def start_daemon(binary):
    sock = "/tmp/offloadd-bench-torch-%d.sock" % os.getpid()
    log = tempfile.TemporaryFile()
    proc = subprocess.Popen([binary, "--socket_path", sock, "--pool_bytes", "512MiB",
                             "--metrics_address", ""], stdout=subprocess.PIPE, stderr=log,
                            text=True)
    ready = threading.Event()

    def watch():
        for line in proc.stdout:
            if line.startswith("offloadd: ready on"):
                ready.set()
    threading.Thread(target=watch, daemon=True).start()
    if not ready.wait(60):
        proc.kill()
        log.seek(0)
        sys.exit("offloadd did not start:\n" + log.read().decode(errors="replace"))
    return proc, sock


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bin", default=None, help="offloadd binary (default build/bin/offloadd, "
                   "else bazel-bin/server/offloadd)")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=3, help="measured steps per worker")
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3, help="workers per mode, interleaved")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json", default=None, help="also write the results here")
    p.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    p.add_argument("--socket", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        return worker(args)

    binary = args.bin or next((b for b in (os.path.join(ROOT, "build/bin/offloadd"),
                                           os.path.join(ROOT, "bazel-bin/server/offloadd"))
                               if os.access(b, os.X_OK)), None)
    if not binary:
        sys.exit("bench_torch.py: no offloadd binary: run 'make build' or pass --bin")
    subprocess.check_call(["sh", os.path.join(ROOT, "client/python/gen_proto.sh")],
                          stdout=subprocess.DEVNULL)
    daemon, sock = start_daemon(binary)
    results = {m: [] for m in MODES}
    try:
        for r in range(args.rounds):
            for mode in (MODES if r % 2 == 0 else tuple(reversed(MODES))):
                cmd = [sys.executable, os.path.abspath(__file__), "--worker", mode,
                       "--socket", sock] + [a for k in ("layers", "hidden", "heads", "seq",
                                                         "batch", "steps", "warmup", "threads")
                                            for a in ("--" + k, str(getattr(args, k)))]
                out = subprocess.run(cmd, capture_output=True, text=True, check=True)
                results[mode].append(json.loads(out.stdout.strip().splitlines()[-1]))
    finally:
        daemon.terminate()
        daemon.wait(30)

    layer_bytes = args.batch * args.seq * args.hidden * 4
    print("bench_torch: %d layers, hidden %d, batch %d x seq %d fp32 (layer input %.1f MiB, "
          "%.1f MiB of checkpoints per step), %d threads, torch %s, %d rounds x %d steps"
          % (args.layers, args.hidden, args.batch, args.seq, layer_bytes / 2**20,
             args.layers * layer_bytes / 2**20, args.threads, results["checkpoint"][0]["torch"],
             args.rounds, args.steps))
    print("x ckpt: step time over checkpoint's (median and fastest step; on a shared machine the "
          "fastest is the steadier figure); above setup: peak RSS minus RSS after building the "
          "model (what the steps added)")
    summary = {}
    for mode in MODES:
        runs = results[mode]
        step = statistics.median(t for r in runs for t in r["step_seconds"])
        fastest = min(t for r in runs for t in r["step_seconds"])
        peak = statistics.median(r["peak_rss_bytes"] for r in runs)
        above = statistics.median(r["peak_rss_bytes"] - r["setup_rss_bytes"] for r in runs)
        summary[mode] = {"step_seconds": step, "min_step_seconds": fastest,
                         "peak_rss_bytes": peak,
                         "peak_above_setup_bytes": above,
                         "fallbacks": sum(r.get("fallbacks", 0) for r in runs)}
    base = summary["checkpoint"]
    print("%-18s %9s %8s %9s %8s %14s %18s" % ("mode", "median s", "x ckpt", "min s", "x ckpt",
                                              "peak RSS (MiB)", "above setup (MiB)"))
    for mode in MODES:
        s = summary[mode]
        print("%-18s %9.3f %8.2f %9.3f %8.2f %14.1f %18.1f" % (
            mode, s["step_seconds"], s["step_seconds"] / base["step_seconds"],
            s["min_step_seconds"], s["min_step_seconds"] / base["min_step_seconds"],
            s["peak_rss_bytes"] / 2**20, s["peak_above_setup_bytes"] / 2**20))
    for mode in ("offloadd", "hooks-reentrant"):
        if summary[mode]["fallbacks"]:
            print("warning: %s fell back %d times: its figures are not the daemon path"
                  % (mode, summary[mode]["fallbacks"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "summary": summary, "runs": results}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
