#!/usr/bin/env python3
"""Acceptance check of offloadd.torch on whatever torch and device this Python has.

  python3 client/python/examples/check_torch_offload.py --socket /tmp/ofd.sock [--device cuda]

Meant for the GPU machine's PyTorch (torch 2.x; run by the CUDA issue's GPU check script against
a daemon it started, cuda or shm backend) and runnable on CPU. For the
tiny model (L=4, b=2, s=64, h=64 fp32 unless changed) it checks, and exits 1 on any failure:
  1. offload_checkpoints around torch's non-reentrant checkpoint sends exactly L tensors of shape (b, s, h) through the daemon (pack count and the
     daemon's offloads_total), and the loss and every parameter gradient are bitwise equal to the
     step without checkpointing and to the step with checkpointing alone;
  2. the same for offloadd.torch.checkpoint;
  3. over several steps, the daemon ends each step with 0 blocks, no handle survives, and on
     CUDA torch.cuda.memory_allocated() is the same after every step (no blocks stuck in the
     training process: the export does not use PyTorch's IPC reference counting);
  4. no fallback happened (the daemon really took the tensors);
  5. on CUDA, after forward (offloads completed) the device holds at least L * b*s*h*4 bytes
     less with offload (keep_last_n=0) than with checkpointing alone: the inputs left the GPU.
Prints one line per check and the offload statistics.
"""

import argparse
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import torch  # noqa: E402

import offloadd.torch as ot  # noqa: E402
import tiny_lm  # noqa: E402
from offloadd.torch import _endpoint  # noqa: E402
from offloadd.torch._store import Saved  # noqa: E402

FAILURES = []


def check(ok, what):
    print("%s  %s" % ("PASS" if ok else "FAIL", what), flush=True)
    if not ok:
        FAILURES.append(what)


def step(args, mode, ctx=None, model=None, batch_seed=1):
    data = tiny_lm.CharData()
    if model is None:
        model = tiny_lm.make_model(data.vocab, args.layers, args.hidden, 4, device=args.device)
    model.zero_grad(set_to_none=True)
    idx, tgt = data.batch(args.batch, args.seq, torch.Generator().manual_seed(batch_seed))
    loss = model(idx.to(args.device), tgt.to(args.device), mode, ctx)
    loss.backward()
    return loss.detach(), [p.grad.detach().clone() for p in model.parameters()]


def equal(a, b):
    return torch.equal(a[0], b[0]) and all(torch.equal(x, y) for x, y in zip(a[1], b[1]))


def daemon_stats():
    ot.synchronize()
    (ep,) = [e for e in _endpoint.endpoints()]
    return ep.client.get_stats()


def counted_context(args):
    ctx = ot.offload_checkpoints(socket_path=args.socket, keep_last_n=0,
                                 threshold_bytes=args.batch * args.seq * args.hidden * 2)
    shapes, inner = [], ctx.pack_hook  # the hook torch gets (the store's C pack)

    def pack(t, *a, **k):
        r = inner(t, *a, **k)
        if isinstance(r, Saved):
            shapes.append(tuple(t.shape))
        return r
    ctx.pack_hook = pack
    return ctx, shapes


def forward_held_bytes(args, mode, ctx):
    """torch.cuda.memory_allocated() added by a forward (offloads completed), then backward."""
    data = tiny_lm.CharData()
    model = tiny_lm.make_model(data.vocab, args.layers, args.hidden, 4, device=args.device)
    idx, tgt = data.batch(args.batch, args.seq, torch.Generator().manual_seed(1))
    idx, tgt = idx.to(args.device), tgt.to(args.device)
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    loss = model(idx, tgt, mode, ctx)
    ot.synchronize()
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    loss.backward()
    return held


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--socket", required=True)
    p.add_argument("--device", default="cpu")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--seq", type=int, default=64)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--steps", type=int, default=5)
    args = p.parse_args()
    if args.device == "cpu":
        torch.set_num_threads(2)
    L, shape = args.layers, (args.batch, args.seq, args.hidden)
    print("check_torch_offload: torch %s, device %s, L=%d, (b, s, h)=%s"
          % (torch.__version__, args.device, L, shape))
    plain, ckpt = step(args, "plain"), step(args, "checkpoint")
    check(equal(plain, ckpt), "checkpointing alone is bitwise equal to no checkpointing")

    hook_mode = "hooks"
    for mode, label in ((hook_mode, "offload_checkpoints around %s torch checkpoint" % (
            "non-reentrant")),
            ("offloadd", "offloadd.torch.checkpoint")):
        ctx, shapes = counted_context(args)
        out = step(args, mode, ctx)  # connects on the first pack
        before = daemon_stats()
        out = step(args, mode, ctx)
        after = daemon_stats()
        n = after.offloads_total - before.offloads_total
        check(shapes[-L:] == [shape] * L and len(shapes) == 2 * L and n == L,
              "%s: %d tensors of shape %s offloaded per step (pack saw %s; daemon counted %d)"
              % (label, L, shape, shapes[-L:], n))
        check(equal(out, plain) and equal(out, ckpt),
              "%s: loss and every gradient bitwise equal to no checkpointing and to "
              "checkpointing alone" % label)
        check(after.blocks == 0 and ctx.store.live_handles() == 0,
              "%s: nothing left in the pool or in handles after the step" % label)
        check(ctx.stats.fallbacks == 0, "%s: no fallbacks (%s)" % (label, ctx.stats.summary()))

    if args.device.startswith("cuda"):
        layer_bytes = args.batch * args.seq * args.hidden * 4
        held = {}
        for mode in ("checkpoint", hook_mode, "offloadd"):
            ctx = counted_context(args)[0] if mode != "checkpoint" else None
            held[mode] = forward_held_bytes(args, mode, ctx)
        for mode in (hook_mode, "offloadd"):
            check(held["checkpoint"] - held[mode] >= L * layer_bytes,
                  "%s: after forward the GPU holds %d bytes less than checkpointing alone "
                  "(expected >= %d)" % (mode, held["checkpoint"] - held[mode], L * layer_bytes))

    ctx, _ = counted_context(args)
    data = tiny_lm.CharData()
    model = tiny_lm.make_model(data.vocab, args.layers, args.hidden, 4, device=args.device)
    allocated, blocks = [], []
    for s in range(args.steps):
        step(args, hook_mode, ctx, model=model, batch_seed=s)
        blocks.append(daemon_stats().blocks)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
            allocated.append(torch.cuda.memory_allocated())
    check(set(blocks) == {0}, "%d steps: daemon blocks after each step %s" % (args.steps, blocks))
    if allocated:
        check(len(set(allocated[1:])) == 1,
              "%d steps: torch.cuda.memory_allocated() after each step %s" % (args.steps,
                                                                              allocated))
    print("stats: " + ctx.stats.summary())
    if FAILURES:
        print("check_torch_offload: %d FAILED" % len(FAILURES))
        return 1
    print("check_torch_offload: all passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
