#!/usr/bin/env python3
"""`make demo`: offloadd with N simulated GPUs running an activation-checkpoint schedule.

`make demo ARGS="--backend cuda-sim"` runs the same schedule against the cuda-sim backend (issue
16): the daemon's real cuda copy engine over a timing model of GPU copy engines; no bytes move or
are checked, every rate is labelled SIMULATED, and step 2 below is skipped. Step 3 then runs on a
second cuda-sim daemon whose two simulated GPUs share one switch of --sim-fairness-gbps (their
engines twice as fast), with no capacity configured: the daemon measures the switch's link at
start-up (link calibration) and paces it at that, and the scenario's rates are its.

Starts the daemon on its embedded defaults plus a config of the demo's links, written to a
temporary folder that is removed after a passing run (shm backend, private socket, metrics off;
simulated GPUs share links --gpus-per-link at a time, paced at --link-gbps per direction), and:
 1. runs N `checkpoint_workload` processes at once (each "a GPU": L layers, one checkpoint of
    b*s*h*2 bytes per layer offloaded in forward, reloaded in reverse with prefetch in backward,
    every byte checked) and prints a table per client and in total, the pool peak, and per link
    and direction its rate, utilisation of the capacity, busy share and Jain's index over its
    GPUs' bytes;
 2. puts the copy time per checkpoint the daemon measured next to the capacity planner's plan
    (offloadd.plan) for the lower of the link's rate and this machine's memcpy rate (the shm
    backend copies with memcpy; measured at start), says which of the two limits the plan, and
    explains a measured time far above it;
 3. fairness with unequal demand: on one half-duplex link paced at --fairness-gbps, a "heavy"
    GPU that copies as fast as the link allows and a "light" one whose compute limits it to
    about a third of the link. Each runs alone, then both together; each GPU's fair share is
    the max-min allocation of the capacity (what heavy reached alone) over the demands (what
    each reached alone), and Jain's index is taken over served / fair share. A scheduler that
    lets the heavy GPU crowd out the light one drives the index down; below --min-jain the demo
    fails.
With --spill the pool is a quarter of the checkpoints all clients hold after forward and the
daemon spills to a directory (docs/spill.md): the demo prints the spill tier's
counters (blocks spilled and staged back, reloads that found their block on disk and their wait)
and, every reload still being checked byte for byte, that nothing was lost.
Sizes are binary (MiB, GiB = 2^20, 2^30 bytes), rates decimal (GB/s = 10^9 bytes/s, as link
speeds are quoted). Exit status 0 only if every client finished with 0 errors and 0 corrupted
reloads, the pool is empty at the end, the fairness index is at least --min-jain, and the daemon
exited 0.
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

MiB, GiB, GB = 2 ** 20, 2 ** 30, 1e9


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


def memcpy_gb_per_second(nbytes=64 * MiB, rounds=5):
    """This machine's single-thread memcpy rate (best of `rounds` copies of `nbytes`)."""
    src, dst = bytearray(b"\x5a" * nbytes), bytearray(nbytes)
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        dst[:] = src
        best = min(best, time.perf_counter() - t0)
    return nbytes / best / GB


def run_workloads(a, sock, specs):
    """Runs checkpoint_workload once per spec (a dict of its flags) at the same time; returns
    (results, failures)."""
    procs = []
    for spec in specs:
        args = [os.path.join(a.bin, "checkpoint_workload"), f"--socket={sock}"]
        args += [f"--{k}={v}" for k, v in spec.items()]
        procs.append(subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True))
    results, failures = [], 0
    for p in procs:
        out, err = p.communicate(timeout=600)
        try:
            results.append(json.loads(out.strip().splitlines()[-1]))
        except (IndexError, json.JSONDecodeError):
            print(f"demo: a client produced no result (exit {p.returncode}): {err.strip()}",
                  file=sys.stderr)
            failures += 1
        if p.returncode != 0:
            failures += 1
    return results, failures


