"""PyTorch example model on CUDA through a running offloadd (backend "cuda").

Run by tests/gpu/run.sh: ``python3 torch_check.py --socket PATH --python-root DIR``.
Prints "SKIPPED: ..." and exits 0 without a GPU; "FAIL: ..." and exits 1 on a mismatch;
figures as "FIGURE <name> <value> <unit>" lines.

Checks, at two sequence lengths:
  * gradients with offloadd (offloadd.torch.checkpoint, strict: no silent fallback) are bitwise
    equal to those of torch.utils.checkpoint without offload (deterministic algorithms on);
  * every checkpointed input really went through the daemon (stats: offloaded == reloaded > 0,
    no fallbacks);
  * step time (forward + backward, ms) of checkpointing alone vs torch's save_on_cpu vs offloadd;
  * GPU memory does not grow over 20 offloadd steps (docs/ARCHITECTURE.md, "Pitfalls": blocks
    stuck in limbo);
  * host waits on the training thread per offloadd step (``stats.host_waits`` /
    ``host_wait_seconds`` where the client counts them, else "n/a"; ``waited`` reloads too).

With PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (run.sh runs it both ways) the context is
made with the default strict=False and the first offloadd step decides: one error naming the
setting (at the context or the first offload) passes and ends the check; offloads that all reach
the daemon go on to the full check; any per-tensor fallback fails (a silent fallback).
An unsupported torch, or any other exception, ends in one "FAIL: ..." line (the traceback goes to
stderr, which run.sh keeps in the log).
"""

import argparse
import os
import sys
import time

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
os.environ.setdefault("PYTORCH_CUDA_ALLOC_CONF", "expandable_segments:False")


def expandable_on():
    return "expandable_segments:true" in \
        os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()


def main():
    import traceback
    try:
        return run()
    except Exception as e:
        traceback.print_exc()
        import torch
        print("FAIL: torch_check under torch %s: %s: %s"
              % (torch.__version__, type(e).__name__, str(e).splitlines()[0][:300] if str(e)
                 else ""))
        return 1


