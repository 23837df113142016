"""The real-stack acceptance on the GPU machine: the reference study's Qwen3 step and the Trainer
path on CUDA tensors, through the bundle's daemon (cuda backend), with the machine's own torch and
Transformers (whatever versions it has; printed).

For each sequence length (default 2048 and 4096; batch 2, fp32, eager attention so every mode is
deterministic) it runs one step with no checkpointing, checkpointing, checkpointing + torch's
save_on_cpu (pinned) and checkpointing + offloadd (offloadd.transformers.enable, keep_last_n=0),
and prints FIGURE lines with each mode's peak GPU memory (torch.cuda.max_memory_allocated) and
step time; PASS/FAIL for loss and gradients bitwise equal to no checkpointing and for the
daemon's offload/reload counts. Then 5 Trainer steps with gradient_checkpointing_kwargs=
{"offload": True} through offloadd vs checkpointing alone: PASS when the losses are equal.

    PYTHONPATH=python python3 transformers_check.py --socket /tmp/x.sock [--device cuda]
    (--device cpu --config small --seqs 256 is the CPU smoke run of client/python/tests)
Exit status 0 when every check passed (or SKIPPED: no CUDA / no transformers), 1 otherwise.
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


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--socket", required=True)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--config", choices=("seed", "small"), default="seed")
    ap.add_argument("--seqs", default="2048,4096")
    ap.add_argument("--trainer-steps", type=int, default=5)
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
    print("torch %s, transformers %s, device %s" % (torch.__version__, transformers.__version__,
                                                   args.device), flush=True)
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
        t0 = time.perf_counter()
        try:
            results[mode] = q.step(model, ids)
        finally:
            otf.disable()
        if dev.type == "cuda":
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            figure("transformers_seed seq=%d mode=%s peak_gpu_bytes=%d step_seconds=%.3f"
                   % (seq, mode, peak, time.perf_counter() - t0))
        if ctx is not None:
            ot.synchronize()
            layers = cfg["num_hidden_layers"]
            s = ctx.stats
            ok = check((s.offloaded, s.reloaded, s.fallbacks) == (layers, layers, 0),
                       "seq %d: offloadd offloaded %d, reloaded %d, fallbacks %d (want %d, %d, 0)"
                       % (seq, s.offloaded, s.reloaded, s.fallbacks, layers, layers)) and ok
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
