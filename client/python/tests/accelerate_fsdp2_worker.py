"""One gloo rank (world size 1, CPU) of test_torch_enable's accelerate test.

accelerate applies FSDP2 activation checkpointing in ``accelerate.utils.fsdp2_apply_ac``: each
layer its auto-wrap policy selects becomes ``checkpoint_wrapper(layer)``, and with
``activation_checkpointing_offload`` ``offload_wrapper(...)`` around it. ``Accelerator`` itself
only takes the FSDP path on accelerator devices, so this calls that function as
``Accelerator.prepare`` does, with a real ``FullyShardedDataParallelPlugin``, on a random Qwen3,
then shards it with FSDP2 ``fully_shard`` and runs one step with offloadd.torch.enable().

Usage: accelerate_fsdp2_worker.py SOCKET. Prints one JSON line: "wrapped" (offload wrappers
accelerate applied), "during" ([daemon offloads since the start, blocks held] between forward
and backward), "offloaded", "reloaded", "fallbacks" (the context's counts), "loss_equal" (the
loss bitwise that of the same model without accelerate, checkpointing or offload), "warnings"
(offloadd's RuntimeWarnings).
"""

import json
import os
import sys
import types
import warnings

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

import daemon_fixture
import offloadd.torch as ot
import qwen3_fixture as q

SEQ, BATCH = 512, 2


def main():
    sock = sys.argv[1]
    torch.set_num_threads(1)
    warnings.simplefilter("ignore", FutureWarning)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(daemon_fixture.free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    from accelerate.utils import FullyShardedDataParallelPlugin, fsdp2_apply_ac
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import OffloadWrapper

    ids = q.batch(q.SMALL_CONFIG["vocab_size"], BATCH, SEQ, seed=4)
    plain = q.make_model(seed=0, max_seq=SEQ, **q.SMALL_CONFIG)
    plain_loss = plain(input_ids=ids, labels=ids).loss.detach()

    ctx = ot.enable(keep_last_n=0, socket_path=sock)   # before the model is prepared
    plugin = FullyShardedDataParallelPlugin(
        fsdp_version=2, activation_checkpointing=True, activation_checkpointing_offload=True,
        auto_wrap_policy="transformer_based_wrap",
        transformer_cls_names_to_wrap=["Qwen3DecoderLayer"])
    accelerator = types.SimpleNamespace(state=types.SimpleNamespace(fsdp_plugin=plugin))
    model = q.make_model(seed=0, max_seq=SEQ, **q.SMALL_CONFIG)
    model = fsdp2_apply_ac(accelerator, model)
    wrapped = sum(isinstance(m, OffloadWrapper) for m in model.modules())
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)

    before = daemon_fixture.daemon_stats(sock)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        out = model(input_ids=ids, labels=ids)
        assert ot.synchronize()
        d = daemon_fixture.daemon_stats(sock)
        during = [d.offloads_total - before.offloads_total, d.blocks - before.blocks]
        out.loss.backward()
        assert ot.synchronize()
    s = ctx.stats
    print(json.dumps({"wrapped": wrapped, "during": during, "offloaded": s.offloaded,
                      "reloaded": s.reloaded, "fallbacks": s.fallbacks,
                      "loss_equal": torch.equal(out.loss.detach(), plain_loss),
                      "warnings": [str(w.message) for w in caught
                                   if "offloadd" in str(w.message)]}), flush=True)
    dist.destroy_process_group()




if __name__ == "__main__":
    main()
