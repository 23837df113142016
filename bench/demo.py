#!/usr/bin/env python3
"""`make demo`: offloadd with N simulated GPUs running an activation-checkpoint schedule.

Starts the daemon on its embedded defaults plus a config of the demo's links, written to a
temporary folder that is removed after a passing run (shm backend, private socket, metrics off;
simulated GPUs share links --gpus-per-link at a time, paced at --link-gbps per direction),
runs N `checkpoint_workload` processes at once (each "a GPU": L layers, one checkpoint of
b*s*h*2 bytes per layer offloaded in forward, reloaded in reverse with prefetch in backward,
every byte checked), then prints a table per client and in total, the daemon's pool peak, per
link and direction its rate, utilisation of the capacity, busy share and Jain's fairness index
over its GPUs' bytes during the run (GetStats), and stops the daemon with SIGTERM. Exit status
0 only if every client finished with 0 errors and 0 corrupted reloads and the daemon exited 0.
"""
import argparse
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time


def parse_bytes(text):
    m = re.fullmatch(r"\s*([\d.]+)\s*(KiB|MiB|GiB|KB|MB|GB|B)?\s*", text)
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text}")
    mult = {"KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "KB": 1e3, "MB": 1e6, "GB": 1e9,
            "B": 1, None: 1}[m.group(2)]
    return int(float(m.group(1)) * mult)


def daemon_stats(bin_dir, sock):
    return json.loads(subprocess.run(
        [os.path.join(bin_dir, "offloadctl"), "--socket", sock, "stats", "--json"],
        check=True, capture_output=True, text=True).stdout)


def jain(xs):
    """Jain's fairness index: 1 when all equal, 1/n when one takes everything."""
    xs = [float(x) for x in xs]
    s2 = sum(x * x for x in xs)
    return sum(xs) ** 2 / (len(xs) * s2) if s2 > 0 else 1.0


def print_links(before, after):
    """Per link and direction over the run: GB/s, utilisation of the capacity (paced links),
    busy share (time with a chunk in flight) and Jain's index over the GPUs' bytes."""
    dt = after["uptime_seconds"] - before["uptime_seconds"]
    if dt <= 0:
        return
    old = {l["name"]: l for l in before.get("links", [])}
    print(f"{'link':<8} {'dir':<4} {'GB/s':>7} {'capacity':>9} {'util':>6} {'busy':>6} "
          f"{'Jain':>7}  per-GPU MiB")
    for l in after.get("links", []):
        o = old.get(l["name"], {})
        prev = {g["gpu"]: g for g in o.get("gpu_bytes", [])}
        for d in ("d2h", "h2d"):
            moved = int(l[f"{d}_bytes"]) - int(o.get(f"{d}_bytes", 0))
            busy = l[f"{d}_busy_seconds"] - o.get(f"{d}_busy_seconds", 0.0)
            cap = l[f"{d}_capacity_bytes_per_second"]
            per_gpu = {g["gpu"]: int(g[f"{d}_bytes"])
                       - int(prev.get(g["gpu"], {}).get(f"{d}_bytes", 0))
                       for g in l.get("gpu_bytes", [])}
            util = f"{moved / (cap * dt):6.3f}" if cap > 0 else f"{'-':>6}"
            capacity = f"{cap / 1e9:.2f} GB/s" if cap > 0 else "unpaced"
            gpus = "  ".join(f"{g} {b / 2**20:.0f}" for g, b in per_gpu.items())
            print(f"{l['name']:<8} {d:<4} {moved / dt / 1e9:>7.3f} {capacity:>9} {util} "
                  f"{busy / dt:>6.3f} {jain(per_gpu.values()):>7.4f}  {gpus}")