def run():
    p = argparse.ArgumentParser()
    p.add_argument("--socket", required=True)
    p.add_argument("--python-root", required=True, help="dir holding offloadd/ and examples/")
    p.add_argument("--seqs", default="2048,8192")
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--heads", type=int, default=16)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--steps", type=int, default=5)
    p.add_argument("--threshold-bytes", type=int, default=1 << 20)
    p.add_argument("--device", default="cuda",
                   help="cpu: a smoke test of this script against an shm daemon (no GPU)")
    a = p.parse_args()
    sys.path.insert(0, a.python_root)
    sys.path.insert(0, os.path.join(a.python_root, "examples"))
    import torch
    if a.device == "cuda" and not torch.cuda.is_available():
        print("SKIPPED: torch.cuda.is_available() is False (no driver or GPU)")
        return 0
    torch.use_deterministic_algorithms(True)
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    import tiny_lm
    try:
        import offloadd.torch as ot
    except ImportError as e:
        print("FAIL: torch %s is not supported by this offloadd: %s" % (torch.__version__, e))
        return 1

    dev = torch.device("cuda", 0) if a.device == "cuda" else torch.device("cpu")
    sync = torch.cuda.synchronize if a.device == "cuda" else (lambda *_: None)
    mem = torch.cuda.memory_allocated if a.device == "cuda" else (lambda *_: 0)
    data = tiny_lm.CharData()
    expandable = a.device == "cuda" and expandable_on()
    print("torch %s on %s, expandable segments %s"
          % (torch.__version__, torch.cuda.get_device_name(dev) if a.device == "cuda" else "cpu",
             "on" if expandable else "off"))
    try:
        ctx = ot.offload_checkpoints(threshold_bytes=a.threshold_bytes, socket_path=a.socket,
                                     strict=not expandable, name="gpu-check")
    except Exception as e:
        return refused(e, "making the context") if expandable else _raise(e)

    def step(model, idx, tgt, mode):
        model.zero_grad(set_to_none=True)
        loss = model(idx, tgt, mode=mode, context=ctx if mode == "offloadd" else None)
        loss.backward()
        return loss

    for s in [int(x) for x in a.seqs.split(",")]:
        model = tiny_lm.make_model(data.vocab, a.layers, a.hidden, a.heads, seed=0, device=dev)
        g = torch.Generator().manual_seed(s)
        idx, tgt = data.batch(a.batch, s, g) if s < len(data.tokens) - 1 else (None, None)
        if idx is None:  # corpus shorter than the sequence: tile it
            reps = (s + 1) // len(data.tokens) + 2
            tok = data.tokens.repeat(reps)
            idx = torch.stack([tok[i:i + s] for i in range(a.batch)])
            tgt = torch.stack([tok[i + 1:i + s + 1] for i in range(a.batch)])
        idx, tgt = idx.to(dev), tgt.to(dev)

        # Bitwise gradients: offloadd vs checkpointing without offload.
        step(model, idx, tgt, "checkpoint")
        ref = [q.grad.clone() for q in model.parameters()]
        before = ctx.stats.snapshot()
        try:
            step(model, idx, tgt, "offloadd")
            ot.synchronize()
        except Exception as e:
            if not expandable:
                raise
            return refused(e, "the first offloadd step")
        got = [q.grad.clone() for q in model.parameters()]
        d = ctx.stats.snapshot() - before
        for i, (r, o) in enumerate(zip(ref, got)):
            if not torch.equal(r, o):
                print("FAIL: seq %d: gradient %d differs from no-offload checkpointing "
                      "(max abs diff %g)" % (s, i, (r - o).abs().max().item()))
                return 1
        if expandable and d.fallbacks:
            print("FAIL: with expandable segments on, %d tensors fell back in-process (a silent "
                  "per-tensor fallback) and %d reached the daemon: enable() must refuse the "
                  "setting with one error, or the offloads must reach the daemon"
                  % (d.fallbacks, d.offloaded))
            return 1
        # Each tensor sent is reloaded, or served from the device because backward needed it
        # while its offload was still copying (the host runs ahead of the GPU: the last layers'
        # offloads can still wait on their ready events when backward starts); an offload
        # completes for every reloaded one and for some served ones.
        if (d.reloaded == 0 or d.fallbacks != 0 or d.lost != 0
                or not d.reloaded <= d.offloaded <= d.reloaded + d.served_in_flight):
            print("FAIL: seq %d: not every input went through the daemon: %s" % (s, d.summary()))
            return 1
        print("FIGURE served_in_flight_per_step_seq%d %d tensors (backward needed them while "
              "their offload was still copying: used from the device)" % (s, d.served_in_flight))
        act_mib = a.batch * s * a.hidden * 4 / 2.0 ** 20
        print("PASS seq %d: gradients bitwise equal; %s (layer input %.0f MiB)"
              % (s, d.summary(), act_mib))

        # Step times.
        times = {}
        for mode in ("checkpoint", "torch-save-on-cpu", "offloadd"):
            for _ in range(2):
                step(model, idx, tgt, mode)
            sync()
            before = ctx.stats.snapshot()
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step(model, idx, tgt, mode)
            sync()
            times[mode] = (time.perf_counter() - t0) / a.steps * 1e3
            if mode == "offloadd":
                ot.synchronize()
                d = ctx.stats.snapshot() - before
        for mode, ms in times.items():
            print("FIGURE step_ms_seq%d_%s %.1f ms (x%.2f of checkpoint)"
                  % (s, mode, ms, ms / times["checkpoint"]))
        print("FIGURE host_waits_per_step_seq%d_offloadd %s waits, %s s (checkpoint: 0 by "
              "construction; reloads waited for: %s, %s s)"
              % (s, per_step(d, "host_waits", a.steps, "%.1f"),
                 per_step(d, "host_wait_seconds", a.steps, "%.6f"),
                 per_step(d, "waited", a.steps, "%.1f"),
                 per_step(d, "waited_seconds", a.steps, "%.6f")))

        # Memory growth over 20 offloadd steps.
        sync()
        m0 = mem(dev)
        for _ in range(20):
            step(model, idx, tgt, "offloadd")
        ot.synchronize()
        sync()
        growth = mem(dev) - m0
        print("FIGURE gpu_memory_growth_20_steps_seq%d %d bytes" % (s, growth))
        if growth > (1 << 20):  # a leaked layer input would be >= batch * s * hidden * 4 bytes
            print("FAIL: seq %d: GPU memory grew by %d bytes over 20 steps" % (s, growth))
            return 1
        del model
        if a.device == "cuda":
            torch.cuda.empty_cache()
    ot.close()
    return 0


def per_step(d, name, steps, fmt):
    v = getattr(d, name, None)
    return "n/a" if v is None else fmt % (v / steps)


def refused(e, where):
    """The expandable-segments outcome when offloadd raised: PASS if the error names the
    setting, FAIL otherwise."""
    msg = str(e).splitlines()[0] if str(e) else type(e).__name__
    if "expandable" in msg.lower():
        print("PASS expandable segments refused with one error at %s: %s" % (where, msg[:300]))
        return 0
    print("FAIL: with expandable segments on, %s raised an error that does not name the "
          "setting: %s: %s" % (where, type(e).__name__, msg[:300]))
    return 1


def _raise(e):
    raise e


if __name__ == "__main__":
    sys.exit(main())
