"""For test_robustness: training in a process forked from one with an open offloadd endpoint.

Usage: fork_worker.py SOCKET. The parent offloads one step (so its endpoint and the reaper thread
exist), then forks twice:
  1. os.fork(): the child trains a step of its own with offload, checks that its blocks are
     released while it still runs (its own reaper thread), and exits through sys.exit (atexit
     runs close_all, which must not touch the parent's inherited channel);
  2. a multiprocessing "fork" child does the same.
Prints one JSON line {"fork_exit_code", "fork_released", "mp_exit_code", "mp_released",
"parent_ok"}; each child has 60 s.
"""

import json
import multiprocessing
import os
import sys
import time

import torch

import daemon_fixture as d
import offloadd.torch as ot


def train_and_check(sock):
    """One offloaded step in this process; True when the daemon holds none of its blocks after
    synchronize (i.e. every release was sent)."""
    torch.set_num_threads(1)
    ctx = ot.offload_checkpoints(socket_path=sock, threshold_bytes=d.THRESHOLD, keep_last_n=0)
    d.run_step("offloadd", ctx)
    ok = ot.synchronize(timeout=20)
    for ep in ot._endpoint.endpoints():
        if ep.client.get_stats().sessions:
            mine = [s for s in ep.client.get_stats().sessions if s.pid == os.getpid()]
            ok = ok and all(s.blocks == 0 for s in mine)
    return ok and ctx.stats.offloaded == d.L


def mp_child(sock, q):
    q.put(train_and_check(sock))


def wait_child(pid, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.05)
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    return "hung"


def main():
    sock = sys.argv[1]
    torch.set_num_threads(1)
    out = {"parent_ok": train_and_check(sock)}
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        os.write(w, b"1" if train_and_check(sock) else b"0")
        sys.exit(0)   # atexit handlers run here
    os.close(w)
    out["fork_exit_code"] = wait_child(pid)
    out["fork_released"] = os.read(r, 1) == b"1"
    ctx = multiprocessing.get_context("fork")
    q = ctx.Queue()
    p = ctx.Process(target=mp_child, args=(sock, q))
    p.start()
    try:
        out["mp_released"] = q.get(timeout=60)
    except Exception:
        out["mp_released"] = False
    p.join(30)
    out["mp_exit_code"] = p.exitcode if p.exitcode is not None else "hung"
    if p.is_alive():
        p.kill()
    out["parent_ok"] = out["parent_ok"] and train_and_check(sock)
    print(json.dumps(out), flush=True)


if __name__ == "__main__":
    main()
