#!/usr/bin/env python3
"""Start-to-serving time of a daemon adopting a shared pool, against a cold start.

    .venv/bin/python bench/restart_bench.py [--bin bazel-bin/server/offloadd] [--pool_gib 1]
        [--blocks 8192] [--fill 0.9] [--pool_data_checksums]

One run: start offloadd on a new shared pool (pool_shm_name) and time exec -> its "ready" line
(cold start); fill the pool to --fill with --blocks equal blocks through the Python client;
SIGKILL the daemon; start it again on the same pool and time exec -> "ready" (adoption of every
block's record, allocator rebuilt, included). Prints both, their ratio, and the adopted count
from the daemon's log. A second client (auto-resume on) holding one block issues a reload right
after the SIGKILL: the time from the kill to that reload's answer is how long a client waits
across the restart (the new daemon is started at once). The pool object is removed at the end.
--pool_data_checksums runs both daemons with pool_data_checksums: the fill then pays a CRC32C
per offloaded block (the fill's offload rate is printed in either mode: compare two runs) and
the adoption checks every block's data (the daemon's "checked the data" line is printed).
"""

import argparse
import os
import signal
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "client", "python"))

from offloadd.client import Client  # noqa: E402
from offloadd.shm import ShmRegion  # noqa: E402


def start(args, log):
    t0 = time.monotonic()
    p = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=log, text=True)
    line = p.stdout.readline()
    elapsed = time.monotonic() - t0
    if "ready" not in line:
        raise SystemExit("daemon did not start: %r (log %s)" % (line, log.name))
    return p, elapsed


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", default=os.path.join(ROOT, "bazel-bin", "server", "offloadd"))
    ap.add_argument("--pool_gib", type=float, default=1)
    ap.add_argument("--blocks", type=int, default=8192)
    ap.add_argument("--fill", type=float, default=0.9)
    ap.add_argument("--pool_data_checksums", action="store_true")
    a = ap.parse_args()
    pool_bytes = int(a.pool_gib * (1 << 30))
    block_bytes = int(pool_bytes * a.fill / a.blocks) // 4096 * 4096
    name = "offloadd-restart-bench-%d" % os.getpid()
    tmp = tempfile.mkdtemp(prefix="ofd-rb-", dir="/tmp")
    sock = os.path.join(tmp, "d.sock")
    args = [a.bin, "--socket_path=" + sock, "--pool_bytes=%d" % pool_bytes,
            "--metrics_address=", "--pool_shm_name=" + name, "--resume_grace_seconds=600",
            "--pool_data_checksums=%s" % ("true" if a.pool_data_checksums else "false")]
    log = open(os.path.join(tmp, "daemon.log"), "w+")
    daemon = None
    try:
        daemon, cold = start(args, log)
        client = Client(sock, "restart-bench", "cpu", reconnect=False)
        src = ShmRegion(block_bytes)
        src.mm[:] = os.urandom(block_bytes)
        rid = client.register_shm(src.name, src.size_bytes)
        futures = []
        t_fill = time.monotonic()
        for _ in range(a.blocks):
            futures.append(client.offload(rid, 0, block_bytes))
            if len(futures) >= 256:
                for f in futures:
                    f.result(60)
                futures = []
        for f in futures:
            f.result(60)
        fill = time.monotonic() - t_fill
        waiter = Client(sock, "restart-bench-waiter", "cpu")
        dst = ShmRegion(block_bytes)
        wsrc = waiter.register_shm(src.name, src.size_bytes, relink=src.relink)
        wdst = waiter.register_shm(dst.name, dst.size_bytes, relink=dst.relink)
        held = waiter.offload(wsrc, 0, block_bytes).result(60).block_id
        stored = client.get_stats().pool_used_bytes
        daemon.kill()
        t_kill = time.monotonic()
        daemon.wait()
        waiting = waiter.reload(held, wdst, 0)
        client.close(timeout=0.5)
        log.seek(0, os.SEEK_END)
        mark = log.tell()
        daemon, adopt = start(args, log)
        waiting.result(120)
        waited = time.monotonic() - t_kill
        assert bytes(dst.mm[:block_bytes]) == bytes(src.mm[:block_bytes])
        waiter.close()
        log.flush()
        log.seek(mark)
        adopted = [line.strip() for line in log if "adopted" in line]
        log.seek(mark)
        checked = [line.strip() for line in log if "checked the data" in line]
    finally:
        if daemon is not None and daemon.poll() is None:
            daemon.send_signal(signal.SIGTERM)
            daemon.wait(60)
        try:
            os.unlink("/dev/shm/" + name)
        except OSError:
            pass
    print("pool                      %.1f GiB, %d blocks of %d bytes (%.0f %% full, %d bytes)"
          % (a.pool_gib, a.blocks, block_bytes, 100.0 * stored / pool_bytes, stored))
    print("pool_data_checksums       %s" % ("on" if a.pool_data_checksums else "off"))
    print("fill: offloads            %.3f s, %.2f GB/s" % (fill, a.blocks * block_bytes / fill / 1e9))
    print("cold start to serving     %.3f s" % cold)
    print("adopting start to serving %.3f s" % adopt)
    print("ratio adopting / cold     %.2f" % (adopt / cold))
    print("client wait, kill -> reload answered  %.3f s (resumed, bytes checked)" % waited)
    for line in adopted[-1:] + checked[-1:]:
        print("daemon log: " + line[-160:])


if __name__ == "__main__":
    main()