def print_links(before, after, skip=("fair",)):
    """Per link and direction over the run: rate, utilisation of the capacity (paced links),
    busy share (time with a chunk in flight) and Jain's index over the GPUs' bytes."""
    dt = after["uptime_seconds"] - before["uptime_seconds"]
    if dt <= 0:
        return
    old = {l["name"]: l for l in before.get("links", [])}
    print(f"{'link':<8} {'dir':<4} {'rate GB/s':>9} {'capacity GB/s':>13} {'util 0-1':>8} "
          f"{'busy 0-1':>8} {'Jain 0-1':>8}  per-GPU MiB moved")
    for l in after.get("links", []):
        if l["name"] in skip:
            continue
        o = old.get(l["name"], {})
        prev = {g["gpu"]: g for g in o.get("gpu_bytes", [])}
        for d in ("d2h", "h2d"):
            moved = int(l[f"{d}_bytes"]) - int(o.get(f"{d}_bytes", 0))
            busy = l[f"{d}_busy_seconds"] - o.get(f"{d}_busy_seconds", 0.0)
            cap = l[f"{d}_capacity_bytes_per_second"]
            per_gpu = {g["gpu"]: int(g[f"{d}_bytes"])
                       - int(prev.get(g["gpu"], {}).get(f"{d}_bytes", 0))
                       for g in l.get("gpu_bytes", [])}
            util = f"{moved / (cap * dt):8.3f}" if cap > 0 else f"{'-':>8}"
            capacity = f"{cap / GB:13.2f}" if cap > 0 else f"{'unpaced':>13}"
            gpus = "  ".join(f"{g} {b / MiB:.0f}" for g, b in per_gpu.items())
            print(f"{l['name']:<8} {d:<4} {moved / dt / GB:>9.3f} {capacity} {util} "
                  f"{busy / dt:>8.3f} {jain(per_gpu.values()):>8.4f}  {gpus}")
    print("  util = bytes moved / (capacity x run time): low when the GPUs' compute, not the "
          "link, sets the pace;\n  busy = share of the run with a chunk in flight; Jain = 1 "
          "when the GPUs of a link moved equal bytes.")


