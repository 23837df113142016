"""GaLore step times: stock galore-torch against offloadd.galore.enable() (bench/galore_bench.sh).

One mode per process (so peak RSS is the mode's own): a random-init LlamaForCausalLM (hidden 512,
MLP 1376, 4 layers of 8 heads, vocabulary 1024: 28 GaLore matrices, 4 x (4 of 512 x 512 + 3 of
1376 x 512)), GaLoreAdamW over the attention and MLP weights at rank 128, update_proj_gap 10,
lr 1e-3, batch 2 x 128 tokens, 60 steps, fp32, one intra-op thread. Each step is timed from the
forward to the end of optimizer.step() (time.perf_counter). A refresh step is a step whose
optimizer state step is a multiple of the gap (steps 1, 11, ..., 51); the first step (warm-up,
and the first refresh, which waits in every mode) is left out of both medians.

Prints one JSON line: mode, median normal step, median refresh step, their ratio, wall time of
the 60 steps, peak RSS of the process (ru_maxrss), final loss, and the routing's counters.

    python bench/galore_bench.py --mode stock|sync|sync-randomized|async|async-lazy --socket S
"""

import argparse
import json
import resource
import statistics
import sys
import time
import warnings

import torch

MODES = ("stock", "sync", "sync-randomized", "async", "async-lazy")
CONFIG = dict(vocab_size=1024, hidden_size=512, intermediate_size=1376, num_hidden_layers=4,
              num_attention_heads=8, num_key_value_heads=8, head_dim=64)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=MODES, required=True)
    ap.add_argument("--socket", default=None)
    ap.add_argument("--steps", type=int, default=60)
    ap.add_argument("--gap", type=int, default=10)
    ap.add_argument("--rank", type=int, default=128)
    args = ap.parse_args()
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    import galore_torch
    from transformers import LlamaConfig, LlamaForCausalLM
    routing = None
    if args.mode != "stock":
        import offloadd.galore as og
        routing = og.enable(socket_path=args.socket,
                            asynchronous=args.mode.startswith("async"),
                            method="randomized" if args.mode == "sync-randomized" else "exact",
                            lazy=args.mode == "async-lazy")
    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(max_position_embeddings=128, **CONFIG))
    model.train()
    target = [p for n, p in model.named_parameters() if p.dim() == 2 and
              any(t in n for t in ("self_attn", "mlp"))]
    ids = {id(p) for p in target}
    groups = [{"params": [p for p in model.parameters() if id(p) not in ids]},
              {"params": target, "rank": args.rank, "update_proj_gap": args.gap, "scale": 0.25,
               "proj_type": "std"}]
    opt = galore_torch.GaLoreAdamW(groups, lr=1e-3, no_deprecation_warning=True)
    gen = torch.Generator().manual_seed(1)
    data = torch.randint(0, CONFIG["vocab_size"], (args.steps, 2, 128), generator=gen)
    times, loss = [], None
    start = time.perf_counter()
    for step in range(args.steps):
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        out = model(input_ids=data[step], labels=data[step])
        out.loss.backward()
        opt.step()
        times.append(time.perf_counter() - t0)
        loss = out.loss.item()
    wall = time.perf_counter() - start
    refresh = [t for i, t in enumerate(times) if i > 0 and i % args.gap == 0]
    normal = [t for i, t in enumerate(times) if i > 0 and i % args.gap != 0]
    result = {"mode": args.mode, "matrices": len(target),
              "median_normal_step_seconds": statistics.median(normal),
              "median_refresh_step_seconds": statistics.median(refresh),
              "refresh_over_normal": statistics.median(refresh) / statistics.median(normal),
              "first_step_seconds": times[0], "wall_seconds": wall,
              "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
              "final_loss": loss}
    if routing is not None:
        result["routing"] = routing.stats.as_dict()
    print(json.dumps(result))
    sys.stdout.flush()


if __name__ == "__main__":
    main()
