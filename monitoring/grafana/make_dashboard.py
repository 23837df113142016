#!/usr/bin/python3
"""Writes offloadd-dashboard.json (Grafana 9+ dashboard JSON, schemaVersion 37) beside this file.

The JSON is committed; edit this script and rerun it (`/usr/bin/python3 make_dashboard.py`)
rather than editing the JSON: tests/monitoring/test_dashboard.py checks the two agree.
Variables: datasource (Prometheus), instance (a daemon), gpu. Every query selects
instance=~"$instance"; per-GPU series also gpu=~"$gpu". Metric names are the daemon's
(docs/metrics-and-alerts.md); tests/monitoring/test_live_scrape.py checks each exists in a live scrape.
"""
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
RATE = "[$__rate_interval]"
INST = 'instance=~"$instance"'
GPU = 'gpu=~"$gpu"'


def target(expr, legend, ref):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref, "range": True}


class Builder:
    def __init__(self):
        self.panels = []
        self.next_id = 1
        self.y = 0
        self.x = 0
        self.row_h = 0

    def _id(self):
        i = self.next_id
        self.next_id += 1
        return i

    def row(self, title):
        if self.x:
            self.y += self.row_h
        self.x, self.row_h = 0, 0
        self.panels.append({"type": "row", "id": self._id(), "title": title, "collapsed": False,
                            "panels": [], "gridPos": {"h": 1, "w": 24, "x": 0, "y": self.y}})
        self.y += 1

    def panel(self, title, description, targets, unit, kind="timeseries", w=8, h=8,
              minimum=None, maximum=None, thresholds=None, stack=False):
        if self.x + w > 24:
            self.y += self.row_h
            self.x, self.row_h = 0, 0
        defaults = {"unit": unit}
        if minimum is not None:
            defaults["min"] = minimum
        if maximum is not None:
            defaults["max"] = maximum
        if thresholds:
            defaults["thresholds"] = {"mode": "absolute", "steps": [
                {"color": color, "value": value} for value, color in thresholds]}
        if kind == "timeseries":
            defaults["custom"] = {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 10,
                                  "showPoints": "never",
                                  "stacking": {"mode": "normal" if stack else "none"}}
        options = {"legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
                   "tooltip": {"mode": "multi", "sort": "desc"}}
        if kind in ("stat", "gauge"):
            options = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
                       "orientation": "auto"}
        refs = "ABCDEFGH"
        self.panels.append({
            "type": kind, "id": self._id(), "title": title, "description": description,
            "datasource": DS, "gridPos": {"h": h, "w": w, "x": self.x, "y": self.y},
            "fieldConfig": {"defaults": defaults, "overrides": []}, "options": options,
            "targets": [target(e, l, refs[i]) for i, (e, l) in enumerate(targets)]})
        self.x += w
        self.row_h = max(self.row_h, h)


def quantiles(metric, by, labels, qs=(0.5, 0.99)):
    sel = "{" + labels + "}"
    return [(f"histogram_quantile({q}, sum by (le, {by}) (rate({metric}_bucket{sel}{RATE})))",
             f"p{int(q * 100)} {{{{{by}}}}}") for q in qs]


