"""One gloo rank (world size 1, CPU) of test_deepspeed_checkpointing.

DeepSpeed's activation checkpointing as a model uses it: ``deepspeed.init_distributed``, then
``deepspeed.checkpointing.configure`` with a DeepSpeed config's ``"activation_checkpointing"``
section, and ``deepspeed.checkpointing.checkpoint`` as each layer's checkpoint function (for a
Transformers model: ``model._set_gradient_checkpointing(enable=True,
gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)``). A random Qwen3 (3 layers,
hidden 256), batch 2 x 256 tokens, one forward and backward in each of two runs:

* "plain": ``cpu_checkpointing`` false (the reference loss and gradients);
* "offloadd": ``cpu_checkpointing`` true after ``offloadd.deepspeed.enable()``.

DeepSpeed 0.19.8's own ``cpu_checkpointing`` cannot run on a CPU-only host: its blocking-copy
path empties the layer input it meant to keep (the "copy" to the CPU is the tensor itself), and
the recompute fails ("IndexError: Dimension out of range"); so no run of it here.
DeepSpeed's TorchBackend JIT-compiles a shared-memory all-reduce op at ``init_distributed`` on
a CPU accelerator (minutes on a fresh machine); checkpointing never uses it, so it is not built.

Usage: deepspeed_ckpt_worker.py SOCKET. Prints one JSON line with, per run, "during" (daemon
offloads, offloaded bytes and blocks held since the run began, between forward and backward),
"after" (daemon reloads since the run began, blocks held after backward), "equal" (loss and
gradients bitwise those of "plain"), and "stats" ([offloaded, reloaded, fallbacks] of offloadd's
context, offloadd run only); "lookup": engine_lookup's answers; "shm_op_built": whether
DeepSpeed's backend holds the shared-memory all-reduce op (false: it was not built).
"""

import importlib
import json
import os
import sys
import warnings

import torch

import daemon_fixture
import offloadd.torch as ot
import qwen3_fixture as q

CONFIG = dict(q.SMALL_CONFIG, num_hidden_layers=3)
BATCH, SEQ = 2, 256
THRESHOLD_BYTES = 64 * 1024 + 1   # layer inputs (512 KiB) go; the rotary tables (64 KiB) stay


def ds_config(cpu_checkpointing):
    return {"train_batch_size": BATCH,
            "activation_checkpointing": {"partition_activations": False,
                                         "cpu_checkpointing": cpu_checkpointing}}


def run(sock, cpu_checkpointing, reference=None):
    import deepspeed
    deepspeed.checkpointing.configure(None, deepspeed_config=ds_config(cpu_checkpointing))
    model = q.make_model(seed=0, max_seq=SEQ, **CONFIG)
    model._set_gradient_checkpointing(
        enable=True, gradient_checkpointing_func=deepspeed.checkpointing.checkpoint)
    ids = q.batch(CONFIG["vocab_size"], BATCH, SEQ, seed=7)
    before = daemon_fixture.daemon_stats(sock)
    seen = {}

    def between():
        ot.synchronize()
        d = daemon_fixture.daemon_stats(sock)
        seen["during"] = [d.offloads_total - before.offloads_total,
                          d.offload_bytes_total - before.offload_bytes_total, d.blocks]
    result = q.step(model, ids, between)
    ot.synchronize()
    a = daemon_fixture.daemon_stats(sock)
    out = {"during": seen["during"], "after": [a.reloads_total - before.reloads_total, a.blocks]}
    if reference is not None:
        out["equal"] = q.bitwise_equal(result, reference)
    return result, out


def main():
    sock = sys.argv[1]
    torch.set_num_threads(1)
    warnings.simplefilter("ignore")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(daemon_fixture.free_port()), RANK="0",
                      LOCAL_RANK="0", WORLD_SIZE="1")
    import deepspeed
    # The module itself: the attribute deepspeed.comm.torch is the torch package (deepspeed.comm
    # imports it under that name), so setting build_shm_op there left DeepSpeed's own in place.
    ds_torch_backend = importlib.import_module("deepspeed.comm.torch")
    ds_torch_backend.build_shm_op = lambda: None   # see the module docstring
    deepspeed.init_distributed(dist_backend="gloo")
    shm_op_built = importlib.import_module("deepspeed.comm.comm").cdb.shm_comm_op is not None
    import offloadd.deepspeed as od
    reference, plain = run(sock, False)
    ctx = od.enable(keep_last_n=0, threshold_bytes=THRESHOLD_BYTES, socket_path=sock)
    ctx.stats.reset()
    _, routed = run(sock, True, reference)
    s = ctx.stats
    routed["stats"] = [s.offloaded, s.reloaded, s.fallbacks]
    lookup = engine_lookup(od)
    print(json.dumps({"plain": plain, "offloadd": routed, "lookup": lookup,
                      "shm_op_built": shm_op_built, "version": deepspeed.__version__}), flush=True)
    import torch.distributed as dist
    dist.destroy_process_group()


def engine_lookup(od):
    """What DeepSpeed's engine lookup answers while enabled (cpu_checkpointing on: offloadd's
    engine; with partition_activations: None and one RuntimeWarning; cpu_checkpointing off:
    None) and whether disable() puts DeepSpeed's own function back."""
    import deepspeed.runtime.activation_checkpointing.checkpointing as ck
    out = {"on": type(ck._get_cpu_offload_engine()).__module__}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ck.PARTITION_ACTIVATIONS = True
        out["partitioned"] = ck._get_cpu_offload_engine() is None
        ck._get_cpu_offload_engine()
        ck.PARTITION_ACTIVATIONS = False
    out["warnings"] = [str(w.message) for w in caught if "offloadd" in str(w.message)]
    ck.CPU_CHECKPOINT = False
    out["off"] = ck._get_cpu_offload_engine() is None
    od.disable()
    out["restored"] = ck._get_cpu_offload_engine.__module__ == ck.__name__
    return out




if __name__ == "__main__":
    main()