def print_plan_check(stats, a, layer_bytes):
    """Copy time of one checkpoint per link: what the daemon measured (from the link's busy time)
    next to what the capacity planner predicts for the same configuration (offloadd.plan: the
    link's rate divided among the GPUs sharing it; shared/reference "the bandwidth arithmetic")."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                    "python"))
    try:
        from offloadd import plan as planner
    except ImportError as e:  # the package is optional for the demo itself
        print(f"(planner check skipped: {e})")
        return
    predicted_ms = None
    if a.link_gbps > 0:
        model = planner.ModelShape(layers=a.layers, hidden=a.hidden, attention_width=a.hidden,
                                   params_per_layer=12 * a.hidden * a.hidden)
        gpl = max(1, min(a.gpus_per_link, a.clients))
        p = planner.plan(model, seq=a.seq, batch=a.batch, dtype="bf16",
                         gpus_per_node=max(a.clients, gpl), gpus_per_link=gpl,
                         link=a.link_gbps)
        # The planner sizes a checkpoint as b*s*h*2; scale if --layer-bytes overrides it.
        predicted_ms = p.copy_seconds_per_layer * layer_bytes / p.checkpoint_bytes_per_layer * 1e3
    print(f"copy time per checkpoint ({layer_bytes / 2**20:.1f} MiB), all GPUs of a link copying:")
    for l in stats.get("links", []):
        measured = l.get("measured_offload_copy_seconds", 0.0) * 1e3
        planned = l.get("planned_offload_copy_seconds", 0.0) * 1e3
        if measured <= 0:
            continue
        extra = f", planner {predicted_ms:.2f} ms" if predicted_ms is not None else ""
        print(f"  {l['name']:<8} measured {measured:8.2f} ms, daemon's plan {planned:8.2f} ms"
              f"{extra}" if planned > 0 else
              f"  {l['name']:<8} measured {measured:8.2f} ms (unpaced link: no plan; "
              f"use --link-gbps)")


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--bin", default="build/bin", help="folder with offloadd, offloadctl, checkpoint_workload")
    p.add_argument("--clients", type=int, default=4, help="simulated GPUs (processes)")
    p.add_argument("--layers", type=int, default=16, help="layers L (one checkpoint each)")
    p.add_argument("--batch", type=int, default=1, help="micro-batch b")
    p.add_argument("--seq", type=int, default=4096, help="sequence length s")
    p.add_argument("--hidden", type=int, default=1024, help="hidden size h")
    p.add_argument("--layer-bytes", type=parse_bytes, default=None,
                   help="override b*s*h*2 (checkpoint bytes per layer)")
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--forward-ms", type=float, default=2.0, help="simulated forward per layer")
    p.add_argument("--pool-bytes", type=parse_bytes, default=None, help="default: the config's 1 GiB")
    p.add_argument("--link-gbps", type=float, default=0.0,
                   help="simulated link rate per direction in GB/s (0 = unpaced memcpy)")
    p.add_argument("--gpus-per-link", type=int, default=2,
                   help="simulated GPUs sharing one link (a PCIe switch); 1 = a link each")
    p.add_argument("--quiet", action="store_true", help="only the summary")
    a = p.parse_args()
    layer_bytes = a.layer_bytes or a.batch * a.seq * a.hidden * 2

    tmp = tempfile.mkdtemp(prefix="offloadd-demo-", dir="/tmp")
    sock = os.path.join(tmp, "d.sock")
    cmd = [os.path.join(a.bin, "offloadd"), "--socket_path", sock, "--metrics_address="]
    if a.pool_bytes:
        cmd += ["--pool_bytes", str(a.pool_bytes)]
    if a.link_gbps > 0:
        cmd += ["--default_link_bytes_per_second", str(int(a.link_gbps * 1e9))]
    if a.gpus_per_link > 1:
        # Links of gpus_per_link GPUs each, at the simulated rate (0 = unpaced).
        rate = a.link_gbps * 1e9
        conf = os.path.join(tmp, "offloadd.conf")
        with open(conf, "w") as f:
            for k in range(0, a.clients, a.gpus_per_link):
                gpus = " ".join(f'gpus: "gpu{i}"'
                                for i in range(k, min(k + a.gpus_per_link, a.clients)))
                f.write(f'links {{ name: "link{k // a.gpus_per_link}" {gpus} '
                        f"d2h_bytes_per_second: {rate} h2d_bytes_per_second: {rate} }}\n")
        cmd += ["--config", conf]
    daemon_log = open(os.path.join(tmp, "offloadd.log"), "w+")
    daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=daemon_log, text=True)
    line = daemon.stdout.readline()
    if "ready" not in line:
        daemon.wait(timeout=10)
        daemon_log.seek(0)
        sys.stderr.write(daemon_log.read())
        print("demo: the daemon did not start", file=sys.stderr)
        return 1
    if not a.quiet:
        print(f"offloadd ready on {sock}; {a.clients} clients x {a.layers} layers x "
              f"{layer_bytes / 2**20:.1f} MiB checkpoints x {a.steps} steps")

    stats0 = daemon_stats(a.bin, sock)
    workers = []
    for i in range(a.clients):
        workers.append(subprocess.Popen(
            [os.path.join(a.bin, "checkpoint_workload"), f"--socket={sock}", f"--name=client{i}",
             f"--device=gpu{i}", f"--layers={a.layers}", f"--layer_bytes={layer_bytes}",
             f"--steps={a.steps}", f"--seed={i + 1}", f"--forward_seconds={a.forward_ms / 1000}"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results, failures = [], 0
    for w in workers:
        out, err = w.communicate(timeout=600)
        try:
            results.append(json.loads(out.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            print(f"demo: a client produced no result (exit {w.returncode}): {err.strip()}",
                  file=sys.stderr)
            failures += 1
        if w.returncode != 0:
            failures += 1

    stats = daemon_stats(a.bin, sock)
    daemon.send_signal(signal.SIGTERM)
    daemon_rc = daemon.wait(timeout=30)

    header = f"{'client':<9} {'link':<6} {'moved GiB':>9} {'GB/s':>6} {'reload wait s':>13} " \
             f"{'prefetched':>10} {'urgent':>6} {'errors':>6} {'corrupt':>7}"
    if not a.quiet:
        print(header)
        print("-" * len(header))
    tot = dict(bytes=0, wait=0.0, pre=0, urg=0, err=0, bad=0, elapsed=0.0)
    for r in results:
        if not a.quiet:
            print(f"{r['name']:<9} {r['link']:<6} {r['bytes_moved'] / 2**30:>9.2f} "
                  f"{r['gb_per_second']:>6.2f} {r['reload_wait_seconds']:>13.4f} "
                  f"{r['reloads_prefetched']:>10} {r['reloads_urgent']:>6} {r['errors']:>6} "
                  f"{r['corrupted']:>7}")
        tot["bytes"] += r["bytes_moved"]
        tot["wait"] += r["reload_wait_seconds"]
        tot["pre"] += r["reloads_prefetched"]
        tot["urg"] += r["reloads_urgent"]
        tot["err"] += r["errors"]
        tot["bad"] += r["corrupted"]
        tot["elapsed"] = max(tot["elapsed"], r["elapsed_seconds"])
    gbps = tot["bytes"] / tot["elapsed"] / 1e9 if tot["elapsed"] else 0.0
    if not a.quiet:
        print("-" * len(header))
    print(f"{'total':<9} {'':<6} {tot['bytes'] / 2**30:>9.2f} {gbps:>6.2f} {tot['wait']:>13.4f} "
          f"{tot['pre']:>10} {tot['urg']:>6} {tot['err']:>6} {tot['bad']:>7}")
    print(f"pool: peak {int(stats['pool_peak_used_bytes']) / 2**20:.1f} MiB of "
          f"{int(stats['pool_capacity_bytes']) / 2**20:.0f} MiB, "
          f"{stats['pool_used_bytes']} bytes held at the end; daemon errors_total "
          f"{stats['errors_total']}; daemon exit status {daemon_rc}")
    print_links(stats0, stats)
    print_plan_check(stats, a, layer_bytes)
    ok = (failures == 0 and tot["err"] == 0 and tot["bad"] == 0 and daemon_rc == 0
          and len(results) == a.clients and int(stats["pool_used_bytes"]) == 0)
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"daemon log and config kept in {tmp}")
    print("demo: OK" if ok else "demo: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
