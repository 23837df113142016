"""GaLore on CUDA through offloadd (tests/gpu/run.sh step 9c): the Trainer's optim="galore_adamw"
on a random-init Llama (galore_fixture.TINY, 30 steps) with CUDA gradients, stock galore-torch
against offloadd.galore.enable() on two daemons of backend cuda: projector backend lapack (the
default) and cusolver. Checks that the gradients went by CUDA IPC (no shm staging), that the
losses agree with stock to 1e-3 relative before the second refresh is used (GPU kernels are not
bitwise reproducible across runs), and that cuSOLVER and LAPACK give the same subspace for the
same gradient. Prints PASS/FAIL/SKIPPED and FIGURE lines.

  python3 galore_check.py --socket LAPACK_SOCK --cusolver-socket CUSOLVER_SOCK --fixture-dir DIR
"""

import argparse
import sys


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--cusolver-socket", required=True)
    ap.add_argument("--fixture-dir", required=True)
    args = ap.parse_args()
    sys.path.insert(0, args.fixture_dir)
    try:
        import torch
        import galore_torch  # noqa: F401
        import transformers  # noqa: F401
    except ImportError as e:
        print("SKIPPED: galore_check needs torch, transformers and galore-torch (%s)" % e)
        return 0
    if not torch.cuda.is_available():
        print("SKIPPED: no CUDA device for galore_check")
        return 0
    import galore_fixture as gf
    import offloadd.galore as og
    fails = 0
    stock, _ = gf.train("galore_adamw", 30, device="cuda")
    for name, sock in (("lapack", args.socket), ("cusolver", args.cusolver_socket)):
        routing = og.enable(socket_path=sock)
        losses, _ = gf.train("galore_adamw", 30, device="cuda")
        og.disable()
        rel = max(gf.relative(a.item(), b.item()) for a, b in zip(losses[:6], stock[:6]))
        cuda_path = all(p._staging.cuda_buf is not None and p._staging.region is None
                        for p in routing.projectors())
        stats = routing.connection.stats()
        print("FIGURE galore_%s max_rel_loss_diff_steps_1_6 %.2e final_loss %.5f stock %.5f "
              "backend %s computed %d" % (name, rel, losses[-1].item(), stock[-1].item(),
                                          stats.backend, stats.computed_total))
        ok = rel <= 1e-3 and cuda_path and stats.cuda_regions
        if name == "cusolver":
            ok = ok and stats.backend == "lapack+cusolver"
        print("%s: galore_adamw on CUDA, projector backend %s (CUDA IPC path: %s)" %
              ("PASS" if ok else "FAIL", name, cuda_path))
        fails += not ok
    g = torch.randn(1376, 512, device="cuda") @ torch.randn(512, 512, device="cuda")
    cols = []
    for sock in (args.socket, args.cusolver_socket):
        p = og.ServiceProjector(64, parameter_id="check", connection=og.ProjectorConnection(sock))
        p.project(g, 0)
        cols.append(p.ortho_matrix.t().double())  # right side: 512 x 64
    a, b = cols
    sine = torch.linalg.matrix_norm(b - a @ (a.t() @ b), ord=2).item()
    print("FIGURE galore_cusolver_vs_lapack_subspace_sine %.2e" % sine)
    print("%s: cuSOLVER and LAPACK projectors of one gradient span the same subspace" %
          ("PASS" if sine < 1e-2 else "FAIL"))
    fails += sine >= 1e-2
    return 1 if fails else 0


if __name__ == "__main__":
    sys.exit(main())
