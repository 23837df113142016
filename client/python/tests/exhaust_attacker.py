"""An attacker process for test_exhaust_training.py: pushes one bound of a daemon for --seconds
and prints "key value" counters. Modes:

  hello      open session streams that never send Hello, over several connections, and open new
             ones as the daemon ends them (hello_timeout_seconds) or refuses them
             (max_pending_hello_streams_*)
  sessions   open sessions (with Hello) until refused and hold them; retry the refused ones

    exhaust_attacker.py --mode MODE --socket PATH --seconds S [--uid U]

With --uid it drops to that uid (and gid) first; it exits 0 unless the daemon answered with a
status no bound explains.
"""
import argparse
import os
import queue
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ))

import grpc  # noqa: E402

from offloadd.v1 import offload_pb2 as pb  # noqa: E402
from offloadd.v1 import offload_pb2_grpc as pb_grpc  # noqa: E402

EXPECTED = {grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.RESOURCE_EXHAUSTED,
            grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED}


def stream(channel, hello, counters, lock, stop):
    out = queue.Queue()
    if hello:
        out.put(pb.ClientMessage(requests=[pb.Request(request_id=1, hello=pb.Hello(
            client_name="attacker", device_id="attack0", pid=os.getpid()))]))
    try:
        call = pb_grpc.OffloadStub(channel).Session(iter(out.get, None))
        for msg in call:
            for r in msg.responses:
                key = "hello_ok" if r.WhichOneof("body") == "hello" else \
                    "refused_%d" % r.error.code
                with lock:
                    counters[key] = counters.get(key, 0) + 1
                if r.WhichOneof("body") != "hello":
                    out.put(None)
            if stop.is_set():
                break
        code = grpc.StatusCode.OK
    except grpc.RpcError as e:
        code = e.code()
    with lock:
        counters[code.name] = counters.get(code.name, 0) + 1
        if code not in EXPECTED and code != grpc.StatusCode.OK:
            counters["unexpected"] = counters.get("unexpected", 0) + 1


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", required=True, choices=("hello", "sessions"))
    ap.add_argument("--socket", required=True)
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--uid", type=int)
    ap.add_argument("--connections", type=int, default=8)
    ap.add_argument("--streams", type=int, default=96)
    a = ap.parse_args()
    if a.uid is not None:
        os.setgroups([])
        os.setgid(a.uid)
        os.setuid(a.uid)
    counters, lock, stop = {}, threading.Lock(), threading.Event()
    channels = [grpc.insecure_channel("unix:" + a.socket, options=[
        ("grpc.use_local_subchannel_pool", 1)]) for _ in range(a.connections)]
    deadline = time.monotonic() + a.seconds
    threads = []
    while time.monotonic() < deadline:
        threads = [t for t in threads if t.is_alive()]
        while len(threads) < a.streams:
            t = threading.Thread(target=stream, daemon=True, args=(
                channels[len(threads) % len(channels)], a.mode == "sessions", counters, lock,
                stop))
            t.start()
            threads.append(t)
        time.sleep(0.2)
    stop.set()
    for c in channels:
        c.close()
    with lock:
        for k, v in sorted(counters.items()):
            print(k, v)
    return 1 if counters.get("unexpected") else 0


if __name__ == "__main__":
    sys.exit(main())
