"""A training process of the non-root end-to-end test (nonroot_e2e.py), run as a non-root uid.

  nonroot_worker.py member     the Transformers hooks (strict: no fallback allowed) and a GaLore
                               projector refresh through the daemon at the default socket path
  nonroot_worker.py outsider   a Client and the hooks (not strict) for a user outside the
                               socket's group: the error, its time, the one warning
Prints one JSON object on its last line of stdout.
"""

import json
import os
import sys
import time
import warnings

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, ".."))
sys.path.insert(0, HERE)

import torch  # noqa: E402

torch.set_num_threads(1)

# A small random-init Qwen3: 2 layers, each layer input (1, 64, 64) fp32 = 16 KiB.
CONFIG = dict(vocab_size=128, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
              num_attention_heads=2, num_key_value_heads=1, head_dim=32)
BATCH, SEQ = 1, 64


def hooks_step(strict):
    """One step with Transformers' checkpoint offload through offloadd; (result, context)."""
    import offloadd.transformers as otf
    import qwen3_fixture as q
    model = q.make_model(seed=0, max_seq=SEQ, **CONFIG)
    ids = q.batch(CONFIG["vocab_size"], BATCH, SEQ)
    q.set_checkpointing(model, "ckpt")
    reference = q.step(model, ids)
    q.set_checkpointing(model, "offload")
    ctx = otf.enable(keep_last_n=0, threshold_bytes=4096, strict=strict)
    try:
        result = q.step(model, ids)
    finally:
        otf.disable()
    return q.bitwise_equal(result, reference), ctx


def galore_error():
    """Max |project_back(project(G))| difference from torch.linalg.svd's rank-8 projector."""
    from offloadd.galore import ServiceProjector
    g = torch.randn(96, 40, generator=torch.Generator().manual_seed(3))
    ours = ServiceProjector(8)
    back = ours.project_back(ours.project(g, 0))
    u, _, vh = torch.linalg.svd(g, full_matrices=False)
    p = vh[:8, :]  # m >= n: the right side, as the reference's "std"
    ref = (g @ p.t()) @ p
    ours.close()
    return float((back - ref).abs().max())


def member():
    import offloadd.torch as ot
    from offloadd.socket_path import default_socket_path
    out = {"socket": default_socket_path()}
    equal, ctx = hooks_step(strict=True)
    assert ot.synchronize(), "offloads or releases did not complete"
    stats = ctx.stats.as_dict()
    out.update(bitwise_equal=equal, offloaded=stats["offloaded"], reloaded=stats["reloaded"],
               fallbacks=ot.fallbacks_total())
    out["galore_max_error"] = galore_error()
    ep = list(ot._endpoint._endpoints.values())[0]
    out.update(shm_mode=ep.client.shm_mode, shm_gid=ep.client.shm_gid,
               daemon_uid=ep.client.daemon_uid)
    return out


def outsider():
    from offloadd import errors
    from offloadd.client import Client
    out = {}
    t0 = time.monotonic()
    try:
        Client(client_name="outsider")
        out["error"] = None
    except errors.OffloaddError as e:
        out.update(error=type(e).__name__, code=e.code_name, message=str(e))
    out["seconds"] = time.monotonic() - t0
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        t0 = time.monotonic()
        equal, ctx = hooks_step(strict=False)
        out["hooks_seconds"] = time.monotonic() - t0
    out["hooks_bitwise_equal"] = equal
    out["warnings"] = [str(w.message) for w in caught if "offloadd" in str(w.message)]
    return out


if __name__ == "__main__":
    result = member() if sys.argv[1] == "member" else outsider()
    print(json.dumps(result, default=str))
