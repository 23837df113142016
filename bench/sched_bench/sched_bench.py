#!/usr/bin/python3
"""Link scheduler benchmark: fairness, utilisation, weights, urgent latency, offload share.

Runs offloadd on the shm backend with simulated (paced) links and sched_client processes that
keep them saturated, reads per-GPU / per-link / per-host-link bytes from GetStats
(`offloadctl stats --json`) at the start and end of a measuring window, and checks:

Run 1 ("links"): 4 links of 2 GPUs each at --rate-gbps per direction, 8 clients, each with
  offloads (D2H, OFFLOAD) and reloads (H2D, PREFETCH) in flight all the time; GPUs g6:g7 on
  link L3 have DRR weights 2:1.
  - Jain's fairness index of the GPUs' bytes per link and direction (bytes / weight) >= 0.99
  - link utilisation = window bytes / (capacity x window seconds) >= 0.95, both directions at
    once (offloads keep their full D2H rate while reloads saturate H2D: links are full duplex)
  - L3's shares g6:g7 within 2% of 2:1
  - after the window, g0 and g4 issue URGENT reloads of --probe-mib while their links stay
    saturated: latency <= own transfer time + 2 chunk-times (chunk-time = chunk / capacity)
Run 2 ("hierarchy"): a half-duplex link "hd" (offloads and reloads share one queue) with a
  reloading client h0 and an offloading client h1; links p0 (q0, q1) and p1 (q2) under a host
  link "mem" whose capacity equals one link's.
  - hd: offloads get >= offload_min_share - 0.01 of the bytes while reloads saturate it, and
    the link is >= 0.95 utilised
  - mem: >= 0.95 utilised; p0 and p1 get equal shares (Jain >= 0.99) though p0 has two GPUs,
    and q0, q1 split p0's (Jain >= 0.99): fair at each level

Prints a table, then one JSON line ({"bench": "sched", ...}); exits 1 if a timing target is
missed (shares, utilisation, latency: these depend on the machine having CPU to spare), 3 if a
client saw an error or the daemon did not exit cleanly (never the machine's fault), 2 on usage or
set-up errors. --quick runs short windows with looser bounds (the e2e test).
"""
import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time

MIB = 1 << 20


def jain(xs):
    xs = [float(x) for x in xs]
    s2 = sum(x * x for x in xs)
    return (sum(xs) ** 2) / (len(xs) * s2) if s2 > 0 else 0.0


