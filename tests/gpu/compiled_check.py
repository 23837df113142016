"""Compiled graphs and CUDA graphs on a GPU: what torch's own compiled offload pass and CUDA graph
capture do, next to offloadd's saved-tensor hooks. Reports; asserts only what must hold.

Run by tests/gpu/run.sh: ``python3 compiled_check.py --socket PATH --python-root DIR``. Prints
"SKIPPED: ..." and exits 0 without CUDA (``--device cpu`` runs the parts that run on CPU, as the
CPU test of this script does); "PASS ..." / "FAIL: ..." / "NOTE ..." lines, figures as
"FIGURE <name> <value> <unit>". Exit 1 when a PASS condition fails.

1. ao_pass_sync / ao_pass_async: torch's compiled activation offload
   (torch._functorch._activation_offloading, torch >= 2.10) on a two-matmul MLP under
   aot_function. The pass runs when ``torch._functorch.config.enable_activation_offloading`` is
   True, and offloads the forward outputs whose node carries ``meta["should_offload"]``; nothing
   in torch sets that mark, so a ``joint_custom_pass`` marks the relu output here. "sync"
   inserts prims.device_put to CPU and back; "async"
   (``activation_offload_separate_stream``) inserts ao::offload / ao::reload / ao::wait_tensor
   on a transfer stream. For each: the ops found in the forward and backward graphs, and whether
   the gradients equal the uncompiled function's (PASS when they do).
2. compiled_backend: offloadd.torch.compiled.backend (offloadd's ops in place of the pass's
   device_put nodes) on the same MLP under torch.compile, through the daemon: PASS when the
   gradients equal the uncompiled function's and every offload the backend inserted was
   packed (offloaded, or kept in process as a fallback without a daemon); the counts as
   figures.
3. cuda_graph_plain / cuda_graph_offloadd: torch.cuda.graph capture of forward + backward of a
   checkpointed block (torch.utils.checkpoint, non-reentrant), without offload (PASS when the
   replayed gradients equal eager ones) and inside offloadd.torch.offload_checkpoints (its pack
   hook runs Python and talks to the daemon during capture: what happens is reported, NOTE, and
   the process is checked to still launch kernels afterwards).
"""

import argparse
import os
import sys
import traceback


def say(line):
    print(line, flush=True)


def mlp(torch):
    def f(x, w1, w2):
        return (torch.relu(x @ w1) @ w2).sum()
    return f


def ao_pass(torch, device, separate_stream):
    """Runs torch's offload pass on the MLP; returns (ops in the graphs, grads equal)."""
    import torch._functorch.config as fc
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_function

    def mark(gm, inputs):
        for n in gm.graph.nodes:
            if n.op == "call_function" and n.target == torch.ops.aten.relu.default:
                n.meta["should_offload"] = True
        return gm
    graphs = []

    def keep(gm, _):
        graphs.append(gm)
        return make_boxed_func(gm.forward)
    f = mlp(torch)
    g = torch.Generator(device="cpu").manual_seed(0)
    x = torch.randn(256, 256, generator=g).to(device)
    w = [torch.randn(256, 256, generator=g).to(device).requires_grad_() for _ in range(2)]
    saved = (fc.joint_custom_pass, fc.enable_activation_offloading,
             fc.activation_offload_separate_stream)
    fc.joint_custom_pass, fc.enable_activation_offloading = mark, True
    fc.activation_offload_separate_stream = separate_stream
    try:
        aot_function(f, fw_compiler=keep, bw_compiler=keep)(x, *w).backward()
    finally:
        (fc.joint_custom_pass, fc.enable_activation_offloading,
         fc.activation_offload_separate_stream) = saved
    compiled = [p.grad.clone() for p in w]
    for p in w:
        p.grad = None
    f(x, *w).backward()
    ops = sorted({str(n.target) for gm in graphs for n in gm.graph.nodes
                  if "device_put" in str(n.target) or str(n.target).startswith("ao.")})
    return ops, all(torch.equal(a, p.grad) for a, p in zip(compiled, w))


def check_ao(torch, device):
    ok = True
    for name, separate in (("ao_pass_sync", False), ("ao_pass_async", True)):
        try:
            ops, equal = ao_pass(torch, device, separate)
        except Exception as e:  # noqa: BLE001 -- reported, as torch raises it
            say("NOTE %s on %s: %s: %s" % (name, device, type(e).__name__, str(e)[:300]))
            continue
        say("NOTE %s on %s: graph ops %s" % (name, device, ", ".join(ops) or "none"))
        say("FIGURE %s_offload_ops %d ops" % (name, len(ops)))
        if equal and ops:
            say("PASS %s: gradients equal the uncompiled function's" % name)
        else:
            say("FAIL: %s: %s" % (name, "gradients differ" if ops else "no offload op inserted"))
            ok = False
    return ok


