"""``offloadctl stats`` (text and --json) shows the daemon's GaLore projector refreshes.

Three refreshes of one parameter at one step through offloadd.galore.ServiceProjector: the first
computed, the same gradient again deduplicated (no SVD), another gradient computed on its own (a
content mismatch). Both outputs carry exactly the daemon's GetProjectorStats counts (2 computed,
1 deduplicated, 1 mismatch), the JSON beside GetStats' own fields; a daemon whose config turns
the projector service off says so in the text and has no "projector" member in the JSON.
"""

import json
import os
import subprocess
import tempfile
import unittest

import torch
from daemon_fixture import Daemon, DaemonTestCase
from test_fsdp2 import offloadctl

from offloadd.galore import ProjectorConnection, ServiceProjector


def gradient(seed):
    return torch.randn(32, 24, generator=torch.Generator().manual_seed(seed))


def run(sock, *args):
    r = subprocess.run([offloadctl(), "--socket", sock, "stats"] + list(args),
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout


class ProjectorStatsTest(DaemonTestCase):
    POOL_BYTES = "16MiB"

    def test_text_and_json_show_the_daemons_refresh_counts(self):
        conn = ProjectorConnection(self.daemon.sock, timeout_seconds=60)
        proj = ServiceProjector(4, update_proj_gap=1, parameter_id="w", connection=conn)
        try:
            proj.project(gradient(1), 0)
            proj.project(gradient(1), 0)   # the same key and gradient: deduplicated
            self.assertTrue(proj.last_result.deduplicated)
            proj.project(gradient(2), 0)   # the same key, another gradient: computed
            want = conn.stats()
        finally:
            proj.close()
            conn.close()
        self.assertEqual((want.computed_total, want.deduplicated_total,
                          want.content_mismatches_total), (2, 1, 1))
        text = run(self.daemon.sock)
        self.assertIn("GaLore projector refreshes: 2 computed, 1 deduplicated (no SVD: a "
                      "repeated key took the first result), 1 gradient mismatches; 0 queued, "
                      "0 running", text)
        out = json.loads(run(self.daemon.sock, "--json"))
        self.assertIn("pool_capacity_bytes", out)   # GetStats' own fields are still there
        p = out["projector"]
        self.assertEqual((int(p["computed_total"]), int(p["deduplicated_total"]),
                          int(p["content_mismatches_total"])), (2, 1, 1))
        self.assertEqual(p["backend"], want.backend)


class ProjectorOffTest(unittest.TestCase):
    def test_a_daemon_without_the_service_says_off(self):
        with tempfile.NamedTemporaryFile("w", suffix=".textproto", delete=False) as cfg:
            cfg.write("projector { enabled: false }\n")
        daemon = Daemon("16MiB", extra=["--config", cfg.name])
        try:
            text = run(daemon.sock)
            self.assertIn("GaLore projector refreshes: off (the daemon runs without the "
                          "projector service)", text)
            self.assertNotIn("projector", json.loads(run(daemon.sock, "--json")))
        finally:
            daemon.stop()
            os.unlink(cfg.name)