def pool_bytes(need):
    """need + 25%, in whole MiB (the daemon pre-faults all of it: keep it small)."""
    return (need * 5 // 4 + MIB - 1) // MIB * MIB


def cpu_seconds(pid):
    """utime + stime of a process, in seconds (proc(5))."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Daemon:
    def __init__(self, bin_dir, config_text, tmp, name):
        self.dir = tempfile.mkdtemp(prefix=f"sb-{name}-", dir=tmp)
        self.sock = os.path.join(self.dir, "d.sock")
        conf = os.path.join(self.dir, "offloadd.conf")
        with open(conf, "w") as f:
            f.write(config_text)
        self.offloadctl = os.path.join(bin_dir, "offloadctl")
        self.log = open(os.path.join(self.dir, "offloadd.log"), "w+")
        self.proc = subprocess.Popen(
            [os.path.join(bin_dir, "offloadd"), "--config", conf, "--socket_path", self.sock],
            stdout=subprocess.PIPE, stderr=self.log, text=True)
        line = self.proc.stdout.readline()
        if "ready" not in line:
            self.stop()
            self.log.seek(0)
            raise RuntimeError("offloadd did not start:\n" + self.log.read())

    def stats(self):
        out = subprocess.run([self.offloadctl, "--socket", self.sock, "stats", "--json"],
                             check=True, capture_output=True, text=True, timeout=30).stdout
        return json.loads(out)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def start_clients(client_bin, sock, specs):
    """specs: list of (device, extra flags). Returns Popen objects once all are ready."""
    procs = []
    for device, flags in specs:
        procs.append(subprocess.Popen(
            [client_bin, f"--socket={sock}", f"--device={device}", f"--name=sched-{device}"]
            + flags, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            text=True))
    for p, (device, _) in zip(procs, specs):
        line = p.stdout.readline()
        if "ready" not in line:
            for q in procs:
                if q.poll() is None:
                    q.kill()
            raise RuntimeError(f"client {device} failed in set-up: {p.stderr.read().strip()}")
    return procs


def go(procs):
    for p in procs:
        p.stdin.write("go\n")
        p.stdin.flush()
    return time.monotonic()


def finish_clients(procs, timeout):
    results = []
    for p in procs:
        out, err = p.communicate(timeout=timeout)
        lines = out.strip().splitlines()
        try:
            r = json.loads(lines[-1])
        except (IndexError, json.JSONDecodeError):
            raise RuntimeError(f"a client printed no result (exit {p.returncode}): {err.strip()}")
        r["exit"] = p.returncode
        results.append(r)
    return results


def by_name(stats, key="links"):
    return {l["name"]: l for l in stats.get(key, [])}


def gpu_delta(s1, s2, link, direction):
    """{gpu: bytes moved in the window} on one link direction."""
    before = {g["gpu"]: int(g[f"{direction}_bytes"]) for g in by_name(s1)[link]["gpu_bytes"]}
    after = {g["gpu"]: int(g[f"{direction}_bytes"]) for g in by_name(s2)[link]["gpu_bytes"]}
    return {g: after[g] - before.get(g, 0) for g in after}


def run_links(a, tmp, rate, chunk):
    window = 2.0 if a.quick else a.window
    probe_phase = 1.5 if a.quick else 4.0
    probe_interval = 0.25 if a.quick else 0.4
    warmup = 1.0 if a.quick else 1.5
    links = {f"L{i}": [f"g{2 * i}", f"g{2 * i + 1}"] for i in range(4)}
    weights = {"g6": 2, "g7": 1}
    # Pool: every client's blocks in flight and its reload blocks, plus the probes, + 25%.
    need = 8 * 2 * a.inflight * a.block_mib * MIB + 2 * a.probe_mib * MIB
    conf = (f"pool_bytes: {pool_bytes(need)}\nchunk_bytes: {chunk}\ncopy_threads: 2\n"
            "metrics_address: \"\"\n")
    for name, gpus in links.items():
        conf += (f"links {{ name: \"{name}\" " + " ".join(f"gpus: \"{g}\"" for g in gpus)
                 + f" d2h_bytes_per_second: {rate} h2d_bytes_per_second: {rate} }}\n")
    for g, w in weights.items():
        conf += f"gpu_weights {{ gpu: \"{g}\" weight: {w} }}\n"
    d = Daemon(a.bin_dir, conf, tmp, "links")
    duration = warmup + window + 0.3 + probe_phase + 0.2
    try:
        specs = []
        for gpus in links.values():
            for g in gpus:
                flags = [f"--block_bytes={a.block_mib * MIB}", f"--offloads={a.inflight}",
                         f"--reloads={a.inflight}", f"--duration_seconds={duration}"]
                if g in ("g0", "g4"):
                    flags += [f"--probes=100", f"--probe_bytes={a.probe_mib * MIB}",
                              f"--probe_start_seconds={warmup + window + 0.3}",
                              f"--probe_interval_seconds={probe_interval}"]
                specs.append((g, flags))
        procs = start_clients(a.client, d.sock, specs)
        t_go = go(procs)
        time.sleep(max(0.0, t_go + warmup - time.monotonic()))
        cpu1, s1 = cpu_seconds(d.proc.pid), d.stats()
        time.sleep(max(0.0, t_go + warmup + window - time.monotonic()))
        cpu2, s2 = cpu_seconds(d.proc.pid), d.stats()
        results = finish_clients(procs, timeout=duration + 60)
    finally:
        rc = d.stop()
    dt = s2["uptime_seconds"] - s1["uptime_seconds"]
    out = {"window_seconds": round(dt, 3), "daemon_cpu_share": round((cpu2 - cpu1) / dt, 3),
           "links": {}, "probes": {}, "client_errors": sum(r["errors"] for r in results),
           "daemon_exit": rc}
    for name, gpus in links.items():
        entry = {}
        for direction in ("d2h", "h2d"):
            delta = gpu_delta(s1, s2, name, direction)
            moved = sum(delta.values())
            norm = [delta.get(g, 0) / weights.get(g, 1) for g in gpus]
            entry[direction] = {
                "gbps": round(moved / dt / 1e9, 4),
                "utilisation": round(moved / (rate * dt), 4),
                "jain": round(jain(norm), 5),
                "gpu_bytes": {g: delta.get(g, 0) for g in gpus},
            }
            if name == "L3":
                entry[direction]["weight_ratio"] = round(
                    delta.get("g6", 0) / max(1, delta.get("g7", 0)), 4)
        out["links"][name] = entry
    chunk_time = chunk / rate
    own = a.probe_mib * MIB / rate
    for r in results:
        if r["probe_latencies"]:
            lat = sorted(r["probe_latencies"])
            out["probes"][r["device"]] = {
                "count": len(lat),
                "own_seconds": round(own, 4),
                "chunk_seconds": round(chunk_time, 4),
                "median_seconds": round(lat[len(lat) // 2], 4),
                "max_seconds": round(lat[-1], 4),
                "max_excess_chunks": round((lat[-1] - own) / chunk_time, 3),
                "median_excess_chunks": round((lat[len(lat) // 2] - own) / chunk_time, 3),
            }
    return out


def run_hierarchy(a, tmp, rate, chunk):
    window = 2.0 if a.quick else a.window * 0.6
    warmup = 1.0 if a.quick else 1.5
    need = 5 * 2 * a.inflight * a.block_mib * MIB
    conf = (f"pool_bytes: {pool_bytes(need)}\nchunk_bytes: {chunk}\ncopy_threads: 2\n"
            f"metrics_address: \"\"\noffload_min_share: {a.min_share}\n"
            f"links {{ name: \"hd\" gpus: \"h0\" gpus: \"h1\" d2h_bytes_per_second: {rate} "
            "half_duplex: true }\n"
            f"links {{ name: \"p0\" gpus: \"q0\" gpus: \"q1\" d2h_bytes_per_second: {rate} "
            f"h2d_bytes_per_second: {rate} }}\n"
            f"links {{ name: \"p1\" gpus: \"q2\" d2h_bytes_per_second: {rate} "
            f"h2d_bytes_per_second: {rate} }}\n"
            f"host_links {{ name: \"mem\" links: \"p0\" links: \"p1\" "
            f"d2h_bytes_per_second: {rate} h2d_bytes_per_second: {rate} }}\n")
    d = Daemon(a.bin_dir, conf, tmp, "hier")
    duration = warmup + window + 0.2
    blk = f"--block_bytes={a.block_mib * MIB}"
    dur = f"--duration_seconds={duration}"
    specs = [("h0", [blk, dur, "--offloads=0", f"--reloads={a.inflight}"]),
             ("h1", [blk, dur, f"--offloads={a.inflight}", "--reloads=0"])]
    specs += [(g, [blk, dur, f"--offloads={a.inflight}", f"--reloads={a.inflight}"])
              for g in ("q0", "q1", "q2")]
    try:
        procs = start_clients(a.client, d.sock, specs)
        t_go = go(procs)
        time.sleep(max(0.0, t_go + warmup - time.monotonic()))
        s1 = d.stats()
        time.sleep(max(0.0, t_go + warmup + window - time.monotonic()))
        s2 = d.stats()
        results = finish_clients(procs, timeout=duration + 60)
    finally:
        rc = d.stop()
    dt = s2["uptime_seconds"] - s1["uptime_seconds"]
    l1, l2 = by_name(s1), by_name(s2)
    delta = lambda f: int(l2["hd"][f]) - int(l1["hd"][f])
    hd_total = delta("d2h_bytes")
    out = {"window_seconds": round(dt, 3), "client_errors": sum(r["errors"] for r in results),
           "daemon_exit": rc,
           "hd": {"utilisation": round(hd_total / (rate * dt), 4),
                  "offload_share": round(delta("offload_bytes") / max(1, hd_total), 4),
                  "prefetch_share": round(delta("prefetch_bytes") / max(1, hd_total), 4),
                  "min_share": a.min_share},
           "mem": {}}
    h1, h2 = by_name(s1, "host_links"), by_name(s2, "host_links")
    for direction in ("d2h", "h2d"):
        host_moved = int(h2["mem"][f"{direction}_bytes"]) - int(h1["mem"][f"{direction}_bytes"])
        per_link = {n: int(l2[n][f"{direction}_bytes"]) - int(l1[n][f"{direction}_bytes"])
                    for n in ("p0", "p1")}
        q = gpu_delta(s1, s2, "p0", direction)
        out["mem"][direction] = {
            "utilisation": round(host_moved / (rate * dt), 4),
            "link_gbps": {n: round(b / dt / 1e9, 4) for n, b in per_link.items()},
            "link_jain": round(jain(per_link.values()), 5),
            "p0_gpu_jain": round(jain([q.get("q0", 0), q.get("q1", 0)]), 5),
        }
    return out


def check(a, links, hier):
    """[(name, value, target text, ok)]."""
    q = a.quick
    jain_min, util_min = (0.95, 0.80) if q else (0.99, 0.95)
    ratio_tol = 0.10 if q else 0.02
    excess_max = 4.0 if q else 2.0
    share_tol = 0.05 if q else 0.01
    rows = []
    for name, entry in links["links"].items():
        for direction in ("d2h", "h2d"):
            e = entry[direction]
            rows.append((f"{name} {direction} Jain (bytes/weight)", e["jain"], f">= {jain_min}",
                         e["jain"] >= jain_min))
            rows.append((f"{name} {direction} utilisation", e["utilisation"], f">= {util_min}",
                         e["utilisation"] >= util_min))
            if "weight_ratio" in e:
                rows.append((f"{name} {direction} g6:g7 (weights 2:1)", e["weight_ratio"],
                             f"2 +- {ratio_tol:.0%}", abs(e["weight_ratio"] / 2 - 1) <= ratio_tol))
    for dev, p in links["probes"].items():
        key = "median_excess_chunks" if q else "max_excess_chunks"
        rows.append((f"urgent {a.probe_mib} MiB on {dev}: {key.split('_')[0]} latency - own, "
                     f"in chunk-times ({p['count']} probes)", p[key], f"<= {excess_max}",
                     p[key] <= excess_max and p["count"] >= (3 if q else 8)))
    hd = hier["hd"]
    rows.append(("hd (half duplex) offload share while reloads saturate", hd["offload_share"],
                 f">= {a.min_share - share_tol:.2f}", hd["offload_share"] >= a.min_share - share_tol))
    rows.append(("hd utilisation", hd["utilisation"], f">= {util_min}",
                 hd["utilisation"] >= util_min))
    for direction, m in hier["mem"].items():
        rows.append((f"mem {direction} host link utilisation", m["utilisation"], f">= {util_min}",
                     m["utilisation"] >= util_min))
        rows.append((f"mem {direction} p0 vs p1 Jain", m["link_jain"], f">= {jain_min}",
                     m["link_jain"] >= jain_min))
        rows.append((f"mem {direction} q0 vs q1 (in p0) Jain", m["p0_gpu_jain"], f">= {jain_min}",
                     m["p0_gpu_jain"] >= jain_min))
    for run, r in (("links", links), ("hierarchy", hier)):
        rows.append((f"{run}: client errors / daemon exit", f"{r['client_errors']}/{r['daemon_exit']}",
                     "0/0", r["client_errors"] == 0 and r["daemon_exit"] == 0))
    return rows


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--bin-dir", default="build/bin", help="folder with offloadd and offloadctl")
    p.add_argument("--client", default="bazel-out/k8-opt/bin/bench/sched_bench/sched_client",
                   help="sched_client binary (bazel build //bench/sched_bench:sched_client)")
    p.add_argument("--rate-gbps", type=float, default=0.5, help="simulated rate per direction")
    p.add_argument("--chunk-mib", type=int, default=8)
    p.add_argument("--block-mib", type=int, default=8, help="size of each offload/reload")
    p.add_argument("--probe-mib", type=int, default=32, help="size of the urgent reloads")
    p.add_argument("--inflight", type=int, default=None,
                   help="offloads and reloads in flight per client (default 4, --quick 3)")
    p.add_argument("--window", type=float, default=10.0, help="measuring window, seconds")
    p.add_argument("--min-share", type=float, default=0.2, help="offload_min_share")
    p.add_argument("--quick", action="store_true", help="short windows, loose bounds (tests)")
    a = p.parse_args()
    if a.inflight is None:
        a.inflight = 3 if a.quick else 4
    for path in (os.path.join(a.bin_dir, "offloadd"), os.path.join(a.bin_dir, "offloadctl"),
                 a.client):
        if not os.access(path, os.X_OK):
            print(f"sched_bench: {path} is missing: run `make build` and "
                  "`bazel build //bench/sched_bench:sched_client`", file=sys.stderr)
            return 2
    rate, chunk = a.rate_gbps * 1e9, a.chunk_mib * MIB
    tmp = tempfile.mkdtemp(prefix="sb-", dir="/tmp")
    t0 = time.monotonic()
    try:
        links = run_links(a, tmp, rate, chunk)
        hier = run_hierarchy(a, tmp, rate, chunk)
    except (RuntimeError, subprocess.SubprocessError, KeyError) as e:
        print(f"sched_bench: {e} (daemon logs under {tmp})", file=sys.stderr)
        return 2
    rows = check(a, links, hier)
    print(f"sched_bench: {a.rate_gbps} GB/s per link direction, chunk {a.chunk_mib} MiB "
          f"(chunk-time {chunk / rate * 1e3:.1f} ms), {a.inflight} offloads + {a.inflight} reloads "
          f"of {a.block_mib} MiB in flight per client; windows {links['window_seconds']} s / "
          f"{hier['window_seconds']} s; daemon CPU {links['daemon_cpu_share']:.2f} cores")
    print(f"{'link':<5} {'dir':<4} {'GB/s':>7} {'util':>7} {'Jain':>8}  per-GPU GiB")
    for name, entry in links["links"].items():
        for direction in ("d2h", "h2d"):
            e = entry[direction]
            gb = "  ".join(f"{g} {b / 2**30:.3f}" for g, b in e["gpu_bytes"].items())
            print(f"{name:<5} {direction:<4} {e['gbps']:>7.4f} {e['utilisation']:>7.4f} "
                  f"{e['jain']:>8.5f}  {gb}")
    for dev, pr in links["probes"].items():
        print(f"urgent {a.probe_mib} MiB reloads on {dev} under saturation: own "
              f"{pr['own_seconds'] * 1e3:.1f} ms, median {pr['median_seconds'] * 1e3:.1f} ms "
              f"(+{pr['median_excess_chunks']:.2f} chunk-times), max {pr['max_seconds'] * 1e3:.1f} "
              f"ms (+{pr['max_excess_chunks']:.2f}), {pr['count']} probes")
        width = max(len(r[0]) for r in rows)
    print(f"{'check':<{width}}  {'value':>9}  target")
    for name, value, target, ok in rows:
        print(f"{name:<{width}}  {value!s:>9}  {target:<10} {'ok' if ok else 'MISSED'}")
    failed = [r[0] for r in rows if not r[3]]
    summary = {"bench": "sched", "quick": a.quick, "rate_gbps": a.rate_gbps,
               "chunk_mib": a.chunk_mib, "seconds": round(time.monotonic() - t0, 1),
               "links": links, "hierarchy": hier, "missed": failed}
    print(json.dumps(summary, sort_keys=True))
    if failed:
        print(f"sched_bench: {len(failed)} target(s) missed (daemon logs under {tmp})")
    else:
        shutil.rmtree(tmp, ignore_errors=True)
        print("sched_bench: OK")
    if any(name.endswith("client errors / daemon exit") for name in failed):
        return 3
    return 0 if not failed else 1


if __name__ == "__main__":
    sys.exit(main())