def check_backend(torch, device, sock):
    import offloadd.torch as ot
    import offloadd.torch.compiled as oc
    f = mlp(torch)
    g = torch.Generator(device="cpu").manual_seed(2)
    x = torch.randn(512, 512, generator=g).to(device)
    w = [torch.randn(512, 512, generator=g).to(device).requires_grad_() for _ in range(2)]
    ctx = ot.offload_checkpoints(threshold_bytes=1 << 20, keep_last_n=0,
                                 socket_path=sock or None, connect_timeout_seconds=2.0,
                                 unresponsive_seconds=5.0)
    be = oc.backend(threshold_bytes=1 << 20, context=ctx)
    torch.compile(f, backend=be)(x, *w).backward()
    compiled = [p.grad.clone() for p in w]
    for p in w:
        p.grad = None
    f(x, *w).backward()
    equal = all(torch.equal(a, p.grad) for a, p in zip(compiled, w))
    ot.synchronize()
    s = ctx.stats.snapshot()
    inserted = sum(n for n, _ in be.graphs)
    say("FIGURE compiled_backend_offloads %d inserted %d offloaded %d reloaded %d fallbacks"
        % (inserted, s.offloaded, s.reloaded, s.fallbacks))
    ok = equal and inserted >= 1 and s.offloaded + s.fallbacks == inserted
    say("PASS compiled_backend: %d offload(s) inserted, gradients equal the uncompiled "
        "function's" % inserted if ok else
        "FAIL: compiled_backend: gradients %s, %d inserted, %d offloaded, %d fallbacks"
        % ("equal" if equal else "differ", inserted, s.offloaded, s.fallbacks))
    return ok


def block(torch, device):
    from torch.utils.checkpoint import checkpoint
    g = torch.Generator(device="cpu").manual_seed(1)
    lin = torch.nn.Sequential(torch.nn.Linear(512, 2048), torch.nn.GELU(),
                              torch.nn.Linear(2048, 512)).to(device)
    x = torch.randn(64, 512, generator=g).to(device).requires_grad_()

    def step():
        y = checkpoint(lin, x, use_reentrant=False)
        y.square().sum().backward()
    return lin, x, step


def capture(torch, step, params):
    """Warm-up on a side stream, capture one step, replay it; returns the replayed grads."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            for p in params:
                p.grad = None
            step()
    torch.cuda.current_stream().wait_stream(s)
    for p in params:
        p.grad = None
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    graph.replay()
    torch.cuda.synchronize()
    return [p.grad.clone() for p in params]


def check_cuda_graphs(torch, sock):
    lin, x, step = block(torch, "cuda")
    params = list(lin.parameters())
    for p in params:
        p.grad = None
    step()
    eager = [p.grad.clone() for p in params]
    ok = True
    try:
        got = capture(torch, step, params)
        same = all(torch.allclose(a, b, rtol=1e-5, atol=1e-6) for a, b in zip(got, eager))
        say(("PASS cuda_graph_plain: a checkpointed block captures and replays, gradients "
             "match eager") if same else "FAIL: cuda_graph_plain: replayed gradients differ")
        ok = same
    except Exception as e:  # noqa: BLE001
        say("FAIL: cuda_graph_plain: %s: %s" % (type(e).__name__, str(e)[:300]))
        ok = False
    import offloadd.torch as ot
    from torch.utils.checkpoint import checkpoint
    ctx = ot.offload_checkpoints(threshold_bytes=0, keep_last_n=0, socket_path=sock or None,
                                 connect_timeout_seconds=2.0, unresponsive_seconds=3.0)

    def offloaded_step():
        with ctx:
            y = checkpoint(lin, x, use_reentrant=False)
        y.square().sum().backward()
    try:
        capture(torch, offloaded_step, params)
        say("NOTE cuda_graph_offloadd: capture succeeded (stats: %s)" % ctx.stats.summary())
    except Exception as e:  # noqa: BLE001 -- expected: hooks cannot run inside a capture
        say("NOTE cuda_graph_offloadd: capture with offloadd's hooks raised %s: %s"
            % (type(e).__name__, str(e)[:300]))
    say("NOTE cuda_graph_offloadd: context stats %s" % ctx.stats.as_dict())
    try:  # the process must still launch kernels after a failed capture
        torch.cuda.synchronize()
        z = torch.ones(4, device="cuda") * 2
        alive = float(z.sum().item()) == 8.0
    except Exception as e:  # noqa: BLE001
        say("FAIL: kernels fail after the capture attempt: %s: %s" % (type(e).__name__, e))
        return False
    say("PASS cuda_graph_offloadd: kernels launch after the capture attempt" if alive else
        "FAIL: a kernel after the capture attempt returned a wrong sum")
    return ok and alive


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", default=os.environ.get("OFFLOADD_SOCKET", ""))
    ap.add_argument("--python-root", default="")
    ap.add_argument("--device", default="cuda", choices=("cuda", "cpu"))
    a = ap.parse_args()
    if a.python_root:
        sys.path.insert(0, a.python_root)
    import torch
    say("torch %s" % torch.__version__)
    if a.device == "cuda" and not torch.cuda.is_available():
        say("SKIPPED: torch.cuda.is_available() is False: no compiled-offload or CUDA graph "
            "check without a GPU")
        return 0
    ok = True
    try:
        ok = check_ao(torch, a.device) and ok
        ok = check_backend(torch, a.device, a.socket) and ok
        if a.device == "cuda":
            ok = check_cuda_graphs(torch, a.socket) and ok
        else:
            say("NOTE cuda_graph: not run on cpu (CUDA graphs need CUDA)")
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        say("FAIL: compiled_check raised (traceback above)")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
