"""One rank of test_fsdp2: a random Qwen3 under FSDP2 ``fully_shard`` (gloo, CPU), one step with
Transformers' checkpoint offload through offloadd, compared with the same step without offload.

Usage: fsdp2_worker.py RANK WORLD PORT SOCKET SYNC_DIR. After the offloaded forward it writes
SYNC_DIR/forward-RANK and waits for SYNC_DIR/go (the test lists the daemon's sessions
meanwhile), then runs backward and prints one JSON line: {"rank", "equal" (loss and every local
gradient shard bitwise equal), "offloaded", "reloaded", "fallbacks", "pid"}.
"""

import json
import os
import sys
import time
import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import daemon_fixture  # noqa: F401  (puts client/python on sys.path)
import offloadd.torch as ot
import offloadd.transformers as otf
import qwen3_fixture as q

SEQ, BATCH = 512, 2


def local_grads(model):
    return [p.grad.to_local().detach().clone() for p in model.parameters()]


def run(model, ids, between=None):
    model.zero_grad(set_to_none=True)
    out = model(input_ids=ids, labels=ids)
    if between is not None:
        between()
    out.loss.backward()
    return out.loss.detach().clone(), local_grads(model)


def main():
    rank, world, port, sock, sync = sys.argv[1:6]
    rank, world = int(rank), int(world)
    warnings.simplefilter("ignore", FutureWarning)
    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    model = q.make_model(seed=0, max_seq=SEQ, **q.SMALL_CONFIG)
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    ids = q.batch(q.SMALL_CONFIG["vocab_size"], BATCH, SEQ, seed=10 + rank)
    q.set_checkpointing(model, "ckpt")
    ref = run(model, ids)

    def wait_for_go():
        assert ot.synchronize()
        open(os.path.join(sync, "forward-%d" % rank), "w").close()
        deadline = time.monotonic() + 120
        while not os.path.exists(os.path.join(sync, "go")):
            if time.monotonic() > deadline:
                raise TimeoutError("no go from the test")
            time.sleep(0.05)
    ctx = otf.enable(keep_last_n=0, socket_path=sock)
    q.set_checkpointing(model, "offload")
    res = run(model, ids, wait_for_go)
    assert ot.synchronize()
    s = ctx.stats
    equal = q.bitwise_equal(res, ref)
    print(json.dumps({"rank": rank, "equal": equal, "offloaded": s.offloaded,
                      "reloaded": s.reloaded, "fallbacks": s.fallbacks, "pid": os.getpid()}),
          flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
