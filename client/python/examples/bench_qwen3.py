"""The reference study's model through three checkpoint paths, timed in one run.

Model and batch of ../shared/reference/activation-checkpoint-offload.txt, "What I ran" (random
Qwen3ForCausalLM: 8 layers, hidden 512, MLP 2048, 8/4 heads, vocabulary 1024; batch 2 x 2048 fp32;
client/python/tests/qwen3_fixture.py), on CPU tensors. Modes, cycled round by round so machine
noise hits all alike:
  ckpt               activation checkpointing alone (Transformers' non-reentrant default)
  torch_save_on_cpu  + offload=True with torch's own save_on_cpu (pinning off: no accelerator)
  offloadd           + offload=True through offloadd.transformers.enable(), keep_last_n=0
Reports per mode the median and fastest step time (forward + backward, seconds) and the training
thread's CPU time in the pack + unpack hooks per offloaded tensor (time.thread_time, the calling
thread only: offloadd's reader thread and the daemon are not counted -- their cost is the
asynchronous part), and the ratios to checkpointing alone / to torch's save_on_cpu.

    .venv/bin/python client/python/examples/bench_qwen3.py --socket /tmp/ofd.sock [--steps 5]

Needs a running shm daemon with >= 64 MiB of pool (bench/torch_bench.sh starts one). Prints a
table and one JSON line. On a CPU the "offload" is a host-to-host copy: this measures the cost of
the hook paths, not GPU memory savings.
"""

import argparse
import json
import os
import statistics
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [os.path.dirname(HERE), os.path.join(os.path.dirname(HERE), "tests")]

import torch  # noqa: E402

import offloadd.torch as ot  # noqa: E402
import offloadd.transformers as otf  # noqa: E402
import qwen3_fixture as q  # noqa: E402

MODES = ("ckpt", "torch_save_on_cpu", "offloadd")


class HookTimer:
    """Wraps the save_on_cpu factory Transformers calls so every instance's pack/unpack hooks
    add their thread CPU time (seconds) to ``cpu_seconds`` and count packs."""

    def __init__(self):
        self.cpu_seconds, self.packs = 0.0, 0

    def wrap(self, factory):
        def make(pin_memory=False, device_type="cuda"):
            ctx = factory(pin_memory=pin_memory, device_type=device_type)
            pack, unpack = ctx.pack_hook, ctx.unpack_hook

            def timed_pack(t):
                t0 = time.thread_time()
                r = pack(t)
                self.cpu_seconds += time.thread_time() - t0
                self.packs += 1
                return r

            def timed_unpack(p):
                t0 = time.thread_time()
                r = unpack(p)
                self.cpu_seconds += time.thread_time() - t0
                return r
            ctx.pack_hook, ctx.unpack_hook = timed_pack, timed_unpack
            return ctx
        return make


def run_mode(mode, model, ids, sock):
    import transformers.modeling_utils as mu
    timer = HookTimer()
    q.set_checkpointing(model, "ckpt" if mode == "ckpt" else "offload")
    orig = mu.save_on_cpu
    if mode == "torch_save_on_cpu":
        mu.save_on_cpu = timer.wrap(lambda pin_memory, device_type:
                                    torch.autograd.graph.save_on_cpu(False, device_type))
    elif mode == "offloadd":
        otf.enable(keep_last_n=0, socket_path=sock)
        mu.save_on_cpu = timer.wrap(ot.save_on_cpu)
    try:
        t0 = time.perf_counter()
        q.step(model, ids)
        seconds = time.perf_counter() - t0
    finally:
        mu.save_on_cpu = orig
        otf.disable()
    return seconds, timer


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--steps", type=int, default=5, help="measured steps per mode (>= 1)")
    ap.add_argument("--threads", type=int, default=2, help="torch intra-op threads, all modes")
    args = ap.parse_args()
    warnings.simplefilter("ignore", FutureWarning)
    torch.set_num_threads(args.threads)
    model = q.make_model(seed=0, max_seq=q.SEED_SEQ, **q.SEED_CONFIG)
    ids = q.batch(q.SEED_CONFIG["vocab_size"], q.SEED_BATCH, q.SEED_SEQ)
    results = {m: {"step_seconds": [], "hook_cpu_seconds_per_tensor": []} for m in MODES}
    for m in MODES:          # warm-up round, not measured
        run_mode(m, model, ids, args.socket)
    for _ in range(args.steps):
        for m in MODES:
            seconds, timer = run_mode(m, model, ids, args.socket)
            results[m]["step_seconds"].append(seconds)
            if timer.packs:
                results[m]["hook_cpu_seconds_per_tensor"].append(timer.cpu_seconds / timer.packs)
    summary = {"threads": args.threads, "steps": args.steps, "modes": {}}
    print("%-18s %12s %12s %22s" % ("mode", "median s", "fastest s", "hook CPU ms/tensor"))
    for m in MODES:
        r = results[m]
        med, best = statistics.median(r["step_seconds"]), min(r["step_seconds"])
        hook = statistics.median(r["hook_cpu_seconds_per_tensor"]) \
            if r["hook_cpu_seconds_per_tensor"] else None
        summary["modes"][m] = {"median_step_seconds": med, "fastest_step_seconds": best,
                               "median_hook_cpu_seconds_per_tensor": hook}
        print("%-18s %12.2f %12.2f %22s" % (m, med, best,
                                               "-" if hook is None else "%.2f" % (hook * 1e3)))
    md = summary["modes"]
    summary["step_ratio_offloadd_to_ckpt"] = \
        md["offloadd"]["median_step_seconds"] / md["ckpt"]["median_step_seconds"]
    summary["step_ratio_torch_save_on_cpu_to_ckpt"] = \
        md["torch_save_on_cpu"]["median_step_seconds"] / md["ckpt"]["median_step_seconds"]
    summary["hook_cpu_ratio_offloadd_to_torch"] = \
        md["offloadd"]["median_hook_cpu_seconds_per_tensor"] / \
        md["torch_save_on_cpu"]["median_hook_cpu_seconds_per_tensor"]
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
