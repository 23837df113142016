"""One process of the multi-process offloadd.galore tests (test_galore_ranks.py).

  galore_worker.py ddp RANK WORLD PORT SOCKETS OUT   a gloo rank: GaLoreAdamW on DDP(TINY Llama),
      30 steps synchronous then 30 asynchronous, offloadd.galore.enable() on the socket
      SOCKETS.split(",")[RANK * len // WORLD] (one daemon per "node"); then the version check
      with this rank's galore-torch faked as 0.9 on rank 1. Writes OUT/rank<R>.json and
      OUT/rank<R>-<phase>.pt (the parameters).
  galore_worker.py same-key INDEX SOCKET OUT          a process of its own, no torch.distributed:
      ServiceProjectors named w0..w2 (no job id, so every process shares the keys) over steps
      0..3 with gradients of its own; checks each projector against torch.linalg.svd's subspace.
"""

import json
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [HERE, os.path.join(HERE, "..")]

import torch  # noqa: E402

torch.set_num_threads(1)
STEPS = 30


def phase(name, rank, world, sock, out, asynchronous):
    import galore_torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    import galore_fixture as gf
    import offloadd.galore as og
    model = gf.make_model(seed=0)
    routing = og.enable(socket_path=sock, asynchronous=asynchronous, model=model)
    ddp = DDP(model)
    opt = galore_torch.GaLoreAdamW(gf.galore_groups(model), lr=1e-2, no_deprecation_warning=True)
    data = gf.dataset(STEPS * world, seed=11)
    conn = og.ProjectorConnection(sock)
    dist.barrier()
    before = conn.stats()
    losses = []
    for step in range(STEPS):
        batch = data[step * world + rank]["input_ids"][None]  # each rank its own batch
        opt.zero_grad()
        loss = ddp(input_ids=batch, labels=batch).loss
        loss.backward()
        opt.step()
        losses.append(loss.item())
    for p in routing.projectors():
        p.wait()
    dist.barrier()
    after = conn.stats()
    conn.close()
    torch.save([p.detach().clone() for p in model.parameters()],
               os.path.join(out, "rank%d-%s.pt" % (rank, name)))
    result = {"losses": losses, "stats": routing.stats.as_dict(), "job_id": routing.job_id,
              "adopted": {p.parameter_id: p.adopted_steps for p in routing.projectors()},
              "computed": after.computed_total - before.computed_total,
              "deduplicated": after.deduplicated_total - before.deduplicated_total,
              "mismatched": after.content_mismatches_total - before.content_mismatches_total,
              "broadcasting": routing.sharing.broadcasting}
    og.disable()
    return result


def version_check(rank, sock):
    from offloadd.galore import _optim as _galore_optim
    import offloadd.galore as og
    routing = og.enable(socket_path=sock)
    if rank == 1:
        _galore_optim.installed_galore_version = lambda: "0.9"
    try:
        routing._setup_job()
        return "no error"
    except RuntimeError as e:
        return str(e)
    finally:
        og.disable()


def ddp(rank, world, port, sockets, out):
    import torch.distributed as dist
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    sockets = sockets.split(",")
    sock = sockets[rank * len(sockets) // world]
    result = {"sync": phase("sync", rank, world, sock, out, False),
              "async": phase("async", rank, world, sock, out, True),
              "version": version_check(rank, sock)}
    with open(os.path.join(out, "rank%d.json" % rank), "w") as f:
        json.dump(result, f)
    dist.barrier()
    dist.destroy_process_group()


def same_key(index, sock, out):
    import offloadd.galore as og
    conn = og.ProjectorConnection(sock, timeout_seconds=120)
    checks = []
    projectors = [og.ServiceProjector(4, update_proj_gap=1, parameter_id="w%d" % k,
                                      connection=conn) for k in range(3)]
    for step in range(4):
        for k, proj in enumerate(projectors):
            gen = torch.Generator().manual_seed(1000 * index + 10 * k + step)
            u, _ = torch.linalg.qr(torch.randn(48, 6, generator=gen))
            v, _ = torch.linalg.qr(torch.randn(32, 6, generator=gen))
            g = (u * torch.tensor([10.0, 7, 5, 3, 1, 0.5])) @ v.t()
            proj.project(g, step)
            p = proj.ortho_matrix.t().double()  # right side (48 >= 32): Vh[:r].T, 32 x 4
            ref = torch.linalg.svd(g.double(), full_matrices=False)[2][:4].t()
            sine = torch.linalg.matrix_norm(p - ref @ (ref.t() @ p), ord=2).item()
            checks.append({"param": k, "step": step, "sine": sine,
                           "zero": bool(p.abs().max().item() == 0),
                           "deduplicated": proj.last_result.deduplicated,
                           "mismatch": proj.last_result.content_mismatch})
    for proj in projectors:
        proj.close()
    conn.close()
    with open(os.path.join(out, "same-key-%d.json" % index), "w") as f:
        json.dump(checks, f)


if __name__ == "__main__":
    if sys.argv[1] == "ddp":
        ddp(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5], sys.argv[6])
    else:
        same_key(int(sys.argv[2]), sys.argv[3], sys.argv[4])