def planned_ms(a, layer_bytes, link_gbps):
    """The capacity planner's copy time per checkpoint (ms) at `link_gbps` per link direction,
    with --gpus-per-link GPUs sharing it; None without the planner."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "client",
                                    "python"))
    try:
        from offloadd import plan as planner
    except ImportError:
        gpl = max(1, min(a.gpus_per_link, a.clients))
        return layer_bytes * gpl / (link_gbps * GB) * 1e3  # the same arithmetic
    model = planner.ModelShape(layers=a.layers, hidden=a.hidden, attention_width=a.hidden,
                               params_per_layer=12 * a.hidden * a.hidden)
    gpl = max(1, min(a.gpus_per_link, a.clients))
    p = planner.plan(model, seq=a.seq, batch=a.batch, dtype="bf16",
                     gpus_per_node=max(a.clients, gpl), gpus_per_link=gpl, link=link_gbps)
    # The planner sizes a checkpoint as b*s*h*2; scale if --layer-bytes overrides it.
    return p.copy_seconds_per_layer * layer_bytes / p.checkpoint_bytes_per_layer * 1e3


def print_plan_check(stats, a, layer_bytes, memcpy_gbps):
    """Copy time of one checkpoint per link, all its GPUs copying: measured by the daemon (from
    the link's busy time) next to the planner's plan for the lower of the link's rate and the
    memcpy rate; explains a measured time far above the plan."""
    link_gbps = a.link_gbps if a.link_gbps > 0 else float("inf")
    model_gbps = min(link_gbps, memcpy_gbps)
    if link_gbps <= memcpy_gbps:
        limit = f"the link, {link_gbps:.2f} GB/s per direction"
    else:
        limit = (f"memcpy on this CPU, {memcpy_gbps:.2f} GB/s measured at start "
                 + ("(the link is unpaced)" if a.link_gbps <= 0
                    else f"(below the {a.link_gbps:.2f} GB/s link)"))
    plan_ms = planned_ms(a, layer_bytes, model_gbps)
    gpl = max(1, min(a.gpus_per_link, a.clients))
    print(f"copy time per checkpoint ({layer_bytes / MiB:.2f} MiB), all {gpl} GPUs of a link "
          f"copying at once; the plan is limited by {limit}:")
    print(f"  {'link':<8} {'measured ms':>11} {'plan ms':>8} {'measured/plan':>13}")
    worst = 0.0
    for l in stats.get("links", []):
        measured = l.get("measured_offload_copy_seconds", 0.0) * 1e3
        if measured <= 0 or l["name"] == "fair":
            continue
        worst = max(worst, measured / plan_ms)
        print(f"  {l['name']:<8} {measured:>11.2f} {plan_ms:>8.2f} {measured / plan_ms:>12.1f}x")
    if worst > 2:
        cores = os.cpu_count() or 1
        print(f"  measured is up to {worst:.1f}x the plan. The plan gives each copy the whole "
              f"rate; here the daemon's copy threads share {cores} CPU cores with {a.clients} "
              f"client processes that fill and check every byte they offload (and the pacing "
              f"sleeps), so each memcpy runs slower than the {memcpy_gbps:.2f} GB/s measured "
              f"alone. Fewer --clients, or more cores, bring it towards the plan; on a GPU node "
              f"the copy engine (DMA), not a CPU core, moves the bytes.")
    elif worst > 0:
        print("  measured is within 2x of the plan (below it where the daemon's copy threads "
              "copy chunks in parallel, which a single memcpy does not).")


class FairLink:
    """The fairness scenario's link: its name, its heavy and light GPUs, its capacity in bytes/s
    (one direction), whether offloads and reloads share it (half duplex), the checkpoint size,
    and whether the daemon is cuda-sim."""

    def __init__(self, name, heavy, light, capacity, half_duplex, layer_bytes, sim):
        self.name, self.heavy, self.light = name, heavy, light
        self.capacity, self.half_duplex = capacity, half_duplex
        self.layer_bytes, self.sim = layer_bytes, sim


def fairness(a, sock, link):
    """The unequal-demand scenario on `link` (a FairLink; see the module doc). Returns Jain's
    index over served / max-min fair share, and the clients' failures."""
    common = {"layers": 8, "layer_bytes": link.layer_bytes, "steps": 100000,
              "run_seconds": a.fairness_seconds}
    if link.sim:
        common["cuda_sim"] = 1
    # Light: 3 forwards of compute per layer and step, moving one checkpoint each way; sized to
    # ~1/3 of the link. A GPU's served rate counts both directions (a half-duplex link carries
    # both; on a full-duplex one a GPU offloads in forward and reloads in backward, so what one
    # GPU alone moves in both directions together is about one direction's capacity).
    light_forward = 2 * link.layer_bytes / (link.capacity / 3) / 3
    heavy, light = link.heavy, link.light
    specs = {heavy: dict(common, name="heavy", device=heavy, slots=8, forward_seconds=0, seed=101),
             light: dict(common, name="light", device=light, slots=2,
                         forward_seconds=light_forward, seed=102)}

    def served(names):
        before = daemon_stats(a.bin, sock)
        t0 = time.monotonic()
        results, failures = run_workloads(a, sock, [specs[n] for n in names])
        dt = time.monotonic() - t0
        after = daemon_stats(a.bin, sock)

        def moved(stats):
            for l in stats.get("links", []):
                if l["name"] == link.name:  # half duplex: d2h_bytes has both directions
                    return {g["gpu"]: int(g["d2h_bytes"]) + int(g.get("h2d_bytes", 0))
                            for g in l.get("gpu_bytes", [])}
            return {}
        b, e = moved(before), moved(after)
        return {n: (e.get(n, 0) - b.get(n, 0)) / dt for n in names}, failures

    heavy_alone, f1 = served([heavy])
    light_alone, f2 = served([light])
    both, f3 = served([heavy, light])
    capacity = heavy_alone[heavy]  # what the link gives one GPU that wants all of it
    demand = {heavy: capacity, light: light_alone[light]}
    fair = {light: min(demand[light], capacity / 2)}
    fair[heavy] = capacity - fair[light]
    ratio = {n: both[n] / fair[n] if fair[n] > 0 else 0.0 for n in both}
    index = jain(ratio.values())
    sim = " SIMULATED" if link.sim else ""
    kind = "half-duplex link" if link.half_duplex else "full-duplex link"
    how = "measured at start-up" if link.sim else "configured"
    print(f"fairness, unequal demand{sim}: one {kind} {link.name} paced at "
          f"{link.capacity / GB:.2f} GB/s ({how}), {a.fairness_seconds:.1f} s per phase; rates "
          f"count both directions")
    print(f"  {'gpu':<11} {'alone GB/s':>10} {'fair share GB/s':>15} {'together GB/s':>13} "
          f"{'served/fair':>11}")
    for n, label in ((heavy, "heavy"), (light, "light")):
        alone = heavy_alone if n == heavy else light_alone
        print(f"  {label:<11} {alone[n] / GB:>10.3f} {fair[n] / GB:>15.3f} {both[n] / GB:>13.3f} "
              f"{ratio[n]:>11.3f}")
    print(f"  fair share: max-min over the demands (rate alone) within the capacity (heavy's "
          f"rate alone, {capacity / GB:.3f} GB/s);\n  Jain's index over served/fair "
          f"{index:.4f} (1 = every GPU got its fair share; pass >= {a.min_jain})")
    return index, f1 + f2 + f3


def start_daemon(cmd, log_path):
    """Starts offloadd with `cmd` (its stderr to `log_path`); returns (process, log file), or
    (None, log file) after printing why it did not start."""
    log = open(log_path, "w+")
    daemon = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=log, text=True)
    if "ready" in daemon.stdout.readline():
        return daemon, log
    daemon.wait(timeout=10)
    log.seek(0)
    sys.stderr.write(log.read())
    print("demo: the daemon did not start", file=sys.stderr)
    return None, log


