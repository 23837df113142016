"""The Grafana dashboard's structure: variables, rows, datasource, instance/gpu filters, layout.

Whether its metric names exist and its queries parse is checked against a live daemon and
Prometheus in test_live_scrape.py. Run: /usr/bin/python3 -m unittest test_dashboard.
"""
import os
import re
import subprocess
import unittest

import common

ROWS = ["Pool", "Link saturation", "Throughput", "Latency quantiles", "Fairness",
        "Sessions and IPC", "Clients", "Spill tier, restarts and errors", "GaLore refreshes"]
# Series labelled by GPU: their panels must follow the gpu variable.
GPU_METRICS = ("offloadd_transfer_bytes_total", "offloadd_transfers_total",
               "offloadd_reload_deadline_misses_total", "offloadd_ipc_handles_open",
               "offloadd_ipc_handle_opens_total", "offloadd_link_gpu_bytes_total",
               "offloadd_client_fallbacks_total", "offloadd_client_host_wait_seconds_total",
               "offloadd_client_idle_steps_total")


class DashboardTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.d = common.load_dashboard()
        cls.panels = [p for p in cls.d["panels"] if p["type"] != "row"]

    def test_variables(self):
        v = {x["name"]: x for x in self.d["templating"]["list"]}
        self.assertEqual(v["datasource"]["type"], "datasource")
        self.assertEqual(v["datasource"]["query"], "prometheus")
        for name in ("instance", "gpu"):
            self.assertEqual(v[name]["type"], "query")
            self.assertEqual(v[name]["datasource"]["uid"], "${datasource}")
            self.assertTrue(common.label_values_selector(v[name]["query"]["query"]))
        self.assertIn('instance=~"$instance"', v["gpu"]["query"]["query"])

    def test_rows(self):
        rows = [p["title"] for p in self.d["panels"] if p["type"] == "row"]
        self.assertEqual(rows, ROWS)
        # Every row has at least one panel under it.
        kinds = [p["type"] for p in self.d["panels"]] + ["row"]
        for i, k in enumerate(kinds[:-1]):
            if k == "row":
                self.assertNotEqual(kinds[i + 1], "row", "empty row %s" % self.d["panels"][i])

    def test_every_query_uses_datasource_and_instance(self):
        for p in self.panels:
            self.assertEqual(p["datasource"]["uid"], "${datasource}", p["title"])
            self.assertTrue(p["targets"], p["title"])
            for t in p["targets"]:
                self.assertEqual(t["datasource"]["uid"], "${datasource}", p["title"])
                sels = re.findall(r"(offloadd_\w+)(\{[^}]*\})?", t["expr"])
                self.assertTrue(sels, "%s: no offloadd metric" % p["title"])
                for name, sel in sels:
                    self.assertIn('instance=~"$instance"', sel,
                                  "%s: %s not filtered by instance" % (p["title"], name))
                gpu_names = [n for n, s in sels if n in GPU_METRICS]
                if gpu_names:
                    self.assertIn('gpu=~"$gpu"', t["expr"], p["title"])

    def test_link_gpu_bytes_chunks_in_flight_and_refresh_panels(self):
        """Per-GPU link bytes (fairness), chunks in flight, projector refreshes."""
        def panel_of(metric):
            return [(p, t["expr"]) for p in self.panels for t in p["targets"]
                    if re.search(r"\b%s\b" % metric, t["expr"])]
        per_gpu = panel_of("offloadd_link_gpu_bytes_total")
        self.assertTrue(per_gpu, "no panel shows offloadd_link_gpu_bytes_total")
        for p, expr in per_gpu:
            self.assertRegex(expr, r"by \(instance, link, direction, gpu\)", p["title"])
        units = {p["fieldConfig"]["defaults"]["unit"] for p, _ in per_gpu}
        self.assertEqual(units, {"Bps", "percentunit"}, "want bytes/s and share of the link")
        chunks = panel_of("offloadd_link_chunks_in_flight")
        self.assertTrue(chunks, "no panel shows offloadd_link_chunks_in_flight")
        refreshes = panel_of("offloadd_projector_refreshes_total")
        self.assertTrue(refreshes, "no panel shows offloadd_projector_refreshes_total")
        self.assertIn("outcome", refreshes[0][1])

    def test_clients_and_data_loss_panels(self):
        exprs = " ".join(t["expr"] for p in self.panels for t in p["targets"])
        for name in ("offloadd_client_fallbacks_total", "offloadd_client_host_wait_seconds_total",
                     "offloadd_client_idle_steps_total", "offloadd_spill_blocks_lost_total",
                     "offloadd_adoption_dropped_blocks_total", "offloadd_spill_failures_total",
                     "offloadd_adopted_blocks_expired_total", "offloadd_request_errors_total",
                     "offloadd_pool_numa_fallback_total"):
            self.assertIn(name, exprs)

    def test_units_and_unique_ids(self):
        ids = [p["id"] for p in self.d["panels"]]
        self.assertEqual(len(ids), len(set(ids)))
        for p in self.panels:
            self.assertTrue(p["fieldConfig"]["defaults"].get("unit"), p["title"])

    def test_layout_fits_and_does_not_overlap(self):
        cells = set()
        for p in self.d["panels"]:
            g = p["gridPos"]
            self.assertLessEqual(g["x"] + g["w"], 24, p["title"])
            for x in range(g["x"], g["x"] + g["w"]):
                for y in range(g["y"], g["y"] + g["h"]):
                    self.assertNotIn((x, y), cells, "%s overlaps another panel" % p["title"])
                    cells.add((x, y))

    def test_json_matches_generator(self):
        gen = os.path.join(common.MONITORING, "grafana", "make_dashboard.py")
        out = subprocess.run(["/usr/bin/python3", "-c",
                              "import sys; sys.path.insert(0, %r); import make_dashboard; "
                              "sys.stdout.write(make_dashboard.render())" % os.path.dirname(gen)],
                             capture_output=True, text=True, timeout=30)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertEqual(out.stdout, common.read_text(common.DASHBOARD),
                         "offloadd-dashboard.json is stale: run monitoring/grafana/make_dashboard.py")


if __name__ == "__main__":
    unittest.main()
