"""A training process for test_multiprocess: offloadd steps next to plain steps, bit for bit.

Usage: train_worker.py SOCKET SEED STEPS. Connects (prints "connected"), waits for a line on
stdin, then runs STEPS steps of the tiny model twice -- through offloadd.torch.checkpoint and the
offload_checkpoints hooks alternately, and without offload -- with SGD updates, and prints one
JSON line: {"ok": all steps bitwise equal, "offloaded": n, "fallbacks": n, "losses": [...]}.
"""

import json
import sys

import torch

import daemon_fixture as d
import offloadd.torch as ot
import tiny_lm


def main():
    sock, seed, steps = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    torch.set_num_threads(1)
    ctx = ot.offload_checkpoints(socket_path=sock, threshold_bytes=d.THRESHOLD, keep_last_n=0)
    from offloadd.torch import _endpoint
    ep, reason = _endpoint.get(sock, torch.device("cpu"))
    print("connected" if ep is not None else "unreachable: %s" % reason, flush=True)
    sys.stdin.readline()
    data = tiny_lm.CharData()
    model = tiny_lm.make_model(data.vocab, d.L, d.H, 4, seed=seed)
    ref = tiny_lm.make_model(data.vocab, d.L, d.H, 4, seed=seed)
    opts = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, ref)]
    ok, losses = True, []
    for step in range(steps):
        mode = "offloadd" if step % 2 == 0 else "hooks-reentrant"
        a = d.run_step(mode, ctx, batch_seed=seed * 100 + step, model=model)
        b = d.run_step("plain", batch_seed=seed * 100 + step, model=ref)
        ok = ok and d.bitwise_equal(a, b)
        losses.append(float(a[0]))
        for o in opts:
            o.step()
    print(json.dumps({"ok": ok, "offloaded": ctx.stats.offloaded,
                      "fallbacks": ctx.stats.fallbacks, "losses": losses}), flush=True)


if __name__ == "__main__":
    main()