def sim_fairness(a, tmp):
    """Step 3 on cuda-sim: a daemon of its own whose two simulated GPUs share one switch of
    --sim-fairness-gbps (engines at twice that), no capacity configured; the link is paced at
    what the daemon measured at start-up. Returns (Jain's index, failures)."""
    switch = a.sim_fairness_gbps * GB
    sock = os.path.join(tmp, "fair.sock")
    conf = os.path.join(tmp, "fair.conf")
    with open(conf, "w") as f:
        f.write(f"backend: \"cuda-sim\"\ncuda_sim {{ gpus: 2 gpus_per_switch: 2 "
                f"engine_bytes_per_second: {2 * switch} switch_bytes_per_second: {switch} }}\n")
    cmd = [os.path.join(a.bin, "offloadd"), "--socket_path", sock, "--metrics_address=",
           "--config", conf, "--pool_bytes", str(512 * MiB)]
    daemon, log = start_daemon(cmd, os.path.join(tmp, "offloadd-fair.log"))
    if daemon is None:
        return 0.0, 1
    try:
        stats = daemon_stats(a.bin, sock)
        link = [l for l in stats.get("links", []) if l["name"] == "sim-switch0"][0]
        capacity = float(link["d2h_capacity_bytes_per_second"])
        cal = [c for c in stats.get("link_calibration", {}).get("links", [])
               if c["name"] == "sim-switch0"]
        alone = [float(g["d2h_bytes_per_second"]) for g in cal[0]["gpus"]] if cal else []
        print(f"link calibration at start-up (SIMULATED): sim-switch0, modelled {switch / GB:.2f} "
              f"GB/s per switch and {2 * switch / GB:.2f} per GPU: each GPU alone "
              + ", ".join(f"{x / GB:.2f}" for x in alone) + f" GB/s d2h, both together "
              f"{capacity / GB:.2f} GB/s; capacity configured: none")
        if not link.get("d2h_capacity_calibrated") or capacity <= 0:
            print("demo: the cuda-sim daemon did not calibrate its switch link", file=sys.stderr)
            return 0.0, 1
        uuid = "GPU-51300000-0000-0000-0000-{:012d}"
        return fairness(a, sock, FairLink("sim-switch0", uuid.format(0), uuid.format(1), capacity,
                                          False, a.sim_fairness_layer_bytes, True))
    finally:
        daemon.send_signal(signal.SIGTERM)
        daemon.wait(timeout=30)
        log.close()


def device_name(a, i):
    """Client i's device id: a name on shm; on cuda-sim the simulated GPU's UUID
    (SimCudaApi::DeviceUuid)."""
    return f"GPU-51300000-0000-0000-0000-{i:012d}" if a.backend == "cuda-sim" else f"gpu{i}"


def write_config(a, path):
    rate = a.link_gbps * GB
    with open(path, "w") as f:
        if a.gpus_per_link > 1:
            # Links of gpus_per_link GPUs each, at the simulated rate (0 = unpaced).
            for k in range(0, a.clients, a.gpus_per_link):
                gpus = " ".join(f'gpus: "{device_name(a, i)}"'
                                for i in range(k, min(k + a.gpus_per_link, a.clients)))
                f.write(f'links {{ name: "link{k // a.gpus_per_link}" {gpus} '
                        f"d2h_bytes_per_second: {rate} h2d_bytes_per_second: {rate} }}\n")
        if not a.no_fairness and a.backend == "shm":
            f.write(f'links {{ name: "fair" gpus: "fair-heavy" gpus: "fair-light" '
                    f"d2h_bytes_per_second: {a.fairness_gbps * GB} half_duplex: true }}\n")


