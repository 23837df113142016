"""The real-stack acceptance on the GPU machine: the reference study's Qwen3 step and the Trainer
path on CUDA tensors, through the bundle's daemon (cuda backend), with the machine's own torch and
Transformers (whatever versions it has; printed).

For each sequence length (default 2048 and 4096; batch 2, fp32, eager attention so every mode is
deterministic) it runs steps with no checkpointing, checkpointing, checkpointing + torch's
save_on_cpu (pinned) and checkpointing + offloadd (offloadd.transformers.enable, keep_last_n=0):
per mode one step whose loss and gradients are compared, then --timed-steps more; FIGURE lines
give each mode's peak GPU memory over its steps (torch.cuda.max_memory_allocated) and its median
timed step, and for offloadd the host waits on the training thread per step (the context's
``host_waits`` / ``host_wait_seconds`` where the client counts them, else "n/a"); PASS/FAIL for
loss and gradients bitwise equal to no checkpointing and for the daemon's offload/reload counts. Then 5 Trainer steps with gradient_checkpointing_kwargs=
{"offload": True} through offloadd vs checkpointing alone: PASS when the losses are equal.

    PYTHONPATH=python python3 transformers_check.py --socket /tmp/x.sock [--device cuda]
    (--device cpu --config small --seqs 256 is the CPU smoke run of client/python/tests)
Exit status 0 when every check passed (or SKIPPED: no CUDA / no transformers), 1 otherwise.
With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (run.sh runs it both ways) enable() or the
first offloadd step may refuse the setting with one error naming it (PASS, the rest is not run);
offloads that reach the daemon go on to the full check; a per-tensor fallback fails. A torch or
Transformers this offloadd does not support, and any other exception, end in one "FAIL: ..."
line naming the versions (the traceback goes to stderr).
"""

import argparse
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))


def figure(msg):
    print("FIGURE " + msg, flush=True)


def check(ok, what):
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    return ok


def expandable_on():
    return "expandable_segments:true" in \
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()


class Refused(Exception):
    """offloadd refused expandable segments with an error naming the setting."""


def per_step(stats, name, steps, fmt):
    v = getattr(stats, name, None)
    return "n/a" if v is None else fmt % (v / steps)


def main():
    import traceback
    try:
        return run()
    except Refused as e:
        print("PASS expandable segments refused with one error: %s" % e, flush=True)
        return 0
    except Exception as e:
        traceback.print_exc()
        print("FAIL: transformers_check under %s: %s: %s"
              % (versions(), type(e).__name__, str(e).splitlines()[0][:300] if str(e) else ""),
              flush=True)
        return 1


def versions():
    out = []
    for name in ("torch", "transformers"):
        mod = sys.modules.get(name)
        out.append("%s %s" % (name, getattr(mod, "__version__", "not imported")))
    return ", ".join(out)


def run():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", choices=("seed", "small"), default="seed")
    ap.add_argument("--seqs", default="2048,4096")
    ap.add_argument("--trainer-steps", type=int, default=5)
    ap.add_argument("--timed-steps", type=int, default=2,
                    help="steps timed per mode after the compared one (median printed)")
    ap.add_argument("--fixture-dir", default=HERE, help="where qwen3_fixture.py is")
    args = ap.parse_args()
    sys.path.insert(0, args.fixture_dir)
    import torch
    try:
        import transformers  # noqa: F401
    except ImportError:
        print("SKIPPED transformers is not installed on this machine")
        return 0
    if args.device == "cuda" and not torch.cuda.is_available():
        print("SKIPPED no CUDA device")
        return 0
    import transformers
    print("torch %s, transformers %s, device %s, expandable segments %s"
          % (torch.__version__, transformers.__version__, args.device,
             "on" if expandable_on() else "off"), flush=True)
    try:
        import offloadd.transformers as otf
        otf.enable(socket_path=args.socket)
        otf.disable()
    except ImportError as e:
        print("FAIL: this offloadd does not support %s: %s" % (versions(), e), flush=True)
        return 1
    except Exception as e:
        if expandable_on() and "expandable" in str(e).lower():
            raise Refused("at enable(): %s" % str(e).splitlines()[0][:300])
        raise
    warnings.simplefilter("ignore", FutureWarning)
    import qwen3_fixture as q
    cfg = q.SEED_CONFIG if args.config == "seed" else q.SMALL_CONFIG
    ok = True
    for seq in (int(s) for s in args.seqs.split(",")):
        ok = seed_step(q, cfg, seq, args) and ok
    ok = trainer_steps(q, args) and ok
    return 0 if ok else 1


