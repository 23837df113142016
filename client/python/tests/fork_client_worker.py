"""For test_fork_client: a process forked after it opened an offloadd session.

Usage: fork_client_worker.py SOCKET. Prints one JSON line:
  * "client": a direct Client (ShmTransport) offloads a tensor, the process forks, and the child
    tries to release the parent's block, offload, pump and drain on the inherited Client; each
    must raise OffloaddError FAILED_PRECONDITION ("child_codes"). The parent then reloads its
    block: "parent_exact" is true when the bytes are the ones it offloaded.
  * "hooks": forward runs under an offload context, the process forks, and the child runs
    backward of the inherited graph: "child_code" is the OffloaddError's code; the child then runs
    a forward and backward of its own under the same context ("child_own_exact": its gradient
    equals the reference). Another child runs its own forward and backward first, while the
    parent's step is open ("own_first_exact", "own_first_offloaded"), then backward of the
    inherited graph ("own_first_inherited_code"). The parent's own backward then gives the
    reference ("parent_exact").
Each child has 60 s (SIGALRM).
"""

import json
import os
import signal
import sys

import torch

import offloadd.torch as ot
from offloadd import errors
from offloadd.client import URGENT, Client
from offloadd.torch._transport import Meta, ShmTransport

torch.set_num_threads(1)  # torch's thread pool does not survive fork


def in_child(fn):
    """Runs fn() in a forked child; its JSON-able result (None when it died)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        signal.alarm(60)
        try:
            out = json.dumps(fn()).encode()
        except BaseException as e:  # noqa: BLE001 -- reported to the parent
            out = json.dumps({"error": repr(e)}).encode()
        os.write(w, out)
        os._exit(0)
    os.close(w)
    chunks = []
    while True:
        b = os.read(r, 65536)
        if not b:
            break
        chunks.append(b)
    os.waitpid(pid, 0)
    return json.loads(b"".join(chunks) or b"null")


def code_of(fn):
    try:
        fn()
    except errors.OffloaddError as e:
        return errors.CODE_NAMES.get(e.code, e.code)
    except Exception as e:  # noqa: BLE001 -- reported as the wrong kind of error
        return repr(e)
    return "no error"


def client_case(sock):
    client = Client(sock, connect_timeout_seconds=10)
    transport = ShmTransport(client)
    t = torch.arange(4096, dtype=torch.float32)
    meta = Meta(t)
    op = transport.start_offload(t, meta)
    block_id = client.wait(op.future).block_id
    transport.finish_offload(op)
    slot = op.slot

    def child():
        return {"child_codes": [
            code_of(lambda: client.release(block_id)),
            code_of(lambda: client.offload(1, 0, 64)),
            code_of(lambda: client.reload(block_id, 1, 0)),
            code_of(lambda: client.drain(1.0)),
        ]}

    out = in_child(child)
    del slot
    rl = transport.prepare_reload(meta)
    transport.send_reload(rl, block_id, URGENT, release_after=True)
    back = transport.finish_reload(rl, meta)
    out["parent_exact"] = bool(torch.equal(back, t))
    client.close()
    return out


def forward(x, w):
    for _ in range(4):
        x = torch.tanh(x @ w)
    return x.sum()


def hooks_case(sock):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(128, 128, generator=g) / 8
    w = (torch.randn(128, 128, generator=g) / 8).requires_grad_()
    reference = torch.autograd.grad(forward(x, w), w)[0]
    ctx = ot.offload_checkpoints(threshold_bytes=1 << 14, keep_last_n=0, prefetch=2,
                                 socket_path=sock)
    with ctx:
        loss = forward(x, w)
    ot.synchronize()  # the offloads are done: backward reloads from the daemon

    def child():
        out = {"child_code": code_of(lambda: torch.autograd.grad(loss, w))}
        with ctx:
            own = forward(x, w)
        out["child_own_exact"] = bool(torch.equal(torch.autograd.grad(own, w)[0], reference))
        out["child_offloaded"] = ctx.stats.offloaded
        return out

    def child_own_first():
        # The parent's step is still open (no unpack since its forward): the child's forward
        # saves the same input tensor x, which must get a handle of the child's own.
        before = ctx.stats.offloaded
        with ctx:
            own = forward(x, w)
        return {"own_first_exact": bool(torch.equal(torch.autograd.grad(own, w)[0],
                                                    reference)),
                "own_first_offloaded": ctx.stats.offloaded - before,
                "own_first_inherited_code": code_of(lambda: torch.autograd.grad(loss, w))}

    out = in_child(child_own_first)
    out.update(in_child(child))
    offloaded = ctx.stats.offloaded
    out["parent_exact"] = bool(torch.equal(torch.autograd.grad(loss, w)[0], reference))
    out["parent_offloaded"] = offloaded
    out["parent_reloaded"] = ctx.stats.reloaded
    return out


if __name__ == "__main__":
    print(json.dumps({"client": client_case(sys.argv[1]), "hooks": hooks_case(sys.argv[1])}))