def print_spill(stats):
    """The spill tier's counters; False when it did not spill or lost a block."""
    d = stats.get("spill")
    if not d:
        print("spill: the daemon reports no spill tier")
        return False
    n = lambda k: int(d.get(k, 0))  # noqa: E731  (JSON has uint64 as strings)
    reloads = max(int(stats.get("reloadsTotal", stats.get("reloads_total", 0))), 1)
    from_disk = n("reloadsFromDiskTotal") or n("reloads_from_disk_total")
    wait = float(d.get("reloadDiskWaitSecondsTotal", d.get("reload_disk_wait_seconds_total", 0)))
    spilled = n("spilledBlocksTotal") or n("spilled_blocks_total")
    staged = n("stagedBlocksTotal") or n("staged_blocks_total")
    lost = n("blocksLostTotal") or n("blocks_lost_total")
    rate = float(d.get("bytesPerSecond", d.get("bytes_per_second", 0)))
    print(f"spill: {d.get('io')} + O_DIRECT, disk paced at {rate / GB:.2f} GB/s; "
          f"{spilled} blocks spilled, {staged} staged back; {from_disk} of {reloads} reloads "
          f"found their block on disk ({100 * (1 - from_disk / reloads):.1f}% served from the "
          f"pool), waiting {wait:.3f} s in total; {lost} blocks lost")
    return spilled > 0 and lost == 0


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
    p.add_argument("--fairness-gbps", type=float, default=0.2,
                   help="rate of the fairness scenario's link (GB/s), low enough to limit it")
    p.add_argument("--fairness-seconds", type=float, default=1.5,
                   help="length of each of its three phases (s)")
    p.add_argument("--min-jain", type=float, default=0.9,
                   help="fairness index below which the demo fails")
    p.add_argument("--no-fairness", action="store_true", help="skip the fairness scenario")
    p.add_argument("--spill", action="store_true",
                   help="pool = 1/4 of the checkpoints, spill tier in a directory (--spill-dir)")
    p.add_argument("--spill-dir", default=None,
                   help="spill directory on a disk with O_DIRECT (default: under /tmp)")
    p.add_argument("--quiet", action="store_true", help="only the summary")
    p.add_argument("--backend", choices=("shm", "cuda-sim"), default="shm",
                   help="cuda-sim: the daemon's GPUs are a timing model of copy engines (55 GB/s "
                        "per direction); no bytes move, none are checked, every rate printed is "
                        "SIMULATED; no plan check; the fairness scenario runs on a second "
                        "cuda-sim daemon with a calibrated switch link")
    p.add_argument("--sim-fairness-gbps", type=float, default=2.0,
                   help="cuda-sim: the fairness scenario's simulated switch (GB/s per direction; "
                        "its two GPUs' engines at twice that)")
    p.add_argument("--sim-fairness-layer-bytes", type=parse_bytes, default=16 * MiB,
                   help="cuda-sim: the fairness scenario's checkpoint size")
    a = p.parse_args()
    layer_bytes = a.layer_bytes or a.batch * a.seq * a.hidden * 2

    tmp = tempfile.mkdtemp(prefix="offloadd-demo-", dir="/tmp")
    sock = os.path.join(tmp, "d.sock")
    conf = os.path.join(tmp, "offloadd.conf")
    write_config(a, conf)
    cmd = [os.path.join(a.bin, "offloadd"), "--socket_path", sock, "--metrics_address=",
           "--config", conf]
    if a.pool_bytes:
        cmd += ["--pool_bytes", str(a.pool_bytes)]
    if a.link_gbps > 0:
        cmd += ["--default_link_bytes_per_second", str(int(a.link_gbps * GB))]
    sim = a.backend == "cuda-sim"
    if sim:
        cmd += ["--backend", "cuda-sim"]
    if a.spill:
        quarter = a.clients * a.layers * layer_bytes // 4
        a.pool_bytes = max(quarter // MiB, 2 * -(-layer_bytes // MiB)) * MiB
        spill_dir = a.spill_dir or os.path.join(tmp, "spill")
        cmd += ["--pool_bytes", str(a.pool_bytes), "--spill_directory", spill_dir,
                "--admission_deadline_seconds", "60"]
    memcpy_gbps = memcpy_gb_per_second()
    daemon, daemon_log = start_daemon(cmd, os.path.join(tmp, "offloadd.log"))
    if daemon is None:
        return 1
    if not a.quiet:
        print(f"offloadd ready on {sock}; {a.clients} clients x {a.layers} layers x "
              f"{layer_bytes / MiB:.2f} MiB checkpoints x {a.steps} steps; sizes in MiB/GiB "
              f"(2^20/2^30 bytes), rates in GB/s (10^9 bytes/s)")
    if sim:
        print("SIMULATED: backend cuda-sim — the GPUs are a timing model of copy engines; no bytes "
              "move and none are checked; every rate below is the model's, not a measurement of "
              "a GPU")

    stats0 = daemon_stats(a.bin, sock)
    specs = [{"name": f"client{i}", "device": device_name(a, i), "layers": a.layers,
              "layer_bytes": layer_bytes, "steps": a.steps, "seed": i + 1,
              "forward_seconds": a.forward_ms / 1000} for i in range(a.clients)]
    if sim:
        for spec in specs:
            spec["cuda_sim"] = 1
    results, failures = run_workloads(a, sock, specs)
    stats = daemon_stats(a.bin, sock)

    header = (f"{'client':<9} {'link':<6} {'moved GiB':>9} {'rate GB/s' + (' sim' if sim else ''):>9} "
              f"{'reload wait s':>13} {'prefetched n':>12} {'urgent n':>8} {'errors n':>8} "
              f"{'corrupt n':>9}")
    if not a.quiet:
        print(header)
        print("-" * len(header))
    tot = dict(bytes=0, wait=0.0, pre=0, urg=0, err=0, bad=0, elapsed=0.0)
    for r in results:
        if not a.quiet:
            print(f"{r['name']:<9} {r['link']:<6} {r['bytes_moved'] / GiB:>9.2f} "
                  f"{r['gb_per_second']:>9.2f} {r['reload_wait_seconds']:>13.4f} "
                  f"{r['reloads_prefetched']:>12} {r['reloads_urgent']:>8} {r['errors']:>8} "
                  f"{r['corrupted']:>9}")
        tot["bytes"] += r["bytes_moved"]
        tot["wait"] += r["reload_wait_seconds"]
        tot["pre"] += r["reloads_prefetched"]
        tot["urg"] += r["reloads_urgent"]
        tot["err"] += r["errors"]
        tot["bad"] += r["corrupted"]
        tot["elapsed"] = max(tot["elapsed"], r["elapsed_seconds"])
    gbps = tot["bytes"] / tot["elapsed"] / GB if tot["elapsed"] else 0.0
    if not a.quiet:
        print("-" * len(header))
    print(f"{'total':<9} {'':<6} {tot['bytes'] / GiB:>9.2f} {gbps:>9.2f} {tot['wait']:>13.4f} "
          f"{tot['pre']:>12} {tot['urg']:>8} {tot['err']:>8} {tot['bad']:>9}")
    if not a.quiet:
        print(f"  rate = bytes offloaded + reloaded / the client's run time; the clients compute "
              f"{a.forward_ms:.1f} ms per layer forward (x3 with recompute + backward), which "
              f"limits it unless the copies take longer")
    print(f"pool: peak {int(stats['pool_peak_used_bytes']) / MiB:.1f} MiB of "
          f"{int(stats['pool_capacity_bytes']) / MiB:.1f} MiB, "
          f"{int(stats['pool_used_bytes']) / MiB:.1f} MiB held at the end; daemon errors_total "
          f"{stats['errors_total']}")
    print_links(stats0, stats)
    spill_ok = print_spill(stats) if a.spill else True
    if sim:
        print("  (SIMULATED: link rates above are the timing model's; the plan check compares "
              "with this machine's memcpy and is skipped on cuda-sim)")
    else:
        print_plan_check(stats, a, layer_bytes, memcpy_gbps)

    if a.no_fairness:
        print("fairness scenario: skipped (--no-fairness)")
        index, fair_failures = 1.0, 0
    elif sim:
        index, fair_failures = sim_fairness(a, tmp)
    else:
        index, fair_failures = fairness(a, sock, FairLink("fair", "fair-heavy", "fair-light",
                                                          a.fairness_gbps * GB, True, 2 * MiB,
                                                          False))
    end = daemon_stats(a.bin, sock)
    daemon.send_signal(signal.SIGTERM)
    daemon_rc = daemon.wait(timeout=30)
    print(f"daemon exit status {daemon_rc}")
    ok = (spill_ok and failures == 0 and fair_failures == 0 and tot["err"] == 0 and tot["bad"] == 0
          and daemon_rc == 0 and len(results) == a.clients
          and int(end["pool_used_bytes"]) == 0 and index >= a.min_jain)
    if index < a.min_jain:
        print(f"demo: fairness index {index:.4f} is below --min-jain {a.min_jain}")
    if ok:
        shutil.rmtree(tmp, ignore_errors=True)
    else:
        print(f"daemon log and config kept in {tmp}")
    print("demo: OK" if ok else "demo: FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