def seed_step(q, cfg, seq, args):
    import torch

    import offloadd.torch as ot
    import offloadd.transformers as otf
    dev = torch.device(args.device)
    model = q.make_model(seed=0, max_seq=seq, attn_implementation="eager", **cfg).to(dev)
    ids = q.batch(cfg["vocab_size"], 2, seq).to(dev)
    results, ok = {}, True
    for mode in ("none", "ckpt", "torch_save_on_cpu", "offloadd"):
        q.set_checkpointing(model, "ckpt" if mode == "ckpt" else
                            "none" if mode == "none" else "offload")
        ctx = None
        if mode == "offloadd":
            ctx = otf.enable(keep_last_n=0, socket_path=args.socket)
            ctx.stats.reset()
        if mode == "torch_save_on_cpu" and dev.type != "cuda":
            results[mode] = None   # torch's save_on_cpu cannot pin without an accelerator
            continue
        if dev.type == "cuda":
            torch.cuda.synchronize()
            torch.cuda.reset_peak_memory_stats()
            base = torch.cuda.memory_allocated()
        times = []
        try:
            for i in range(1 + args.timed_steps):
                t0 = time.perf_counter()
                try:
                    r = q.step(model, ids)
                except Exception as e:
                    if mode == "offloadd" and expandable_on() and \
                            "expandable" in str(e).lower():
                        raise Refused("at the first offload: %s" % str(e).splitlines()[0][:300])
                    raise
                if dev.type == "cuda":
                    torch.cuda.synchronize()
                times.append(time.perf_counter() - t0)
                if i == 0:
                    results[mode] = r
        finally:
            otf.disable()
        timed = sorted(times[1:] or times)
        if dev.type == "cuda":
            peak = torch.cuda.max_memory_allocated() - base
            figure("transformers_seed seq=%d mode=%s peak_gpu_bytes=%d step_seconds=%.4f "
                   "(median of %d timed steps after the compared one)"
                   % (seq, mode, peak, timed[len(timed) // 2], len(times) - 1))
        if ctx is not None:
            ot.synchronize()
            layers = cfg["num_hidden_layers"]
            s = ctx.stats
            n = len(times)
            figure("transformers_host_waits_per_step seq=%d %s waits, %s s (reloads waited for: "
                   "%s, %s s)" % (seq, per_step(s, "host_waits", n, "%.1f"),
                                  per_step(s, "host_wait_seconds", n, "%.6f"),
                                  per_step(s, "waited", n, "%.1f"),
                                  per_step(s, "waited_seconds", n, "%.6f")))
            if expandable_on() and s.fallbacks:
                ok = check(False, "seq %d: with expandable segments on %d tensors fell back "
                           "in-process (a silent per-tensor fallback), %d reached the daemon"
                           % (seq, s.fallbacks, s.offloaded))
                continue
            # Every layer's input is reloaded or, when backward needs it while its offload is
            # still copying (the host runs ahead of the GPU), served from the device.
            figure("transformers_served_in_flight seq=%d %d of %d tensors" %
                   (seq, s.served_in_flight, n * layers))
            ok = check((s.reloaded + s.served_in_flight, s.fallbacks, s.lost) == (n * layers, 0, 0)
                       and s.reloaded <= s.offloaded <= n * layers,
                       "seq %d: offloadd offloaded %d, reloaded %d, served in flight %d, "
                       "fallbacks %d over %d steps (want reloaded + served = %d, 0 fallbacks)"
                       % (seq, s.offloaded, s.reloaded, s.served_in_flight, s.fallbacks, n,
                          n * layers)) and ok
    for mode in ("ckpt", "torch_save_on_cpu"):
        if results.get(mode) is not None:
            ok = check(q.bitwise_equal(results["offloadd"], results[mode]),
                       "seq %d: offloadd bitwise equal to %s" % (seq, mode)) and ok
    ok = check(q.bitwise_equal(results["offloadd"], results["none"]),
               "seq %d: offloadd bitwise equal to no checkpointing" % seq) and ok
    ok = check(daemon_blocks(args.socket) == 0,
               "seq %d: the daemon holds no block after the step" % seq) and ok
    return ok


def daemon_blocks(sock):
    """Blocks the daemon holds, from a unary GetStats (opens no session)."""
    import grpc

    from offloadd.v1 import offload_pb2 as pb
    from offloadd.v1 import offload_pb2_grpc as pb_grpc
    with grpc.insecure_channel("unix:" + sock) as channel:
        return pb_grpc.OffloadStub(channel).GetStats(pb.GetStatsRequest(), timeout=10).blocks


def trainer_steps(q, args):
    import torch
    import transformers

    import offloadd.transformers as otf
    seq, batch, steps = 512, 2, args.trainer_steps

    def train(offload):
        model = q.make_model(seed=0, max_seq=seq, attn_implementation="eager", **q.SMALL_CONFIG)
        ids = q.batch(q.SMALL_CONFIG["vocab_size"], batch * steps, seq, seed=5)
        data = [{"input_ids": r, "labels": r} for r in ids]
        losses = []

        class Recording(transformers.Trainer):
            def training_step(self, *a, **k):
                loss = super().training_step(*a, **k)
                losses.append(loss.detach().float().cpu().clone())
                return loss
        import tempfile
        with tempfile.TemporaryDirectory() as out:
            ta = transformers.TrainingArguments(
                output_dir=out, max_steps=steps, per_device_train_batch_size=batch,
                learning_rate=1e-3, gradient_checkpointing=True,
                gradient_checkpointing_kwargs={"offload": True} if offload else None,
                use_cpu=args.device == "cpu", report_to=[], save_strategy="no",
                logging_strategy="no", dataloader_num_workers=0, seed=0, disable_tqdm=True)
            Recording(model=model, args=ta, train_dataset=data).train()
        return losses
    plain = train(False)
    otf.enable(keep_last_n=0, socket_path=args.socket)
    try:
        off = train(True)
    finally:
        otf.disable()
    return check(len(off) == steps and all(torch.equal(a, b) for a, b in zip(off, plain)),
                 "Trainer: %d steps with offloadd, losses equal to checkpointing alone (%s)"
                 % (steps, ", ".join("%.6f" % x.item() for x in off)))


if __name__ == "__main__":
    sys.exit(main())
