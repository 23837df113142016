#!/usr/bin/python3
"""Trains the tiny decoder-only transformer (tiny_lm.py) on the bundled text, optionally with
its checkpointed layer inputs offloaded to an offloadd daemon.

  /usr/bin/python3 client/python/examples/train_tiny.py                      # checkpointing only
  /usr/bin/python3 client/python/examples/train_tiny.py --offload --socket /tmp/ofd.sock

Every layer runs under non-reentrant checkpointing; with --offload the layer inputs go to the
daemon through ``offloadd.torch.checkpoint`` (default) or through ``offload_checkpoints`` hooks
around torch's checkpoint (--offload-mode hooks: non-reentrant).
Prints the loss per step, then the offload statistics and the daemon's pool counters.
Exit status 0 on success; the daemon being unreachable is a fallback (warned), not an error,
unless --strict.
"""

import argparse
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.dirname(HERE)]

import torch  # noqa: E402

import tiny_lm  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--hidden", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--device", default="cpu", help="cpu or cuda[:N]")
    p.add_argument("--threads", type=int, default=2, help="torch intra-op threads (CPU)")
    p.add_argument("--offload", action="store_true", help="send layer inputs to the daemon")
    p.add_argument("--offload-mode", choices=("checkpoint", "hooks"), default="checkpoint")
    p.add_argument("--socket", default=None, help="daemon socket (default: $OFFLOADD_SOCKET or "
                   "the default rule, see offloadd.socket_path)")
    p.add_argument("--threshold-bytes", type=int, default=None,
                   help="offload saved tensors of at least this size (default: one layer "
                        "input, batch*seq*hidden*4, capped at 1 MiB)")
    p.add_argument("--keep-last-n", type=int, default=1)
    p.add_argument("--strict", action="store_true", help="fail instead of falling back")
    return p.parse_args(argv)


def main(argv=None):
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    device = torch.device(args.device)
    data = tiny_lm.CharData()
    model = tiny_lm.make_model(data.vocab, args.layers, args.hidden, args.heads, seed=args.seed,
                               device=device)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    gen = torch.Generator().manual_seed(args.seed)
    layer_bytes = args.batch * args.seq * args.hidden * 4
    ctx, mode = None, "checkpoint"
    if args.offload:
        import offloadd.torch as ot
        threshold = args.threshold_bytes or min(layer_bytes, 1 << 20)
        ctx = ot.offload_checkpoints(threshold_bytes=threshold, keep_last_n=args.keep_last_n,
                                     strict=args.strict, socket_path=args.socket,
                                     name="train_tiny")
        mode = "offloadd" if args.offload_mode == "checkpoint" else "hooks"
    print("train_tiny: %d layers, hidden %d, batch %d x seq %d (layer input %d bytes), "
          "vocab %d, torch %s, mode %s"
          % (args.layers, args.hidden, args.batch, args.seq, layer_bytes, data.vocab,
             torch.__version__, mode), flush=True)
    for step in range(1, args.steps + 1):
        t0 = time.perf_counter()
        idx, tgt = data.batch(args.batch, args.seq, gen)
        loss = model(idx.to(device), tgt.to(device), mode, ctx)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        print("step %3d  loss %.4f  %.3f s" % (step, loss.item(), time.perf_counter() - t0),
              flush=True)
    if ctx is not None:
        import offloadd.torch as ot
        from offloadd.torch import _endpoint
        ot.synchronize()
        print("offload: " + ctx.stats.summary())
        for ep in _endpoint.endpoints():
            print(daemon_line(ep.client.target, ep.client.get_stats()))
    return 0


def _count(n, noun):
    """'1 session', '2 sessions': ``n`` (an int) with ``noun`` singular or plural."""
    return "%d %s%s" % (n, noun, "" if n == 1 else "s")


def daemon_line(target, s):
    """The daemon's counters as one line: ``target`` its gRPC target (str), ``s`` its
    ``Client.get_stats()`` reply (offload, reload and session counts; pool bytes)."""
    return ("daemon %s (%s backend): %s / %s in total, pool %d of %d bytes in use, peak %d, "
            "%s open (this process's included)" % (target, s.backend, _count(s.offloads_total, "offload"),
                         _count(s.reloads_total, "reload"), s.pool_used_bytes,
                         s.pool_capacity_bytes, s.pool_peak_used_bytes,
                         _count(s.sessions_open, "session")))


if __name__ == "__main__":
    sys.exit(main())