def build():
    b = Builder()
    b.row("Pool")
    b.panel("Pool bytes by NUMA node",
            "Host pool capacity, bytes held by blocks, the peak since start, and bytes pinned "
            "(registered with the driver or mlocked), per daemon and NUMA node.",
            [(f"sum by (instance, numa_node) (offloadd_pool_capacity_bytes{{{INST}}})",
              "{{instance}} node {{numa_node}} capacity"),
             (f"sum by (instance, numa_node) (offloadd_pool_used_bytes{{{INST}}})",
              "{{instance}} node {{numa_node}} used"),
             (f"sum by (instance, numa_node) (offloadd_pool_peak_used_bytes{{{INST}}})",
              "{{instance}} node {{numa_node}} peak"),
             (f"sum by (instance, numa_node) (offloadd_pool_pinned_bytes{{{INST}}})",
              "{{instance}} node {{numa_node}} pinned")], "bytes", w=10)
    b.panel("Pool used ratio",
            "Used / capacity per daemon. The OffloaddPoolAbove90Percent alert fires above 0.9 "
            "for 5 minutes.",
            [(f"sum by (instance) (offloadd_pool_used_bytes{{{INST}}}) / sum by (instance) "
              f"(offloadd_pool_capacity_bytes{{{INST}}})", "{{instance}}")],
            "percentunit", kind="gauge", w=4, minimum=0, maximum=1,
            thresholds=[(None, "green"), (0.75, "orange"), (0.9, "red")])
    b.panel("Offloads waiting for space / refused",
            "Offloads queued for pool space (back-pressure), and offloads refused with "
            "RESOURCE_EXHAUSTED per second (queue full or admission deadline passed).",
            [(f"offloadd_offloads_waiting{{{INST}}}", "{{instance}} waiting"),
             (f"rate(offloadd_offloads_refused_total{{{INST}}}{RATE})",
              "{{instance}} refused/s")], "short", w=5, minimum=0)
    b.panel("Blocks held", "Blocks (extents) held in the pool.",
            [(f"offloadd_pool_blocks{{{INST}}}", "{{instance}}")], "short", w=5, minimum=0)

    b.row("Link saturation")
    b.panel("Link busy ratio",
            "Fraction of time a link direction was copying (rate of busy seconds). 1 = "
            "saturated: copies queue behind each other.",
            [(f"rate(offloadd_link_busy_seconds_total{{{INST}}}{RATE})",
              "{{instance}} {{link}} {{direction}}")], "percentunit", w=6, minimum=0, maximum=1,
            thresholds=[(None, "green"), (0.9, "red")])
    b.panel("Link throughput and capacity",
            "Bytes/s copied per link direction, and the capacity it is paced at: configured, or "
            "measured at start-up by link calibration (0 = unpaced, not drawn).",
            [(f"rate(offloadd_link_bytes_total{{{INST}}}{RATE})",
              "{{instance}} {{link}} {{direction}}"),
             (f"offloadd_link_capacity_bytes_per_second{{{INST}}} > 0",
              "{{instance}} {{link}} {{direction}} capacity")], "Bps", w=6, minimum=0)
    b.panel("Transfers queued per link", "Transfers queued or copying per link direction.",
            [(f"offloadd_link_queued_transfers{{{INST}}}",
              "{{instance}} {{link}} {{direction}}")], "short", w=6, minimum=0)
    b.panel("Chunks in flight per link",
            "Chunks being copied right now per link direction (at most copy_threads): 0 while "
            "transfers are queued means the link is paced or waiting on its host link.",
            [(f"offloadd_link_chunks_in_flight{{{INST}}}",
              "{{instance}} {{link}} {{direction}}")], "short", w=6, minimum=0)

    b.row("Throughput")
    b.panel("Bytes/s per GPU and direction",
            "Bytes moved by completed transfers: d2h = offloads, h2d = reloads.",
            [(f"sum by (instance, gpu, direction) (rate(offloadd_transfer_bytes_total"
              f"{{{INST},{GPU},status=\"ok\"}}{RATE}))",
              "{{instance}} {{gpu}} {{direction}}")], "Bps", w=8, minimum=0, stack=True)
    b.panel("Transfers/s per GPU and direction", "Completed transfers per second.",
            [(f"sum by (instance, gpu, direction) (rate(offloadd_transfers_total"
              f"{{{INST},{GPU},status=\"ok\"}}{RATE}))",
              "{{instance}} {{gpu}} {{direction}}")], "ops", w=8, minimum=0)
    b.panel("Failed transfers/s", "Transfers that finished with a status other than ok.",
            [(f"sum by (instance, gpu, direction, status) (rate(offloadd_transfers_total"
              f"{{{INST},{GPU},status!=\"ok\"}}{RATE}))",
              "{{instance}} {{gpu}} {{direction}} {{status}}")], "ops", w=8, minimum=0)

    b.row("Latency quantiles")
    b.panel("Transfer duration",
            "From a transfer's request to its completion, waits included; p50 and p99 by "
            "direction.",
            quantiles("offloadd_transfer_duration_seconds", "direction", INST), "s", w=8)
    b.panel("Transfer size", "Size of completed transfers; p50 and p99 by direction.",
            quantiles("offloadd_transfer_size_bytes", "direction", INST), "bytes", w=8)
    b.panel("Reload deadline misses/s per GPU",
            "Reloads that completed after the deadline the client gave (backward waited).",
            [(f"sum by (instance, gpu) (rate(offloadd_reload_deadline_misses_total"
              f"{{{INST},{GPU}}}{RATE}))", "{{instance}} {{gpu}}")], "ops", w=8, minimum=0)

    b.row("Fairness")
    b.panel("Share of transfer bytes per GPU",
            "Each GPU's share of its daemon's transfer bytes. GPUs with equal DRR weights and "
            "equal demand should get equal shares.",
            [(f"sum by (instance, gpu) (rate(offloadd_transfer_bytes_total"
              f"{{{INST},{GPU},status=\"ok\"}}{RATE})) / on (instance) group_left sum by "
              f"(instance) (rate(offloadd_transfer_bytes_total{{{INST},status=\"ok\"}}{RATE}))",
              "{{instance}} {{gpu}}")], "percentunit", w=8, minimum=0, maximum=1, stack=True)
    b.panel("Scheduler queue wait p99 by class",
            "Time a transfer waits in its link's queue before its first chunk is copied, by "
            "class (urgent > prefetch > offload).",
            quantiles("offloadd_link_queue_wait_seconds", "class", INST, qs=(0.99,)), "s", w=8)
    b.panel("Scheduler queue wait p50 by class", "As on the left, median.",
            quantiles("offloadd_link_queue_wait_seconds", "class", INST, qs=(0.5,)), "s", w=8)
    b.panel("Link bytes/s per GPU",
            "Bytes/s each GPU copied over each link direction (chunks as the scheduler served "
            "them). GPUs sharing a link compete here: with equal weights and enough demand "
            "each gets an equal part.",
            [(f"sum by (instance, link, direction, gpu) (rate(offloadd_link_gpu_bytes_total"
              f"{{{INST},{GPU}}}{RATE}))", "{{instance}} {{link}} {{direction}} {{gpu}}")],
            "Bps", w=12, minimum=0)
    b.panel("Share of its link per GPU",
            "Each GPU's share of the bytes its link direction copied. A GPU far below 1/n of "
            "a link it shares with n-1 others, while it has transfers queued, is starved.",
            [(f"sum by (instance, link, direction, gpu) (rate(offloadd_link_gpu_bytes_total"
              f"{{{INST},{GPU}}}{RATE})) / on (instance, link, direction) group_left sum by "
              f"(instance, link, direction) (rate(offloadd_link_gpu_bytes_total{{{INST}}}"
              f"{RATE}))", "{{instance}} {{link}} {{direction}} {{gpu}}")],
            "percentunit", w=12, minimum=0, maximum=1)

    b.row("Sessions and IPC")
    b.panel("Sessions open", "Client sessions (training processes) connected.",
            [(f"offloadd_sessions_open{{{INST}}}", "{{instance}}")], "short", w=6, minimum=0)
    b.panel("Sessions ended by cause",
            "Sessions ended per interval: closed (clean), crashed (stream broke), shutdown, "
            "lease_expired.",
            [(f"sum by (instance, cause) (increase(offloadd_sessions_ended_total{{{INST}}}"
              f"{RATE}))", "{{instance}} {{cause}}")], "short", w=6, minimum=0)
    b.panel("IPC handles open / opened per second",
            "Client memory handles (CUDA IPC, or shm regions) the daemon holds open per GPU, "
            "and how often it opens new ones (a steady high rate means clients re-register).",
            [(f"offloadd_ipc_handles_open{{{INST},{GPU}}}", "{{instance}} {{gpu}} open"),
             (f"rate(offloadd_ipc_handle_opens_total{{{INST},{GPU}}}{RATE})",
              "{{instance}} {{gpu}} opens/s")], "short", w=6, minimum=0)
    b.panel("Daemons", "Daemons reporting, by version and backend.",
            [(f"count by (version, backend) (offloadd_build_info{{{INST}}})",
              "{{version}} {{backend}}")], "short", kind="stat", w=6)

    b.row("Clients")
    b.panel("Fallbacks per GPU",
            "Saved tensors the training processes kept in their own process per interval "
            "(daemon unreachable or refusing), as the clients reported them. Any is a job "
            "running without the offload it was sized for; `offloadctl sessions` names it.",
            [(f"sum by (instance, gpu) (increase(offloadd_client_fallbacks_total{{{INST},{GPU}}}"
              f"{RATE}))", "{{instance}} {{gpu}}")], "short", w=8, minimum=0)
    b.panel("Training time waiting on reloads per GPU",
            "Fraction of the time the training thread was blocked on an answer of the daemon "
            "(a reload not there when backward needed it), as the clients reported it.",
            [(f"sum by (instance, gpu) (rate(offloadd_client_host_wait_seconds_total"
              f"{{{INST},{GPU}}}{RATE}))", "{{instance}} {{gpu}}")], "percentunit", w=8,
            minimum=0)
    b.panel("Idle steps per GPU",
            "Training steps that saved tensors but sent none to the daemon (all below "
            "threshold_bytes, kept by keep_last_n, or no checkpointing), per interval.",
            [(f"sum by (instance, gpu) (increase(offloadd_client_idle_steps_total"
              f"{{{INST},{GPU}}}{RATE}))", "{{instance}} {{gpu}}")], "short", w=8, minimum=0)

    b.row("Spill tier, restarts and errors")
    b.panel("Blocks lost (data loss)",
            "Spilled blocks whose file was removed or damaged, and block records dropped at a "
            "restart's adoption: each is a reload answered DATA_LOSS.",
            [(f"sum by (instance) (increase(offloadd_spill_blocks_lost_total{{{INST}}}{RATE}))",
              "{{instance}} spill lost"),
             (f"sum by (instance, reason) (increase(offloadd_adoption_dropped_blocks_total"
              f"{{{INST}}}{RATE}))", "{{instance}} adoption {{reason}}")], "short", w=6,
            minimum=0)
    b.panel("Spill failures by cause",
            "Spills not done (the block stayed in the pool): write_error, disk_full.",
            [(f"sum by (instance, cause) (increase(offloadd_spill_failures_total{{{INST}}}"
              f"{RATE}))", "{{instance}} {{cause}}")], "short", w=6, minimum=0)
    b.panel("Adopted blocks waiting / expired",
            "After a restart on a shared pool: blocks not yet taken back by a resumed session, "
            "and those freed because none resumed them within resume_grace_seconds.",
            [(f"offloadd_adopted_blocks_waiting{{{INST}}}", "{{instance}} waiting"),
             (f"increase(offloadd_adopted_blocks_expired_total{{{INST}}}{RATE})",
              "{{instance}} expired")], "short", w=6, minimum=0)
    b.panel("Request errors/s by code and NUMA fallbacks",
            "Requests answered with an error, by gRPC code; pool allocations that left their "
            "GPU's NUMA node, by reason.",
            [(f"sum by (instance, code) (rate(offloadd_request_errors_total{{{INST}}}{RATE}))",
              "{{instance}} {{code}}"),
             (f"sum by (instance, reason) (rate(offloadd_pool_numa_fallback_total{{{INST}}}"
              f"{RATE}))", "{{instance}} numa {{reason}}")], "ops", w=6, minimum=0)
    b.panel("Request ring: requests/s and rings refused/s",
            "Offloads, reloads and releases taken from clients' request rings per second, and "
            "rings refused at Hello (those sessions send per-tensor requests on their streams, "
            "at several times the client CPU: the client's HelloReply ring_error says why).",
            [(f"sum by (instance) (rate(offloadd_ring_requests_total{{{INST}}}{RATE}))",
              "{{instance}} ring requests"),
             (f"sum by (instance) (rate(offloadd_ring_offers_total{{{INST},"
              f"result=\"refused\"}}{RATE}))", "{{instance}} rings refused")], "ops", w=6,
            minimum=0)
    b.panel("Request ring threads: sleeps/s and answers waiting",
            "The daemon's ring threads (one per session with a ring): timed poll sleeps per "
            "second (the wake-ups that let clients publish without ringing: up to 1 / "
            "ring_poll_seconds per busy session), sleeps until rung, 1 ms back-offs of a client "
            "ringing for nothing, malformed entries refused, and answers waiting in daemon "
            "memory because a client's completion ring is full (a client not taking them).",
            [(f"sum by (instance, wait) (rate(offloadd_ring_sleeps_total{{{INST}}}{RATE}))",
              "{{instance}} sleeps {{wait}}"),
             (f"sum by (instance) (rate(offloadd_ring_backoffs_total{{{INST}}}{RATE}))",
              "{{instance}} back-offs"),
             (f"sum by (instance) (rate(offloadd_ring_malformed_entries_total{{{INST}}}"
              f"{RATE}))", "{{instance}} malformed"),
             (f"offloadd_ring_completions_waiting{{{INST}}}", "{{instance}} answers waiting"),
             (f"offloadd_ring_threads{{{INST}}}", "{{instance}} ring threads")], "short", w=6,
            minimum=0)

    b.row("GaLore refreshes")
    b.panel("Projector refresh duration",
            "Time of one GaLore projector refresh (top-r SVD of a gradient); p50 and p99.",
            [(f"histogram_quantile({q}, sum by (le) (rate("
              f"offloadd_projector_refresh_duration_seconds_bucket{{{INST}}}{RATE})))",
              f"p{int(q * 100)}") for q in (0.5, 0.99)], "s", w=6)
    b.panel("Projector refreshes/s", "Refreshes completed per second.",
            [(f"sum by (instance) (rate(offloadd_projector_refresh_duration_seconds_count"
              f"{{{INST}}}{RATE}))", "{{instance}}")], "ops", w=6, minimum=0)
    b.panel("Projector refreshes/s by outcome",
            "Refreshes finished per second by outcome: ok, skipped (the lazy policy kept the "
            "projector), degenerate, invalid_input, cancelled, error.",
            [(f"sum by (instance, outcome) (rate(offloadd_projector_refreshes_total{{{INST}}}"
              f"{RATE}))", "{{instance}} {{outcome}}")], "ops", w=6, minimum=0, stack=True)
    b.panel("Projector refreshes/s by source",
            "computed: an SVD ran; deduplicated: another data-parallel rank's refresh of the "
            "same key, with a bitwise equal gradient, gave its P; mismatched: a repeated key "
            "whose gradient differed, computed on its own.",
            [(f"sum by (instance, source) (rate(offloadd_projector_refresh_sources_total"
              f"{{{INST}}}{RATE}))", "{{instance}} {{source}}"),
             (f"sum by (instance) (rate(offloadd_projector_content_mismatches_total{{{INST}}}"
              f"{RATE}))", "{{instance}} mismatched")], "ops", w=6, minimum=0)
    b.panel("Projector queue depth", "Refresh requests queued or running.",
            [(f"offloadd_projector_queue_depth{{{INST}}}", "{{instance}}")], "short", w=6,
            minimum=0)
    return b.panels


def variable(name, label, query, multi=True):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "definition": query, "query": {"query": query, "refId": name}, "refresh": 2,
            "multi": multi, "includeAll": True, "allValue": ".*", "sort": 1, "hide": 0,
            "current": {}, "options": [], "regex": ""}


def dashboard():
    return {
        "uid": "offloadd",
        "title": "offloadd",
        "description": "offloadd: host pool, PCIe link saturation, throughput, latency, "
                       "fairness, sessions and IPC, GaLore projector refreshes.",
        "tags": ["offloadd", "gpu"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 37,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
             "options": []},
            variable("instance", "Daemon", "label_values(offloadd_build_info, instance)"),
            variable("gpu", "GPU",
                     'label_values(offloadd_transfers_total{instance=~"$instance"}, gpu)'),
        ]},
        "panels": build(),
    }


def render():
    return json.dumps(dashboard(), indent=2) + "\n"


if __name__ == "__main__":
    out = os.path.join(os.path.dirname(os.path.abspath(__file__)), "offloadd-dashboard.json")
    if len(sys.argv) > 1:
        out = sys.argv[1]
    with open(out, "w") as f:
        f.write(render())
    print(out)
